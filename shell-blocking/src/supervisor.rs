//! The one owner: a single thread holds the core's `Hub` (router, session queues,
//! backend), takes one input at a time and performs what comes out. No lock is held
//! anywhere and no send into a session ever waits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{after, never, select, tick, Receiver, Sender};
use switchboard_core::config::Config;
use switchboard_core::hub::{self, Hub, Level, PongWaiter, Reply};
use switchboard_core::supervise::{self, AfterExit};
use switchboard_core::SessionId;
use tracing::{debug, error, info, warn};

use crate::backend::{self, Backend, Permit};
use crate::session::Queue;

/// Wakes a `/health` request when the backend answers its ping.
pub struct PongTx(pub Sender<()>);

impl PongWaiter for PongTx {
    fn answered(self) {
        let _ = self.0.send(());
    }
}

/// Everything the loop reacts to, from handlers and the backend's threads.
pub type Input = hub::Input<Queue, Permit, PongTx>;

/// A handler's one-shot channel as the hub's reply.
pub fn reply<T: Send + 'static>(tx: Sender<T>) -> Reply<T> {
    Box::new(move |value| {
        // The handler may have given up (client gone); nothing to do then.
        let _ = tx.send(value);
    })
}

pub struct Supervisor {
    config: Arc<Config>,
    command: Vec<String>,
    hub: Hub<Queue, Backend, PongTx>,
    restart_at: Option<Instant>,
    inputs_tx: Sender<Input>,
    inputs: Receiver<Input>,
    closed: Receiver<SessionId>,
    shutdown: Receiver<()>,
}

impl Supervisor {
    /// The loop, and what the other threads need to reach it: its inputs, the channel on
    /// which streams report their end, and the shutdown request.
    pub fn new(
        config: Arc<Config>,
        command: Vec<String>,
    ) -> (Self, Sender<Input>, Sender<SessionId>, Sender<()>) {
        let (inputs_tx, inputs) = crossbeam_channel::bounded(1024);
        let (closed_tx, closed) = crossbeam_channel::unbounded();
        let (shutdown_tx, shutdown) = crossbeam_channel::bounded(1);
        let supervisor = Supervisor {
            hub: Hub::new(&config),
            config,
            command,
            restart_at: None,
            inputs_tx: inputs_tx.clone(),
            inputs,
            closed,
            shutdown,
        };
        (supervisor, inputs_tx, closed_tx, shutdown_tx)
    }

    /// Runs until a shutdown signal (exit status 0) or until a backend that will not be
    /// restarted exits (its status). Either way sessions are ended and the backend stopped.
    pub fn run(mut self, stop_accepting: impl FnOnce()) -> i32 {
        if let Err(e) = self.start_backend() {
            error!("cannot start backend {:?}: {e}", self.command);
            return 1;
        }
        let ping = tick(self.config.ping_interval);
        let status = loop {
            let restart = match self.restart_at {
                Some(at) => after(at.saturating_duration_since(Instant::now())),
                None => never(),
            };
            select! {
                recv(self.shutdown) -> _ => {
                    info!("shutdown requested");
                    break 0;
                }
                recv(self.closed) -> session => {
                    if let Ok(session) = session {
                        self.hub.stream_closed(session, Instant::now());
                    }
                }
                recv(self.inputs) -> input => {
                    let Ok(input) = input else { break 0 };
                    if let Some(status) = self.input(input) {
                        break status;
                    }
                }
                recv(ping) -> _ => self.hub.periodic_ping(Instant::now()),
                recv(restart) -> _ => {
                    self.restart_at = None;
                    if let Err(e) = self.start_backend() {
                        error!("cannot restart backend: {e}");
                        self.restart_at = Some(Instant::now() + self.config.ping_interval);
                    }
                }
            }
            self.log_events();
        };
        stop_accepting();
        self.shut_down();
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
        self.hub
            .backend_started(backend, generation, Instant::now());
        self.log_events();
        Ok(())
    }

    /// Handles one input; `Some(status)` when the proxy must exit.
    fn input(&mut self, input: Input) -> Option<i32> {
        let now = Instant::now();
        match self.hub.input(input, now)? {
            AfterExit::Restart { after } => {
                self.restart_at = Some(now + after);
                None
            }
            AfterExit::Shutdown { status } => Some(status),
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
    fn shut_down(mut self) {
        let backend = self.hub.shut_down(Instant::now());
        self.log_events();
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
            if self.wait_exit(grace) {
                return;
            }
        }
    }

    /// Waits for the (only) backend's exit report; other inputs are dropped, which answers
    /// their senders with 503.
    fn wait_exit(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            match self.inputs.recv_deadline(deadline) {
                Ok(Input::BackendExited { exit, .. }) => {
                    info!(?exit, "backend stopped");
                    return true;
                }
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    }
}
