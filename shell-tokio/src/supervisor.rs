//! The one owner: a single task holds the core's `Hub`, feeds it one input at a time with
//! the current time, and performs every output with one exhaustive `execute`. It keeps the
//! shell's own things (reply channels, stream queues, the backend process) in maps keyed
//! by the ids the hub hands out. No lock is held anywhere; no send ever waits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchboard_core::config::Config;
use switchboard_core::hub::{self, Fetched, Hub, Settings};
use switchboard_core::jwt::KeyStore;
use switchboard_core::load::{Front, Loaded, Shared};
use switchboard_core::output::Level;
use switchboard_core::supervise::Exit;
use switchboard_core::{BackendId, FetchId, Output, StreamEnd, StreamId};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use crate::audit::AuditLog;
use crate::backend::{self, Backend};
use crate::pending::Pending;
use crate::session::{self, Queue, StreamBody};

/// How a request handler is answered.
pub enum Reply {
    /// A complete response.
    Full(switchboard_core::http::Response),
    /// A stream: its head, and the body the loop feeds.
    Stream(switchboard_core::http::Response, StreamBody),
}

/// Everything the loop reacts to, from handlers and the backend's tasks.
pub enum Input {
    /// An admitted request and where its answer goes.
    Request {
        request: Box<hub::Request>,
        reply: oneshot::Sender<Reply>,
        /// The handler's [`pending::ticket`], named again if its client leaves.
        ticket: u64,
    },
    /// The client of the request handed over with this ticket left before its answer.
    ClientLeft { ticket: u64 },
    /// What an [`Output::Fetch`] brought.
    Fetched {
        fetch: FetchId,
        result: Result<Fetched, String>,
    },
    /// A request the gate or the framing rules refused (already answered): counted and
    /// audited.
    Refused(hub::TurnedAway),
    /// Lines the backend wrote (`None`: one over `--max-line`).
    BackendLines {
        backend: BackendId,
        batch: Vec<Option<Vec<u8>>>,
    },
    /// Lines written to the backend's stdin.
    BackendWrote { backend: BackendId, lines: usize },
    /// The backend exited.
    BackendExited { backend: BackendId, exit: Exit },
    /// SIGHUP: the configuration read again and checked, or why it was refused.
    Reload(Box<Result<Loaded, String>>),
}

/// The loop and what it owns.
pub struct Supervisor {
    config: Arc<Config>,
    command: Vec<String>,
    hub: Hub,
    replies: Pending<oneshot::Sender<Reply>>,
    streams: HashMap<StreamId, Queue>,
    backend: Option<Backend>,
    inputs_tx: mpsc::Sender<Input>,
    inputs: mpsc::Receiver<Input>,
    closed_tx: mpsc::UnboundedSender<StreamId>,
    closed: mpsc::UnboundedReceiver<StreamId>,
    stop_accepting: Option<oneshot::Sender<()>>,
    /// The gate's key store, given the key sets the hub fetched.
    key_store: Option<Arc<KeyStore>>,
    /// The audit log's queue, with `--audit-log`.
    audit: Option<AuditLog>,
    /// What request handlers read, and a reloaded one waiting for the hub's outputs (the
    /// fetched key sets) to be performed before it takes requests.
    front: Arc<Shared<Front>>,
    next_front: Option<Arc<Front>>,
}

impl Supervisor {
    /// Gives fetched key sets to the gate's `store` (JWT auth).
    pub fn use_key_store(&mut self, store: Option<Arc<KeyStore>>) {
        self.key_store = store;
    }

    /// Writes the hub's audit events to `log` (`--audit-log`).
    pub fn use_audit_log(&mut self, log: Option<AuditLog>) {
        self.audit = log;
    }

    /// The loop, and the sender request handlers reach it by. `config` is what the
    /// proxy started with (the backend's command, environment and line limit); `front`
    /// is what request handlers read, replaced on reload.
    pub fn new(
        config: Arc<Config>,
        settings: Settings,
        front: Arc<Shared<Front>>,
        command: Vec<String>,
        stop_accepting: oneshot::Sender<()>,
    ) -> (Self, mpsc::Sender<Input>) {
        let (inputs_tx, inputs) = mpsc::channel(1024);
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let supervisor = Supervisor {
            hub: Hub::new(settings, Instant::now()),
            config,
            command,
            replies: Pending::default(),
            streams: HashMap::new(),
            backend: None,
            inputs_tx: inputs_tx.clone(),
            key_store: None,
            audit: None,
            front,
            next_front: None,
            inputs,
            closed_tx,
            closed,
            stop_accepting: Some(stop_accepting),
        };
        (supervisor, inputs_tx)
    }

    /// Runs until the hub says exit; returns the status and how long answers under way
    /// may still take.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> (i32, Duration) {
        tokio::pin!(shutdown);
        let mut signalled = false;
        // One timer, moved only when the hub's next deadline moves: registering a new one
        // per input would cost a timer-wheel insert and removal for every message.
        let timer = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(timer);
        let mut armed_for: Option<Instant> = None;
        let mut now = Instant::now();
        loop {
            if let Some(exit) = self.drain(now) {
                return exit;
            }
            let deadline = self.hub.poll_timeout();
            if deadline != armed_for {
                if let Some(at) = deadline {
                    timer.as_mut().reset(tokio::time::Instant::from_std(at));
                }
                armed_for = deadline;
            }
            tokio::select! {
                biased;
                () = &mut shutdown, if !signalled => {
                    signalled = true;
                    now = Instant::now();
                    self.hub.handle_shutdown(now);
                }
                Some(stream) = self.closed.recv() => {
                    now = Instant::now();
                    self.streams.remove(&stream);
                    self.hub.handle_stream_closed(now, stream, StreamEnd::ClientGone);
                }
                Some(input) = self.inputs.recv() => {
                    now = Instant::now();
                    self.input(now, input);
                }
                () = &mut timer, if armed_for.is_some() => {
                    armed_for = None;
                    now = Instant::now();
                    self.hub.handle_timeout(now);
                }
            }
        }
    }

    fn input(&mut self, now: Instant, input: Input) {
        match input {
            Input::Request {
                request,
                reply,
                ticket,
            } => {
                let id = self.hub.handle_request(now, *request);
                self.replies.insert(id, Some(ticket), reply);
            }
            Input::ClientLeft { ticket } => {
                if let Some(request) = self.replies.left(ticket) {
                    self.hub.handle_client_left(now, request);
                }
            }
            Input::Refused(turned_away) => self.hub.handle_refused(now, turned_away),
            Input::Fetched { fetch, result } => self.hub.handle_fetched(now, fetch, result),
            Input::BackendLines { backend, batch } => {
                self.hub.handle_backend_lines(now, backend, batch)
            }
            Input::BackendWrote { backend, lines } => {
                self.hub.handle_backend_wrote(now, backend, lines)
            }
            Input::BackendExited { backend, exit } => {
                if self.backend.as_ref().is_some_and(|b| b.id == backend) {
                    self.backend = None;
                }
                self.hub.handle_backend_exited(now, backend, exit)
            }
            Input::Reload(loaded) => match *loaded {
                Ok(loaded) => self.reload(now, loaded),
                Err(why) => self.hub.handle_reload_failed(now, why),
            },
        }
    }

    /// A reloaded configuration: the hub takes its settings; the shell's request handlers
    /// take its gate and limits once the hub's outputs are performed (`drain`).
    fn reload(&mut self, now: Instant, loaded: Loaded) {
        self.key_store = loaded.front.gate.key_store();
        self.hub.handle_reload(now, loaded.reload());
        self.next_front = Some(loaded.front);
    }

    /// Performs every output; `Some` once the hub says exit. `now` is the time of the
    /// input that produced them (what follows from them happened then too).
    fn drain(&mut self, now: Instant) -> Option<(i32, Duration)> {
        let mut exit = None;
        while let Some(output) = self.hub.poll_output() {
            exit = exit.or(self.execute(now, output));
        }
        if let Some(front) = self.next_front.take() {
            self.front.set(front);
        }
        if exit.is_some() {
            self.answer_queued(now);
        }
        exit
    }

    /// The proxy is exiting: requests still queued for the loop are answered by the hub
    /// like any other (it refuses them).
    fn answer_queued(&mut self, now: Instant) {
        while let Ok(input) = self.inputs.try_recv() {
            if let Input::Request { .. } = input {
                self.input(now, input);
                while let Some(output) = self.hub.poll_output() {
                    self.execute(now, output);
                }
            }
        }
    }

    /// Performs one output: I/O only, every decision is the hub's.
    fn execute(&mut self, now: Instant, output: Output) -> Option<(i32, Duration)> {
        match output {
            Output::Respond { request, response } => {
                if let Some(reply) = self.replies.take(request) {
                    // The client may have given up; nothing to do then.
                    let _ = reply.send(Reply::Full(response));
                }
            }
            Output::StartStream {
                request,
                stream,
                head,
                budget,
            } => {
                let (queue, body) = session::channel(stream, budget, self.closed_tx.clone());
                self.streams.insert(stream, queue);
                if let Some(reply) = self.replies.take(request) {
                    // A client that gave up drops the body, which reports the stream closed.
                    let _ = reply.send(Reply::Stream(head, body));
                }
            }
            Output::ToStream { stream, frame } => {
                if let Some(queue) = self.streams.get(&stream) {
                    if let Err(end) = queue.push(frame) {
                        self.streams.remove(&stream);
                        self.hub.handle_stream_closed(now, stream, end);
                    }
                }
            }
            Output::EndStream { stream } => {
                self.streams.remove(&stream);
            }
            Output::SpawnBackend { backend } => {
                let spawned = backend::spawn(
                    &self.command,
                    &self.config.env,
                    self.config.max_line,
                    backend,
                    self.inputs_tx.clone(),
                );
                match spawned {
                    Ok(process) => {
                        let pid = process.pid;
                        self.backend = Some(process);
                        self.hub.handle_backend_spawned(now, backend, pid);
                    }
                    Err(e) => self.hub.handle_spawn_failed(
                        now,
                        backend,
                        format!("{}: {e}", self.command.join(" ")),
                    ),
                }
            }
            Output::ToBackend { backend, line } => {
                if let Some(stdin) = self.process(backend).and_then(|b| b.stdin.as_ref()) {
                    let _ = stdin.send(line);
                }
            }
            Output::CloseBackendStdin { backend } => {
                if let Some(process) = self.process(backend) {
                    process.stdin = None;
                }
            }
            Output::SignalBackend { backend, signal } => {
                if let Some(process) = self.process(backend) {
                    let _ = process.signals.send(signal);
                }
            }
            Output::Fetch { fetch, url } => {
                let inputs = self.inputs_tx.clone();
                // Off the loop: a slow identity provider never stalls routing.
                tokio::task::spawn_blocking(move || {
                    let result = crate::fetch::fetch(&url);
                    let _ = inputs.blocking_send(Input::Fetched { fetch, result });
                });
            }
            Output::UseKeys { sets } => {
                if let Some(store) = &self.key_store {
                    if let Err(e) = store.use_fetched(&sets) {
                        warn!("cannot use the fetched key sets: {e}");
                    }
                }
            }
            Output::StopAccepting => {
                if let Some(stop) = self.stop_accepting.take() {
                    let _ = stop.send(());
                }
            }
            Output::Exit { status, drain } => return Some((status, drain)),
            Output::Audit(record) => {
                if let Some(lost) = self.audit.as_ref().map(|log| log.push(record)) {
                    self.hub.handle_audit_dropped(lost);
                }
            }
            Output::Log(event) => {
                let session = event.session().map(tracing::field::display);
                match event.level() {
                    Level::Warn => warn!(session, "{event}"),
                    Level::Info => info!(session, "{event}"),
                    Level::Debug => debug!(session, "{event}"),
                }
            }
        }
        None
    }

    fn process(&mut self, backend: BackendId) -> Option<&mut Backend> {
        self.backend.as_mut().filter(|b| b.id == backend)
    }
}
