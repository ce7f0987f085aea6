//! SPEC section 10's configuration file and reload on both binaries: `--config` names a
//! tokens file by a path relative to itself; SIGHUP reads both again. A principal removed
//! from the tokens file loses its sessions (both transports) and its token gets 401, others
//! keep theirs; a broken tokens file changes nothing and is counted; a new `rate-limit` in
//! the config file is used after SIGHUP, and a restart-only key is logged as ignored; key
//! sets fetched from a real OpenID provider stay in use across a reload, not fetched again.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use switchboard_tests::oidc::oidc_provider;
use switchboard_tests::{
    echo_body, open_session, suite, try_open_session, Body, McpSession, OpenOptions, Proxy, Target,
    TempDir, WAIT,
};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");
const ALICE: (&str, &str) = ("alice", "alice-token-0123456789abcdef");
const BOB: (&str, &str) = ("bob", "bob-token-fedcba9876543210xyz");

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn tokens(entries: &[(&str, &str)]) -> String {
    entries.iter().map(|(p, t)| format!("{p} {t}\n")).collect()
}

/// A proxy started with `--config <dir>/switchboard.toml` holding `config`.
fn start(target: Target, dir: &TempDir, config: &str) -> Proxy {
    let file = dir.file("switchboard.toml");
    write(&file, config);
    Proxy::builder(target)
        .backend([BACKEND])
        .args(["--config".to_owned(), file.display().to_string()])
        .start()
}

/// Sends SIGHUP and waits until `/metrics` shows `series` at `value`.
fn reload(p: &Proxy, series: &str, value: f64) {
    p.signal(libc::SIGHUP);
    let deadline = Instant::now() + WAIT;
    while p.metric(series) != Some(value) {
        assert!(
            Instant::now() < deadline,
            "{series} is not {value} after SIGHUP: {:?}\n{}",
            p.metric(series),
            p.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn opens(p: &Proxy, token: &str) -> Result<(), u16> {
    let options = OpenOptions {
        token: Some(token.to_owned()),
        ..OpenOptions::default()
    };
    try_open_session(p.addr, &options)
        .map(|_| ())
        .map_err(|r| r.status)
}

fn a_removed_token_ends_its_sessions(target: Target) {
    let dir = TempDir::new("reload-tokens");
    write(&dir.file("tokens.txt"), &tokens(&[ALICE, BOB]));
    // A path relative to the config file's folder, not the working folder.
    let p = start(target, &dir, "auth-tokens = \"tokens.txt\"\n");
    let mut alice = open_session(&p, Some(ALICE.1));
    alice.initialize();
    let mut bob = open_session(&p, Some(BOB.1));
    bob.initialize();
    let _alice_mcp = McpSession::start(&p, Some(ALICE.1));
    let bob_mcp = McpSession::start(&p, Some(BOB.1));
    assert_eq!(p.metric("switchboard_sessions"), Some(4.0));

    write(&dir.file("tokens.txt"), &tokens(&[BOB]));
    reload(&p, "switchboard_reloads_total", 1.0);
    assert!(alice.wait_closed(WAIT), "alice's stream still open");
    assert_eq!(p.metric("switchboard_sessions"), Some(2.0));
    assert_eq!(opens(&p, ALICE.1), Err(401));
    assert!(bob.call("echo", json!({"n": 1}))["result"].is_object());
    let answer = bob_mcp.call(json!(2), "echo", json!({"n": 2}));
    assert!(answer["result"].is_object(), "{answer}");

    // A broken file: the old tokens stay in force, the failure is counted and logged.
    write(&dir.file("tokens.txt"), "bob short\n");
    reload(&p, "switchboard_reload_failures_total", 1.0);
    assert_eq!(p.metric("switchboard_reloads_total"), Some(1.0));
    assert!(p.log().contains("tokens.txt"), "{}", p.log());
    assert_eq!(opens(&p, BOB.1), Ok(()));
    assert_eq!(opens(&p, ALICE.1), Err(401));
    let answer = bob_mcp.call(json!(3), "echo", json!({"n": 3}));
    assert!(answer["result"].is_object(), "{answer}");
}

fn a_new_rate_limit_takes_effect(target: Target) {
    let dir = TempDir::new("reload-rate");
    write(&dir.file("tokens.txt"), &tokens(&[ALICE]));
    let p = start(
        target,
        &dir,
        "auth-tokens = \"tokens.txt\"\nrate-limit = \"2/min\"\n",
    );
    let mut alice = open_session(&p, Some(ALICE.1));
    alice.initialize();
    let _ = alice.call("echo", json!({"n": 1}));
    let status = alice.post(&echo_body("3", json!({"n": 3}))).status;
    assert_eq!(status, 429);

    // 600/min refills 10 a second; the old 2/min would take 30 s for one.
    write(
        &dir.file("switchboard.toml"),
        "auth-tokens = \"tokens.txt\"\nrate-limit = \"600/min\"\ninstance = \"other\"\n",
    );
    reload(&p, "switchboard_reloads_total", 1.0);
    // A pause in real time, kept on purpose: the bucket refilling at the new rate is what is
    // under test (3 calls need 0.3 s at 600/min, 90 s at the old 2/min).
    std::thread::sleep(Duration::from_millis(500));
    for n in 4..7 {
        let r = alice.post(&echo_body(&n.to_string(), json!({ "n": n })));
        assert_eq!(r.status, 202, "{}", r.text());
    }
    assert!(
        p.log().contains("ignored until a restart: --instance"),
        "{}",
        p.log()
    );
}

/// `POST /mcp` of an `initialize` with `token`: its status.
fn initialize(p: &Proxy, token: &str) -> u16 {
    let auth = format!("Bearer {token}");
    let headers = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Authorization", auth.as_str()),
    ];
    let body = switchboard_tests::mcp::initialize_body(1);
    p.request("POST", "/mcp", &headers, Body::json(&body))
        .status
}

fn fetched_key_sets_survive_a_reload(target: Target) {
    let Some(idp) = oidc_provider("key sets across a reload") else {
        return;
    };
    let dir = TempDir::new("reload-keys");
    let resource = "https://mcp.test/";
    let config = format!(
        "oauth-issuer = [\"{}\"]\nresource = \"{resource}\"\n",
        idp.issuer()
    );
    // Started once /health says the key set is in hand.
    let p = start(target, &dir, &config);
    let token = idp.token(resource, "mcp:tools");
    assert_eq!(initialize(&p, &token), 200);
    let fetches = idp.jwks_fetches();
    write(
        &dir.file("switchboard.toml"),
        &format!("{config}rate-limit = \"600/min\"\n"),
    );
    reload(&p, "switchboard_reloads_total", 1.0);
    // The new gate has the fetched keys at once: no 503 while they would be fetched again.
    assert_eq!(initialize(&p, &token), 200);
    assert_eq!(p.health().0, 200);
    assert_eq!(idp.jwks_fetches(), fetches);
}

suite!(
    a_removed_token_ends_its_sessions,
    a_new_rate_limit_takes_effect,
    fetched_key_sets_survive_a_reload,
);
