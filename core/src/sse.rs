//! Server-sent event framing for the legacy HTTP+SSE transport.

/// The comment that keeps idle streams (and the proxies in front of them) open.
pub const KEEPALIVE: &[u8] = b": keep-alive\n\n";

/// The first event of every stream: where to POST.
pub(crate) fn endpoint_event(url: &str) -> Vec<u8> {
    frame(b"endpoint", url.as_bytes())
}

/// One JSON-RPC message as a `message` event. `json` must hold no raw newline, which the
/// router guarantees for everything it delivers.
pub(crate) fn message_event(json: &[u8]) -> Vec<u8> {
    frame(b"message", json)
}

/// A Streamable stream's event with its id line (`id` is `<stream>.<position>`).
pub fn with_id(id: &str, event: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(id.len() + 5 + event.len());
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(id.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(event);
    out
}

/// The priming event a 2025-11-25 POST stream opens with: an id and empty data, so the
/// client can resume even before the first message.
pub fn priming(id: &str) -> Vec<u8> {
    format!("id: {id}\ndata: \n\n").into_bytes()
}

fn frame(event: &[u8], data: &[u8]) -> Vec<u8> {
    debug_assert!(memchr::memchr2(b'\n', b'\r', data).is_none());
    let mut out = Vec::with_capacity(event.len() + data.len() + 16);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event);
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn frames() {
        assert_eq!(
            super::message_event(br#"{"a":1}"#),
            b"event: message\ndata: {\"a\":1}\n\n"
        );
        assert_eq!(
            super::endpoint_event("/messages?session_id=x"),
            b"event: endpoint\ndata: /messages?session_id=x\n\n"
        );
    }
}
