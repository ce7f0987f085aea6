//! SPEC section 11's audit log end to end on both binaries: one session of the official
//! Python SDK client per transport (`tests/python/audit_client.py`) against the real
//! `mcp-server-time`, under a policy, produces exactly the expected events (session open,
//! initialize, list, a call, the backend's error, a denied call, session close), each in
//! ToolHive's AuditEvent shape, and a refused credential exactly one `auth_failure`. No
//! bearer token appears in the audit log or the proxy's log. Through the nginx recipe,
//! `source.value` is the client's address only when nginx is a `--trusted-proxy`.
//!
//! Needs `SWITCHBOARD_PYTHON` (see `python_sdk.rs`); `tests/run.sh` sets it up.

use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard_tests::python::{mcp_server_time, python, run_script};
use switchboard_tests::{suite, Body, Proxy, Target, TempDir, WAIT};

const ALICE: (&str, &str) = ("alice", "alice-token-0123456789abcdef");
const WRONG: &str = "not-a-token-of-anyone-0123456789";

const POLICY: &str = r#"{"version":"1.0","type":"cedarv1","cedar":{"policies":[
  "permit(principal, action == Action::\"call_tool\", resource == Tool::\"get_current_time\");",
  "permit(principal, action == Action::\"get_prompt\", resource);"],"entities_json":"[]"}}"#;

/// The events of the audit log at `path`, waiting until `pred` holds for them.
fn events(path: &std::path::Path, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let events: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        if pred(&events) || Instant::now() > deadline {
            return events;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kind_and_outcome(e: &Value) -> (String, String) {
    let s = |v: &Value| v.as_str().unwrap_or("?").to_owned();
    (s(&e["type"]), s(&e["outcome"]))
}

fn an_sdk_session_produces_exactly_the_expected_events(target: Target) {
    let Some(python) = python() else { return };
    let server = mcp_server_time(&python).display().to_string();
    let dir = TempDir::new("audit");
    let (policy, log) = (dir.file("policy.json"), dir.file("audit.jsonl"));
    std::fs::write(&policy, POLICY).unwrap();
    let p = Proxy::builder(target)
        .backend([server])
        .tokens(&[ALICE])
        .args(["--authz-config".to_owned(), policy.display().to_string()])
        .args(["--audit-log".to_owned(), log.display().to_string()])
        .start();
    // A refused credential: one auth_failure and nothing else.
    let auth = format!("Bearer {WRONG}");
    let r = p.request("GET", "/sse", &[("Authorization", &auth)], Body::None);
    assert_eq!(r.status, 401);
    let mut seen = 1;
    for transport in ["sse", "mcp"] {
        let args = [
            format!("http://{}", p.addr),
            ALICE.1.to_owned(),
            transport.to_owned(),
        ];
        let out = run_script(&python, &p, "audit_client.py", &args);
        assert_eq!(out["errors"][1], -32003, "{transport}: {out}");
        let expected = [
            ("session_open", "success"),
            ("mcp_initialize", "success"),
            ("mcp_tools_list", "success"),
            ("mcp_tool_call", "success"),
            ("mcp_prompt_get", "failure"),
            ("mcp_tool_call", "denied"),
            ("session_close", "success"),
        ];
        let all = events(&log, |e| e.len() >= seen + expected.len());
        let got: Vec<(String, String)> = all[seen..].iter().map(kind_and_outcome).collect();
        let mut got_sorted = got.clone();
        got_sorted.sort();
        let mut want: Vec<(String, String)> = expected
            .iter()
            .map(|(k, o)| (k.to_string(), o.to_string()))
            .collect();
        want.sort();
        assert_eq!(got_sorted, want, "{transport}: {got:?}\n{}", p.log());
        let wire = if transport == "sse" {
            "sse"
        } else {
            "streamable-http"
        };
        for e in &all[seen..] {
            assert_eq!(e["source"]["value"], "127.0.0.1", "{e}");
            assert_eq!(e["subjects"]["user"], "alice", "{e}");
            assert_eq!(e["metadata"]["extra"]["transport"], wire, "{e}");
            assert_eq!(e["target"]["endpoint"], format!("/{transport}"), "{e}");
            assert_eq!(e["component"], "switchboard", "{e}");
            assert!(e["metadata"]["auditId"]
                .as_str()
                .is_some_and(|id| id.len() == 36));
            assert!(
                e["loggedAt"].as_str().is_some_and(|t| t.ends_with('Z')),
                "{e}"
            );
        }
        let call = all[seen..]
            .iter()
            .find(|e| e["type"] == "mcp_tool_call" && e["outcome"] == "success")
            .expect("the call's event");
        assert_eq!(call["target"]["name"], "get_current_time", "{call}");
        assert_eq!(call["target"]["type"], "tool", "{call}");
        assert!(call["source"]["extra"]["request_id"].is_number(), "{call}");
        assert!(call["metadata"]["extra"]["response_size_bytes"].as_u64() > Some(0));
        assert!(call["subjects"]["client_name"].is_string(), "{call}");
        seen += expected.len();
    }
    let all = events(&log, |_| true);
    assert_eq!(
        kind_and_outcome(&all[0]),
        ("auth_failure".into(), "denied".into())
    );
    assert_eq!(all[0]["target"]["endpoint"], "/sse", "{}", all[0]);
    assert_eq!(
        all[0]["metadata"]["extra"]["transport"], "sse",
        "{}",
        all[0]
    );
    assert_eq!(all.len(), seen, "{all:#?}");
    let text = std::fs::read_to_string(&log).unwrap() + &p.log() + &p.metrics();
    for token in [ALICE.1, WRONG] {
        assert!(
            !text.contains(token),
            "a bearer token in the audit log, log or metrics"
        );
    }
}

/// `GET /sse` with `X-Forwarded-For: 203.0.113.7` through nginx at `nginx`, from the
/// loopback address 127.0.0.3 (a client nginx sees as 127.0.0.3), by a small Python socket
/// client that reads the answer's status line and hangs up.
fn open_from(python: &std::path::Path, nginx: std::net::SocketAddr, token: &str) -> String {
    let script = format!(
        "import socket\n\
         s = socket.create_connection(('127.0.0.1', {port}), timeout=10, source_address=('127.0.0.3', 0))\n\
         s.sendall(b'GET /sse HTTP/1.1\\r\\nHost: {host}\\r\\nAuthorization: Bearer {token}\\r\\nX-Forwarded-For: 203.0.113.7\\r\\nAccept: text/event-stream\\r\\n\\r\\n')\n\
         print(s.recv(64).split(b'\\r\\n')[0].decode())\n",
        port = nginx.port(),
        host = switchboard_tests::nginx::PUBLIC_HOST,
    );
    let out = std::process::Command::new(python)
        .args(["-c", &script])
        .output()
        .expect("run python");
    String::from_utf8_lossy(&out.stdout).trim().to_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Through the nginx recipe, `source.value` is the client's own address only when nginx
/// is a `--trusted-proxy`; otherwise it is nginx's, whatever `X-Forwarded-For` says.
fn behind_nginx_the_client_address_comes_only_from_a_trusted_proxy(target: Target) {
    let Some(python) = python() else { return };
    let Some(binary) = switchboard_tests::nginx::nginx_or_skip("audit behind nginx") else {
        return;
    };
    for (trusted, expected) in [(true, "127.0.0.3"), (false, "127.0.0.1")] {
        let dir = TempDir::new("audit-nginx");
        let log = dir.file("audit.jsonl");
        let mut builder = Proxy::builder(target)
            .args([
                "--instance",
                "a",
                "--allow-host",
                switchboard_tests::nginx::PUBLIC_HOST,
            ])
            .args(["--audit-log".to_owned(), log.display().to_string()])
            .tokens(&[ALICE]);
        if trusted {
            builder = builder.args(["--trusted-proxy", "127.0.0.1/32"]);
        }
        let p = builder.start();
        let nginx = switchboard_tests::nginx::Nginx::start(&binary, &[("a", p.addr)]);
        let status = open_from(&python, nginx.addr, ALICE.1);
        assert!(status.contains("200"), "{status}\n{}", nginx.error_log());
        let all = events(&log, |e| e.iter().any(|e| e["type"] == "session_open"));
        let open = all
            .iter()
            .find(|e| e["type"] == "session_open")
            .expect("session_open");
        assert_eq!(
            open["source"]["value"], expected,
            "trusted: {trusted}: {open}"
        );
    }
}

const BOB: (&str, &str) = ("bob", "bob-token-0123456789abcdefghij");

/// Every refusal, by the gate, the hub or the framing rules, is exactly one event that
/// names its endpoint (under `--base-path`) and transport: a refused credential's
/// `auth_failure` too. A path that is neither transport's is named as asked, without its
/// query, with `transport` null.
fn every_refusal_is_one_event_with_its_endpoint_and_transport(target: Target) {
    let dir = TempDir::new("audit-refusals");
    let log = dir.file("audit.jsonl");
    let p = Proxy::builder(target)
        .tokens(&[ALICE, BOB])
        .args(["--base-path", "/bp"])
        .args(["--audit-log".to_owned(), log.display().to_string()])
        .health_path("/bp/health")
        .start();
    let alice = format!("Bearer {}", ALICE.1);
    let wrong = format!("Bearer {WRONG}");
    let bobs = switchboard_tests::mcp::McpSession::start_at(p.addr, "/bp/mcp", Some(BOB.1));
    let mut seen = events(&log, |e| e.len() >= 2).len();
    assert_eq!(seen, 2, "bob's session_open and mcp_initialize");
    let init = switchboard_tests::mcp::initialize_body(1);
    let (json, both) = ("application/json", "application/json, text/event-stream");
    let post = |headers: &[(&str, &str)]| {
        let mut all = headers.to_vec();
        for (name, value) in [("Content-Type", json), ("Accept", both)] {
            if !headers.iter().any(|(n, _)| *n == name) {
                all.push((name, value));
            }
        }
        p.request("POST", "/bp/mcp", &all, Body::json(&init))
    };
    let foreign = [
        ("Authorization", alice.as_str()),
        ("Mcp-Session-Id", bobs.sid.as_str()),
    ];
    let unknown = [
        ("Authorization", alice.as_str()),
        ("Mcp-Session-Id", "6f1c2a9e-8a1b-4c3d-9e2f-0a1b2c3d4e5f"),
        ("Accept", "text/event-stream"),
    ];
    let evil_origin = [
        ("Authorization", alice.as_str()),
        ("Origin", "http://evil.example"),
    ];
    let evil_host = [("Authorization", alice.as_str()), ("Host", "evil.example")];
    let bad_accept = [("Authorization", alice.as_str()), ("Accept", "text/plain")];
    let twice = [
        ("Authorization", alice.as_str()),
        ("Origin", "http://localhost"),
        ("Origin", "http://localhost:1"),
    ];
    let auth = [("Authorization", alice.as_str())];
    // (what, the answer's status, type, outcome, endpoint, transport)
    type Case<'a> = (&'a str, u16, &'a str, &'a str, &'a str, Option<&'a str>);
    let cases: [(Case, Box<dyn Fn() -> u16 + '_>); 11] = [
        (
            (
                "wrong token",
                401,
                "auth_failure",
                "denied",
                "/bp/mcp",
                Some("streamable-http"),
            ),
            Box::new(|| post(&[("Authorization", wrong.as_str())]).status),
        ),
        (
            (
                "Origin",
                403,
                "mcp_request",
                "denied",
                "/bp/mcp",
                Some("streamable-http"),
            ),
            Box::new(|| post(&evil_origin).status),
        ),
        (
            (
                "Host",
                403,
                "session_open",
                "denied",
                "/bp/sse",
                Some("sse"),
            ),
            Box::new(|| p.request("GET", "/bp/sse", &evil_host, Body::None).status),
        ),
        (
            (
                "DELETE foreign",
                404,
                "session_close",
                "error",
                "/bp/mcp",
                Some("streamable-http"),
            ),
            Box::new(|| p.request("DELETE", "/bp/mcp", &foreign, Body::None).status),
        ),
        (
            (
                "GET unknown",
                404,
                "mcp_request",
                "error",
                "/bp/mcp",
                Some("streamable-http"),
            ),
            Box::new(|| p.request("GET", "/bp/mcp", &unknown, Body::None).status),
        ),
        (
            (
                "405 /mcp",
                405,
                "mcp_request",
                "error",
                "/bp/mcp",
                Some("streamable-http"),
            ),
            Box::new(|| p.request("PUT", "/bp/mcp", &auth, Body::None).status),
        ),
        (
            (
                "405 messages",
                405,
                "mcp_request",
                "error",
                "/bp/sse",
                Some("sse"),
            ),
            Box::new(|| p.request("GET", "/bp/messages", &auth, Body::None).status),
        ),
        (
            ("404 path", 404, "mcp_request", "error", "/bp/nope", None),
            Box::new(|| {
                p.request("GET", "/bp/nope?secret=s3cr3t", &auth, Body::None)
                    .status
            }),
        ),
        (
            (
                "406 POST",
                406,
                "mcp_request",
                "error",
                "/bp/mcp",
                Some("streamable-http"),
            ),
            Box::new(|| post(&bad_accept).status),
        ),
        (
            (
                "406 GET",
                406,
                "mcp_request",
                "error",
                "/bp/mcp",
                Some("streamable-http"),
            ),
            Box::new(|| p.request("GET", "/bp/mcp", &foreign, Body::None).status),
        ),
        (
            (
                "Origin twice",
                400,
                "mcp_request",
                "error",
                "/bp/mcp",
                Some("streamable-http"),
            ),
            Box::new(|| post(&twice).status),
        ),
    ];
    for ((what, status, kind, outcome, endpoint, transport), send) in &cases {
        assert_eq!(send(), *status, "{what}");
        let all = events(&log, |e| e.len() > seen);
        let e = all.get(seen).unwrap_or_else(|| panic!("{what}: no event"));
        assert_eq!(
            kind_and_outcome(e),
            (kind.to_string(), outcome.to_string()),
            "{what}: {e}"
        );
        assert_eq!(e["target"]["endpoint"], *endpoint, "{what}: {e}");
        let wire = transport.map_or(Value::Null, Value::from);
        assert_eq!(e["metadata"]["extra"]["transport"], wire, "{what}: {e}");
        assert_eq!(e["source"]["value"], "127.0.0.1", "{what}: {e}");
        seen += 1;
    }
    // The foreign session was not disturbed, and nothing else was written: one more
    // refusal's event comes next, right after those above.
    assert_eq!(
        bobs.post(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#)
            .status(),
        200
    );
    assert_eq!(post(&[("Authorization", wrong.as_str())]).status, 401);
    let all = events(&log, |e| {
        e.iter().skip(seen).any(|e| e["type"] == "auth_failure")
    });
    let kinds: Vec<_> = all[seen..].iter().map(kind_and_outcome).collect();
    let want = [("mcp_ping", "success"), ("auth_failure", "denied")];
    let want: Vec<_> = want
        .iter()
        .map(|(k, o)| (k.to_string(), o.to_string()))
        .collect();
    assert_eq!(kinds, want, "{all:#?}");
    assert!(!std::fs::read_to_string(&log).unwrap().contains("s3cr3t"));
}

/// A refusal echoes a browser's `Origin` in `Access-Control-Allow-Origin` only when that
/// origin is allowed (SPEC section 1): 401, 404 and 405 alike.
fn only_an_allowed_origin_is_echoed_on_a_refusal(target: Target) {
    let p = Proxy::builder(target)
        .tokens(&[ALICE])
        .args(["--allow-origin", "https://app.example"])
        .start();
    let alice = format!("Bearer {}", ALICE.1);
    for origin in [
        "http://evil.example",
        "http://localhost:3000",
        "https://app.example",
    ] {
        let allowed = origin != "http://evil.example";
        let gone = if allowed { 404 } else { 403 };
        let with_token = vec![("Origin", origin), ("Authorization", alice.as_str())];
        let refusals = [
            (401, "POST", "/mcp", vec![("Origin", origin)]),
            (404, "GET", "/nope", vec![("Origin", origin)]),
            (405, "PUT", "/mcp", vec![("Origin", origin)]),
            (405, "POST", "/health", vec![("Origin", origin)]),
            // An unknown session: the hub's 404, or the gate's 403 for a bad origin.
            (gone, "POST", "/messages?session_id=gone", with_token),
        ];
        for (status, method, path, headers) in refusals {
            let r = p.request(method, path, &headers, Body::json("{}"));
            assert_eq!(r.status, status, "{method} {path} from {origin}");
            let echoed = r.header("access-control-allow-origin");
            let want = allowed.then_some(origin);
            assert_eq!(echoed, want, "{method} {path} from {origin}: {}", r.status);
        }
    }
}

/// A request whose head the HTTP library refuses itself (two different Content-Lengths) is
/// audited like every refusal (SPEC 11), on both binaries: one event, its 400 a denial of a
/// request that named no endpoint.
fn a_request_refused_for_its_framing_is_one_event(target: Target) {
    use std::io::{Read, Write};
    let dir = TempDir::new("audit-framing");
    let log = dir.file("audit.jsonl");
    let p = Proxy::builder(target)
        .args(["--audit-log".to_owned(), log.display().to_string()])
        .start();
    let before = events(&log, |_| false).len();
    let mut socket = std::net::TcpStream::connect(p.addr).expect("connect");
    socket.set_read_timeout(Some(WAIT)).unwrap();
    let request = "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!";
    socket.write_all(request.as_bytes()).expect("write");
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{target:?}: {answer}");
    let seen = events(&log, |e| e.len() > before);
    assert_eq!(seen.len(), before + 1, "{target:?}: {seen:#?}");
    let event = &seen[before];
    assert_eq!(event["type"], "mcp_request", "{event}");
    assert_ne!(event["outcome"], "success", "{event}");
    assert_eq!(event["source"]["value"], "127.0.0.1", "{event}");
}

suite!(
    a_request_refused_for_its_framing_is_one_event,
    an_sdk_session_produces_exactly_the_expected_events,
    behind_nginx_the_client_address_comes_only_from_a_trusted_proxy,
    every_refusal_is_one_event_with_its_endpoint_and_transport,
    only_an_allowed_origin_is_echoed_on_a_refusal
);
