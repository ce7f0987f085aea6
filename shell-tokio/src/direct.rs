//! A connection's first request, read here before hyper sees the connection: a plain `GET`
//! of an event stream (`/sse`, or `/mcp`'s standalone stream) is served on the socket
//! itself, so that an open stream holds its socket, its queue and a small task instead of
//! an HTTP server's buffers (hyper keeps ~14 KiB a connection while a response streams:
//! its 8 KiB header buffer, allocated up front, and its read buffer; tests/BENCHMARKS.md).
//!
//! Only the plain case is taken: HTTP/1.1, `GET`, a target ending in `/sse` or `/mcp`, no
//! body, no `Expect`, no `Upgrade`, the head within the framing limits and the core's
//! [`framing::check_head`]. Every other request goes to hyper with the bytes already read,
//! as does whatever follows an answer here that is not a stream: hyper applies the same
//! rules, refuses alike and audits alike, so the rules live in one place.

use std::borrow::Cow;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::HeaderValue;
use hyper::StatusCode;
use switchboard_core::framing::{self, BodyLength, Limits};
use switchboard_core::http::{self, Admitted, Refused};
use switchboard_core::hub::{Payload, TurnedAway};
use switchboard_core::Front;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::debug;

use switchboard_shell::head::Lines;

use crate::server::{into_request, unix_now, Server};
use crate::session::StreamBody;
use crate::supervisor::{Input, Reply};

/// What the first request left for hyper.
pub(crate) enum HandOver {
    /// The connection is done (served, or the client left).
    Closed,
    /// hyper serves the rest: the bytes read and not consumed, and whether they were read
    /// before an answer went out (a pipelined request).
    Hyper(TcpStream, Bytes, bool),
}

/// A head's first bytes that can start a plain stream request.
const GET: &[u8] = b"GET ";

/// hyper's first read of a connection (its initial buffer).
const FIRST_READ: usize = 8192;

/// How many header lines the first read's parse makes room for at most (the framing limit
/// applies too).
const HEADERS: usize = 64;

impl Server {
    /// Reads the connection's first request head and serves it here when it asks for an
    /// event stream in the plain way; otherwise hands it over to hyper. A head not complete
    /// within the header timeout, or when the server stops, closes the connection, as hyper
    /// closes it.
    pub(crate) async fn first_request(
        &self,
        mut socket: TcpStream,
        peer: SocketAddr,
        mut stopping: watch::Receiver<bool>,
    ) -> HandOver {
        let front = self.front.get();
        let limits = front.framing;
        // As much as hyper's first read takes: a burst of pipelined requests reaches it as
        // it would have, in one read.
        let mut buf = Vec::with_capacity(FIRST_READ);
        let read = tokio::time::timeout(
            limits.header_timeout,
            read_head(&mut socket, &mut buf, &limits),
        );
        let head_len = tokio::select! {
            read = read => match read {
                Ok(Ok(Some(len))) => len,
                Ok(Ok(None)) => return HandOver::Hyper(socket, buf.into(), false),
                Ok(Err(_)) | Err(_) => return HandOver::Closed,
            },
            _ = stopping.wait_for(|stopping| *stopping) => return HandOver::Closed,
        };
        drop(stopping);
        // Read and judged off the task's state: its header array lives only here.
        let answer = match admit_plain(&front, &buf[..head_len], peer) {
            None => return HandOver::Hyper(socket, buf.into(), false),
            Some(judged) => judged,
        };
        // A reload's new front is for later requests; a stream keeps none alive.
        drop(front);
        let answer = match answer {
            Err(refused) => {
                debug!(%peer, reason = refused.rejection.as_str(), "refused");
                let (response, turned_away) = TurnedAway::by_gate(*refused);
                let _ = self.inputs.send(Input::Refused(turned_away)).await;
                Reply::Full(response)
            }
            Ok(admitted) => {
                let Some(request) = into_request(admitted, Payload::Bytes(Vec::new())).await else {
                    return backend_down(socket).await;
                };
                match self.ask(request).await {
                    Some(reply) => reply,
                    None => return backend_down(socket).await,
                }
            }
        };
        match answer {
            Reply::Stream(head, body) => {
                drop(buf);
                stream(socket, head, body, limits.max_head).await;
                HandOver::Closed
            }
            Reply::Full(response) => {
                let close = framing::closes(&response);
                let mut out = head_bytes(&response, Length::Full(response.body.len()), close);
                out.extend_from_slice(&response.body);
                if !written(&mut socket, &out).await || close {
                    return HandOver::Closed;
                }
                let rest = Bytes::from(buf).slice(head_len..);
                HandOver::Hyper(socket, rest, true)
            }
        }
    }
}

/// The gate's verdict on the head in `buf` when it is a plain stream request (else `None`).
fn admit_plain(
    front: &Front,
    buf: &[u8],
    peer: SocketAddr,
) -> Option<Result<Admitted, Box<Refused>>> {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    let complete = matches!(parsed.parse(buf), Ok(httparse::Status::Complete(_)));
    if !complete || !plain_stream_request(&parsed, &front.framing) {
        return None;
    }
    let lines = Lines(&*parsed.headers);
    let gathered = lines.gathered();
    let target = parsed.path.unwrap_or("/");
    let request_head = lines.request_head(&gathered, ("GET", target), peer);
    Some(front.gate.admit(&request_head, unix_now()))
}

/// Reads until a complete request head is in `buf`: its length, or `None` as soon as the
/// bytes read cannot start a plain stream request (or the head outgrows the limit).
async fn read_head(
    socket: &mut TcpStream,
    buf: &mut Vec<u8>,
    limits: &Limits,
) -> std::io::Result<Option<usize>> {
    loop {
        if buf.len() > limits.max_head || !buf.starts_with(&GET[..buf.len().min(GET.len())]) {
            return Ok(None);
        }
        // Where httparse (hyper's parser too) ends the head, bare line feeds included.
        match head_end(buf) {
            Ok(Some(len)) => return Ok(Some(len)),
            Ok(None) => {}
            Err(()) => return Ok(None),
        }
        if buf.capacity() == buf.len() {
            let room = (limits.max_head + 1).saturating_sub(buf.len());
            buf.reserve(room.clamp(1, buf.len().max(FIRST_READ)));
        }
        if socket.read_buf(buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// The length of the complete head at the start of `buf`, `None` while it is partial,
/// `Err` when httparse refuses it (hyper answers that).
fn head_end(buf: &[u8]) -> Result<Option<usize>, ()> {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS];
    match httparse::Request::new(&mut headers).parse(buf) {
        Ok(httparse::Status::Complete(len)) => Ok(Some(len)),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(_) => Err(()),
    }
}

/// Answers 503 (the loop is gone: the proxy is exiting) and closes, as the hyper path does.
async fn backend_down(mut socket: TcpStream) -> HandOver {
    let response = switchboard_core::Rejection::BackendDown.response();
    let mut out = head_bytes(&response, Length::Full(response.body.len()), true);
    out.extend_from_slice(&response.body);
    written(&mut socket, &out).await;
    HandOver::Closed
}

/// HTTP/1.1 `GET` of a target ending in `/sse` or `/mcp`, in origin form, with no body, no
/// `Expect`, no `Upgrade`, within the framing rules.
fn plain_stream_request(parsed: &httparse::Request<'_, '_>, limits: &Limits) -> bool {
    let Some(target) = parsed.path else {
        return false;
    };
    // As hyper's URI parser reads it, or not here (a fragment, a character it refuses).
    let parsed_target = hyper::http::uri::PathAndQuery::try_from(target);
    if !parsed_target.is_ok_and(|p| p.as_str() == target) {
        return false;
    }
    let path = target.split('?').next().unwrap_or_default();
    let stream_path = path.starts_with('/') && (path.ends_with("/sse") || path.ends_with("/mcp"));
    let unusual = |h: &&httparse::Header<'_>| {
        ["expect", "upgrade", "content-length", "transfer-encoding"]
            .iter()
            .any(|name| h.name.eq_ignore_ascii_case(name))
    };
    let headers = (parsed.headers.iter()).map(|h| (h.name.as_bytes(), h.value));
    parsed.method == Some("GET")
        && parsed.version == Some(1)
        && stream_path
        && !parsed.headers.iter().any(|h| unusual(&h))
        && parsed.headers.len() <= limits.max_headers
        && framing::check_head(1, target.len(), headers, limits).is_ok_and(|framing| {
            framing.body == BodyLength::Length(0) && framing.keep_alive && !framing.expect_continue
        })
}

/// How a response's body is delimited on the wire.
enum Length {
    Full(usize),
    Chunked,
}

/// The status line and header section of `response`, as hyper writes them: the core's
/// headers (a value hyper would not take is left out), `date`, and the body's length or
/// chunked coding.
fn head_bytes(response: &http::Response, length: Length, close: bool) -> Vec<u8> {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut said_close = false;
    for (name, value) in &response.headers {
        let value: &str = match value {
            Cow::Borrowed(text) => text,
            Cow::Owned(text) => text,
        };
        if HeaderValue::from_str(value).is_err() {
            continue;
        }
        said_close |= name.eq_ignore_ascii_case("connection");
        for part in [name.as_bytes(), b": ", value.as_bytes(), b"\r\n"] {
            out.extend_from_slice(part);
        }
    }
    if close && !said_close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"date: ");
    out.extend_from_slice(httpdate::fmt_http_date(std::time::SystemTime::now()).as_bytes());
    out.extend_from_slice(b"\r\n");
    match length {
        Length::Full(len) => {
            out.extend_from_slice(format!("content-length: {len}\r\n").as_bytes());
        }
        Length::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Writes a stream's head, then each frame the loop queues as a chunk, until the loop ends
/// the stream (the last chunk is written) or the client leaves (a read sees its end).
async fn stream(socket: TcpStream, head: http::Response, mut body: StreamBody, budget: usize) {
    let (mut reader, mut writer) = socket.into_split();
    if !written(&mut writer, &head_bytes(&head, Length::Chunked, false)).await {
        return;
    }
    drop(head);
    // What a client sends on its stream's connection is read and dropped, to see it leave;
    // past what hyper would have buffered (a head's worth), the connection is closed.
    let mut probe = [0u8; 64];
    let mut sent = 0usize;
    loop {
        tokio::select! {
            frame = body.frame() => {
                let Some(Ok(frame)) = frame else {
                    written(&mut writer, b"0\r\n\r\n").await;
                    return;
                };
                let Ok(data) = frame.into_data() else { continue };
                if data.is_empty() {
                    continue;
                }
                let mut chunk = Vec::with_capacity(data.len() + 12);
                chunk.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                chunk.extend_from_slice(&data);
                chunk.extend_from_slice(b"\r\n");
                if !written(&mut writer, &chunk).await {
                    return;
                }
            }
            read = reader.read(&mut probe) => {
                sent += read.as_ref().map_or(0, |n| *n);
                if !matches!(read, Ok(n) if n > 0) || sent > budget {
                    return;
                }
            }
        }
    }
}

/// Writes `bytes` to the client; false if it failed, or a write moved nothing for
/// [`STALLED_WRITE`](switchboard_shell::STALLED_WRITE): a client that reads slowly is
/// served, one that stopped reading is let go. Every write on this path goes through it.
async fn written<W: AsyncWrite + Unpin>(writer: &mut W, mut bytes: &[u8]) -> bool {
    let stalled = switchboard_shell::STALLED_WRITE;
    while !bytes.is_empty() {
        match crate::server::within(stalled, writer.write(bytes)).await {
            Some(Ok(n)) if n > 0 => bytes = &bytes[n..],
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::future::Future;
    use std::time::Duration;

    /// A client that takes one byte every 40 s: slow, but never still for the stall time.
    struct Trickle(std::pin::Pin<Box<tokio::time::Sleep>>);

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            _: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::task::ready!(self.0.as_mut().poll(cx));
            let next = tokio::time::Instant::now() + Duration::from_secs(40);
            self.0.as_mut().reset(next);
            std::task::Poll::Ready(Ok(1))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_reads_slowly_is_served() {
        let first = tokio::time::Instant::now() + Duration::from_secs(40);
        let mut client = Trickle(Box::pin(tokio::time::sleep_until(first)));
        let started = tokio::time::Instant::now();
        assert!(written(&mut client, b"0\r\n\r\n").await);
        assert!(started.elapsed() > 2 * switchboard_shell::STALLED_WRITE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_is_let_go_after_the_stall_time() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).await;
        let (mut socket, _) = listener.accept().await.expect("accept");
        let started = tokio::time::Instant::now();
        // More than both sockets' buffers hold: the write must wait for the client.
        let big = vec![b'x'; 64 << 20];
        assert!(!written(&mut socket, &big).await);
        assert!(started.elapsed() >= switchboard_shell::STALLED_WRITE);
        drop(client);
    }

    fn limits() -> Limits {
        Limits::default()
    }

    fn plain(head: &str) -> bool {
        let mut headers = [httparse::EMPTY_HEADER; HEADERS];
        let mut parsed = httparse::Request::new(&mut headers);
        let complete = matches!(
            parsed.parse(head.as_bytes()),
            Ok(httparse::Status::Complete(_))
        );
        complete && plain_stream_request(&parsed, &limits())
    }

    #[test]
    fn only_a_plain_get_of_a_stream_is_served_outside_hyper() {
        let host = "Host: 127.0.0.1\r\n";
        assert!(plain(&format!("GET /sse HTTP/1.1\r\n{host}\r\n")));
        assert!(plain(&format!(
            "GET /base/mcp?x=1 HTTP/1.1\r\n{host}Accept: text/event-stream\r\n\r\n"
        )));
        for head in [
            format!("POST /sse HTTP/1.1\r\n{host}\r\n"),
            format!("GET /sse HTTP/1.0\r\n{host}\r\n"),
            format!("GET /health HTTP/1.1\r\n{host}\r\n"),
            format!("GET /sse HTTP/1.1\r\n{host}Content-Length: 2\r\n\r\n"),
            format!("GET /sse HTTP/1.1\r\n{host}Transfer-Encoding: chunked\r\n\r\n"),
            format!("GET /sse HTTP/1.1\r\n{host}Expect: 100-continue\r\n\r\n"),
            format!("GET /sse HTTP/1.1\r\n{host}Upgrade: websocket\r\n\r\n"),
            format!("GET /sse HTTP/1.1\r\n{host}Connection: close\r\n\r\n"),
            format!("GET /sse HTTP/1.1\r\n{host}{host}\r\n"),
            format!("GET http://127.0.0.1/sse HTTP/1.1\r\n{host}\r\n"),
            format!("GET /sse#top HTTP/1.1\r\n{host}\r\n"),
            format!("GET /<x>/sse HTTP/1.1\r\n{host}\r\n"),
        ] {
            assert!(!plain(&head), "{head:?} goes to hyper");
        }
    }

    #[test]
    fn a_head_ends_where_httparse_ends_it() {
        let pipelined = b"GET /sse HTTP/1.1\r\nHost: h\r\n\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n";
        assert_eq!(head_end(pipelined), Ok(Some(29)));
        assert_eq!(head_end(b"GET /sse HTTP/1.1\r\nHost: h\r\n"), Ok(None));
        assert_eq!(head_end(b"GET /sse HTTP/1.1\r\nHo st: h\r\n\r\n"), Err(()));
    }

    #[test]
    fn a_head_is_written_as_hyper_writes_it() {
        let mut response = http::Response::text(401, "application/json", &b"{}"[..]);
        response
            .headers
            .push(("www-authenticate", Cow::Owned("Bearer\r\nx: y".to_owned())));
        let head = head_bytes(&response, Length::Full(2), true);
        let head = String::from_utf8(head).unwrap();
        assert!(head.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{head}");
        assert!(
            head.contains("content-type: application/json\r\n"),
            "{head}"
        );
        assert!(head.contains("content-length: 2\r\n"), "{head}");
        assert!(head.contains("connection: close\r\n"), "{head}");
        assert!(head.contains("\r\ndate: "), "{head}");
        assert!(
            !head.contains("www-authenticate"),
            "a value hyper refuses: {head}"
        );
        assert!(head.ends_with("\r\n\r\n"));
        let stream = http::Response::text(200, "text/event-stream", &b""[..]);
        let head = String::from_utf8(head_bytes(&stream, Length::Chunked, false)).unwrap();
        assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
        assert!(!head.contains("connection"), "{head}");
    }
}
