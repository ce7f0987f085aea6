//! The owner loop's state, shared by both shells: the [`Router`], the session queues, the
//! running backend, supervision and health bookkeeping. A shell's loop feeds it one input
//! at a time and only moves bytes: channels, sockets, pipes, timers and logging stay in the
//! shell, behind three small traits.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::action::{Action, DropReason, LogLevel};
use crate::auth::Principal;
use crate::config::Config;
use crate::http::Rejection;
use crate::metrics::{self, ShellGauges};
use crate::routed_id::SessionId;
use crate::router::{Accepted, Body, Router};
use crate::sse;
use crate::supervise::{AfterExit, Exit, Health, Supervisor};

/// One SSE frame for a session's stream: owned, or shared by every session of a broadcast.
#[derive(Debug, Clone)]
pub enum Frame {
    Owned(Vec<u8>),
    Shared(Arc<[u8]>),
}

impl Frame {
    pub fn len(&self) -> usize {
        match self {
            Frame::Owned(v) => v.len(),
            Frame::Shared(a) => a.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl AsRef<[u8]> for Frame {
    fn as_ref(&self) -> &[u8] {
        match self {
            Frame::Owned(v) => v,
            Frame::Shared(a) => a,
        }
    }
}

/// Frames already waiting are joined into one write up to this size.
pub const COALESCE_LIMIT: usize = 64 * 1024;

/// Joins `first` with the frames already waiting (pulled from `next` until it gives
/// `None`) into one write of about [`COALESCE_LIMIT`] bytes; a lone frame is not copied.
pub fn coalesce(first: Frame, mut next: impl FnMut() -> Option<Frame>) -> Frame {
    let Some(second) = next() else {
        return first;
    };
    let mut buf = Vec::with_capacity(COALESCE_LIMIT.max(first.len() + second.len()));
    buf.extend_from_slice(first.as_ref());
    buf.extend_from_slice(second.as_ref());
    while buf.len() < COALESCE_LIMIT {
        let Some(more) = next() else { break };
        buf.extend_from_slice(more.as_ref());
    }
    Frame::Owned(buf)
}

/// A queue or pipe that had no room (or whose reader is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// A session's outbound queue in a shell. `push` never waits: a full queue is the
/// slow-consumer rule and the hub closes the session.
pub trait SessionQueue {
    fn push(&self, frame: Frame) -> Result<(), Full>;
}

/// The running backend's stdin as a shell provides it.
pub trait BackendPipe {
    /// Room for one line, reserved by a POST handler before its message reached the loop.
    type Permit;
    fn pid(&self) -> u32;
    /// Writes a client's line into the room its POST reserved.
    fn write_client_line(&mut self, permit: Self::Permit, line: Vec<u8>);
    /// Writes one of the proxy's own lines if there is room now.
    fn write_proxy_line(&mut self, line: Vec<u8>) -> Result<(), Full>;
}

/// Whoever waits for the answer to a health ping (a `/health` request).
pub trait PongWaiter {
    fn answered(self);
}

/// The byte budget of one session queue: the loop charges each frame before queueing it,
/// the stream writer refunds it once the frame is handed to the socket.
#[derive(Debug, Clone)]
pub struct QueueBudget {
    queued: Arc<AtomicUsize>,
    limit: usize,
}

impl QueueBudget {
    pub fn new(limit: usize) -> Self {
        QueueBudget {
            queued: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    pub fn charge(&self, bytes: usize) -> Result<(), Full> {
        let before = self.queued.fetch_add(bytes, Ordering::AcqRel);
        if before + bytes > self.limit {
            self.queued.fetch_sub(bytes, Ordering::AcqRel);
            return Err(Full);
        }
        Ok(())
    }

    /// Charges `frame` and hands it to `send` (a non-blocking channel send); a frame that
    /// does not fit, or whose receiver is gone, is refused and not charged.
    pub fn admit<E>(
        &self,
        frame: Frame,
        send: impl FnOnce(Frame) -> Result<(), E>,
    ) -> Result<(), Full> {
        let len = frame.len();
        self.charge(len)?;
        send(frame).map_err(|_| {
            self.refund(len);
            Full
        })
    }

    pub fn refund(&self, bytes: usize) {
        self.queued.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Why a session ended, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    ClientGone,
    SlowConsumer,
    BackendExited,
    Shutdown,
}

/// Something a shell should log, at [`Event::level`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    SessionOpened {
        session: SessionId,
        principal: Principal,
    },
    SessionClosed {
        session: SessionId,
        reason: CloseReason,
    },
    Dropped {
        reason: DropReason,
        method: Option<String>,
        level: LogLevel,
    },
    BackendStarted {
        pid: u32,
    },
    BackendExited {
        pid: u32,
        exit: Exit,
    },
    Restarting {
        after: Duration,
    },
    ShuttingDown {
        status: i32,
    },
    Unresponsive {
        silent: Duration,
    },
}

/// Log levels the hub asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Warn,
    Info,
    Debug,
}

impl Event {
    pub fn level(&self) -> Level {
        match self {
            Event::SessionClosed {
                reason: CloseReason::SlowConsumer,
                ..
            }
            | Event::BackendExited { .. }
            | Event::Unresponsive { .. } => Level::Warn,
            Event::Dropped {
                level: LogLevel::Warn,
                ..
            } => Level::Warn,
            Event::Dropped { .. } => Level::Debug,
            _ => Level::Info,
        }
    }

    /// The session the event is about, for the shell's per-session span or field.
    pub fn session(&self) -> Option<SessionId> {
        match self {
            Event::SessionOpened { session, .. } | Event::SessionClosed { session, .. } => {
                Some(*session)
            }
            _ => None,
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::SessionOpened { principal, .. } => {
                write!(f, "session opened for principal {principal}")
            }
            Event::SessionClosed { reason, .. } => match reason {
                CloseReason::ClientGone => f.write_str("session closed: stream ended"),
                CloseReason::SlowConsumer => {
                    f.write_str("session closed: client is not reading its stream")
                }
                CloseReason::BackendExited => f.write_str("session closed: backend exited"),
                CloseReason::Shutdown => f.write_str("session closed: shutting down"),
            },
            Event::Dropped { reason, method, .. } => write!(
                f,
                "backend message not delivered: reason={reason} method={}",
                method.as_deref().unwrap_or("-")
            ),
            Event::BackendStarted { pid } => write!(f, "backend started, pid {pid}"),
            Event::BackendExited { pid, exit } => match exit {
                Exit::Code(code) => write!(f, "backend pid {pid} exited with status {code}"),
                Exit::Signal => write!(f, "backend pid {pid} was killed by a signal"),
            },
            Event::Restarting { after } => {
                write!(f, "restarting backend in {} ms", after.as_millis())
            }
            Event::ShuttingDown { status } => write!(
                f,
                "backend will not be restarted; shutting down with status {status}"
            ),
            Event::Unresponsive { silent } => write!(
                f,
                "backend has not answered a ping for {} ms",
                silent.as_millis()
            ),
        }
    }
}

/// A one-shot answer to a request handler waiting in the shell.
pub type Reply<T> = Box<dyn FnOnce(T) + Send>;

/// Everything a shell's loop feeds the hub, from its handlers and backend readers.
pub enum Input<Q, P, W> {
    /// `GET /sse`: the shell made the session's queue; the reply says whether it is open.
    Open {
        session: SessionId,
        principal: Principal,
        queue: Q,
        reply: Reply<Result<(), Rejection>>,
    },
    /// `POST /messages`: `body` is `None` when larger than `--max-body`; `permit` is the
    /// room reserved in the backend's stdin (`None` when none came in time).
    Post {
        session: String,
        principal: Principal,
        body: Option<Vec<u8>>,
        permit: Option<P>,
        reply: Reply<Result<Accepted, Rejection>>,
    },
    /// A refusal the HTTP layer decided on its own: counted only.
    Refused(Rejection),
    /// `GET /health`: the reply says whether a ping went out for `waiter` to wait on.
    Health {
        waiter: W,
        reply: Reply<(Health, bool)>,
    },
    /// `GET /metrics`.
    Metrics { reply: Reply<String> },
    /// Lines the backend of `generation` wrote (`None`: a line over `--max-line`).
    BackendLines {
        generation: u64,
        batch: Vec<Option<Vec<u8>>>,
    },
    /// The backend of `generation` exited.
    BackendExited { generation: u64, exit: Exit },
}

struct Running<B> {
    pipe: B,
    generation: u64,
    started: Instant,
}

/// The loop's state. Every input takes `now` from the shell's clock.
pub struct Hub<Q, B: BackendPipe, W> {
    router: Router,
    sessions: HashMap<SessionId, Q>,
    backend: Option<Running<B>>,
    generation: u64,
    supervisor: Supervisor,
    ping_timeout: Duration,
    pong_waiters: Vec<(u64, W)>,
    last_pong: Option<Instant>,
    unanswered_since: Option<Instant>,
    events: VecDeque<Event>,
}

impl<Q: SessionQueue, B: BackendPipe, W: PongWaiter> Hub<Q, B, W> {
    pub fn new(config: &Config) -> Self {
        Hub {
            router: Router::new(config.max_sessions),
            sessions: HashMap::new(),
            backend: None,
            generation: 0,
            supervisor: Supervisor::new(config.restart),
            ping_timeout: config.ping_timeout,
            pong_waiters: Vec::new(),
            last_pong: None,
            unanswered_since: None,
            events: VecDeque::new(),
        }
    }

    /// The next thing to log; drain after every input.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The generation number for the backend about to be spawned; lines and exits tagged
    /// with an older one are ignored.
    pub fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    pub fn is_current(&self, generation: u64) -> bool {
        self.backend
            .as_ref()
            .is_some_and(|r| r.generation == generation)
    }

    pub fn backend_started(&mut self, pipe: B, generation: u64, now: Instant) {
        self.events
            .push_back(Event::BackendStarted { pid: pipe.pid() });
        self.backend = Some(Running {
            pipe,
            generation,
            started: now,
        });
        self.last_pong = None;
        self.unanswered_since = None;
        self.router.backend_started();
        self.drain(None, now);
    }

    /// Handles one input from the shell; `Some` when the backend exited and the shell
    /// must restart it or shut down.
    pub fn input(&mut self, input: Input<Q, B::Permit, W>, now: Instant) -> Option<AfterExit> {
        match input {
            Input::Open {
                session,
                principal,
                queue,
                reply,
            } => reply(self.open_session(session, principal, queue, now)),
            Input::Post {
                session,
                principal,
                body,
                permit,
                reply,
            } => {
                let body = match &body {
                    Some(bytes) => Body::Complete(bytes),
                    None => Body::TooLarge,
                };
                reply(self.client_message(&session, &principal, body, permit, now))
            }
            Input::Refused(rejection) => self.count_rejection(&rejection),
            Input::Health { waiter, reply } => reply(self.health(waiter, now)),
            Input::Metrics { reply } => reply(self.metrics_text()),
            Input::BackendLines { generation, batch } => self.backend_lines(generation, batch, now),
            Input::BackendExited { generation, exit } => {
                return self.backend_exited(generation, exit, now)
            }
        }
        None
    }

    /// Opens a session for `principal` with the shell's `queue` for its stream.
    pub fn open_session(
        &mut self,
        session: SessionId,
        principal: Principal,
        queue: Q,
        now: Instant,
    ) -> Result<(), Rejection> {
        self.router.open_session(session, principal.clone())?;
        self.sessions.insert(session, queue);
        self.events
            .push_back(Event::SessionOpened { session, principal });
        self.drain(None, now);
        Ok(())
    }

    /// A POST for `session`. `permit` is the room its handler reserved in the backend's
    /// stdin; `None` when none could be had in time (503 unless an earlier check fails).
    pub fn client_message(
        &mut self,
        session: &str,
        principal: &Principal,
        body: Body<'_>,
        permit: Option<B::Permit>,
        now: Instant,
    ) -> Result<Accepted, Rejection> {
        let Some(permit) = permit else {
            let refusal = self
                .router
                .check_client_message(session, principal, body)
                .err()
                .unwrap_or(Rejection::BackendBusy);
            self.router.count_rejection(&refusal);
            return Err(refusal);
        };
        let result = self.router.client_message(session, principal, body);
        self.drain(Some(permit), now);
        result
    }

    /// Counts a refusal the HTTP layer decided on its own (401, 403, 404 path, 405).
    pub fn count_rejection(&mut self, rejection: &Rejection) {
        self.router.count_rejection(rejection);
    }

    /// A `/health` request: pings the backend now (when it runs) and registers `waiter`
    /// for the answer. The report says `answered: false`; the shell sets it when woken.
    pub fn health(&mut self, waiter: W, now: Instant) -> (Health, bool) {
        let pinging = self.backend.is_some();
        if pinging {
            let n = self.router.health_ping();
            self.unanswered_since.get_or_insert(now);
            self.pong_waiters.push((n, waiter));
            self.drain(None, now);
        }
        let running = self.backend.as_ref();
        let health = Health {
            running: running.is_some(),
            pid: running.map(|r| r.pipe.pid()),
            restarts: self.supervisor.restarts(),
            since_last_pong: self.last_pong.map(|t| now.saturating_duration_since(t)),
            answered: false,
            sessions: self.router.live_sessions(),
        };
        (health, pinging)
    }

    /// The Prometheus text for `/metrics`.
    pub fn metrics_text(&self) -> String {
        let gauges = ShellGauges {
            live_sessions: self.router.live_sessions(),
            backend_running: self.backend.is_some(),
            backend_restarts: self.supervisor.restarts(),
        };
        metrics::render(self.router.metrics(), gauges)
    }

    /// Lines the backend of `generation` wrote (`None`: a line over `--max-line`).
    pub fn backend_lines(
        &mut self,
        generation: u64,
        batch: impl IntoIterator<Item = Option<Vec<u8>>>,
        now: Instant,
    ) {
        if !self.is_current(generation) {
            return;
        }
        for line in batch {
            match line {
                Some(line) => self.router.backend_line(&line),
                None => self.router.backend_line_too_long(),
            }
            self.drain(None, now);
        }
    }

    /// The backend of `generation` exited: sessions are closed and the policy decides.
    /// `None` for a stale generation.
    pub fn backend_exited(
        &mut self,
        generation: u64,
        exit: Exit,
        now: Instant,
    ) -> Option<AfterExit> {
        if !self.is_current(generation) {
            return None;
        }
        let running = self.backend.take().expect("the current generation runs");
        self.events.push_back(Event::BackendExited {
            pid: running.pipe.pid(),
            exit,
        });
        self.pong_waiters.clear();
        self.router.backend_exited();
        self.drain(None, now);
        let decision = self
            .supervisor
            .exited(exit, now.saturating_duration_since(running.started));
        self.events.push_back(match decision {
            AfterExit::Restart { after } => Event::Restarting { after },
            AfterExit::Shutdown { status } => Event::ShuttingDown { status },
        });
        Some(decision)
    }

    /// The `--ping-interval` timer fired.
    pub fn periodic_ping(&mut self, now: Instant) {
        if self.backend.is_none() {
            return;
        }
        if let Some(since) = self.unanswered_since {
            let silent = now.saturating_duration_since(since);
            if silent >= self.ping_timeout {
                self.events.push_back(Event::Unresponsive { silent });
            }
        }
        let _ = self.router.health_ping();
        self.unanswered_since.get_or_insert(now);
        self.drain(None, now);
    }

    /// A session's stream ended on the shell's side (client gone, write error).
    pub fn stream_closed(&mut self, session: SessionId, now: Instant) {
        if self.sessions.remove(&session).is_some() {
            self.events.push_back(Event::SessionClosed {
                session,
                reason: CloseReason::ClientGone,
            });
        }
        self.router.close_session(&session);
        self.drain(None, now);
    }

    /// Ends every stream and hands the backend to the shell to stop (SPEC section 5).
    pub fn shut_down(&mut self, now: Instant) -> Option<B> {
        let sessions: Vec<SessionId> = self.sessions.keys().copied().collect();
        for session in sessions {
            self.sessions.remove(&session);
            self.router.close_session(&session);
            self.events.push_back(Event::SessionClosed {
                session,
                reason: CloseReason::Shutdown,
            });
        }
        self.drain(None, now);
        self.pong_waiters.clear();
        self.backend.take().map(|r| r.pipe)
    }

    fn drain(&mut self, mut permit: Option<B::Permit>, now: Instant) {
        while let Some(action) = self.router.poll_action() {
            self.execute(action, &mut permit, now);
        }
    }

    /// Performs one action: only moving bytes, every decision is the router's.
    fn execute(&mut self, action: Action, permit: &mut Option<B::Permit>, now: Instant) {
        match action {
            Action::Rewrite { line } => match (permit.take(), self.backend.as_mut()) {
                (Some(permit), Some(running)) => running.pipe.write_client_line(permit, line),
                _ => self.write_proxy_line(line),
            },
            Action::Reply { line } => self.write_proxy_line(line),
            Action::Deliver { session, message } => {
                let frame = Frame::Owned(sse::message_event(&message));
                let full = self
                    .sessions
                    .get(&session)
                    .is_some_and(|queue| queue.push(frame).is_err());
                if full {
                    self.slow_consumer(session);
                }
            }
            Action::Broadcast { message } => {
                let frame: Arc<[u8]> = Arc::from(sse::message_event(&message));
                let slow: Vec<SessionId> = self
                    .sessions
                    .iter()
                    .filter(|(_, queue)| queue.push(Frame::Shared(frame.clone())).is_err())
                    .map(|(sid, _)| *sid)
                    .collect();
                for session in slow {
                    self.slow_consumer(session);
                }
            }
            Action::Drop {
                reason,
                method,
                level,
            } => self.events.push_back(Event::Dropped {
                reason,
                method,
                level,
            }),
            Action::CloseSession { session } => {
                if self.sessions.remove(&session).is_some() {
                    self.events.push_back(Event::SessionClosed {
                        session,
                        reason: CloseReason::BackendExited,
                    });
                }
            }
            Action::Pong { ping } => {
                self.last_pong = Some(now);
                self.unanswered_since = None;
                let (answered, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pong_waiters)
                    .into_iter()
                    .partition(|(n, _)| *n <= ping);
                self.pong_waiters = waiting;
                for (_, waiter) in answered {
                    waiter.answered();
                }
            }
        }
    }

    /// A session whose queue is full is closed, never thinned and never waited for.
    fn slow_consumer(&mut self, session: SessionId) {
        if self.sessions.remove(&session).is_some() {
            self.events.push_back(Event::SessionClosed {
                session,
                reason: CloseReason::SlowConsumer,
            });
        }
        self.router.close_session(&session);
    }

    /// The proxy's own lines never wait: with no room they are dropped and counted.
    fn write_proxy_line(&mut self, line: Vec<u8>) {
        let written = self
            .backend
            .as_mut()
            .is_some_and(|r| r.pipe.write_proxy_line(line).is_ok());
        if !written {
            self.router.count_backend_queue_full();
        }
    }
}
