//! The whole owner loop as one sans-IO state machine: sessions and their streams, the
//! backend's lifecycle (start, restart backoff, stop sequence), health pings, the stdin
//! budget and every timer, around the message-level [`Router`].
//!
//! Every input takes `now`; after each one the shell drains [`Hub::poll_output`] and
//! performs every [`Output`] in order, then sleeps until its next input or
//! [`Hub::poll_timeout`], whichever comes first, and calls [`Hub::handle_timeout`] when the
//! latter passes. The hub refers to the shell's things by the ids it hands out
//! ([`RequestId`], [`StreamId`], [`BackendId`]); the shell keeps its own maps from those ids
//! to senders, sockets and processes.

mod mcp;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::action::{Action, Delivery};
use crate::auth::Principal;
use crate::config::Restart;
use crate::http::{self, Endpoint, McpHeaders, Rejection, Response};
use crate::metrics::{self, ShellGauges};
use crate::output::{BackendId, CloseReason, Event, Frame, Output, RequestId, StreamEnd, StreamId};
use crate::routed_id::{Instance, SessionId};
use crate::router::{Body, Router};
use crate::sse;
use crate::streamable::IdKey;
use crate::supervise::{AfterExit, Exit, Health, Signal, Supervisor};

/// Client lines the hub lets wait in the backend's stdin queue by default; past it a POST
/// waits for room (at most [`BACKEND_BUSY_WAIT`]). The proxy's own lines may use as much
/// again.
pub const STDIN_QUEUE: usize = 1024;

/// How long a POST waits for room in the backend's stdin queue before 503.
pub const BACKEND_BUSY_WAIT: Duration = Duration::from_secs(2);

/// At exit, how long answers already under way get to reach their clients.
pub const EXIT_DRAIN: Duration = Duration::from_secs(1);

/// What the hub needs from the command line; see [`Config::settings`](crate::config::Config::settings).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Most live sessions.
    pub max_sessions: usize,
    /// Byte budget of each stream's queue in the shell.
    pub session_buffer: usize,
    /// Idle time after which a stream gets a keep-alive comment.
    pub keepalive: Duration,
    /// Interval of health pings.
    pub ping_interval: Duration,
    /// Silence after a ping that makes the backend unhealthy.
    pub ping_timeout: Duration,
    /// Each wait of the stop sequence.
    pub grace: Duration,
    /// When the backend is restarted.
    pub restart: Restart,
    /// Client lines that may wait in the backend's stdin queue ([`STDIN_QUEUE`]).
    pub stdin_queue: usize,
    /// How long a Streamable request may wait for its answer (progress restarts the
    /// clock); `None` for no limit.
    pub request_timeout: Option<Duration>,
    /// How long a Streamable session may go without a request or an open stream.
    pub session_idle: Duration,
    /// Requests one Streamable session may have in flight.
    pub max_inflight: usize,
    /// Prefix of the POST URL in a session's `endpoint` event (`--public-url` and
    /// `--base-path`), without a trailing slash.
    pub endpoint_prefix: String,
    /// The `--instance` name every minted session id starts with, if any.
    pub instance: Option<Instance>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_sessions: 10_000,
            session_buffer: 4 << 20,
            keepalive: Duration::from_secs(30),
            ping_interval: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(10),
            grace: Duration::from_secs(5),
            restart: Restart::OnFailure,
            stdin_queue: STDIN_QUEUE,
            request_timeout: Some(Duration::from_secs(300)),
            session_idle: Duration::from_secs(1800),
            max_inflight: 256,
            endpoint_prefix: String::new(),
            instance: None,
        }
    }
}

/// An HTTP request the gate admitted ([`http::Gate::admit`]), with its body and fresh
/// randomness for a session it may create.
#[derive(Debug, Clone)]
pub struct Request {
    /// What it asks for.
    pub endpoint: Endpoint,
    /// Who asks.
    pub principal: Principal,
    /// The session `session_id` names, as sent (empty when none), for `/messages`.
    pub session: String,
    /// The Streamable HTTP headers, for `/mcp`.
    pub mcp: McpHeaders,
    /// The browser origin to answer with CORS headers, when present and allowed.
    pub cors: Option<String>,
    /// The body as far as the shell read it.
    pub body: Payload,
    /// 16 random bytes from the OS, for the id of a session this request may create.
    pub entropy: [u8; 16],
}

/// A request body as the shell read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// The whole body (empty for none).
    Bytes(Vec<u8>),
    /// Longer than `--max-body`; the rest was not read.
    TooLarge,
}

impl Payload {
    fn as_body(&self) -> Body<'_> {
        match self {
            Payload::Bytes(bytes) => Body::Complete(bytes),
            Payload::TooLarge => Body::TooLarge,
        }
    }
}

/// What [`Hub::table_sizes`] counts (for tests).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableSizes {
    /// Streams open (legacy, GET and request streams).
    pub streams: usize,
    /// Streamable requests in flight.
    pub in_flight: usize,
    /// Progress tokens of requests in flight (one per request carrying one).
    pub progress_tokens: usize,
    /// Request timeout timers.
    pub request_timers: usize,
    /// Idle expiry timers.
    pub idle_timers: usize,
    /// Subscriptions the router records, as (session, uri) pairs in both of its maps.
    pub subscriptions: (usize, usize),
}

/// A POST waiting for room in the backend's stdin queue.
#[derive(Debug)]
struct WaitingPost {
    request: RequestId,
    req: Request,
    deadline: Instant,
}

/// A `/health` request waiting for the backend's answer to its ping.
#[derive(Debug)]
struct HealthWaiter {
    request: RequestId,
    ping: u64,
    deadline: Instant,
}

#[derive(Debug)]
struct Session {
    id: SessionId,
    kind: SessionKind,
}

/// The two transports side by side (SPEC section 7).
#[derive(Debug)]
enum SessionKind {
    /// HTTP+SSE: the session is its one `/sse` stream.
    Legacy { stream: StreamId },
    /// Streamable HTTP: a standalone GET stream, and requests in flight.
    Mcp(mcp::McpSession),
}

/// What a stream carries.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StreamRole {
    /// A legacy session's `/sse` stream.
    Legacy,
    /// A Streamable session's standalone GET stream.
    Get,
    /// The answer stream of the Streamable request with this id.
    Request(IdKey),
}

#[derive(Debug)]
struct StreamState {
    /// Creation number of the session it belongs to.
    session: u64,
    role: StreamRole,
    /// When a frame was last queued on it, for keep-alives.
    last_frame: Instant,
    /// Its entry in `keepalives`, which leaves with it.
    keepalive_at: Instant,
}

/// Whose line is queued for the backend, which decides how much room it may take.
#[derive(Debug, Clone, Copy)]
pub(super) enum LineFrom {
    /// A client's message.
    Client,
    /// The proxy's own (pings, unsubscribes, answers to the backend's requests).
    Proxy,
    /// The cancellation of a request the backend was given.
    Cancellation,
}

/// The backend process as the hub knows it.
#[derive(Debug)]
enum Backend {
    /// Spawn requested, not reported yet.
    Spawning { id: BackendId },
    /// Running since `started`.
    Up {
        id: BackendId,
        pid: u32,
        started: Instant,
        /// Lines queued for its stdin and not reported written.
        queued: usize,
        /// Stdin closed by the stop sequence.
        stdin_closed: bool,
    },
    /// Not running; started again at `restart_at` if set.
    Down { restart_at: Option<Instant> },
}

/// Health ping bookkeeping.
#[derive(Debug, Default)]
struct Pings {
    next_at: Option<Instant>,
    /// The first ping still unanswered was sent then.
    unanswered_since: Option<Instant>,
    last_pong: Option<Instant>,
    /// Reported unresponsive for the current silence.
    unresponsive: bool,
}

/// The stop sequence (SPEC section 5).
#[derive(Debug)]
enum Phase {
    Running,
    /// Streams are ended; waiting for the backend to exit. `step` counts the waits done.
    Stopping {
        status: i32,
        step: usize,
        at: Instant,
    },
    /// [`Output::Exit`] was emitted; nothing more happens.
    Exited,
}

/// The owner loop's state; see the [module docs](self) for the loop contract.
#[derive(Debug)]
pub struct Hub {
    settings: Settings,
    router: Router,
    outputs: VecDeque<Output>,
    next_id: u64,
    next_session: u64,
    /// Live sessions by creation number, so broadcasts and closes follow creation order.
    sessions: BTreeMap<u64, Session>,
    by_sid: BTreeMap<SessionId, u64>,
    streams: BTreeMap<StreamId, StreamState>,
    /// Keep-alive deadlines; an entry whose stream saw a frame since is moved on lazily.
    keepalives: BTreeSet<(Instant, StreamId)>,
    /// Request timeouts (session number, request id): one entry per request in flight,
    /// removed when it leaves the in-flight table (so bounded by what is in flight).
    request_deadlines: BTreeSet<(Instant, u64, IdKey)>,
    /// Idle expiry checks (session number): at most one per Streamable session (its
    /// `idle_at`), moved on lazily when due.
    idle_deadlines: BTreeSet<(Instant, u64)>,
    backend: Backend,
    /// A backend has run at least once (a first spawn failure ends the proxy).
    ever_started: bool,
    waiting_posts: VecDeque<WaitingPost>,
    health_waiters: Vec<HealthWaiter>,
    pings: Pings,
    supervisor: Supervisor,
    phase: Phase,
}

impl Hub {
    /// A hub that starts the backend at once ([`Output::SpawnBackend`]).
    pub fn new(settings: Settings, now: Instant) -> Self {
        let mut hub = Hub {
            router: Router::new(settings.max_sessions),
            supervisor: Supervisor::new(settings.restart),
            settings,
            outputs: VecDeque::new(),
            next_id: 1,
            next_session: 1,
            sessions: BTreeMap::new(),
            by_sid: BTreeMap::new(),
            streams: BTreeMap::new(),
            keepalives: BTreeSet::new(),
            request_deadlines: BTreeSet::new(),
            idle_deadlines: BTreeSet::new(),
            backend: Backend::Down { restart_at: None },
            ever_started: false,
            waiting_posts: VecDeque::new(),
            health_waiters: Vec::new(),
            pings: Pings::default(),
            phase: Phase::Running,
        };
        hub.spawn_backend(now);
        hub
    }

    /// The next thing to do; drain until `None` after every input.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// When [`Hub::handle_timeout`] must be called next, if any timer is set.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if matches!(self.phase, Phase::Exited) {
            return None;
        }
        let backend = match self.backend {
            Backend::Down { restart_at } => restart_at,
            _ => None,
        };
        let stop = match self.phase {
            Phase::Stopping { at, .. } => Some(at),
            _ => None,
        };
        let ping_silence = match self.pings.unanswered_since {
            Some(since) if !self.pings.unresponsive => Some(since + self.settings.ping_timeout),
            _ => None,
        };
        [
            backend,
            stop,
            self.pings.next_at,
            ping_silence,
            self.waiting_posts.front().map(|p| p.deadline),
            self.health_waiters.iter().map(|w| w.deadline).min(),
            self.keepalives.first().map(|(at, _)| *at),
            self.request_deadlines.first().map(|(at, ..)| *at),
            self.idle_deadlines.first().map(|(at, _)| *at),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if matches!(self.phase, Phase::Exited) {
            return;
        }
        if let Backend::Down {
            restart_at: Some(at),
        } = self.backend
        {
            if at <= now {
                self.spawn_backend(now);
            }
        }
        if let Phase::Stopping { status, step, at } = self.phase {
            if at <= now {
                self.stop_step(status, step, now);
            }
        }
        if self.pings.next_at.is_some_and(|at| at <= now) {
            self.periodic_ping(now);
        }
        if let Some(since) = self.pings.unanswered_since {
            let silent = now.saturating_duration_since(since);
            if !self.pings.unresponsive && silent >= self.settings.ping_timeout {
                self.pings.unresponsive = true;
                self.log(Event::Unresponsive { silent });
            }
        }
        while let Some((at, number, key)) = self.request_deadlines.first().cloned() {
            if at > now {
                break;
            }
            self.request_deadlines.pop_first();
            self.request_timed_out(now, at, number, &key);
        }
        while let Some(&(at, number)) = self.idle_deadlines.first() {
            if at > now {
                break;
            }
            self.idle_deadlines.pop_first();
            self.idle_check(now, number);
        }
        while self
            .waiting_posts
            .front()
            .is_some_and(|p| p.deadline <= now)
        {
            let post = self.waiting_posts.pop_front().expect("checked above");
            self.refuse(post.request, Rejection::BackendBusy);
        }
        let due: Vec<HealthWaiter>;
        (due, self.health_waiters) = std::mem::take(&mut self.health_waiters)
            .into_iter()
            .partition(|w| w.deadline <= now);
        for waiter in due {
            let report = self.health_report(now, false);
            self.respond_health(waiter.request, &report);
        }
        while let Some(&(at, stream)) = self.keepalives.first() {
            if at > now {
                break;
            }
            self.keepalives.pop_first();
            let Some(state) = self.streams.get_mut(&stream) else {
                continue;
            };
            let idle_until = state.last_frame + self.settings.keepalive;
            if idle_until > now {
                state.keepalive_at = idle_until;
                self.keepalives.insert((idle_until, stream));
                continue;
            }
            state.last_frame = now;
            state.keepalive_at = now + self.settings.keepalive;
            self.keepalives.insert((state.keepalive_at, stream));
            self.outputs.push_back(Output::ToStream {
                stream,
                frame: Frame::Static(sse::KEEPALIVE),
            });
        }
    }

    /// An admitted HTTP request; its answer comes as [`Output::Respond`] or
    /// [`Output::StartStream`] naming the returned id, now or later (never once the hub
    /// has emitted [`Output::Exit`]).
    pub fn handle_request(&mut self, now: Instant, request: Request) -> RequestId {
        let id = RequestId(self.mint());
        match self.phase {
            Phase::Running => {}
            // The shell is exiting: nothing more is said.
            Phase::Exited => return id,
            Phase::Stopping { .. } => {
                self.refuse(id, Rejection::BackendDown);
                return id;
            }
        }
        match request.endpoint {
            Endpoint::Stream => {
                let (principal, cors) = (request.principal, request.cors);
                self.open_stream(now, id, principal, request.entropy, cors)
            }
            Endpoint::Messages | Endpoint::McpPost => self.post(now, id, request),
            Endpoint::McpGet => {
                if let Err(rejection) = self.mcp_get(now, id, &request) {
                    self.refuse_for(id, rejection, &request.cors);
                }
            }
            Endpoint::McpDelete => {
                if let Err(rejection) = self.mcp_delete(now, id, &request) {
                    self.refuse_for(id, rejection, &request.cors);
                }
            }
            Endpoint::Preflight => self.outputs.push_back(Output::Respond {
                request: id,
                response: http::preflight(request.cors.as_deref()),
            }),
            Endpoint::Health => self.health(now, id),
            Endpoint::Metrics => {
                let response = Response::text(
                    200,
                    "text/plain; version=0.0.4",
                    self.metrics_text().into_bytes(),
                );
                self.outputs.push_back(Output::Respond {
                    request: id,
                    response,
                });
            }
        }
        id
    }

    /// Counts a request the gate refused before the hub saw it (the shell answered it).
    pub fn handle_refused(&mut self, rejection: Rejection) {
        self.router.count_rejection(&rejection);
    }

    /// A stream ended on the shell's side; the session it served ends.
    pub fn handle_stream_closed(&mut self, now: Instant, stream: StreamId, end: StreamEnd) {
        let Some(state) = self.remove_stream(stream) else {
            return;
        };
        let reason = match end {
            StreamEnd::ClientGone => CloseReason::ClientGone,
            StreamEnd::Full => CloseReason::SlowConsumer,
        };
        match state.role {
            StreamRole::Legacy => self.end_session(now, state.session, reason),
            StreamRole::Get => {
                if let Some(SessionKind::Mcp(m)) =
                    self.sessions.get_mut(&state.session).map(|s| &mut s.kind)
                {
                    if m.get_stream == Some(stream) {
                        m.get_stream = None;
                    }
                }
                self.touch(state.session, now);
            }
            StreamRole::Request(key) => self.request_stream_closed(now, state.session, &key),
        }
    }

    /// The process of [`Output::SpawnBackend`] runs as `pid`.
    pub fn handle_backend_spawned(&mut self, now: Instant, backend: BackendId, pid: u32) {
        if !matches!(self.backend, Backend::Spawning { id } if id == backend) {
            return;
        }
        self.backend = Backend::Up {
            id: backend,
            pid,
            started: now,
            queued: 0,
            stdin_closed: false,
        };
        self.ever_started = true;
        let running = matches!(self.phase, Phase::Running);
        self.pings = Pings {
            next_at: running.then(|| now + self.settings.ping_interval),
            ..Pings::default()
        };
        self.log(Event::BackendStarted { pid });
        self.router.backend_started();
        self.drain_router(now);
        if let Phase::Stopping { .. } = self.phase {
            // SIGTERM arrived while it was being started: stop it like any other.
            self.close_stdin();
        }
    }

    /// The process of [`Output::SpawnBackend`] could not be started.
    pub fn handle_spawn_failed(&mut self, now: Instant, backend: BackendId, error: String) {
        if !matches!(self.backend, Backend::Spawning { id } if id == backend) {
            return;
        }
        self.backend = Backend::Down { restart_at: None };
        self.log(Event::SpawnFailed { error });
        if let Phase::Stopping { status, .. } = self.phase {
            self.exit(status);
            return;
        }
        if !self.ever_started {
            // A command that never ran is a configuration error, not a crash to ride out.
            self.log(Event::ShuttingDown { status: 1 });
            self.begin_stop(now, 1);
            return;
        }
        self.after_exit(now, Exit::SpawnFailed, Duration::ZERO);
    }

    /// Lines `backend` wrote on stdout, without their newlines; `None` for a line longer
    /// than `--max-line`, which was skipped.
    pub fn handle_backend_lines<L: AsRef<[u8]>>(
        &mut self,
        now: Instant,
        backend: BackendId,
        lines: impl IntoIterator<Item = Option<L>>,
    ) {
        if self.current_backend() != Some(backend) {
            return;
        }
        for line in lines {
            match line {
                Some(line) => self.router.backend_line(line.as_ref()),
                None => self.router.backend_line_too_long(),
            }
            self.drain_router(now);
        }
    }

    /// `lines` more lines queued for `backend`'s stdin were written.
    pub fn handle_backend_wrote(&mut self, now: Instant, backend: BackendId, lines: usize) {
        let Backend::Up { id, queued, .. } = &mut self.backend else {
            return;
        };
        if *id != backend {
            return;
        }
        *queued = queued.saturating_sub(lines);
        while self.client_room() {
            let Some(post) = self.waiting_posts.pop_front() else {
                break;
            };
            self.dispatch_post(now, post.request, &post.req);
        }
    }

    /// `backend` exited: its sessions end and the restart policy decides what follows.
    pub fn handle_backend_exited(&mut self, now: Instant, backend: BackendId, exit: Exit) {
        let Backend::Up {
            id, pid, started, ..
        } = self.backend
        else {
            return;
        };
        if id != backend {
            return;
        }
        self.backend = Backend::Down { restart_at: None };
        self.log(Event::BackendExited { pid, exit });
        self.router.backend_exited();
        self.pings = Pings::default();
        if let Phase::Stopping { status, .. } = self.phase {
            self.exit(status);
            return;
        }
        self.end_all_sessions(now, CloseReason::BackendExited);
        for post in std::mem::take(&mut self.waiting_posts) {
            self.refuse(post.request, Rejection::BackendDown);
        }
        for waiter in std::mem::take(&mut self.health_waiters) {
            let report = self.health_report(now, false);
            self.respond_health(waiter.request, &report);
        }
        self.after_exit(now, exit, now.saturating_duration_since(started));
    }

    /// SIGINT or SIGTERM: stop accepting, end every stream, stop the backend (SPEC section 5)
    /// and exit 0.
    pub fn handle_shutdown(&mut self, now: Instant) {
        if !matches!(self.phase, Phase::Running) {
            return;
        }
        self.log(Event::ShutdownRequested);
        self.begin_stop(now, 0);
    }

    /// How many timer entries the hub holds (keep-alives, request timeouts, idle checks):
    /// bounded by the streams, requests in flight and sessions that are live, never by how
    /// many requests came before (SPEC section 6, item 6).
    pub fn pending_timers(&self) -> usize {
        self.keepalives.len() + self.request_deadlines.len() + self.idle_deadlines.len()
    }

    /// Live sessions.
    pub fn live_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// The router inside, for tests and checks.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Entry counts of the hub's per-session tables, summed over every session, so a test
    /// can check that a session leaves nothing behind when it ends. Not for shells.
    #[doc(hidden)]
    pub fn table_sizes(&self) -> TableSizes {
        let mut sizes = TableSizes {
            streams: self.streams.len(),
            request_timers: self.request_deadlines.len(),
            idle_timers: self.idle_deadlines.len(),
            subscriptions: self.router.subscription_count(),
            ..TableSizes::default()
        };
        for session in self.sessions.values() {
            if let SessionKind::Mcp(m) = &session.kind {
                sizes.in_flight += m.in_flight.len();
                sizes.progress_tokens += m.tokens.values().map(Vec::len).sum::<usize>();
            }
        }
        sizes
    }

    /// The session a stream serves, while both are live.
    pub fn stream_session(&self, stream: StreamId) -> Option<SessionId> {
        let state = self.streams.get(&stream)?;
        self.sessions.get(&state.session).map(|s| s.id)
    }

    /// The Prometheus text for `/metrics`.
    pub fn metrics_text(&self) -> String {
        let gauges = ShellGauges {
            live_sessions: self.sessions.len(),
            backend_running: matches!(self.backend, Backend::Up { .. }),
            backend_restarts: self.supervisor.restarts(),
            instance: self.settings.instance,
        };
        metrics::render(self.router.metrics(), gauges)
    }

    // -----------------------------------------------------------------------------------
    // Requests

    /// Adds a session the router has opened, numbered in creation order (the order every
    /// broadcast and close follows).
    fn add_session(&mut self, sid: SessionId, kind: SessionKind) -> u64 {
        let number = self.next_session;
        self.next_session += 1;
        self.sessions.insert(number, Session { id: sid, kind });
        self.by_sid.insert(sid, number);
        number
    }

    fn open_stream(
        &mut self,
        now: Instant,
        request: RequestId,
        principal: Principal,
        entropy: [u8; 16],
        cors: Option<String>,
    ) {
        let sid = SessionId::mint(self.settings.instance.as_ref(), entropy);
        if let Err(rejection) = self.router.open_session(sid, principal.clone()) {
            self.respond_rejection(request, rejection);
            return;
        }
        let stream = StreamId(self.mint());
        let number = self.add_session(sid, SessionKind::Legacy { stream });
        let mut head = http::sse_head();
        if let Some(origin) = &cors {
            http::add_cors(&mut head, origin);
        }
        self.start_stream(now, request, stream, head, number, StreamRole::Legacy);
        let url = format!(
            "{}/messages?session_id={sid}",
            self.settings.endpoint_prefix
        );
        self.outputs.push_back(Output::ToStream {
            stream,
            frame: Frame::Owned(sse::endpoint_event(&url)),
        });
        self.log(Event::SessionOpened {
            session: sid,
            principal,
        });
    }

    /// A POST to `/messages` or `/mcp`: at once when the backend's stdin has room;
    /// otherwise a POST that would be refused anyway is refused now, and the others wait
    /// their turn, in order, for a bounded time.
    fn post(&mut self, now: Instant, request: RequestId, req: Request) {
        if self.waiting_posts.is_empty() && self.client_room() {
            self.dispatch_post(now, request, &req);
            return;
        }
        let check = match req.endpoint {
            Endpoint::McpPost => self.mcp_post(now, request, &req, true),
            _ => self.legacy_session(&req).and_then(|()| {
                self.router
                    .check_client_message(&req.session, &req.principal, req.body.as_body())
            }),
        };
        if let Err(rejection) = check {
            self.refuse_for(request, rejection, &req.cors);
            return;
        }
        self.waiting_posts.push_back(WaitingPost {
            request,
            req,
            deadline: now + BACKEND_BUSY_WAIT,
        });
    }

    fn dispatch_post(&mut self, now: Instant, request: RequestId, req: &Request) {
        let result = match req.endpoint {
            Endpoint::McpPost => self.mcp_post(now, request, req, false),
            _ => self.legacy_post(now, request, req),
        };
        if let Err(rejection) = result {
            self.refuse_for(request, rejection, &req.cors);
        }
    }

    /// A legacy session's `session_id` must not name a Streamable session.
    fn legacy_session(&self, req: &Request) -> Result<(), Rejection> {
        let streamable = SessionId::parse(&req.session)
            .and_then(|sid| self.by_sid.get(&sid))
            .and_then(|n| self.sessions.get(n))
            .is_some_and(|s| matches!(s.kind, SessionKind::Mcp(_)));
        if streamable {
            return Err(Rejection::SessionNotFound);
        }
        Ok(())
    }

    fn legacy_post(
        &mut self,
        now: Instant,
        request: RequestId,
        req: &Request,
    ) -> Result<(), Rejection> {
        self.legacy_session(req)?;
        self.router
            .client_message(&req.session, &req.principal, req.body.as_body())
            .inspect_err(|_| self.drain_router(now))?;
        self.drain_router(now);
        let mut response = http::accepted();
        if let Some(origin) = &req.cors {
            http::add_cors(&mut response, origin);
        }
        self.outputs
            .push_back(Output::Respond { request, response });
        Ok(())
    }

    fn health(&mut self, now: Instant, request: RequestId) {
        if !matches!(self.backend, Backend::Up { .. }) {
            let report = self.health_report(now, false);
            self.respond_health(request, &report);
            return;
        }
        let ping = self.send_ping(now);
        self.health_waiters.push(HealthWaiter {
            request,
            ping,
            deadline: now + self.settings.ping_timeout,
        });
    }

    fn health_report(&self, now: Instant, answered: bool) -> Health {
        let (running, pid) = match self.backend {
            Backend::Up { pid, .. } => (true, Some(pid)),
            _ => (false, None),
        };
        Health {
            running,
            pid,
            restarts: self.supervisor.restarts(),
            since_last_pong: self
                .pings
                .last_pong
                .map(|t| now.saturating_duration_since(t)),
            answered,
            sessions: self.sessions.len(),
            instance: self.settings.instance,
        }
    }

    fn respond_health(&mut self, request: RequestId, report: &Health) {
        let (status, body) = report.response();
        self.outputs.push_back(Output::Respond {
            request,
            response: Response::json(status, body),
        });
    }

    fn refuse(&mut self, request: RequestId, rejection: Rejection) {
        self.router.count_rejection(&rejection);
        self.respond_rejection(request, rejection);
    }

    /// Refuses `request`, with CORS headers for an allowed browser origin. (The router
    /// counts what it refuses itself; the hub's own refusals are counted here.)
    fn refuse_for(&mut self, request: RequestId, rejection: Rejection, cors: &Option<String>) {
        let mut response = rejection.response();
        if let Some(origin) = cors {
            http::add_cors(&mut response, origin);
        }
        self.outputs
            .push_back(Output::Respond { request, response });
    }

    fn respond_rejection(&mut self, request: RequestId, rejection: Rejection) {
        self.outputs.push_back(Output::Respond {
            request,
            response: rejection.response(),
        });
    }

    // -----------------------------------------------------------------------------------
    // The backend

    fn current_backend(&self) -> Option<BackendId> {
        match self.backend {
            Backend::Up { id, .. } => Some(id),
            _ => None,
        }
    }

    fn spawn_backend(&mut self, _now: Instant) {
        let id = BackendId(self.mint());
        self.backend = Backend::Spawning { id };
        self.outputs.push_back(Output::SpawnBackend { backend: id });
    }

    fn after_exit(&mut self, now: Instant, exit: Exit, ran_for: Duration) {
        match self.supervisor.exited(exit, ran_for) {
            AfterExit::Restart { after } => {
                self.log(Event::Restarting { after });
                self.backend = Backend::Down {
                    restart_at: Some(now + after),
                };
            }
            AfterExit::Shutdown { status } => {
                self.log(Event::ShuttingDown { status });
                self.begin_stop(now, status);
            }
        }
    }

    /// Whether a client line may be queued for the backend now.
    fn client_room(&self) -> bool {
        matches!(self.backend, Backend::Up { queued, stdin_closed: false, .. } if queued < self.settings.stdin_queue)
    }

    fn send_ping(&mut self, now: Instant) -> u64 {
        let n = self.router.health_ping();
        self.pings.unanswered_since.get_or_insert(now);
        self.drain_router(now);
        n
    }

    fn periodic_ping(&mut self, now: Instant) {
        self.pings.next_at = Some(now + self.settings.ping_interval);
        if matches!(self.backend, Backend::Up { .. }) {
            self.send_ping(now);
        }
    }

    fn pong(&mut self, now: Instant, ping: u64) {
        self.pings.last_pong = Some(now);
        self.pings.unanswered_since = None;
        if std::mem::take(&mut self.pings.unresponsive) {
            self.log(Event::Responsive);
        }
        let answered: Vec<HealthWaiter>;
        (answered, self.health_waiters) = std::mem::take(&mut self.health_waiters)
            .into_iter()
            .partition(|w| w.ping <= ping);
        for waiter in answered {
            let report = self.health_report(now, true);
            self.respond_health(waiter.request, &report);
        }
    }

    /// Queues a line for the backend's stdin: a client's within the stdin queue, the proxy's
    /// own within twice that (past it, dropped and counted: they never delay a client), and
    /// the cancellation of a request in flight always (each is owed for a request the
    /// backend was given, so there are never more than requests in flight).
    fn queue_for_backend(&mut self, line: Vec<u8>, from: LineFrom) {
        let queue = self.settings.stdin_queue;
        let limit = match from {
            LineFrom::Client => queue,
            LineFrom::Proxy => 2 * queue,
            LineFrom::Cancellation => usize::MAX,
        };
        match &mut self.backend {
            Backend::Up {
                id,
                queued,
                stdin_closed: false,
                ..
            } if *queued < limit => {
                *queued += 1;
                self.outputs
                    .push_back(Output::ToBackend { backend: *id, line });
            }
            _ => {
                self.router.count_backend_queue_full();
                self.drain_router_drops();
            }
        }
    }

    // -----------------------------------------------------------------------------------
    // Shutdown

    fn begin_stop(&mut self, now: Instant, status: i32) {
        self.outputs.push_back(Output::StopAccepting);
        self.end_all_sessions(now, CloseReason::Shutdown);
        for post in std::mem::take(&mut self.waiting_posts) {
            self.refuse(post.request, Rejection::BackendDown);
        }
        for waiter in std::mem::take(&mut self.health_waiters) {
            let report = self.health_report(now, false);
            self.respond_health(waiter.request, &report);
        }
        self.pings.next_at = None;
        self.pings.unanswered_since = None;
        match self.backend {
            Backend::Down { .. } => self.exit(status),
            Backend::Spawning { .. } | Backend::Up { .. } => {
                self.phase = Phase::Stopping {
                    status,
                    step: 0,
                    at: now + self.settings.grace,
                };
                self.close_stdin();
            }
        }
    }

    fn close_stdin(&mut self) {
        if let Backend::Up {
            id, stdin_closed, ..
        } = &mut self.backend
        {
            if !*stdin_closed {
                *stdin_closed = true;
                let backend = *id;
                self.outputs
                    .push_back(Output::CloseBackendStdin { backend });
            }
        }
    }

    /// One grace period of the stop sequence passed: SIGTERM, then SIGKILL, then give up.
    fn stop_step(&mut self, status: i32, step: usize, now: Instant) {
        let signal = match step {
            0 => Signal::Terminate,
            1 => Signal::Kill,
            _ => {
                self.log(Event::GaveUpWaiting);
                self.exit(status);
                return;
            }
        };
        self.phase = Phase::Stopping {
            status,
            step: step + 1,
            at: now + self.settings.grace,
        };
        if let Some(backend) = self.current_backend() {
            self.log(Event::StillRunning { signal });
            self.outputs
                .push_back(Output::SignalBackend { backend, signal });
        }
    }

    fn exit(&mut self, status: i32) {
        self.phase = Phase::Exited;
        self.keepalives.clear();
        self.outputs.push_back(Output::Exit {
            status,
            drain: EXIT_DRAIN,
        });
    }

    /// Ends every live session in creation order; a Streamable session's requests in
    /// flight are answered first.
    fn end_all_sessions(&mut self, now: Instant, reason: CloseReason) {
        let ending = match reason {
            CloseReason::BackendExited => mcp::Ending::BackendExited,
            _ => mcp::Ending::Shutdown,
        };
        for (number, session) in std::mem::take(&mut self.sessions) {
            self.close_kind(now, number, session.id, session.kind, ending);
            self.log(Event::SessionClosed {
                session: session.id,
                reason,
            });
        }
        self.by_sid.clear();
        self.streams.clear();
        self.keepalives.clear();
        self.request_deadlines.clear();
        self.idle_deadlines.clear();
        self.router.close_all_sessions();
        // Unsubscribes for a backend that is gone or going are not sent.
        while self.router.poll_action().is_some() {}
    }

    /// Ends one session (its stream ended, DELETE, idle): its streams end, its requests in
    /// flight are answered (and, on DELETE, cancelled at the backend), and the router
    /// forgets it, unsubscribing what only it watched.
    fn end_session(&mut self, now: Instant, number: u64, reason: CloseReason) {
        let Some(session) = self.sessions.remove(&number) else {
            return;
        };
        self.by_sid.remove(&session.id);
        self.close_kind(now, number, session.id, session.kind, mcp::Ending::Deleted);
        self.log(Event::SessionClosed {
            session: session.id,
            reason,
        });
        self.router.close_session(&session.id);
        self.drain_router(now);
    }

    fn close_kind(
        &mut self,
        now: Instant,
        number: u64,
        sid: SessionId,
        kind: SessionKind,
        ending: mcp::Ending,
    ) {
        match kind {
            SessionKind::Legacy { stream } => {
                if self.remove_stream(stream).is_some() {
                    self.outputs.push_back(Output::EndStream { stream });
                }
            }
            SessionKind::Mcp(m) => self.end_mcp(now, number, sid, m, ending),
        }
    }

    // -----------------------------------------------------------------------------------
    // Router actions

    fn drain_router(&mut self, now: Instant) {
        while let Some(action) = self.router.poll_action() {
            self.route(action, now);
        }
    }

    fn drain_router_drops(&mut self) {
        while let Some(action) = self.router.poll_action() {
            if let Action::Drop {
                reason,
                method,
                level,
            } = action
            {
                self.log(Event::Dropped {
                    reason,
                    method,
                    level,
                });
            }
        }
    }

    /// Turns one router action into outputs.
    fn route(&mut self, action: Action, now: Instant) {
        match action {
            Action::Rewrite { line } => self.queue_for_backend(line, LineFrom::Client),
            Action::Reply { line } => self.queue_for_backend(line, LineFrom::Proxy),
            Action::Deliver {
                session,
                message,
                what,
            } => self.deliver(now, session, message, what),
            Action::Broadcast { message } => {
                let frame: Arc<[u8]> = Arc::from(sse::message_event(&message));
                // Legacy streams and Streamable GET streams, in creation order; a Streamable
                // session without a GET stream is not told (never replayed).
                let streams: Vec<StreamId> = self
                    .sessions
                    .values()
                    .filter_map(|s| match &s.kind {
                        SessionKind::Legacy { stream } => Some(*stream),
                        SessionKind::Mcp(m) => m.get_stream,
                    })
                    .collect();
                for stream in streams {
                    self.queue_on_stream(now, stream, Frame::Shared(frame.clone()));
                }
            }
            Action::Drop {
                reason,
                method,
                level,
            } => self.log(Event::Dropped {
                reason,
                method,
                level,
            }),
            Action::Pong { ping } => self.pong(now, ping),
        }
    }

    fn deliver(&mut self, now: Instant, session: SessionId, message: Vec<u8>, what: Delivery) {
        let Some(&number) = self.by_sid.get(&session) else {
            return;
        };
        match &self.sessions[&number].kind {
            SessionKind::Legacy { stream } => {
                let stream = *stream;
                self.queue_on_stream(now, stream, Frame::Owned(sse::message_event(&message)));
            }
            SessionKind::Mcp(_) => self.mcp_deliver(now, number, message, what),
        }
    }

    fn queue_on_stream(&mut self, now: Instant, stream: StreamId, frame: Frame) {
        if let Some(state) = self.streams.get_mut(&stream) {
            state.last_frame = now;
            self.outputs.push_back(Output::ToStream { stream, frame });
        }
    }

    fn log(&mut self, event: Event) {
        self.outputs.push_back(Output::Log(event));
    }

    fn mint(&mut self) -> u64 {
        let n = self.next_id;
        self.next_id += 1;
        n
    }
}
