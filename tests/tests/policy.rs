//! SPEC section 10's authorization policy end to end on both binaries: the official Python SDK
//! client (`tests/python/policy_client.py`) on `/sse` and `/mcp` against the real
//! `mcp-server-time`, under one ToolHive-format YAML policy file. A static-token principal
//! and JWT principals (claims as `claim_<name>`) see different `tools/list` results; a call
//! the policy does not permit, or whose arguments a `forbid` rule names, gets -32003 under its
//! own id and never reaches the backend. SIGHUP re-reads the policy: a new one is in force at
//! once, a broken one keeps the old and is counted.
//!
//! Needs `SWITCHBOARD_PYTHON` (see `python_sdk.rs`); `tests/run.sh` sets it up.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use switchboard_tests::python::{mcp_server_time, python, run_script};
use switchboard_tests::{echoed_args, open_session, suite, McpSession, Proxy, Target, TempDir};

const ALICE: (&str, &str) = ("alice", "alice-token-0123456789abcdef");
const ISSUER: &str = "https://idp.test";
const AUDIENCE: &str = "switchboard";

/// Alice (a static token) may use `get_current_time`, but only for Oslo; a JWT whose `roles`
/// claim holds `admin` may call every tool. Everything else is denied.
const POLICY: &str = r#"# ToolHive's Cedar authorization file, unchanged.
version: "1.0"
type: cedarv1
cedar:
  policies:
    - 'permit(principal == Client::"alice", action == Action::"call_tool", resource == Tool::"get_current_time");'
    - 'forbid(principal == Client::"alice", action == Action::"call_tool", resource == Tool::"get_current_time") when { resource has arg_timezone && resource.arg_timezone != "Europe/Oslo" };'
    - 'permit(principal, action == Action::"call_tool", resource) when { principal has claim_roles && principal.claim_roles.contains("admin") };'
  entities_json: "[]"
"#;

fn secret_path() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/jwt/hs256.secret");
    dir.display().to_string()
}

/// An HS256 token for `sub` with `roles`, valid for ten minutes.
fn jwt(sub: &str, roles: &[&str]) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let claims = json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": sub, "roles": roles,
        "iat": now - 5, "exp": now + 600,
    });
    let secret = std::fs::read(secret_path()).expect("the HS256 fixture");
    let key = EncodingKey::from_secret(secret.trim_ascii()).expect("an HS256 key");
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).expect("signs")
}

/// One SDK client with `token` on `transport`: its tool names and each call's outcome.
fn client(python: &Path, p: &Proxy, token: &str, transport: &str, calls: Value) -> Value {
    let args = [
        format!("http://{}", p.addr),
        token.to_owned(),
        transport.to_owned(),
        calls.to_string(),
    ];
    run_script(python, p, "policy_client.py", &args)
}

fn tool_names(out: &Value) -> Vec<String> {
    let mut names: Vec<String> = (out["tools"].as_array().into_iter().flatten())
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

fn assert_denied(call: &Value) {
    assert_eq!(call["ok"], false, "{call}");
    assert_eq!(call["code"], -32003, "{call}");
    assert_eq!(call["message"], "forbidden by policy", "{call}");
}

fn policy_file(dir: &TempDir) -> String {
    let path = dir.file("policy.yaml");
    std::fs::write(&path, POLICY).expect("write the policy");
    path.display().to_string()
}

fn static_principal_sees_and_calls_what_the_policy_permits(target: Target) {
    let Some(python) = python() else { return };
    let server = mcp_server_time(&python).display().to_string();
    let dir = TempDir::new("policy");
    let p = Proxy::builder(target)
        .backend([server])
        .tokens(&[ALICE])
        .args(["--authz-config", &policy_file(&dir)])
        .start();
    let calls = json!([
        ["get_current_time", {"timezone": "Europe/Oslo"}],
        ["get_current_time", {"timezone": "Asia/Tokyo"}],
        ["convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}],
    ]);
    for transport in ["sse", "mcp"] {
        let out = client(&python, &p, ALICE.1, transport, calls.clone());
        assert_eq!(tool_names(&out), ["get_current_time"], "{transport}: {out}");
        let calls = &out["calls"];
        assert_eq!(calls[0]["ok"], true, "{transport}: {out}");
        assert!(calls[0]["texts"][0]
            .as_str()
            .unwrap_or("")
            .contains("Europe/Oslo"));
        assert_denied(&calls[1]);
        assert_denied(&calls[2]);
    }
    // The backend would have answered the denied calls; the proxy did (-32003) instead.
    assert_eq!(p.metric("switchboard_policy_denied_total"), Some(4.0));
    assert_eq!(p.metric("switchboard_list_entries_hidden_total"), Some(2.0));
}

fn jwt_principals_are_judged_by_their_claims(target: Target) {
    let Some(python) = python() else { return };
    let server = mcp_server_time(&python).display().to_string();
    let dir = TempDir::new("policy-jwt");
    let p = Proxy::builder(target)
        .backend([server])
        .args(["--jwt-secret-file", &secret_path()])
        .args(["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE])
        .args(["--authz-config", &policy_file(&dir)])
        .start();
    let calls = json!([
        ["convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}],
    ]);
    let admin = jwt("ops", &["admin"]);
    let viewer = jwt("viewer", &["viewer"]);
    for transport in ["sse", "mcp"] {
        let out = client(&python, &p, &admin, transport, calls.clone());
        assert_eq!(
            tool_names(&out),
            ["convert_time", "get_current_time"],
            "{transport}: {out}"
        );
        assert_eq!(out["calls"][0]["ok"], true, "{transport}: {out}");
        let out = client(&python, &p, &viewer, transport, calls.clone());
        assert!(tool_names(&out).is_empty(), "{transport}: {out}");
        assert_denied(&out["calls"][0]);
    }
}

/// A burst past `--tool-rate-limit`, with the policy on: the SDK client on `/mcp` gets the
/// 429's JSON-RPC error (-32029) for its own call. (The Python SDK's legacy client fails its
/// whole session on any non-2xx POST, so `/sse` is left to `limits.rs`' raw requests.)
fn sdk_burst_is_rate_limited(target: Target) {
    let Some(python) = python() else { return };
    let server = mcp_server_time(&python).display().to_string();
    let dir = TempDir::new("policy-burst");
    let p = Proxy::builder(target)
        .backend([server])
        .tokens(&[ALICE])
        .args(["--authz-config", &policy_file(&dir)])
        .args(["--tool-rate-limit", "get_current_time=2/min"])
        .start();
    let oslo = json!(["get_current_time", {"timezone": "Europe/Oslo"}]);
    let out = client(&python, &p, ALICE.1, "mcp", json!([oslo, oslo, oslo, oslo]));
    let ok: Vec<&Value> = (out["calls"].as_array().into_iter().flatten())
        .map(|c| &c["ok"])
        .collect();
    assert_eq!(ok, [true, true, false, false], "{out}");
    assert_eq!(out["calls"][2]["code"], -32029, "{out}");
    assert_eq!(out["calls"][3]["message"], "rate limit exceeded", "{out}");
}

/// SIGHUP re-reads the policy named in the `--config` file (relative to it): a new policy
/// is in force for the next request; a broken one keeps the old in force and is counted.
fn reload_replaces_the_policy_and_a_broken_one_changes_nothing(target: Target) {
    let Some(python) = python() else { return };
    let server = mcp_server_time(&python).display().to_string();
    let dir = TempDir::new("policy-reload");
    policy_file(&dir);
    std::fs::write(dir.file("tokens.txt"), format!("{} {}\n", ALICE.0, ALICE.1)).unwrap();
    let config = dir.file("switchboard.toml");
    let toml = "auth-tokens = \"tokens.txt\"\nauthz-config = \"policy.yaml\"\n";
    std::fs::write(&config, toml).unwrap();
    let p = Proxy::builder(target)
        .backend([server])
        .args(["--config".to_owned(), config.display().to_string()])
        .start();
    let sees = || tool_names(&client(&python, &p, ALICE.1, "mcp", json!([])));
    assert_eq!(sees(), ["get_current_time"]);
    let convert_only = POLICY.replace("Tool::\"get_current_time\");'", "Tool::\"convert_time\");'");
    std::fs::write(dir.file("policy.yaml"), convert_only).unwrap();
    hang_up_and_wait(&p, "switchboard_reloads_total", 1.0);
    assert_eq!(sees(), ["convert_time"]);
    std::fs::write(
        dir.file("policy.yaml"),
        "version: '1.0'\ntype: cedarv1\ncedar: {policies: ['permit(']}\n",
    )
    .unwrap();
    hang_up_and_wait(&p, "switchboard_reload_failures_total", 1.0);
    assert_eq!(sees(), ["convert_time"]);
    assert!(p.log().contains("policy.yaml"), "{}", p.log());
}

/// A limit on an argument, and the numbers that slipped past it: ones Cedar cannot hold were
/// left out of the request, so `resource has arg_amount` was false and the call went through.
fn numbers_cedar_cannot_hold_are_denied(target: Target) {
    const LIMIT: &str = r#"{"version":"1.0","type":"cedarv1","cedar":{"policies":[
        "permit(principal, action == Action::\"call_tool\", resource);",
        "forbid(principal, action == Action::\"call_tool\", resource) when { resource has arg_amount && resource.arg_amount > 1000 };"
    ],"entities_json":"[]"}}"#;
    let dir = TempDir::new("policy-numbers");
    let path = dir.file("policy.json");
    std::fs::write(&path, LIMIT).expect("write the policy");
    let p = Proxy::builder(target)
        .backend([env!("CARGO_BIN_EXE_test-backend")])
        .args(["--authz-config", &path.display().to_string()])
        .record()
        .start();
    // Written as raw text: a JSON library would reformat the numbers.
    let body = |id: u64, amount: &str, note: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"amount":{amount},"note":"{note}"}}}}}}"#
        )
    };
    let denied = [
        "1e15",
        "1001.00001",
        "18446744073709551615",
        "1000000000000000",
    ];
    let mut legacy = open_session(&p, None);
    legacy.initialize();
    let mcp = McpSession::start(&p, None);
    for (n, amount) in denied.iter().enumerate() {
        let id = 100 + n as u64;
        let r = legacy.post(&body(id, amount, "MARK-REJECTED"));
        assert_eq!(r.status, 202, "{amount}: {}", r.text());
        let m = legacy.expect_message(&format!("the answer to amount {amount}"));
        assert_eq!(m["id"], id, "{amount}: {m}");
        assert_eq!(m["error"]["code"], -32003, "/sse, amount {amount}: {m}");
        let (_, m) = mcp.post(&body(id, amount, "MARK-REJECTED")).response();
        assert_eq!(m["id"], id, "{amount}: {m}");
        assert_eq!(m["error"]["code"], -32003, "/mcp, amount {amount}: {m}");
    }
    // Ordinary numbers are judged as before: within the limit the call reaches the tool.
    let r = legacy.post(&body(200, "1000", "allowed"));
    assert_eq!(r.status, 202, "{}", r.text());
    let m = legacy.expect_message("the answer to amount 1000");
    assert_eq!(echoed_args(&m), json!({"amount": 1000, "note": "allowed"}));
    let (_, m) = mcp.post(&body(200, "7", "allowed")).response();
    assert!(m["result"].is_object(), "{m}");
    legacy.sync();
    p.assert_nothing_rejected_reached_the_backend();
    assert_eq!(p.metric("switchboard_policy_denied_total"), Some(8.0));
}

/// Sends SIGHUP and waits until `/metrics` shows `series` at `value`.
fn hang_up_and_wait(p: &Proxy, series: &str, value: f64) {
    p.signal(libc::SIGHUP);
    let deadline = std::time::Instant::now() + switchboard_tests::WAIT;
    while p.metric(series) != Some(value) {
        assert!(
            std::time::Instant::now() < deadline,
            "{series}: {}",
            p.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

suite!(
    numbers_cedar_cannot_hold_are_denied,
    reload_replaces_the_policy_and_a_broken_one_changes_nothing,
    static_principal_sees_and_calls_what_the_policy_permits,
    jwt_principals_are_judged_by_their_claims,
    sdk_burst_is_rate_limited
);
