//! The HTTP surface as data: which endpoint a request names, the Origin and Host checks,
//! and every refusal as (status, headers, body). Shells only copy these onto the wire.

use std::borrow::Cow;

use crate::auth::{Auth, AuthFailure, Principal};
use crate::hub::{Payload, Request};
use crate::message::Invalid;

/// What a request asks for, from its method and path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET /sse`: open a session stream.
    Stream,
    /// `POST /messages`: one JSON-RPC message for a session.
    Messages,
    /// `GET /health`.
    Health,
    /// `GET /metrics`.
    Metrics,
}

impl Endpoint {
    /// Routes `method` and `path` (without query, `--base-path` already removed).
    pub fn route(method: &str, path: &str) -> Result<Endpoint, Rejection> {
        let (endpoint, allow) = match path {
            "/sse" => (Endpoint::Stream, "GET"),
            "/messages" | "/messages/" => (Endpoint::Messages, "POST"),
            "/health" => (Endpoint::Health, "GET"),
            "/metrics" => (Endpoint::Metrics, "GET"),
            _ => return Err(Rejection::NotFound),
        };
        if method == allow {
            Ok(endpoint)
        } else {
            Err(Rejection::MethodNotAllowed { allow })
        }
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

    /// The host the client named: the `Host` header, else the target's authority (a
    /// request in absolute form may carry it there alone).
    fn host(&self) -> Option<&'a str> {
        self.host.or(self.authority).or_else(|| {
            let rest = self
                .target
                .strip_prefix("http://")
                .or_else(|| self.target.strip_prefix("https://"))?;
            Some(rest.split(['/', '?']).next().unwrap_or(rest))
        })
    }
}

/// Who may reach which endpoint: routing under `--base-path`, then auth, Origin and Host
/// in the order of SPEC section 1. `/health` is open; `/metrics` too unless
/// `--metrics-auth`.
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
}

impl Admitted {
    /// The hub's input for this request with the body the shell read; `entropy` (16
    /// random bytes from the OS) is called only for a request that may create a session.
    pub fn into_request(self, body: Payload, entropy: impl FnOnce() -> [u8; 16]) -> Request {
        let entropy = match self.endpoint {
            Endpoint::Stream => entropy(),
            Endpoint::Messages | Endpoint::Health | Endpoint::Metrics => [0; 16],
        };
        Request {
            endpoint: self.endpoint,
            principal: self.principal,
            session: self.session,
            body,
            entropy,
        }
    }
}

impl Gate {
    /// What the request asks for and who asks, or the refusal to send at once. `now` is
    /// seconds since the Unix epoch (token expiry).
    pub fn admit(&self, head: &RequestHead<'_>, now: u64) -> Result<Admitted, Rejection> {
        let (path, query) = head.path_and_query();
        let path = path
            .strip_prefix(self.base_path.trim_end_matches('/'))
            .filter(|rest| rest.starts_with('/'))
            .ok_or(Rejection::NotFound)?;
        let endpoint = Endpoint::route(head.method, path)?;
        let checked = match endpoint {
            Endpoint::Health => false,
            Endpoint::Metrics => self.metrics_auth,
            Endpoint::Stream | Endpoint::Messages => true,
        };
        let principal = if checked {
            let principal = self
                .auth
                .authenticate(head.authorization, now)
                .map_err(Rejection::Unauthorized)?;
            self.origins.check(head.origin, head.host())?;
            principal
        } else {
            Principal::anonymous()
        };
        let session = match endpoint {
            Endpoint::Messages => session_param(query).to_owned(),
            _ => String::new(),
        };
        Ok(Admitted {
            endpoint,
            principal,
            session,
        })
    }
}

/// What the router is given when `session_id` and `sessionId` disagree: text no session id
/// can equal, so the answer is the same 404 as for any unknown session.
const CONFLICTING_SESSION_IDS: &str = "conflicting session_id and sessionId";

/// The session a POST names: `session_id`, or `sessionId` (the TypeScript SDK's name).
/// Both present and different, or a value needing percent-decoding, names no session (404).
/// Empty when neither is present (400).
pub fn session_param(query: Option<&str>) -> &str {
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
    /// Checks the `Origin` (when present) and then the `Host` header.
    pub fn check(&self, origin: Option<&str>, host: Option<&str>) -> Result<(), Rejection> {
        if let Some(origin) = origin {
            let allowed = self.allow_origins.iter().any(|o| o == origin)
                || origin
                    .strip_prefix("http://")
                    .or_else(|| origin.strip_prefix("https://"))
                    .is_some_and(|rest| is_loopback_host(strip_port(rest)));
            if !allowed {
                return Err(Rejection::OriginNotAllowed);
            }
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
    /// 405: the path exists for another method.
    MethodNotAllowed {
        /// The method it takes.
        allow: &'static str,
    },
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
        Response {
            status,
            headers: vec![("content-type", Cow::Borrowed(content_type))],
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
pub fn sse_head() -> Response {
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
            Rejection::MissingSessionId | Rejection::Invalid(_) => 400,
            Rejection::SessionNotFound | Rejection::NotFound => 404,
            Rejection::MethodNotAllowed { .. } => 405,
            Rejection::BodyTooLarge => 413,
            Rejection::BackendDown | Rejection::BackendBusy | Rejection::TooManySessions => 503,
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
            Rejection::NotFound => "not_found",
            Rejection::MethodNotAllowed { .. } => "method_not_allowed",
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
            Rejection::NotFound => (-32601, "Not found"),
            Rejection::MethodNotAllowed { .. } => (-32601, "Method not allowed"),
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
            Rejection::BackendDown | Rejection::BackendBusy | Rejection::TooManySessions => {
                headers.push(("retry-after", Cow::Borrowed("1")))
            }
            // The rest of the body was not read: the connection cannot be reused.
            Rejection::BodyTooLarge => headers.push(("connection", Cow::Borrowed("close"))),
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

/// The body of `202 Accepted`.
pub const ACCEPTED_BODY: &[u8] = b"Accepted";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_refuses() {
        assert_eq!(Endpoint::route("GET", "/sse"), Ok(Endpoint::Stream));
        assert_eq!(
            Endpoint::route("POST", "/sse"),
            Err(Rejection::MethodNotAllowed { allow: "GET" })
        );
        assert_eq!(Endpoint::route("GET", "/nope"), Err(Rejection::NotFound));
    }

    #[test]
    fn host_falls_back_to_the_target_authority() {
        let gate = Gate {
            auth: Auth::None,
            origins: OriginPolicy {
                loopback_bind: true,
                ..Default::default()
            },
            base_path: String::new(),
            metrics_auth: false,
        };
        let head = |target, authority, host| RequestHead {
            method: "GET",
            target,
            authority,
            host,
            ..Default::default()
        };
        let admit = |h: RequestHead<'_>| gate.admit(&h, 0).map(|a| a.endpoint);
        assert_eq!(
            admit(head("/sse", None, Some("localhost:1"))),
            Ok(Endpoint::Stream)
        );
        // No Host header: the authority the HTTP library split off, or the absolute target's.
        assert_eq!(
            admit(head("/sse", Some("127.0.0.1:9"), None)),
            Ok(Endpoint::Stream)
        );
        assert_eq!(
            admit(head("http://[::1]:9/sse", None, None)),
            Ok(Endpoint::Stream)
        );
        assert_eq!(
            admit(head("http://evil.example/sse", None, None)),
            Err(Rejection::HostNotAllowed)
        );
        assert_eq!(
            admit(head("/sse", Some("evil.example"), None)),
            Err(Rejection::HostNotAllowed)
        );
        // The Host header wins over the authority.
        assert_eq!(
            admit(head("http://localhost/sse", None, Some("evil.example"))),
            Err(Rejection::HostNotAllowed)
        );
        assert_eq!(
            admit(head("http://localhost", None, None)),
            Err(Rejection::NotFound)
        );
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
