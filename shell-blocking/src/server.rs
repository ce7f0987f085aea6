//! HTTP: tiny_http accepts and parses (a thread per connection); a pool of handler threads
//! that grows when all are busy lets the core's gate say who is asking and what for, reads
//! the body within the limit, hands the request to the owner loop and copies its answer
//! onto the wire. Every status, header and body comes from the core.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use switchboard_core::http::{self, Gate, RequestHead};
use switchboard_core::hub::Payload;
use switchboard_core::{Rejection, StreamId};
use tiny_http::{Header, Request};
use tracing::{debug, warn};

use crate::session;
use crate::supervisor::{Input, Reply};

/// How soon after a request the pool is nudged, and how often while requests keep coming.
const NUDGE_EVERY: Duration = Duration::from_millis(50);
/// How long nudging goes on after the last request.
const NUDGE_FOR: Duration = Duration::from_secs(1);
/// Throwaway connections per nudge.
const NUDGES: usize = 4;

/// Handler threads taking requests at once; requests beyond wait in the queue. A thread
/// waiting for its answer (a JSON answer may take up to `--request-timeout`) has left this
/// count, so waiting requests never starve new ones; a thread the OS refuses is a 503.
const MAX_HANDLERS: usize = 512;
/// Idle handler threads kept for the next burst (after a crowd of JSON waits); more end.
const MAX_IDLE: usize = MAX_HANDLERS;
const HANDLER_STACK: usize = 256 * 1024;

/// The handler threads, as [`Server::serve`] sizes them.
#[derive(Default)]
struct Pool {
    /// Threads waiting for a request.
    idle: AtomicUsize,
    /// Threads taking requests (idle or handling one), not waiting for an answer.
    taking: AtomicUsize,
}

/// What every handler shares.
pub struct Server {
    pub gate: Gate,
    pub max_body: usize,
    pub inputs: Sender<Input>,
    pub closed: Sender<StreamId>,
    /// Requests being handled now, so exit can let their answers out first.
    pub busy: AtomicUsize,
    /// The port connections arrive on (to find a stream's own socket by).
    pub local_port: u16,
    /// Told of every request, for [`nudge`].
    pub activity: Sender<()>,
}

impl Server {
    /// Takes requests from tiny_http until it is unblocked, handing each to an idle
    /// handler thread, starting one more when none is idle, so a slow client never holds
    /// up the others.
    pub fn serve(self: Arc<Self>, http: Arc<tiny_http::Server>) {
        let (queue, requests) = crossbeam_channel::unbounded::<Request>();
        let pool = Arc::new(Pool::default());
        while let Ok(request) = http.recv() {
            let _ = self.activity.try_send(());
            if pool.idle.load(Ordering::Acquire) == 0
                && pool.taking.load(Ordering::Acquire) < MAX_HANDLERS
                && !self.clone().spawn_handler(requests.clone(), pool.clone())
                && pool.taking.load(Ordering::Acquire) == 0
            {
                // No thread at all to answer it: refuse rather than leave it waiting.
                respond(request, Rejection::BackendBusy.response());
                continue;
            }
            if queue.send(request).is_err() {
                return;
            }
        }
    }

    /// Waits (at most `within`) for requests under way to be answered.
    pub fn drain(&self, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        while self.busy.load(Ordering::Acquire) > 0 && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts one more handler thread; false when the OS refused one.
    fn spawn_handler(self: Arc<Self>, requests: Receiver<Request>, pool: Arc<Pool>) -> bool {
        pool.taking.fetch_add(1, Ordering::AcqRel);
        let thread_pool = pool.clone();
        let spawned = thread::Builder::new()
            .name("http".into())
            .stack_size(HANDLER_STACK)
            .spawn(move || {
                let pool = thread_pool;
                loop {
                    pool.idle.fetch_add(1, Ordering::AcqRel);
                    let Ok(request) = requests.recv() else { break };
                    pool.idle.fetch_sub(1, Ordering::AcqRel);
                    self.busy.fetch_add(1, Ordering::AcqRel);
                    if let Some((request, answer)) = self.handle(request) {
                        // Out of the pool while the answer is awaited (a JSON answer may
                        // take up to --request-timeout); a request already queued behind
                        // gets a thread of its own.
                        pool.taking.fetch_sub(1, Ordering::AcqRel);
                        if pool.idle.load(Ordering::Acquire) < requests.len() {
                            self.clone().spawn_handler(requests.clone(), pool.clone());
                        }
                        let answer = answer.recv();
                        pool.taking.fetch_add(1, Ordering::AcqRel);
                        self.answer(request, answer);
                    }
                    self.busy.fetch_sub(1, Ordering::AcqRel);
                    if pool.idle.load(Ordering::Acquire) >= MAX_IDLE {
                        break;
                    }
                }
                pool.taking.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = &spawned {
            pool.taking.fetch_sub(1, Ordering::AcqRel);
            warn!("cannot start a handler thread: {e}");
        }
        spawned.is_ok()
    }

    /// Admits `request` and hands it to the owner loop, returning it with the channel its
    /// answer comes on; answers it at once when refused.
    fn handle(&self, mut request: Request) -> Option<(Request, Receiver<Reply>)> {
        let headers = request.headers();
        let header = |name: &'static str| {
            headers
                .iter()
                .find(|h| h.field.equiv(name))
                .map(|h| h.value.as_str())
        };
        let head = RequestHead {
            method: request.method().as_str(),
            target: request.url(),
            authority: None,
            authorization: header("Authorization").map(str::as_bytes),
            origin: header("Origin"),
            host: header("Host"),
            content_type: header("Content-Type"),
            accept: header("Accept"),
            mcp_session_id: header("Mcp-Session-Id"),
            mcp_protocol_version: header("MCP-Protocol-Version"),
        };
        let admitted = match self.gate.admit(&head, unix_now()) {
            Ok(admitted) => admitted,
            Err(refused) => {
                debug!(reason = refused.rejection.as_str(), "refused");
                // Counting is best effort: never wait on the loop for it.
                let _ = self.inputs.try_send(Input::Refused(refused.rejection));
                respond(request, refused.response);
                return None;
            }
        };
        let body = read_limited(&mut request, self.max_body);
        let (reply, answer) = crossbeam_channel::bounded(1);
        let input = Input::Request {
            request: admitted.into_request(body, entropy),
            reply,
        };
        if self.inputs.send(input).is_err() {
            respond(request, Rejection::BackendDown.response());
            return None;
        }
        Some((request, answer))
    }

    /// Copies the loop's answer to `request` onto the wire, or hands the connection to its
    /// stream's writer.
    fn answer(&self, request: Request, answer: Result<Reply, crossbeam_channel::RecvError>) {
        match answer {
            Ok(Reply::Full(response)) => respond(request, response),
            Ok(Reply::Stream(head, body)) => {
                if let Err(request) =
                    session::serve(request, head, body, self.local_port, self.closed.clone())
                {
                    respond(*request, Rejection::TooManySessions.response());
                }
            }
            // The loop ended without answering: the proxy is exiting.
            Err(_) => respond(request, Rejection::BackendDown.response()),
        }
    }
}

/// Works around a lost wake-up in tiny_http 0.12's connection pool: when connections arrive
/// in a burst, the pool may notify a thread that is already awake, and a connection then
/// waits in its queue until some pool thread finishes a task, which an SSE stream or an
/// idle keep-alive connection never does. So while requests arrive (and for a second
/// after), every [`NUDGE_EVERY`] a few throwaway connections to our own port give the pool
/// tasks that end at once; each pool thread that takes one goes on to the oldest waiting
/// connection. Idle, the proxy makes none.
pub fn nudge(addr: SocketAddr, activity: Receiver<()>) {
    let addr = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::from((Ipv4Addr::LOCALHOST, addr.port()))
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::from((Ipv6Addr::LOCALHOST, addr.port()))
        }
        _ => addr,
    };
    while activity.recv().is_ok() {
        let mut until = Instant::now() + NUDGE_FOR;
        while Instant::now() < until {
            thread::sleep(NUDGE_EVERY);
            for _ in 0..NUDGES {
                // Refused or slow: the pool is not starving for lack of connections then.
                let _ = TcpStream::connect_timeout(&addr, NUDGE_EVERY);
            }
            if activity.try_recv().is_ok() {
                until = Instant::now() + NUDGE_FOR;
            }
        }
    }
}

/// The body, or [`Payload::TooLarge`] past `limit` (by header, or counted as it arrives
/// for chunked bodies): no more than `limit` bytes are ever held.
fn read_limited(request: &mut Request, limit: usize) -> Payload {
    if request.body_length().is_some_and(|n| n > limit) {
        return Payload::TooLarge;
    }
    let mut body = Vec::new();
    let read = request
        .as_reader()
        .take(limit as u64 + 1)
        .read_to_end(&mut body);
    if read.is_ok() && body.len() > limit {
        return Payload::TooLarge;
    }
    // A broken body is judged by what arrived, like a malformed one.
    Payload::Bytes(body)
}

/// 16 bytes from the OS for the id of a session the request may create.
fn entropy() -> [u8; 16] {
    let mut random = [0u8; 16];
    getrandom::fill(&mut random).expect("the OS random source works");
    random
}

/// A core response, copied onto the wire.
fn respond(request: Request, response: http::Response) {
    let mut out = tiny_http::Response::from_data(response.body.into_owned())
        .with_status_code(response.status);
    for (name, value) in &response.headers {
        if let Ok(header) = Header::from_bytes(name.as_bytes(), value.as_bytes()) {
            out.add_header(header);
        }
    }
    if let Err(e) = request.respond(out) {
        debug!("response not delivered: {e}");
    }
}

/// Seconds since the Unix epoch, for token expiry.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
