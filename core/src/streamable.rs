//! Pure helpers of the Streamable HTTP transport (SPEC section 7): what the headers of a
//! `/mcp` request admit, and the lines and bodies the proxy writes itself.

use std::borrow::Cow;

use crate::http::Response;
use crate::message::RawId;
use crate::routed_id::{self, Mark, SessionId};

pub(crate) use crate::http::PROTOCOL_VERSIONS;

/// Whether `version` (the header, when present) is one this proxy speaks.
pub(crate) fn supported_version(version: Option<&str>) -> bool {
    version.is_none_or(|v| PROTOCOL_VERSIONS.contains(&v.trim()))
}

/// Whether a `Content-Type` declares JSON (`application/json`, parameters allowed).
pub(crate) fn is_json(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// What an `Accept` header admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Accepts {
    /// `application/json` (or `application/*`, `*/*`).
    pub(crate) json: bool,
    /// `text/event-stream` (or `text/*`, `*/*`).
    pub(crate) event_stream: bool,
}

impl Accepts {
    /// Reads an `Accept` header; a media range with `q=0` admits nothing. Bytes, compared
    /// in place: it runs on the owner loop for every POST.
    pub(crate) fn parse(accept: Option<&str>) -> Accepts {
        let mut out = Accepts::default();
        for range in accept.unwrap_or_default().as_bytes().split(|&b| b == b',') {
            let mut parts = range.split(|&b| b == b';');
            let media = parts.next().unwrap_or_default().trim_ascii();
            let is = |name: &[u8]| media.eq_ignore_ascii_case(name);
            let (json, event_stream) = if is(b"*/*") {
                (true, true)
            } else if is(b"application/json") || is(b"application/*") {
                (true, false)
            } else if is(b"text/event-stream") || is(b"text/*") {
                (false, true)
            } else {
                continue;
            };
            let refused = parts.any(|p| {
                p.trim_ascii().strip_prefix(b"q=").is_some_and(|q| {
                    std::str::from_utf8(q)
                        .ok()
                        .and_then(|q| q.trim().parse::<f32>().ok())
                        .is_some_and(|q| q <= 0.0)
                })
            });
            if !refused {
                out.json |= json;
                out.event_stream |= event_stream;
            }
        }
        out
    }
}

pub(crate) use crate::http::error_message;

/// The proxy's `notifications/cancelled` for the request `raw_id` of `session` (its routed
/// id, as the backend knows it), as a backend line.
pub(crate) fn cancel_line(
    session: &SessionId,
    raw_id: &str,
    mark: Mark,
    reason: &str,
) -> Option<Vec<u8>> {
    let id = RawId::classify(raw_id)?;
    let mut line =
        br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"#.to_vec();
    routed_id::encode_marked(session, id, mark, &mut line);
    line.extend_from_slice(
        format!(r#","reason":{}}}}}"#, serde_json::Value::from(reason)).as_bytes(),
    );
    line.push(b'\n');
    Some(line)
}

/// `200 application/json` carrying one message.
pub(crate) fn json_answer(message: Vec<u8>) -> Response {
    Response::json(200, message)
}

/// `200 text/event-stream` whose whole body is `message` as one event: an answer that
/// has no stream to resume (the failed `initialize` of a session that never opened).
pub(crate) fn sse_answer(message: &[u8]) -> Response {
    let mut response = crate::http::sse_head();
    response.body = Cow::Owned(crate::sse::message_event(message));
    response
}

/// `202 Accepted` with an empty body: a notification was taken (Streamable HTTP).
pub(crate) fn notification_accepted() -> Response {
    Response {
        status: 202,
        headers: Vec::new(),
        body: Cow::Borrowed(&[]),
    }
}

/// `204 No Content`: a session was deleted.
pub(crate) fn deleted() -> Response {
    Response {
        status: 204,
        headers: Vec::new(),
        body: Cow::Borrowed(&[]),
    }
}

/// An answer of session `sid`, naming it.
pub(crate) fn with_session(mut response: Response, sid: crate::routed_id::SessionId) -> Response {
    response.headers.push((
        "mcp-session-id",
        std::borrow::Cow::Owned(sid.as_str().to_owned()),
    ));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::IdKey;

    #[test]
    fn accept_and_content_type() {
        let a = Accepts::parse(Some("application/json, text/event-stream"));
        assert!(a.json && a.event_stream);
        assert_eq!(
            Accepts::parse(Some("*/*")),
            Accepts {
                json: true,
                event_stream: true
            }
        );
        assert!(!Accepts::parse(Some("text/html")).json);
        assert!(!Accepts::parse(None).event_stream);
        assert!(!Accepts::parse(Some("text/event-stream;q=0")).event_stream);
        assert!(Accepts::parse(Some("text/event-stream;q=0.5")).event_stream);
        let a = Accepts::parse(Some("Application/JSON, TEXT/*"));
        assert!(a.json && a.event_stream);
        let a = Accepts::parse(Some(
            " text/html;level=1 , application/json ; q=0 ,text/*;q=0.1",
        ));
        assert!(!a.json && a.event_stream);
        assert_eq!(Accepts::parse(Some("*/*;q=0")), Accepts::default());
        assert!(is_json(Some("application/json; charset=utf-8")));
        assert!(is_json(Some("Application/JSON")));
        assert!(!is_json(Some("text/plain")));
        assert!(!is_json(None));
        assert!(supported_version(None));
        assert!(supported_version(Some("2025-03-26")));
        assert!(!supported_version(Some("2026-07-28")));
    }

    #[test]
    fn id_keys() {
        assert_eq!(IdKey::of(r#""a""#), IdKey::of(r#""\u0061""#));
        assert_ne!(IdKey::of("1"), IdKey::of(r#""1""#));
        assert_eq!(IdKey::of("1.5"), None);
        assert_eq!(IdKey::of("null"), None);
        assert_eq!(IdKey::of(r#""\ud800""#), None);
        let sid = SessionId::from_random([1; 16]);
        let line =
            String::from_utf8(cancel_line(&sid, "7", Mark::Plain, "request timed out").unwrap())
                .unwrap();
        assert_eq!(
            line,
            format!(
                "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{{\"requestId\":\"{sid}|n:7\",\"reason\":\"request timed out\"}}}}\n"
            )
        );
    }
}
