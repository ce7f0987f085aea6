//! HTTP: tiny_http accepts and parses (a thread per connection); a pool of handler threads
//! that grows when all are busy lets the core's gate say who is asking and what for, reads
//! the body within the limit and hands the request to the owner loop, and copies the
//! loop's answers onto the wire. No handler waits for an answer: the request travels to the
//! loop and comes back with its answer as the next piece of work for any handler, so a
//! busy pool runs without sleeping between requests and a JSON answer that takes up to
//! `--request-timeout` holds no handler thread (only tiny_http's connection thread waits).
//! A request whose body tiny_http already read goes to the loop straight from the accept
//! thread while the handlers have nothing waiting: one hand-off fewer. Every status, header and body comes from the core.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use switchboard_core::http::{self, Gate, RequestHead};
use switchboard_core::hub::Payload;
use switchboard_core::{Rejection, StreamId};
use tiny_http::{Header, Request};
use tracing::{debug, error, warn};

use crate::session;
use crate::supervisor::{Input, Reply};

/// How soon after a request the pool is nudged, and how often while requests keep coming.
const NUDGE_EVERY: Duration = Duration::from_millis(50);
/// How long nudging goes on after the last request.
const NUDGE_FOR: Duration = Duration::from_secs(1);
/// Throwaway connections per nudge.
const NUDGES: usize = 4;

// Listening again after tiny_http's accept thread panicked, and making a server whose
// thread may be refused, both rely on panics unwinding.
#[cfg(panic = "abort")]
compile_error!("switchboard-blocking needs panic = \"unwind\" (see `Listening`)");

/// How often the watcher looks whether tiny_http's accept thread is still there.
const WATCH_EVERY: Duration = Duration::from_millis(250);
/// Descriptors that must be free before a new server listens (each accepted connection
/// takes two), so that it does not die of the same shortage at once.
const MIN_FREE_DESCRIPTORS: usize = 16;
/// The least time between two restarts, doubling while they keep coming up to the most;
/// back to the least after a calm spell without one.
const RELISTEN_FIRST: Duration = Duration::from_secs(1);
const RELISTEN_MAX: Duration = Duration::from_secs(4);
const RELISTEN_CALM: Duration = Duration::from_secs(60);

/// Requests a connection may pipeline behind the one under way before it is cut, and how
/// long what a cut connection still brings is dropped.
const MAX_PIPELINED: usize = 32;
const CUT_REMEMBERED: Duration = Duration::from_secs(5);

/// Handler threads at most. A handler is held only by a client that is slow to send its
/// body or to read its answer, or while the loop's inputs are full; past this many, work
/// (new requests and answers alike) waits in the queue.
const MAX_HANDLERS: usize = 512;
/// Idle handler threads kept for the next burst; more end.
const MAX_IDLE: usize = 64;
const HANDLER_STACK: usize = 256 * 1024;

/// The handler threads, as they start and end each other.
#[derive(Default)]
struct Pool {
    /// Threads waiting for work.
    idle: AtomicUsize,
    /// Threads running.
    threads: AtomicUsize,
}

/// What every handler shares.
pub struct Server {
    pub gate: Gate,
    pub max_body: usize,
    pub inputs: Sender<Input>,
    pub closed: Sender<StreamId>,
    /// Requests taken from tiny_http and not yet answered (queued, being admitted, with the
    /// loop, or being written), so exit can let their answers out first.
    pub busy: AtomicUsize,
    /// The port connections arrive on (to find a stream's own socket by).
    pub local_port: u16,
    /// Told of every request, for [`nudge`].
    pub activity: Sender<()>,
    /// Client connections with a request under way, and the requests pipelined behind it.
    pub connections: Mutex<HashMap<SocketAddr, Connection>>,
    /// The handlers' queue: requests from the accept threads, and those that waited behind
    /// another on their connection.
    pub work: Sender<Work>,
}

/// A client connection with a request under way. tiny_http writes a connection's answers
/// in order, each waiting for the one before: were pipelined requests handled side by
/// side, the handlers of later ones would wait for an earlier answer that no free handler
/// is left to write. So a connection has one request under way at a time (as with hyper),
/// the rest wait here, and one that pipelines more than [`MAX_PIPELINED`] unanswered
/// requests is cut (a client that reads none of its answers would otherwise be sent
/// everything it asked for).
#[derive(Default)]
pub struct Connection {
    /// One of its requests is with a handler or the loop.
    under_way: bool,
    pipelined: VecDeque<Request>,
    /// When it was cut: what tiny_http still reads from it is dropped, for a while (later
    /// the peer's port may belong to a new connection).
    cut_at: Option<Instant>,
}

impl Connection {
    fn is_forgotten(&self) -> bool {
        self.cut_at.is_some_and(|at| at.elapsed() > CUT_REMEMBERED) && !self.under_way
    }
}

/// A handler's next piece of work: a new request from tiny_http, or the loop's answer to
/// one. One queue holds both, so a handler waits on one channel only.
pub enum Work {
    /// A request to admit and hand to the loop.
    Request(Request),
    /// A request and the loop's answer to it, to put on the wire.
    Answer(Request, Reply),
}

/// The tiny_http servers taking connections on our port. tiny_http's accept thread ends at
/// its first accept error, and panics when it cannot duplicate an accepted socket or start
/// a pool thread (out of descriptors or threads); the port would then stay deaf. Its end
/// closes the listening descriptor it was given, so [`watch`] looks for that descriptor and,
/// once it is gone and descriptors are free again, starts a new server on a copy of the
/// socket; the old server's connections still bring their requests. All servers are
/// unblocked to stop.
///
/// [`watch`]: Listening::watch
pub struct Listening {
    servers: Mutex<Vec<Arc<tiny_http::Server>>>,
    stopping: AtomicBool,
    /// A copy of the listening socket: for the next server, and to know the socket by.
    socket: TcpListener,
    /// The descriptor the newest server's accept thread owns.
    accepting: AtomicI32,
}

impl Listening {
    /// The first server on `socket`.
    pub fn new(socket: TcpListener) -> std::io::Result<Self> {
        let spare = socket.try_clone()?;
        let accepting = AtomicI32::new(socket.as_raw_fd());
        let first = tiny_http::Server::from_listener(socket, None)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Listening {
            servers: Mutex::new(vec![Arc::new(first)]),
            stopping: AtomicBool::new(false),
            socket: spare,
            accepting,
        })
    }

    /// Stops taking requests (answers under way still go out).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        for server in self.servers.lock().expect("servers").iter() {
            server.unblock();
        }
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    fn first(&self) -> Arc<tiny_http::Server> {
        self.servers.lock().expect("servers")[0].clone()
    }

    /// Every [`WATCH_EVERY`], looks whether the newest server's accept thread still holds
    /// its descriptor; when not, and [`MIN_FREE_DESCRIPTORS`] are free, calls `relisten`
    /// (true when a new server listens). Restarts are at least [`RELISTEN_FIRST`] apart,
    /// doubling up to [`RELISTEN_MAX`] while they keep coming.
    fn watch(&self, relisten: impl Fn() -> bool) {
        let mut backoff = RELISTEN_FIRST;
        let mut last_restart = Instant::now();
        while !self.is_stopping() {
            thread::sleep(WATCH_EVERY);
            // A new server would die at once while descriptors are still short.
            if self.is_accepting() || free_descriptors() < MIN_FREE_DESCRIPTORS {
                continue;
            }
            if last_restart.elapsed() > RELISTEN_CALM {
                backoff = RELISTEN_FIRST;
            }
            error!(
                "tiny_http's accept loop ended (out of descriptors or threads?): listening again"
            );
            if relisten() {
                warn!("listening again");
            }
            last_restart = Instant::now();
            thread::sleep(backoff);
            backoff = (backoff * 2).min(RELISTEN_MAX);
        }
    }

    /// Whether the newest server's accept thread still holds its descriptor (an open
    /// descriptor of this very socket: the number may have been reused since).
    fn is_accepting(&self) -> bool {
        let fd = self.accepting.load(Ordering::Acquire);
        match (inode(fd), inode(self.socket.as_raw_fd())) {
            (Some(theirs), Some(ours)) => theirs == ours,
            // Our own copy unreadable: nothing to compare with, assume the best.
            (_, None) => true,
            (None, Some(_)) => false,
        }
    }

    /// A new server on the port, now the newest.
    fn listen_again(&self) -> std::io::Result<Arc<tiny_http::Server>> {
        let socket = self.socket.try_clone()?;
        let fd = socket.as_raw_fd();
        // Making a server starts its accept thread, which may be refused too.
        let server =
            std::panic::catch_unwind(move || tiny_http::Server::from_listener(socket, None))
                .map_err(|_| std::io::Error::other("no thread for its accept loop"))?
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        let server = Arc::new(server);
        let mut servers = self.servers.lock().expect("servers");
        if self.is_stopping() {
            server.unblock();
        }
        servers.push(server.clone());
        self.accepting.store(fd, Ordering::Release);
        Ok(server)
    }
}

/// The device and inode of descriptor `fd`, or `None` when it is not open.
fn inode(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: an all-zero stat is a valid value of the plain C struct.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one stat into `stat`, which is that large; a descriptor that
    // is not open only makes it fail.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return None;
    }
    Some((stat.st_dev, stat.st_ino))
}

/// Descriptors this process may still open (`RLIMIT_NOFILE` less those open); none when
/// they cannot even be counted (that takes a descriptor), all when there is no limit.
fn free_descriptors() -> usize {
    let Some(limit) = crate::open_files_limit() else {
        return usize::MAX;
    };
    match std::fs::read_dir("/proc/self/fd") {
        Ok(open) => usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .saturating_sub(open.count()),
        Err(_) => 0,
    }
}

impl Server {
    /// Takes requests from tiny_http until [`Listening::stop`] and queues each for the
    /// handlers (starting them as needed), listening again when tiny_http's accept thread
    /// has ended (see [`Listening`]). `work` is the handlers' end of the queue that
    /// [`Server::work`] (and the loop, with its answers) sends on.
    pub fn serve(self: Arc<Self>, listening: Arc<Listening>, work: Receiver<Work>) {
        let pool = Arc::new(Pool::default());
        let (server, watching, watch_work, watch_pool) =
            (self.clone(), listening.clone(), work.clone(), pool.clone());
        let watcher = thread::Builder::new()
            .name("listen-watch".into())
            .stack_size(HANDLER_STACK)
            .spawn(move || {
                watching.watch(|| {
                    // The thread that takes the new server's requests first, so that no
                    // server is made that nobody takes requests from.
                    let (give, taken) = crossbeam_channel::bounded::<Arc<tiny_http::Server>>(1);
                    let (server, listening, work, pool) = (
                        server.clone(),
                        watching.clone(),
                        watch_work.clone(),
                        watch_pool.clone(),
                    );
                    let taker = thread::Builder::new()
                        .name("accept".into())
                        .stack_size(HANDLER_STACK)
                        .spawn(move || {
                            if let Ok(http) = taken.recv() {
                                server.take(&http, &listening, &work, &pool);
                            }
                        });
                    if let Err(e) = taker {
                        warn!("cannot listen again yet: no thread to take requests: {e}");
                        return false;
                    }
                    match watching.listen_again() {
                        Ok(http) => give.send(http).is_ok(),
                        Err(e) => {
                            warn!("cannot listen again yet: {e}");
                            false
                        }
                    }
                })
            });
        if let Err(e) = watcher {
            warn!("cannot watch the listening socket: {e}");
        }
        let first = listening.first();
        self.take(&first, &listening, &work, &pool);
    }

    /// Takes `http`'s requests until [`Listening::stop`] (an accept error ends only
    /// tiny_http's accept thread: its connections still bring requests).
    fn take(
        self: &Arc<Self>,
        http: &tiny_http::Server,
        listening: &Listening,
        work: &Receiver<Work>,
        pool: &Arc<Pool>,
    ) {
        loop {
            match http.recv() {
                Ok(request) => {
                    let _ = self.activity.try_send(());
                    let Some(request) = self.one_at_a_time(request) else {
                        continue;
                    };
                    // Every handler busy (or none yet): one more, if the OS allows.
                    if pool.idle.load(Ordering::Acquire) == 0
                        && !self.clone().spawn_handler(work, pool)
                        && pool.threads.load(Ordering::Acquire) == 0
                    {
                        // No thread at all to answer it: refuse rather than leave it waiting.
                        self.busy.fetch_sub(1, Ordering::AcqRel);
                        let peer = request.remote_addr().copied();
                        respond(request, Rejection::BackendBusy.response());
                        self.next_of(peer);
                        continue;
                    }
                    if is_buffered(&request) && work.is_empty() {
                        // Nothing to wait for, and the handlers have nothing waiting: handed
                        // to the loop from here, one hand-off fewer (under load the handlers
                        // share the work instead); a refusal is written by a handler.
                        if let Err(refused) = self.handle(request) {
                            let (request, refusal) = *refused;
                            let _ = self.work.send(Work::Answer(request, Reply::Full(refusal)));
                        }
                    } else {
                        let _ = self.work.send(Work::Request(request));
                    }
                }
                Err(_) if listening.is_stopping() => return,
                Err(e) => error!("accepting connections failed: {e}"),
            }
        }
    }

    /// `request` if its connection has nothing else under way (it is then), else `None`:
    /// it waits behind, and past [`MAX_PIPELINED`] the connection is cut. Counted `busy`
    /// either way.
    fn one_at_a_time(&self, request: Request) -> Option<Request> {
        self.busy.fetch_add(1, Ordering::AcqRel);
        let Some(peer) = request.remote_addr().copied() else {
            return Some(request);
        };
        let leftover = {
            let mut connections = self.connections.lock().expect("connections");
            let connection = connections.entry(peer).or_default();
            if connection.is_forgotten() {
                *connection = Connection::default();
            }
            if connection.under_way {
                connection.pipelined.push_back(request);
                if connection.pipelined.len() <= MAX_PIPELINED || connection.cut_at.is_some() {
                    return None;
                }
                connection.cut_at = Some(Instant::now());
                connections.retain(|_, c| !c.is_forgotten());
                None
            } else if connection.cut_at.is_some() {
                Some(request)
            } else {
                connection.under_way = true;
                return Some(request);
            }
        };
        match leftover {
            // Read from a cut connection with nothing under way: its 500 fails at once.
            Some(request) => {
                drop(request);
                self.busy.fetch_sub(1, Ordering::AcqRel);
            }
            None => {
                warn!(%peer, "a client pipelines more than {MAX_PIPELINED} requests behind an unanswered one: its connection is closed");
                if let Some(socket) = session::connection_socket(peer, self.local_port) {
                    let _ = socket.shutdown(std::net::Shutdown::Both);
                }
            }
        }
        None
    }

    /// The request under way on `peer`'s connection is answered: the next one pipelined
    /// behind it goes to the handlers (those of a cut connection are dropped, which fails
    /// at once).
    fn next_of(&self, peer: Option<SocketAddr>) {
        let Some(peer) = peer else { return };
        let (next, dropped) = {
            let mut connections = self.connections.lock().expect("connections");
            let Some(connection) = connections.get_mut(&peer) else {
                return;
            };
            if connection.cut_at.is_some() {
                connection.under_way = false;
                (None, std::mem::take(&mut connection.pipelined))
            } else {
                let next = connection.pipelined.pop_front();
                if next.is_none() {
                    connections.remove(&peer);
                }
                (next, VecDeque::new())
            }
        };
        self.drop_unanswered(dropped);
        if let Some(request) = next {
            let _ = self.work.send(Work::Request(request));
        }
    }

    /// Drops requests that will not be answered (tiny_http writes a 500 for each, which
    /// fails at once on a closed connection).
    fn drop_unanswered(&self, requests: VecDeque<Request>) {
        for request in requests {
            drop(request);
            self.busy.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Waits (at most `within`) for requests under way to be answered.
    pub fn drain(&self, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        while self.busy.load(Ordering::Acquire) > 0 && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts one more handler thread unless [`MAX_HANDLERS`] run; false when none was
    /// started.
    fn spawn_handler(self: Arc<Self>, work: &Receiver<Work>, pool: &Arc<Pool>) -> bool {
        if pool.threads.fetch_add(1, Ordering::AcqRel) >= MAX_HANDLERS {
            pool.threads.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        let (work, thread_pool) = (work.clone(), pool.clone());
        let spawned = thread::Builder::new()
            .name("http".into())
            .stack_size(HANDLER_STACK)
            .spawn(move || self.work(&work, &thread_pool));
        if let Err(e) = &spawned {
            pool.threads.fetch_sub(1, Ordering::AcqRel);
            warn!("cannot start a handler thread: {e}");
        }
        spawned.is_ok()
    }

    /// One handler thread's life: the next request or answer; a thread that takes the
    /// last idle place starts another, so a slow client never holds up the others. Ends
    /// when enough others idle; the queue itself stays open (the server keeps a sender for
    /// pipelined requests) until the process exits.
    fn work(self: Arc<Self>, work: &Receiver<Work>, pool: &Arc<Pool>) {
        loop {
            pool.idle.fetch_add(1, Ordering::AcqRel);
            let next = work.recv();
            let idle = pool.idle.fetch_sub(1, Ordering::AcqRel) - 1;
            let Ok(next) = next else { break };
            if idle == 0 {
                self.clone().spawn_handler(work, pool);
            }
            match next {
                Work::Request(request) => {
                    if let Err(refused) = self.handle(request) {
                        let (request, refusal) = *refused;
                        let peer = request.remote_addr().copied();
                        respond(request, refusal);
                        self.busy.fetch_sub(1, Ordering::AcqRel);
                        self.next_of(peer);
                    }
                }
                Work::Answer(request, reply) => {
                    let peer = request.remote_addr().copied();
                    let streaming = self.clone().answer(request, reply);
                    self.busy.fetch_sub(1, Ordering::AcqRel);
                    if !streaming {
                        self.next_of(peer);
                    }
                }
            }
            if pool.idle.load(Ordering::Acquire) >= MAX_IDLE {
                break;
            }
        }
        pool.threads.fetch_sub(1, Ordering::AcqRel);
    }

    /// Admits `request` and hands it to the owner loop, whose answer comes back as work;
    /// gives it back with the refusal to write when it is refused (or the loop is gone).
    /// It was counted `busy` when taken: that ends once it is answered.
    fn handle(&self, mut request: Request) -> Result<(), Box<(Request, http::Response)>> {
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
                return Err(Box::new((request, refused.response)));
            }
        };
        let body = read_limited(&mut request, self.max_body);
        let input = Input::Request {
            request: admitted.into_request(body, entropy),
            http: Box::new(request),
        };
        // Blocks while the loop's inputs are full: the loop never waits on a handler.
        match self.inputs.send(input) {
            Err(crossbeam_channel::SendError(Input::Request { http, .. })) => {
                Err(Box::new((*http, Rejection::BackendDown.response())))
            }
            _ => Ok(()),
        }
    }

    /// Copies the loop's answer to `request` onto the wire, or hands the connection to its
    /// stream's writer (then true: what the connection pipelined behind waits for the
    /// stream to end, and is dropped then).
    fn answer(self: Arc<Self>, request: Request, reply: Reply) -> bool {
        match reply {
            Reply::Full(response) => respond(request, response),
            Reply::Stream(head, body) => {
                let peer = request.remote_addr().copied();
                let server = self.clone();
                let ended = Box::new(move || server.stream_ended(peer));
                let streaming = session::serve(
                    request,
                    head,
                    body,
                    self.local_port,
                    self.closed.clone(),
                    ended,
                );
                match streaming {
                    Ok(()) => return true,
                    Err(request) => respond(*request, Rejection::TooManySessions.response()),
                }
            }
        }
        false
    }

    /// The stream on `peer`'s connection is over, and so is the connection (its read side
    /// was shut before the stream began): what it pipelined behind is dropped.
    fn stream_ended(&self, peer: Option<SocketAddr>) {
        let Some(peer) = peer else { return };
        let connection = self.connections.lock().expect("connections").remove(&peer);
        if let Some(connection) = connection {
            self.drop_unanswered(connection.pipelined);
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

/// Whether `request`'s body (if any) is already in memory, so that admitting it waits for
/// nothing: tiny_http reads a body of up to 1 KiB with the head, unless the client asked
/// for `100 Continue` first.
fn is_buffered(request: &Request) -> bool {
    let has = |name: &'static str| request.headers().iter().any(|h| h.field.equiv(name));
    match request.body_length() {
        Some(length) => length <= 1024 && !has("Expect"),
        None => !has("Transfer-Encoding"),
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
