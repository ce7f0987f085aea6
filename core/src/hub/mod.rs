//! The whole owner loop as one sans-IO state machine. The [`Hub`] coordinates small parts
//! that own their state and answer for their own deadlines:
//!
//! | part | owns |
//! |---|---|
//! | `backend` | the process: spawn, restart backoff, stdin budget, pings, `/health` waiters, the stop sequence; it writes its own outputs |
//! | `sessions` | the one table of live sessions (principal, kind, subscriptions, creation order), the Streamable timers (idle, resume window) and the streams' logs and windows |
//! | `in_flight` | every request in flight of either transport and era (its record: how its answer travels, its progress token, its timeout, its observation context) |
//! | `exchanges` | the HTTP exchanges owed an answer: each one's CORS origin and observation context until `respond` |
//! | `streams` | open SSE streams, what is sent on them and their end, their keep-alives |
//! | `listen` | the 2026-07-28 listen streams: what each gets, the uris they hold, their keep-alives |
//! | `modern` | the 2026-07-28 requests in flight: each one's key, caller and lane, what its answer needs |
//! | `resume` | each Streamable session's event log: numbered events kept for resumption |
//! | `keys` | the key sets: their fetches, refreshes and backoff (SPEC section 9) |
//! | `authz` | the policy's decisions, remembered, and the filtering of list results (SPEC section 10) |
//! | `tasks` | the backend's tasks and their owners, the cursors minted for each owner (SPEC section 15) |
//! | `deadlines` | the timer set the other parts keep their deadlines in |
//!
//! Beside them the hub holds the `Router` (the message-level rules of SPEC sections 2 and
//! 3, returning decisions), the rate limits' token buckets (`crate::limits`), the POSTs
//! waiting for a restarted backend (`post`'s `WaitingPosts`), the metrics and the output
//! queue. A part imports only other parts, never a behaviour file, and the behaviour files
//! import one another one way: besides `Hub` itself, which every file names, the hub's
//! imports form no circle. The behaviour files (each adds `impl Hub` methods) say what each
//! input does: `post` a legacy session and every POST, `mcp` the rest of `/mcp`,
//! `resumption` Streamable streams (numbered, kept, resumed), `dispatch` a backend line,
//! `fetching` what a key set fetch brought, `lifecycle` the backend's and the proxy's life,
//! `reload` a configuration read again; `settle` is the one exit of a request owed an
//! answer; `auditing` is the one reader of how a request, a session or a refusal ended
//! (`observe`); `inspect` is the read-only view ([`Hub::inspect`]).
//!
//! The loop contract is the crate's: every input but `handle_lost` takes `now`;
//! after each one the shell drains [`Hub::poll_output`] and performs every [`Output`] in
//! order (an input that arises while it does is fed at once, its outputs joining the
//! drain), then sleeps until its next input or [`Hub::poll_timeout`], whichever comes
//! first, and calls [`Hub::handle_timeout`] when the latter passes. The hub refers to the
//! shell's things by the ids it hands out ([`RequestId`], [`StreamId`], [`BackendId`]); the
//! shell keeps its own maps from those ids to senders, sockets and processes.

mod auditing;
mod authz;
mod backend;
mod deadlines;
mod delivery;
mod dispatch;
mod exchanges;
mod fetching;
mod in_flight;
mod inspect;
mod keys;
mod lifecycle;
mod listen;
mod mcp;
mod measuring;
mod modern;
mod post;
mod reload;
mod resume;
mod resumption;
mod sessions;
mod settle;
mod spans;
mod streams;
mod tasks;

use std::collections::VecDeque;
use std::time::Instant;

pub use crate::http::{Body, Payload, Request};
pub use crate::settings::{
    Reload, Settings, BACKEND_WINDOW, EXIT_DRAIN, RESUME_GLOBAL, STDIN_QUEUE, STDIN_WINDOW,
};
pub use auditing::{Refusal, TurnedAway};
pub use inspect::{Inspect, TableSizes};
pub use keys::Fetched;
pub use resume::MAX_FINISHED_KEPT;

use auditing::Happened;
use backend::{BackendProcess, LineFrom, Phase};
use exchanges::{Answer, Exchange, Exchanges};
use in_flight::InFlight;
use post::WaitingPosts;
use sessions::{Gone, SessionTimer, Sessions};
use streams::{Role, Streams};

use crate::http::{self, Endpoint, Rejection, Response};
use crate::metrics::{DropReason, Metrics};
use crate::output::{BackendId, Event, Output, RequestId, StreamEnd, StreamId};
use crate::router::Router;
use crate::supervise::Health;

/// A message dropped (or answered by the proxy) for `reason`: counted, and logged at the
/// level the metrics decide (the first of each reason and method at WARN).
fn dropped(
    (metrics, outputs): (&mut Metrics, &mut VecDeque<Output>),
    reason: DropReason,
    method: Option<&str>,
) {
    let level = metrics.dropped(reason, method);
    let method = method.map(str::to_owned);
    outputs.push_back(Output::Log(Event::Dropped {
        reason,
        method,
        level,
    }));
}

/// The owner loop's state; see the [module docs](self) for the loop contract.
#[derive(Debug)]
pub struct Hub {
    settings: Settings,
    router: Router,
    backend: BackendProcess,
    sessions: Sessions,
    in_flight: InFlight,
    streams: Streams,
    listeners: listen::Listeners,
    posts: WaitingPosts,
    /// 2026-07-28 requests in flight (SPEC section 13).
    modern: modern::ModernRequests,
    metrics: Metrics,
    keys: keys::KeySets,
    buckets: crate::limits::Buckets,
    exchanges: Exchanges,
    decisions: authz::Decisions,
    /// The backend's tasks and who owns each (SPEC section 15).
    tasks: tasks::Tasks,
    /// The backend's own tool names, read for the operator's tool view (SPEC section 16).
    backend_tools: crate::tools::BackendTools,
    outputs: VecDeque<Output>,
    next_id: u64,
}

impl Hub {
    /// A hub that starts the backend at once ([`Output::SpawnBackend`]).
    pub fn new(settings: Settings, now: Instant) -> Self {
        let mut hub = Hub {
            router: Router::new(),
            backend: BackendProcess::new(settings.restart, &settings),
            sessions: Sessions::new(settings.max_sessions),
            in_flight: InFlight::default(),
            streams: Streams::new(settings.keepalive),
            listeners: listen::Listeners::new(settings.keepalive),
            posts: WaitingPosts::default(),
            modern: modern::ModernRequests::default(),
            metrics: Metrics::default(),
            keys: keys::KeySets::new(&settings.key_sources, now),
            buckets: crate::limits::Buckets::default(),
            exchanges: Exchanges::default(),
            decisions: authz::Decisions::default(),
            tasks: tasks::Tasks::new(settings.max_tasks_per_owner),
            backend_tools: crate::tools::BackendTools::default(),
            settings,
            outputs: VecDeque::new(),
            next_id: 1,
        };
        let list_cache = hub.settings.list_cache;
        (hub.router.lists).configure(list_cache.is_some(), list_cache.unwrap_or_default());
        let backend = BackendId(hub.mint());
        hub.backend.spawn(backend, &mut hub.outputs);
        hub.keys.start_due(now, &mut hub.next_id, &mut hub.outputs);
        hub
    }

    /// The next thing to do; drain until `None` after every input.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// When [`Hub::handle_timeout`] must be called next: the earliest deadline of any part.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.backend.phase() == Phase::Exited {
            return None;
        }
        [
            self.backend.poll_timeout(),
            self.sessions.poll_timeout(),
            self.in_flight.poll_timeout(),
            self.posts.poll_timeout(),
            self.streams.poll_timeout(),
            self.listeners.poll_timeout(),
            self.keys.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs every timer due at `now`, part by part.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.backend.phase() == Phase::Exited {
            return;
        }
        let (next_id, outputs) = (&mut self.next_id, &mut self.outputs);
        if self.backend.handle_timeout(now, next_id, outputs) {
            let (_, line) = self.backend.ping(now, &mut self.router);
            self.queue_line(now, line, LineFrom::Proxy);
        }
        if let Some(silent) = self.backend.newly_unresponsive(now) {
            let event = Event::Unresponsive { silent };
            self.outputs.push_back(Output::Log(event));
        }
        while let Some((caller, key)) = self.in_flight.take_due(now) {
            self.request_timed_out(now, caller, &key);
        }
        while let Some(timer) = self.sessions.take_due(now) {
            match timer {
                SessionTimer::Idle(number) => {
                    let (idle, busy) =
                        (self.settings.session_idle, self.in_flight.count(number) > 0);
                    if self.sessions.idle_ends(now, number, idle, busy) {
                        self.end_session(now, number, crate::output::CloseReason::Idle);
                    }
                }
                SessionTimer::Resume(number, key) => {
                    self.stream_gone(now, number, key, Gone::WindowPassed)
                }
            }
        }
        while let Some(post) = self.posts.take_due(now) {
            self.respond(now, post.request, Answer::Rejected(Rejection::BackendDown));
        }
        for request in self.backend.health_due(now) {
            self.respond(now, request, Answer::Health(false));
        }
        self.streams.handle_timeout(now, &mut self.outputs);
        (self.listeners).handle_timeout(now, &self.sessions, listen::upstream!(self));
        self.keys
            .start_due(now, &mut self.next_id, &mut self.outputs);
    }

    /// An admitted HTTP request; its answer comes as [`Output::Respond`] or
    /// [`Output::StartStream`] naming the returned id, now or later. Every request is
    /// answered: once the hub has emitted [`Output::Exit`] each one is refused (503) at
    /// once, so a shell feeds the requests it still had queued and answers them as usual.
    pub fn handle_request(&mut self, now: Instant, mut request: Request) -> RequestId {
        let id = RequestId(self.mint());
        if let (crate::settings::Modern::Off, Body::Message(msg)) =
            (self.settings.modern, &mut request.body)
        {
            // Under `--modern off` no request is of the 2026-07-28 era, not even to the
            // observers or the rate limit's error code.
            msg.modern = None;
        }
        let exchange = Exchange {
            cors: request.cors.take(),
            started: auditing::arrived((&self.settings, &self.router), now, &mut request),
        };
        self.exchanges.open(id, exchange);
        match self.backend.phase() {
            Phase::Running => {}
            Phase::Exited | Phase::Stopping { .. } => {
                self.respond(now, id, Answer::Rejected(Rejection::BackendDown));
                return id;
            }
        }
        let result = match request.endpoint {
            Endpoint::Stream => self.open_legacy(now, id, request),
            Endpoint::Messages | Endpoint::McpPost => self.post(now, id, request),
            Endpoint::McpGet | Endpoint::McpDelete => self.mcp_named(now, id, &request),
            Endpoint::Preflight => {
                // The preflight's answer names its origin itself.
                let cors = self.exchanges.take_cors(id);
                self.respond(now, id, Answer::Served(http::preflight(cors.as_deref())));
                Ok(())
            }
            // Answered once the backend answers a ping of its own (or the wait ends).
            Endpoint::Health if self.backend.is_up() => {
                let (ping, line) = self.backend.ping(now, &mut self.router);
                self.queue_line(now, line, LineFrom::Proxy);
                self.backend.ping_sent(now, Some((id, ping)));
                Ok(())
            }
            Endpoint::Health => {
                self.respond(now, id, Answer::Health(false));
                Ok(())
            }
            Endpoint::ResourceMetadata => {
                let response = http::metadata_response(self.settings.oauth.as_deref());
                self.respond(now, id, Answer::Served(response));
                Ok(())
            }
            Endpoint::Metrics => {
                let text = self.inspect().metrics_text().into_bytes();
                let response = Response::text(200, "text/plain; version=0.0.4", text);
                self.respond(now, id, Answer::Served(response));
                Ok(())
            }
        };
        if let Err(rejection) = result {
            self.respond(now, id, Answer::Rejected(rejection));
        }
        id
    }

    /// The shell could not start what would serve a new connection (a thread), so its
    /// request was never read: the answer for it comes as [`Output::Respond`] (503 with
    /// `Retry-After`, the connection closed), counted like every refusal.
    pub fn handle_unserved(&mut self, now: Instant) -> RequestId {
        let id = RequestId(self.mint());
        self.exchanges.open(id, Exchange::default());
        self.respond(now, id, Answer::Rejected(Rejection::Overloaded));
        id
    }

    /// A request the shell refused before the hub saw it (and answered): by the gate
    /// (counted) or by the framing rules; audited either way. A token naming a key its
    /// issuer's key sets lack refetches those sets only (at most once per 30 s per URL).
    pub fn handle_refused(&mut self, now: Instant, turned_away: TurnedAway) {
        let (why, claimed_issuer) = (turned_away.why, turned_away.claimed_issuer);
        self.observe(now, Happened::TurnedAway(why, turned_away.asked));
        let Refusal::Gate(rejection) = why else {
            return;
        };
        self.metrics.rejected(&rejection);
        if rejection == Rejection::Unauthorized(crate::principal::AuthFailure::UnknownKey)
            && claimed_issuer.is_some_and(|issuer| self.keys.unknown_kid(now, &issuer))
        {
            self.keys
                .start_due(now, &mut self.next_id, &mut self.outputs);
        }
    }

    /// A stream ended on the shell's side (the client left, or its queue was full): a
    /// legacy session ends with it; a Streamable session only loses that stream; a listen
    /// stream ends.
    pub fn handle_stream_closed(&mut self, now: Instant, stream: StreamId, end: StreamEnd) {
        let Some(state) = self.streams.remove(stream) else {
            let upstream = listen::upstream!(self);
            return (self.listeners).closed(now, stream, &mut self.sessions, upstream);
        };
        let reason = match end {
            StreamEnd::ClientGone => crate::output::CloseReason::ClientGone,
            StreamEnd::Full => crate::output::CloseReason::SlowConsumer,
        };
        match (state.role, state.session) {
            (Role::Modern(key), _) => self.modern_client_left(now, key),
            (Role::Legacy, Some(number)) => self.end_session(now, number, reason),
            (Role::Mcp(key), Some(number)) => self.stream_gone(now, number, key, Gone::ClientLeft),
            (_, None) => unreachable!("a session's stream names its session"),
        }
    }

    /// Lines `backend` wrote on stdout, without their newlines; `None` for a line longer
    /// than `--max-line`, which was skipped.
    pub fn handle_backend_lines<L: AsRef<[u8]>>(
        &mut self,
        now: Instant,
        backend: BackendId,
        lines: impl IntoIterator<Item = Option<L>>,
    ) {
        if self.backend.current() != Some(backend) {
            return;
        }
        for line in lines {
            self.metrics.backend_lines += 1;
            match line {
                Some(line) => {
                    let routed = self.router.backend_line(line.as_ref());
                    self.dispatch(now, routed);
                }
                None => self.drop_message(DropReason::LineTooLong, None),
            }
        }
    }

    /// `lines` more lines queued for `backend`'s stdin were written: their sessions get
    /// their share of the queue back, and the shell gets the next lines.
    pub fn handle_backend_wrote(&mut self, now: Instant, backend: BackendId, lines: usize) {
        self.backend.wrote(backend, lines);
        self.backend.release(now, &mut self.outputs, false);
    }

    /// A read-only view of the hub's tables: what `/metrics` and the tests read.
    pub fn inspect(&self) -> Inspect<'_> {
        Inspect { hub: self }
    }

    // -----------------------------------------------------------------------------------
    // What every part's decisions come down to

    /// Answers `request` with the head of `stream`, which then carries `role`'s frames for
    /// `session` (with keep-alives when idle).
    fn start_stream(
        &mut self,
        now: Instant,
        request: RequestId,
        (stream, head): (StreamId, Response),
        session: sessions::SessionNumber,
        role: Role,
    ) {
        self.respond(now, request, Answer::Stream(stream, head));
        self.streams.open(now, stream, session, role);
    }

    /// Queues a line for the backend's stdin within its part of the budget; a proxy line
    /// that does not fit is dropped and counted.
    fn queue_line(&mut self, now: Instant, line: Vec<u8>, from: LineFrom) {
        let parts = (&mut self.metrics, &mut self.backend, &mut self.outputs);
        backend::queued(parts, now, line, from);
    }

    /// The one way an answer leaves the hub: the exchange's record is closed, its CORS
    /// headers added, a refusal counted and, while the request's observation context is
    /// still with the exchange (it was not accepted), observed.
    fn respond(&mut self, now: Instant, request: RequestId, answer: Answer) {
        let exchange = self.exchanges.close(request);
        debug_assert!(exchange.is_some(), "{request:?} answered twice");
        let mut exchange = exchange.unwrap_or_default();
        let parts = (&self.backend, &self.sessions, &self.keys, &self.settings);
        let (mut response, stream, denied) = match built(parts, now, answer) {
            Answer::Served(response) => (response, None, false),
            Answer::Denied(response) => (response, None, true),
            Answer::Refused(rejection, response) => {
                self.metrics.rejected(&rejection);
                (response, None, false)
            }
            Answer::Stream(stream, head) => (head, Some(stream), false),
            Answer::Rejected(_) | Answer::Health(_) => unreachable!("built above"),
        };
        // Not accepted: its event is this answer's (a stream's context went with it).
        if let Some(started) = exchange.started.take().filter(|_| stream.is_none()) {
            let happened = match denied {
                true => {
                    let denied = Some(crate::audit::Outcome::Denied);
                    Happened::answered(None, started, &response.body, denied)
                }
                false => Happened::Refused(started, &response),
            };
            self.observe(now, happened);
        }
        if let Some(origin) = &exchange.cors {
            http::add_cors(&mut response, origin);
        }
        let output = match stream {
            Some(stream) => Output::StartStream {
                request,
                stream,
                head: response,
                budget: self.settings.session_buffer,
            },
            None => Output::Respond { request, response },
        };
        self.outputs.push_back(output);
    }

    /// Counts and logs a message that went nowhere, at the level the counters decide.
    fn drop_message(&mut self, reason: DropReason, method: Option<&str>) {
        dropped((&mut self.metrics, &mut self.outputs), reason, method);
    }

    fn mint(&mut self) -> u64 {
        let n = self.next_id;
        self.next_id += 1;
        n
    }
}

/// `answer` as it goes out: a rejection's response (a 503 for want of a backend says when
/// it restarts, as admission gives it) and the `/health` report (`answered`: the backend
/// answered the ping it waited for) built from the parts that know.
fn built(
    (backend, sessions, keys, settings): (&BackendProcess, &Sessions, &keys::KeySets, &Settings),
    now: Instant,
    answer: Answer,
) -> Answer {
    match answer {
        Answer::Rejected(Rejection::BackendDown) => {
            let restart_in = backend.until_restart(now);
            let refused = crate::admission::Refused::BackendDown { restart_in };
            refused.refusal(None, None).into()
        }
        Answer::Rejected(rejection) => crate::admission::Refusal::from(rejection).into(),
        Answer::Health(answered) => {
            let report = Health {
                running: backend.is_up(),
                pid: backend.pid(),
                restarts: backend.restarts(),
                since_last_pong: backend.since_last_pong(now),
                answered,
                sessions: sessions.len(),
                instance: settings.instance,
                keys_unavailable: keys.configured()
                    && !settings.configured_keys
                    && !keys.available(),
            };
            let (status, body) = report.response();
            Answer::Served(Response::json(status, body))
        }
        answer => answer,
    }
}
