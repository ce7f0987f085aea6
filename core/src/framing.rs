//! HTTP/1.1 framing, decided once for both shells (RFC 9112): how large a request head may
//! be and how long it may take, which `Content-Length` and `Transfer-Encoding` a request may
//! carry, how a chunked body is read, and how many pipelined requests a connection may have
//! waiting. Every refusal is a [`FramingError`] whose answer closes the connection, so no
//! byte after an ambiguous message is ever read as another request.
//!
//! The tokio shell's HTTP library (hyper, over `httparse`) parses the head itself and is
//! configured from [`Limits`]; the blocking shell parses it with `httparse` too. Both then
//! call [`check_head`] on the parsed head, so the rules hyper does not apply (duplicated
//! `Host`, `Authorization`, `Mcp-Session-Id` or `Origin`; a coding before `chunked`; a
//! target over [`Limits::max_target`]) are applied alike, and count pipelined requests
//! with one [`Pipeline`].

use std::borrow::Cow;
use std::time::Duration;

use crate::http::Response;

/// Longest request target (414 past it).
pub(crate) const MAX_TARGET: usize = 16 * 1024;
/// Largest request head, request line and headers together (431 past it).
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// Most header lines in a head (431 past it).
pub(crate) const MAX_HEADERS: usize = 100;
/// Longest chunk-size line of a chunked body, extensions included (400 past it).
pub(crate) const MAX_CHUNK_LINE: usize = 4 * 1024;

/// The bounds both shells hold every connection to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest request target.
    pub max_target: usize,
    /// Largest request head.
    pub max_head: usize,
    /// Most header lines.
    pub max_headers: usize,
    /// How long a request head may take to arrive, counted from when the connection
    /// waits for it (a new connection, or one whose last answer went out); past it the
    /// connection is closed without an answer.
    pub header_timeout: Duration,
    /// Requests a connection may pipeline behind an unanswered one before the next is
    /// refused (see [`Pipeline`]).
    pub max_pipelined: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_target: MAX_TARGET,
            max_head: MAX_HEAD,
            max_headers: MAX_HEADERS,
            header_timeout: Duration::from_secs(10),
            max_pipelined: 32,
        }
    }
}

/// Why a request cannot be read as one unambiguous HTTP/1.1 message. Each answer closes
/// the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramingError {
    /// 431: the head is over [`Limits::max_head`] or has more than [`Limits::max_headers`]
    /// lines.
    HeadTooLarge,
    /// 414: the target is over [`Limits::max_target`].
    TargetTooLong,
    /// 400: the head does not parse (a non-token byte in a method or header name, a control
    /// byte in a value, an obs-fold line, a version other than HTTP/1.0 or 1.1, ...).
    MalformedHead,
    /// 400: a header that must appear at most once appears twice.
    Duplicated(&'static str),
    /// 400: a `Content-Length` that is not one decimal number, or two that differ.
    InvalidContentLength,
    /// 400: `Transfer-Encoding` whose last coding is not `chunked`, `chunked` given twice,
    /// or any transfer coding on an HTTP/1.0 request (the length cannot be known).
    InvalidTransferEncoding,
    /// 501: a transfer coding other than `chunked` before it (`gzip, chunked`).
    UnsupportedTransferCoding,
    /// 400: a chunked body whose chunk sizes, chunk ends or trailers do not parse.
    InvalidChunk,
    /// 503: more than [`Limits::max_pipelined`] requests pipelined behind unread answers;
    /// refused before it is forwarded.
    TooManyPipelined,
}

impl FramingError {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            FramingError::HeadTooLarge => 431,
            FramingError::TargetTooLong => 414,
            FramingError::UnsupportedTransferCoding => 501,
            FramingError::TooManyPipelined => 503,
            FramingError::MalformedHead
            | FramingError::Duplicated(_)
            | FramingError::InvalidContentLength
            | FramingError::InvalidTransferEncoding
            | FramingError::InvalidChunk => 400,
        }
    }

    /// Stable snake_case name, for logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            FramingError::HeadTooLarge => "head_too_large",
            FramingError::TargetTooLong => "target_too_long",
            FramingError::MalformedHead => "malformed_head",
            FramingError::Duplicated(_) => "duplicated_header",
            FramingError::InvalidContentLength => "invalid_content_length",
            FramingError::InvalidTransferEncoding => "invalid_transfer_encoding",
            FramingError::UnsupportedTransferCoding => "unsupported_transfer_coding",
            FramingError::InvalidChunk => "invalid_chunk",
            FramingError::TooManyPipelined => "too_many_pipelined",
        }
    }

    fn message(&self) -> &'static str {
        match self {
            FramingError::HeadTooLarge => "Request head too large",
            FramingError::TargetTooLong => "Request target too long",
            FramingError::MalformedHead => "Malformed request head",
            FramingError::Duplicated("host") => "Host given more than once",
            FramingError::Duplicated("authorization") => "Authorization given more than once",
            FramingError::Duplicated("origin") => "Origin given more than once",
            FramingError::Duplicated(_) => "Mcp-Session-Id given more than once",
            FramingError::InvalidContentLength => "Invalid Content-Length",
            FramingError::InvalidTransferEncoding => "Invalid Transfer-Encoding",
            FramingError::UnsupportedTransferCoding => {
                "Only the chunked transfer coding is supported"
            }
            FramingError::InvalidChunk => "Invalid chunked body",
            FramingError::TooManyPipelined => "Too many pipelined requests",
        }
    }

    /// The answer: a JSON-RPC error without id, and `Connection: close` (the shell closes
    /// the connection once it is written, reading nothing more from it).
    pub fn response(&self) -> Response {
        let body = format!(
            r#"{{"jsonrpc":"2.0","error":{{"code":-32600,"message":"{}"}}}}"#,
            self.message()
        );
        let mut response = Response::json(self.status(), body.into_bytes());
        if *self == FramingError::TooManyPipelined {
            response.headers.push(("retry-after", Cow::Borrowed("1")));
        }
        response.headers.push(CLOSE);
        response
    }
}

/// The header that tells a shell to close the connection after this answer.
pub(crate) const CLOSE: (&str, Cow<'static, str>) = ("connection", Cow::Borrowed("close"));

/// Whether `response` asks for the connection to be closed after it.
pub fn closes(response: &Response) -> bool {
    response.headers.iter().any(|(name, value)| {
        name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close")
    })
}

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// `Content-Length` bytes (0 without either header).
    Length(u64),
    /// Chunked ([`ChunkedBody`]).
    Chunked,
}

/// What [`check_head`] found: how to read the body and what to do after the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// How the body is delimited.
    pub body: BodyLength,
    /// Whether the connection may carry another request after the answer (HTTP/1.1
    /// without `Connection: close`, and not both `Content-Length` and
    /// `Transfer-Encoding`: RFC 9112 §6.1 says to close after such a request).
    pub keep_alive: bool,
    /// The client waits for `100 Continue` before sending the body.
    pub expect_continue: bool,
}

/// Headers that name who asks, for where, or in which session: a second copy could be
/// read differently by a proxy in front, so either is refused.
const SINGLE: [&str; 4] = ["host", "authorization", "mcp-session-id", "origin"];

/// Checks a parsed request head against the framing rules: `minor` is the HTTP/1.x minor
/// version, `target_len` the length of the request target as sent, `headers` every header
/// line in order (names in any case). Returns how to read the body, or the refusal.
pub fn check_head<'a>(
    minor: u8,
    target_len: usize,
    headers: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    limits: &Limits,
) -> Result<Framing, FramingError> {
    if target_len > limits.max_target {
        return Err(FramingError::TargetTooLong);
    }
    let mut read = HeadRead::new(minor);
    for (name, value) in headers {
        read.line(name, value)?;
    }
    let HeadRead {
        length,
        codings,
        has_te,
        mut keep_alive,
        expect_continue,
        ..
    } = read;
    let body = if has_te {
        check_codings(minor, &codings)?;
        // Both say how long the body is: it is chunked (RFC 9112 section 6.3), and nothing
        // after it is read as another request.
        if length.is_some() {
            keep_alive = false;
        }
        BodyLength::Chunked
    } else {
        BodyLength::Length(length.unwrap_or(0))
    };
    Ok(Framing {
        body,
        keep_alive,
        expect_continue,
    })
}

/// What a head's lines said so far about its framing.
struct HeadRead<'a> {
    seen: [bool; SINGLE.len()],
    length: Option<u64>,
    codings: Vec<&'a [u8]>,
    has_te: bool,
    keep_alive: bool,
    expect_continue: bool,
}

impl<'a> HeadRead<'a> {
    fn new(minor: u8) -> Self {
        Self {
            seen: [false; SINGLE.len()],
            length: None,
            codings: Vec::new(),
            has_te: false,
            keep_alive: minor == 1,
            expect_continue: false,
        }
    }

    fn line(&mut self, name: &[u8], value: &'a [u8]) -> Result<(), FramingError> {
        if let Some(i) = SINGLE
            .iter()
            .position(|s| name.eq_ignore_ascii_case(s.as_bytes()))
        {
            if std::mem::replace(&mut self.seen[i], true) {
                return Err(FramingError::Duplicated(SINGLE[i]));
            }
        } else if name.eq_ignore_ascii_case(b"content-length") {
            // After a `Transfer-Encoding` it is not read (the body is chunked and the
            // connection closes after it), as hyper does not: both binaries alike.
            if self.has_te {
                self.length.get_or_insert(0);
                return Ok(());
            }
            let n = decimal(value).ok_or(FramingError::InvalidContentLength)?;
            if self.length.is_some_and(|before| before != n) {
                return Err(FramingError::InvalidContentLength);
            }
            self.length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.has_te = true;
            self.codings.extend(list(value));
        } else if name.eq_ignore_ascii_case(b"connection") {
            if list(value).any(|t| t.eq_ignore_ascii_case(b"close")) {
                self.keep_alive = false;
            }
        } else if name.eq_ignore_ascii_case(b"expect") {
            self.expect_continue = trim(value).eq_ignore_ascii_case(b"100-continue");
        }
        Ok(())
    }
}

/// A `Transfer-Encoding` the proxy reads: HTTP/1.1, `chunked` once and last, nothing
/// before it.
fn check_codings(minor: u8, codings: &[&[u8]]) -> Result<(), FramingError> {
    if minor != 1 {
        return Err(FramingError::InvalidTransferEncoding);
    }
    let is_chunked = |c: &&[u8]| c.eq_ignore_ascii_case(b"chunked");
    match codings.split_last() {
        Some((last, before)) if is_chunked(last) => {
            if before.iter().any(is_chunked) {
                Err(FramingError::InvalidTransferEncoding)
            } else if !before.is_empty() {
                Err(FramingError::UnsupportedTransferCoding)
            } else {
                Ok(())
            }
        }
        _ => Err(FramingError::InvalidTransferEncoding),
    }
}

/// A `Content-Length` value: one or more ASCII digits and nothing else, within `u64`.
fn decimal(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// The non-empty elements of a comma-separated header value, trimmed.
fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim)
        .filter(|t| !t.is_empty())
}

fn trim(bytes: &[u8]) -> &[u8] {
    let is_space = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes
        .iter()
        .position(|b| !is_space(b))
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_space(b))
        .map_or(start, |e| e + 1);
    &bytes[start..end]
}

/// The first bytes of the HTTP/2 connection preface: a connection that opens with it is
/// closed without an answer (an HTTP/1.1 answer would mean nothing to it).
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Counts the requests a connection pipelines behind unread answers. A request is
/// *pipelined* when the shell had already received it (into its read buffer) when the
/// answer before it was written, without reading the socket since; past
/// [`Limits::max_pipelined`] such requests in a row the next is refused with
/// [`FramingError::TooManyPipelined`] before it is forwarded, and the connection closed.
/// Every request before it was answered in order.
#[derive(Debug, Default, Clone)]
pub struct Pipeline {
    in_a_row: usize,
}

impl Pipeline {
    /// A new request was read; `read_since_answer` says whether the socket was read after
    /// the previous answer was written (always true for a connection's first request).
    pub fn request(
        &mut self,
        read_since_answer: bool,
        limits: &Limits,
    ) -> Result<(), FramingError> {
        if read_since_answer {
            self.in_a_row = 0;
            return Ok(());
        }
        self.in_a_row += 1;
        if self.in_a_row > limits.max_pipelined {
            return Err(FramingError::TooManyPipelined);
        }
        Ok(())
    }
}

/// Reads a chunked body strictly (RFC 9112 §7.1), sans I/O: chunk-size lines of hex digits
/// with optional extensions and no control bytes (the number read by `httparse`), each
/// chunk's data followed by CRLF, then a trailer section parsed as header lines by
/// `httparse` (no obs-fold, token names) and discarded.
#[derive(Debug, Clone, Default)]
pub struct ChunkedBody {
    state: Chunk,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Chunk {
    /// Waiting for a chunk-size line.
    #[default]
    Size,
    /// This many bytes of chunk data left.
    Data(u64),
    /// The CRLF after chunk data.
    DataEnd,
    /// The trailer section after the last chunk.
    Trailers,
    /// The body is complete.
    Done,
}

impl ChunkedBody {
    /// Whether the whole body has been read.
    pub fn is_done(&self) -> bool {
        self.state == Chunk::Done
    }

    /// Decodes as much of `input` as it can, appending chunk data to `out`; returns how
    /// many bytes of `input` it consumed (the rest must be given again with more after
    /// it). Stops at the end of the body: bytes after it are not consumed.
    pub fn decode(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        limits: &Limits,
    ) -> Result<usize, FramingError> {
        let mut at = 0;
        loop {
            let rest = &input[at..];
            let used = match self.state {
                Chunk::Done => return Ok(at),
                Chunk::Size => match size_line(rest)? {
                    Some((used, 0)) => {
                        self.state = Chunk::Trailers;
                        used
                    }
                    Some((used, size)) => {
                        self.state = Chunk::Data(size);
                        used
                    }
                    None => return Ok(at),
                },
                Chunk::Data(left) => {
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(rest.len());
                    out.extend_from_slice(&rest[..take]);
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left)
                    };
                    if take == 0 {
                        return Ok(at);
                    }
                    take
                }
                Chunk::DataEnd => match rest {
                    [b'\r', b'\n', ..] => {
                        self.state = Chunk::Size;
                        2
                    }
                    [] | [b'\r'] => return Ok(at),
                    _ => return Err(FramingError::InvalidChunk),
                },
                Chunk::Trailers => match trailers(rest, limits)? {
                    Some(used) => {
                        self.state = Chunk::Done;
                        used
                    }
                    None => return Ok(at),
                },
            };
            at += used;
        }
    }
}

/// A complete chunk-size line at the start of `input`: (its length, the size), or `None`
/// while it is incomplete.
fn size_line(input: &[u8]) -> Result<Option<(usize, u64)>, FramingError> {
    let Some(lf) = memchr::memchr(b'\n', input) else {
        return if input.len() > MAX_CHUNK_LINE {
            Err(FramingError::InvalidChunk)
        } else {
            Ok(None)
        };
    };
    let line = &input[..=lf];
    let strict = lf <= MAX_CHUNK_LINE
        && line.first().is_some_and(u8::is_ascii_hexdigit)
        && line[..lf - 1]
            .iter()
            .all(|&b| b == b'\t' || (b' '..0x7f).contains(&b));
    if !strict {
        return Err(FramingError::InvalidChunk);
    }
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((used, size))) if used == line.len() => {
            Ok(Some((used, size)))
        }
        _ => Err(FramingError::InvalidChunk),
    }
}

/// A complete trailer section (possibly empty) at the start of `input`: its length, or
/// `None` while it is incomplete. Its lines end in CRLF, as a chunk-size line must: a bare
/// LF that ended it here would not end it for hyper (or a front proxy), which would read
/// what follows as trailers, not as the next request.
fn trailers(input: &[u8], limits: &Limits) -> Result<Option<usize>, FramingError> {
    let mut headers = vec![httparse::EMPTY_HEADER; limits.max_headers];
    match httparse::parse_headers(input, &mut headers) {
        Ok(httparse::Status::Complete((used, _))) if bare_lf(&input[..used]) => {
            Err(FramingError::InvalidChunk)
        }
        Ok(httparse::Status::Complete((used, _))) => Ok(Some(used)),
        Ok(httparse::Status::Partial) if input.len() <= limits.max_head => Ok(None),
        _ => Err(FramingError::InvalidChunk),
    }
}

/// Whether a line of `text` ends in a LF with no CR before it.
fn bare_lf(text: &[u8]) -> bool {
    memchr::memchr_iter(b'\n', text).any(|at| at == 0 || text[at - 1] != b'\r')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(minor: u8, headers: &[(&str, &str)]) -> Result<Framing, FramingError> {
        let headers = headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()));
        check_head(minor, 4, headers, &Limits::default())
    }

    #[test]
    fn content_length_is_one_decimal_number() {
        for bad in [
            "-1",
            "0x10",
            "1e3",
            "5, 6",
            "5, 5",
            "+5",
            "",
            " ",
            "18446744073709551616",
        ] {
            assert_eq!(
                check(1, &[("Content-Length", bad)]),
                Err(FramingError::InvalidContentLength),
                "{bad:?}"
            );
        }
        let ok = check(1, &[("content-length", "5"), ("Content-Length", "5")]).unwrap();
        assert_eq!(ok.body, BodyLength::Length(5));
        assert_eq!(
            check(1, &[("content-length", "5"), ("Content-Length", "6")]),
            Err(FramingError::InvalidContentLength)
        );
    }

    #[test]
    fn only_chunked_is_a_transfer_coding() {
        let te = |v| check(1, &[("Transfer-Encoding", v)]);
        assert_eq!(te("chunked").unwrap().body, BodyLength::Chunked);
        assert_eq!(te("Chunked").unwrap().body, BodyLength::Chunked);
        for bad in [
            "identity",
            "xchunked",
            "chunked, identity",
            "chunked, chunked",
            "",
        ] {
            assert_eq!(
                te(bad),
                Err(FramingError::InvalidTransferEncoding),
                "{bad:?}"
            );
        }
        assert_eq!(
            te("gzip, chunked"),
            Err(FramingError::UnsupportedTransferCoding)
        );
        assert_eq!(
            check(0, &[("Transfer-Encoding", "chunked")]),
            Err(FramingError::InvalidTransferEncoding)
        );
        // With a Content-Length, before or after it (then not even read, as hyper does):
        // chunked, and the connection closes.
        for both in [
            [("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
            [("Transfer-Encoding", "chunked"), ("Content-Length", "abc")],
        ] {
            let framing = check(1, &both).unwrap();
            assert_eq!(
                (framing.body, framing.keep_alive),
                (BodyLength::Chunked, false)
            );
        }
    }

    #[test]
    fn who_and_where_are_given_once() {
        for name in ["Host", "Authorization", "Mcp-Session-Id", "Origin"] {
            let twice = check(1, &[(name, "a"), (&name.to_lowercase(), "a")]);
            assert!(matches!(twice, Err(FramingError::Duplicated(_))), "{name}");
        }
    }

    #[test]
    fn long_targets_and_pipelines_are_refused() {
        let limits = Limits::default();
        assert_eq!(
            check_head(1, MAX_TARGET + 1, [], &limits),
            Err(FramingError::TargetTooLong)
        );
        let mut pipeline = Pipeline::default();
        assert!(pipeline.request(true, &limits).is_ok());
        for _ in 0..limits.max_pipelined {
            assert!(pipeline.request(false, &limits).is_ok());
        }
        assert_eq!(
            pipeline.request(false, &limits),
            Err(FramingError::TooManyPipelined)
        );
    }

    fn decode(body: &[u8]) -> Result<(Vec<u8>, usize, bool), FramingError> {
        let mut chunked = ChunkedBody::default();
        let mut out = Vec::new();
        let mut used = 0;
        // One byte at a time: every state must wait for more rather than misread a part.
        for end in 1..=body.len() {
            used += chunked.decode(&body[used..end], &mut out, &Limits::default())?;
        }
        Ok((out, used, chunked.is_done()))
    }

    #[test]
    fn chunked_bodies_are_read_strictly() {
        let (out, used, done) =
            decode(b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\nGET").unwrap();
        assert_eq!(
            (out.as_slice(), used, done),
            (&b"hello world"[..], 40, true)
        );
        for bad in [
            &b"\r\n"[..],
            b"x\r\n",
            b" 5\r\nhello\r\n",
            b"5\r\nhelloXX",
            b"5\nhello\r\n",
            b"10000000000000000\r\n",
            b"0\r\n folded\r\n\r\n",
            b"0\r\nbad name: 1\r\n\r\n",
            b"5;\x01\r\nhello\r\n",
            // Trailers end in CRLF like every other line of the body.
            b"0\r\n\nPOST / HTTP/1.1\r\n",
            b"0\r\nX-T: 1\n\r\n",
        ] {
            assert_eq!(
                decode(bad).map(|_| ()),
                Err(FramingError::InvalidChunk),
                "{bad:?}"
            );
        }
    }
}
