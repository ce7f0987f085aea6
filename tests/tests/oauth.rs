//! SPEC section 9 end to end, on both binaries, with real parts: a real OpenID provider
//! (npm `oidc-provider`, on loopback) and the official SDKs' OAuth clients, which sign in by
//! discovery alone from nothing but the MCP endpoint's URL. The proxy is given only
//! `--oauth-issuer`: it finds the key set itself, picks up rotated keys, keeps a flood of
//! forged `kid`s from hammering the provider, answers 503 (not 401) until it has keys, and
//! refuses a token for another resource.

use std::time::{Duration, Instant};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use switchboard_tests::oidc::{oidc_provider, Mint, OidcProvider};
use switchboard_tests::python::{mcp_server_time, python, run_script};
use switchboard_tests::{node, suite, Body, Proxy, Response, Target, WAIT};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");

fn proxy(target: Target, idp: &OidcProvider, backend: &[String]) -> Proxy {
    Proxy::builder(target)
        .backend(backend.iter().cloned())
        .args([
            "--oauth-issuer",
            idp.issuer(),
            "--oauth-scopes",
            "mcp:tools",
        ])
        .start()
}

/// The resource of [`proxy_without_keys`], fixed so tokens can be minted before it starts.
const RESOURCE: &str = "https://mcp.test/";

/// [`proxy`] for [`RESOURCE`], not waiting for /health: it listens at once, before it has
/// any keys.
fn proxy_without_keys(target: Target, idp: &OidcProvider) -> Proxy {
    Proxy::builder(target)
        .backend([BACKEND])
        .args(["--oauth-issuer", idp.issuer(), "--resource", RESOURCE])
        .no_health_wait()
        .start()
}

/// `POST /mcp` of an `initialize` with `token`.
fn initialize(p: &Proxy, token: &str) -> Response {
    let auth = format!("Bearer {token}");
    p.request(
        "POST",
        "/mcp",
        &[
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Authorization", &auth),
        ],
        Body::json(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#),
    )
}

/// Waits (bounded) until `what` holds.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn python_sdk_signs_in_by_discovery(target: Target) {
    let Some(py) = python() else { return };
    let Some(idp) = oidc_provider("OAuth sign-in") else {
        return;
    };
    let time = mcp_server_time(&py).display().to_string();
    let p = proxy(target, &idp, &[time]);
    p.wait_health(200, WAIT);
    let resource = format!("http://{}/", p.addr);
    for transport in ["mcp", "sse"] {
        let url = format!("http://{}/{transport}", p.addr);
        let args = [
            transport.to_owned(),
            url,
            "get_current_time".to_owned(),
            json!({"timezone": "UTC"}).to_string(),
        ];
        let out = run_script(&py, &p, "oauth_client.py", &args);
        let tools = out["tools"].as_array().cloned().unwrap_or_default();
        assert!(
            tools.contains(&json!("get_current_time")),
            "{transport}: {out}"
        );
        assert_eq!(out["is_error"], json!(false), "{transport}: {out}");
        assert!(
            out["texts"][0].as_str().unwrap_or_default().contains("UTC"),
            "{out}"
        );
        // Signed in by discovery: the first request was refused, the token is for us.
        let first = out["requests"][0].as_str().unwrap_or_default();
        assert!(first.starts_with("401 "), "{transport}: {out}");
        assert_eq!(
            out["token"]["claims"]["aud"],
            json!(resource),
            "{transport}: {out}"
        );
        assert_eq!(
            out["token"]["claims"]["iss"],
            json!(idp.issuer()),
            "{transport}: {out}"
        );
    }
}

fn ts_sdk_signs_in_by_discovery(target: Target) {
    let Some(node) = node::node("OAuth sign-in (TypeScript SDK)") else {
        return;
    };
    let Some(idp) = oidc_provider("OAuth sign-in (TypeScript SDK)") else {
        return;
    };
    let p = proxy(target, &idp, &[BACKEND.to_owned()]);
    p.wait_health(200, WAIT);
    let script = node.file("oauth-client.mjs").display().to_string();
    let url = format!("http://{}/mcp", p.addr);
    let args = [script, url, "echo".to_owned(), json!({"n": 7}).to_string()];
    let out = node
        .spawn("node", args, p.dir().path(), "ts-oauth")
        .wait(Duration::from_secs(90));
    assert!(out.status.success(), "{}", out.transcript());
    let report: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", out.transcript()));
    let tools = report["tools"].as_array().cloned().unwrap_or_default();
    assert!(tools.contains(&json!("echo")), "{report}");
    assert!(
        report["requests"][0]
            .as_str()
            .unwrap_or_default()
            .starts_with("401 "),
        "{report}"
    );
    assert_eq!(
        report["token"]["claims"]["aud"],
        json!(format!("http://{}/", p.addr))
    );
}

/// A token signed by a key the provider never had, under `kid`.
fn forged(idp: &OidcProvider, resource: &str, kid: &str) -> String {
    let pem = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/jwt/rsa-other.pem"),
    )
    .expect("the fixture key");
    let key = EncodingKey::from_rsa_pem(&pem).expect("an RSA key");
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.to_owned());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let claims = json!({"iss": idp.issuer(), "sub": "mallory", "aud": resource,
                        "iat": now, "exp": now + 300, "scope": "mcp:tools"});
    jsonwebtoken::encode(&header, &claims, &key).expect("signed")
}

fn keys_rotate_floods_are_bounded_outages_are_503(target: Target) {
    let Some(idp) = oidc_provider("OAuth key sets") else {
        return;
    };
    // The provider is down when the proxy starts: 503 (the token is not at fault), and
    // /health says why; once it is back, the proxy's retries find the keys.
    let resource = RESOURCE;
    let token = idp.token(resource, "mcp:tools");
    idp.set_outage(true);
    let p = proxy_without_keys(target, &idp);
    let r = initialize(&p, &token);
    assert_eq!(r.status, 503, "before any key set: {}", r.text());
    assert!(r.header("retry-after").is_some());
    let (status, health) = p.health();
    assert_eq!(
        (status, health["auth"].clone()),
        (503, json!("keys unavailable"))
    );
    idp.set_outage(false);
    eventually("the proxy fetched the key set", || p.health().0 == 200);
    assert_eq!(initialize(&p, &token).status, 200);

    // A token for another resource is refused.
    let other = idp.token("https://other.example/", "mcp:tools");
    assert_eq!(initialize(&p, &other).status, 401);

    // The provider rotates its key: a token under the new kid works without a restart (the
    // unknown kid refetches the key set; a client may meet one 401 before it comes).
    let old_kid = idp.kid();
    let new_kid = idp.rotate();
    assert_ne!(old_kid, new_kid);
    let rotated = idp.token(resource, "mcp:tools");
    eventually("a token under the rotated key works", || {
        initialize(&p, &rotated).status == 200
    });

    // A flood of forged kids costs the provider at most one key-set fetch per 30 s.
    let before = idp.jwks_fetches();
    for i in 0..50 {
        let r = initialize(&p, &forged(&idp, resource, &format!("forged-{i}")));
        assert_eq!(r.status, 401, "forged kid {i}: {}", r.text());
    }
    // Give a fetch the flood caused time to land before counting. A pause kept on purpose:
    // fetches run beside the 401s and nothing observable says "no more fetch is coming", so
    // no barrier exists; a loaded machine can only make this pass wrongly, never fail.
    std::thread::sleep(Duration::from_millis(500));
    let fetched = idp.jwks_fetches() - before;
    assert!(
        fetched <= 1,
        "50 forged kids cost {fetched} key-set fetches"
    );
}

/// `POST /mcp` of a `tools/call` of `tool` in `session`, with `token`.
fn call(p: &Proxy, token: &str, session: &str, tool: &str) -> Response {
    let auth = format!("Bearer {token}");
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": {"name": tool, "arguments": {}}});
    p.request(
        "POST",
        "/mcp",
        &[
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Authorization", &auth),
            ("Mcp-Session-Id", session),
        ],
        Body::json(&body.to_string()),
    )
}

/// SPEC section 10's per-tool scopes: a call of a tool whose scope the token lacks gets 403
/// `insufficient_scope` naming that scope (so the client can step up), before the backend;
/// the same call with a token that has it goes through, and other tools need nothing more.
fn tool_scopes_gate_calls(target: Target) {
    let Some(idp) = oidc_provider("per-tool scopes") else {
        return;
    };
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--oauth-issuer", idp.issuer(), "--resource", RESOURCE])
        .args(["--tool-scope", "get_time=time:read"])
        .start();
    p.wait_health(200, WAIT);
    let plain = idp.token(RESOURCE, "mcp:tools");
    let opened = initialize(&p, &plain);
    assert_eq!(opened.status, 200, "{}", opened.text());
    let session = opened
        .header("mcp-session-id")
        .expect("a session")
        .to_owned();

    let refused = call(&p, &plain, &session, "get_time");
    assert_eq!(refused.status, 403, "{}", refused.text());
    let challenge = refused.header("www-authenticate").unwrap_or_default();
    assert!(
        challenge.contains(r#"error="insufficient_scope""#)
            && challenge.contains(r#"scope="time:read""#)
            && challenge.contains("resource_metadata="),
        "{challenge}"
    );
    assert_eq!(refused.json()["id"], json!(7), "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], json!(-32001));

    let other = call(&p, &plain, &session, "echo");
    assert_eq!(other.status, 200, "another tool: {}", other.text());
    let stepped_up = idp.token(RESOURCE, "mcp:tools time:read");
    let allowed = call(&p, &stepped_up, &session, "get_time");
    assert_eq!(allowed.status, 200, "with the scope: {}", allowed.text());
}

/// The claims of a JWT, read without verifying it.
fn payload(token: &str) -> Value {
    jsonwebtoken::dangerous::insecure_decode_claims(token).expect("a JWT")
}

/// Issue 30.1: with two trusted issuers, a token signed with issuer B's key that claims to
/// be issuer A's alice is refused (401): it opens no session and posts nothing into
/// alice's live one, while A's and B's own tokens work. Its unknown kid refetches A's key
/// set only (the kid is looked up among A's keys), never B's.
fn one_issuer_cannot_sign_for_another(target: Target) {
    let Some(a) = oidc_provider("two issuers (A)") else {
        return;
    };
    let Some(b) = oidc_provider("two issuers (B)") else {
        return;
    };
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--oauth-issuer", a.issuer(), "--oauth-issuer", b.issuer()])
        .args(["--resource", RESOURCE])
        .record()
        .start();
    let alice = a.mint(&Mint::new(RESOURCE, "").subject("alice"));
    let bob = b.mint(&Mint::new(RESOURCE, "").subject("bob"));
    // Both key sets are in use (so the forgery below meets B's key).
    eventually("A's and B's tokens are accepted", || {
        initialize(&p, &alice).status == 200 && initialize(&p, &bob).status == 200
    });
    let opened = initialize(&p, &alice);
    assert_eq!(opened.status, 200, "{}", opened.text());
    let session = opened
        .header("mcp-session-id")
        .expect("a session")
        .to_owned();

    let forged = b.mint(
        &Mint::new(RESOURCE, "")
            .subject("alice")
            .claims(json!({"iss": a.issuer()})),
    );
    assert_eq!(payload(&forged)["iss"], json!(a.issuer()), "B signed for A");
    assert_eq!(payload(&forged)["sub"], json!("alice"));
    let fetched = (a.jwks_fetches(), b.jwks_fetches());
    let r = initialize(&p, &forged);
    assert_eq!(r.status, 401, "a new session: {}", r.text());
    let challenge = r.header("www-authenticate").unwrap_or_default();
    assert!(
        challenge.contains(r#"error="invalid_token""#),
        "{challenge}"
    );
    let r = call(&p, &forged, &session, "MARK-REJECTED");
    assert_eq!(r.status, 401, "into alice's session: {}", r.text());

    eventually("the unknown kid refetched A's key set", || {
        a.jwks_fetches() > fetched.0
    });
    // A second trip through the proxy, so a refetch of B's (if any) had its turn.
    assert_eq!(initialize(&p, &bob).status, 200);
    assert_eq!(b.jwks_fetches(), fetched.1, "B's key set was refetched");
    let r = call(&p, &alice, &session, "echo");
    assert_eq!(r.status, 200, "alice's own call: {}", r.text());
    p.assert_nothing_rejected_reached_the_backend();
}

suite!(
    one_issuer_cannot_sign_for_another,
    python_sdk_signs_in_by_discovery,
    ts_sdk_signs_in_by_discovery,
    keys_rotate_floods_are_bounded_outages_are_503,
    tool_scopes_gate_calls,
);
