//! Interop with the official Python MCP SDK clients, the legacy one
//! (`mcp.client.sse.sse_client`) on `/sse` and the Streamable HTTP one
//! (`mcp.client.streamable_http.streamable_http_client`) on `/mcp`, through the real binary:
//! against the real `mcp-server-time`, the built-in demo server, and `test-backend
//! --fail-second-initialize` (a server that, like the Go SDK's, rejects a second handshake),
//! one client at a time and several of both transports at once. Every SDK client numbers
//! its requests from 0, so concurrent clients always send colliding ids. Against
//! `test-backend`, clients of both transports keep their sessions and subscriptions while
//! the backend is killed and restarted (SPEC 12, `tests/python/sdk_restart.py`).
//!
//! Needs `SWITCHBOARD_PYTHON` pointing at a Python with `mcp` (and `mcp-server-time` beside
//! it); `tests/run.sh` sets that up. Without it the tests skip loudly, or fail when `CI=true`.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchboard_tests::{suite, workspace_root, Proxy, Target};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");

/// The Python to run the SDK with, or `None` (after saying why) when the test must skip.
fn python() -> Option<PathBuf> {
    let why = match std::env::var_os("SWITCHBOARD_PYTHON") {
        None => "SWITCHBOARD_PYTHON is not set (run tests/run.sh)".to_owned(),
        Some(p) => {
            let p = PathBuf::from(p);
            let probe = Command::new(&p)
                .args(["-c", "import mcp.client.sse, mcp.client.streamable_http"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output();
            match probe {
                Ok(o) if o.status.success() => return Some(p),
                Ok(o) => format!(
                    "{} cannot import the mcp package: {}",
                    p.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                Err(e) => format!("cannot run SWITCHBOARD_PYTHON={}: {e}", p.display()),
            }
        }
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("Python SDK interop cannot run in CI: {why}");
    }
    // Straight to the stream, past the test harness's capture, so a skip is never silent.
    let msg = format!("\n**********\nSKIPPED: Python SDK interop test: {why}\n**********\n");
    let _ = std::io::stderr().write_all(msg.as_bytes());
    None
}

/// `mcp-server-time` installed beside the Python (a venv's `bin/`).
fn mcp_server_time(python: &Path) -> PathBuf {
    let exe = python
        .parent()
        .map(|d| d.join("mcp-server-time"))
        .filter(|p| p.is_file());
    match exe {
        Some(p) => p,
        None => panic!(
            "mcp-server-time is not installed beside {} (pip install mcp-server-time)",
            python.display()
        ),
    }
}

/// Runs `tests/python/SCRIPT ARGS...` against `proxy` (waiting at most 150 s) and returns
/// the one JSON line it prints; fails with its stderr when it fails.
fn run_script(python: &Path, proxy: &Proxy, script: &str, args: &[String]) -> Value {
    const LIMIT: Duration = Duration::from_secs(150);
    let path = workspace_root().join("tests/python").join(script);
    let out_path = proxy.dir().file(&format!("{script}-stdout.txt"));
    let err_path = proxy.dir().file(&format!("{script}-stderr.txt"));
    let mut child = Command::new(python)
        .arg(&path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the SDK client") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{script} did not finish within {LIMIT:?}:\n{}\n--- proxy log ---\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default(),
                proxy.log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(
        status.success(),
        "{script} failed ({status}):\n{stderr}\n--- stdout ---\n{stdout}\n--- proxy log ---\n{}",
        proxy.log()
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{script} output is not JSON ({e}): {stdout:?}\n{stderr}"))
}

/// Runs `sdk_client.py` with one SDK client per `(transport, args)` (`sse` or `mcp`), all at
/// once; returns each client's summary in order.
fn sdk_clients(python: &Path, proxy: &Proxy, tool: &str, clients: &[(&str, Value)]) -> Vec<Value> {
    let mut args = vec![format!("http://{}", proxy.addr), tool.to_owned()];
    args.extend(
        clients
            .iter()
            .map(|(transport, args)| format!("{transport}={args}")),
    );
    let summary = run_script(python, proxy, "sdk_client.py", &args);
    let got = summary["clients"].as_array().cloned().unwrap_or_default();
    assert_eq!(got.len(), clients.len(), "{summary}");
    for (got, (transport, _)) in got.iter().zip(clients) {
        assert_eq!(got["transport"], *transport, "{summary}");
    }
    got
}

fn time_result(client: &Value) -> Value {
    assert_eq!(client["is_error"], false, "{client}");
    let text = client["texts"][0]
        .as_str()
        .unwrap_or_else(|| panic!("{client}"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn sdk_through_proxy_to_mcp_server_time(target: Target) {
    let Some(python) = python() else { return };
    let server = mcp_server_time(&python);
    let p = Proxy::builder(target)
        .backend([server.display().to_string()])
        .start();
    for transport in ["sse", "mcp"] {
        let one = sdk_clients(
            &python,
            &p,
            "get_current_time",
            &[(transport, json!({"timezone": "UTC"}))],
        );
        assert_eq!(one[0]["server"], "mcp-time", "{}", one[0]);
        let tools: Vec<&str> = one[0]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            tools.contains(&"get_current_time"),
            "{transport}: {tools:?}"
        );
        assert_eq!(time_result(&one[0])["timezone"], "UTC", "{}", one[0]);
    }

    // Four SDK clients at once, two per transport, with the same ids: each must get its own
    // timezone back.
    let clients = [
        ("sse", "UTC"),
        ("mcp", "Asia/Tokyo"),
        ("sse", "Europe/Paris"),
        ("mcp", "America/New_York"),
    ]
    .map(|(t, z)| (t, json!({"timezone": z})));
    let all = sdk_clients(&python, &p, "get_current_time", &clients);
    for (client, (_, args)) in all.iter().zip(&clients) {
        assert_eq!(
            time_result(client)["timezone"],
            args["timezone"],
            "{client}"
        );
    }
}

/// The built-in demo server (no command after `--`), over both transports at once.
fn sdk_through_proxy_to_the_demo_server(target: Target) {
    let Some(python) = python() else { return };
    let p = Proxy::builder(target).start();
    let clients: Vec<(&str, Value)> = (0..4)
        .map(|i| {
            let transport = if i % 2 == 0 { "mcp" } else { "sse" };
            (
                transport,
                json!({"text": format!("{transport} client {i}")}),
            )
        })
        .collect();
    let out = sdk_clients(&python, &p, "echo", &clients);
    for (client, (_, args)) in out.iter().zip(&clients) {
        assert_eq!(client["server"], "switchboard-demo", "{client}");
        assert_eq!(client["is_error"], false, "{client}");
        assert_eq!(client["texts"][0], args["text"], "{client}");
    }
}

fn sdk_clients_share_a_server_that_rejects_a_second_initialize(target: Target) {
    let Some(python) = python() else { return };
    let p = Proxy::builder(target)
        .backend([BACKEND, "--fail-second-initialize"])
        .record()
        .start();
    // Three clients one after another...
    for i in 0..3 {
        let args = json!({"client": i, "mode": "sequential"});
        let transport = if i == 1 { "mcp" } else { "sse" };
        let out = sdk_clients(&python, &p, "echo", &[(transport, args.clone())]);
        assert_eq!(out[0]["server"], "test-backend", "{}", out[0]);
        assert_eq!(out[0]["is_error"], false, "{}", out[0]);
        let echoed: Value = serde_json::from_str(out[0]["texts"][0].as_str().unwrap()).unwrap();
        assert_eq!(echoed, args, "client {i} got someone else's answer");
    }
    // ...and six at once, three per transport.
    let args: Vec<(&str, Value)> = (0..6)
        .map(|i| {
            let transport = if i % 2 == 0 { "sse" } else { "mcp" };
            (transport, json!({"client": i, "mode": "concurrent"}))
        })
        .collect();
    let out = sdk_clients(&python, &p, "echo", &args);
    for (client, (_, want)) in out.iter().zip(&args) {
        let echoed: Value = serde_json::from_str(client["texts"][0].as_str().unwrap()).unwrap();
        assert_eq!(&echoed, want, "{client}");
    }
    let inits = p.recorded_initializes();
    assert_eq!(
        inits, 1,
        "nine SDK clients must cause exactly one backend initialize"
    );
}

/// SPEC 12 with the real SDK clients: two legacy (`sse_client`) and two Streamable
/// (`streamable_http_client`) clients, each subscribed to a uri of its own and with a call in
/// flight, while the backend is killed (SIGKILL to the pid `/health` reports). Each keeps its
/// one session (no second initialize, no second subscribe, one session id on every request),
/// gets -32603 `backend restarted` for the call in flight, gets its answers from the new
/// process, hears the three `list_changed`, and its subscription, renewed by the proxy, still
/// delivers `resources/updated` (the new process knows only the subscriptions sent to it).
fn sdk_sessions_survive_a_killed_backend(target: Target) {
    let Some(python) = python() else { return };
    let p = Proxy::builder(target).backend([BACKEND]).record().start();
    let transports = ["sse", "mcp", "sse", "mcp"];
    let mut args = vec![
        format!("http://{}", p.addr),
        p.record_path().display().to_string(),
        "test://switchboard/doc".to_owned(),
    ];
    args.extend(transports.map(String::from));
    let report = run_script(&python, &p, "sdk_restart.py", &args);

    let pids = report["pids"].as_array().expect("pids");
    assert!(
        pids.len() == 2 && pids[0] != pids[1],
        "a new backend process: {report}"
    );
    let clients = report["clients"].as_array().expect("clients");
    assert_eq!(clients.len(), transports.len(), "{report}");
    let uris: Vec<&str> = clients.iter().filter_map(|c| c["uri"].as_str()).collect();
    for (index, (c, transport)) in clients.iter().zip(transports).enumerate() {
        assert_eq!(c["transport"], transport, "{c}");
        let uri = c["uri"].as_str().unwrap_or_else(|| panic!("{c}"));
        let sessions = c["sessions"].as_array().expect("sessions");
        assert_eq!(
            sessions.len(),
            1,
            "{transport}: one session on every request: {c}"
        );
        let sent = |m: &str| {
            c["methods"]
                .as_array()
                .expect("methods")
                .iter()
                .filter(|x| *x == m)
                .count()
        };
        assert_eq!(sent("initialize"), 1, "{transport}: no new initialize: {c}");
        assert_eq!(
            sent("resources/subscribe"),
            1,
            "{transport}: the client subscribed once: {c}"
        );
        assert_eq!(
            c["in_flight"],
            json!({"code": -32603, "message": "backend restarted"}),
            "{transport}: the call in flight: {c}"
        );
        assert_eq!(
            c["echo"],
            json!({"after": "restart", "transport": transport, "index": index}),
            "{transport}: a call after the restart: {c}"
        );
        assert_eq!(
            c["touched"],
            json!([{"uri": uri, "notified": true}, {"uri": uri, "notified": true}]),
            "{transport}: both processes held the subscription: {c}"
        );
        let updated = format!("notifications/resources/updated {uri}");
        let heard = |when: &str| -> Vec<&str> {
            c[when]
                .as_array()
                .expect("notifications")
                .iter()
                .filter_map(Value::as_str)
                .collect()
        };
        assert_eq!(heard("before"), [updated.as_str()], "{transport}: {c}");
        let after = heard("after");
        for want in [
            "notifications/tools/list_changed",
            "notifications/resources/list_changed",
            "notifications/prompts/list_changed",
            updated.as_str(),
        ] {
            assert_eq!(
                after.iter().filter(|m| **m == want).count(),
                1,
                "{transport}: after the restart, {want} once: {c}"
            );
        }
        assert_eq!(after.len(), 4, "{transport}: nothing else: {c}");
    }
    // The sessions were distinct, and each subscription reached both processes.
    let sids: BTreeSet<&str> = clients
        .iter()
        .filter_map(|c| c["sessions"][0].as_str())
        .collect();
    assert_eq!(sids.len(), clients.len(), "{report}");
    assert_eq!(
        p.recorded_initializes(),
        2,
        "one initialize per backend process"
    );
    for uri in &uris {
        let subscribes = p
            .recorded()
            .iter()
            .filter(|l| l.contains("\"resources/subscribe\"") && l.contains(&format!("\"{uri}\"")))
            .count();
        assert_eq!(subscribes, 2, "{uri}: subscribed on each backend process");
    }
    let (_, health) = p.health();
    assert_eq!(health["backend"]["restarts"], json!(1), "{health}");
}

suite!(
    sdk_sessions_survive_a_killed_backend,
    sdk_through_proxy_to_mcp_server_time,
    sdk_through_proxy_to_the_demo_server,
    sdk_clients_share_a_server_that_rejects_a_second_initialize,
);
