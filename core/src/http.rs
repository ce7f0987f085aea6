//! The HTTP surface as data: which endpoint a request names, the Origin and Host checks,
//! and every refusal as (status, headers, body). Shells only copy these onto the wire.

use crate::auth::{Auth, AuthFailure, Principal};
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

/// The parts of a request head the gate looks at.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestHead<'a> {
    pub method: &'a str,
    /// Path without the query.
    pub path: &'a str,
    pub authorization: Option<&'a [u8]>,
    pub origin: Option<&'a str>,
    pub host: Option<&'a str>,
}

/// Who may reach which endpoint: routing under `--base-path`, then auth, Origin and Host
/// in the order of SPEC section 1. `/health` is open; `/metrics` too unless
/// `--metrics-auth`.
#[derive(Debug, Clone)]
pub struct Gate {
    pub auth: Auth,
    pub origins: OriginPolicy,
    pub base_path: String,
    pub metrics_auth: bool,
}

impl Gate {
    /// The endpoint and the caller's principal ([`Principal::anonymous`] where none is
    /// required), or the refusal to send. `now` is seconds since the Unix epoch.
    pub fn admit(
        &self,
        head: &RequestHead<'_>,
        now: u64,
    ) -> Result<(Endpoint, Principal), Rejection> {
        let path = head
            .path
            .strip_prefix(self.base_path.trim_end_matches('/'))
            .filter(|rest| rest.starts_with('/'))
            .ok_or(Rejection::NotFound)?;
        let endpoint = Endpoint::route(head.method, path)?;
        let checked = match endpoint {
            Endpoint::Health => false,
            Endpoint::Metrics => self.metrics_auth,
            Endpoint::Stream | Endpoint::Messages => true,
        };
        if !checked {
            return Ok((endpoint, Principal::anonymous()));
        }
        let principal = self
            .auth
            .authenticate(head.authorization, now)
            .map_err(Rejection::Unauthorized)?;
        self.origins.check(head.origin, head.host)?;
        Ok((endpoint, principal))
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
    Unauthorized(AuthFailure),
    OriginNotAllowed,
    HostNotAllowed,
    MissingSessionId,
    SessionNotFound,
    BodyTooLarge,
    Invalid(Invalid),
    BackendDown,
    BackendBusy,
    TooManySessions,
    NotFound,
    MethodNotAllowed { allow: &'static str },
}

/// A refusal ready for the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Rejection {
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
        let mut headers = vec![("content-type", "application/json".to_owned())];
        match self {
            Rejection::Unauthorized(AuthFailure::Missing) => {
                headers.push(("www-authenticate", "Bearer".to_owned()))
            }
            Rejection::Unauthorized(failure) => headers.push((
                "www-authenticate",
                format!(
                    "Bearer error=\"invalid_token\", error_description=\"{}\"",
                    failure.reason()
                ),
            )),
            Rejection::MethodNotAllowed { allow } => headers.push(("allow", (*allow).to_owned())),
            Rejection::BackendDown | Rejection::BackendBusy | Rejection::TooManySessions => {
                headers.push(("retry-after", "1".to_owned()))
            }
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
            body: body.into_bytes(),
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
            r.body,
            br#"{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"}}"#
        );
    }
}
