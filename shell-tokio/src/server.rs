//! HTTP: accept connections, let the core's gate say who is asking and what for, read the
//! body within the limit, hand the request to the owner loop and copy its answer onto the
//! wire. Every status, header and body comes from the core.
//!
//! hyper parses each request head (with `httparse`) within the core's framing limits
//! (head size, header count, header-read timeout) and decodes chunked bodies; the core's
//! [`framing::check_head`] then applies the rules hyper leaves to us, and a body hyper could
//! not decode is refused, never forwarded. An answer with `Connection: close` makes hyper
//! close the connection once it is written. One exception, for memory: a connection whose
//! first request is a plain `GET` of an event stream is served outside hyper
//! ([`crate::direct`]), the rest of any other connection by hyper.
//!
//! A POST's body is admitted here, before the hand-off (`Admitted::into_request`), so the
//! loop never parses one; a large body on the blocking pool, so that parsing it holds no
//! runtime worker the loop and the other connections need.

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use switchboard_core::framing::{self, FramingError, Limits, Pipeline};
use switchboard_core::http::{self, Admitted, RequestHead};
use switchboard_core::hub::{self, Payload, TurnedAway};
use switchboard_core::Front;
use switchboard_core::Rejection;
use switchboard_shell::{entropy, Shared};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, warn};

use crate::direct::HandOver;
use crate::supervisor::{Input, Reply};

type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// What every request handler shares.
pub struct Server {
    /// The gate and limits, replaced whole by a reload (new connections and requests).
    pub front: Arc<Shared<Front>>,
    pub inputs: mpsc::Sender<Input>,
}

// Built at compile time: `HeaderName::from_static` at run time looks each one up again.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// hyper's own header count limit. Named explicitly, even at this value, a limit makes
/// hyper allocate and fill two arrays of that many headers for every request it parses.
const HYPER_MAX_HEADERS: usize = 100;

/// How long to wait after a failed accept, and how many failures in a row make one log line.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
const ACCEPT_FAILURES_LOGGED_EVERY: u32 = 20;

/// Bodies up to this size are admitted on the connection's task; larger ones on the
/// blocking pool (a thread hop costs more than parsing a small body).
const INLINE_BODY: usize = 64 * 1024;

impl Server {
    /// Accepts connections until `stop` fires, then waits for the answers under way (the
    /// caller bounds how long).
    pub async fn serve(self: Arc<Self>, listener: TcpListener, stop: oneshot::Receiver<()>) {
        // Every connection's task holds a watcher from its start, so that the shutdown waits
        // for streams served outside hyper (crate::direct) as for hyper's connections; a
        // connection still without a request is closed when `stopping` says so.
        let graceful = GracefulShutdown::new();
        let (stop_reading, stopping) = watch::channel(false);
        tokio::pin!(stop);
        let mut failures = 0u32;
        loop {
            let (stream, peer) = tokio::select! {
                _ = &mut stop => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning,
                        // and say so once a second, not at every try.
                        if failures.is_multiple_of(ACCEPT_FAILURES_LOGGED_EVERY) {
                            warn!("accept failed ({} in a row): {e}", failures + 1);
                        }
                        failures = failures.saturating_add(1);
                        tokio::time::sleep(ACCEPT_RETRY).await;
                        continue;
                    }
                },
            };
            failures = 0;
            let _ = stream.set_nodelay(true);
            let (server, watcher, stopping) = (self.clone(), graceful.watcher(), stopping.clone());
            tokio::spawn(async move {
                // Each part boxed, and freed when it is done: the task holds only the one
                // under way (a stream served outside hyper, or hyper's connection).
                let (stream, prefix, pipelined) =
                    match Box::pin(server.first_request(stream, peer, stopping)).await {
                        HandOver::Closed => return,
                        HandOver::Hyper(stream, prefix, pipelined) => (stream, prefix, pipelined),
                    };
                Box::pin(server.hyper(stream, peer, (prefix, pipelined), watcher)).await;
            });
        }
        drop(listener);
        let _ = stop_reading.send(true);
        graceful.shutdown().await;
    }

    /// Serves a connection with hyper, `prefix` its bytes read already (`pipelined`: before
    /// an answer was written).
    async fn hyper(
        self: Arc<Self>,
        stream: TcpStream,
        peer: SocketAddr,
        (prefix, pipelined): (Bytes, bool),
        watcher: Watcher,
    ) {
        let reads = Arc::new(Reads::default());
        if !prefix.is_empty() && !pipelined {
            reads.reads.fetch_add(1, Ordering::AcqRel);
        }
        let stream = Counted {
            // An empty slice of the first read's buffer would keep that buffer alive for
            // the connection's life.
            prefix: if prefix.is_empty() {
                Bytes::new()
            } else {
                prefix
            },
            io: stream,
            reads: reads.clone(),
            stalled: None,
        };
        let server = self.clone();
        let service = hyper::service::service_fn(move |req| {
            let (server, reads) = (server.clone(), reads.clone());
            async move { Ok::<_, Infallible>(server.handle(req, peer, &reads).await) }
        });
        let framing = self.front.get().framing;
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(framing.header_timeout)
            .max_header_size(framing.max_head)
            .max_buf_size(framing.max_head);
        if framing.max_headers != HYPER_MAX_HEADERS {
            http1.max_headers(framing.max_headers);
        }
        let conn = http1.serve_connection(TokioIo::new(stream), service);
        if let Err(e) = watcher.watch(conn).await {
            debug!(%peer, "connection ended: {e}");
            if let Some(refused) = hyper_refusal(&e) {
                self.refused_by_hyper(peer, refused).await;
            }
        }
    }

    async fn handle(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        reads: &Reads,
    ) -> Response<ResponseBody> {
        let front = self.front.get();
        let lines = req.headers().len();
        let (req, body) = req.into_parts();
        let text = |name| {
            req.headers
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
        };
        let forwarded_for: Vec<&str> = (req.headers)
            .get_all(X_FORWARDED_FOR)
            .iter()
            .map(|v| v.to_str().unwrap_or_default())
            .collect();
        // Empty (no allocation) for every 2025 request.
        let mcp_fields: Vec<(&str, &str)> = (req.headers.iter())
            .filter(|(name, _)| http::is_modern_field(name.as_str()))
            .map(|(name, value)| (name.as_str(), value.to_str().unwrap_or_default()))
            .collect();
        let head = RequestHead {
            method: req.method.as_str(),
            target: req.uri.path_and_query().map_or("/", |p| p.as_str()),
            authority: req.uri.authority().map(|a| a.as_str()),
            authorization: req
                .headers
                .get(header::AUTHORIZATION)
                .map(HeaderValue::as_bytes),
            origin: text(header::ORIGIN),
            host: text(header::HOST),
            content_type: text(header::CONTENT_TYPE),
            accept: text(header::ACCEPT),
            mcp_session_id: text(MCP_SESSION_ID),
            mcp_protocol_version: http::single_field(
                (req.headers.get_all(MCP_PROTOCOL_VERSION).iter())
                    .map(|v| v.to_str().unwrap_or_default()),
            ),
            last_event_id: (req.headers).get(LAST_EVENT_ID).map(HeaderValue::as_bytes),
            mcp_fields: &mcp_fields,
            peer: Some(peer),
            user_agent: text(header::USER_AGENT),
            forwarded_for: &forwarded_for,
            traceparent: text(TRACEPARENT),
            tracestate: text(TRACESTATE),
        };
        if let Err(refused) = self.check_framing(&req, reads, &front.framing) {
            return self.misframed(peer, refused, front.gate.asked(&head)).await;
        }
        let admitted = match front.gate.admit(&head, unix_now()) {
            Ok(admitted) => admitted,
            Err(refused) => {
                debug!(%peer, reason = refused.rejection.as_str(), "refused");
                // Counted and audited like any request: a refused client waits for room
                // on the loop's queue as every other does.
                let (mut response, turned_away) = TurnedAway::by_gate(*refused);
                let _ = self.inputs.send(Input::Refused(turned_away)).await;
                // The body is read and dropped, as the blocking shell does: hyper closes a
                // connection whose body was left unread without saying so, and a client
                // reusing it (to retry with a token) would meet a closed socket. One the
                // client waits to send (100-continue) is not asked for.
                let expects_continue = (req.headers.get(header::EXPECT))
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
                let drained = !expects_continue
                    && matches!(
                        read_limited(body, front.max_body, front.framing.header_timeout).await,
                        Ok(Payload::Bytes(_))
                    );
                if !drained {
                    response
                        .headers
                        .push(("connection", Cow::Borrowed("close")));
                }
                return full(response);
            }
        };
        let body = match read_limited(body, front.max_body, front.framing.header_timeout).await {
            Ok(body) => body,
            Err(Unread::Misframed(refused)) => {
                return self.misframed(peer, refused, front.gate.asked(&head)).await
            }
            // The client left mid-body, as the blocking shell sees it: nothing to audit.
            Err(Unread::Left) => return full(FramingError::InvalidChunk.response()),
            // Or went silent in it: the connection closes, as the blocking shell closes it.
            Err(Unread::Silent) => return silent(),
        };
        let Some(request) = into_request(admitted, body).await else {
            return full(Rejection::BackendDown.response());
        };
        // hyper reads the socket while the answer is awaited (to see a client leave): with
        // the head let go (its fields are slices of the connection's read buffer), that
        // read reuses the buffer instead of allocating another.
        drop(req);
        match self.ask(request).await {
            Some(Reply::Full(response)) => answer(response, lines),
            Some(Reply::Stream(head, body)) => with_head(head, UnsyncBoxBody::new(body), lines),
            None => full(Rejection::BackendDown.response()),
        }
    }

    /// Hands `request` to the loop and waits for its answer; `None` when the loop is gone
    /// (the proxy is exiting). Dropped before the answer (hyper drops a handler whose
    /// client closed the connection), it tells the loop the client left.
    pub(crate) async fn ask(&self, request: Box<hub::Request>) -> Option<Reply> {
        let (reply, answer) = oneshot::channel();
        let ticket = switchboard_shell::pending::ticket();
        let input = Input::Request {
            request,
            reply,
            ticket,
        };
        self.inputs.send(input).await.ok()?;
        let waiting = Waiting {
            ticket,
            inputs: &self.inputs,
        };
        let answer = answer.await;
        std::mem::forget(waiting);
        answer.ok()
    }
}

/// A request handed to the loop and not answered yet; dropped unanswered (its client
/// left), it tells the loop so, without waiting (a full queue loses the notice: the
/// request is then answered into the void as before).
struct Waiting<'s> {
    ticket: u64,
    inputs: &'s mpsc::Sender<Input>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let _ = (self.inputs).try_send(Input::ClientLeft {
            ticket: self.ticket,
        });
    }
}

/// The framing rule a request broke when hyper refused its head itself (hyper answered it:
/// 400, 414 or 431, and closed): `None` for an end that refused no request (an HTTP/2
/// preface is closed on, a timeout or a client that left is no request).
fn hyper_refusal(e: &hyper::Error) -> Option<FramingError> {
    if !e.is_parse() || e.is_parse_version_h2() {
        return None;
    }
    if e.is_parse_too_large() {
        return Some(FramingError::HeadTooLarge);
    }
    let text = e.to_string();
    let refused = if text.contains("content-length") {
        FramingError::InvalidContentLength
    } else if text.contains("transfer-encoding") {
        FramingError::InvalidTransferEncoding
    } else if text.contains("URI too long") {
        FramingError::TargetTooLong
    } else {
        FramingError::MalformedHead
    };
    Some(refused)
}

impl Server {
    /// A request hyper refused before any of it reached a handler (its head did not parse):
    /// the hub is told, so it is audited as the blocking shell's framing refusals are (SPEC
    /// section 11: every refusal). Its method and target were not read.
    async fn refused_by_hyper(&self, peer: SocketAddr, refused: FramingError) {
        debug!(%peer, reason = refused.as_str(), "refused by hyper");
        let head = RequestHead {
            peer: Some(peer),
            ..RequestHead::default()
        };
        let asked = self.front.get().gate.asked(&head);
        let _ = (self.inputs)
            .send(Input::Refused(TurnedAway::by_framing(refused, asked)))
            .await;
    }

    /// A request the framing rules refused once its head was read: the hub is told (it
    /// audits the refusal) and the refusal answered.
    async fn misframed(
        &self,
        peer: SocketAddr,
        refused: FramingError,
        asked: switchboard_core::Asked,
    ) -> Response<ResponseBody> {
        debug!(%peer, reason = refused.as_str(), "refused");
        let _ = (self.inputs)
            .send(Input::Refused(TurnedAway::by_framing(refused, asked)))
            .await;
        full(refused.response())
    }

    /// The core's framing rules on the head hyper parsed (within `limits`), and the
    /// connection's pipelining count.
    fn check_framing(
        &self,
        req: &Parts,
        reads: &Reads,
        limits: &Limits,
    ) -> Result<(), FramingError> {
        let uri = &req.uri;
        let target_len = uri.scheme_str().map_or(0, |s| s.len() + 3)
            + uri.authority().map_or(0, |a| a.as_str().len())
            + uri.path_and_query().map_or(0, |p| p.as_str().len());
        let minor = u8::from(req.version != hyper::Version::HTTP_10);
        let headers = req
            .headers
            .iter()
            .map(|(name, value)| (name.as_str().as_bytes(), value.as_bytes()));
        framing::check_head(minor, target_len, headers, limits)?;
        let read_since_answer =
            reads.reads.load(Ordering::Acquire) > reads.at_answer.load(Ordering::Acquire);
        reads
            .pipeline
            .lock()
            .expect("pipeline")
            .request(read_since_answer, limits)
    }
}

/// The loop's input for `admitted` with its body admitted: a large body on the blocking
/// pool. `None` when that failed (the process is going down).
pub(crate) async fn into_request(admitted: Admitted, body: Payload) -> Option<Box<hub::Request>> {
    let inline = !matches!(&body, Payload::Bytes(bytes) if bytes.len() > INLINE_BODY);
    let admit = move || {
        let mut request = Box::new(admitted.into_request(body, entropy));
        request.seed_trace(entropy);
        request
    };
    if inline {
        return Some(admit());
    }
    tokio::task::spawn_blocking(admit).await.ok()
}

/// `work`'s output, or `None` if it took longer than `limit`. Work done at once (the usual
/// case: a body that came with its head, a write the socket takes) arms no timer.
pub(crate) async fn within<F: Future>(limit: Duration, work: F) -> Option<F::Output> {
    let mut work = std::pin::pin!(work);
    match std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await {
        Poll::Ready(output) => Some(output),
        Poll::Pending => tokio::time::timeout(limit, work).await.ok(),
    }
}

/// Why a request's body was not read whole.
enum Unread {
    /// hyper could not decode it (a bad chunk, trailers that do not parse).
    Misframed(FramingError),
    /// The client closed the connection in it.
    Left,
    /// Nothing of it came for as long as a request head may take (`--header-timeout`).
    Silent,
}

/// The body, or [`Payload::TooLarge`] past `limit` (by header, or counted as it arrives
/// for chunked bodies): no more than `limit` bytes are ever held, and no read waits longer
/// than `idle` (so a client that sends a head and then nothing holds no connection). A
/// body not read whole is refused: a request is forwarded only once its whole body was
/// framed correctly.
async fn read_limited(mut body: Incoming, limit: usize, idle: Duration) -> Result<Payload, Unread> {
    use hyper::body::Body as _;
    if body.size_hint().lower() > limit as u64 {
        return Ok(Payload::TooLarge);
    }
    let mut buf = Vec::new();
    loop {
        // A frame already here (a small body comes with its head) needs no timer.
        let next = within(idle, body.frame()).await.ok_or(Unread::Silent)?;
        let Some(frame) = next else {
            break;
        };
        let frame = frame.map_err(|e| match e.is_incomplete_message() {
            true => Unread::Left,
            false => Unread::Misframed(FramingError::InvalidChunk),
        })?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Ok(Payload::TooLarge);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Payload::Bytes(buf))
}

/// What a connection's service knows of its socket: how often it was read, how often by
/// the time an answer was last written (a request read with no read since came from bytes
/// the client sent before reading that answer: pipelined), and its [`Pipeline`] count.
#[derive(Default)]
struct Reads {
    reads: AtomicU64,
    at_answer: AtomicU64,
    pipeline: Mutex<Pipeline>,
}

/// A connection's socket, counting its reads and marking its writes in [`Reads`]; its
/// first bytes read before hyper took it (crate::direct) come first.
struct Counted {
    prefix: Bytes,
    io: TcpStream,
    reads: Arc<Reads>,
    /// Since when writes have moved nothing (armed only when one must wait): past
    /// [`STALLED_WRITE`](switchboard_shell::STALLED_WRITE) the connection ends, or a client
    /// that never reads an answer or a stream would keep it for ever.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Counted {
    fn wrote(&self) {
        let reads = self.reads.reads.load(Ordering::Acquire);
        self.reads.at_answer.store(reads, Ordering::Release);
    }

    /// A write's outcome, `polled`, with the stall rule: one that went through disarms
    /// it; one that must wait fails once writes have moved nothing for the stall time.
    fn progress(
        &mut self,
        polled: Poll<std::io::Result<usize>>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<usize>> {
        match polled {
            Poll::Ready(Ok(n)) => {
                self.stalled = None;
                self.wrote();
                Poll::Ready(Ok(n))
            }
            Poll::Pending => {
                let stalled = switchboard_shell::STALLED_WRITE;
                let since =
                    (self.stalled).get_or_insert_with(|| Box::pin(tokio::time::sleep(stalled)));
                match since.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::ErrorKind::TimedOut.into())),
                    Poll::Pending => Poll::Pending,
                }
            }
            failed => failed,
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix.split_to(n));
            if self.prefix.is_empty() {
                // Its buffer goes with its last byte.
                self.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.reads.reads.fetch_add(1, Ordering::AcqRel);
        }
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.progress(polled, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.progress(polled, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The answer to a request whose body stopped coming: 408, and the connection closes.
fn silent() -> Response<ResponseBody> {
    let mut response = Response::new(UnsyncBoxBody::new(Full::new(Bytes::new())));
    *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
    (response.headers_mut()).insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A core response, copied onto the wire (constants are borrowed, not copied).
fn full(response: http::Response) -> Response<ResponseBody> {
    answer(response, 0)
}

/// [`full`], for a request of `lines` header lines (see [`with_head`]).
fn answer(mut response: http::Response, lines: usize) -> Response<ResponseBody> {
    let body = match std::mem::take(&mut response.body) {
        Cow::Borrowed(bytes) => Bytes::from_static(bytes),
        Cow::Owned(bytes) => Bytes::from(bytes),
    };
    with_head(response, UnsyncBoxBody::new(Full::new(body)), lines)
}

/// The header lines a map gets on its first insert (the `http` crate's own start).
const FIRST_ROOM: usize = 6;
/// The most header lines an answer's map is given room for: what an idle connection may
/// keep of a request with many more is no more than what a usual one keeps.
const MOST_ROOM: usize = 16;

/// The answer to a request of `lines` header lines. hyper reads the connection's next
/// request into its last answer's header map: room for as many lines as this request had
/// (a client sends the same ones each time; an SDK 8-12, a 2026-07-28 request its `Mcp-*`
/// fields too) spares the next request a map grown anew.
fn with_head(head: http::Response, body: ResponseBody, lines: usize) -> Response<ResponseBody> {
    let mut response = Response::new(body);
    response
        .headers_mut()
        .reserve(lines.clamp(FIRST_ROOM, MOST_ROOM));
    *response.status_mut() =
        StatusCode::from_u16(head.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in head.headers {
        let value = match value {
            Cow::Borrowed(text) => Ok(HeaderValue::from_static(text)),
            Cow::Owned(text) => HeaderValue::from_maybe_shared(Bytes::from(text)),
        };
        if let Ok(value) = value {
            response
                .headers_mut()
                .append(HeaderName::from_static(name), value);
        }
    }
    response
}

/// Seconds since the Unix epoch, for token expiry.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A client that reads nothing: writes to it fail once they have moved nothing for the
    /// stall time (the clock is paused and moves on by itself while all waits).
    #[tokio::test(start_paused = true)]
    async fn a_write_that_moves_nothing_fails_after_the_stall_time() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).await;
        let (io, _) = listener.accept().await.expect("accept");
        let mut counted = Counted {
            prefix: Bytes::new(),
            io,
            reads: Arc::default(),
            stalled: None,
        };
        let started = tokio::time::Instant::now();
        let chunk = vec![b'x'; 64 * 1024];
        let failed = loop {
            if let Err(error) = counted.write(&chunk).await {
                break error;
            }
        };
        assert_eq!(failed.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= switchboard_shell::STALLED_WRITE);
        drop(client);
    }
}
