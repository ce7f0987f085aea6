//! A real OpenID provider for the OAuth suites (SPEC 9): `tests/node/oidc-provider.mjs` (npm
//! `oidc-provider`, pinned in `tests/node/package-lock.json`) as a child process on loopback,
//! with helpers for its test-only endpoints: rotate the signing key, count key-set fetches,
//! mint access tokens for any resource, switch an outage on and off.
//!
//! ```no_run
//! use switchboard_tests::oidc::{oidc_provider, Mint};
//!
//! let Some(op) = oidc_provider("OAuth sign-in") else { return };
//! // --oauth-issuer op.issuer() ...
//! let token = op.token("http://127.0.0.1:8080/", "mcp:tools");
//! let other = op.mint(&Mint::new("http://other.example/", "mcp:tools").subject("bob"));
//! let new_kid = op.rotate();
//! assert!(op.jwks_fetches() <= 2);
//! ```

use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http::{self, Body, Response};
use crate::node::{node_with, Node, NodeRun};
use crate::{TempDir, WAIT};

/// The confidential client of the provider that may use `client_credentials` (and the
/// test-only `sub`, `ttl` and `claims` fields of that grant).
pub const TEST_CLIENT_ID: &str = "switchboard-tests";
/// Its secret (`client_secret_post`).
pub const TEST_CLIENT_SECRET: &str = "switchboard-tests-secret";

/// How long one start of the provider may take to print its issuer (Node start, an RSA
/// key; about a second): generous, for a machine loaded by a parallel build and every test
/// starting a provider at once.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts tried before the provider is given up on.
const START_ATTEMPTS: usize = 3;

/// How to start the provider; `Default` is a free port, RFC 8414 metadata served, no
/// `Cache-Control` on the key set, account `alice`, one-hour tokens.
#[derive(Debug, Clone, Default)]
pub struct OidcOptions {
    /// The port to listen on (0: any free one). A fixed port lets a test start a proxy
    /// before its identity provider is up ([`free_port`]).
    pub port: u16,
    /// `Cache-Control: public, max-age=N` on `/jwks`.
    pub jwks_max_age: Option<u64>,
    /// Answer 404 at `/.well-known/oauth-authorization-server`, so only OpenID discovery
    /// works.
    pub no_rfc8414: bool,
    /// The account sign-ins approve (default `alice`).
    pub account: Option<String>,
    /// Access token lifetime in seconds (default 3600).
    pub access_token_ttl: Option<u64>,
}

/// A running provider; killed (with its process group) on drop.
pub struct OidcProvider {
    // Dropped first: the process goes before its scratch folder.
    run: NodeRun,
    issuer: String,
    addr: SocketAddr,
    scratch: TempDir,
}

/// One access token to mint with the `client_credentials` grant of the test client.
#[derive(Debug, Clone)]
pub struct Mint {
    resource: String,
    scope: String,
    sub: Option<String>,
    ttl: Option<u64>,
    claims: Option<Value>,
}

impl Mint {
    /// A token whose `aud` is `resource` and whose `scope` is `scope` (space-separated; may
    /// be empty).
    pub fn new(resource: &str, scope: &str) -> Mint {
        Mint {
            resource: resource.to_owned(),
            scope: scope.to_owned(),
            sub: None,
            ttl: None,
            claims: None,
        }
    }

    /// The token's `sub` (default: the test client's id).
    pub fn subject(mut self, sub: &str) -> Mint {
        self.sub = Some(sub.to_owned());
        self
    }

    /// The token's lifetime in seconds.
    pub fn ttl(mut self, seconds: u64) -> Mint {
        self.ttl = Some(seconds);
        self
    }

    /// Claims merged into the token's payload (a JSON object), e.g. `{"scp": ["a"]}`.
    pub fn claims(mut self, claims: Value) -> Mint {
        self.claims = Some(claims);
        self
    }
}

/// The provider with default options, or `None` (after saying why) when `what` must skip
/// because Node or the pinned packages are missing; under `CI=true` that panics instead.
pub fn oidc_provider(what: &str) -> Option<OidcProvider> {
    OidcProvider::start(what, OidcOptions::default())
}

/// A loopback port that was free a moment ago (for a provider started later on it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

/// Runs the provider script with `args` until it prints its JSON line (`Ok`: the process and
/// that line), exits, or takes longer than [`START_TIMEOUT`] (then it is killed).
fn launch(node: &Node, args: &[String], scratch: &TempDir) -> Result<(NodeRun, Value), String> {
    let mut run = node.spawn("node", args, scratch.path(), "oidc-provider");
    let stdout = scratch.file("oidc-provider-stdout.txt");
    let stderr = scratch.file("oidc-provider-stderr.txt");
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let out = fs::read_to_string(&stdout).unwrap_or_default();
        if let Some(line) = out.lines().find(|l| l.starts_with('{')) {
            let started = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("the OpenID provider printed {line:?}: {e}"));
            return Ok((run, started));
        }
        let exited = run.has_exited();
        if exited || Instant::now() >= deadline {
            let why = if exited { "exited" } else { "timed out" };
            return Err(format!(
                "{why}:\n--- stdout ---\n{out}\n--- stderr ---\n{}",
                fs::read_to_string(&stderr).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl OidcProvider {
    /// Starts the provider with `options`; `None` as [`oidc_provider`].
    pub fn start(what: &str, options: OidcOptions) -> Option<OidcProvider> {
        let node = node_with(what, &["oidc-provider"])?;
        let scratch = TempDir::new("oidc-provider");
        let mut args = vec![
            node.file("oidc-provider.mjs").display().to_string(),
            "--port".to_owned(),
            options.port.to_string(),
        ];
        if let Some(s) = options.jwks_max_age {
            args.extend(["--jwks-max-age".to_owned(), s.to_string()]);
        }
        if options.no_rfc8414 {
            args.push("--no-rfc8414".to_owned());
        }
        if let Some(a) = &options.account {
            args.extend(["--account".to_owned(), a.clone()]);
        }
        if let Some(s) = options.access_token_ttl {
            args.extend(["--access-token-ttl".to_owned(), s.to_string()]);
        }
        // A start takes about a second; now and then, on a loaded machine, Node stalls
        // before it listens: that attempt is killed and the provider started again.
        let mut why = String::new();
        let mut launched = None;
        for _ in 0..START_ATTEMPTS {
            match launch(&node, &args, &scratch) {
                Ok(ok) => {
                    launched = Some(ok);
                    break;
                }
                Err(e) => why = e,
            }
        }
        let Some((run, started)) = launched else {
            panic!(
                "the OpenID provider did not start (port {}): {why}",
                options.port
            );
        };
        let issuer = started["issuer"]
            .as_str()
            .expect("the provider's issuer")
            .to_owned();
        let port = started["port"].as_u64().expect("the provider's port") as u16;
        Some(OidcProvider {
            run,
            issuer,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            scratch,
        })
    }

    /// `http://127.0.0.1:PORT`, exactly as its metadata says (no trailing slash).
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The key set's URL (`jwks_uri` of its metadata).
    pub fn jwks_url(&self) -> String {
        format!("{}/jwks", self.issuer)
    }

    /// A request to the provider; panics when it cannot be made.
    pub fn request(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: Body,
    ) -> Response {
        http::request(self.addr, method, target, headers, body, WAIT).unwrap_or_else(|e| {
            panic!(
                "{method} {target} at the OpenID provider: {e}\n{}",
                self.stderr()
            )
        })
    }

    /// A GET answered 200 with JSON.
    pub fn get_json(&self, target: &str) -> Value {
        let r = self.request("GET", target, &[], Body::None);
        assert_eq!(r.status, 200, "GET {target}: {}", r.text());
        r.json()
    }

    fn post_test(&self, target: &str) -> Value {
        let r = self.request("POST", target, &[], Body::None);
        assert_eq!(r.status, 200, "POST {target}: {}", r.text());
        r.json()
    }

    /// `/test/stats`: `jwks_fetches`, `discovery_fetches`, `registrations`,
    /// `authorizations`, `token_requests`, `kid`, `kids`, `outage`, `account`.
    pub fn stats(&self) -> Value {
        self.get_json("/test/stats")
    }

    /// How many times `/jwks` was fetched so far.
    pub fn jwks_fetches(&self) -> u64 {
        self.stats()["jwks_fetches"].as_u64().expect("jwks_fetches")
    }

    /// The kid that signs new tokens.
    pub fn kid(&self) -> String {
        self.stats()["kid"].as_str().expect("kid").to_owned()
    }

    /// Rotates the signing key (the previous key stays in the key set, after the new one);
    /// returns the new kid.
    pub fn rotate(&self) -> String {
        self.post_test("/test/rotate")["kid"]
            .as_str()
            .expect("new kid")
            .to_owned()
    }

    /// Rotates the signing key and drops the previous one from the key set; returns the new
    /// kid.
    pub fn rotate_dropping_old(&self) -> String {
        self.post_test("/test/rotate?keep_old=0")["kid"]
            .as_str()
            .expect("new kid")
            .to_owned()
    }

    /// While on, every endpoint but `/test/*` answers 503.
    pub fn set_outage(&self, on: bool) {
        self.post_test(if on {
            "/test/outage?on=1"
        } else {
            "/test/outage?on=0"
        });
    }

    /// The account later sign-ins approve.
    pub fn set_account(&self, sub: &str) {
        self.post_test(&format!("/test/account?sub={}", form_encode(sub)));
    }

    /// An access token (a JWT) for `resource` (its `aud`) with `scope`, `sub` the test client.
    pub fn token(&self, resource: &str, scope: &str) -> String {
        self.mint(&Mint::new(resource, scope))
    }

    /// An access token as `mint` says, from the `client_credentials` grant.
    pub fn mint(&self, mint: &Mint) -> String {
        let mut form = vec![
            ("grant_type", "client_credentials".to_owned()),
            ("client_id", TEST_CLIENT_ID.to_owned()),
            ("client_secret", TEST_CLIENT_SECRET.to_owned()),
            ("resource", mint.resource.clone()),
        ];
        if !mint.scope.is_empty() {
            form.push(("scope", mint.scope.clone()));
        }
        if let Some(sub) = &mint.sub {
            form.push(("sub", sub.clone()));
        }
        if let Some(ttl) = mint.ttl {
            form.push(("ttl", ttl.to_string()));
        }
        if let Some(claims) = &mint.claims {
            form.push(("claims", claims.to_string()));
        }
        let body = form
            .iter()
            .map(|(k, v)| format!("{k}={}", form_encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let r = self.request(
            "POST",
            "/token",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            Body::Bytes(body.into_bytes()),
        );
        assert_eq!(r.status, 200, "minting a token: {}", r.text());
        r.json()["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no access_token in {}", r.text()))
            .to_owned()
    }

    /// What the provider printed on stderr so far (for failure messages).
    pub fn stderr(&self) -> String {
        format!(
            "--- OpenID provider stderr ---\n{}",
            fs::read_to_string(self.scratch.file("oidc-provider-stderr.txt")).unwrap_or_default()
        )
    }

    /// Stops the provider now (a later start on the same port may follow).
    pub fn stop(self) {
        drop(self);
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        !self.run.has_exited()
    }
}

/// `application/x-www-form-urlencoded` encoding of one value.
pub fn form_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The header and payload of a JWT, decoded (not verified).
pub fn jwt_parts(token: &str) -> (Value, Value) {
    let mut parts = token.split('.');
    let mut next = |what: &str| -> Value {
        let part = parts
            .next()
            .unwrap_or_else(|| panic!("no {what} in token {token:?}"));
        let bytes = base64url_decode(part)
            .unwrap_or_else(|| panic!("the {what} of {token:?} is not base64url"));
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("the {what} of {token:?} is not JSON: {e}"))
    };
    let header = next("header");
    let payload = next("payload");
    (header, payload)
}

/// Unpadded base64url (RFC 4648 §5), as in JWTs and JWKs; `None` on a bad character.
pub fn base64url_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}
