//! SPEC section 10's limits on both binaries: a principal past `--rate-limit` gets 429 with
//! `Retry-After` and a JSON-RPC error under its id (the request never reaches the backend),
//! and past `--max-sessions-per-principal` 429 for a new session, while another principal is
//! still served.

use serde_json::json;
use switchboard_tests::{
    bearer, open_session, suite, try_open_session, Body, OpenOptions, Proxy, Target,
};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");
const ALICE: (&str, &str) = ("alice", "alice-token-0123456789abcdef");
const BOB: (&str, &str) = ("bob", "bob-token-fedcba9876543210xyz");

fn limits_are_per_principal(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .tokens(&[ALICE, BOB])
        .args(["--rate-limit", "3/min", "--max-sessions-per-principal", "2"])
        .record()
        .start();
    let mut a = open_session(&p, Some(ALICE.1));
    // Three requests pass (initialize counts), the fourth is refused with its id.
    a.initialize();
    let _ = a.call("echo", json!({"n": 1}));
    let _ = a.call("echo", json!({"n": 2}));
    let auth = bearer(ALICE.1);
    let r = p.request(
        "POST",
        &a.post_target,
        &[("Content-Type", "application/json"), ("Authorization", &auth)],
        Body::json(r#"{"jsonrpc":"2.0","id":99,"method":"tools/call","params":{"name":"echo","arguments":{"m":"MARK-LIMITED"}}}"#),
    );
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["id"], json!(99));
    assert_eq!(r.json()["error"]["code"], json!(-32029));
    let wait: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!((1..=20).contains(&wait), "Retry-After {wait}");
    assert!(!p.recorded().iter().any(|l| l.contains("MARK-LIMITED")));
    // Bob has his own bucket.
    let mut b = open_session(&p, Some(BOB.1));
    b.initialize();
    // Alice's second session opens, her third is refused; Bob's second still opens.
    let _a2 = open_session(&p, Some(ALICE.1));
    let refused = try_open_session(
        p.addr,
        &OpenOptions {
            token: Some(ALICE.1.to_owned()),
            ..OpenOptions::default()
        },
    );
    match refused {
        Err(r) => {
            assert_eq!(r.status, 429, "{}", r.text());
            assert!(r.header("retry-after").is_some());
        }
        Ok(s) => panic!("alice's third session opened: {}", s.sid),
    }
    let _b2 = open_session(&p, Some(BOB.1));
}

suite!(limits_are_per_principal);
