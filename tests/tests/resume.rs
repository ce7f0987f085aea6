//! Resumable Streamable streams end to end (SPEC section 12), on both binaries: a client
//! whose connection is cut while its request runs comes back with `GET /mcp` and
//! `Last-Event-ID`, and receives that request's remaining progress and its result exactly
//! once, without sending the request again.
//!
//! - The official Python SDK's Streamable HTTP client (`tests/python/resume_client.py`)
//!   talks to the proxy through a [`Forwarder`], which the test uses to cut every connection
//!   mid-call. The SDK resumes by itself (it reconnects with `Last-Event-ID` when a request's
//!   stream ends before its response). Twice: once the rest of the call is produced after
//!   the client is back (the stream continues live), once while the client is provably away
//!   (its reconnection held at the forwarder), so the rest is replayed.
//! - Through the nginx recipe (three instances), a raw client drops its POST stream and
//!   resumes it through nginx; the resumption reaches the instance that owns the session.
//!
//! The tool is the test backend's `gated_progress`: progress 1 of 2 at once, then, once the
//! test creates its gate file, progress 2 of 2 and the result (then it removes the file). No
//! step depends on timing: every wait is for an observable event, bounded by [`LONG`].
//!
//! The Python tests need `SWITCHBOARD_PYTHON` (a Python with `mcp`, as `tests/run.sh` sets
//! up) and the nginx test needs nginx; without them they skip loudly, or fail under `CI=true`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchboard_tests::mcp::{self, Answer};
use switchboard_tests::nginx::{instance_of, start_mcp, Cluster, NAMES, PUBLIC_HOST};
use switchboard_tests::python::python;
use switchboard_tests::{
    echoed_args, request_events, suite, workspace_root, Events, Forwarder, McpSession, Proxy,
    Recorded, Target,
};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");
const ALICE: (&str, &str) = ("alice", "alice-token-0123456789abcdef");
const BOB: (&str, &str) = ("bob", "bob-token-fedcba9876543210xyz");

/// The bound on every wait in this file.
const LONG: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------
// The Python SDK client as a process
// ---------------------------------------------------------------------------------------

/// `resume_client.py` running: its stdout lines (one JSON object each) as they come.
struct SdkClient {
    child: Child,
    lines: Receiver<Value>,
    stderr: PathBuf,
    /// Every line read so far.
    seen: Vec<Value>,
}

impl SdkClient {
    fn start(python: &Path, url: &str, tool: &str, args: &Value, scratch: &Path) -> SdkClient {
        let script = workspace_root().join("tests/python/resume_client.py");
        let stderr = scratch.join("resume-client-stderr.txt");
        let mut child = Command::new(python)
            .arg(&script)
            .arg(url)
            .arg(tool)
            .arg(args.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value = serde_json::from_str(&line)
                    .unwrap_or_else(|_| json!({"event": "unparsed", "line": line}));
                if tx.send(value).is_err() {
                    break;
                }
            }
        });
        SdkClient {
            child,
            lines,
            stderr,
            seen: Vec::new(),
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The next line, which must be a `kind` event.
    fn expect(&mut self, kind: &str) -> Value {
        let line = self.lines.recv_timeout(LONG).unwrap_or_else(|_| {
            panic!(
                "the SDK client printed no {kind:?} within {LONG:?}; so far {:?}\n--- stderr ---\n{}",
                self.seen,
                self.stderr()
            )
        });
        self.seen.push(line.clone());
        assert_eq!(
            line["event"],
            kind,
            "expected a {kind:?} event; so far {:?}\n--- stderr ---\n{}",
            self.seen,
            self.stderr()
        );
        line
    }

    /// Waits for the exit (at most [`LONG`]), which must be a success with nothing more
    /// printed.
    fn finish(mut self) -> String {
        let deadline = Instant::now() + LONG;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for the SDK client") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the SDK client did not exit within {LONG:?}\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let stderr = self.stderr();
        assert!(
            status.success(),
            "the SDK client failed ({status}):\n{stderr}"
        );
        let rest: Vec<Value> = self.lines.try_iter().collect();
        assert!(rest.is_empty(), "more after the result: {rest:?}");
        stderr
    }
}

impl Drop for SdkClient {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- SDK client stderr ---\n{}\n---", self.stderr());
        }
    }
}

// ---------------------------------------------------------------------------------------
// What the forwarder saw
// ---------------------------------------------------------------------------------------

/// The `id:` values of the SSE events in `bytes`, in order.
fn event_ids(bytes: &str) -> Vec<String> {
    bytes
        .lines()
        .filter_map(|l| l.strip_prefix("id:"))
        .map(|id| id.trim().to_owned())
        .collect()
}

/// The connections whose first request was `GET /mcp` with `Last-Event-ID`.
fn resumptions(conns: &[Recorded]) -> Vec<&Recorded> {
    conns
        .iter()
        .filter(|c| {
            c.request_line().is_some_and(|l| l.starts_with("GET /mcp "))
                && c.request_header("last-event-id").is_some()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// The Python SDK through the forwarder
// ---------------------------------------------------------------------------------------

/// When the rest of the call is produced, relative to the client's return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rest {
    /// After the resumed stream is open: it continues live.
    AfterResume,
    /// While the client is away (its reconnection held): it is replayed.
    WhileAway,
}

/// The SDK client through a forwarder against a backend that negotiates `version`: the
/// call's stream is cut after its first progress, and `rest` says when the rest comes.
fn sdk_resumes(target: Target, rest: Rest, version: &str) {
    let Some(python) = python() else { return };
    let p = Proxy::builder(target)
        .backend([BACKEND, "--protocol-version", version])
        .record()
        .start();
    let fwd = Forwarder::start(p.addr);
    let gate = p.dir().file("gate");
    let args = json!({"gate": gate.display().to_string()});
    let url = format!("http://{}/mcp", fwd.addr);
    let mut client = SdkClient::start(&python, &url, "gated_progress", &args, p.dir().path());
    let init = client.expect("initialized");
    assert_eq!(
        (init["server"].as_str(), init["protocol"].as_str()),
        (Some("test-backend"), Some(version)),
        "{init}"
    );
    let first = client.expect("progress");
    assert_eq!(
        (first["progress"].as_f64(), first["total"].as_f64()),
        (Some(1.0), Some(2.0)),
        "{first}"
    );

    // The call's POST stream, as the forwarder passed it: its events carry ids.
    let conns = fwd.connections();
    let posts: Vec<&Recorded> = conns
        .iter()
        .filter(|c| c.sent_text().contains("gated_progress"))
        .collect();
    assert_eq!(posts.len(), 1, "one POST carries the call");
    let post = posts[0];
    let seen_ids = event_ids(&post.received_text());
    let last_id = seen_ids
        .last()
        .unwrap_or_else(|| {
            panic!(
                "the POST stream's events carry no id:\n{}",
                post.received_text()
            )
        })
        .clone();
    let stream_key = last_id
        .split_once('.')
        .expect("<stream>.<position>")
        .0
        .to_owned();
    // A 2025-11-25 stream opens with a priming event (position 0); the progress follows.
    let want: Vec<String> = match version {
        "2025-11-25" => vec![format!("{stream_key}.0"), format!("{stream_key}.1")],
        _ => vec![format!("{stream_key}.1")],
    };
    assert_eq!(seen_ids, want, "{}", post.received_text());

    // Cut mid-call.
    if rest == Rest::WhileAway {
        fwd.hold(true);
    }
    assert!(fwd.cut() >= 1, "the POST stream's connection was live");
    let is_resumption = |c: &&Recorded| {
        c.request_header("last-event-id").as_deref() == Some(last_id.as_str())
            && c.sent_text().contains("\r\n\r\n")
    };
    match rest {
        Rest::AfterResume => {
            // The resumed stream is open (its head came back): the rest goes there live.
            fwd.wait_until("the resumption's 200", LONG, |conns| {
                resumptions(conns)
                    .iter()
                    .any(|c| is_resumption(c) && c.status() == Some(200))
            });
            std::fs::write(&gate, b"open").expect("open the gate");
        }
        Rest::WhileAway => {
            // The client asked to resume and is held at the forwarder: the rest is produced
            // now, and the proxy has it before the client gets through (the backend answers
            // an echo after the gated lines on the same stdout, which the proxy reads in
            // order).
            fwd.wait_until("the held resumption", LONG, |conns| {
                resumptions(conns)
                    .iter()
                    .any(|c| c.held && is_resumption(c))
            });
            std::fs::write(&gate, b"open").expect("open the gate");
            let deadline = Instant::now() + LONG;
            while gate.exists() {
                assert!(
                    Instant::now() < deadline,
                    "the backend never passed the gate"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            let barrier = McpSession::start(&p, None);
            let m = barrier.call(json!(1), "echo", json!({"barrier": true}));
            assert_eq!(echoed_args(&m)["barrier"], true);
            fwd.hold(false);
        }
    }

    let second = client.expect("progress");
    assert_eq!(
        (
            second["progress"].as_f64(),
            second["total"].as_f64(),
            second["message"].as_str()
        ),
        (Some(2.0), Some(2.0), Some("step 2")),
        "{second}"
    );
    let result = client.expect("result");
    assert_eq!(result["is_error"], false, "{result}");
    let echoed: Value = serde_json::from_str(result["texts"][0].as_str().expect("a text"))
        .expect("the tool's arguments as JSON");
    assert_eq!(echoed, args);
    let log = client.finish();

    // The SDK came back with GET and the last id it had, never sent the call again, and the
    // backend received it once and no cancellation.
    let conns = fwd.connections();
    let calls: usize = conns
        .iter()
        .map(|c| c.sent_text().matches("gated_progress").count())
        .sum();
    assert_eq!(calls, 1, "the SDK sent the call again\n{log}");
    let back: Vec<&Recorded> = resumptions(&conns)
        .into_iter()
        .filter(|c| c.request_header("last-event-id").as_deref() == Some(last_id.as_str()))
        .collect();
    assert!(
        !back.is_empty(),
        "no GET with Last-Event-ID {last_id}\n{log}"
    );
    let resumed_ids = event_ids(&back.last().expect("one").received_text());
    assert_eq!(
        resumed_ids,
        [format!("{stream_key}.2"), format!("{stream_key}.3")],
        "the resumed stream carries the call's two remaining events, numbered on"
    );
    let recorded = p.recorded();
    let at_backend: Vec<&String> = recorded
        .iter()
        .filter(|l| l.contains("\"tools/call\"") && l.contains("gated_progress"))
        .collect();
    assert_eq!(at_backend.len(), 1, "{recorded:#?}");
    assert!(
        !recorded
            .iter()
            .any(|l| l.contains("notifications/cancelled")),
        "a dropped stream is not a cancellation: {recorded:#?}"
    );
}

/// The Python SDK client's connection is cut after the first progress; it resumes with
/// `Last-Event-ID` on its own, and the second progress and the result, produced once it is
/// back, arrive on the resumed stream, once each. The session negotiated 2024-11-05 (the
/// backend's version): its streams carry event ids but no priming event.
fn sdk_client_resumes_and_the_stream_continues(target: Target) {
    sdk_resumes(target, Rest::AfterResume, "2024-11-05");
}

/// The same, but the second progress and the result are produced while the client is
/// away (its reconnection is held at the forwarder until the proxy has them): the proxy
/// replays them on the resumed stream, once each. The session negotiated 2025-11-25, so the
/// call's stream opens with a priming event.
fn sdk_client_resumes_and_gets_what_it_missed(target: Target) {
    sdk_resumes(target, Rest::WhileAway, "2025-11-25");
}

// ---------------------------------------------------------------------------------------
// Through nginx
// ---------------------------------------------------------------------------------------

/// A gated call on `s` through nginx, answered as a 2025-11-25 event stream: returns the
/// stream after its priming event and first progress, and the id of that progress.
fn gated_call_through(
    addr: std::net::SocketAddr,
    s: &McpSession,
    id: u64,
    gate: &Path,
) -> (Events, String) {
    let auth = format!("Bearer {}", s.token.as_deref().expect("a token"));
    let body = json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "gated_progress", "arguments": {"gate": gate.display().to_string()}, "_meta": {"progressToken": format!("tok-{id}")}},
    });
    let headers = [
        ("Authorization", auth.as_str()),
        ("Host", PUBLIC_HOST),
        ("Mcp-Session-Id", s.sid.as_str()),
        ("MCP-Protocol-Version", "2025-11-25"),
        ("Accept", "text/event-stream"),
    ];
    let mut events = match mcp::post(addr, "/mcp", &headers, &body.to_string()) {
        Answer::Stream(events) => events,
        Answer::Whole(r) => panic!("the gated call: {} {}", r.status, r.text()),
    };
    let primed = events.priming_id(LONG);
    let progress = events
        .next_message(LONG)
        .expect("the first progress through nginx");
    assert_eq!(progress["method"], "notifications/progress", "{progress}");
    assert_eq!(
        progress["params"]["progressToken"],
        format!("tok-{id}"),
        "{progress}"
    );
    assert_eq!(progress["params"]["progress"], 1, "{progress}");
    let last = events.last_event_id().expect("an id").to_owned();
    let (key, position) = last.split_once('.').expect("<stream>.<position>");
    assert_eq!(
        primed,
        format!("{key}.0"),
        "the priming event opens the same stream"
    );
    assert_ne!(position, "0");
    (events, last)
}

/// `GET /mcp` through nginx resuming `s`'s stream after `last`.
fn resume_through(addr: std::net::SocketAddr, s: &McpSession, last: &str) -> Events {
    let auth = format!("Bearer {}", s.token.as_deref().expect("a token"));
    let headers = [
        ("Authorization", auth.as_str()),
        ("Host", PUBLIC_HOST),
        ("Mcp-Session-Id", s.sid.as_str()),
        ("MCP-Protocol-Version", "2025-11-25"),
        ("Accept", "text/event-stream"),
        ("Last-Event-ID", last),
    ];
    request_events(addr, "GET", "/mcp", &headers, b"")
        .unwrap_or_else(|r| panic!("resume through nginx: {} {}", r.status, r.text()))
}

/// Asserts `got` is exactly the gated call `id`'s second progress and its result.
fn assert_rest_of_call(got: &[Value], id: u64, gate: &Path) {
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["method"], "notifications/progress", "{got:?}");
    assert_eq!(
        (
            got[0]["params"]["progressToken"].clone(),
            got[0]["params"]["progress"].clone()
        ),
        (json!(format!("tok-{id}")), json!(2)),
        "{got:?}"
    );
    assert_eq!(got[1]["id"], id, "{got:?}");
    assert_eq!(
        echoed_args(&got[1])["gate"],
        gate.display().to_string(),
        "{got:?}"
    );
}

/// Through the nginx recipe, a raw client's POST stream is dropped after the first
/// progress and resumed with `GET` + `Mcp-Session-Id` + `Last-Event-ID` through nginx: the
/// resumption reaches the instance that owns the session, which continues the stream (the
/// rest produced after the resumption) or replays it (the rest produced while the client
/// was away). Each call reached the owner's backend once, and no other instance's.
fn resumption_through_nginx_reaches_the_owner(target: Target) {
    let Some(cluster) = Cluster::start(
        target,
        "resumption_through_nginx_reaches_the_owner",
        BACKEND,
        &[ALICE, BOB],
    ) else {
        return;
    };
    let addr = cluster.nginx.addr;
    // Sessions on every instance, so that a resumption routed to any but the owner would
    // find a live instance that does not know the stream.
    let sessions: Vec<McpSession> = (0..6)
        .map(|n| start_mcp(addr, if n % 2 == 0 { ALICE.1 } else { BOB.1 }))
        .collect();
    for name in NAMES {
        assert!(
            sessions.iter().any(|s| instance_of(&s.sid) == name),
            "no session on instance {name}"
        );
    }
    let s = &sessions[0];
    let owner = instance_of(&s.sid);
    let gates = cluster.instance(owner).dir();

    // 1. Resumed at once; the rest is produced once the resumed stream is open.
    let gate = gates.file("gate-live");
    let (events, last) = gated_call_through(addr, s, 1, &gate);
    events.shutdown();
    drop(events);
    let mut resumed = resume_through(addr, s, &last);
    assert_eq!(
        resumed.head.header("mcp-session-id"),
        Some(s.sid.as_str()),
        "the owner answered"
    );
    std::fs::write(&gate, b"open").expect("open the gate");
    let got = resumed
        .rest_until_closed(LONG)
        .expect("the resumed stream ends after the result");
    assert_rest_of_call(&got, 1, &gate);

    // 2. The rest is produced while the client is away, then replayed.
    let gate = gates.file("gate-away");
    let (events, last) = gated_call_through(addr, s, 2, &gate);
    events.shutdown();
    drop(events);
    std::fs::write(&gate, b"open").expect("open the gate");
    let deadline = Instant::now() + LONG;
    while gate.exists() {
        assert!(
            Instant::now() < deadline,
            "the backend never passed the gate"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The owner's backend answers this after the gated lines, on the same stdout.
    let m = s.call(json!(3), "echo", json!({"barrier": true}));
    assert_eq!(echoed_args(&m)["barrier"], true);
    let got = resume_through(addr, s, &last)
        .rest_until_closed(LONG)
        .expect("the replay ends after the result");
    assert_rest_of_call(&got, 2, &gate);

    // Each call reached the owner's backend once, and no other.
    for name in NAMES {
        let recorded = cluster.instance(name).recorded();
        let calls = recorded
            .iter()
            .filter(|l| l.contains("\"tools/call\"") && l.contains("gated_progress"))
            .count();
        let want = if name == owner { 2 } else { 0 };
        assert_eq!(
            calls, want,
            "instance {name} (owner {owner}): {recorded:#?}"
        );
        assert!(
            !recorded
                .iter()
                .any(|l| l.contains("notifications/cancelled")),
            "instance {name}: a dropped stream is not a cancellation: {recorded:#?}"
        );
    }
}

suite!(
    sdk_client_resumes_and_the_stream_continues,
    sdk_client_resumes_and_gets_what_it_missed,
    resumption_through_nginx_reaches_the_owner,
);
