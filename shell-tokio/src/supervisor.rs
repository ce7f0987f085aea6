//! The one owner: a single task holds the core's `Hub` (router, session queues, backend),
//! takes one input at a time and performs what comes out. No lock is held anywhere and no
//! send into a session ever waits.

use std::sync::Arc;
use std::time::Instant;

use switchboard_core::config::Config;
use switchboard_core::hub::{self, Hub, Level, PongWaiter, Reply};
use switchboard_core::supervise::{self, AfterExit};
use switchboard_core::SessionId;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, error, info, warn};

use crate::backend::{self, Backend};
use crate::session::Queue;

/// The current backend's stdin queue, for POST handlers to reserve room in before the
/// loop sees their message (`None` while the backend is down).
pub type StdinSlot = watch::Receiver<Option<mpsc::Sender<Vec<u8>>>>;

/// Room reserved in the backend's stdin queue for one client line.
pub type StdinPermit = mpsc::OwnedPermit<Vec<u8>>;

/// Wakes a `/health` request when the backend answers its ping.
pub struct PongTx(pub oneshot::Sender<()>);

impl PongWaiter for PongTx {
    fn answered(self) {
        let _ = self.0.send(());
    }
}

/// Everything the loop reacts to, from handlers and the backend's tasks.
pub type Input = hub::Input<Queue, StdinPermit, PongTx>;

/// A handler's one-shot channel as the hub's reply.
pub fn reply<T: Send + 'static>(tx: oneshot::Sender<T>) -> Reply<T> {
    Box::new(move |value| {
        // The handler may have given up (client gone); nothing to do then.
        let _ = tx.send(value);
    })
}

pub struct Supervisor {
    config: Arc<Config>,
    command: Vec<String>,
    hub: Hub<Queue, Backend, PongTx>,
    restart_at: Option<tokio::time::Instant>,
    stdin_slot: watch::Sender<Option<mpsc::Sender<Vec<u8>>>>,
    inputs_tx: mpsc::Sender<Input>,
    inputs: mpsc::Receiver<Input>,
    closed: mpsc::UnboundedReceiver<SessionId>,
}

impl Supervisor {
    /// The loop, and what the HTTP side needs to reach it: its inputs, the channel on
    /// which streams report their end, and the backend's stdin slot.
    pub fn new(
        config: Arc<Config>,
        command: Vec<String>,
    ) -> (
        Self,
        mpsc::Sender<Input>,
        mpsc::UnboundedSender<SessionId>,
        StdinSlot,
    ) {
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
            closed,
        };
        (supervisor, inputs_tx, closed_tx, slot_rx)
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
        match self.hub.input(input, Instant::now())? {
            AfterExit::Restart { after } => {
                self.stdin_slot.send_replace(None);
                self.restart_at = Some(tokio::time::Instant::now() + after);
                None
            }
            AfterExit::Shutdown { status } => {
                self.stdin_slot.send_replace(None);
                Some(status)
            }
        }
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
        for signal in supervise::STOP_STEPS {
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
