//! The one owner: a single loop holds the `Router`, the session queues and the backend,
//! takes one input at a time, drains the router's actions and performs them. No lock is
//! held anywhere and no send into a session ever waits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use switchboard_core::config::Config;
use switchboard_core::metrics::{self, ShellGauges};
use switchboard_core::router::{Accepted, Body};
use switchboard_core::supervise::{AfterExit, Exit, Health, Supervisor as Policy};
use switchboard_core::{sse, Action, LogLevel, Principal, Rejection, Router, SessionId};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::backend::{self, Backend, Signal};
use crate::session::{self, SessionQueue, SessionStream};

/// The current backend's stdin queue, for POST handlers to reserve room in before the
/// loop sees their message (`None` while the backend is down).
pub type StdinSlot = watch::Receiver<Option<mpsc::Sender<Vec<u8>>>>;

/// Room reserved in the backend's stdin queue for one client line.
pub type StdinPermit = mpsc::OwnedPermit<Vec<u8>>;

/// Everything the loop reacts to.
pub enum Input {
    Open {
        session: SessionId,
        principal: Principal,
        reply: oneshot::Sender<Result<SessionStream, Rejection>>,
    },
    Post {
        session: String,
        principal: Principal,
        /// `None` when the body was larger than `--max-body`.
        body: Option<Bytes>,
        /// `None` when the backend's queue stayed full (or the backend is down).
        permit: Option<StdinPermit>,
        reply: oneshot::Sender<Result<Accepted, Rejection>>,
    },
    /// A refusal the HTTP layer decided (401, 403, 404, 405): counted only.
    Refused(Rejection),
    Health {
        reply: oneshot::Sender<(Health, Option<oneshot::Receiver<()>>)>,
    },
    Metrics {
        reply: oneshot::Sender<String>,
    },
    BackendLines {
        generation: u64,
        /// `None` stands for a line that was too long and skipped.
        batch: Vec<Option<Vec<u8>>>,
    },
    BackendExited {
        generation: u64,
        exit: Exit,
    },
}

struct Running {
    backend: Backend,
    generation: u64,
    started: Instant,
}

pub struct Supervisor {
    config: Arc<Config>,
    command: Vec<String>,
    router: Router,
    sessions: HashMap<SessionId, SessionQueue>,
    backend: Option<Running>,
    generation: u64,
    policy: Policy,
    restart_at: Option<Instant>,
    stdin_slot: watch::Sender<Option<mpsc::Sender<Vec<u8>>>>,
    inputs_tx: mpsc::Sender<Input>,
    inputs: mpsc::Receiver<Input>,
    closed_tx: mpsc::UnboundedSender<SessionId>,
    closed: mpsc::UnboundedReceiver<SessionId>,
    pong_waiters: Vec<(u64, oneshot::Sender<()>)>,
    last_pong: Option<Instant>,
    unanswered_since: Option<Instant>,
}

impl Supervisor {
    pub fn new(
        config: Arc<Config>,
        command: Vec<String>,
    ) -> (Self, mpsc::Sender<Input>, StdinSlot) {
        let (inputs_tx, inputs) = mpsc::channel(1024);
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let (stdin_slot, slot_rx) = watch::channel(None);
        let supervisor = Supervisor {
            router: Router::new(config.max_sessions),
            policy: Policy::new(config.restart),
            config,
            command,
            sessions: HashMap::new(),
            backend: None,
            generation: 0,
            restart_at: None,
            stdin_slot,
            inputs_tx: inputs_tx.clone(),
            inputs,
            closed_tx,
            closed,
            pong_waiters: Vec::new(),
            last_pong: None,
            unanswered_since: None,
        };
        (supervisor, inputs_tx, slot_rx)
    }

    /// Runs until a shutdown signal (exit status 0) or until a backend that will not be
    /// restarted exits (its status). Either way sessions are ended and the backend stopped.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
        stop_accepting: oneshot::Sender<()>,
    ) -> i32 {
        if let Err(e) = self.start_backend() {
            error!("cannot start backend {:?}: {e}", self.command);
            return 1;
        }
        let mut ping = tokio::time::interval(self.config.ping_interval);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        let status = loop {
            let restart_at = self.restart_at;
            tokio::select! {
                biased;
                () = &mut shutdown => {
                    info!("shutdown requested");
                    break 0;
                }
                Some(session) = self.closed.recv() => self.stream_closed(session),
                Some(input) = self.inputs.recv() => {
                    if let Some(status) = self.input(input) {
                        break status;
                    }
                }
                _ = ping.tick() => self.periodic_ping(),
                () = sleep_until(restart_at) => {
                    self.restart_at = None;
                    if let Err(e) = self.start_backend() {
                        error!("cannot restart backend: {e}");
                        self.schedule_restart(Exit::Code(127), Duration::ZERO);
                    }
                }
            }
        };
        let _ = stop_accepting.send(());
        self.shut_down().await;
        status
    }

    fn start_backend(&mut self) -> std::io::Result<()> {
        self.generation += 1;
        let backend = backend::spawn(
            &self.command,
            &self.config.env,
            self.config.max_line,
            self.generation,
            self.inputs_tx.clone(),
        )?;
        info!(pid = backend.pid, "backend started");
        self.stdin_slot.send_replace(Some(backend.stdin.clone()));
        self.backend = Some(Running {
            backend,
            generation: self.generation,
            started: Instant::now(),
        });
        self.last_pong = None;
        self.unanswered_since = None;
        self.router.backend_started();
        self.drain(None);
        Ok(())
    }

    /// Handles one input; `Some(status)` when the proxy must exit.
    fn input(&mut self, input: Input) -> Option<i32> {
        match input {
            Input::Open {
                session,
                principal,
                reply,
            } => {
                let opened = self.router.open_session(session, principal.clone());
                let result = opened.map(|()| {
                    let url = self.config.endpoint_url(&session);
                    let (queue, stream) = session::channel(
                        session,
                        &url,
                        self.config.session_buffer,
                        self.config.keepalive,
                        self.closed_tx.clone(),
                    );
                    self.sessions.insert(session, queue);
                    info!(session = %session, %principal, "session opened");
                    stream
                });
                if let Err(Ok(_stream)) = reply.send(result) {
                    // The client left before its stream started; the dropped stream
                    // reports the close.
                }
                self.drain(None);
            }
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
                let result = match permit {
                    Some(permit) => {
                        let result = self.router.client_message(&session, &principal, body);
                        self.drain(Some(permit));
                        result
                    }
                    None => {
                        let refusal = self
                            .router
                            .check_client_message(&session, &principal, body)
                            .err()
                            .unwrap_or(Rejection::BackendBusy);
                        self.router.count_rejection(&refusal);
                        Err(refusal)
                    }
                };
                let _ = reply.send(result);
            }
            Input::Refused(rejection) => self.router.count_rejection(&rejection),
            Input::Health { reply } => {
                let pong = self.backend.is_some().then(|| {
                    let n = self.router.health_ping();
                    self.note_ping_sent();
                    self.drain(None);
                    let (tx, rx) = oneshot::channel();
                    self.pong_waiters.push((n, tx));
                    rx
                });
                let _ = reply.send((self.health(), pong));
            }
            Input::Metrics { reply } => {
                let gauges = ShellGauges {
                    live_sessions: self.router.live_sessions(),
                    backend_running: self.backend.is_some(),
                    backend_restarts: self.policy.restarts(),
                };
                let _ = reply.send(metrics::render(self.router.metrics(), gauges));
            }
            Input::BackendLines { generation, batch } => {
                if self.is_current(generation) {
                    for line in batch {
                        match line {
                            Some(line) => self.router.backend_line(&line),
                            None => self.router.backend_line_too_long(),
                        }
                        self.drain(None);
                    }
                }
            }
            Input::BackendExited { generation, exit } => {
                if self.is_current(generation) {
                    let running = self.backend.take().expect("current generation runs");
                    let ran_for = running.started.elapsed();
                    warn!(pid = running.backend.pid, ?exit, "backend exited");
                    self.backend_gone();
                    return self.schedule_restart(exit, ran_for);
                }
            }
        }
        None
    }

    fn is_current(&self, generation: u64) -> bool {
        self.backend
            .as_ref()
            .is_some_and(|r| r.generation == generation)
    }

    /// The backend is gone: close every session, refuse POSTs until it is back.
    fn backend_gone(&mut self) {
        self.stdin_slot.send_replace(None);
        self.pong_waiters.clear();
        self.router.backend_exited();
        self.drain(None);
    }

    fn schedule_restart(&mut self, exit: Exit, ran_for: Duration) -> Option<i32> {
        match self.policy.exited(exit, ran_for) {
            AfterExit::Restart { after } => {
                info!(after_ms = after.as_millis() as u64, "restarting backend");
                self.restart_at = Some(Instant::now() + after);
                None
            }
            AfterExit::Shutdown { status } => {
                info!(status, "backend will not be restarted; shutting down");
                Some(status)
            }
        }
    }

    fn periodic_ping(&mut self) {
        if self.backend.is_none() {
            return;
        }
        if let Some(since) = self.unanswered_since {
            if since.elapsed() >= self.config.ping_timeout {
                warn!(
                    silent_ms = since.elapsed().as_millis() as u64,
                    "backend does not answer pings"
                );
            }
        }
        let _ = self.router.health_ping();
        self.note_ping_sent();
        self.drain(None);
    }

    fn note_ping_sent(&mut self) {
        self.unanswered_since.get_or_insert_with(Instant::now);
    }

    fn health(&self) -> Health {
        let running = self.backend.as_ref();
        Health {
            running: running.is_some(),
            pid: running.map(|r| r.backend.pid),
            restarts: self.policy.restarts(),
            since_last_pong: self.last_pong.map(|t| t.elapsed()),
            answered: false,
            sessions: self.router.live_sessions(),
        }
    }

    fn stream_closed(&mut self, session: SessionId) {
        if self.sessions.remove(&session).is_some() {
            info!(session = %session, "session closed by client");
        }
        self.router.close_session(&session);
        self.drain(None);
    }

    /// Performs every pending action; `permit` carries the client line's reserved room.
    fn drain(&mut self, mut permit: Option<StdinPermit>) {
        while let Some(action) = self.router.poll_action() {
            self.execute(action, &mut permit);
        }
    }

    fn execute(&mut self, action: Action, permit: &mut Option<StdinPermit>) {
        match action {
            Action::Rewrite { line } => match permit.take() {
                Some(permit) => {
                    permit.send(line);
                }
                None => self.send_proxy_line(line),
            },
            Action::Reply { line } => self.send_proxy_line(line),
            Action::Deliver { session, message } => {
                let frame = Bytes::from(sse::message_event(&message));
                let full = self
                    .sessions
                    .get(&session)
                    .is_some_and(|queue| queue.send(frame).is_err());
                if full {
                    self.slow_consumer(session);
                }
            }
            Action::Broadcast { message } => {
                let frame = Bytes::from(sse::message_event(&message));
                let slow: Vec<SessionId> = self
                    .sessions
                    .iter()
                    .filter(|(_, queue)| queue.send(frame.clone()).is_err())
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
            } => {
                let method = method.as_deref().unwrap_or("-");
                match level {
                    LogLevel::Warn => warn!(%reason, method, "backend message not delivered"),
                    LogLevel::Debug => debug!(%reason, method, "backend message not delivered"),
                }
            }
            Action::CloseSession { session } => {
                if self.sessions.remove(&session).is_some() {
                    info!(session = %session, "session closed: backend exited");
                }
            }
            Action::Pong { ping } => {
                self.last_pong = Some(Instant::now());
                self.unanswered_since = None;
                let (answered, waiting) = std::mem::take(&mut self.pong_waiters)
                    .into_iter()
                    .partition(|(n, _)| *n <= ping);
                self.pong_waiters = waiting;
                for (_, tx) in answered {
                    let _ = tx.send(());
                }
            }
        }
    }

    /// A session whose queue is full is closed, never thinned and never waited for.
    fn slow_consumer(&mut self, session: SessionId) {
        if self.sessions.remove(&session).is_some() {
            warn!(session = %session, "session closed: client is not reading its stream");
        }
        self.router.close_session(&session);
    }

    /// The proxy's own lines never wait: with no room they are dropped and counted.
    fn send_proxy_line(&mut self, line: Vec<u8>) {
        let sent = self
            .backend
            .as_ref()
            .is_some_and(|r| r.backend.stdin.try_send(line).is_ok());
        if !sent {
            self.router.count_backend_queue_full();
        }
    }

    /// SPEC section 5: stop accepting (the caller stops the server), end every stream,
    /// close the backend's stdin, wait the grace period, SIGTERM, wait again, SIGKILL.
    async fn shut_down(mut self) {
        let sessions: Vec<SessionId> = self.sessions.keys().copied().collect();
        for session in sessions {
            self.router.close_session(&session);
        }
        self.sessions.clear();
        while self.router.poll_action().is_some() {}
        let Some(running) = self.backend.take() else {
            return;
        };
        self.stdin_slot.send_replace(None);
        let Running {
            backend,
            generation,
            ..
        } = running;
        let Backend {
            pid,
            stdin,
            signals,
        } = backend;
        drop(stdin);
        let grace = self.config.grace;
        for signal in [None, Some(Signal::Terminate), Some(Signal::Kill)] {
            if let Some(signal) = signal {
                info!(pid, ?signal, "backend still running");
                let _ = signals.send(signal);
            }
            if self.wait_exit(generation, grace).await {
                return;
            }
        }
    }

    async fn wait_exit(&mut self, generation: u64, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.inputs.recv()).await {
                Ok(Some(Input::BackendExited {
                    generation: g,
                    exit,
                })) if g == generation => {
                    info!(?exit, "backend stopped");
                    return true;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return false,
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
