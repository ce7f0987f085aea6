//! HTTP: an accept thread starts a thread per connection; the connection's thread reads
//! each request head with `httparse` (the parser hyper uses) under the core's framing
//! limits and header-read timeout, checks it with [`framing::check_head`], lets the core's
//! gate say who is asking and what for, reads the body strictly (a chunked one with the
//! core's [`ChunkedBody`]) within `--max-body`, hands the request to the owner loop, waits
//! for its answer and writes it; then the next request, so a connection's answers go out in
//! the order it asked. A stream's answer turns the connection's thread into the stream's
//! writer ([`session::serve`]). Every status, header and body comes from the core.
//!
//! Why not tiny_http, which this shell used before: it reads request heads without any
//! bound on their size, header count or time (one header line of 256 MiB held 300 MiB;
//! half-sent heads held a thread each for good), takes any `Transfer-Encoding` as chunked,
//! reads an invalid `Content-Length` as 0 and keeps such a connection alive, reads ahead
//! every pipelined request, and exposes no hook where a strict parser or a timeout could
//! sit under it: its accept thread owns the sockets and parses before we see a byte.
//!
//! A connection is read only while it has no request under way, and only into a buffer of
//! at most the head limit (or the body being read), so memory per connection is bounded;
//! a head that does not arrive within `--header-timeout` ends the connection and its
//! thread. After any framing refusal the connection is closed, so nothing after it is read.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use switchboard_core::framing::{
    self, BodyLength, ChunkedBody, Framing, FramingError, Pipeline, H2_PREFACE,
};
use switchboard_core::http::{self, RequestHead};
use switchboard_core::hub::{Payload, TurnedAway};
use switchboard_core::Front;
use switchboard_core::{Rejection, StreamId};
use switchboard_shell::head::Lines;
use switchboard_shell::{entropy, Shared};
use tracing::{debug, warn};

use crate::session;
use crate::supervisor::{Input, Reply};

/// Stack of a connection's thread: it admits requests (token checks included) and may
/// become a stream's writer.
const CONNECTION_STACK: usize = 256 * 1024;
/// Bytes read from a socket at a time.
const READ_CHUNK: usize = 8 * 1024;
/// How long an answer may take to be taken by a client that stopped reading.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a connection waiting for its answer looks whether its client left.
const CLIENT_CHECK: Duration = Duration::from_millis(200);
/// How long to wait after a failed accept, and how many failures in a row make one log line.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
const ACCEPT_FAILURES_LOGGED_EVERY: u32 = 20;

/// What every connection shares.
pub struct Server {
    /// The gate and limits, replaced whole by a reload (each connection takes the one in
    /// force for each request).
    pub front: Arc<Shared<Front>>,
    pub inputs: Sender<Input>,
    pub closed: Sender<StreamId>,
    /// Requests handed to the loop and not yet answered on the wire, so exit can let their
    /// answers out first.
    pub busy: AtomicUsize,
    /// Set once the proxy stops accepting: connections close after their answer.
    pub stopping: AtomicBool,
    /// Connections served (a thread each).
    pub connections: AtomicUsize,
    /// Connections served at once, at most: within the host's threads (a thread each, some
    /// kept for the loop, the backend and key fetches). Past it a new connection is answered
    /// 503 and closed, and the process can still start the threads a backend restart or a
    /// key fetch needs.
    pub max_connections: usize,
}

/// A connection's place in [`Server::connections`], given back when its thread ends.
struct Place(Arc<Server>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The listening socket, shared by the accept thread and whoever stops it.
pub struct Listening {
    socket: TcpListener,
    server: Arc<Server>,
}

impl Listening {
    pub fn new(socket: TcpListener, server: Arc<Server>) -> Self {
        Listening { socket, server }
    }

    /// Stops taking connections (answers under way still go out).
    pub fn stop(&self) {
        self.server.stopping.store(true, Ordering::Release);
        // SAFETY: shutdown on our own listening descriptor only wakes the blocked accept
        // (it then fails); a failure leaves it blocked until the process exits.
        unsafe {
            libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR);
        }
    }

    /// Accepts connections until [`Listening::stop`], a thread for each.
    pub fn serve(&self) {
        let mut failures = 0u32;
        loop {
            let (socket, peer) = match self.socket.accept() {
                Ok(accepted) => accepted,
                Err(_) if self.server.stopping.load(Ordering::Acquire) => return,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    if failures.is_multiple_of(ACCEPT_FAILURES_LOGGED_EVERY) {
                        warn!("accept failed ({} in a row): {e}", failures + 1);
                    }
                    failures = failures.saturating_add(1);
                    thread::sleep(ACCEPT_RETRY);
                    continue;
                }
            };
            if failures > 0 {
                warn!("accepting connections again after {failures} failed accepts");
                failures = 0;
            }
            let _ = socket.set_nodelay(true);
            let server = self.server.clone();
            let served = server.connections.fetch_add(1, Ordering::AcqRel);
            let place = Place(server.clone());
            if served >= server.max_connections {
                drop(place);
                self.unserved(socket);
                continue;
            }
            // The socket goes to the thread once it runs, so that a failed start still has it.
            let (give, take) = crossbeam_channel::bounded::<TcpStream>(1);
            let spawned = thread::Builder::new()
                .name("conn".into())
                .stack_size(CONNECTION_STACK)
                .spawn(move || {
                    let _place = place;
                    if let Ok(socket) = take.recv() {
                        Connection::new(&server, socket, peer).run();
                    }
                });
            match spawned {
                Ok(_) => {
                    let _ = give.send(socket);
                }
                Err(e) => {
                    warn!("cannot start a connection thread: {e}");
                    self.unserved(socket);
                }
            }
        }
    }
}

impl Listening {
    /// A connection no thread could be started for: the hub's answer (a 503) is written
    /// without reading its request, and it is closed. Nothing here waits long: the loop
    /// is asked without blocking and answers at once, or the connection is just closed.
    fn unserved(&self, mut socket: TcpStream) {
        let (reply, answer) = crossbeam_channel::bounded(1);
        if self
            .server
            .inputs
            .try_send(Input::Unserved { reply })
            .is_err()
        {
            return;
        }
        if let Ok(Reply::Full(response)) = answer.recv_timeout(UNSERVED_WAIT) {
            let _ = socket.set_write_timeout(Some(Duration::from_millis(100)));
            let _ = socket.write_all(&response_bytes(&response, true, false));
        }
    }
}

/// How long the accept thread waits for the loop's answer to a connection it cannot serve.
const UNSERVED_WAIT: Duration = Duration::from_secs(1);

impl Server {
    /// Waits (at most `within`) for requests under way to be answered.
    pub fn drain(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.busy.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Why a connection stops reading requests.
enum Stop {
    /// The client left, went quiet past the timeout, or opened with the HTTP/2 preface:
    /// close without an answer.
    Close,
    /// Answer this refusal, then close.
    Refuse(FramingError),
}

/// A request head as `httparse` read it.
struct Head {
    method: String,
    target: String,
    minor: u8,
    headers: Vec<(String, Vec<u8>)>,
}

/// One client connection on its own thread.
struct Connection<'s> {
    server: &'s Arc<Server>,
    socket: TcpStream,
    peer: SocketAddr,
    /// Bytes read and not yet consumed.
    buf: Vec<u8>,
    /// Whether the socket was read since the last answer was written.
    read_since_answer: bool,
    pipeline: Pipeline,
    /// The gate and limits for the request being read.
    front: Arc<Front>,
}

impl<'s> Connection<'s> {
    fn new(server: &'s Arc<Server>, socket: TcpStream, peer: SocketAddr) -> Self {
        let _ = socket.set_write_timeout(Some(WRITE_TIMEOUT));
        Connection {
            server,
            socket,
            peer,
            buf: Vec::with_capacity(READ_CHUNK),
            read_since_answer: true,
            pipeline: Pipeline::default(),
            front: server.front.get(),
        }
    }

    /// Serves requests until the connection closes.
    fn run(mut self) {
        loop {
            self.front = self.server.front.get();
            let deadline = Instant::now() + self.front.framing.header_timeout;
            let served = self.read_head(deadline).and_then(|head| self.serve(head));
            match served {
                Ok(true) => continue,
                Ok(false) | Err(Stop::Close) => return,
                Err(Stop::Refuse(refused)) => {
                    debug!(peer = %self.peer, reason = refused.as_str(), "refused");
                    self.write(&refused.response(), true, false);
                    return;
                }
            }
        }
    }

    /// One request from its parsed head to its answer; true when the connection may carry
    /// another.
    fn serve(&mut self, head: Head) -> Result<bool, Stop> {
        let limits = self.front.framing;
        let lines = Lines(&head.headers);
        let gathered = lines.gathered();
        let request_head = lines.request_head(&gathered, (&head.method, &head.target), self.peer);
        let headers = head
            .headers
            .iter()
            .map(|(name, value)| (name.as_bytes(), value.as_slice()));
        let framing = (self.pipeline)
            .request(self.read_since_answer, &limits)
            .and_then(|()| framing::check_head(head.minor, head.target.len(), headers, &limits))
            .map_err(|refused| self.misframed(Stop::Refuse(refused), &request_head))?;
        let no_body = head.method == "HEAD";
        let admitted = match self.front.gate.admit(&request_head, unix_now()) {
            Ok(admitted) => admitted,
            Err(refused) => {
                debug!(peer = %self.peer, reason = refused.rejection.as_str(), "refused");
                // Counted and audited like any request: a refused client waits for room
                // on the loop's queue as every other does.
                let (response, turned_away) = TurnedAway::by_gate(*refused);
                let _ = self.server.inputs.send(Input::Refused(turned_away));
                // The body is read and dropped, so the next request starts where it ends;
                // one the client waits to send (100-continue) is not asked for.
                let keep = framing.keep_alive
                    && !framing.expect_continue
                    && self.read_body(&framing)?.is_some();
                return Ok(self.write(&response, !keep, no_body));
            }
        };
        let body = self.read_body(&framing);
        let body = body.map_err(|stop| self.misframed(stop, &request_head))?;
        let (payload, keep) = match body {
            Some(body) => (Payload::Bytes(body), framing.keep_alive),
            // Not read: nothing more can be read from this connection.
            None => (Payload::TooLarge, false),
        };
        let (reply, answer) = crossbeam_channel::bounded(1);
        let ticket = switchboard_shell::pending::ticket();
        let mut request = Box::new(admitted.into_request(payload, entropy));
        request.seed_trace(entropy);
        let input = Input::Request {
            request,
            reply,
            ticket,
        };
        self.server.busy.fetch_add(1, Ordering::AcqRel);
        // Blocks while the loop's inputs are full: the loop never waits on a connection.
        let reply = match self.server.inputs.send(input) {
            Ok(()) => self.await_answer(&answer, ticket),
            Err(_) => Ok(None),
        };
        let Ok(reply) = reply else {
            self.server.busy.fetch_sub(1, Ordering::AcqRel);
            return Err(Stop::Close);
        };
        // The loop ended without answering: the proxy is exiting.
        let reply = reply.unwrap_or_else(|| Reply::Full(Rejection::BackendDown.response()));
        match reply {
            Reply::Full(response) => {
                let open = self.write(&response, !keep, no_body);
                self.server.busy.fetch_sub(1, Ordering::AcqRel);
                Ok(open)
            }
            Reply::Stream(head, body) => {
                self.server.busy.fetch_sub(1, Ordering::AcqRel);
                let socket = self.socket.try_clone().map_err(|_| Stop::Close)?;
                session::serve(socket, &head, &body, &self.server.closed);
                Ok(false)
            }
        }
    }

    /// A request the framing rules refused once its head was read: the hub is told (it
    /// audits the refusal); the caller answers it. Any other stop passes through.
    fn misframed(&self, stop: Stop, head: &RequestHead<'_>) -> Stop {
        if let Stop::Refuse(refused) = stop {
            let asked = self.front.gate.asked(head);
            let turned_away = TurnedAway::by_framing(refused, asked);
            let _ = self.server.inputs.send(Input::Refused(turned_away));
        }
        stop
    }

    /// The loop's answer (`None`: the loop ended without one), watching the client
    /// meanwhile: one that closes its connection first is reported to the loop with the
    /// request's `ticket` (`Err`: nobody is left to answer).
    fn await_answer(&self, answer: &Receiver<Reply>, ticket: u64) -> Result<Option<Reply>, ()> {
        loop {
            match answer.recv_timeout(CLIENT_CHECK) {
                Ok(reply) => return Ok(Some(reply)),
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
                Err(RecvTimeoutError::Timeout) if self.client_gone() => {
                    let _ = self.server.inputs.send(Input::ClientLeft { ticket });
                    return Err(());
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Whether the client closed its connection (or it broke): a read would end it.
    /// Bytes it sent meanwhile (a pipelined request) are left for later.
    fn client_gone(&self) -> bool {
        if self.socket.set_nonblocking(true).is_err() {
            return false;
        }
        let gone = match self.socket.peek(&mut [0u8; 1]) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ),
        };
        let _ = self.socket.set_nonblocking(false);
        gone
    }

    /// Reads the next request head within `deadline`.
    fn read_head(&mut self, deadline: Instant) -> Result<Head, Stop> {
        let limits = self.front.framing;
        loop {
            if !self.buf.is_empty() {
                let mut headers = vec![httparse::EMPTY_HEADER; limits.max_headers];
                let mut request = httparse::Request::new(&mut headers);
                match request.parse(&self.buf) {
                    Ok(httparse::Status::Complete(len)) if len <= limits.max_head => {
                        let head = Head {
                            method: request.method.unwrap_or_default().to_owned(),
                            target: request.path.unwrap_or_default().to_owned(),
                            minor: request.version.unwrap_or_default(),
                            headers: request
                                .headers
                                .iter()
                                .map(|h| (h.name.to_owned(), h.value.to_owned()))
                                .collect(),
                        };
                        self.buf.drain(..len);
                        return Ok(head);
                    }
                    Ok(httparse::Status::Partial) if self.buf.len() < limits.max_head => {}
                    Ok(_) | Err(httparse::Error::TooManyHeaders) => {
                        return Err(Stop::Refuse(FramingError::HeadTooLarge))
                    }
                    // As hyper: the whole HTTP/2 preface is closed on, anything else refused.
                    Err(_) if self.buf.starts_with(H2_PREFACE) => return Err(Stop::Close),
                    Err(_) => return Err(Stop::Refuse(FramingError::MalformedHead)),
                }
            }
            self.read_more(deadline)?;
        }
    }

    /// The body as `framing` delimits it, or `None` when it is over `--max-body` (then it
    /// is not read). A body that is not framed correctly is refused.
    fn read_body(&mut self, framing: &Framing) -> Result<Option<Vec<u8>>, Stop> {
        let limit = self.front.max_body;
        match framing.body {
            BodyLength::Length(0) => return Ok(Some(Vec::new())),
            BodyLength::Length(n) if n > limit as u64 => return Ok(None),
            _ => {}
        }
        if framing.expect_continue {
            self.socket
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .map_err(|_| Stop::Close)?;
        }
        match framing.body {
            BodyLength::Length(n) => {
                // Checked against the limit above.
                let n = n as usize;
                while self.buf.len() < n {
                    self.read_more(self.idle_deadline())?;
                }
                Ok(Some(self.buf.drain(..n).collect()))
            }
            BodyLength::Chunked => {
                let mut chunked = ChunkedBody::default();
                let mut body = Vec::new();
                loop {
                    let used = chunked
                        .decode(&self.buf, &mut body, &self.front.framing)
                        .map_err(Stop::Refuse)?;
                    self.buf.drain(..used);
                    if body.len() > limit {
                        return Ok(None);
                    }
                    if chunked.is_done() {
                        return Ok(Some(body));
                    }
                    self.read_more(self.idle_deadline())?;
                }
            }
        }
    }

    /// While a body arrives, each read may wait as long as a head may.
    fn idle_deadline(&self) -> Instant {
        Instant::now() + self.front.framing.header_timeout
    }

    /// Reads what the client sent next (at most [`READ_CHUNK`]) by `deadline`.
    fn read_more(&mut self, deadline: Instant) -> Result<(), Stop> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Stop::Close);
        }
        let _ = self.socket.set_read_timeout(Some(left));
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            match self.socket.read(&mut chunk) {
                Ok(0) => return Err(Stop::Close),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    self.read_since_answer = true;
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // Timed out or broken.
                Err(_) => return Err(Stop::Close),
            }
        }
    }

    /// Writes `response`, with `Connection: close` when `close` (or when it says so
    /// itself) and without its body when it answers a HEAD; true when the connection
    /// stays open for another request.
    fn write(&mut self, response: &http::Response, close: bool, no_body: bool) -> bool {
        let close =
            close || framing::closes(response) || self.server.stopping.load(Ordering::Acquire);
        let written = self
            .socket
            .write_all(&response_bytes(response, close, no_body));
        self.read_since_answer = false;
        if let Err(e) = &written {
            debug!(peer = %self.peer, "response not delivered: {e}");
        }
        if close || written.is_err() {
            let _ = self.socket.shutdown(Shutdown::Write);
            return false;
        }
        true
    }
}

/// A core response as HTTP/1.1 bytes.
fn response_bytes(response: &http::Response, close: bool, no_body: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + response.body.len());
    out.extend_from_slice(
        format!(
            "HTTP/1.1 {} {}\r\n",
            response.status,
            reason(response.status)
        )
        .as_bytes(),
    );
    for (name, value) in &response.headers {
        if !name.eq_ignore_ascii_case("connection") {
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
    }
    out.extend_from_slice(format!("content-length: {}\r\n", response.body.len()).as_bytes());
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !no_body {
        out.extend_from_slice(&response.body);
    }
    out
}

/// The reason phrase of the statuses the core answers with.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        409 => "Conflict",
        413 => "Payload Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// Seconds since the Unix epoch, for token expiry.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
