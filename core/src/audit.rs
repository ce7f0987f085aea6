//! SPEC section 11's audit records, in the shape of ToolHive's `AuditEvent` so that existing
//! log pipelines parse them. The hub emits an [`AuditRecord`] as an output when an outcome
//! is known; the shell adds what only it has (a random id, the wall-clock time) with
//! [`AuditRecord::to_json`] and writes the line through a bounded queue.

use std::net::IpAddr;
use std::sync::Arc;

use crate::principal::Principal;
use crate::routed_id::SessionId;

/// ToolHive's event type names, and Switchboard's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditType {
    /// `initialize`.
    Initialize,
    /// `tools/call`.
    ToolCall,
    /// `tools/list`.
    ToolsList,
    /// `resources/read` (and subscribing).
    ResourceRead,
    /// `resources/list`, `resources/templates/list`.
    ResourcesList,
    /// `prompts/get`.
    PromptGet,
    /// `prompts/list`.
    PromptsList,
    /// `ping`.
    Ping,
    /// `completion/complete`.
    Completion,
    /// `logging/setLevel`.
    Logging,
    /// Any other method.
    Request,
    /// A session opened.
    SessionOpen,
    /// A session closed.
    SessionClose,
    /// A credential was refused.
    AuthFailure,
    /// The backend process exited and is restarted.
    BackendRestart,
}

impl AuditType {
    /// The event type of a request for `method`.
    pub fn of_method(method: &str) -> AuditType {
        match method {
            "initialize" => AuditType::Initialize,
            "tools/call" => AuditType::ToolCall,
            "tools/list" => AuditType::ToolsList,
            "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
                AuditType::ResourceRead
            }
            "resources/list" | "resources/templates/list" => AuditType::ResourcesList,
            "prompts/get" => AuditType::PromptGet,
            "prompts/list" => AuditType::PromptsList,
            "ping" => AuditType::Ping,
            "completion/complete" => AuditType::Completion,
            "logging/setLevel" => AuditType::Logging,
            _ => AuditType::Request,
        }
    }

    /// Its name in the `type` field.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditType::Initialize => "mcp_initialize",
            AuditType::ToolCall => "mcp_tool_call",
            AuditType::ToolsList => "mcp_tools_list",
            AuditType::ResourceRead => "mcp_resource_read",
            AuditType::ResourcesList => "mcp_resources_list",
            AuditType::PromptGet => "mcp_prompt_get",
            AuditType::PromptsList => "mcp_prompts_list",
            AuditType::Ping => "mcp_ping",
            AuditType::Completion => "mcp_completion",
            AuditType::Logging => "mcp_logging",
            AuditType::Request => "mcp_request",
            AuditType::SessionOpen => "session_open",
            AuditType::SessionClose => "session_close",
            AuditType::AuthFailure => "auth_failure",
            AuditType::BackendRestart => "backend_restart",
        }
    }

    /// `target.type`: what the event is about.
    fn target_type(self) -> &'static str {
        match self {
            AuditType::ToolCall => "tool",
            AuditType::ResourceRead => "resource",
            AuditType::PromptGet => "prompt",
            AuditType::SessionOpen | AuditType::SessionClose => "session",
            _ => "endpoint",
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A result (`isError: true` included).
    Success,
    /// The backend answered a JSON-RPC error.
    Failure,
    /// Refused by auth, a scope, the policy or a rate limit.
    Denied,
    /// Timed out, backend down or restarted, cancelled, or refused for another reason.
    Error,
}

impl Outcome {
    /// The outcome of the backend's answer: a result succeeded, an error failed.
    pub(crate) fn of_failed(failed: bool) -> Outcome {
        match failed {
            true => Outcome::Failure,
            false => Outcome::Success,
        }
    }

    /// Its name in the `outcome` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
            Outcome::Denied => "denied",
            Outcome::Error => "error",
        }
    }

    /// A request refused with HTTP `status` before any JSON-RPC answer. 401, 403 and 429
    /// are `denied`: a decision about who may ask what, from where (credential, Origin,
    /// Host, scope, policy, rate limit). Every other refusal (400 for framing or admission,
    /// 404, 405, 406, 409, 413, 415, 503) is `error`: SPEC section 11 keeps `failure` for
    /// the backend's own JSON-RPC error and `denied` for those decisions, and a request
    /// that could not be served as sent ended in error, as one that timed out or met a
    /// backend that was down did.
    pub fn of_refusal(status: u16) -> Outcome {
        match status {
            200..=299 => Outcome::Success,
            401 | 403 | 429 => Outcome::Denied,
            _ => Outcome::Error,
        }
    }

    /// A backend's answer: a result succeeded, an error failed.
    pub(crate) fn of_answer(message: &[u8]) -> Outcome {
        match crate::message::parse_backend(std::str::from_utf8(message).unwrap_or("")) {
            Ok(m) if m.error.is_some() => Outcome::Failure,
            _ => Outcome::Success,
        }
    }
}

/// Where a request came from: the client's address (the peer's, or the rightmost untrusted
/// `X-Forwarded-For` address when the peer is a `--trusted-proxy`) and its `User-Agent`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Source {
    /// The client's address.
    pub ip: Option<IpAddr>,
    /// The client's port, when the address is the peer's own (SPEC section 14's
    /// `client.port`).
    pub port: Option<u16>,
    /// The `User-Agent` header.
    pub user_agent: Option<String>,
}

/// The transport a request came over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `/mcp`.
    Streamable,
    /// `/sse` and its message endpoint.
    Sse,
}

impl Transport {
    fn as_str(self) -> &'static str {
        match self {
            Transport::Streamable => "streamable-http",
            Transport::Sse => "sse",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Transport::Streamable => "/mcp",
            Transport::Sse => "/sse",
        }
    }
}

/// What a request the hub never saw asked for (one the gate or the HTTP/1.1 framing rules
/// refused in the shell): where it came from and which endpoint it named, for the event of
/// its refusal ([`Asked::new`] decides which event that is).
#[derive(Debug, Clone)]
pub struct Asked {
    /// Where it came from.
    pub source: Arc<Source>,
    /// The event its refusal is, unless a credential was refused (`auth_failure`):
    /// `session_open` for `GET /sse`, `session_close` for `DELETE /mcp`, else `mcp_request`
    /// (its message, if any, was not read).
    pub kind: AuditType,
    /// The transport whose endpoint it named; `None` for any other path.
    pub transport: Option<Transport>,
    /// The path asked for (no query: it may carry a token), cut to `MAX_FIELD` bytes,
    /// when it names neither transport's endpoint: the event's `target.endpoint` then,
    /// with `transport` null. `None` otherwise.
    pub path: Option<String>,
}

impl Asked {
    /// A request for `method` and `path` (without query, `--base-path` included) under
    /// `base_path`: `/sse`, `/messages` and `/messages/` are the legacy transport, `/mcp`
    /// and `/mcp/` Streamable HTTP; anything else names neither.
    pub fn new(source: Arc<Source>, method: &str, path: &str, base_path: &str) -> Asked {
        let rest = path
            .strip_prefix(base_path.trim_end_matches('/'))
            .filter(|rest| rest.starts_with('/'));
        let transport = match rest {
            Some("/sse" | "/messages" | "/messages/") => Some(Transport::Sse),
            Some("/mcp" | "/mcp/") => Some(Transport::Streamable),
            _ => None,
        };
        let kind = match (method, rest) {
            ("GET", Some("/sse")) => AuditType::SessionOpen,
            ("DELETE", Some("/mcp" | "/mcp/")) => AuditType::SessionClose,
            _ => AuditType::Request,
        };
        Asked {
            source,
            kind,
            transport,
            path: transport.is_none().then(|| field(path)),
        }
    }
}

/// A client's `clientInfo` from its session's `initialize`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
pub struct ClientInfo {
    /// `clientInfo.name`.
    pub name: Option<String>,
    /// `clientInfo.version`.
    pub version: Option<String>,
}

/// One audit event, as the hub knows it.
#[derive(Debug, Clone)]
pub struct AuditRecord {
    /// The event type.
    pub kind: AuditType,
    /// How it ended.
    pub outcome: Outcome,
    /// Over which transport (none for a backend restart, and for a refused request that
    /// named neither transport's endpoint).
    pub transport: Option<Transport>,
    /// The 2026-07-28 revision, for a request of that era (a 2025 request's version is its
    /// session's, not repeated).
    pub protocol_version: Option<&'static str>,
    /// The path a refused request asked for when it named neither transport's endpoint
    /// ([`Asked::path`]): `target.endpoint` when `transport` is `None`.
    pub path: Option<String>,
    /// From request to outcome.
    pub duration_ms: u64,
    /// The bytes of the JSON-RPC response message as sent.
    pub response_size: Option<usize>,
    /// Where it came from.
    pub source: Arc<Source>,
    /// The session.
    pub session: Option<SessionId>,
    /// The client's own request id, as JSON text.
    pub request_id: Option<String>,
    /// Who (none for a refused credential or a backend restart).
    pub user: Option<Principal>,
    /// The session's `clientInfo`.
    pub client: Option<Arc<ClientInfo>>,
    /// The tool or prompt name, or the resource uri.
    pub target_name: Option<String>,
    /// The backend's name of a tool called by another, shown, name (SPEC section 16):
    /// `metadata.extra.backend_tool`.
    pub backend_tool: Option<String>,
    /// The JSON-RPC method.
    pub method: Option<String>,
    /// `--base-path`, prefixed to the transport's path.
    pub base_path: Arc<str>,
    /// With `--audit-include-data`: the request and response messages, each cut to
    /// `--audit-max-data` bytes, and whether either was cut.
    pub data: Option<(String, String, bool)>,
    /// `--audit-max-data`.
    pub max_data: usize,
}

impl AuditRecord {
    /// About the bytes it holds while it waits for the writer (its own, its strings and
    /// messages; what it shares with other records is not counted), for a queue's byte
    /// budget.
    pub fn held_bytes(&self) -> usize {
        let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        let data = self.data.as_ref().map_or(0, |(a, b, _)| a.len() + b.len());
        std::mem::size_of::<AuditRecord>()
            + text(&self.request_id)
            + text(&self.target_name)
            + text(&self.method)
            + text(&self.source.user_agent)
            + data
    }

    /// The event as one line of JSON (no newline), with the shell's `audit_id` (a UUID v4),
    /// `logged_at` (RFC 3339 UTC with milliseconds, see [`rfc3339_millis`]) and `component`.
    pub fn to_json(&self, audit_id: &str, logged_at: &str, component: &str) -> String {
        let mut out = String::with_capacity(640);
        self.write_json(&mut out, [audit_id, logged_at, component]);
        out
    }

    /// [`AuditRecord::to_json`] appended to `out`: written by hand, in ToolHive's order, so a
    /// busy audit log costs a few small copies per event.
    pub fn write_json(&self, out: &mut String, [audit_id, logged_at, component]: [&str; 3]) {
        use std::fmt::Write as _;
        out.push_str(r#"{"metadata":{"auditId":"#);
        json_str(out, Some(audit_id));
        let _ = write!(
            out,
            r#","extra":{{"duration_ms":{},"transport":"#,
            self.duration_ms
        );
        json_str(out, self.transport.map(Transport::as_str));
        if let Some(version) = self.protocol_version {
            out.push_str(r#","protocol_version":"#);
            json_str(out, Some(version));
        }
        if let Some(tool) = &self.backend_tool {
            out.push_str(r#","backend_tool":"#);
            json_str(out, Some(tool));
        }
        out.push_str(r#","response_size_bytes":"#);
        match self.response_size {
            Some(n) => {
                let _ = write!(out, "{n}");
            }
            None => out.push_str("null"),
        }
        out.push_str(r#"}},"type":"#);
        json_str(out, Some(self.kind.as_str()));
        out.push_str(r#","loggedAt":"#);
        json_str(out, Some(logged_at));
        out.push_str(r#","outcome":"#);
        json_str(out, Some(self.outcome.as_str()));
        self.write_source(out);
        self.write_subjects(out);
        out.push_str(r#","component":"#);
        json_str(out, Some(component));
        self.write_target(out);
        if let Some((request, response, truncated)) = &self.data {
            out.push_str(r#","data":{"request":"#);
            json_str(out, Some(request));
            out.push_str(r#","response":"#);
            json_str(out, Some(response));
            if *truncated {
                out.push_str(r#","truncated":true"#);
            }
            out.push('}');
        }
        out.push('}');
    }

    /// `"source":{...}`: where the request came from.
    fn write_source(&self, out: &mut String) {
        use std::fmt::Write as _;
        out.push_str(r#","source":{"type":"network","value":"#);
        match self.source.ip {
            Some(ip) => {
                let _ = write!(out, "\"{ip}\"");
            }
            None => out.push_str("null"),
        }
        out.push_str(r#","extra":{"user_agent":"#);
        json_str(out, self.source.user_agent.as_deref());
        out.push_str(r#","session_id":"#);
        json_str(out, self.session.as_ref().map(SessionId::as_str));
        out.push_str(r#","request_id":"#);
        json_id(out, self.request_id.as_deref());
        out.push_str("}}");
    }

    /// `"subjects":{...}`: who asked, with which client.
    fn write_subjects(&self, out: &mut String) {
        use std::fmt::Write as _;
        let user = self.user.as_ref();
        let client = self.client.as_deref();
        out.push_str(r#","subjects":{"user":"#);
        match user {
            // A principal's name holds no character JSON escapes (token file names are
            // whitespace-free words; a JWT principal is shown as `sub (issuer iss)`).
            Some(p)
                if !p
                    .as_str()
                    .bytes()
                    .any(|b| b < 0x20 || b == b'"' || b == b'\\') =>
            {
                let _ = write!(out, "\"{p}\"");
            }
            Some(p) => json_str(out, Some(&p.to_string())),
            None => out.push_str("null"),
        }
        out.push_str(r#","user_id":"#);
        json_str(out, user.map(Principal::user_id));
        out.push_str(r#","client_name":"#);
        json_str(out, client.and_then(|c| c.name.as_deref()));
        out.push_str(r#","client_version":"#);
        json_str(out, client.and_then(|c| c.version.as_deref()));
        out.push('}');
    }

    /// `"target":{...}`: what was asked of which endpoint.
    fn write_target(&self, out: &mut String) {
        out.push_str(r#","target":{"type":"#);
        json_str(out, Some(self.kind.target_type()));
        out.push_str(r#","name":"#);
        json_str(out, self.target_name.as_deref());
        out.push_str(r#","method":"#);
        json_str(out, self.method.as_deref());
        out.push_str(r#","endpoint":"#);
        match self.transport {
            Some(t) => {
                out.push('"');
                escape_into(out, &self.base_path);
                out.push_str(t.path());
                out.push('"');
            }
            None => json_str(out, self.path.as_deref()),
        }
        out.push('}');
    }
}

/// A JSON string (or `null`).
fn json_str(out: &mut String, text: Option<&str>) {
    match text {
        Some(text) => {
            out.push('"');
            escape_into(out, text);
            out.push('"');
        }
        None => out.push_str("null"),
    }
}

/// A client's id as it wrote it (JSON text already), unless it holds an escape that does not
/// make valid Unicode (a lone surrogate): then `null`, so that every line parses.
fn json_id(out: &mut String, raw: Option<&str>) {
    match raw {
        Some(raw) if !raw.contains('\\') => out.push_str(raw),
        Some(raw) if serde_json::from_str::<String>(raw).is_ok() => out.push_str(raw),
        _ => out.push_str("null"),
    }
}

/// `text` with JSON string escapes.
fn escape_into(out: &mut String, text: &str) {
    let plain = |b: u8| b >= 0x20 && b != b'"' && b != b'\\';
    if text.bytes().all(plain) {
        return out.push_str(text);
    }
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                use std::fmt::Write as _;
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// Free-text fields a client chooses (user agent, client name and version, method, target
/// name) are kept to at most this many bytes, so that a hostile client cannot make every
/// event of its session huge.
pub(crate) const MAX_FIELD: usize = 1024;

/// `text` cut to [`MAX_FIELD`] bytes on a UTF-8 boundary.
pub(crate) fn field(text: &str) -> String {
    cut(text, MAX_FIELD).0.to_owned()
}

/// `text` cut on a UTF-8 boundary to at most `max` bytes, and whether it was cut.
pub(crate) fn cut(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], true)
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC with milliseconds
/// (`2026-12-04T16:40:00.123Z`).
pub fn rfc3339_millis(unix_ms: u64) -> String {
    let (secs, ms) = (unix_ms / 1000, unix_ms % 1000);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil algorithm.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The client's address: the rightmost `X-Forwarded-For` address that is not itself a
/// trusted proxy, when the peer is one; otherwise the peer's. Several field lines are one
/// list (RFC 9110 section 5.3), so a proxy that adds its own line is read past too.
pub(crate) fn client_ip(
    peer: Option<IpAddr>,
    forwarded_for: &[&str],
    trusted: &[Cidr],
) -> Option<IpAddr> {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|c| c.contains(ip));
    let peer_ip = peer?;
    if !is_trusted(&peer_ip) {
        return Some(peer_ip);
    }
    let hops = forwarded_for.iter().rev().flat_map(|h| h.rsplit(','));
    for hop in hops {
        match hop.trim().parse::<IpAddr>() {
            Ok(ip) if is_trusted(&ip) => continue,
            Ok(ip) => return Some(ip),
            // A hop that is not an address: the chain cannot be trusted past it.
            Err(_) => return Some(peer_ip),
        }
    }
    Some(peer_ip)
}

/// An address block (`--trusted-proxy 10.0.0.0/8`, `::1/128`, or one address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Cidr, String> {
        let (addr, bits) = match text.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (text, None),
        };
        let net: IpAddr = addr
            .parse()
            .map_err(|_| format!("{text:?}: not an IP address or CIDR block"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            Some(b) => b
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| format!("{text:?}: the prefix length must be 0 to {max}"))?,
            None => max,
        };
        Ok(Cidr { net, bits })
    }
}

impl Cidr {
    /// Whether `ip` is in the block (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: &IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(*ip, IpAddr::V4),
            v4 => *v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), self.bits),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), self.bits),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let (whole, rest) = (usize::from(bits / 8), bits % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_chosen_fields_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_FIELD);
        let kept = field(&long);
        assert!(kept.len() <= MAX_FIELD && kept.len() > MAX_FIELD - 2);
        assert!(long.starts_with(&kept));
        assert_eq!(field("curl/8"), "curl/8");
    }

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_millis(951_782_400_007), "2000-02-29T00:00:00.007Z");
        assert_eq!(
            rfc3339_millis(1_796_402_405_123),
            "2026-12-04T16:40:05.123Z"
        );
    }

    #[test]
    fn events_are_json_whatever_their_text_holds() {
        let record = AuditRecord {
            kind: AuditType::ToolCall,
            outcome: Outcome::Failure,
            transport: Some(Transport::Sse),
            protocol_version: None,
            path: None,
            duration_ms: 12,
            response_size: Some(99),
            source: Arc::new(Source {
                ip: Some("10.0.0.1".parse().unwrap()),
                port: Some(443),
                user_agent: Some("a \"quoted\"\tagent\u{1}\\".into()),
            }),
            session: None,
            request_id: Some(r#""\ud800""#.into()),
            user: Some(Principal::issuer_subject("https://idp", "ann")),
            client: Some(Arc::new(ClientInfo {
                name: Some("é\n".into()),
                version: None,
            })),
            target_name: Some("tool".into()),
            backend_tool: Some("backend \"tool\"".into()),
            method: Some("tools/call".into()),
            base_path: Arc::from("/p"),
            data: Some(("{\"a\":1}".into(), "x".into(), true)),
            max_data: 10,
        };
        let v: serde_json::Value = serde_json::from_str(&record.to_json("id", "t", "c")).unwrap();
        assert_eq!(
            v["source"]["extra"]["user_agent"],
            "a \"quoted\"\tagent\u{1}\\"
        );
        assert_eq!(v["source"]["extra"]["request_id"], serde_json::Value::Null);
        assert_eq!(v["subjects"]["user_id"], "ann");
        assert_eq!(v["subjects"]["client_name"], "é\n");
        assert_eq!(v["target"]["endpoint"], "/p/sse");
        assert_eq!(v["metadata"]["extra"]["response_size_bytes"], 99);
        assert_eq!(v["metadata"]["extra"]["backend_tool"], "backend \"tool\"");
        assert_eq!(v["data"]["truncated"], true);
        let mut plain = record.clone();
        plain.request_id = Some("7".into());
        let v: serde_json::Value = serde_json::from_str(&plain.to_json("id", "t", "c")).unwrap();
        assert_eq!(v["source"]["extra"]["request_id"], 7);
    }

    #[test]
    fn a_refused_request_names_its_transport_or_the_path_asked() {
        let asked = |method, path| {
            let a = Asked::new(Arc::default(), method, path, "/bp/");
            (a.kind, a.transport, a.path)
        };
        let (sse, mcp) = (Some(Transport::Sse), Some(Transport::Streamable));
        assert_eq!(asked("GET", "/bp/sse"), (AuditType::SessionOpen, sse, None));
        assert_eq!(asked("POST", "/bp/sse"), (AuditType::Request, sse, None));
        assert_eq!(
            asked("POST", "/bp/messages/"),
            (AuditType::Request, sse, None)
        );
        assert_eq!(
            asked("DELETE", "/bp/mcp/"),
            (AuditType::SessionClose, mcp, None)
        );
        assert_eq!(asked("GET", "/bp/mcp"), (AuditType::Request, mcp, None));
        // Outside the base path, or any other path: named as asked, no transport.
        let other = |path: &str| (AuditType::Request, None, Some(path.to_owned()));
        assert_eq!(asked("GET", "/sse"), other("/sse"));
        assert_eq!(asked("GET", "/bp/sse/"), other("/bp/sse/"));
        assert_eq!(asked("GET", "/bpmcp"), other("/bpmcp"));
        let long = format!("/{}", "x".repeat(2 * MAX_FIELD));
        assert_eq!(asked("GET", &long).2.map(|p| p.len()), Some(MAX_FIELD));
        let outcomes = [401, 403, 429, 400, 404, 405, 406, 503].map(Outcome::of_refusal);
        assert_eq!(
            outcomes.map(Outcome::as_str).join(" "),
            "denied denied denied error error error error error"
        );
    }

    #[test]
    fn data_is_cut_on_a_character_boundary() {
        assert_eq!(cut("héllo", 2), ("h", true));
        assert_eq!(cut("héllo", 3), ("hé", true));
        assert_eq!(cut("hi", 2), ("hi", false));
    }

    #[test]
    fn client_ip_trusts_only_trusted_proxies() {
        let trusted: Vec<Cidr> = ["127.0.0.1", "10.0.0.0/8"]
            .iter()
            .map(|c| c.parse().unwrap())
            .collect();
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let xff = &["203.0.113.9, 198.51.100.7, 10.1.2.3"];
        assert_eq!(
            client_ip(ip("127.0.0.1"), xff, &trusted),
            ip("198.51.100.7")
        );
        // An untrusted peer's header is ignored.
        assert_eq!(client_ip(ip("192.0.2.1"), xff, &trusted), ip("192.0.2.1"));
        assert_eq!(client_ip(ip("127.0.0.1"), &[], &trusted), ip("127.0.0.1"));
        assert_eq!(
            client_ip(ip("127.0.0.1"), &["junk"], &trusted),
            ip("127.0.0.1")
        );
        assert_eq!(
            client_ip(ip("::ffff:10.0.0.1"), &["1.2.3.4"], &trusted),
            ip("1.2.3.4")
        );
        // A trusted proxy that adds its own line: the client's spoofed first line is not
        // the answer, the hop the proxy saw is; a line that was not text stops the walk.
        let lines = &["203.0.113.66", "198.51.100.7"];
        assert_eq!(
            client_ip(ip("127.0.0.1"), lines, &trusted),
            ip("198.51.100.7")
        );
        let lines = &["203.0.113.66", "10.0.0.2", ""];
        assert_eq!(client_ip(ip("127.0.0.1"), lines, &trusted), ip("127.0.0.1"));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
        let any: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(any.contains(&"8.8.8.8".parse().unwrap()));
    }
}
