//! The owner loop's common part. A shell's loop holds one [`Owner`] on one thread or task,
//! waits for its next event its own way (a `select!` over channels and a timer), hands the
//! event in with the time, and drains: the owner feeds the hub and performs every output,
//! asking the shell's [`Perform`] for what only the shell can do (answer a handler, open a
//! stream, start the backend or a fetch, stop accepting). No lock is held and no send waits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchboard_core::http::Response;
use switchboard_core::hub::{self, Fetched, Hub, Settings};
use switchboard_core::Level;
use switchboard_core::{BackendId, Event, FetchId, Frame, Output, StreamEnd, StreamId};
use switchboard_core::{Exit, Signal};
use switchboard_core::{Front, Loaded};
use switchboard_core::{KeyStore, Lost};
use tracing::{debug, info, warn};

use crate::audit::AuditLog;
use crate::otel::Telemetry;
use crate::pending::Pending;
use crate::Shared;

/// What handlers, the backend's readers and the signal handler send the loop; `R` is where
/// a request handler waits for its answer.
pub enum Input<R> {
    /// An admitted request, and where its answer goes.
    Request {
        /// The hub's input.
        request: Box<hub::Request>,
        /// Where the handler waits.
        reply: R,
        /// The handler's [`ticket`](crate::pending::ticket), named again if its client
        /// leaves.
        ticket: u64,
    },
    /// The client of the request handed over with this ticket left before its answer.
    ClientLeft {
        /// The handler's ticket.
        ticket: u64,
    },
    /// What an [`Output::Fetch`] brought.
    Fetched {
        /// Which fetch.
        fetch: FetchId,
        /// The document, or why there is none.
        result: Result<Fetched, String>,
    },
    /// A request the gate or the framing rules refused (already answered): counted and
    /// audited.
    Refused(hub::TurnedAway),
    /// A connection no thread could be started for: the hub says what it is answered.
    Unserved {
        /// Where the connection waits.
        reply: R,
    },
    /// Lines the backend wrote (`None`: one over `--max-line`).
    BackendLines {
        /// Which process.
        backend: BackendId,
        /// The lines, in order.
        batch: Vec<Option<Vec<u8>>>,
    },
    /// Lines written to the backend's stdin.
    BackendWrote {
        /// Which process.
        backend: BackendId,
        /// How many.
        lines: usize,
    },
    /// The backend exited.
    BackendExited {
        /// Which process.
        backend: BackendId,
        /// How.
        exit: Exit,
    },
    /// SIGHUP: the configuration read again and checked, or why it was refused.
    Reload(Box<Result<Loaded, String>>),
}

/// The loop's end of one stream's queue.
pub trait StreamQueue {
    /// Queues `frame` without waiting, or says why the stream cannot take it.
    fn push(&self, frame: Frame) -> Result<(), StreamEnd>;
}

/// The backend process as the shell started it.
pub trait Process {
    /// Which process the hub knows this as.
    fn id(&self) -> BackendId;
    /// Its process id.
    fn pid(&self) -> u32;
    /// Queues `line` for its stdin.
    fn write(&self, line: Vec<u8>);
    /// Closes its stdin once what is queued is written.
    fn close_stdin(&mut self);
    /// Sends it `signal`.
    fn signal(&self, signal: Signal);
}

/// What only the shell can do: its reply channels, streams, processes, threads or tasks.
pub trait Perform {
    /// Where a request handler waits for its answer.
    type Reply;
    /// The loop's end of a stream.
    type Queue: StreamQueue;
    /// A started backend.
    type Process: Process;

    /// Sends `response` to the handler waiting at `reply` (it may have given up).
    fn respond(&mut self, reply: Self::Reply, response: Response);

    /// Opens `stream`, whose queue may hold `budget` bytes, and hands `head` and its body
    /// to `reply` (`None`: its client left). `None` when the client is known gone: the hub
    /// is then told the stream closed.
    fn open_stream(
        &mut self,
        stream: StreamId,
        head: Response,
        budget: usize,
        reply: Option<Self::Reply>,
    ) -> Option<Self::Queue>;

    /// Starts `command` as `backend`, its lines and exit reported as [`Input`]s.
    fn spawn_backend(
        &mut self,
        command: &[String],
        backend: BackendId,
    ) -> std::io::Result<Self::Process>;

    /// GETs `url` off the loop, its result reported as [`Input::Fetched`]; `Err` when it
    /// could not be started.
    fn fetch(&mut self, fetch: FetchId, url: String) -> Result<(), String>;

    /// Stops taking connections (the proxy is draining).
    fn stop_accepting(&mut self);

    /// What a request or a stream held is free again (a shell may return memory to the
    /// OS).
    fn churned(&mut self) {}
}

/// The hub and everything the loop owns that both shells keep alike.
pub struct Owner<P: Perform> {
    hub: Hub,
    perform: P,
    command: Vec<String>,
    replies: Pending<P::Reply>,
    streams: HashMap<StreamId, P::Queue>,
    backend: Option<P::Process>,
    /// The gate's key store, given the key sets the hub fetched.
    key_store: Option<Arc<KeyStore>>,
    /// The audit log's queue, with `--audit-log`.
    audit: Option<AuditLog>,
    /// The OTLP exporters, with `--otlp-endpoint`.
    telemetry: Option<Telemetry>,
    /// What request handlers read, and a reloaded one waiting for the hub's outputs (the
    /// fetched key sets) to be performed before it takes requests.
    front: Arc<Shared<Front>>,
    next_front: Option<Arc<Front>>,
}

impl<P: Perform> Owner<P> {
    /// A new hub with `settings`; `front` is what request handlers read, replaced on
    /// reload; `command` starts the backend.
    pub fn new(
        settings: Settings,
        front: Arc<Shared<Front>>,
        command: Vec<String>,
        perform: P,
    ) -> Self {
        Owner {
            hub: Hub::new(settings, Instant::now()),
            perform,
            command,
            replies: Pending::default(),
            streams: HashMap::new(),
            backend: None,
            key_store: None,
            audit: None,
            telemetry: None,
            front,
            next_front: None,
        }
    }

    /// Gives fetched key sets to the gate's `store` (JWT auth).
    pub fn use_key_store(&mut self, store: Option<Arc<KeyStore>>) {
        self.key_store = store;
    }

    /// Writes the hub's audit events to `log` (`--audit-log`).
    pub fn use_audit_log(&mut self, log: Option<AuditLog>) {
        self.audit = log;
    }

    /// Exports the hub's spans and measurements with `telemetry` (`--otlp-endpoint`).
    pub fn use_telemetry(&mut self, telemetry: Option<Telemetry>) {
        self.telemetry = telemetry;
    }

    /// When the hub next needs [`Owner::handle_timeout`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.hub.poll_timeout()
    }

    /// The hub's deadline passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.hub.handle_timeout(now);
    }

    /// SIGINT or SIGTERM.
    pub fn handle_shutdown(&mut self, now: Instant) {
        self.hub.handle_shutdown(now);
    }

    /// A stream's client went away.
    pub fn handle_stream_closed(&mut self, now: Instant, stream: StreamId) {
        self.perform.churned();
        self.streams.remove(&stream);
        self.hub
            .handle_stream_closed(now, stream, StreamEnd::ClientGone);
    }

    /// Hands `input` to the hub.
    pub fn handle_input(&mut self, now: Instant, input: Input<P::Reply>) {
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
                    // What it held (its body, if it waited) is free.
                    self.perform.churned();
                    self.hub.handle_client_left(now, request);
                }
            }
            Input::Refused(turned_away) => self.hub.handle_refused(now, turned_away),
            Input::Fetched { fetch, result } => self.hub.handle_fetched(now, fetch, result),
            Input::Unserved { reply } => {
                let id = self.hub.handle_unserved(now);
                self.replies.insert(id, None, reply);
            }
            Input::BackendLines { backend, batch } => {
                self.hub.handle_backend_lines(now, backend, batch)
            }
            Input::BackendWrote { backend, lines } => {
                self.hub.handle_backend_wrote(now, backend, lines)
            }
            Input::BackendExited { backend, exit } => {
                if self.backend.as_ref().is_some_and(|b| b.id() == backend) {
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

    /// Performs every output; `Some` (the exit status and how long answers under way may
    /// still take) once the hub says exit, after answering the requests still `queued` for
    /// the loop. `now` is the time of the input that produced them (what follows from them
    /// happened then too).
    pub fn drain(
        &mut self,
        now: Instant,
        queued: impl Iterator<Item = Input<P::Reply>>,
    ) -> Option<(i32, Duration)> {
        let mut exit = None;
        while let Some(output) = self.hub.poll_output() {
            exit = exit.or(self.execute(now, output));
        }
        if let Some(front) = self.next_front.take() {
            self.front.set(front);
        }
        if exit.is_some() {
            self.answer_queued(now, queued);
        }
        exit
    }

    /// The proxy is exiting: requests still queued for the loop are answered by the hub
    /// like any other (it refuses them).
    fn answer_queued(&mut self, now: Instant, queued: impl Iterator<Item = Input<P::Reply>>) {
        for input in queued {
            if let Input::Request { .. } = input {
                self.handle_input(now, input);
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
                self.perform.churned();
                if let Some(reply) = self.replies.take(request) {
                    self.perform.respond(reply, response);
                }
            }
            Output::StartStream {
                request,
                stream,
                head,
                budget,
            } => {
                let reply = self.replies.take(request);
                match self.perform.open_stream(stream, head, budget, reply) {
                    Some(queue) => _ = self.streams.insert(stream, queue),
                    None => self
                        .hub
                        .handle_stream_closed(now, stream, StreamEnd::ClientGone),
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
                self.perform.churned();
                self.streams.remove(&stream);
            }
            Output::Fetch { fetch, url } => {
                if let Err(e) = self.perform.fetch(fetch, url) {
                    self.hub.handle_fetched(now, fetch, Err(e));
                }
            }
            Output::UseKeys { sets } => {
                if let Some(Err(e)) = self.key_store.as_ref().map(|s| s.use_fetched(&sets)) {
                    warn!("cannot use the fetched key sets: {e}");
                }
            }
            Output::StopAccepting => self.perform.stop_accepting(),
            Output::Exit { status, drain } => return Some((status, drain)),
            Output::Audit(record) => {
                if let Some(lost) = self.audit.as_ref().map(|log| log.push(record)) {
                    self.hub.handle_lost(Lost::AuditEvents, lost);
                }
            }
            Output::Log(event) => log(&event),
            Output::Span(span) => {
                if let Some(lost) = self.telemetry.as_ref().map(|t| t.export(span)) {
                    self.hub.handle_lost(Lost::Spans, lost);
                }
            }
            Output::Measured(measured) => {
                if let Some(telemetry) = &mut self.telemetry {
                    telemetry.measure(*measured);
                }
            }
            output @ (Output::SpawnBackend { .. }
            | Output::ToBackend { .. }
            | Output::CloseBackendStdin { .. }
            | Output::SignalBackend { .. }) => self.execute_on_backend(now, output),
        }
        None
    }

    /// Performs an output about the backend process.
    fn execute_on_backend(&mut self, now: Instant, output: Output) {
        match output {
            Output::SpawnBackend { backend } => {
                match self.perform.spawn_backend(&self.command, backend) {
                    Ok(process) => {
                        let pid = process.pid();
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
                if let Some(process) = self.process(backend) {
                    process.write(line);
                }
            }
            Output::CloseBackendStdin { backend } => {
                if let Some(process) = self.process(backend) {
                    process.close_stdin();
                }
            }
            Output::SignalBackend { backend, signal } => {
                if let Some(process) = self.process(backend) {
                    process.signal(signal);
                }
            }
            other => unreachable!("not an output about the backend: {other:?}"),
        }
    }

    fn process(&mut self, backend: BackendId) -> Option<&mut P::Process> {
        self.backend.as_mut().filter(|b| b.id() == backend)
    }
}

/// An [`Output::Log`] as a `tracing` event, with its session as a field.
fn log(event: &Event) {
    let session = event.session().map(tracing::field::display);
    match event.level() {
        Level::Warn => warn!(session, "{event}"),
        Level::Info => info!(session, "{event}"),
        Level::Debug => debug!(session, "{event}"),
    }
}
