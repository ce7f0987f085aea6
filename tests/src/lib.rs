//! # switchboard-tests
//!
//! End-to-end harness: start a Switchboard binary as a real process on a free loopback
//! port, talk HTTP and SSE to it, and read what its backend received.
//!
//! One suite, two targets: every test is written once as `fn name(target: Target)` and
//! [`suite!`] generates a `#[test]` per [`Target`] (`tokio::name`, `blocking::name`). A
//! binary that is not built fails with the command to build it under `CI=true` (a missing
//! `switchboard` always does); elsewhere a missing `switchboard-blocking` skips loudly.
//!
//! ```no_run
//! use serde_json::json;
//! use switchboard_tests::{open_session, Proxy, Target};
//!
//! fn echo_round_trip(target: Target) {
//!     let proxy = Proxy::builder(target).backend(["/path/to/test-backend"]).start();
//!     let mut s = open_session(&proxy, None);
//!     s.initialize();
//!     let m = s.call("echo", json!({"hello": 1}));
//!     assert_eq!(m["result"]["content"][0]["text"], r#"{"hello":1}"#);
//! }
//! ```

use std::time::{Duration, Instant};

pub mod forwarder;
pub mod http;
pub mod mcp;
pub mod nginx;
pub mod node;
pub mod oidc;
pub mod proxy;
pub mod python;
pub mod sse;

pub use forwarder::{Forwarder, Recorded};
pub use http::{Body, Conn, Response};
pub use mcp::{Answer, McpSession};
pub use node::{node, Node, NodeRun};
pub use proxy::{
    parse_metric, proc_status_kb, run, target_dir, workspace_root, Proxy, ProxyBuilder, Target,
    TempDir,
};
pub use sse::{
    open_session, raw_member, request_events, try_open_session, Events, Frame, OpenOptions, Session,
};

/// The longest any single wait for something that should happen may take.
pub const WAIT: Duration = Duration::from_secs(10);

/// How long to watch for something that must not happen when no in-order barrier proves it.
pub const QUIET: Duration = Duration::from_millis(300);

/// Waits on an event: polls `ready` (every 20 ms) until it gives a value, for at most
/// `timeout`, then panics saying `what` never happened. The suites' one "wait until" helper:
/// a test waits for what it means (a metric, a log line, a recorded backend line), never a
/// fixed time that a loaded machine can outlast.
pub fn wait_until<T>(what: &str, timeout: Duration, mut ready: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = ready() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "never within {timeout:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Prints a timing figure as `FIGURE <target> <name> <ms> ms`, the one form
/// `tests/bench_timing.sh` collects into `tests/BENCHMARKS.md`. Tests assert behaviour, not
/// time: on a loaded machine any time bound lies, so times are reported, never asserted.
pub fn figure(target: Target, name: &str, took: Duration) {
    println!(
        "FIGURE {} {name} {:.1} ms",
        target.package(),
        took.as_secs_f64() * 1e3
    );
}

/// The body of every 404 for a session that is unknown, closed or someone else's.
pub const SESSION_NOT_FOUND: &str =
    r#"{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"}}"#;

/// POSTs `body` to `session`'s endpoint with extra `headers` (the session's token is added
/// unless they carry an Authorization); the answer keeps its raw status and headers.
pub fn post(session: &Session, body: &str, headers: &[(&str, &str)]) -> Response {
    session.post_with(Body::json(body), headers)
}

/// Generates one `#[test]` per [`Target`] for each listed `fn(Target)`:
/// `tokio::<name>` and `blocking::<name>`.
#[macro_export]
macro_rules! suite {
    ($($test:ident),+ $(,)?) => {
        mod tokio {
            $(
                #[test]
                fn $test() {
                    $crate::run($crate::Target::Tokio, stringify!($test), super::$test);
                }
            )+
        }
        mod blocking {
            $(
                #[test]
                fn $test() {
                    $crate::run($crate::Target::Blocking, stringify!($test), super::$test);
                }
            )+
        }
    };
}

/// `Bearer <token>`, the value of an `Authorization` header.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// An echo `tools/call` request body (the test backend answers with its arguments).
pub fn echo_body(id: &str, args: serde_json::Value) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{args}}}}}"#
    )
}

/// The first text content of a tool result, parsed as JSON.
pub fn echoed_args(message: &serde_json::Value) -> serde_json::Value {
    let text = message["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("not a tool result: {message}"));
    serde_json::from_str(text).expect("echo text is JSON")
}

/// The id the backend saw for an echo call (the test backend puts it in the second text).
pub fn backend_seen_id(message: &serde_json::Value) -> serde_json::Value {
    let text = message["result"]["content"][1]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("not an echo result: {message}"));
    serde_json::from_str(text).expect("id text is JSON")
}

/// Every session sends every one of `ids` as a delayed echo call (later ids answered sooner,
/// so the backend answers out of order), then each must receive exactly its own answers:
/// its own payload, under the id it sent, routed through its own sid, and nothing more.
pub fn assert_colliding_ids_stay_isolated(
    sessions: &mut [(&str, Session)],
    ids: &[serde_json::Value],
    step_ms: u64,
) {
    use serde_json::{json, Value};
    // The delays start together once every call is sent (the backend waits for this gate
    // file), so the answers come back reordered however slowly a loaded machine sends them.
    static GATES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let gate = std::env::temp_dir().join(format!(
        "switchboard-tests-reorder-{}-{}",
        std::process::id(),
        GATES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&gate);
    for (i, id) in ids.iter().enumerate() {
        for (n, (who, s)) in sessions.iter().enumerate() {
            let ms = (ids.len() - i) as u64 * step_ms + n as u64 * (step_ms / 2);
            s.send(&json!({
                "jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "delay", "arguments": {"ms": ms, "who": who, "id": id, "gate": gate}},
            }));
        }
    }
    std::fs::write(&gate, b"open").expect("open the reorder gate");
    for (who, s) in sessions.iter_mut() {
        let mut seen = Vec::new();
        for _ in 0..ids.len() {
            let m = s.expect_message(&format!("{who}'s delayed answers"));
            let args = echoed_args(&m);
            assert_eq!(
                args["who"], *who,
                "{who} received someone else's answer: {m}"
            );
            assert_eq!(
                args["id"], m["id"],
                "{who}: the answer's id does not match its call: {m}"
            );
            let seen_id = backend_seen_id(&m);
            assert!(
                seen_id
                    .as_str()
                    .is_some_and(|x| x.starts_with(&format!("{}|", s.sid))),
                "{who}: the backend saw id {seen_id}, not one routed to {}",
                s.sid
            );
            seen.push(m["id"].clone());
        }
        let mut got: Vec<String> = seen.iter().map(Value::to_string).collect();
        let mut want: Vec<String> = ids.iter().map(Value::to_string).collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{who} got the wrong set of answers");
        assert_ne!(
            seen, ids,
            "{who}: the answers did not come back reordered; the test proves less"
        );
    }
    let _ = std::fs::remove_file(&gate);
    // Every answer is out of the backend now; a barrier per session proves none went to a
    // second session too (the proxy reads the backend's stdout in order).
    for (_, s) in sessions.iter_mut() {
        s.sync();
    }
}
