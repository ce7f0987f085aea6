//! The echo server's answers, shared by `echo-backend` (over pipes) and `floor` (in
//! process), so both produce the very same bytes for the same request.
//!
//! - `initialize`: a fixed result (protocol `2024-11-05`, a `tools` capability).
//! - `tools/call`: the raw id spliced back verbatim (never parsed as a number) and the
//!   request's `params.arguments` echoed raw as `structuredContent`, next to a fixed text
//!   content, about 300 bytes in all for the load generator's ~170-byte call.
//! - `tools/call` of the tool `hang`: never answered (the soak's cancelled and timed-out
//!   calls, `loadgen --soak`).
//! - `ping` and any request for `resources/*` subscriptions: `{}`; other requests: -32601.
//! - Notifications and responses: no answer.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

/// The parts of a JSON-RPC message the echo server looks at, borrowed from the line.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow)]
    params: Option<Params<'a>>,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

/// What a line asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A `tools/call`: its answer was appended.
    Call,
    /// Any other request: its answer was appended.
    Request,
    /// A notification or a response: nothing to answer.
    Silent,
    /// Not a JSON-RPC object: nothing appended.
    Invalid,
}

const CALL_TEXT: &str = r#"{\"timezone\":\"Europe/Amsterdam\",\"datetime\":\"2026-12-02T12:34:56+01:00\",\"is_dst\":false}"#;

/// Appends the answer to `line` (one JSON object, no trailing newline) to `out`.
pub fn answer(line: &[u8], out: &mut Vec<u8>) -> Kind {
    let Ok(message) = serde_json::from_slice::<Message>(line) else {
        return Kind::Invalid;
    };
    let (Some(id), Some(method)) = (message.id, message.method.as_deref()) else {
        return Kind::Silent;
    };
    let params = message.params;
    if method == "tools/call" && params.as_ref().and_then(|p| p.name.as_deref()) == Some("hang") {
        return Kind::Silent;
    }
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    out.extend_from_slice(id.get().as_bytes());
    match method {
        "tools/call" => {
            out.extend_from_slice(br#","result":{"content":[{"type":"text","text":""#);
            out.extend_from_slice(CALL_TEXT.as_bytes());
            out.extend_from_slice(br#""}],"structuredContent":"#);
            let arguments = params.and_then(|p| p.arguments).map_or("{}", RawValue::get);
            out.extend_from_slice(arguments.as_bytes());
            out.extend_from_slice(br#","isError":false}}"#);
            Kind::Call
        }
        "initialize" => {
            out.extend_from_slice(
                br#","result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"switchboard-echo","version":"0"}}}"#,
            );
            Kind::Request
        }
        "ping" | "resources/subscribe" | "resources/unsubscribe" => {
            out.extend_from_slice(br#","result":{}}"#);
            Kind::Request
        }
        _ => {
            out.extend_from_slice(br#","error":{"code":-32601,"message":"Method not found"}}"#);
            Kind::Request
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_spliced_verbatim_and_arguments_echoed() {
        let mut out = Vec::new();
        let line = br#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"tools/call","params":{"name":"echo","arguments":{"tok":"a\"b","n":1.50}}}"#;
        assert_eq!(answer(line, &mut out), Kind::Call);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"#),
            "{text}"
        );
        assert!(
            text.contains(r#""structuredContent":{"tok":"a\"b","n":1.50}"#),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["result"]["isError"], false);
    }

    #[test]
    fn other_messages() {
        let mut out = Vec::new();
        let init = br#"{"jsonrpc":"2.0","id":"x|s:1","method":"initialize","params":{}}"#;
        assert_eq!(answer(init, &mut out), Kind::Request);
        assert!(out.starts_with(br#"{"jsonrpc":"2.0","id":"x|s:1","result":{"protocolVersion""#));
        out.clear();
        let note = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        assert_eq!(answer(note, &mut out), Kind::Silent);
        assert!(out.is_empty());
        assert_eq!(answer(b"[1]", &mut out), Kind::Invalid);
        let other = br#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#;
        assert_eq!(answer(other, &mut out), Kind::Request);
        assert!(String::from_utf8_lossy(&out).contains("-32601"));
        out.clear();
        let hang = br#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"hang"}}"#;
        assert_eq!(answer(hang, &mut out), Kind::Silent);
        assert!(out.is_empty());
    }
}
