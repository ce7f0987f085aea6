//! The HTTP surface as data: which endpoint a request names, the Origin and Host checks,
//! and every refusal as (status, headers, body). Shells only copy these onto the wire.

use std::borrow::Cow;

use crate::auth::{Auth, AuthFailure, Principal};
pub use crate::message::Checked;
use crate::message::Invalid;
use crate::oauth::ResourceServer;

/// What a request asks for, from its method and path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET /sse`: open a legacy session's stream.
    Stream,
    /// `POST /messages`: one JSON-RPC message for a legacy session.
    Messages,
    /// `POST /mcp`: one JSON-RPC message, Streamable HTTP (SPEC section 7).
    McpPost,
    /// `GET /mcp`: a Streamable session's standalone stream.
    McpGet,
    /// `DELETE /mcp`: end a Streamable session.
    McpDelete,
    /// `OPTIONS` on `/mcp`, `/messages` or `/sse`: a browser's CORS preflight.
    Preflight,
    /// `GET /health`.
    Health,
    /// `GET /metrics`.
    Metrics,
    /// `GET /.well-known/oauth-protected-resource[<base-path>/mcp|/sse]` (RFC 9728), when
    /// the proxy is an OAuth resource server.
    ResourceMetadata,
}

impl Endpoint {
    /// Routes `method` and `path` (without query, `--base-path` already removed).
    pub(crate) fn route(method: &str, path: &str) -> Result<Endpoint, Rejection> {
        let endpoint = match (path, method) {
            ("/sse", "GET") => Endpoint::Stream,
            ("/messages" | "/messages/", "POST") => Endpoint::Messages,
            ("/mcp" | "/mcp/", "POST") => Endpoint::McpPost,
            ("/mcp" | "/mcp/", "GET") => Endpoint::McpGet,
            ("/mcp" | "/mcp/", "DELETE") => Endpoint::McpDelete,
            ("/sse" | "/messages" | "/messages/" | "/mcp" | "/mcp/", "OPTIONS") => {
                Endpoint::Preflight
            }
            ("/health", "GET") => Endpoint::Health,
            ("/metrics", "GET") => Endpoint::Metrics,
            (path, _) => {
                let allow = match path {
                    "/sse" => "GET, OPTIONS",
                    "/messages" | "/messages/" => "POST, OPTIONS",
                    "/mcp" | "/mcp/" => "GET, POST, DELETE, OPTIONS",
                    "/health" | "/metrics" => "GET",
                    _ => return Err(Rejection::NotFound),
                };
                return Err(Rejection::MethodNotAllowed { allow });
            }
        };
        Ok(endpoint)
    }
}

/// The parts of a request head the gate looks at, borrowed from the shell's HTTP library.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestHead<'a> {
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// The request target: origin form (`/messages?session_id=...`) or absolute form
    /// (`http://host:port/sse`), as sent.
    pub target: &'a str,
    /// The target's authority when the HTTP library split it off the target already.
    pub authority: Option<&'a str>,
    /// The `Authorization` header.
    pub authorization: Option<&'a [u8]>,
    /// The `Origin` header.
    pub origin: Option<&'a str>,
    /// The `Host` header.
    pub host: Option<&'a str>,
    /// The `Content-Type` header.
    pub content_type: Option<&'a str>,
    /// The `Accept` header.
    pub accept: Option<&'a str>,
    /// The `Mcp-Session-Id` header.
    pub mcp_session_id: Option<&'a str>,
    /// The `MCP-Protocol-Version` header.
    pub mcp_protocol_version: Option<&'a str>,
    /// The `Last-Event-ID` header (a Streamable client resuming a stream), as sent: one
    /// that is not text still names no stream (400), it is not absent.
    pub last_event_id: Option<&'a [u8]>,
    /// Every `Mcp-Method`, `Mcp-Name` and `Mcp-Param-*` field line (names as sent, see
    /// [`is_modern_field`]), in order, duplicates kept: a 2026-07-28 request mirrors its
    /// body in them. Empty for every 2025 request, so it costs those nothing.
    pub mcp_fields: &'a [(&'a str, &'a str)],
    /// The peer's address and port.
    pub peer: Option<std::net::SocketAddr>,
    /// The `User-Agent` header.
    pub user_agent: Option<&'a str>,
    /// Every `X-Forwarded-For` field line, in order (believed only from a
    /// `--trusted-proxy`); a line that is not visible ASCII as `""`, a hop never believed.
    pub forwarded_for: &'a [&'a str],
    /// The `traceparent` header (W3C Trace Context).
    pub traceparent: Option<&'a str>,
    /// The `tracestate` header.
    pub tracestate: Option<&'a str>,
}

impl<'a> RequestHead<'a> {
    /// The target without scheme and authority, then split at `?`: (path, query).
    fn path_and_query(&self) -> (&'a str, Option<&'a str>) {
        let target = self.target;
        let origin_form = target
            .strip_prefix("http://")
            .or_else(|| target.strip_prefix("https://"))
            .map_or(target, |rest| rest.find('/').map_or("/", |at| &rest[at..]));
        match origin_form.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (origin_form, None),
        }
    }

    /// The hosts the request names, each checked: an absolute-form target's authority
    /// (which RFC 9112 §3.2.2 makes the one that counts) and the `Host` header; either
    /// alone when the other is absent.
    fn hosts(&self) -> [Option<&'a str>; 2] {
        let authority = self.authority.or_else(|| {
            let rest = self
                .target
                .strip_prefix("http://")
                .or_else(|| self.target.strip_prefix("https://"))?;
            Some(rest.split(['/', '?']).next().unwrap_or(rest))
        });
        match (authority, self.host) {
            (Some(authority), Some(host)) => [Some(authority), Some(host)],
            (named, None) | (None, named) => [named, None],
        }
    }
}

/// Who may reach which endpoint: routing under `--base-path`, then auth, Origin and Host
/// in the order of SPEC section 1. `/health` is open; `/metrics` too unless
/// `--metrics-auth`; a CORS preflight carries no credentials.
#[derive(Debug, Clone)]
pub struct Gate {
    /// How callers are identified.
    pub auth: Auth,
    /// The Origin and Host rules.
    pub origins: OriginPolicy,
    /// `--base-path` without a trailing slash.
    pub base_path: String,
    /// Whether `/metrics` needs credentials.
    pub metrics_auth: bool,
    /// The OAuth resource server's face (SPEC section 9), when `--oauth-issuer` is given.
    pub oauth: Option<std::sync::Arc<ResourceServer>>,
    /// Peers whose `X-Forwarded-For` names the client (`--trusted-proxy`).
    pub trusted_proxies: Vec<crate::audit::Cidr>,
    /// Whether spans are made (`--otlp-endpoint`): only then are trace headers read.
    pub tracing: bool,
}

/// The Streamable HTTP headers of a `/mcp` request, as sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpHeaders {
    /// `Mcp-Session-Id`.
    pub session: Option<String>,
    /// `Content-Type` (POST).
    pub content_type: Option<Cow<'static, str>>,
    /// `Accept`.
    pub accept: Option<Cow<'static, str>>,
    /// `MCP-Protocol-Version`.
    pub protocol_version: Option<Cow<'static, str>>,
    /// `Last-Event-ID` (GET).
    pub last_event_id: Option<String>,
    /// The 2026-07-28 mirror headers (`Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`), names
    /// lowercase, in order, duplicates kept.
    pub fields: Vec<(String, String)>,
}

/// Whether a header is one a shell puts in [`RequestHead::mcp_fields`]: `Mcp-Method`,
/// `Mcp-Name` or `Mcp-Param-*`, in any case.
pub fn is_modern_field(name: &str) -> bool {
    let lower = |prefix: &str| {
        name.len() >= prefix.len()
            && name.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
    };
    name.eq_ignore_ascii_case("mcp-method")
        || name.eq_ignore_ascii_case("mcp-name")
        || lower("mcp-param-")
}

/// The one value of a field that must not repeat (`MCP-Protocol-Version`): a field given
/// twice names no version (`""`, which no check accepts), so a repeated header is a
/// mismatch (SPEC section 13) and never read as its first or last line.
pub fn single_field<'a>(mut lines: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let first = lines.next()?;
    match lines.next() {
        None => Some(first),
        Some(_) => Some(""),
    }
}

/// The protocol revisions a `MCP-Protocol-Version` header may name.
pub(crate) const PROTOCOL_VERSIONS: [&str; 4] =
    ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The revision of SPEC section 13 (no session; headers mirror the body).
pub(crate) const MODERN_VERSION: &str = "2026-07-28";

/// Whether a POST is a modern request: its version header says so, or it names no session
/// and its `_meta` names a protocol version.
pub(crate) fn is_modern(version: Option<&str>, has_session: bool, meta_version: bool) -> bool {
    match version.map(str::trim) {
        Some(MODERN_VERSION) => true,
        _ => !has_session && meta_version,
    }
}

/// The media types clients send in nearly every `/mcp` request: a header holding one of
/// these (or a protocol version this proxy speaks) exactly is borrowed, not copied.
const COMMON_MEDIA: [&str; 4] = [
    "application/json",
    "application/json, text/event-stream",
    "text/event-stream, application/json",
    "text/event-stream",
];

fn common_or_owned(value: &str) -> Cow<'static, str> {
    let mut common = COMMON_MEDIA.iter().chain(&PROTOCOL_VERSIONS);
    match common.find(|common| **common == value) {
        Some(common) => Cow::Borrowed(common),
        None => Cow::Owned(value.to_owned()),
    }
}

impl McpHeaders {
    fn of(head: &RequestHead<'_>) -> Self {
        Self {
            session: head.mcp_session_id.map(str::to_owned),
            content_type: head.content_type.map(common_or_owned),
            accept: head.accept.map(common_or_owned),
            protocol_version: head.mcp_protocol_version.map(common_or_owned),
            last_event_id: (head.last_event_id).map(|id| String::from_utf8_lossy(id).into_owned()),
            fields: (head.mcp_fields.iter())
                .map(|(name, value)| (name.to_ascii_lowercase(), (*value).to_owned()))
                .collect(),
        }
    }
}

/// What a credential grants, for the hub's scope checks (SPEC section 9).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// The scopes the token grants (a JWT's `scope` or `scp`).
    pub scopes: Vec<String>,
    /// The token's claims, when it is a JWT (for policies).
    pub claims: Option<crate::principal::ClaimSet>,
    /// Where this endpoint's protected resource metadata is, when the proxy is an OAuth
    /// resource server: for the challenge of a 403 `insufficient_scope`.
    pub metadata_url: Option<String>,
}

/// A request the gate let through: what it asks for, who asks, and the session it names.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// What it asks for.
    pub endpoint: Endpoint,
    /// Who asks ([`Principal::anonymous`] where no credentials are needed).
    pub principal: Principal,
    /// The session named by `session_id` (or `sessionId`), empty when none.
    pub session: String,
    /// The Streamable HTTP headers, for `/mcp`.
    pub mcp: McpHeaders,
    /// The browser origin to answer with CORS headers (present and allowed).
    pub cors: Option<String>,
    /// What the caller's credential grants.
    pub grant: Grant,
    /// Where it came from, for audit records.
    pub source: std::sync::Arc<crate::audit::Source>,
    /// Its trace headers, when spans are made (`None` otherwise: no work, no allocation).
    pub trace: Option<Box<crate::trace::TraceHeaders>>,
}

impl Admitted {
    /// An admitted request for `endpoint` by `principal` naming `session`, with no other
    /// headers (tests and tools).
    pub fn new(endpoint: Endpoint, principal: Principal, session: &str) -> Admitted {
        Admitted {
            endpoint,
            principal,
            session: session.to_owned(),
            mcp: McpHeaders::default(),
            cors: None,
            grant: Grant::default(),
            source: Default::default(),
            trace: None,
        }
    }

    /// The hub's input for this request with the body the shell read; `entropy` (16
    /// random bytes from the OS) is called only for a request that may create a session.
    ///
    /// A POST's body is admitted here (SPEC section 1's checks of the message itself: one
    /// parse, every nested key checked), so a shell calls this where the body arrived (the
    /// connection's task or thread), never on the hub's: a large body then costs its own
    /// connection, not every session's latency. Pure, like the gate.
    pub fn into_request(self, body: Payload, entropy: impl FnOnce() -> [u8; 16]) -> Request {
        let mut body = Body::admit(self.endpoint, body);
        let mut modern = false;
        if self.endpoint == Endpoint::McpPost {
            (body, modern) = body.modernize(&self.mcp);
        }
        let creates = match self.endpoint {
            Endpoint::Stream => true,
            Endpoint::McpPost => modern || self.mcp.session.is_none(),
            _ => false,
        };
        Request {
            endpoint: self.endpoint,
            principal: self.principal,
            session: self.session,
            mcp: self.mcp,
            cors: self.cors,
            grant: self.grant,
            source: self.source,
            body,
            entropy: if creates { entropy() } else { [0; 16] },
            trace: self.trace,
        }
    }
}

/// A request the gate refused: why (counted by the hub) and the answer to send now.
#[derive(Debug, Clone)]
pub struct Refused {
    /// Why.
    pub rejection: Rejection,
    /// The answer, CORS headers included for an allowed origin.
    pub response: Response,
    /// Where it came from and what it asked for, for its audit event.
    pub asked: crate::audit::Asked,
    /// For a token naming a key its issuer's key sets lack: the issuer it claims (not
    /// verified), whose key sets the hub may refetch
    /// ([`Hub::handle_refused`](crate::Hub::handle_refused)).
    pub claimed_issuer: Option<std::sync::Arc<str>>,
}

impl Gate {
    /// The key store JWT verification reads, for the loop to give it fetched key sets.
    #[cfg(feature = "jwt")]
    pub fn key_store(&self) -> Option<std::sync::Arc<crate::jwt::KeyStore>> {
        match &self.auth {
            Auth::Jwt(store) => Some(store.clone()),
            _ => None,
        }
    }

    /// What the request asks for and who asks, or the refusal to send at once. `now` is
    /// seconds since the Unix epoch (token expiry). A refusal is boxed: it is the rare path.
    pub fn admit(&self, head: &RequestHead<'_>, now: u64) -> Result<Admitted, Box<Refused>> {
        self.admit_inner(head, now).map_err(|rejection| {
            let mut response = rejection.response();
            if let (Rejection::Unauthorized(failure), Some(oauth)) = (rejection, &self.oauth) {
                let streamable = head.path_and_query().0.contains("/mcp");
                let url = oauth.metadata_url(head.host, streamable);
                response
                    .headers
                    .retain(|(name, _)| *name != "www-authenticate");
                let challenge = oauth.challenge(&url, failure);
                response
                    .headers
                    .push(("www-authenticate", Cow::Owned(challenge)));
            }
            let path = head.path_and_query().0;
            if self
                .oauth
                .as_ref()
                .is_some_and(|o| o.is_metadata_path(path))
            {
                // SPEC section 9: the metadata document is readable from any origin, and
                // every answer at its path says so.
                let any = Cow::Borrowed("*");
                response.headers.push(("access-control-allow-origin", any));
            } else if let Some(origin) = head.origin.filter(|o| self.origins.allows_origin(o)) {
                // Only an allowed origin is echoed (SPEC section 1), whatever the refusal.
                add_cors(&mut response, origin);
            }
            let unknown_key = rejection == Rejection::Unauthorized(AuthFailure::UnknownKey);
            Box::new(Refused {
                rejection,
                response,
                asked: self.asked(head),
                claimed_issuer: unknown_key
                    .then(|| self.auth.claimed_issuer(head.authorization))
                    .flatten(),
            })
        })
    }

    /// Where a request came from and which endpoint it named, for the audit event of its
    /// refusal (by the gate, or by the framing rules in the shell).
    pub fn asked(&self, head: &RequestHead<'_>) -> crate::audit::Asked {
        let source = std::sync::Arc::new(self.source(head));
        let path = head.path_and_query().0;
        crate::audit::Asked::new(source, head.method, path, &self.base_path)
    }

    /// Where a request came from: SPEC section 11's client address and its `User-Agent`.
    pub fn source(&self, head: &RequestHead<'_>) -> crate::audit::Source {
        let peer_ip = head.peer.map(|peer| peer.ip());
        let ip = crate::audit::client_ip(peer_ip, head.forwarded_for, &self.trusted_proxies);
        crate::audit::Source {
            // A forwarded client's port is not known: the peer's is the proxy's.
            port: head.peer.filter(|_| ip == peer_ip).map(|peer| peer.port()),
            ip,
            user_agent: head.user_agent.map(crate::audit::field),
        }
    }

    /// Whether an endpoint needs credentials, and whether its Origin and Host are checked.
    fn guards(&self, endpoint: Endpoint) -> (bool, bool) {
        match endpoint {
            Endpoint::Health | Endpoint::ResourceMetadata => (false, false),
            Endpoint::Metrics => (self.metrics_auth, self.metrics_auth),
            Endpoint::Preflight => (false, true),
            Endpoint::Stream
            | Endpoint::Messages
            | Endpoint::McpPost
            | Endpoint::McpGet
            | Endpoint::McpDelete => (true, true),
        }
    }

    /// Where the challenge of a 403 `insufficient_scope` on this endpoint points.
    fn metadata_url(&self, endpoint: Endpoint, host: Option<&str>) -> Option<String> {
        let streamable = matches!(
            endpoint,
            Endpoint::McpPost | Endpoint::McpGet | Endpoint::McpDelete
        );
        self.oauth
            .as_ref()
            .map(|oauth| oauth.metadata_url(host, streamable))
    }

    fn identify(
        &self,
        authorization: Option<&[u8]>,
        now: u64,
    ) -> Result<(Principal, crate::principal::Credential), Rejection> {
        self.auth
            .identify(authorization, now)
            .map_err(|failure| match failure {
                AuthFailure::KeysUnavailable => Rejection::KeysUnavailable,
                failure => Rejection::Unauthorized(failure),
            })
    }

    fn admit_inner(&self, head: &RequestHead<'_>, now: u64) -> Result<Admitted, Rejection> {
        let (path, query) = head.path_and_query();
        if self
            .oauth
            .as_ref()
            .is_some_and(|oauth| oauth.is_metadata_path(path))
        {
            return match head.method {
                "GET" | "HEAD" => Ok(Admitted::new(
                    Endpoint::ResourceMetadata,
                    Principal::anonymous(),
                    "",
                )),
                _ => Err(Rejection::MethodNotAllowed { allow: "GET" }),
            };
        }
        let path = path
            .strip_prefix(self.base_path.trim_end_matches('/'))
            .filter(|rest| rest.starts_with('/'))
            .ok_or(Rejection::NotFound)?;
        let endpoint = Endpoint::route(head.method, path)?;
        let (authenticated, checked) = self.guards(endpoint);
        if authenticated && query.is_some_and(has_access_token) {
            return Err(Rejection::Unauthorized(AuthFailure::TokenInQuery));
        }
        let (principal, credential) = if authenticated {
            self.identify(head.authorization, now)?
        } else {
            (Principal::anonymous(), Default::default())
        };
        let grant = Grant {
            scopes: credential.scopes,
            claims: credential.claims,
            metadata_url: self.metadata_url(endpoint, head.host),
        };
        if checked {
            let [host, also] = head.hosts();
            self.origins.check(head.origin, host)?;
            if also.is_some() {
                self.origins.check(None, also)?;
            }
        }
        let messages = endpoint == Endpoint::Messages;
        let session = messages.then(|| session_param(query).to_owned());
        let session = session.unwrap_or_default();
        let mcp = match endpoint {
            Endpoint::McpPost | Endpoint::McpGet | Endpoint::McpDelete => McpHeaders::of(head),
            _ => McpHeaders::default(),
        };
        Ok(Admitted {
            endpoint,
            principal,
            session,
            mcp,
            cors: head.origin.filter(|_| checked).map(str::to_owned),
            grant,
            source: std::sync::Arc::new(self.source(head)),
            trace: self.tracing.then(|| Box::new(trace_headers(head))),
        })
    }
}

/// A request's valid trace headers (ids come later: [`Request::seed_trace`]).
fn trace_headers(head: &RequestHead<'_>) -> crate::trace::TraceHeaders {
    crate::trace::TraceHeaders {
        parent: head.traceparent.and_then(crate::trace::SpanContext::parse),
        tracestate: (head.tracestate)
            .and_then(crate::trace::valid_tracestate)
            .map(str::to_owned),
        entropy: [0; 32],
    }
}

/// Whether a query string carries an `access_token` (refused: tokens never go in URLs,
/// where logs and proxies keep them).
fn has_access_token(query: &str) -> bool {
    query
        .split('&')
        .any(|pair| pair.split('=').next() == Some("access_token"))
}

/// Adds the CORS headers of an answer to an allowed browser `origin`.
pub(crate) fn add_cors(response: &mut Response, origin: &str) {
    response.headers.extend([
        ("access-control-allow-origin", Cow::Owned(origin.to_owned())),
        ("vary", Cow::Borrowed("Origin")),
        (
            "access-control-expose-headers",
            Cow::Borrowed("Mcp-Session-Id"),
        ),
    ]);
}

/// The answer to a CORS preflight from an allowed origin (or to a plain `OPTIONS`).
pub fn preflight(origin: Option<&str>) -> Response {
    let mut response = Response {
        status: 204,
        headers: vec![("allow", Cow::Borrowed("GET, POST, DELETE, OPTIONS"))],
        body: Cow::Borrowed(&[]),
    };
    if let Some(origin) = origin {
        add_cors(&mut response, origin);
        response.headers.extend([
            (
                "access-control-allow-methods",
                Cow::Borrowed("GET, POST, DELETE, OPTIONS"),
            ),
            (
                "access-control-allow-headers",
                Cow::Borrowed(
                    "Authorization, Content-Type, Accept, Mcp-Session-Id, MCP-Protocol-Version, Last-Event-ID",
                ),
            ),
            ("access-control-max-age", Cow::Borrowed("600")),
        ]);
    }
    response
}

/// What the router is given when `session_id` and `sessionId` disagree: text no session id
/// can equal, so the answer is the same 404 as for any unknown session.
const CONFLICTING_SESSION_IDS: &str = "conflicting session_id and sessionId";

/// The session a POST names: `session_id`, or `sessionId` (the TypeScript SDK's name).
/// Both present and different, or a value needing percent-decoding, names no session (404).
/// Empty when neither is present (400).
pub(crate) fn session_param(query: Option<&str>) -> &str {
    let mut found: Option<&str> = None;
    for pair in query.unwrap_or_default().split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == "session_id" || key == "sessionId" {
            match found {
                Some(prev) if prev != value => return CONFLICTING_SESSION_IDS,
                _ => found = Some(value),
            }
        }
    }
    found.unwrap_or_default()
}

/// Origin and Host rules (DNS-rebinding and cross-site defence).
#[derive(Debug, Clone, Default)]
pub struct OriginPolicy {
    /// Extra allowed origins, exactly as browsers send them (`https://app.example`).
    pub allow_origins: Vec<String>,
    /// Extra allowed hosts (without port), or every host when bound off loopback and none
    /// were given.
    pub allow_hosts: Vec<String>,
    /// The listener is on a loopback address, so Host is checked by default.
    pub loopback_bind: bool,
}

impl OriginPolicy {
    /// Whether a browser `origin` may call: a loopback origin (any port) or one of
    /// `--allow-origin`.
    pub(crate) fn allows_origin(&self, origin: &str) -> bool {
        self.allow_origins.iter().any(|o| o == origin)
            || origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .is_some_and(|rest| is_loopback_host(strip_port(rest)))
    }

    /// Checks the `Origin` (when present) and then the `Host` header.
    pub fn check(&self, origin: Option<&str>, host: Option<&str>) -> Result<(), Rejection> {
        if origin.is_some_and(|origin| !self.allows_origin(origin)) {
            return Err(Rejection::OriginNotAllowed);
        }
        if self.loopback_bind || !self.allow_hosts.is_empty() {
            let host = strip_port(host.unwrap_or_default());
            let allowed = (self.loopback_bind && is_loopback_host(host))
                || self
                    .allow_hosts
                    .iter()
                    .any(|h| h.eq_ignore_ascii_case(host));
            if !allowed {
                return Err(Rejection::HostNotAllowed);
            }
        }
        Ok(())
    }
}

fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost") || host == "127.0.0.1" || host == "[::1]"
}

/// `host[:port]` or `[v6]:port` without the port.
fn strip_port(authority: &str) -> &str {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) => &authority[..=end],
            None => authority,
        };
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// Every way the proxy refuses a request, each with its own status and body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rejection {
    /// 401: no or bad credentials.
    Unauthorized(AuthFailure),
    /// 403: a browser Origin not allowed.
    OriginNotAllowed,
    /// 403: a Host not allowed (DNS rebinding).
    HostNotAllowed,
    /// 400: no `session_id`.
    MissingSessionId,
    /// 404: unknown, closed or someone else's session (one answer for all three).
    SessionNotFound,
    /// 413: over `--max-body`.
    BodyTooLarge,
    /// 400: not one valid JSON-RPC request or notification.
    Invalid(Invalid),
    /// 503: the backend is down or restarting.
    BackendDown,
    /// 503: the backend's stdin stayed full.
    BackendBusy,
    /// 503: `--max-sessions` are live.
    TooManySessions,
    /// 404: no such path.
    NotFound,
    /// 415: a `/mcp` POST whose body is not declared `application/json`.
    UnsupportedMediaType,
    /// 406: an `Accept` that admits neither JSON nor an event stream (or no event stream,
    /// for a GET).
    NotAcceptable,
    /// 400: an `MCP-Protocol-Version` this proxy does not speak.
    BadProtocolVersion,
    /// 400: a `/mcp` request without `Mcp-Session-Id` that is not an `initialize`.
    MissingMcpSession,
    /// 400: an `initialize` that names a session.
    InitializeWithSession,
    /// 400: a second `initialize` in a legacy session whose first one succeeded.
    AlreadyInitialized,
    /// 429: `--max-inflight` requests of this session are in flight.
    TooManyInFlight,
    /// 409: a request reused the id of one still in flight in its session.
    IdInFlight,
    /// 400: a `Last-Event-ID` that names no stream of this session.
    UnknownEventId,
    /// 403: the token lacks a scope the request needs (`--required-scope`).
    InsufficientScope,
    /// 503: no signing keys could be fetched yet (the token is not at fault).
    KeysUnavailable,
    /// 429: past `--rate-limit` or `--tool-rate-limit` (the hub adds `Retry-After`).
    RateLimited,
    /// 403: a notification the policy denies (a request gets -32003 under its id).
    ForbiddenByPolicy,
    /// 429: the principal holds `--max-sessions-per-principal` sessions.
    PrincipalSessions,
    /// 503: the shell could not start what would serve the connection (a thread); its
    /// request was not read, so the connection is closed.
    Overloaded,
    /// 405: the path exists for another method.
    MethodNotAllowed {
        /// The method it takes.
        allow: &'static str,
    },
}

/// An HTTP request the gate admitted ([`Gate::admit`]), with its body and fresh
/// randomness for a session it may create: the hub's input.
#[derive(Debug, Clone)]
pub struct Request {
    /// What it asks for.
    pub endpoint: Endpoint,
    /// Who asks.
    pub principal: Principal,
    /// The session `session_id` names, as sent (empty when none), for `/messages`.
    pub session: String,
    /// The Streamable HTTP headers, for `/mcp`.
    pub mcp: McpHeaders,
    /// The browser origin to answer with CORS headers, when present and allowed.
    pub cors: Option<String>,
    /// What the caller's credential grants.
    pub grant: Grant,
    /// Where it came from, for audit records.
    pub source: std::sync::Arc<crate::audit::Source>,
    /// The body: a POST's message admitted before the hand-off.
    pub body: Body,
    /// 16 random bytes from the OS, for the id of a session this request may create.
    pub entropy: [u8; 16],
    /// Its trace headers and the random bytes of its span ids, when spans are made.
    pub trace: Option<Box<crate::trace::TraceHeaders>>,
}

impl Request {
    /// Gives the request the 32 random bytes of its span ids (`entropy` from the OS), only
    /// when it will have spans: tracing is on and its body is a JSON-RPC request.
    pub fn seed_trace(&mut self, entropy: impl FnOnce() -> [u8; 32]) {
        let request = matches!(&self.body, Body::Message(m) if m.id.is_some());
        if let (Some(trace), true) = (&mut self.trace, request) {
            trace.entropy = entropy();
        }
    }
}

/// A request body as the shell read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// The whole body (empty for none).
    Bytes(Vec<u8>),
    /// Longer than `--max-body`; the rest was not read.
    TooLarge,
}

/// A request's body as the hub takes it: a POST's JSON-RPC message already admitted.
#[derive(Debug, Clone)]
pub enum Body {
    /// One JSON-RPC request or notification, admitted.
    Message(Box<Checked>),
    /// What admission refused it for (400).
    Invalid(Invalid),
    /// Longer than `--max-body`; the rest was not read (413).
    TooLarge,
    /// Not read as a message: the endpoint takes none.
    Ignored,
}

impl Body {
    /// The body of a request for `endpoint`: admitted when it is a POST of a message.
    fn admit(endpoint: Endpoint, payload: Payload) -> Body {
        match (endpoint, payload) {
            (Endpoint::Messages | Endpoint::McpPost, Payload::Bytes(bytes)) => {
                match Checked::admit(bytes) {
                    Ok(message) => Body::Message(Box::new(message)),
                    Err(invalid) => Body::Invalid(invalid),
                }
            }
            (_, Payload::TooLarge) => Body::TooLarge,
            (_, Payload::Bytes(_)) => Body::Ignored,
        }
    }

    /// Makes a `/mcp` message a modern request when SPEC section 13 says it is one (its
    /// reserved `_meta` keys removed here, off the owner loop); true when it is.
    fn modernize(self, headers: &McpHeaders) -> (Body, bool) {
        let version = headers.protocol_version.as_deref();
        let session = headers.session.is_some();
        match self {
            Body::Message(msg) if is_modern(version, session, msg.meta_version) => {
                (Body::Message(Box::new(msg.into_modern())), true)
            }
            body => (body, is_modern(version, session, false)),
        }
    }

    /// The message, or why there is none (413 or 400), in SPEC section 1's terms.
    pub(crate) fn message(self) -> Result<Checked, Rejection> {
        match self {
            Body::Message(message) => Ok(*message),
            Body::Invalid(invalid) => Err(Rejection::Invalid(invalid)),
            Body::TooLarge => Err(Rejection::BodyTooLarge),
            Body::Ignored => Err(Rejection::Invalid(Invalid::NotJson)),
        }
    }
}

/// An answer ready for the wire: the shell copies status, headers and body as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// Header names (lowercase) and values; most values are constants, borrowed.
    pub headers: Vec<(&'static str, Cow<'static, str>)>,
    /// The body (empty for a stream head); constant bodies are borrowed.
    pub body: Cow<'static, [u8]>,
}

impl Response {
    /// `status` with a body of `content_type`.
    pub fn text(
        status: u16,
        content_type: &'static str,
        body: impl Into<Cow<'static, [u8]>>,
    ) -> Response {
        // Room for what an answer gains on its way (a session's id, cache and CORS fields).
        let mut headers = Vec::with_capacity(4);
        headers.push(("content-type", Cow::Borrowed(content_type)));
        Response {
            status,
            headers,
            body: body.into(),
        }
    }

    /// `status` with a JSON body.
    pub fn json(status: u16, body: impl Into<Cow<'static, [u8]>>) -> Response {
        Response::text(status, "application/json", body)
    }

    /// The value of header `name` (lowercase), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_ref())
    }
}

/// `202 Accepted` for a POSTed message that was queued (or answered) by the proxy.
pub fn accepted() -> Response {
    Response::text(202, "text/plain", ACCEPTED_BODY)
}

/// The head of every SSE stream: `200 text/event-stream`, not cached, not buffered by
/// proxies in front (`X-Accel-Buffering: no` for nginx).
pub(crate) fn sse_head() -> Response {
    Response {
        status: 200,
        headers: vec![
            ("content-type", Cow::Borrowed("text/event-stream")),
            ("cache-control", Cow::Borrowed("no-cache")),
            ("x-accel-buffering", Cow::Borrowed("no")),
        ],
        body: Cow::Borrowed(&[]),
    }
}

impl Rejection {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            Rejection::Unauthorized(_) => 401,
            Rejection::OriginNotAllowed | Rejection::HostNotAllowed => 403,
            Rejection::MissingSessionId
            | Rejection::Invalid(_)
            | Rejection::BadProtocolVersion
            | Rejection::MissingMcpSession
            | Rejection::InitializeWithSession
            | Rejection::AlreadyInitialized => 400,
            Rejection::UnsupportedMediaType => 415,
            Rejection::NotAcceptable => 406,
            Rejection::TooManyInFlight => 429,
            Rejection::IdInFlight => 409,
            Rejection::UnknownEventId => 400,
            Rejection::InsufficientScope | Rejection::ForbiddenByPolicy => 403,
            Rejection::RateLimited | Rejection::PrincipalSessions => 429,
            Rejection::SessionNotFound | Rejection::NotFound => 404,
            Rejection::MethodNotAllowed { .. } => 405,
            Rejection::BodyTooLarge => 413,
            Rejection::BackendDown
            | Rejection::BackendBusy
            | Rejection::TooManySessions
            | Rejection::Overloaded
            | Rejection::KeysUnavailable => 503,
        }
    }

    /// Stable snake_case name, used as a metrics label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Rejection::Unauthorized(_) => "unauthorized",
            Rejection::OriginNotAllowed => "origin_not_allowed",
            Rejection::HostNotAllowed => "host_not_allowed",
            Rejection::MissingSessionId => "missing_session_id",
            Rejection::SessionNotFound => "session_not_found",
            Rejection::BodyTooLarge => "body_too_large",
            Rejection::Invalid(invalid) => invalid.as_str(),
            Rejection::BackendDown => "backend_down",
            Rejection::BackendBusy => "backend_busy",
            Rejection::TooManySessions => "too_many_sessions",
            Rejection::Overloaded => "overloaded",
            Rejection::NotFound => "not_found",
            Rejection::MethodNotAllowed { .. } => "method_not_allowed",
            Rejection::UnsupportedMediaType => "unsupported_media_type",
            Rejection::NotAcceptable => "not_acceptable",
            Rejection::BadProtocolVersion => "bad_protocol_version",
            Rejection::MissingMcpSession => "missing_mcp_session",
            Rejection::InitializeWithSession => "initialize_with_session",
            Rejection::AlreadyInitialized => "already_initialized",
            Rejection::TooManyInFlight => "too_many_in_flight",
            Rejection::IdInFlight => "id_in_flight",
            Rejection::UnknownEventId => "unknown_event_id",
            Rejection::InsufficientScope => "insufficient_scope",
            Rejection::KeysUnavailable => "keys_unavailable",
            Rejection::RateLimited => "rate_limited",
            Rejection::ForbiddenByPolicy => "forbidden_by_policy",
            Rejection::PrincipalSessions => "principal_sessions",
        }
    }

    fn code_and_message(&self) -> (i32, &'static str) {
        match self {
            Rejection::Unauthorized(failure) => (-32001, failure.reason()),
            Rejection::OriginNotAllowed => (-32600, "Origin not allowed"),
            Rejection::HostNotAllowed => (-32600, "Host not allowed"),
            Rejection::MissingSessionId => (-32600, "Missing session_id query parameter"),
            Rejection::SessionNotFound => (-32001, "Session not found"),
            Rejection::BodyTooLarge => (-32600, "Request body too large"),
            Rejection::Invalid(invalid) => (invalid.code(), invalid.reason()),
            Rejection::BackendDown => (-32002, "Backend unavailable, retry later"),
            Rejection::BackendBusy => (-32002, "Backend busy, retry later"),
            Rejection::TooManySessions => (-32002, "Too many sessions, retry later"),
            Rejection::Overloaded => (-32002, "Server overloaded, retry later"),
            Rejection::NotFound => (-32601, "Not found"),
            Rejection::MethodNotAllowed { .. } => (-32601, "Method not allowed"),
            Rejection::UnsupportedMediaType => {
                (-32600, "Unsupported Media Type: Content-Type must be application/json")
            }
            Rejection::NotAcceptable => (
                -32600,
                "Not Acceptable: Accept must admit application/json or text/event-stream",
            ),
            Rejection::BadProtocolVersion => (
                -32600,
                "Bad Request: unsupported MCP-Protocol-Version (2024-11-05, 2025-03-26, 2025-06-18 and 2025-11-25 are spoken)",
            ),
            Rejection::MissingMcpSession => (
                -32600,
                "Bad Request: no Mcp-Session-Id header; start a session with initialize",
            ),
            Rejection::InitializeWithSession => (
                -32600,
                "Bad Request: initialize starts a session and must not name one",
            ),
            Rejection::AlreadyInitialized => {
                (-32600, "Bad Request: this session is already initialized")
            }
            Rejection::TooManyInFlight => (-32600, "Too many requests in flight for this session"),
            Rejection::IdInFlight => (-32600, "Request id already in flight in this session"),
            Rejection::UnknownEventId => (
                -32600,
                "Bad Request: Last-Event-ID names no stream of this session",
            ),
            Rejection::InsufficientScope => (-32001, "Forbidden: insufficient scope"),
            Rejection::KeysUnavailable => (-32002, "Signing keys not available yet, retry later"),
            Rejection::RateLimited => (-32029, "rate limit exceeded"),
            Rejection::ForbiddenByPolicy => (-32003, "forbidden by policy"),
            Rejection::PrincipalSessions => {
                (-32029, "Too many sessions for this principal, retry later")
            }
        }
    }

    /// Status, headers and a JSON-RPC error body (no id: none can be attributed).
    pub fn response(&self) -> Response {
        let mut headers = vec![("content-type", Cow::Borrowed("application/json"))];
        match self {
            Rejection::Unauthorized(AuthFailure::Missing) => {
                headers.push(("www-authenticate", Cow::Borrowed("Bearer")))
            }
            Rejection::Unauthorized(failure) => headers.push((
                "www-authenticate",
                Cow::Owned(format!(
                    "Bearer error=\"invalid_token\", error_description=\"{}\"",
                    failure.reason()
                )),
            )),
            Rejection::MethodNotAllowed { allow } => headers.push(("allow", Cow::Borrowed(allow))),
            Rejection::BackendDown
            | Rejection::BackendBusy
            | Rejection::TooManySessions
            | Rejection::TooManyInFlight
            | Rejection::KeysUnavailable
            | Rejection::PrincipalSessions => headers.push(("retry-after", Cow::Borrowed("1"))),
            // The rest of the body was not read: the connection cannot be reused.
            Rejection::BodyTooLarge => headers.push(("connection", Cow::Borrowed("close"))),
            // Nothing was read: the connection cannot be reused either.
            Rejection::Overloaded => headers.extend([
                ("retry-after", Cow::Borrowed("1")),
                ("connection", Cow::Borrowed("close")),
            ]),
            _ => {}
        }
        let (code, message) = self.code_and_message();
        let body = format!(
            r#"{{"jsonrpc":"2.0","error":{{"code":{code},"message":{}}}}}"#,
            serde_json::Value::from(message)
        );
        Response {
            status: self.status(),
            headers,
            body: Cow::Owned(body.into_bytes()),
        }
    }
}

impl Rejection {
    /// [`Rejection::response`] with its JSON-RPC error under the request's id (`raw_id`,
    /// as the client wrote it).
    pub(crate) fn response_to(&self, raw_id: &str) -> Response {
        let mut response = self.response();
        let (code, message) = self.code_and_message();
        response.body = Cow::Owned(error_message(raw_id, code, message));
        response
    }
}

/// `{"jsonrpc":"2.0","id":<id>,"error":{"code":<code>,"message":<message>}}`.
pub(crate) fn error_message(raw_id: &str, code: i32, text: &str) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":{raw_id},"error":{{"code":{code},"message":{}}}}}"#,
        serde_json::Value::from(text)
    )
    .into_bytes()
}

/// The body of `202 Accepted`.
pub(crate) const ACCEPTED_BODY: &[u8] = b"Accepted";

/// The answer to `GET /.well-known/oauth-protected-resource`: the protected resource
/// metadata (RFC 9728), readable from any origin; 404 when the proxy is no resource server
/// (not a refusal: no such resource is served).
pub(crate) fn metadata_response(oauth: Option<&crate::oauth::ResourceServer>) -> Response {
    let Some(oauth) = oauth else {
        return Rejection::NotFound.response();
    };
    let mut response = Response::json(200, oauth.document().into_bytes());
    let any = std::borrow::Cow::Borrowed("*");
    response.headers.push(("access-control-allow-origin", any));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_version_field_names_no_version() {
        assert_eq!(single_field([].into_iter()), None);
        assert_eq!(single_field(["2026-07-28"].into_iter()), Some("2026-07-28"));
        let twice = ["2026-07-28", "2026-07-28"];
        assert_eq!(single_field(twice.into_iter()), Some(""));
    }

    #[test]
    fn routes_and_refuses() {
        assert_eq!(Endpoint::route("GET", "/sse"), Ok(Endpoint::Stream));
        assert_eq!(
            Endpoint::route("POST", "/sse"),
            Err(Rejection::MethodNotAllowed {
                allow: "GET, OPTIONS"
            })
        );
        assert_eq!(Endpoint::route("GET", "/nope"), Err(Rejection::NotFound));
    }

    #[test]
    fn oauth_metadata_challenges_and_query_tokens() {
        let oauth = crate::oauth::ResourceServer {
            resource: "http://127.0.0.1:8000/".into(),
            issuers: vec!["http://127.0.0.1:9000".into()],
            scopes: vec!["mcp".into()],
            required: vec!["mcp".into()],
            tool_scopes: Vec::new(),
            name: "Switchboard".into(),
            public_url: None,
            listen_origin: "http://127.0.0.1:8000".into(),
            base_path: String::new(),
        };
        let table = crate::auth::TokenTable::parse("alice aaaaaaaaaaaaaaaaaaaa").unwrap();
        let gate = Gate {
            auth: Auth::Tokens(table),
            origins: OriginPolicy {
                loopback_bind: true,
                ..Default::default()
            },
            base_path: String::new(),
            metrics_auth: false,
            oauth: Some(std::sync::Arc::new(oauth)),
            trusted_proxies: Vec::new(),
            tracing: false,
        };
        let head = |method, target| RequestHead {
            method,
            target,
            host: Some("127.0.0.1:8000"),
            ..RequestHead::default()
        };
        let doc = gate.admit(&head("GET", "/.well-known/oauth-protected-resource/mcp"), 0);
        assert_eq!(doc.unwrap().endpoint, Endpoint::ResourceMetadata);
        let refused = gate.admit(&head("POST", "/mcp"), 0).unwrap_err();
        assert_eq!(
            refused.response.header("www-authenticate"),
            Some(
                r#"Bearer resource_metadata="http://127.0.0.1:8000/.well-known/oauth-protected-resource/mcp", scope="mcp""#
            )
        );
        let sse = gate.admit(&head("GET", "/sse"), 0).unwrap_err();
        assert!(sse
            .response
            .header("www-authenticate")
            .unwrap()
            .contains("resource/sse\""));
        let query = RequestHead {
            authorization: Some(b"Bearer aaaaaaaaaaaaaaaaaaaa"),
            ..head("GET", "/sse?access_token=aaaaaaaaaaaaaaaaaaaa")
        };
        let refused = gate.admit(&query, 0).unwrap_err();
        assert_eq!(
            refused.rejection,
            Rejection::Unauthorized(AuthFailure::TokenInQuery)
        );
    }

    /// A gate with no auth that allows loopback hosts only.
    fn loopback_gate() -> Gate {
        Gate {
            auth: Auth::None,
            origins: OriginPolicy {
                loopback_bind: true,
                ..Default::default()
            },
            base_path: String::new(),
            metrics_auth: false,
            oauth: None,
            trusted_proxies: Vec::new(),
            tracing: false,
        }
    }

    #[test]
    fn host_falls_back_to_the_target_authority() {
        let gate = loopback_gate();
        let head = |target, authority, host| RequestHead {
            method: "GET",
            target,
            authority,
            host,
            ..Default::default()
        };
        let admit = |h: RequestHead<'_>| {
            gate.admit(&h, 0)
                .map(|a| a.endpoint)
                .map_err(|r| r.rejection)
        };
        let (ok, host_refused) = (Ok(Endpoint::Stream), Err(Rejection::HostNotAllowed));
        // (target, authority the HTTP library split off, Host header, answer): without a
        // Host header the authority or the absolute target's; with both, both are checked.
        let cases = [
            ("/sse", None, Some("localhost:1"), ok),
            ("/sse", Some("127.0.0.1:9"), None, ok),
            ("http://[::1]:9/sse", None, None, ok),
            ("http://evil.example/sse", None, None, host_refused),
            ("/sse", Some("evil.example"), None, host_refused),
            (
                "http://localhost/sse",
                None,
                Some("evil.example"),
                host_refused,
            ),
            (
                "http://evil.example/sse",
                None,
                Some("127.0.0.1"),
                host_refused,
            ),
            (
                "/sse",
                Some("evil.example"),
                Some("127.0.0.1"),
                host_refused,
            ),
            ("http://localhost", None, None, Err(Rejection::NotFound)),
        ];
        for (target, authority, host, answer) in cases {
            let got = admit(head(target, authority, host));
            assert_eq!(got, answer, "{target} {authority:?} {host:?}");
        }
    }

    #[test]
    fn an_absolute_target_names_the_session_in_its_query() {
        let gate = loopback_gate();
        let messages = gate
            .admit(
                &RequestHead {
                    method: "POST",
                    target: "http://localhost:1/messages?session_id=abc",
                    ..Default::default()
                },
                0,
            )
            .expect("admitted");
        assert_eq!(messages.session, "abc");
    }

    #[test]
    fn session_param_rules() {
        assert_eq!(session_param(Some("session_id=a")), "a");
        assert_eq!(session_param(Some("x=1&sessionId=b")), "b");
        assert_eq!(session_param(Some("session_id=a&sessionId=a")), "a");
        assert_ne!(session_param(Some("session_id=a&sessionId=b")), "a");
        assert_eq!(session_param(None), "");
        assert_eq!(session_param(Some("session_id=")), "");
    }

    #[test]
    fn origin_and_host() {
        let p = OriginPolicy {
            loopback_bind: true,
            allow_origins: vec!["https://app.example".into()],
            ..Default::default()
        };
        assert_eq!(p.check(None, Some("127.0.0.1:8080")), Ok(()));
        assert_eq!(
            p.check(Some("http://localhost:3000"), Some("localhost")),
            Ok(())
        );
        assert_eq!(
            p.check(Some("https://app.example"), Some("[::1]:1")),
            Ok(())
        );
        assert_eq!(
            p.check(Some("http://evil.example"), Some("localhost")),
            Err(Rejection::OriginNotAllowed)
        );
        assert_eq!(
            p.check(None, Some("evil.example")),
            Err(Rejection::HostNotAllowed)
        );
        assert_eq!(
            p.check(Some("http://localhost.evil:1"), None),
            Err(Rejection::OriginNotAllowed)
        );
        let open = OriginPolicy::default();
        assert_eq!(open.check(None, Some("anything")), Ok(()));
    }

    #[test]
    fn statuses() {
        let r = Rejection::Unauthorized(AuthFailure::Missing).response();
        assert_eq!(r.status, 401);
        assert!(r.headers.contains(&("www-authenticate", "Bearer".into())));
        let r = Rejection::SessionNotFound.response();
        assert_eq!(
            &r.body[..],
            &br#"{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"}}"#[..]
        );
    }
}
