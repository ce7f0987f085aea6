//! The hub in virtual time (quinn's `Pair` idea): a [`Driver`] plays the shell around a
//! [`Hub`] with a manual clock, a scripted backend process and scripted clients, and checks
//! the hub's outputs on the way.
//!
//! The driver does what a shell does and nothing more: it starts the scripted backend when
//! asked, reports what the backend wrote to stdout and how much of its stdin it read,
//! keeps each stream's queue within the budget the hub gave it (a stream that stopped
//! reading and overflows is reported [`StreamEnd::Full`]), and answers requests with what
//! the hub says. Every output is recorded with its virtual time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use switchboard_core::http::{Admitted, Endpoint};
use switchboard_core::hub::{Fetched, Payload, Request, Settings};
use switchboard_core::FetchId;
use switchboard_core::{BackendId, Hub, Output, Principal, RequestId, StreamEnd, StreamId};
use switchboard_core::{Exit, Signal};

/// Timer firings one [`Driver::advance`] may run before it calls the hub livelocked.
const MAX_TIMER_STEPS: usize = 100_000;

/// Something the driver saw: an output of the hub, or what the scripted world did.
#[derive(Debug, Clone)]
pub enum Seen {
    /// An output, as the hub emitted it.
    Output(Output),
    /// The scripted world acted on its own (a stream overflowed, the backend exited).
    Note(String),
}

/// One thing seen, at a virtual time since the driver started.
#[derive(Debug, Clone)]
pub struct Record {
    /// Virtual time since [`Driver::new`].
    pub at: Duration,
    /// What.
    pub seen: Seen,
}

/// A stream as the scripted client and the shell's queue see it.
#[derive(Debug, Clone)]
pub struct ClientStream {
    /// The request it answers.
    pub request: RequestId,
    /// Every frame written to it, in order (what the client read).
    pub frames: Vec<Vec<u8>>,
    /// The client stopped reading: frames pile up in the queue.
    pub stalled: bool,
    /// Bytes queued and unread while stalled.
    pub queued: usize,
    /// The byte budget the hub gave.
    pub budget: usize,
    /// The hub ended it.
    pub ended_by_hub: bool,
    /// The shell ended it (client gone or queue full).
    pub ended_by_shell: bool,
}

impl ClientStream {
    /// Whether frames still reach the client.
    pub fn is_open(&self) -> bool {
        !self.ended_by_hub && !self.ended_by_shell
    }
}

/// How the scripted backend process behaves.
#[derive(Debug, Clone, Copy, Default)]
pub struct BackendScript {
    /// Ignores its stdin closing and SIGTERM (only SIGKILL ends it).
    pub stubborn: bool,
    /// Stops reading stdin: queued lines are not reported written.
    pub stdin_stalled: bool,
}

#[derive(Debug)]
struct Process {
    id: BackendId,
    pid: u32,
    /// Lines queued on its stdin and not yet reported read.
    unread: usize,
    stdin_closed: bool,
}

/// The shell around a [`Hub`], in virtual time.
#[derive(Debug)]
pub struct Driver {
    hub: Hub,
    start: Instant,
    now: Instant,
    /// The backend the hub asked for and the driver started.
    process: Option<Process>,
    /// Spawns still to fail.
    spawn_failures: usize,
    next_pid: u32,
    /// How the next backend behaves (and the current one, for what changes live).
    pub script: BackendScript,
    streams: BTreeMap<StreamId, ClientStream>,
    pending: BTreeSet<RequestId>,
    answers: BTreeMap<RequestId, Answer>,
    /// Every line written to the backend's stdin, in order, with the backend it went to.
    backend_input: Vec<(BackendId, Vec<u8>)>,
    /// Fetches asked for and not answered yet.
    fetches: Vec<(FetchId, String)>,
    /// The fetched key sets the hub said to use last.
    key_sets: Vec<switchboard_core::KeySet>,
    records: Vec<Record>,
    accepting: bool,
    exit_status: Option<i32>,
}

/// How a request was answered.
#[derive(Debug, Clone)]
pub enum Answer {
    /// A complete response.
    Response(switchboard_core::http::Response),
    /// A stream.
    Stream(StreamId),
}

impl Driver {
    /// A hub with `settings` whose first backend is started at once (the records of the
    /// start are kept; [`Driver::take_records`] clears them).
    pub fn new(settings: Settings) -> Driver {
        Driver::start(settings, 0)
    }

    /// [`Driver::new`], with the first `failing` backend starts failing.
    pub fn start(settings: Settings, failing: usize) -> Driver {
        // The one clock reading of the harness: the origin of virtual time.
        #[allow(clippy::disallowed_methods)]
        let start = Instant::now();
        let mut driver = Driver {
            hub: Hub::new(settings, start),
            start,
            now: start,
            process: None,
            spawn_failures: failing,
            next_pid: 1001,
            script: BackendScript::default(),
            streams: BTreeMap::new(),
            pending: BTreeSet::new(),
            answers: BTreeMap::new(),
            backend_input: Vec::new(),
            fetches: Vec::new(),
            key_sets: Vec::new(),
            records: Vec::new(),
            accepting: true,
            exit_status: None,
        };
        driver.drain();
        driver
    }

    /// The hub, for queries.
    pub fn hub(&self) -> &Hub {
        &self.hub
    }

    /// Virtual time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// What was seen since the last call.
    pub fn take_records(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.records)
    }

    /// Every line written to the backend's stdin so far, with the backend it went to.
    pub fn backend_input(&self) -> &[(BackendId, Vec<u8>)] {
        &self.backend_input
    }

    /// The stream answering `request`, if the answer was a stream.
    pub fn stream_of(&self, request: RequestId) -> Option<StreamId> {
        match self.answers.get(&request)? {
            Answer::Stream(stream) => Some(*stream),
            Answer::Response(_) => None,
        }
    }

    /// How `request` was answered, if it was.
    pub fn answer(&self, request: RequestId) -> Option<&Answer> {
        self.answers.get(&request)
    }

    /// A stream as its client sees it.
    pub fn stream(&self, stream: StreamId) -> Option<&ClientStream> {
        self.streams.get(&stream)
    }

    /// Every stream ever started.
    pub fn streams(&self) -> impl Iterator<Item = (StreamId, &ClientStream)> {
        self.streams.iter().map(|(id, s)| (*id, s))
    }

    /// The process id of the running backend.
    pub fn backend_pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.pid)
    }

    /// The status the hub exited with, once it did.
    pub fn exit_status(&self) -> Option<i32> {
        self.exit_status
    }

    /// Whether the hub still wants connections accepted.
    pub fn accepting(&self) -> bool {
        self.accepting
    }

    /// An HTTP request as the gate would admit it.
    pub fn request(
        &mut self,
        endpoint: Endpoint,
        principal: Principal,
        session: &str,
        body: Payload,
        entropy: [u8; 16],
    ) -> RequestId {
        self.send(Admitted::new(endpoint, principal, session).into_request(body, || entropy))
    }

    /// Any admitted request.
    pub fn send(&mut self, request: Request) -> RequestId {
        let id = self.hub.handle_request(self.now, request);
        self.pending.insert(id);
        self.drain();
        id
    }

    /// The shell could not start what would serve a new connection.
    pub fn unserved(&mut self) -> RequestId {
        let id = self.hub.handle_unserved(self.now);
        self.pending.insert(id);
        self.drain();
        id
    }

    /// Answers the oldest fetch of `url` under way (false if there is none).
    pub fn answer_fetch(&mut self, url: &str, result: Result<Fetched, String>) -> bool {
        let Some(at) = self.fetches.iter().position(|(_, u)| u == url) else {
            return false;
        };
        let (fetch, _) = self.fetches.remove(at);
        self.hub.handle_fetched(self.now, fetch, result);
        self.drain();
        true
    }

    /// The fetches under way, oldest first.
    pub fn fetches(&self) -> impl Iterator<Item = &str> {
        self.fetches.iter().map(|(_, url)| url.as_str())
    }

    /// The fetched key sets in use.
    pub fn key_sets(&self) -> &[switchboard_core::KeySet] {
        &self.key_sets
    }

    /// The configuration was read again and checked (SIGHUP).
    pub fn reload(&mut self, reload: switchboard_core::hub::Reload) {
        self.hub.handle_reload(self.now, reload);
        self.drain();
    }

    /// A reload was refused: a file failed.
    pub fn reload_failed(&mut self, why: &str) {
        self.hub.handle_reload_failed(self.now, why.to_owned());
        self.drain();
    }

    /// The gate refused a request (e.g. a token of `claimed_issuer` naming an unknown key).
    pub fn refused(
        &mut self,
        rejection: switchboard_core::Rejection,
        claimed_issuer: Option<&str>,
    ) {
        let asked = switchboard_core::Asked::new(Default::default(), "POST", "/mcp", "");
        let turned_away = switchboard_core::hub::TurnedAway {
            why: switchboard_core::hub::Refusal::Gate(rejection),
            asked,
            claimed_issuer: claimed_issuer.map(std::sync::Arc::from),
        };
        self.hub.handle_refused(self.now, turned_away);
        self.drain();
    }

    /// The client of `stream` hangs up.
    pub fn hang_up(&mut self, stream: StreamId) {
        if let Some(s) = self.streams.get_mut(&stream) {
            if !s.is_open() {
                return;
            }
            s.ended_by_shell = true;
        }
        self.hub
            .handle_stream_closed(self.now, stream, StreamEnd::ClientGone);
        self.drain();
    }

    /// The client of `request` hangs up before its answer: the shell forgets it (a late
    /// answer to it would fail the run) and tells the hub.
    pub fn client_left(&mut self, request: RequestId) {
        assert!(
            self.pending.remove(&request),
            "{request:?} left after its answer, or never asked"
        );
        self.hub.handle_client_left(self.now, request);
        self.drain();
    }

    /// The client of `stream` stops reading (or, with `false`, reads everything queued).
    pub fn stall(&mut self, stream: StreamId, stalled: bool) {
        if let Some(s) = self.streams.get_mut(&stream) {
            s.stalled = stalled;
            if !stalled {
                s.queued = 0;
            }
        }
    }

    /// The backend writes `line` (without newline) on stdout; `None` for one over `--max-line`.
    pub fn backend_line(&mut self, line: Option<&[u8]>) {
        let Some(id) = self.process.as_ref().map(|p| p.id) else {
            return;
        };
        self.hub.handle_backend_lines(self.now, id, [line]);
        self.drain();
    }

    /// The backend process exits on its own.
    pub fn backend_exit(&mut self, exit: Exit) {
        let Some(process) = self.process.take() else {
            return;
        };
        self.hub.handle_backend_exited(self.now, process.id, exit);
        self.drain();
    }

    /// The next `n` spawns fail.
    pub fn fail_spawns(&mut self, n: usize) {
        self.spawn_failures = n;
    }

    /// The backend stops reading its stdin (`true`) or reads everything queued (`false`).
    pub fn stall_stdin(&mut self, stalled: bool) {
        self.script.stdin_stalled = stalled;
        if stalled {
            return;
        }
        if let Some(p) = &mut self.process {
            let (id, unread) = (p.id, std::mem::take(&mut p.unread));
            if unread > 0 {
                self.hub.handle_backend_wrote(self.now, id, unread);
                self.drain();
            }
        }
    }

    /// SIGINT or SIGTERM for the proxy.
    pub fn shutdown(&mut self) {
        self.hub.handle_shutdown(self.now);
        self.drain();
    }

    /// Moves virtual time forward by `by`, running every timer at its own instant.
    pub fn advance(&mut self, by: Duration) {
        let target = self.now + by;
        for _ in 0..MAX_TIMER_STEPS {
            match self.hub.poll_timeout() {
                Some(at) if at <= target => {
                    self.now = self.now.max(at);
                    self.hub.handle_timeout(self.now);
                    self.drain();
                }
                _ => {
                    self.now = target;
                    return;
                }
            }
        }
        panic!("the hub livelocked: {MAX_TIMER_STEPS} timer firings before {by:?} passed");
    }

    fn note(&mut self, text: String) {
        self.records.push(Record {
            at: self.elapsed(),
            seen: Seen::Note(text),
        });
    }

    /// Drains and performs every output, as a shell's `execute` would.
    fn drain(&mut self) {
        while let Some(output) = self.hub.poll_output() {
            // After Exit the hub only refuses what a shell still had queued.
            assert!(
                self.exit_status.is_none()
                    || matches!(&output, Output::Respond { response, .. } if response.status == 503),
                "output after Exit: {output:?}"
            );
            self.records.push(Record {
                at: self.elapsed(),
                seen: Seen::Output(output.clone()),
            });
            self.perform(output);
        }
        // An audit context lives no longer than its request's HTTP exchange.
        assert!(
            self.hub.inspect().audit_pending() <= self.pending.len(),
            "{} audit contexts for {} requests not answered",
            self.hub.inspect().audit_pending(),
            self.pending.len()
        );
    }

    fn answered(&mut self, request: RequestId, answer: Answer) {
        assert!(
            self.pending.remove(&request),
            "{request:?} answered twice or never asked: {answer:?}"
        );
        self.answers.insert(request, answer);
    }

    fn perform(&mut self, output: Output) {
        match output {
            Output::Fetch { fetch, url } => {
                assert!(
                    switchboard_core::check_fetchable(&url).is_ok(),
                    "a fetch of {url}, which is neither https nor loopback"
                );
                self.fetches.push((fetch, url));
            }
            Output::UseKeys { sets } => self.key_sets = sets.to_vec(),
            Output::Respond { request, response } => {
                assert!(
                    (100..600).contains(&response.status),
                    "status {}",
                    response.status
                );
                self.answered(request, Answer::Response(response));
            }
            Output::StartStream {
                request,
                stream,
                head,
                budget,
            } => {
                assert_eq!(head.status, 200, "a stream is a 200");
                assert!(head.body.is_empty(), "a stream head has no body");
                assert!(
                    !self.streams.contains_key(&stream),
                    "{stream:?} started twice"
                );
                self.answered(request, Answer::Stream(stream));
                self.streams.insert(
                    stream,
                    ClientStream {
                        request,
                        frames: Vec::new(),
                        stalled: false,
                        queued: 0,
                        budget,
                        ended_by_hub: false,
                        ended_by_shell: false,
                    },
                );
            }
            Output::ToStream { stream, frame } => {
                let s = self
                    .streams
                    .get_mut(&stream)
                    .unwrap_or_else(|| panic!("ToStream for {stream:?}, never started"));
                assert!(!s.ended_by_hub, "ToStream for {stream:?} after EndStream");
                check_frame(frame.as_ref());
                if s.ended_by_shell {
                    return;
                }
                if s.stalled {
                    if s.queued + frame.len() > s.budget {
                        s.ended_by_shell = true;
                        let budget = s.budget;
                        self.note(format!(
                            "{stream:?}'s queue is full ({budget} bytes): the shell ends it"
                        ));
                        self.hub
                            .handle_stream_closed(self.now, stream, StreamEnd::Full);
                        return;
                    }
                    s.queued += frame.len();
                }
                s.frames.push(frame.as_ref().to_vec());
            }
            Output::EndStream { stream } => {
                let s = self
                    .streams
                    .get_mut(&stream)
                    .unwrap_or_else(|| panic!("EndStream for {stream:?}, never started"));
                assert!(!s.ended_by_hub, "{stream:?} ended twice");
                s.ended_by_hub = true;
            }
            Output::SpawnBackend { backend } => {
                assert!(self.process.is_none(), "a second backend while one runs");
                if self.spawn_failures > 0 {
                    self.spawn_failures -= 1;
                    self.hub.handle_spawn_failed(
                        self.now,
                        backend,
                        "No such file or directory (os error 2)".to_owned(),
                    );
                    return;
                }
                let pid = self.next_pid;
                self.next_pid += 1;
                self.process = Some(Process {
                    id: backend,
                    pid,
                    unread: 0,
                    stdin_closed: false,
                });
                self.hub.handle_backend_spawned(self.now, backend, pid);
            }
            Output::ToBackend { backend, line } => {
                let process = self
                    .process
                    .as_mut()
                    .filter(|p| p.id == backend)
                    .unwrap_or_else(|| panic!("ToBackend for {backend:?}, which is not running"));
                assert!(!process.stdin_closed, "ToBackend after CloseBackendStdin");
                check_backend_line(&line);
                self.backend_input.push((backend, line));
                if self.script.stdin_stalled {
                    process.unread += 1;
                } else {
                    self.hub.handle_backend_wrote(self.now, backend, 1);
                }
            }
            Output::CloseBackendStdin { backend } => {
                let process = self
                    .process
                    .as_mut()
                    .filter(|p| p.id == backend)
                    .unwrap_or_else(|| panic!("CloseBackendStdin for {backend:?}"));
                process.stdin_closed = true;
                if !self.script.stubborn {
                    self.note("the backend exits 0 after its stdin closed".to_owned());
                    self.process = None;
                    self.hub
                        .handle_backend_exited(self.now, backend, Exit::Code(0));
                }
            }
            Output::SignalBackend { backend, signal } => {
                if self.process.as_ref().is_none_or(|p| p.id != backend) {
                    return;
                }
                if signal == Signal::Kill || !self.script.stubborn {
                    self.note(format!("the backend dies of {signal:?}"));
                    self.process = None;
                    self.hub
                        .handle_backend_exited(self.now, backend, Exit::Signal);
                }
            }
            Output::StopAccepting => self.accepting = false,
            Output::Exit { status, .. } => self.exit_status = Some(status),
            Output::Log(_) => {}
            Output::Audit(record) => {
                let json = record.to_json("id", "time", "switchboard");
                assert!(
                    serde_json::from_str::<serde_json::Value>(&json).is_ok(),
                    "an audit event that is not JSON: {json}"
                );
            }
            Output::Span(span) => {
                assert!(span.context.sampled, "only sampled spans are exported");
                assert!(span.start <= span.end, "a span ends after it starts");
                assert!(span.context.trace_id != [0; 16] && span.context.span_id != [0; 8]);
            }
            Output::Measured(measured) => {
                assert!(measured.seconds.is_finite() && measured.seconds >= 0.0);
            }
        }
    }
}

/// An event without its `id:` line (Streamable streams number their events).
pub fn without_id(frame: &[u8]) -> &[u8] {
    match frame.strip_prefix(b"id: ") {
        Some(rest) => rest
            .iter()
            .position(|&b| b == b'\n')
            .map_or(frame, |at| &rest[at + 1..]),
        None => frame,
    }
}

/// A stream frame is the endpoint event, a keep-alive comment, a priming event (an id and
/// empty data) or one `message` event (with or without an id) holding one JSON object
/// with no raw newline.
fn check_frame(frame: &[u8]) {
    if frame == switchboard_core::sse::KEEPALIVE || frame.starts_with(b"event: endpoint\ndata: ") {
        return;
    }
    let frame = without_id(frame);
    if frame == b"data: \n\n" {
        return;
    }
    let data = frame
        .strip_prefix(b"event: message\ndata: ")
        .and_then(|rest| rest.strip_suffix(b"\n\n"))
        .unwrap_or_else(|| {
            panic!(
                "not an SSE message event: {:?}",
                String::from_utf8_lossy(frame)
            )
        });
    assert!(
        !data.contains(&b'\n') && !data.contains(&b'\r'),
        "a raw newline inside an event's data"
    );
    assert_json_object(data);
}

/// A backend line is one JSON object, then exactly one `\n`.
fn check_backend_line(line: &[u8]) {
    let body = line.strip_suffix(b"\n").unwrap_or_else(|| {
        panic!(
            "a backend line ends in \\n: {:?}",
            String::from_utf8_lossy(line)
        )
    });
    assert!(
        !body.contains(&b'\n') && !body.contains(&b'\r'),
        "a backend line holds one newline only"
    );
    assert_json_object(body);
}

fn assert_json_object(bytes: &[u8]) {
    let text = std::str::from_utf8(bytes).expect("output is UTF-8");
    let value: Box<RawValue> = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("output is one JSON value ({e}): {text}"));
    assert!(
        value.get().starts_with('{'),
        "output is a JSON object: {text}"
    );
}
