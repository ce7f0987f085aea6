//! The one owner: a single task holds the core's `Hub` (router, session queues, backend),
//! takes one input at a time and performs what comes out. No lock is held anywhere and no
//! send into a session ever waits.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use switchboard_core::config::Config;
use switchboard_core::hub::{Hub, Level, PongWaiter};
use switchboard_core::router::{Accepted, Body};
use switchboard_core::supervise::{AfterExit, Exit, Health};
use switchboard_core::{Principal, Rejection, SessionId};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, error, info, warn};

use crate::backend::{self, Backend, Signal};
use crate::session::{self, Queue, SessionStream};

/// The current backend's stdin queue, for POST handlers to reserve room in before the
/// loop sees their message (`None` while the backend is down).
pub type StdinSlot = watch::Receiver<Option<mpsc::Sender<Vec<u8>>>>;

/// Room reserved in the backend's stdin queue for one client line.
pub type StdinPermit = mpsc::OwnedPermit<Vec<u8>>;

/// Wakes a `/health` request when the backend answers its ping.
pub struct PongTx(oneshot::Sender<()>);

impl PongWaiter for PongTx {
    fn answered(self) {
        let _ = self.0.send(());
    }
}

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

pub struct Supervisor {
    config: Arc<Config>,
    command: Vec<String>,
    hub: Hub<Queue, Backend, PongTx>,
    restart_at: Option<tokio::time::Instant>,
    stdin_slot: watch::Sender<Option<mpsc::Sender<Vec<u8>>>>,
    inputs_tx: mpsc::Sender<Input>,
    inputs: mpsc::Receiver<Input>,
    closed_tx: mpsc::UnboundedSender<SessionId>,
    closed: mpsc::UnboundedReceiver<SessionId>,
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
            hub: Hub::new(&config),
            config,
            command,
            restart_at: None,
            stdin_slot,
            inputs_tx: inputs_tx.clone(),
            inputs,
            closed_tx,
            closed,
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
                Some(session) = self.closed.recv() => self.hub.stream_closed(session, Instant::now()),
                Some(input) = self.inputs.recv() => {
                    if let Some(status) = self.input(input) {
                        break status;
                    }
                }
                _ = ping.tick() => self.hub.periodic_ping(Instant::now()),
                () = sleep_until(restart_at) => {
                    self.restart_at = None;
                    if let Err(e) = self.start_backend() {
                        error!("cannot restart backend: {e}");
                        self.restart_at = Some(tokio::time::Instant::now() + self.config.ping_interval);
                    }
                }
            }
            self.log_events();
        };
        let _ = stop_accepting.send(());
        self.shut_down().await;
        status
    }

    fn start_backend(&mut self) -> std::io::Result<()> {
        let generation = self.hub.next_generation();
        let backend = backend::spawn(
            &self.command,
            &self.config.env,
            self.config.max_line,
            generation,
            self.inputs_tx.clone(),
        )?;
        self.stdin_slot.send_replace(Some(backend.stdin.clone()));
        self.hub
            .backend_started(backend, generation, Instant::now());
        self.log_events();
        Ok(())
    }

    /// Handles one input; `Some(status)` when the proxy must exit.
    fn input(&mut self, input: Input) -> Option<i32> {
        let now = Instant::now();
        match input {
            Input::Open {
                session,
                principal,
                reply,
            } => {
                let url = self.config.endpoint_url(&session);
                let (limit, keepalive) = (self.config.session_buffer, self.config.keepalive);
                let closed = self.closed_tx.clone();
                let opened = self.hub.open_session(
                    session,
                    principal,
                    || session::channel(session, &url, limit, keepalive, closed),
                    now,
                );
                // A client that left already drops the stream, which reports the close.
                let _ = reply.send(opened);
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
                let result = self
                    .hub
                    .client_message(&session, &principal, body, permit, now);
                let _ = reply.send(result);
            }
            Input::Refused(rejection) => self.hub.count_rejection(&rejection),
            Input::Health { reply } => {
                let (tx, rx) = oneshot::channel();
                let (health, pinging) = self.hub.health(PongTx(tx), now);
                let _ = reply.send((health, pinging.then_some(rx)));
            }
            Input::Metrics { reply } => {
                let _ = reply.send(self.hub.metrics_text());
            }
            Input::BackendLines { generation, batch } => {
                self.hub.backend_lines(generation, batch, now);
            }
            Input::BackendExited { generation, exit } => {
                match self.hub.backend_exited(generation, exit, now)? {
                    AfterExit::Restart { after } => {
                        self.stdin_slot.send_replace(None);
                        self.restart_at = Some(tokio::time::Instant::now() + after);
                    }
                    AfterExit::Shutdown { status } => {
                        self.stdin_slot.send_replace(None);
                        return Some(status);
                    }
                }
            }
        }
        None
    }

    fn log_events(&mut self) {
        while let Some(event) = self.hub.poll_event() {
            let session = event.session().map(tracing::field::display);
            match event.level() {
                Level::Warn => warn!(session, "{event}"),
                Level::Info => info!(session, "{event}"),
                Level::Debug => debug!(session, "{event}"),
            }
        }
    }

    /// SPEC section 5: end every stream, close the backend's stdin, wait the grace
    /// period, SIGTERM, wait again, SIGKILL.
    async fn shut_down(mut self) {
        let backend = self.hub.shut_down(Instant::now());
        self.log_events();
        self.stdin_slot.send_replace(None);
        let Some(Backend {
            pid,
            stdin,
            signals,
        }) = backend
        else {
            return;
        };
        drop(stdin);
        let grace = self.config.grace;
        for signal in [None, Some(Signal::Terminate), Some(Signal::Kill)] {
            if let Some(signal) = signal {
                info!(pid, ?signal, "backend still running");
                let _ = signals.send(signal);
            }
            if self.wait_exit(grace).await {
                return;
            }
        }
    }

    /// Waits for the (only) backend's exit report; other inputs are dropped, which answers
    /// their senders with 503.
    async fn wait_exit(&mut self, within: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.inputs.recv()).await {
                Ok(Some(Input::BackendExited { exit, .. })) => {
                    info!(?exit, "backend stopped");
                    return true;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return false,
            }
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
