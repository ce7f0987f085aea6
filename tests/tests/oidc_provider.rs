//! The OpenID provider of the OAuth suites (`tests/node/oidc-provider.mjs`, driven by
//! `switchboard_tests::oidc`) does what those suites rely on, checked over loopback HTTP with
//! no proxy involved: discovery documents, a key set with kids, JWT access tokens whose `aud`
//! is the requested resource and whose signature the key set verifies, key rotation, the
//! key-set fetch counter, a fixed port, the outage switch and `--no-rfc8414`; and the path the
//! SDK clients take: open registration of a public client, PKCE required, an authorization
//! that approves at once (a browser's redirects and cookies), the code redeemed for a JWT.
//!
//! Needs Node and the pinned packages of `tests/node` (`tests/run.sh` installs them); without
//! them the tests skip loudly, or fail when `CI=true`.

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{json, Value};
use switchboard_tests::oidc::{
    form_encode, free_port, jwt_parts, oidc_provider, Mint, OidcOptions, OidcProvider,
};
use switchboard_tests::Body;

const RESOURCE: &str = "http://127.0.0.1:8080/";

/// Verifies `token` (RS256) with the key of the provider's key set that its `kid` names, and
/// returns its payload.
fn verify(op: &OidcProvider, token: &str, audience: &str) -> Value {
    let (header, _) = jwt_parts(token);
    let kid = header["kid"].as_str().expect("a kid in the header");
    let jwks = op.get_json("/jwks");
    let key = jwks["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .find(|k| k["kid"] == kid)
        .unwrap_or_else(|| panic!("kid {kid} is not in the key set {jwks}"));
    let decoding = DecodingKey::from_rsa_components(
        key["n"].as_str().expect("n"),
        key["e"].as_str().expect("e"),
    )
    .expect("an RSA key");
    let mut validation = Validation::new(Algorithm::RS256);
    validation.set_audience(&[audience]);
    validation.set_issuer(&[op.issuer()]);
    jsonwebtoken::decode::<Value>(token, &decoding, &validation)
        .unwrap_or_else(|e| panic!("the token does not verify: {e}"))
        .claims
}

fn kids(op: &OidcProvider) -> Vec<String> {
    op.get_json("/jwks")["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| k["kid"].as_str().expect("every key has a kid").to_owned())
        .collect()
}

#[test]
fn discovery_tokens_rotation_and_fetch_counter() {
    let Some(op) = oidc_provider("the OpenID provider of the OAuth suites") else {
        return;
    };
    let issuer = op.issuer().to_owned();
    assert!(issuer.starts_with("http://127.0.0.1:"), "{issuer}");
    assert!(!issuer.ends_with('/'), "{issuer}");

    // Both discovery documents, naming the issuer exactly.
    for path in [
        "/.well-known/openid-configuration",
        "/.well-known/oauth-authorization-server",
    ] {
        let meta = op.get_json(path);
        assert_eq!(meta["issuer"], issuer.as_str(), "{path}: {meta}");
        assert_eq!(meta["jwks_uri"], op.jwks_url(), "{path}");
        assert_eq!(meta["registration_endpoint"], format!("{issuer}/reg"));
        assert_eq!(meta["authorization_endpoint"], format!("{issuer}/auth"));
        assert_eq!(meta["token_endpoint"], format!("{issuer}/token"));
        assert_eq!(meta["code_challenge_methods_supported"], json!(["S256"]));
        assert_eq!(meta["authorization_response_iss_parameter_supported"], true);
        let auth_methods = meta["token_endpoint_auth_methods_supported"].to_string();
        assert!(auth_methods.contains("\"none\""), "{auth_methods}");
    }
    assert_eq!(op.stats()["discovery_fetches"], 2);

    // The key set: one RS256 signing key with a kid; every GET counted.
    let before = op.jwks_fetches();
    let first = op.get_json("/jwks");
    let key = &first["keys"][0];
    assert_eq!(key["kty"], "RSA");
    assert_eq!(key["alg"], "RS256");
    assert_eq!(key["use"], "sig");
    assert!(
        key.get("d").is_none(),
        "the key set leaks a private key: {key}"
    );
    let kid1 = key["kid"].as_str().expect("kid").to_owned();
    assert_eq!(op.kid(), kid1);
    assert_eq!(op.jwks_fetches(), before + 1);
    let response = op.request("GET", "/jwks", &[], Body::None);
    assert_eq!(
        response.header("cache-control"),
        None,
        "no max-age unless asked"
    );
    assert_eq!(op.jwks_fetches(), before + 2);

    // A token for a resource: a JWT signed by the current key, aud = the resource verbatim.
    let token = op.token(RESOURCE, "mcp:tools mcp:admin");
    let (header, _) = jwt_parts(&token);
    assert_eq!(header["alg"], "RS256");
    assert_eq!(header["typ"], "at+jwt");
    assert_eq!(header["kid"], kid1.as_str());
    let claims = verify(&op, &token, RESOURCE);
    assert_eq!(claims["aud"], RESOURCE);
    assert_eq!(claims["iss"], issuer.as_str());
    assert_eq!(claims["scope"], "mcp:tools mcp:admin");
    assert_eq!(claims["sub"], "switchboard-tests");

    // A token for another resource, another subject, a short life and extra claims.
    let other = op.mint(
        &Mint::new("http://other.example/mcp", "mcp:tools")
            .subject("bob")
            .ttl(5)
            .claims(json!({"scp": ["a", "b"]})),
    );
    let claims = verify(&op, &other, "http://other.example/mcp");
    assert_eq!(claims["aud"], "http://other.example/mcp");
    assert_eq!(claims["sub"], "bob");
    assert_eq!(claims["scp"], json!(["a", "b"]));
    let life = claims["exp"].as_u64().expect("exp") - claims["iat"].as_u64().expect("iat");
    assert_eq!(life, 5);

    // Rotation: a new kid signs; the key set lists it first and keeps the old one.
    let fetches = op.jwks_fetches();
    let kid2 = op.rotate();
    assert_ne!(kid2, kid1);
    assert_eq!(op.kid(), kid2);
    assert_eq!(kids(&op), vec![kid2.clone(), kid1.clone()]);
    let token2 = op.token(RESOURCE, "mcp:tools");
    assert_eq!(jwt_parts(&token2).0["kid"], kid2.as_str());
    verify(&op, &token2, RESOURCE);
    verify(&op, &token, RESOURCE);

    // Rotating again without keeping the old key: only the newest is left.
    let kid3 = op.rotate_dropping_old();
    assert_eq!(kids(&op), vec![kid3]);
    // kids() fetched the key set twice, verify() twice, rotate() not at all.
    assert_eq!(op.jwks_fetches(), fetches + 4);

    // The outage switch: 503 everywhere but /test/*, then back.
    op.set_outage(true);
    assert_eq!(op.request("GET", "/jwks", &[], Body::None).status, 503);
    assert_eq!(
        op.request("GET", "/.well-known/openid-configuration", &[], Body::None)
            .status,
        503
    );
    op.set_outage(false);
    assert_eq!(op.request("GET", "/jwks", &[], Body::None).status, 200);
}

#[test]
fn fixed_port_max_age_and_openid_discovery_only() {
    let port = free_port();
    let options = OidcOptions {
        port,
        jwks_max_age: Some(300),
        no_rfc8414: true,
        ..OidcOptions::default()
    };
    let Some(op) = OidcProvider::start("the OpenID provider of the OAuth suites", options.clone())
    else {
        return;
    };
    assert_eq!(op.issuer(), format!("http://127.0.0.1:{port}"));
    let r = op.request(
        "GET",
        "/.well-known/oauth-authorization-server",
        &[],
        Body::None,
    );
    assert_eq!(r.status, 404);
    assert_eq!(
        op.get_json("/.well-known/openid-configuration")["issuer"],
        op.issuer()
    );
    let r = op.request("GET", "/jwks", &[], Body::None);
    assert_eq!(r.header("cache-control"), Some("public, max-age=300"));
    let kid = op.kid();
    op.stop();

    // Up again on the same port (a provider that was down comes back): same issuer, new key.
    let op = OidcProvider::start("the OpenID provider of the OAuth suites", options)
        .expect("it started once already");
    assert_eq!(op.issuer(), format!("http://127.0.0.1:{port}"));
    assert_ne!(op.kid(), kid, "a restarted provider has a new key");
}

/// Where the provider sends the user agent back; never fetched.
const REDIRECT_URI: &str = "http://127.0.0.1:9/callback";
/// A PKCE pair (S256): the challenge is the unpadded base64url SHA-256 of the verifier.
const VERIFIER: &str = "switchboard-tests-pkce-verifier-0123456789-abcdefghijklmnop";
const CHALLENGE: &str = "HOmh53eJoyknvOAtdxGux71TmDsERauaN6fa0ewkxaw";

/// Percent-decoding of one form value (`+` is a space).
fn form_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("ascii");
                out.push(u8::from_str_radix(hex, 16).expect("a percent escape"));
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).expect("UTF-8")
}

/// The query parameters of `url`.
fn query(url: &str) -> Vec<(String, String)> {
    url.split_once('?')
        .map(|(_, q)| q)
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (form_decode(k), form_decode(v))
        })
        .collect()
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn form(fields: &[(&str, &str)]) -> Body {
    let text = fields
        .iter()
        .map(|(k, v)| format!("{k}={}", form_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    Body::Bytes(text.into_bytes())
}

/// Follows `url` at the provider like a browser (cookies kept) until it redirects to
/// REDIRECT_URI; returns that redirect's query and the paths visited.
fn authorize(op: &OidcProvider, url: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut cookies: Vec<(String, String)> = Vec::new();
    let mut visited = Vec::new();
    let mut next = url.to_owned();
    for _ in 0..10 {
        if next.starts_with(REDIRECT_URI) {
            return (query(&next), visited);
        }
        let target = next.strip_prefix(op.issuer()).unwrap_or(&next).to_owned();
        visited.push(target.split('?').next().unwrap_or("").to_owned());
        let cookie = cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ");
        let mut headers = vec![];
        if !cookie.is_empty() {
            headers.push(("Cookie", cookie.as_str()));
        }
        let r = op.request("GET", &target, &headers, Body::None);
        for (name, value) in &r.headers {
            if name.eq_ignore_ascii_case("set-cookie") {
                let pair = value.split(';').next().unwrap_or("");
                if let Some((k, v)) = pair.split_once('=') {
                    cookies.retain(|(n, _)| n != k.trim());
                    cookies.push((k.trim().to_owned(), v.trim().to_owned()));
                }
            }
        }
        let location = r.header("location").unwrap_or_else(|| {
            panic!(
                "GET {target}: {} without a redirect: {}",
                r.status,
                r.text()
            )
        });
        assert!([302, 303].contains(&r.status), "GET {target}: {}", r.status);
        next = if location.starts_with('/') {
            format!("{}{location}", op.issuer())
        } else {
            location.to_owned()
        };
    }
    panic!("too many redirects: {visited:?}");
}

#[test]
fn registration_pkce_and_an_authorization_that_approves_at_once() {
    let Some(op) = oidc_provider("the OpenID provider of the OAuth suites") else {
        return;
    };
    // Open dynamic registration of a public client, with a scope the provider does not list.
    let r = op.request(
        "POST",
        "/reg",
        &[("Content-Type", "application/json")],
        Body::json(
            &json!({
                "redirect_uris": [REDIRECT_URI],
                "token_endpoint_auth_method": "none",
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "scope": "mcp:tools offline_access",
            })
            .to_string(),
        ),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let client = r.json();
    let client_id = client["client_id"].as_str().expect("client_id").to_owned();
    assert_eq!(client["token_endpoint_auth_method"], "none");
    assert!(client.get("client_secret").is_none(), "{client}");

    let auth = |extra: &[(&str, &str)]| {
        let mut fields = vec![
            ("response_type", "code"),
            ("client_id", client_id.as_str()),
            ("redirect_uri", REDIRECT_URI),
            ("state", "st-1"),
            ("scope", "mcp:tools offline_access"),
            ("prompt", "consent"),
            ("resource", RESOURCE),
        ];
        fields.extend_from_slice(extra);
        let q = fields
            .iter()
            .map(|(k, v)| format!("{k}={}", form_encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        format!("{}/auth?{q}", op.issuer())
    };

    // Without PKCE: refused, back at the client.
    let (params, _) = authorize(&op, &auth(&[]));
    assert_eq!(
        param(&params, "error"),
        Some("invalid_request"),
        "{params:?}"
    );

    // With PKCE: approved at once (no page), a code for the client, with state and iss.
    let (params, visited) = authorize(
        &op,
        &auth(&[
            ("code_challenge", CHALLENGE),
            ("code_challenge_method", "S256"),
        ]),
    );
    assert_eq!(param(&params, "error"), None, "{params:?}");
    assert_eq!(param(&params, "state"), Some("st-1"));
    assert_eq!(param(&params, "iss"), Some(op.issuer()));
    let code = param(&params, "code").expect("a code").to_owned();
    assert_eq!(
        visited.len(),
        3,
        "/auth, /interaction/UID, /auth/UID: {visited:?}"
    );

    // The code, redeemed with its verifier: a JWT for the resource, for alice.
    let r = op.request(
        "POST",
        "/token",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        form(&[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("redirect_uri", REDIRECT_URI),
            ("client_id", &client_id),
            ("code_verifier", VERIFIER),
            ("resource", RESOURCE),
        ]),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let tokens = r.json();
    assert_eq!(tokens["token_type"], "Bearer");
    assert!(
        tokens["refresh_token"].is_string(),
        "offline_access: {tokens}"
    );
    let access = tokens["access_token"].as_str().expect("access_token");
    let claims = verify(&op, access, RESOURCE);
    assert_eq!(claims["sub"], "alice");
    assert_eq!(claims["scope"], "mcp:tools");
    assert_eq!(claims["client_id"], client_id.as_str());
    let stats = op.stats();
    assert_eq!(stats["registrations"], 1);
    assert_eq!(stats["authorizations"], 2);
}
