//! A request head's header lines as the gate reads them, wherever a shell parses a head
//! itself (the blocking binary always; the tokio binary a connection's first request, when
//! it may be a stream): one reading, so that both binaries and both paths ask the gate
//! about the same request in the same words.

use std::net::SocketAddr;

use switchboard_core::http::{self, RequestHead};

/// One header line: its name (any case) and its value's bytes.
pub trait Line {
    /// The name as sent.
    fn name(&self) -> &str;
    /// The value's bytes.
    fn value(&self) -> &[u8];
}

impl Line for (String, Vec<u8>) {
    fn name(&self) -> &str {
        &self.0
    }
    fn value(&self) -> &[u8] {
        &self.1
    }
}

impl Line for httparse::Header<'_> {
    fn name(&self) -> &str {
        self.name
    }
    fn value(&self) -> &[u8] {
        self.value
    }
}

/// A head's header lines, in order.
#[derive(Debug, Clone, Copy)]
pub struct Lines<'h, L>(pub &'h [L]);

/// What [`RequestHead`] borrows that several lines make: kept by the caller while the head
/// is read.
#[derive(Debug, Default)]
pub struct Gathered<'h> {
    forwarded_for: Vec<&'h str>,
    mcp_fields: Vec<(&'h str, &'h str)>,
}

impl<'h, L: Line> Lines<'h, L> {
    /// The first value of `name`, as bytes.
    pub fn bytes(&self, name: &str) -> Option<&'h [u8]> {
        (self.0.iter())
            .find(|line| line.name().eq_ignore_ascii_case(name))
            .map(Line::value)
    }

    /// The first value of `name`, when it is visible ASCII (as hyper's `to_str`); the
    /// framing check refused heads where the names that matter repeat.
    pub fn text(&self, name: &str) -> Option<&'h str> {
        visible(self.bytes(name)?)
    }

    /// Every line of `name`, in order; one that is not visible ASCII as `""`.
    pub fn all(&self, name: &str) -> Vec<&'h str> {
        (self.0.iter())
            .filter(|line| line.name().eq_ignore_ascii_case(name))
            .map(|line| visible(line.value()).unwrap_or_default())
            .collect()
    }

    /// The `X-Forwarded-For` lines and the 2026-07-28 fields (empty, no allocation, for
    /// every 2025 request).
    pub fn gathered(&self) -> Gathered<'h> {
        Gathered {
            forwarded_for: self.all("x-forwarded-for"),
            mcp_fields: (self.0.iter())
                .filter(|line| http::is_modern_field(line.name()))
                .map(|line| (line.name(), visible(line.value()).unwrap_or_default()))
                .collect(),
        }
    }

    /// The head the gate reads: `method` and `target` as the request line says, `peer`
    /// the connection's other end.
    pub fn request_head(
        &self,
        gathered: &'h Gathered<'h>,
        (method, target): (&'h str, &'h str),
        peer: SocketAddr,
    ) -> RequestHead<'h> {
        RequestHead {
            method,
            target,
            authority: None,
            authorization: self.bytes("authorization"),
            origin: self.text("origin"),
            host: self.text("host"),
            content_type: self.text("content-type"),
            accept: self.text("accept"),
            mcp_session_id: self.text("mcp-session-id"),
            mcp_protocol_version: http::single_field(self.all("mcp-protocol-version").into_iter()),
            last_event_id: self.bytes("last-event-id"),
            mcp_fields: &gathered.mcp_fields,
            peer: Some(peer),
            user_agent: self.text("user-agent"),
            forwarded_for: &gathered.forwarded_for,
            traceparent: self.text("traceparent"),
            tracestate: self.text("tracestate"),
        }
    }
}

/// `value` as text when it is visible ASCII, spaces and tabs (hyper's `to_str`).
pub fn visible(value: &[u8]) -> Option<&str> {
    (value.iter())
        .all(|&b| b == b'\t' || (b' '..0x7f).contains(&b))
        .then(|| std::str::from_utf8(value).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_as_hyper_reads_them() {
        let owned = vec![
            ("Host".to_owned(), b"a:1".to_vec()),
            ("X-Forwarded-For".to_owned(), b"10.0.0.1".to_vec()),
            ("x-forwarded-for".to_owned(), b"10.0.0.2".to_vec()),
            ("MCP-Protocol-Version".to_owned(), b"2025-06-18".to_vec()),
            ("Mcp-Method".to_owned(), b"tools/call".to_vec()),
            ("User-Agent".to_owned(), b"caf\xc3\xa9".to_vec()),
        ];
        let lines = Lines(&owned);
        let gathered = lines.gathered();
        let peer = "127.0.0.1:9".parse().unwrap();
        let head = lines.request_head(&gathered, ("GET", "/sse"), peer);
        assert_eq!(head.host, Some("a:1"));
        assert_eq!(head.forwarded_for, ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(head.mcp_protocol_version, Some("2025-06-18"));
        assert_eq!(head.mcp_fields, [("Mcp-Method", "tools/call")]);
        // Not visible ASCII: absent as text, as hyper's `to_str` fails.
        assert_eq!(head.user_agent, None);
        assert_eq!(head.origin, None);
    }
}
