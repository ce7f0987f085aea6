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

suite!(
    an_sdk_session_produces_exactly_the_expected_events,
    behind_nginx_the_client_address_comes_only_from_a_trusted_proxy
);
