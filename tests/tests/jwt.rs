//! End-to-end: JWT bearer auth (SPEC 4) against the real binaries. Tokens are minted here
//! with `jsonwebtoken` from the test-only keys in `fixtures/jwt/` (see its README); the
//! proxy verifies them against `fixtures/jwt/jwks.json` or `fixtures/jwt/hs256.secret`.
//!
//! Every refusal is checked for its status, its exact `WWW-Authenticate` header, a body
//! that does not echo the token, and a log that never holds it; every acceptance by a
//! session that really works (initialize and a tool call through the backend).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use switchboard_tests::{
    assert_colliding_ids_stay_isolated, bearer, echo_body, echoed_args, open_session, suite,
    try_open_session, Body, OpenOptions, Proxy, Response, Session, Target, SESSION_NOT_FOUND,
};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");
const ISSUER: &str = "https://idp.test";
const AUDIENCE: &str = "switchboard";
/// The proxy's default `--jwt-leeway`.
const LEEWAY: i64 = 60;

// ---------------------------------------------------------------------------------------
// Fixtures and minting
// ---------------------------------------------------------------------------------------

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/jwt")
        .join(name)
}

fn fixture_bytes(name: &str) -> Vec<u8> {
    let path = fixture(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn fixture_path(name: &str) -> String {
    fixture(name).display().to_string()
}

/// A signing key and the algorithm and `kid` its tokens carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signer {
    /// `rsa-1.pem`.
    Rsa,
    /// `ec-1.pem`.
    Ec,
    /// `ed-1.pem`.
    Ed,
    /// `rsa-other.pem`: not in the JWKS.
    RsaOther,
    /// `hs256.secret`, trimmed as the proxy trims it.
    Hs,
}

impl Signer {
    fn key(self) -> EncodingKey {
        match self {
            Signer::Rsa => EncodingKey::from_rsa_pem(&fixture_bytes("rsa-1.pem")),
            Signer::RsaOther => EncodingKey::from_rsa_pem(&fixture_bytes("rsa-other.pem")),
            Signer::Ec => EncodingKey::from_ec_pem(&fixture_bytes("ec-1.pem")),
            Signer::Ed => EncodingKey::from_ed_pem(&fixture_bytes("ed-1.pem")),
            Signer::Hs => EncodingKey::from_secret(fixture_bytes("hs256.secret").trim_ascii()),
        }
        .unwrap_or_else(|e| panic!("cannot load the {self:?} key: {e}"))
    }

    fn alg(self) -> Algorithm {
        match self {
            Signer::Rsa | Signer::RsaOther => Algorithm::RS256,
            Signer::Ec => Algorithm::ES256,
            Signer::Ed => Algorithm::EdDSA,
            Signer::Hs => Algorithm::HS256,
        }
    }

    /// The `kid` a token from this key names (the other RSA key claims to be `rsa-1`).
    fn kid(self) -> Option<&'static str> {
        match self {
            Signer::Rsa | Signer::RsaOther => Some("rsa-1"),
            Signer::Ec => Some("ec-1"),
            Signer::Ed => Some("ed-1"),
            Signer::Hs => None,
        }
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

/// Claims of a token that is valid for the next ten minutes, with a fresh `jti`.
fn claims(iss: &str, sub: &str) -> Value {
    static JTI: AtomicU64 = AtomicU64::new(0);
    let n = now();
    json!({
        "iss": iss,
        "sub": sub,
        "aud": AUDIENCE,
        "iat": n - 5,
        "nbf": n - 5,
        "exp": n + 600,
        "jti": format!("jti-{}-{}", std::process::id(), JTI.fetch_add(1, Ordering::Relaxed)),
    })
}

/// `claims` with `changes` merged in (a `null` removes the claim).
fn claims_with(iss: &str, sub: &str, changes: Value) -> Value {
    let mut c = claims(iss, sub);
    let map = c.as_object_mut().expect("claims are an object");
    for (k, v) in changes.as_object().expect("changes are an object") {
        if v.is_null() {
            map.remove(k);
        } else {
            map.insert(k.clone(), v.clone());
        }
    }
    c
}

fn encode(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key)
        .unwrap_or_else(|e| panic!("cannot sign a {alg:?} token: {e}"))
}

fn mint(signer: Signer, claims: &Value) -> String {
    encode(signer.alg(), signer.kid(), &signer.key(), claims)
}

/// A valid token for `sub` at [`ISSUER`].
fn token(signer: Signer, sub: &str) -> String {
    mint(signer, &claims(ISSUER, sub))
}

/// Unpadded base64url, for the tokens `jsonwebtoken` refuses to make (`alg: none`).
fn b64url(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// `header.payload.` with no signature.
fn unsigned(header: &Value, claims: &Value) -> String {
    format!(
        "{}.{}.",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    )
}

// ---------------------------------------------------------------------------------------
// Proxies and assertions
// ---------------------------------------------------------------------------------------

/// `--jwt-jwks` with the RSA, EC and Ed25519 keys, `iss` and `aud` required.
fn jwks_proxy(target: Target) -> Proxy {
    jwks_proxy_with(target, &[])
}

fn jwks_proxy_with(target: Target, extra: &[&str]) -> Proxy {
    Proxy::builder(target)
        .backend([BACKEND])
        .args(["--jwt-jwks", &fixture_path("jwks.json")])
        .args(["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE])
        .args(extra.iter().copied())
        .record()
        .start()
}

/// `--jwt-secret-file` (HS256), `iss` and `aud` required.
fn hs_proxy(target: Target) -> Proxy {
    Proxy::builder(target)
        .backend([BACKEND])
        .args(["--jwt-secret-file", &fixture_path("hs256.secret")])
        .args(["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE])
        .args(["--log-level", "trace"])
        .record()
        .start()
}

fn opens_with(p: &Proxy, token: &str) -> Session {
    let mut s = open_session(p, Some(token));
    s.initialize();
    s
}

/// A 401 as the spec wants it: the exact challenge, a JSON-RPC error without id, the
/// token nowhere in the answer.
fn assert_401(r: &Response, www_authenticate: &str, token: Option<&str>, what: &str) {
    assert_eq!(r.status, 401, "{what}: {} {}", r.status, r.text());
    assert_eq!(
        r.header("www-authenticate"),
        Some(www_authenticate),
        "{what}: WWW-Authenticate"
    );
    let body = r.json();
    assert_eq!(body["jsonrpc"], "2.0", "{what}: 401 body {body}");
    assert!(body["error"]["code"].is_i64(), "{what}: 401 body {body}");
    assert!(
        body.get("id").is_none(),
        "{what}: 401 body carries an id: {body}"
    );
    if let Some(t) = token.filter(|t| !t.is_empty()) {
        let text = r.text();
        assert!(!text.contains(t), "{what}: the 401 body echoes the token");
        for (k, v) in &r.headers {
            assert!(!v.contains(t), "{what}: header {k} echoes the token");
        }
    }
}

fn invalid_token_challenge(reason: &str) -> String {
    format!(r#"Bearer error="invalid_token", error_description="{reason}""#)
}

/// `token` is refused with `reason` both on `GET /sse` (creating nothing) and on a POST into
/// `live`, a real session (which the refusal must not reach or disturb).
fn assert_refused(p: &Proxy, live: &Session, token: &str, reason: &str, what: &str) {
    let challenge = invalid_token_challenge(reason);
    let sessions_before = p.health().1["sessions"].clone();
    let options = OpenOptions {
        token: Some(token.to_owned()),
        ..OpenOptions::default()
    };
    match try_open_session(p.addr, &options) {
        Ok(s) => panic!("{what}: GET /sse accepted the token (session {})", s.sid),
        Err(r) => {
            assert_401(&r, &challenge, Some(token), &format!("{what}: GET /sse"));
            assert_eq!(r.json()["error"]["message"], reason, "{what}: GET /sse");
        }
    }
    assert_eq!(
        p.health().1["sessions"],
        sessions_before,
        "{what}: a refused GET /sse created a session"
    );
    let auth = bearer(token);
    let r = p.request(
        "POST",
        &live.post_target,
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        Body::json(&echo_body("1", json!({"MARK-REJECTED": what}))),
    );
    assert_401(&r, &challenge, Some(token), &format!("{what}: POST"));
    assert_eq!(r.json()["error"]["message"], reason, "{what}: POST");
}

/// No credentials at all: `WWW-Authenticate: Bearer`, exactly.
fn assert_missing(p: &Proxy, live: &Session) {
    for auth in [
        None,
        Some("Basic YWxpY2U6c2VjcmV0"),
        Some("Bearer "),
        Some(""),
    ] {
        let mut headers = vec![("Content-Type", "application/json")];
        if let Some(a) = auth {
            headers.push(("Authorization", a));
        }
        let what = format!("Authorization {auth:?}");
        let r = p.request(
            "POST",
            &live.post_target,
            &headers,
            Body::json(&echo_body("1", json!({"MARK-REJECTED": "missing"}))),
        );
        assert_401(&r, "Bearer", None, &format!("{what}: POST"));
        let options = OpenOptions {
            headers: auth
                .map(|a| vec![("Authorization".to_owned(), a.to_owned())])
                .unwrap_or_default(),
            ..OpenOptions::default()
        };
        match try_open_session(p.addr, &options) {
            Ok(s) => panic!("{what}: GET /sse accepted (session {})", s.sid),
            Err(r) => assert_401(&r, "Bearer", None, &format!("{what}: GET /sse")),
        }
    }
}

/// Neither a whole token nor its signature appears in the proxy's log.
fn assert_not_logged(p: &Proxy, tokens: &[&str]) {
    let log = p.log();
    assert!(!log.is_empty(), "the proxy logged nothing at all");
    for t in tokens {
        assert!(
            !log.contains(t),
            "the proxy's log holds a bearer token: {t}"
        );
        let signature = t.rsplit('.').next().unwrap_or_default();
        if signature.len() >= 16 {
            assert!(
                !log.contains(signature),
                "the proxy's log holds a token's signature: {signature}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------------------

/// Every way a token can be wrong, against the JWKS keys: each refused with its own reason.
/// SPEC section 9, the resource server's face: the protected resource metadata at the root
/// and at the /mcp and /sse locations (readable from any origin), a 401 that says where it
/// is, tokens for another resource refused, 403 insufficient_scope with the scopes to ask
/// for and the request's id, and a token in the query string refused.
fn oauth_resource_server_face(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--jwt-jwks", &fixture_path("jwks.json")])
        .args([
            "--oauth-issuer",
            ISSUER,
            "--oauth-scopes",
            "mcp:tools mcp:read",
        ])
        .args(["--required-scope", "mcp:tools"])
        .start();
    let resource = format!("http://{}/", p.addr);
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource/sse",
    ] {
        let r = p.get(path);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.header("access-control-allow-origin"), Some("*"), "{path}");
        assert_eq!(
            r.json(),
            json!({"resource": resource, "authorization_servers": [ISSUER],
                   "bearer_methods_supported": ["header"],
                   "scopes_supported": ["mcp:tools", "mcp:read"], "resource_name": "Switchboard"}),
            "{path}"
        );
        // Every answer at the document's path is readable from any origin, a 405 too.
        let origin = [("Origin", "https://evil.example")];
        let r = p.request("POST", path, &origin, Body::json("{}"));
        assert_eq!(r.status, 405, "POST {path}");
        assert_eq!(
            r.header("access-control-allow-origin"),
            Some("*"),
            "POST {path}"
        );
    }
    let call = r#"{"jsonrpc":"2.0","id":41,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let post = |token: Option<&str>, target: &str| {
        let auth = token.map(bearer);
        let mut headers = vec![
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ];
        if let Some(a) = &auth {
            headers.push(("Authorization", a.as_str()));
        }
        p.request("POST", target, &headers, Body::json(call))
    };
    let metadata = format!("http://{}/.well-known/oauth-protected-resource/mcp", p.addr);
    let r = post(None, "/mcp");
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(
        r.header("www-authenticate"),
        Some(format!(r#"Bearer resource_metadata="{metadata}", scope="mcp:tools""#).as_str())
    );
    let claims_for =
        |aud: &str, scope: &str| claims_with(ISSUER, "alice", json!({"aud": aud, "scope": scope}));
    let other = mint(
        Signer::Rsa,
        &claims_for("https://other.example/", "mcp:tools"),
    );
    let r = post(Some(&other), "/mcp");
    assert_eq!(r.status, 401, "a token for another resource: {}", r.text());
    assert!(r
        .header("www-authenticate")
        .unwrap_or_default()
        .contains("invalid_token"));
    let unscoped = mint(Signer::Rsa, &claims_for(&resource, "mcp:read"));
    let r = post(Some(&unscoped), "/mcp");
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(
        r.header("www-authenticate"),
        Some(
            format!(r#"Bearer error="insufficient_scope", scope="mcp:tools", resource_metadata="{metadata}""#)
                .as_str()
        )
    );
    assert_eq!(r.json()["id"], json!(41), "{}", r.text());
    let scoped = mint(
        Signer::Rsa,
        &claims_for(resource.trim_end_matches('/'), "mcp:read mcp:tools"),
    );
    let r = post(Some(&scoped), "/mcp");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("mcp-session-id").is_some());
    let r = post(Some(&scoped), &format!("/mcp?access_token={scoped}"));
    assert_eq!(r.status, 401, "a token in the query: {}", r.text());
    let sse = p.request("GET", "/sse", &[], Body::None);
    assert_eq!(sse.status, 401);
    let challenge = sse.header("www-authenticate").unwrap_or_default();
    assert!(
        challenge.contains("oauth-protected-resource/sse\""),
        "{challenge}"
    );
}

fn invalid_tokens_are_refused_with_their_reason(target: Target) {
    let p = jwks_proxy_with(target, &["--log-level", "trace"]);
    let alice_token = token(Signer::Rsa, "alice");
    let mut alice = opens_with(&p, &alice_token);
    let n = now();

    let valid = token(Signer::Rsa, "alice");
    let mut parts = valid.split('.');
    let (h, payload, sig) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    // Bob's claims under alice's signature.
    let bob_payload = token(Signer::Rsa, "bob")
        .split('.')
        .nth(1)
        .unwrap()
        .to_owned();
    // One signature character changed in the middle (a whole sextet, so no padding bits).
    let mid = sig.len() / 2;
    let flipped = if &sig[mid..=mid] == "A" { "B" } else { "A" };
    let bad_sig = format!("{}{flipped}{}", &sig[..mid], &sig[mid + 1..]);
    let rsa_pub = fixture_bytes("rsa-1.pub.pem");
    let rsa_n = {
        let jwks: Value =
            serde_json::from_slice(&fixture_bytes("jwks.json")).expect("jwks.json is JSON");
        jwks["keys"][0]["n"].as_str().expect("rsa-1 n").to_owned()
    };
    let good = claims(ISSUER, "alice");
    let hs = |kid: Option<&str>, secret: &[u8]| {
        let key = EncodingKey::from_secret(secret).expect("an HMAC key");
        encode(Algorithm::HS256, kid, &key, &good)
    };

    let cases: Vec<(&str, String, &str)> = vec![
        // Time, beyond the 60 s leeway.
        (
            "expired an hour ago",
            mint(
                Signer::Rsa,
                &claims_with(
                    ISSUER,
                    "alice",
                    json!({"iat": n - 7200, "nbf": n - 7200, "exp": n - 3600}),
                ),
            ),
            "token expired",
        ),
        (
            "expired just beyond the leeway",
            mint(
                Signer::Ec,
                &claims_with(ISSUER, "alice", json!({"exp": n - LEEWAY - 30})),
            ),
            "token expired",
        ),
        (
            "not valid for an hour",
            mint(
                Signer::Rsa,
                &claims_with(ISSUER, "alice", json!({"nbf": n + 3600, "exp": n + 7200})),
            ),
            "token not yet valid",
        ),
        (
            "not valid until just beyond the leeway",
            mint(
                Signer::Ed,
                &claims_with(ISSUER, "alice", json!({"nbf": n + LEEWAY + 30})),
            ),
            "token not yet valid",
        ),
        // Audience and issuer.
        (
            "wrong audience",
            mint(
                Signer::Rsa,
                &claims_with(ISSUER, "alice", json!({"aud": "other-service"})),
            ),
            "wrong audience",
        ),
        (
            "wrong audiences (array)",
            mint(
                Signer::Ec,
                &claims_with(ISSUER, "alice", json!({"aud": ["a", "switchboard-x"]})),
            ),
            "wrong audience",
        ),
        (
            "no audience",
            mint(
                Signer::Ed,
                &claims_with(ISSUER, "alice", json!({"aud": null})),
            ),
            "wrong audience",
        ),
        (
            "wrong issuer",
            mint(Signer::Rsa, &claims("https://evil.test", "alice")),
            "wrong issuer",
        ),
        (
            "issuer with a trailing slash",
            mint(Signer::Ed, &claims("https://idp.test/", "alice")),
            "wrong issuer",
        ),
        // Signatures.
        (
            "signed by another RSA key under kid rsa-1",
            mint(Signer::RsaOther, &claims(ISSUER, "alice")),
            "bad signature",
        ),
        (
            "bob's claims under alice's signature",
            format!("{h}.{bob_payload}.{sig}"),
            "bad signature",
        ),
        (
            "one signature character changed",
            format!("{h}.{payload}.{bad_sig}"),
            "bad signature",
        ),
        (
            "ES256 token under kid rsa-1",
            encode(Algorithm::ES256, Some("rsa-1"), &Signer::Ec.key(), &good),
            "bad signature",
        ),
        (
            "RS256 token under kid ed-1",
            encode(Algorithm::RS256, Some("ed-1"), &Signer::Rsa.key(), &good),
            "bad signature",
        ),
        // Algorithm confusion: HMAC keyed with the RSA public key.
        (
            "HS256 keyed with rsa-1's public PEM, kid rsa-1",
            hs(Some("rsa-1"), &rsa_pub),
            "bad signature",
        ),
        (
            "HS256 keyed with rsa-1's modulus text, kid rsa-1",
            hs(Some("rsa-1"), rsa_n.as_bytes()),
            "bad signature",
        ),
        (
            "HS256 keyed with the JWKS document, kid ec-1",
            hs(Some("ec-1"), &fixture_bytes("jwks.json")),
            "bad signature",
        ),
        // Keys.
        (
            "unknown kid",
            encode(Algorithm::RS256, Some("rsa-2"), &Signer::Rsa.key(), &good),
            "unknown key id",
        ),
        (
            "no kid among several keys",
            encode(Algorithm::RS256, None, &Signer::Rsa.key(), &good),
            "unknown key id",
        ),
        (
            "HS256 keyed with rsa-1's public PEM, no kid",
            hs(None, &rsa_pub),
            "unknown key id",
        ),
        // Malformed.
        ("garbage", "garbage".to_owned(), "malformed token"),
        (
            "three dots of garbage",
            "a.b.c".to_owned(),
            "malformed token",
        ),
        ("header only", h.to_owned(), "malformed token"),
        (
            "no signature part",
            format!("{h}.{payload}"),
            "malformed token",
        ),
        (
            "alg none, kid rsa-1",
            unsigned(&json!({"alg": "none", "typ": "JWT", "kid": "rsa-1"}), &good),
            "malformed token",
        ),
        (
            "alg none, no kid",
            unsigned(&json!({"alg": "none", "typ": "JWT"}), &good),
            "malformed token",
        ),
        (
            "alg None, kid rsa-1",
            unsigned(&json!({"alg": "None", "kid": "rsa-1"}), &good),
            "malformed token",
        ),
        (
            "signed, but no exp",
            mint(
                Signer::Rsa,
                &claims_with(ISSUER, "alice", json!({"exp": null})),
            ),
            "malformed token",
        ),
        (
            "signed, but no sub",
            mint(
                Signer::Ec,
                &claims_with(ISSUER, "alice", json!({"sub": null})),
            ),
            "malformed token",
        ),
    ];

    for (what, token, reason) in &cases {
        assert_refused(&p, &alice, token, reason, what);
    }
    assert_missing(&p, &alice);

    // The refusals neither reached the backend nor disturbed the session they named.
    alice.sync();
    let m = alice.call("echo", json!({"still": "alice"}));
    assert_eq!(echoed_args(&m), json!({"still": "alice"}));
    p.assert_nothing_rejected_reached_the_backend();
    let mut all: Vec<&str> = cases.iter().map(|(_, t, _)| t.as_str()).collect();
    all.push(&alice_token);
    assert_not_logged(&p, &all);
}

/// The HS256 mode refuses the same way: wrong secret, other algorithms, time, claims.
fn hs256_refusals(target: Target) {
    let p = hs_proxy(target);
    let alice_token = token(Signer::Hs, "alice");
    let mut alice = opens_with(&p, &alice_token);
    let n = now();
    let good = claims(ISSUER, "alice");
    let wrong_secret = EncodingKey::from_secret(&[0x5a; 48]).expect("an HMAC key");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "another secret",
            encode(Algorithm::HS256, None, &wrong_secret, &good),
            "bad signature",
        ),
        (
            "HS384 with the right secret",
            encode(
                Algorithm::HS384,
                None,
                &EncodingKey::from_secret(fixture_bytes("hs256.secret").trim_ascii()).unwrap(),
                &good,
            ),
            "bad signature",
        ),
        (
            "RS256 without kid",
            encode(Algorithm::RS256, None, &Signer::Rsa.key(), &good),
            "bad signature",
        ),
        (
            "EdDSA without kid",
            encode(Algorithm::EdDSA, None, &Signer::Ed.key(), &good),
            "bad signature",
        ),
        (
            // The lone secret serves any kid, but only for HS256.
            "RS256 under kid rsa-1 (no JWKS here)",
            mint(Signer::Rsa, &good),
            "bad signature",
        ),
        (
            "expired",
            mint(
                Signer::Hs,
                &claims_with(ISSUER, "alice", json!({"exp": n - LEEWAY - 60})),
            ),
            "token expired",
        ),
        (
            "not yet valid",
            mint(
                Signer::Hs,
                &claims_with(ISSUER, "alice", json!({"nbf": n + LEEWAY + 60})),
            ),
            "token not yet valid",
        ),
        (
            "wrong audience",
            mint(
                Signer::Hs,
                &claims_with(ISSUER, "alice", json!({"aud": "nope"})),
            ),
            "wrong audience",
        ),
        (
            "wrong issuer",
            mint(Signer::Hs, &claims("https://evil.test", "alice")),
            "wrong issuer",
        ),
        (
            "alg none",
            unsigned(&json!({"alg": "none", "typ": "JWT"}), &good),
            "malformed token",
        ),
        ("garbage", "not-a-jwt-at-all".to_owned(), "malformed token"),
    ];
    for (what, token, reason) in &cases {
        assert_refused(&p, &alice, token, reason, what);
    }
    assert_missing(&p, &alice);
    alice.sync();
    p.assert_nothing_rejected_reached_the_backend();
    let mut all: Vec<&str> = cases.iter().map(|(_, t, _)| t.as_str()).collect();
    all.push(&alice_token);
    assert_not_logged(&p, &all);
}

// ---------------------------------------------------------------------------------------
// Acceptance
// ---------------------------------------------------------------------------------------

/// RS256, ES256 and EdDSA tokens each open a stream and complete a call; so do the edge
/// cases inside the leeway, an `aud` array and a second configured audience.
fn each_jwks_algorithm_opens_a_session(target: Target) {
    // `--jwt-audience` is repeatable: a token naming any of them is accepted.
    let p = jwks_proxy_with(target, &["--jwt-audience", "switchboard-staging"]);
    let n = now();
    let cases: Vec<(&str, String)> = vec![
        ("RS256", token(Signer::Rsa, "alice")),
        ("ES256", token(Signer::Ec, "alice")),
        ("EdDSA", token(Signer::Ed, "alice")),
        (
            "aud array naming switchboard",
            mint(
                Signer::Ec,
                &claims_with(ISSUER, "alice", json!({"aud": ["other", AUDIENCE]})),
            ),
        ),
        (
            "the second --jwt-audience",
            mint(
                Signer::Ed,
                &claims_with(ISSUER, "alice", json!({"aud": "switchboard-staging"})),
            ),
        ),
        (
            "expired, but within the leeway",
            mint(
                Signer::Rsa,
                &claims_with(ISSUER, "alice", json!({"exp": n - LEEWAY / 2})),
            ),
        ),
        (
            "not yet valid, but within the leeway",
            mint(
                Signer::Ed,
                &claims_with(ISSUER, "alice", json!({"nbf": n + LEEWAY / 2})),
            ),
        ),
    ];
    for (what, token) in &cases {
        let mut s = open_session(&p, Some(token));
        s.initialize();
        let m = s.call("echo", json!({"alg": what}));
        assert_eq!(echoed_args(&m), json!({"alg": what}), "{what}");
    }
    let all: Vec<&str> = cases.iter().map(|(_, t)| t.as_str()).collect();
    assert_not_logged(&p, &all);
}

fn hs256_token_opens_a_session(target: Target) {
    let p = hs_proxy(target);
    let t = token(Signer::Hs, "alice");
    let mut s = open_session(&p, Some(&t));
    s.initialize();
    let m = s.call("echo", json!({"alg": "HS256"}));
    assert_eq!(echoed_args(&m), json!({"alg": "HS256"}));
    // Identity providers may put a kid on HS256 tokens: the lone secret still serves them.
    let with_kid = encode(
        Algorithm::HS256,
        Some("hs-key-7"),
        &Signer::Hs.key(),
        &claims(ISSUER, "alice"),
    );
    let mut again = open_session(&p, Some(&with_kid));
    again.initialize();
    let m = again.call("echo", json!({"kid": "hs-key-7"}));
    assert_eq!(echoed_args(&m), json!({"kid": "hs-key-7"}));
    assert_not_logged(&p, &[&t, &with_kid]);
}

/// A refreshed token (new `jti`, `iat`, `exp`, even another key) for the same issuer and
/// subject keeps the session the old one opened, also after the old one expired.
fn refreshed_token_keeps_its_session(target: Target) {
    let p = jwks_proxy_with(target, &["--jwt-leeway", "0s"]);
    // The opening token expires a few seconds after it is minted; on a machine too loaded
    // to open the stream before then, a longer-lived one (bounded). The client refreshes at
    // once: it initializes with a refreshed token.
    let mut margin = 3;
    let (mut s, short, expires) = loop {
        let expires = now() + margin;
        let short = mint(
            Signer::Rsa,
            &claims_with(ISSUER, "alice", json!({"exp": expires})),
        );
        let options = OpenOptions {
            token: Some(short.clone()),
            ..OpenOptions::default()
        };
        match try_open_session(p.addr, &options) {
            Ok(s) => break (s, short, expires),
            Err(r) if r.status == 401 && margin < 24 => margin *= 2,
            Err(r) => panic!("GET /sse with the short token: {} {}", r.status, r.text()),
        }
    };
    s.token = Some(token(Signer::Rsa, "alice"));
    s.initialize();
    let sessions = p.health().1["sessions"].clone();

    let refreshed = [
        ("RS256", token(Signer::Rsa, "alice")),
        ("ES256", token(Signer::Ec, "alice")),
        ("EdDSA", token(Signer::Ed, "alice")),
    ];
    let post_as = |s: &Session, token: &str, id: u64, args: Value| {
        let auth = bearer(token);
        let r = s.post_with(
            Body::json(&echo_body(&id.to_string(), args)),
            &[("Authorization", &auth)],
        );
        assert_eq!(r.status, 202, "POST with a refreshed token: {}", r.text());
        assert_eq!(r.text(), "Accepted");
    };
    for (i, (what, token)) in refreshed.iter().enumerate() {
        let id = 100 + i as u64;
        post_as(&s, token, id, json!({"refreshed": what}));
        let m = s.expect_message(&format!("the answer to the {what} refreshed token's call"));
        assert_eq!(m["id"], id, "{m}");
        assert_eq!(echoed_args(&m), json!({"refreshed": what}));
    }

    // Once the opening token has expired, it is refused, while the refreshed one still
    // reaches the same stream. A pause in real time, kept on purpose: the proxy reads the
    // token's `exp` against its own clock, and that clock passing it is what is under test.
    while now() <= expires + 1 {
        std::thread::sleep(Duration::from_millis(200));
    }
    let auth = bearer(&short);
    let r = s.post_with(
        Body::json(&echo_body("1", json!({"MARK-REJECTED": "expired"}))),
        &[("Authorization", &auth)],
    );
    assert_401(
        &r,
        &invalid_token_challenge("token expired"),
        Some(&short),
        "the expired opening token",
    );
    let later = token(Signer::Rsa, "alice");
    post_as(&s, &later, 200, json!({"after": "expiry"}));
    let m = s.expect_message("the answer after the opening token expired");
    assert_eq!(m["id"], 200, "{m}");
    assert_eq!(echoed_args(&m), json!({"after": "expiry"}));
    assert_eq!(
        p.health().1["sessions"],
        sessions,
        "a refreshed token made a new session"
    );
    // The client now uses the refreshed token for everything.
    s.token = Some(later);
    s.sync();
    p.assert_nothing_rejected_reached_the_backend();
}

// ---------------------------------------------------------------------------------------
// Principals
// ---------------------------------------------------------------------------------------

/// alice and bob (two subjects of one issuer) use the same request ids, answered out of
/// order: each gets exactly its own answers; bob posting into alice's session gets 404.
fn two_subjects_stay_isolated(target: Target) {
    let p = jwks_proxy(target);
    let alice_token = token(Signer::Rsa, "alice");
    let bob_token = token(Signer::Ec, "bob");
    let mut sessions = [
        ("alice", opens_with(&p, &alice_token)),
        ("bob", opens_with(&p, &bob_token)),
    ];
    let ids: Vec<Value> = (1..=10)
        .map(|n| json!(n))
        .chain([json!("same"), json!(0)])
        .collect();
    assert_colliding_ids_stay_isolated(&mut sessions, &ids, 20);

    let [(_, alice), (_, bob)] = &mut sessions;
    // Bob, with any of his tokens, cannot post into alice's session: the unknown-session 404.
    let bob_again = token(Signer::Ed, "bob");
    for t in [&bob_token, &bob_again] {
        let auth = bearer(t);
        for path in [
            alice.post_target.clone(),
            format!("/messages?sessionId={}", alice.sid),
        ] {
            let r = p.request(
                "POST",
                &path,
                &[
                    ("Authorization", &auth),
                    ("Content-Type", "application/json"),
                ],
                Body::json(&echo_body("1", json!({"MARK-REJECTED": "bob"}))),
            );
            assert_eq!(
                r.status,
                404,
                "bob posting into alice's session: {}",
                r.text()
            );
            assert_eq!(r.text(), SESSION_NOT_FOUND);
        }
    }
    // Alice with a token from another key is still alice.
    let alice_ed = token(Signer::Ed, "alice");
    let auth = bearer(&alice_ed);
    let r = alice.post_with(
        Body::json(&echo_body("77", json!({"alice": "ed25519"}))),
        &[("Authorization", &auth)],
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let m = alice.expect_message("alice's answer under her Ed25519 token");
    assert_eq!(m["id"], 77);
    assert_eq!(echoed_args(&m), json!({"alice": "ed25519"}));
    alice.sync();
    bob.sync();
    p.assert_nothing_rejected_reached_the_backend();
}

/// Without `--jwt-issuer`, tokens of two issuers verify under the same key; the same
/// subject at another issuer is another principal.
fn same_subject_other_issuer_is_another_principal(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--jwt-jwks", &fixture_path("jwks.json")])
        .args(["--jwt-audience", AUDIENCE])
        .record()
        .start();
    let alice_token = token(Signer::Rsa, "alice");
    let mut alice = opens_with(&p, &alice_token);
    let impostor_token = mint(Signer::Rsa, &claims("https://other-idp.test", "alice"));
    // The other issuer's alice is a valid caller with a session of her own ...
    let mut impostor = opens_with(&p, &impostor_token);
    let m = impostor.call("echo", json!({"who": "other-idp alice"}));
    assert_eq!(echoed_args(&m), json!({"who": "other-idp alice"}));
    // ... but not the owner of alice's, nor alice the owner of hers.
    for (token, session) in [(&impostor_token, &alice), (&alice_token, &impostor)] {
        let auth = bearer(token);
        let r = p.request(
            "POST",
            &session.post_target,
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            Body::json(&echo_body("1", json!({"MARK-REJECTED": "cross-issuer"}))),
        );
        assert_eq!(r.status, 404, "cross-issuer POST: {}", r.text());
        assert_eq!(r.text(), SESSION_NOT_FOUND);
    }
    // Issuer and subject are not simply concatenated.
    let spliced = mint(Signer::Rsa, &claims("https://idp.testa", "lice"));
    let auth = bearer(&spliced);
    let r = p.request(
        "POST",
        &alice.post_target,
        &[("Authorization", &auth)],
        Body::json(&echo_body("1", json!({"MARK-REJECTED": "spliced"}))),
    );
    assert_eq!(r.status, 404, "spliced issuer/subject: {}", r.text());
    assert_eq!(r.text(), SESSION_NOT_FOUND);

    let m = alice.call("echo", json!({"still": "alice"}));
    assert_eq!(echoed_args(&m), json!({"still": "alice"}));
    alice.sync();
    impostor.sync();
    p.assert_nothing_rejected_reached_the_backend();
}

/// Issue 30.10: a 401's challenge names the metadata at the request's `Host` only when that
/// is a valid `host[:port]`; a `Host` crafted to break out of the quoted `resource_metadata`
/// gets the listen address instead, and the header carries exactly one `error`.
fn a_crafted_host_stays_out_of_the_challenge(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--jwt-jwks", &fixture_path("jwks.json")])
        .args(["--oauth-issuer", ISSUER])
        .start();
    let own = format!("http://{}/.well-known/oauth-protected-resource", p.addr);
    let expired = mint(
        Signer::Rsa,
        &claims_with(ISSUER, "alice", json!({"exp": now() - 3600})),
    );
    let auth = bearer(&expired);
    for (host, origin) in [
        (r#"a", error="injected"#, own.clone()),
        (r#"x\"#, own.clone()),
        ("a b", own.clone()),
        (
            "mcp.example:8443",
            "http://mcp.example:8443/.well-known/oauth-protected-resource".to_owned(),
        ),
    ] {
        for (path, endpoint, token) in [
            ("/mcp", "mcp", None),
            ("/sse", "sse", None),
            ("/mcp", "mcp", Some(auth.as_str())),
        ] {
            let mut headers = vec![
                ("Host", host),
                ("Accept", "application/json, text/event-stream"),
            ];
            if let Some(auth) = token {
                headers.push(("Authorization", auth));
            }
            let r = match endpoint {
                "mcp" => p.request("POST", path, &headers, Body::json("{}")),
                _ => p.request("GET", path, &headers, Body::None),
            };
            assert_eq!(r.status, 401, "Host {host:?} {path}: {}", r.text());
            let challenge = r.header("www-authenticate").unwrap_or_default();
            let mut want = format!(r#"Bearer resource_metadata="{origin}/{endpoint}""#);
            if token.is_some() {
                want.push_str(r#", error="invalid_token", error_description="token expired""#);
            }
            assert_eq!(challenge, want, "Host {host:?} {path}");
        }
    }
}

suite!(
    a_crafted_host_stays_out_of_the_challenge,
    oauth_resource_server_face,
    invalid_tokens_are_refused_with_their_reason,
    hs256_refusals,
    each_jwks_algorithm_opens_a_session,
    hs256_token_opens_a_session,
    refreshed_token_keeps_its_session,
    two_subjects_stay_isolated,
    same_subject_other_issuer_is_another_principal,
);
