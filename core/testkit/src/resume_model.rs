//! Resumable streams and the fair share, as properties (SPEC sections 7 and 12): seeded
//! operation sequences over a few Streamable sessions of a few principals (POSTs answered
//! as streams, primed or not, or as JSON; hang-ups and stalls of request and GET streams;
//! GET streams; backend progress and responses, fresh and repeated; `GET` with
//! `Last-Event-ID` naming the session's own streams at any position, other sessions'
//! streams, other principals' sessions, ended sessions and ids this proxy never sent;
//! time passing within and past the resume window; the backend's stdin stalled and drained
//! while one session floods), run through the [`Driver`], with after every step:
//!
//! 1. every frame on a stream belongs to that stream: its event id names the stream's own
//!    number (a resumed stream's: the stream it resumed), positions follow one another
//!    (a resumed request stream from right after the `Last-Event-ID`: nothing skipped), one
//!    event id is always the same event, and the message belongs to the stream's session
//!    (backend messages carry a marker saying whom the backend meant) and, on a request
//!    stream, to its request: its progress, its response under its own id, nothing else;
//!    never a response on a GET stream;
//! 2. each request gets at most one response across its original stream, every
//!    resumption and its JSON answer: one event id carries it (replaying that same event is
//!    not a second answer); a -32001 `response lost` counts as its answer and nothing is
//!    delivered for it afterwards; a request stream ends after its response; and what has
//!    somewhere to go arrives (progress and responses for a request whose stream is open, a
//!    JSON answer);
//! 3. a GET naming another principal's or an ended session is 404; a `Last-Event-ID` that
//!    names no stream of the session (another session's stream number, garbage) is 400; one
//!    of its own streams within the window is 200 (a replay, or -32001 when its events are
//!    gone), past it -32001 for a request stream and 400 for a GET stream;
//! 4. `resume_bytes` stays within live sessions × `--resume-buffer` and the global cap, and
//!    is 0 (with no resume timers) once no session is live;
//! 5. the fair share: a valid POST is refused 503 exactly when its session already has its
//!    share of the stalled stdin queue (the queue split among the sessions with lines queued,
//!    itself counted), so a session with nothing queued always gets through and no session
//!    is admitted past its share.
//!
//! An expired request stream remembers where its answer was: resuming it at or after that
//! event gets a stream that ends at once (the client has its answer; a -32001 then would
//! be a second, contradictory one), before it a -32001.
//!
//! A failing sequence is shrunk ([`shrink`]) and shown as a scenario script ([`Outcome::script`])
//! that `core/tests/scenarios/` can run as it is.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;
use switchboard_core::http::{Admitted, Endpoint, McpHeaders, Response};
use switchboard_core::hub::{Payload, Settings, RESUME_GLOBAL};
use switchboard_core::{Principal, RequestId, SessionId, StreamId};

use crate::driver::{without_id, Answer, Driver};
use crate::scenario::{scenario_settings, Labels};

/// `--resume-window` of the runs.
pub const WINDOW: Duration = Duration::from_secs(10);
/// `--resume-buffer` of the runs (small: events are evicted often).
pub const BUFFER: usize = 2048;
/// `--stdin-queue` of the runs (small: the fair share matters).
pub const QUEUE: usize = 4;
/// `--request-timeout` of the runs.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Session slots, and the principal owning each slot's sessions.
const OWNERS: [&str; 4] = ["alice", "bob", "alice", "carol"];
/// Everyone who asks (an impostor is anyone else).
const PRINCIPALS: [&str; 4] = ["alice", "bob", "carol", "mallory"];
/// `Last-Event-ID`s this proxy never sends.
const GARBAGE: [&str; 12] = [
    "abc",
    "",
    "1",
    "1.",
    ".1",
    "1.2.3",
    "-1.0",
    "+1.2",
    "0.0",
    "4294967296.1",
    "1.99999999999999999999",
    "\u{663}.\u{661}",
];
/// Answered streams a session may have before the hub forgets the oldest
/// ([`switchboard_core::hub::MAX_FINISHED_KEPT`], with room to spare): past it the model
/// does not predict resumptions of that session.
const FINISHED_PREDICTED: usize = 48;
const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#;
const INIT_RESULT: &str = r#"{"jsonrpc":"2.0","id":"switchboard|initialize:1","result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{"listChanged":true}},"serverInfo":{"name":"s","version":"1"}}}"#;
const SSE: &str = "text/event-stream";
const BOTH: &str = "application/json, text/event-stream";
const V2025_11_25: &str = "2025-11-25";

/// How a POST asks to be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// Both media types and a progress token: a stream.
    Token,
    /// Only `text/event-stream`, no token: a stream.
    SseOnly,
    /// Both media types, no token: a JSON body.
    Json,
}

/// Which `Last-Event-ID` a resuming GET sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// One of the session's own streams, at a position the client saw.
    OwnSeen,
    /// One of the session's own streams, at any position (maybe past its end).
    OwnAny,
    /// A stream number of another session.
    OtherSession,
    /// The session's own stream, asked by another principal.
    OtherPrincipal,
    /// Text this proxy never sends.
    Garbage,
    /// A stream of a session that ended.
    Ended,
}

/// One operation; `pick`s choose among what exists when it runs, so every sequence runs
/// (and a shrunk one too).
#[derive(Debug, Clone)]
pub enum Op {
    /// A POST of a `tools/call` by the slot's session.
    Post {
        /// Which slot.
        slot: u8,
        /// How it asks to be answered.
        form: Form,
        /// `MCP-Protocol-Version: 2025-11-25` (its stream is primed).
        priming: bool,
    },
    /// `count` POSTs in a row (with progress tokens) by the slot's session.
    Flood {
        /// Which slot.
        slot: u8,
        /// How many.
        count: u8,
    },
    /// A POST to the slot's session by another principal: 404.
    PostForeign {
        /// Which slot.
        slot: u8,
        /// Which other principal.
        who: u8,
    },
    /// The backend answers a request it was sent (`fresh`: one it has not answered yet).
    Respond {
        /// Which request.
        pick: u32,
        /// One not answered yet.
        fresh: bool,
        /// Bytes of padding in the result.
        pad: u16,
    },
    /// The backend reports progress for a request (`stray`: a token nobody sent).
    Progress {
        /// Which request (or session, for a stray token).
        pick: u32,
        /// A token no request carries.
        stray: bool,
        /// Bytes of padding in the message.
        pad: u16,
    },
    /// `notifications/tools/list_changed` from the backend.
    ListChanged,
    /// A client hangs up one of the open streams.
    HangUp {
        /// Which stream.
        pick: u32,
    },
    /// A client stops reading one of the open streams (`false`: reads again).
    Stall {
        /// Which stream.
        pick: u32,
        /// Stops or reads again.
        stalled: bool,
    },
    /// `GET /mcp` without `Last-Event-ID`: the slot's new GET stream.
    Get {
        /// Which slot.
        slot: u8,
    },
    /// `GET /mcp` with `Last-Event-ID`.
    Resume {
        /// Which slot.
        slot: u8,
        /// Which id.
        target: Target,
        /// Which stream and position.
        pick: u32,
    },
    /// Virtual time passes.
    Advance(Duration),
    /// The backend stops reading its stdin (`true`) or reads everything queued.
    StdinStall(bool),
    /// `DELETE /mcp` for the slot's session.
    Delete {
        /// Which slot.
        slot: u8,
    },
    /// A new session (an `initialize`) in the slot, if it has none.
    Init {
        /// Which slot.
        slot: u8,
    },
}

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The first property that failed, with the step.
    pub violation: Option<String>,
    /// The operations as a scenario script (`core/tests/scenarios/*.txt`).
    pub script: String,
    /// How often each interesting case was reached.
    pub coverage: BTreeMap<&'static str, u64>,
}

/// The settings the runs use.
pub fn settings() -> Settings {
    Settings {
        resume_window: Some(WINDOW),
        resume_buffer: BUFFER,
        stdin_queue: QUEUE,
        // The model counts the lines the stalled backend has not read; the backend window
        // (SPEC section 12, its own scenarios) is kept out of the way.
        backend_window: WINDOW_OFF,
        request_timeout: Some(REQUEST_TIMEOUT),
        ..scenario_settings()
    }
}

/// The `with` lines that give a scenario script [`settings`].
const SCRIPT_HEAD: &str = "with resume-window 10s\nwith resume-buffer 2KiB\nwith stdin-queue 4\nwith backend-window 65536\nwith request-timeout 60s\n";

/// A backend window no run fills.
const WINDOW_OFF: usize = 65_536;

/// `len` operations from a seeded generator.
pub fn random_ops(seed: u64, len: usize) -> Vec<Op> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d | 1);
    (0..len).map(|_| rng.op()).collect()
}

/// xorshift64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn slot(&mut self) -> u8 {
        self.below(OWNERS.len() as u64) as u8
    }

    fn pick(&mut self) -> u32 {
        self.next() as u32
    }

    fn pad(&mut self) -> u16 {
        match self.below(10) {
            0..=5 => 0,
            6..=8 => self.below(300) as u16,
            _ => 300 + self.below(1200) as u16,
        }
    }

    fn op(&mut self) -> Op {
        match self.below(100) {
            0..=19 => Op::Post {
                slot: self.slot(),
                form: match self.below(10) {
                    0..=5 => Form::Token,
                    6..=7 => Form::SseOnly,
                    _ => Form::Json,
                },
                priming: self.below(2) == 0,
            },
            20..=23 => Op::Flood {
                slot: self.slot(),
                count: 3 + self.below(6) as u8,
            },
            24..=25 => Op::PostForeign {
                slot: self.slot(),
                who: self.below(3) as u8,
            },
            26..=41 => Op::Respond {
                pick: self.pick(),
                fresh: self.below(4) != 0,
                pad: self.pad(),
            },
            42..=53 => Op::Progress {
                pick: self.pick(),
                stray: self.below(4) == 0,
                pad: self.pad(),
            },
            54..=58 => Op::ListChanged,
            59..=64 => Op::HangUp { pick: self.pick() },
            65..=67 => Op::Stall {
                pick: self.pick(),
                stalled: self.below(2) == 0,
            },
            68..=71 => Op::Get { slot: self.slot() },
            72..=84 => Op::Resume {
                slot: self.slot(),
                target: match self.below(20) {
                    0..=7 => Target::OwnSeen,
                    8..=10 => Target::OwnAny,
                    11..=13 => Target::OtherSession,
                    14..=15 => Target::OtherPrincipal,
                    16..=18 => Target::Garbage,
                    _ => Target::Ended,
                },
                pick: self.pick(),
            },
            85..=91 => Op::Advance(match self.below(4) {
                0..=2 => Duration::from_millis(100 * (1 + self.below(40))),
                _ => Duration::from_millis(1000 * (10 + self.below(20))),
            }),
            92..=95 => Op::StdinStall(self.below(2) == 0),
            96 => Op::Delete { slot: self.slot() },
            _ => Op::Init { slot: self.slot() },
        }
    }
}

/// Runs `ops` (after opening one session in each slot) and checks the properties after
/// every step; at the end every session is deleted and nothing may be left.
pub fn run(ops: &[Op]) -> Outcome {
    let mut run = Run::new();
    run.setup();
    for (step, op) in ops.iter().enumerate() {
        if run.violation.is_some() {
            break;
        }
        run.step(step, op);
    }
    if run.violation.is_none() {
        run.finish();
    }
    Outcome {
        violation: run.violation,
        script: run.script,
        coverage: run.coverage,
    }
}

/// The shortest sequence found (removing chunks, then single operations) that still
/// fails (a violation or a panic); `ops` itself must fail.
pub fn shrink(ops: &[Op]) -> Vec<Op> {
    let fails =
        |ops: &[Op]| std::panic::catch_unwind(|| run(ops).violation.is_some()).unwrap_or(true);
    let mut ops = ops.to_vec();
    let mut chunk = ops.len().div_ceil(2).max(1);
    loop {
        let mut at = 0;
        while at < ops.len() {
            let mut fewer = ops.clone();
            fewer.drain(at..(at + chunk).min(ops.len()));
            if fails(&fewer) {
                ops = fewer;
            } else {
                at += chunk;
            }
        }
        if chunk == 1 {
            return ops;
        }
        chunk = chunk.div_ceil(2);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Get,
    /// The request (index into `Run::reqs`).
    Request(usize),
}

/// What the hub still holds of a stream, as far as the model can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Kept: attached, or dropped within the window.
    Kept,
    /// Forgotten: resuming it is a 400.
    Forgotten,
    /// Expired request stream: resuming it is a -32001.
    Expired,
}

/// One stream of a session as the hub numbers it.
#[derive(Debug, Clone)]
struct Key {
    kind: KeyKind,
    /// The client stream carrying it now.
    attached: Option<StreamId>,
    /// When its client went away (no earlier, no later than).
    detached: Option<(Duration, Duration)>,
    /// Its response was seen.
    finished: bool,
    held: Held,
    /// The highest position a client saw.
    max_seen: Option<u64>,
}

#[derive(Debug)]
struct Sess {
    label: String,
    principal: &'static str,
    id: SessionId,
    sid: String,
    live: bool,
    next_key: u32,
    keys: BTreeMap<u32, Key>,
    get_key: Option<u32>,
    /// Every event seen, by id: one id is always the same event.
    events: BTreeMap<(u32, u64), Vec<u8>>,
    /// Client lines waiting in the stalled stdin queue.
    queued: usize,
}

#[derive(Debug)]
struct Req {
    session: usize,
    id: u64,
    token: Option<String>,
    priming: bool,
    key: Option<u32>,
    post: RequestId,
    json: bool,
    /// Its line reached the backend.
    forwarded: bool,
    /// The backend answered it (once or more).
    backend_answered: bool,
    /// The event that carried its response.
    answer: Option<(u32, u64)>,
    /// It was answered as JSON.
    json_answered: bool,
    /// A -32001 `response lost` was delivered for it.
    lost: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ViewKind {
    /// A POST's answer stream.
    Post,
    /// A GET stream.
    Get,
    /// A resumption from this position (a replay, or a -32001 when `lost`).
    Resume(u64),
}

/// A client stream, as the model reads it.
#[derive(Debug)]
struct View {
    session: usize,
    key: u32,
    kind: ViewKind,
    /// Its script name (`A@12`, `A/get`, `A/resume@30`).
    name: String,
    checked: usize,
    last_pos: Option<u64>,
    /// It carried a response (or a lost answer): nothing may follow.
    answered: bool,
    /// It carried a -32001 `response lost`.
    lost: bool,
}

/// What the backend meant a message for.
#[derive(Debug)]
struct Marker {
    session: usize,
    /// The request a response answers, or whose token a progress carries.
    req: Option<usize>,
}

struct Run {
    d: Driver,
    labels: Labels,
    script: String,
    line: usize,
    slots: [Option<usize>; OWNERS.len()],
    sessions: Vec<Sess>,
    reqs: Vec<Req>,
    by_id: BTreeMap<u64, usize>,
    views: BTreeMap<StreamId, View>,
    markers: Vec<Marker>,
    next_id: u64,
    stalled: bool,
    input_seen: usize,
    step_start: Duration,
    violation: Option<String>,
    context: String,
    coverage: BTreeMap<&'static str, u64>,
}

fn header(response: &Response, name: &str) -> Option<String> {
    response
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.to_string())
}

/// An answer as a failure shows it: `stream S12`, `404 {...}`, `none`.
fn show(answer: Option<&Answer>) -> String {
    match answer {
        Some(Answer::Stream(stream)) => format!("a stream ({stream:?})"),
        Some(Answer::Response(r)) => format!("{} {}", r.status, String::from_utf8_lossy(&r.body)),
        None => "no answer yet".to_owned(),
    }
}

fn label_of(n: usize) -> String {
    let letter = (b'A' + (n % 26) as u8) as char;
    match n / 26 {
        0 => letter.to_string(),
        round => format!("{letter}{round}"),
    }
}

impl Run {
    fn new() -> Run {
        let mut d = Driver::new(settings());
        d.take_records();
        Run {
            d,
            labels: Labels::default(),
            script: format!("# resume_properties\n{SCRIPT_HEAD}"),
            line: SCRIPT_HEAD.lines().count() + 1,
            slots: [None; OWNERS.len()],
            sessions: Vec::new(),
            reqs: Vec::new(),
            by_id: BTreeMap::new(),
            views: BTreeMap::new(),
            markers: Vec::new(),
            next_id: 1,
            stalled: false,
            input_seen: 0,
            step_start: Duration::ZERO,
            violation: None,
            context: String::new(),
            coverage: BTreeMap::new(),
        }
    }

    fn hit(&mut self, what: &'static str) {
        *self.coverage.entry(what).or_default() += 1;
    }

    fn fail(&mut self, text: String) {
        if self.violation.is_none() {
            self.violation = Some(format!("{}: {text}", self.context));
        }
    }

    /// Adds a script line; its number (stream names use it).
    fn say(&mut self, text: &str) -> usize {
        self.line += 1;
        writeln!(self.script, "{text}").unwrap();
        self.line
    }

    fn setup(&mut self) {
        self.context = "setup".to_owned();
        for slot in 0..OWNERS.len() {
            self.init(slot);
            if slot == 0 {
                self.say(&format!("backend {INIT_RESULT}"));
                self.d.backend_line(Some(INIT_RESULT.as_bytes()));
            }
        }
        self.after_step();
        let live = self.slots.iter().flatten().count();
        if live != OWNERS.len() {
            self.fail(format!("{live} sessions opened, not {}", OWNERS.len()));
        }
    }

    fn step(&mut self, step: usize, op: &Op) {
        self.context = format!("step {step} ({op:?})");
        self.step_start = self.d.elapsed();
        match *op {
            Op::Post {
                slot,
                form,
                priming,
            } => self.post(slot as usize, form, priming),
            Op::Flood { slot, count } => {
                for _ in 0..count {
                    self.post(slot as usize, Form::Token, false);
                }
            }
            Op::PostForeign { slot, who } => self.post_foreign(slot as usize, who as usize),
            Op::Respond { pick, fresh, pad } => self.respond(pick, fresh, pad),
            Op::Progress { pick, stray, pad } => self.progress(pick, stray, pad),
            Op::ListChanged => {
                let line = r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#;
                self.say(&format!("backend {line}"));
                self.d.backend_line(Some(line.as_bytes()));
            }
            Op::HangUp { pick } => {
                if let Some(stream) = self.pick_open(pick) {
                    let name = self.views[&stream].name.clone();
                    self.say(&format!("hangup {name}"));
                    self.d.hang_up(stream);
                    self.hit("hangup");
                }
            }
            Op::Stall { pick, stalled } => {
                if let Some(stream) = self.pick_open(pick) {
                    let name = self.views[&stream].name.clone();
                    let word = if stalled { "stall" } else { "resume" };
                    self.say(&format!("{word} {name}"));
                    self.d.stall(stream, stalled);
                }
            }
            Op::Get { slot } => self.get(slot as usize),
            Op::Resume { slot, target, pick } => self.resume(slot as usize, target, pick),
            Op::Advance(by) => {
                self.say(&format!("at +{}ms", by.as_millis()));
                self.d.advance(by);
                self.hit(if by > WINDOW {
                    "advance:past-window"
                } else {
                    "advance"
                });
            }
            Op::StdinStall(stalled) => {
                self.say(if stalled {
                    "stdin-stall"
                } else {
                    "stdin-drain"
                });
                self.d.stall_stdin(stalled);
                self.stalled = stalled;
                if !stalled {
                    for s in &mut self.sessions {
                        s.queued = 0;
                    }
                }
            }
            Op::Delete { slot } => self.delete(slot as usize),
            Op::Init { slot } => {
                let slot = slot as usize;
                if self.slots[slot].is_none() {
                    self.init(slot);
                }
            }
        }
        self.after_step();
    }

    /// Deletes every session: nothing is left of them.
    fn finish(&mut self) {
        self.context = "the end".to_owned();
        self.step_start = self.d.elapsed();
        for slot in 0..OWNERS.len() {
            self.delete(slot);
        }
        self.after_step();
        let sizes = self.d.hub().inspect().table_sizes();
        if self.d.hub().inspect().live_sessions() != 0
            || sizes.resume_bytes != 0
            || sizes.resume_timers != 0
            || sizes.streams != 0
            || sizes.in_flight != 0
            || sizes.progress_tokens != 0
            || sizes.request_timers != 0
        {
            self.fail(format!("every session deleted, left: {sizes:?}"));
        }
    }

    fn mcp_request(
        &mut self,
        endpoint: Endpoint,
        principal: &str,
        session: Option<String>,
        headers: (Option<&str>, Option<&str>, Option<String>),
        body: &str,
        entropy: [u8; 16],
    ) -> RequestId {
        let (accept, version, last_event_id) = headers;
        let admitted = Admitted {
            mcp: McpHeaders {
                session,
                content_type: Some("application/json".into()),
                accept: accept.map(|a| a.to_owned().into()),
                protocol_version: version.map(|v| v.to_owned().into()),
                last_event_id,
                fields: Vec::new(),
            },
            ..Admitted::new(endpoint, Principal::new(principal), "")
        };
        let body = Payload::Bytes(body.as_bytes().to_vec());
        self.d.send(admitted.into_request(body, || entropy))
    }

    fn init(&mut self, slot: usize) {
        let label = label_of(self.sessions.len());
        let principal = OWNERS[slot];
        self.say(&format!("mcp-init {label} {principal} {INIT}"));
        let id = self.labels.sid(&label);
        let sid = id.to_string();
        let entropy = self.labels.entropy(&label);
        let request = self.mcp_request(
            Endpoint::McpPost,
            principal,
            None,
            (Some(BOTH), None, None),
            INIT,
            entropy,
        );
        self.sessions.push(Sess {
            label,
            principal,
            id,
            sid: sid.clone(),
            live: true,
            next_key: 0,
            keys: BTreeMap::new(),
            get_key: None,
            events: BTreeMap::new(),
            queued: 0,
        });
        let index = self.sessions.len() - 1;
        self.slots[slot] = Some(index);
        if slot == 0 && index == 0 {
            // The first initialize waits for the backend (answered by `setup`).
            return;
        }
        match self.d.answer(request) {
            Some(Answer::Response(r)) if r.status == 200 => {
                if header(r, "mcp-session-id").as_deref() != Some(sid.as_str()) {
                    let got = header(r, "mcp-session-id");
                    self.fail(format!("initialize names {got:?}, not {sid}"));
                }
                self.hit("init");
            }
            other => {
                let other = show(other);
                self.fail(format!("initialize answered {other}"));
            }
        }
    }

    fn live_slot(&self, slot: usize) -> Option<usize> {
        self.slots[slot].filter(|&s| self.sessions[s].live)
    }

    /// Whether a session with `mine` lines queued is within its share now.
    fn fits(&self, mine: usize) -> bool {
        let sharing =
            self.sessions.iter().filter(|s| s.queued > 0).count() + usize::from(mine == 0);
        mine < (QUEUE / sharing).max(1)
    }

    fn post(&mut self, slot: usize, form: Form, priming: bool) {
        let Some(s) = self.live_slot(slot) else {
            return;
        };
        let id = self.next_id;
        self.next_id += 1;
        let token = (form == Form::Token).then(|| format!("t{id}"));
        let meta = match &token {
            Some(t) => format!(r#","_meta":{{"progressToken":"{t}"}}"#),
            None => String::new(),
        };
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"slow"{meta}}}}}"#
        );
        let accept = if form == Form::SseOnly { SSE } else { BOTH };
        let label = self.sessions[s].label.clone();
        let line = match (form, priming) {
            (Form::SseOnly, true) => self.say(&format!(
                "mcp-raw POST {label} accept=sse version={V2025_11_25} {body}"
            )),
            (Form::SseOnly, false) => self.say(&format!("mcp-raw POST {label} accept=sse {body}")),
            (_, true) => self.say(&format!(
                "mcp-raw POST {label} version={V2025_11_25} {body}"
            )),
            (_, false) => self.say(&format!("mcp-post {label} {body}")),
        };
        let mine = self.sessions[s].queued;
        let others_full = self
            .sessions
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != s)
            .map(|(_, o)| o.queued)
            .sum::<usize>()
            >= QUEUE;
        let fits = self.fits(mine);
        let sid = self.sessions[s].sid.clone();
        let principal = self.sessions[s].principal;
        let request = self.mcp_request(
            Endpoint::McpPost,
            principal,
            Some(sid),
            (Some(accept), priming.then_some(V2025_11_25), None),
            &body,
            [0xee; 16],
        );
        let answer = self.d.answer(request).cloned();
        let stream_expected = form != Form::Json;
        match answer {
            Some(Answer::Response(r)) if r.status == 503 => {
                if fits {
                    self.fail(format!(
                        "POST refused 503 with {mine} lines queued (queues {:?})",
                        self.queues()
                    ));
                }
                self.hit("post:503");
                return;
            }
            _ if !fits => {
                self.fail(format!(
                    "POST admitted with {mine} lines queued, at its share (queues {:?}): {}",
                    self.queues(),
                    show(answer.as_ref())
                ));
                return;
            }
            Some(Answer::Stream(stream)) if stream_expected => {
                self.sessions[s].next_key += 1;
                let key = self.sessions[s].next_key;
                let req = self.reqs.len();
                self.sessions[s].keys.insert(
                    key,
                    Key {
                        kind: KeyKind::Request(req),
                        attached: Some(stream),
                        detached: None,
                        finished: false,
                        held: Held::Kept,
                        max_seen: None,
                    },
                );
                self.views.insert(
                    stream,
                    View {
                        session: s,
                        key,
                        kind: ViewKind::Post,
                        name: format!("{label}@{line}"),
                        checked: 0,
                        last_pos: None,
                        answered: false,
                        lost: false,
                    },
                );
                self.new_req(s, id, token, priming, Some(key), request);
            }
            None if !stream_expected => {
                self.new_req(s, id, None, priming, None, request);
            }
            other => {
                self.fail(format!("POST ({form:?}) answered {}", show(other.as_ref())));
                return;
            }
        }
        self.read_backend_input();
        if self.stalled {
            self.hit("post:admitted-while-stalled");
            if mine == 0 && others_full {
                self.hit("post:admitted-past-full-queue");
            }
        }
    }

    fn queues(&self) -> Vec<(String, usize)> {
        self.sessions
            .iter()
            .filter(|s| s.queued > 0)
            .map(|s| (s.label.clone(), s.queued))
            .collect()
    }

    fn new_req(
        &mut self,
        session: usize,
        id: u64,
        token: Option<String>,
        priming: bool,
        key: Option<u32>,
        post: RequestId,
    ) {
        self.by_id.insert(id, self.reqs.len());
        self.reqs.push(Req {
            session,
            id,
            token,
            priming,
            key,
            post,
            json: key.is_none(),
            forwarded: false,
            backend_answered: false,
            answer: None,
            json_answered: false,
            lost: false,
        });
    }

    fn post_foreign(&mut self, slot: usize, who: usize) {
        let Some(s) = self.slots[slot] else {
            return;
        };
        let owner = self.sessions[s].principal;
        let others: Vec<&str> = PRINCIPALS.iter().copied().filter(|p| *p != owner).collect();
        let who = others[who % others.len()];
        let id = self.next_id;
        self.next_id += 1;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"x"}}}}"#
        );
        let label = self.sessions[s].label.clone();
        self.say(&format!("mcp-raw POST {label} as={who} {body}"));
        let sid = self.sessions[s].sid.clone();
        let request = self.mcp_request(
            Endpoint::McpPost,
            who,
            Some(sid),
            (Some(BOTH), None, None),
            &body,
            [0xee; 16],
        );
        self.expect_status(request, 404, "a POST by another principal");
    }

    fn expect_status(&mut self, request: RequestId, status: u16, what: &str) {
        match self.d.answer(request) {
            Some(Answer::Response(r)) if r.status == status => {}
            other => {
                let other = show(other);
                self.fail(format!("{what}: expected {status}, got {other}"));
            }
        }
    }

    /// A backend line meant for `session` (and `req`), with its marker.
    fn marker(&mut self, session: usize, req: Option<usize>) -> usize {
        self.markers.push(Marker { session, req });
        self.markers.len() - 1
    }

    fn backend(&mut self, session: usize, line: &str) {
        let label = &self.sessions[session].label;
        let sid = &self.sessions[session].sid;
        let shown = line.replace(sid.as_str(), &format!("<{label}>"));
        // Padding as the scenario language writes it.
        let shown = match shown.find("\"pad\":\"") {
            Some(at) => {
                let start = at + 7;
                let end = start + shown[start..].find('"').expect("closed");
                let n = end - start;
                if n > 0 {
                    format!("{}${{{n}*x}}{}", &shown[..start], &shown[end..])
                } else {
                    shown
                }
            }
            None => shown,
        };
        self.say(&format!("backend {shown}"));
        self.d.backend_line(Some(line.as_bytes()));
    }

    /// A request still waiting whose answer has a client there now: the stream carrying it
    /// (`None` for a JSON request still unanswered).
    fn waiting_client(&self, req: usize) -> Option<Option<StreamId>> {
        let r = &self.reqs[req];
        let s = &self.sessions[r.session];
        if !s.live || r.lost || r.answer.is_some() {
            return None;
        }
        if r.json {
            return self.d.answer(r.post).is_none().then_some(None);
        }
        let key = s.keys.get(&r.key?)?;
        let stream = key.attached?;
        let open = self.d.stream(stream).is_some_and(|c| c.is_open());
        (open && key.held == Held::Kept).then_some(Some(stream))
    }

    fn respond(&mut self, pick: u32, fresh: bool, pad: u16) {
        let candidates: Vec<usize> = (0..self.reqs.len())
            .filter(|&r| self.reqs[r].forwarded && (!fresh || !self.reqs[r].backend_answered))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let req = candidates[pick as usize % candidates.len()];
        let waiting = self.waiting_client(req);
        let r = &self.reqs[req];
        let (session, id) = (r.session, r.id);
        if r.backend_answered {
            self.hit("backend:repeat-answer");
        }
        self.reqs[req].backend_answered = true;
        let m = self.marker(session, Some(req));
        let sid = self.sessions[session].sid.clone();
        let pad = "x".repeat(pad as usize);
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":"{sid}|n:{id}","result":{{"m":{m},"pad":"{pad}"}}}}"#
        );
        self.backend(session, &line);
        match waiting {
            Some(Some(stream)) => {
                let got = self.frames_with_marker(stream, m) || self.overflowed(stream);
                if !got {
                    self.fail(format!(
                        "the response to request {id} did not reach its open stream {}",
                        self.views[&stream].name
                    ));
                }
                if matches!(self.views[&stream].kind, ViewKind::Resume(_)) {
                    self.hit("response:on-resumed-stream");
                }
                self.hit("response:delivered");
            }
            Some(None) => {
                let answered = matches!(self.d.answer(self.reqs[req].post), Some(Answer::Response(r)) if r.status == 200);
                if !answered {
                    self.fail(format!(
                        "the response to JSON request {id} was not its answer"
                    ));
                }
                self.hit("response:json");
            }
            None => self.hit("response:no-client"),
        }
    }

    /// Whether the shell ended `stream` because its client stopped reading.
    fn overflowed(&self, stream: StreamId) -> bool {
        self.d
            .stream(stream)
            .is_some_and(|c| c.ended_by_shell && c.stalled)
    }

    /// Whether a frame carrying marker `m` reached `stream` (not yet checked by the
    /// model).
    fn frames_with_marker(&self, stream: StreamId, m: usize) -> bool {
        let checked = self.views[&stream].checked;
        let Some(client) = self.d.stream(stream) else {
            return false;
        };
        client.frames[checked..].iter().any(|f| {
            message_of(f)
                .and_then(|v| marker_of(&v))
                .is_some_and(|got| got == m)
        })
    }

    fn progress(&mut self, pick: u32, stray: bool, pad: u16) {
        let pad = "x".repeat(pad as usize);
        if stray {
            let live: Vec<usize> = (0..self.sessions.len())
                .filter(|&s| self.sessions[s].live)
                .collect();
            if live.is_empty() {
                return;
            }
            let session = live[pick as usize % live.len()];
            let m = self.marker(session, None);
            let sid = self.sessions[session].sid.clone();
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"{sid}|s:stray","progress":{m},"pad":"{pad}"}}}}"#
            );
            self.backend(session, &line);
            return;
        }
        let candidates: Vec<usize> = (0..self.reqs.len())
            .filter(|&r| self.reqs[r].forwarded && self.reqs[r].token.is_some())
            .filter(|&r| !self.reqs[r].backend_answered || pick.is_multiple_of(4))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let req = candidates[pick as usize % candidates.len()];
        let waiting = self.waiting_client(req);
        let session = self.reqs[req].session;
        let token = self.reqs[req].token.clone().expect("filtered");
        let m = self.marker(session, Some(req));
        let sid = self.sessions[session].sid.clone();
        let line = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"{sid}|s:{token}","progress":{m},"pad":"{pad}"}}}}"#
        );
        self.backend(session, &line);
        if let Some(Some(stream)) = waiting {
            if !self.frames_with_marker(stream, m) && !self.overflowed(stream) {
                let id = self.reqs[req].id;
                self.fail(format!(
                    "progress for request {id} did not reach its open stream {}",
                    self.views[&stream].name
                ));
            }
            if matches!(self.views[&stream].kind, ViewKind::Resume(_)) {
                self.hit("progress:on-resumed-stream");
            }
            self.hit("progress:delivered");
        }
    }

    /// One of the open client streams of live sessions.
    fn pick_open(&self, pick: u32) -> Option<StreamId> {
        let open: Vec<StreamId> = self
            .views
            .keys()
            .copied()
            .filter(|s| self.d.stream(*s).is_some_and(|c| c.is_open()))
            .collect();
        (!open.is_empty()).then(|| open[pick as usize % open.len()])
    }

    fn get(&mut self, slot: usize) {
        let Some(s) = self.live_slot(slot) else {
            return;
        };
        let label = self.sessions[s].label.clone();
        self.say(&format!("mcp-get {label}"));
        let sid = self.sessions[s].sid.clone();
        let principal = self.sessions[s].principal;
        let request = self.mcp_request(
            Endpoint::McpGet,
            principal,
            Some(sid),
            (Some(SSE), None, None),
            "",
            [0xee; 16],
        );
        let Some(stream) = self.d.stream_of(request) else {
            let got = show(self.d.answer(request));
            return self.fail(format!("GET answered {got}"));
        };
        let sess = &mut self.sessions[s];
        sess.next_key += 1;
        let key = sess.next_key;
        let replaced = sess.get_key.replace(key);
        if let Some(k) = replaced.and_then(|old| sess.keys.get_mut(&old)) {
            k.held = Held::Forgotten;
            k.attached = None;
        }
        sess.keys.insert(
            key,
            Key {
                kind: KeyKind::Get,
                attached: Some(stream),
                detached: None,
                finished: false,
                held: Held::Kept,
                max_seen: None,
            },
        );
        if replaced.is_some() {
            self.hit("get:replace");
        }
        self.views.insert(
            stream,
            View {
                session: s,
                key,
                kind: ViewKind::Get,
                name: format!("{label}/get"),
                checked: 0,
                last_pos: None,
                answered: false,
                lost: false,
            },
        );
        self.hit("get");
    }

    /// What resuming `key` of session `s` at `position` must give: `Some(400)`,
    /// `Some(200)` (a replay or a -32001), or `None` when the model cannot tell (a position
    /// it never saw, a window edge, too many answered streams).
    fn predict(&mut self, s: usize, key: u32, position: u64) -> Option<u16> {
        let now = self.d.elapsed();
        let finished_kept = self.sessions[s]
            .keys
            .values()
            .filter(|k| k.held == Held::Kept)
            .filter(|k| match k.kind {
                KeyKind::Request(r) => k.finished || self.reqs[r].backend_answered,
                KeyKind::Get => false,
            })
            .count();
        let sess = &mut self.sessions[s];
        let Some(k) = sess.keys.get_mut(&key) else {
            return Some(400);
        };
        if k.held == Held::Kept && k.attached.is_none() {
            if let Some((earliest, latest)) = k.detached {
                if latest + WINDOW <= now {
                    k.held = match k.kind {
                        KeyKind::Get => Held::Forgotten,
                        KeyKind::Request(_) => Held::Expired,
                    };
                    if sess.get_key == Some(key) {
                        sess.get_key = None;
                    }
                } else if earliest + WINDOW <= now {
                    return None;
                }
            }
        }
        match k.held {
            Held::Forgotten => Some(400),
            Held::Expired => Some(200),
            Held::Kept if finished_kept > FINISHED_PREDICTED => None,
            Held::Kept => match k.max_seen {
                _ if position == 0 => Some(200),
                Some(seen) if position <= seen => Some(200),
                _ => None,
            },
        }
    }

    fn resume(&mut self, slot: usize, target: Target, pick: u32) {
        let pick = pick as usize;
        let session = match target {
            Target::Ended => {
                let ended: Vec<usize> = (0..self.sessions.len())
                    .filter(|&s| !self.sessions[s].live)
                    .collect();
                if ended.is_empty() {
                    return;
                }
                ended[pick % ended.len()]
            }
            _ => match self.live_slot(slot) {
                Some(s) => s,
                None => return,
            },
        };
        let own_keys: Vec<u32> = self.sessions[session].keys.keys().copied().collect();
        let (principal, last_event_id, expected) = match target {
            Target::OwnSeen | Target::OwnAny | Target::Ended | Target::OtherPrincipal => {
                let (key, position) = if own_keys.is_empty() {
                    (1, 0)
                } else {
                    // The GET stream a third of the time: it lives longest.
                    let key = match self.sessions[session].get_key {
                        Some(get) if pick.is_multiple_of(3) => get,
                        _ => own_keys[pick % own_keys.len()],
                    };
                    let seen = self.sessions[session].keys[&key].max_seen.unwrap_or(0);
                    let span = if target == Target::OwnAny {
                        seen + 4
                    } else {
                        seen + 1
                    };
                    (key, (pick as u64 / 7) % span)
                };
                let owner = self.sessions[session].principal;
                let (principal, expected) = match target {
                    Target::Ended => (owner, Some(404)),
                    Target::OtherPrincipal => {
                        let others: Vec<&str> =
                            PRINCIPALS.iter().copied().filter(|p| *p != owner).collect();
                        (others[pick % others.len()], Some(404))
                    }
                    _ => (owner, self.predict(session, key, position)),
                };
                (principal, format!("{key}.{position}"), expected)
            }
            Target::OtherSession => {
                let others: Vec<usize> = (0..self.sessions.len())
                    .filter(|&o| o != session && self.sessions[o].next_key > 0)
                    .collect();
                if others.is_empty() {
                    return;
                }
                let other = others[pick % others.len()];
                let keys: Vec<u32> = self.sessions[other].keys.keys().copied().collect();
                let key = keys[(pick / 3) % keys.len()];
                let seen = self.sessions[other].keys[&key].max_seen.unwrap_or(0);
                let position = (pick as u64 / 11) % (seen + 1);
                // The same number may name a stream of this session too.
                let expected = if self.sessions[session].keys.contains_key(&key) {
                    self.predict(session, key, position)
                } else {
                    self.hit("resume:other-session-stream");
                    Some(400)
                };
                let owner = self.sessions[session].principal;
                (owner, format!("{key}.{position}"), expected)
            }
            Target::Garbage => {
                let owner = self.sessions[session].principal;
                (owner, GARBAGE[pick % GARBAGE.len()].to_owned(), Some(400))
            }
        };
        let label = self.sessions[session].label.clone();
        let as_who = if principal == self.sessions[session].principal {
            String::new()
        } else {
            format!(" as={principal}")
        };
        let line = self.say(&format!(
            "mcp-raw GET {label}{as_who} last-event-id={last_event_id}"
        ));
        let sid = self.sessions[session].sid.clone();
        let request = self.mcp_request(
            Endpoint::McpGet,
            principal,
            Some(sid),
            (Some(SSE), None, Some(last_event_id.clone())),
            "",
            [0xee; 16],
        );
        let answer = self.d.answer(request).cloned();
        let status = match &answer {
            Some(Answer::Stream(_)) => 200,
            Some(Answer::Response(r)) => r.status,
            None => 0,
        };
        let allowed = match expected {
            Some(code) => status == code,
            None => status == 200 || status == 400,
        };
        if !allowed {
            self.fail(format!(
                "GET with Last-Event-ID {last_event_id:?} ({target:?}): expected {expected:?}, got {}",
                show(answer.as_ref())
            ));
            return;
        }
        match status {
            404 => self.hit("resume:404"),
            400 => self.hit("resume:400"),
            _ => {}
        }
        let Some(Answer::Stream(stream)) = answer else {
            return;
        };
        let (key, position) = {
            let (k, p) = last_event_id.split_once('.').expect("a stream's id");
            (k.parse().expect("a key"), p.parse().expect("a position"))
        };
        self.views.insert(
            stream,
            View {
                session,
                key,
                kind: ViewKind::Resume(position),
                name: format!("{label}/resume@{line}"),
                checked: 0,
                last_pos: None,
                answered: false,
                lost: false,
            },
        );
        // A replay carries the stream on; a -32001 ends it (read by `check_view`).
        let lost = self
            .d
            .stream(stream)
            .and_then(|c| {
                c.frames
                    .iter()
                    .find(|f| f.as_slice() != switchboard_core::sse::KEEPALIVE)
            })
            .is_some_and(|f| without_id(f).len() == f.len());
        let ended_empty = self.d.stream(stream).is_some_and(|c| {
            !c.is_open()
                && c.frames
                    .iter()
                    .all(|f| f.as_slice() == switchboard_core::sse::KEEPALIVE)
        });
        let sess = &mut self.sessions[session];
        match sess.keys.get_mut(&key) {
            // An expired stream resumed at or after its answer: nothing more comes.
            Some(k) if ended_empty && k.held == Held::Expired => {
                self.hit("resume:after-answer");
            }
            Some(k) if !lost => {
                if k.held != Held::Kept {
                    self.fail(format!("stream {key} replayed, but it was gone"));
                    return;
                }
                k.attached = Some(stream);
                k.detached = None;
                if k.kind == KeyKind::Get {
                    sess.get_key = Some(key);
                }
                self.hit("resume:replay");
            }
            Some(k) => {
                k.held = Held::Expired;
                k.attached = None;
                self.hit("resume:lost");
            }
            None => self.fail(format!(
                "stream {key} was never opened, but resuming it is a 200"
            )),
        }
    }

    fn delete(&mut self, slot: usize) {
        let Some(s) = self.live_slot(slot) else {
            return;
        };
        let label = self.sessions[s].label.clone();
        self.say(&format!("mcp-delete {label}"));
        let sid = self.sessions[s].sid.clone();
        let principal = self.sessions[s].principal;
        let request = self.mcp_request(
            Endpoint::McpDelete,
            principal,
            Some(sid),
            (Some(BOTH), None, None),
            "",
            [0xee; 16],
        );
        self.expect_status(request, 204, "DELETE");
        // Its answers to requests in flight are read by `check_view` first.
        self.check_views();
        let sess = &mut self.sessions[s];
        sess.live = false;
        sess.queued = 0;
        sess.get_key = None;
        for k in sess.keys.values_mut() {
            k.held = Held::Forgotten;
            k.attached = None;
        }
        self.slots[slot] = None;
        self.hit("delete");
    }

    fn after_step(&mut self) {
        self.read_backend_input();
        self.check_views();
        self.check_answers();
        self.check_detached();
        self.check_bounds();
        for s in 0..self.sessions.len() {
            let live = self.d.hub().inspect().is_live(&self.sessions[s].id);
            if live != self.sessions[s].live {
                let label = self.sessions[s].label.clone();
                self.fail(format!(
                    "session {label} live: {live}, the model says otherwise"
                ));
            }
        }
    }

    /// New lines on the backend's stdin: which requests were forwarded, and whose lines
    /// wait in a stalled queue.
    fn read_backend_input(&mut self) {
        let input = self.d.backend_input();
        let new: Vec<Vec<u8>> = input[self.input_seen..]
            .iter()
            .map(|(_, line)| line.clone())
            .collect();
        self.input_seen = input.len();
        for line in new {
            let Ok(value) = serde_json::from_slice::<Value>(&line) else {
                self.fail(format!("a backend line is not JSON: {line:?}"));
                continue;
            };
            let method = value["method"].as_str().unwrap_or_default();
            let routed = match method {
                "notifications/cancelled" => value["params"]["requestId"].as_str(),
                _ => value["id"].as_str(),
            };
            let Some(routed) = routed else {
                continue;
            };
            let Some((sid, rest)) = routed.split_once('|') else {
                continue;
            };
            if sid == "switchboard" {
                continue;
            }
            let Some(s) = self.sessions.iter().position(|s| s.sid == sid) else {
                self.fail(format!("a backend line for no session: {value}"));
                continue;
            };
            let req = rest
                .strip_prefix("n:")
                .and_then(|n| n.parse::<u64>().ok())
                .and_then(|id| self.by_id.get(&id).copied());
            let Some(req) = req.filter(|&r| self.reqs[r].session == s) else {
                self.fail(format!(
                    "a backend line names no request of its session: {value}"
                ));
                continue;
            };
            if method == "notifications/cancelled" {
                continue;
            }
            self.reqs[req].forwarded = true;
            if self.stalled {
                self.sessions[s].queued += 1;
            }
        }
    }

    fn check_views(&mut self) {
        let streams: Vec<StreamId> = self.d.streams().map(|(id, _)| id).collect();
        for stream in streams {
            if !self.views.contains_key(&stream) {
                self.fail(format!("{stream:?} was never asked for"));
                continue;
            }
            self.check_view(stream);
        }
    }

    fn check_view(&mut self, stream: StreamId) {
        let client = self.d.stream(stream).expect("listed");
        let frames: Vec<Vec<u8>> = client.frames[self.views[&stream].checked..].to_vec();
        let ended_by_hub = client.ended_by_hub;
        self.views.get_mut(&stream).expect("listed").checked += frames.len();
        for frame in frames {
            self.check_frame(stream, &frame);
        }
        let view = &self.views[&stream];
        if view.answered && !ended_by_hub && self.d.stream(stream).is_some_and(|c| c.is_open()) {
            let name = view.name.clone();
            self.fail(format!("{name} carried its answer and did not end"));
        }
    }

    fn check_frame(&mut self, stream: StreamId, frame: &[u8]) {
        if frame == switchboard_core::sse::KEEPALIVE {
            return;
        }
        let view = &self.views[&stream];
        let (s, name, kind, own_key) = (view.session, view.name.clone(), view.kind, view.key);
        let shown = String::from_utf8_lossy(frame).into_owned();
        if view.answered {
            return self.fail(format!("{name}: a frame after its answer: {shown:?}"));
        }
        let event = without_id(frame);
        if event.len() == frame.len() {
            // No id: only a -32001 for a resumed request stream whose events are gone.
            return self.lost_frame(stream, frame);
        }
        let id = std::str::from_utf8(&frame[4..frame.len() - event.len() - 1]).unwrap_or("?");
        let parsed = id
            .split_once('.')
            .and_then(|(k, p)| Some((k.parse::<u32>().ok()?, p.parse::<u64>().ok()?)));
        let Some((key, position)) = parsed else {
            return self.fail(format!(
                "{name}: an event id this proxy would not send: {shown:?}"
            ));
        };
        if key != own_key {
            return self.fail(format!(
                "{name} (stream {own_key}) carried event {id}: {shown:?}"
            ));
        }
        // Positions follow one another; a resumed request stream from right after its id.
        let view = &self.views[&stream];
        let expected_first = match kind {
            ViewKind::Post => {
                let req = self.req_of(s, key);
                if req.is_some_and(|r| self.reqs[r].priming) {
                    Some(0)
                } else {
                    Some(1)
                }
            }
            ViewKind::Get => Some(1),
            ViewKind::Resume(from) => match self.sessions[s].keys.get(&key).map(|k| k.kind) {
                Some(KeyKind::Request(_)) => Some(from + 1),
                _ => None,
            },
        };
        let ok = match (view.last_pos, kind) {
            (Some(last), _) => position == last + 1,
            (None, ViewKind::Resume(from)) => {
                expected_first.is_none_or(|f| f == position) && position > from
            }
            (None, _) => expected_first == Some(position),
        };
        if !ok {
            let last = view.last_pos;
            return self.fail(format!(
                "{name}: event {id} after {last:?} (first expected {expected_first:?}): a gap"
            ));
        }
        if let (ViewKind::Resume(from), None) = (kind, view.last_pos) {
            if position > from + 1 {
                self.hit("resume:replay-after-eviction");
            }
            self.hit("resume:replayed-events");
        }
        self.views.get_mut(&stream).expect("listed").last_pos = Some(position);
        if let Some(k) = self.sessions[s].keys.get_mut(&key) {
            k.max_seen = Some(k.max_seen.map_or(position, |m| m.max(position)));
        }
        // One id, one event.
        match self.sessions[s].events.get(&(key, position)) {
            Some(before) if before.as_slice() != event => {
                let before = String::from_utf8_lossy(before).into_owned();
                return self.fail(format!(
                    "{name}: event {id} is {shown:?}, but was {before:?} before"
                ));
            }
            Some(_) => self.hit("event:replayed-identical"),
            None => {
                self.sessions[s]
                    .events
                    .insert((key, position), event.to_vec());
            }
        }
        if event == b"data: \n\n" {
            if position != 0 || kind != ViewKind::Post {
                self.fail(format!("{name}: a priming event {id} out of place"));
            }
            self.hit("priming");
            return;
        }
        let Some(message) = message_of(frame) else {
            return self.fail(format!("{name}: not a message event: {shown:?}"));
        };
        self.check_message(stream, (key, position), &message);
    }

    /// The request of stream `key` of session `s`.
    fn req_of(&self, s: usize, key: u32) -> Option<usize> {
        match self.sessions[s].keys.get(&key)?.kind {
            KeyKind::Request(r) => Some(r),
            KeyKind::Get => None,
        }
    }

    fn check_message(&mut self, stream: StreamId, (key, position): (u32, u64), message: &Value) {
        let view = &self.views[&stream];
        let (s, name) = (view.session, view.name.clone());
        let req = self.req_of(s, key);
        if let Some(m) = marker_of(message) {
            let Some(marker) = self.markers.get(m) else {
                return self.fail(format!("{name}: an unknown marker {m}"));
            };
            if marker.session != s {
                let meant = self.sessions[marker.session].label.clone();
                return self.fail(format!(
                    "{name}: a message the backend meant for session {meant}: {message}"
                ));
            }
        }
        let method = message["method"].as_str();
        match method {
            None => {
                // A response: only on its request's stream, under its id, once.
                let Some(r) = req else {
                    return self.fail(format!("{name}: a response on a GET stream: {message}"));
                };
                let id = self.reqs[r].id;
                if message["id"].as_u64() != Some(id) {
                    return self.fail(format!(
                        "{name}: a response under another id than {id}: {message}"
                    ));
                }
                if let Some(m) = marker_of(message) {
                    if self.markers[m].req != Some(r) {
                        return self.fail(format!(
                            "{name}: the response to another request: {message}"
                        ));
                    }
                }
                self.views.get_mut(&stream).expect("listed").answered = true;
                if let Some(k) = self.sessions[s].keys.get_mut(&key) {
                    k.finished = true;
                }
                let req = &mut self.reqs[r];
                match req.answer {
                    Some(first) if first != (key, position) => {
                        let text = format!(
                            "{name}: request {id} answered again as event {key}.{position} (first {}.{})",
                            first.0, first.1
                        );
                        return self.fail(text);
                    }
                    Some(_) => self.hit("response:replayed"),
                    None if req.lost => {
                        return self.fail(format!(
                            "{name}: request {id} answered after its -32001 response lost"
                        ));
                    }
                    None => req.answer = Some((key, position)),
                }
                if message["error"]["code"].as_i64() == Some(-32001) {
                    self.hit("response:timed-out");
                }
            }
            Some("notifications/progress") => {
                if let Some(r) = req {
                    let token = message["params"]["progressToken"].as_str();
                    if token != self.reqs[r].token.as_deref() {
                        self.fail(format!("{name}: progress of another request: {message}"));
                    }
                }
            }
            Some("notifications/tools/list_changed") => {
                if req.is_some() {
                    self.fail(format!("{name}: list_changed on a request stream"));
                }
            }
            Some(other) => self.fail(format!("{name}: an unexpected {other}: {message}")),
        }
    }

    /// A frame without id: a -32001 for a resumed request stream, alone on its stream.
    fn lost_frame(&mut self, stream: StreamId, frame: &[u8]) {
        let view = &self.views[&stream];
        let (s, name, key, kind) = (view.session, view.name.clone(), view.key, view.kind);
        let shown = String::from_utf8_lossy(frame).into_owned();
        let ViewKind::Resume(from) = kind else {
            return self.fail(format!("{name}: an event without id: {shown:?}"));
        };
        if view.last_pos.is_some() {
            return self.fail(format!(
                "{name}: an event without id after a replay: {shown:?}"
            ));
        }
        let Some(r) = self.req_of(s, key) else {
            return self.fail(format!(
                "{name}: stream {key} is no request stream, yet lost: {shown:?}"
            ));
        };
        let message = message_of(frame);
        let id = self.reqs[r].id;
        let ok = message.as_ref().is_some_and(|m| {
            m["id"].as_u64() == Some(id)
                && m["error"]["code"].as_i64() == Some(-32001)
                && m["error"]["message"].as_str() == Some("response lost: resume window exceeded")
        });
        if !ok {
            return self.fail(format!("{name}: not request {id}'s -32001: {shown:?}"));
        }
        let view = self.views.get_mut(&stream).expect("listed");
        view.answered = true;
        view.lost = true;
        // A client that saw the response and resumes after it must not be told it was
        // lost: that would be a second answer.
        if let Some((_, at)) = self.reqs[r].answer {
            if from >= at {
                return self.fail(format!(
                    "{name}: request {id} was answered at {at} and resumed from {from}, but got -32001"
                ));
            }
        }
        self.reqs[r].lost = true;
    }

    fn check_answers(&mut self) {
        for r in 0..self.reqs.len() {
            let req = &self.reqs[r];
            if !req.json || req.json_answered {
                continue;
            }
            let Some(Answer::Response(response)) = self.d.answer(req.post).cloned() else {
                continue;
            };
            self.reqs[r].json_answered = true;
            let id = self.reqs[r].id;
            let message: Option<Value> = serde_json::from_slice(&response.body).ok();
            let ok = response.status == 200
                && message.as_ref().is_some_and(|m| {
                    m["id"].as_u64() == Some(id)
                        && marker_of(m).is_none_or(|k| self.markers[k].req == Some(r))
                });
            if !ok {
                let body = String::from_utf8_lossy(&response.body).into_owned();
                self.fail(format!(
                    "JSON request {id} answered {} {body}",
                    response.status
                ));
            }
        }
    }

    /// Streams whose client went: when (for the window).
    fn check_detached(&mut self) {
        let (start, now) = (self.step_start, self.d.elapsed());
        for s in 0..self.sessions.len() {
            let keys: Vec<u32> = self.sessions[s].keys.keys().copied().collect();
            for key in keys {
                let attached = self.sessions[s].keys[&key].attached;
                let Some(stream) = attached else { continue };
                let open = self.d.stream(stream).is_some_and(|c| c.is_open());
                if !open {
                    let k = self.sessions[s].keys.get_mut(&key).expect("listed");
                    k.attached = None;
                    k.detached = Some((start, now));
                }
            }
        }
    }

    fn check_bounds(&mut self) {
        let hub = self.d.hub();
        let sizes = hub.inspect().table_sizes();
        let live = hub.inspect().live_sessions();
        if sizes.resume_bytes > live * BUFFER || sizes.resume_bytes > RESUME_GLOBAL {
            self.fail(format!(
                "{} bytes kept for resumption, {live} sessions of {BUFFER}",
                sizes.resume_bytes
            ));
        }
        if live == 0 && (sizes.resume_bytes != 0 || sizes.resume_timers != 0) {
            self.fail(format!("no session live, yet {sizes:?}"));
        }
        if sizes.resume_bytes > (live.max(1) - 1) * BUFFER {
            self.hit("bytes:over-one-less-session");
        }
    }
}

/// The JSON message of a `message` event.
fn message_of(frame: &[u8]) -> Option<Value> {
    let data = without_id(frame)
        .strip_prefix(b"event: message\ndata: ")?
        .strip_suffix(b"\n\n")?;
    serde_json::from_slice(data).ok()
}

/// The marker of a backend message: a response's `result.m`, a progress's `progress`.
fn marker_of(message: &Value) -> Option<usize> {
    let m = match message["method"].as_str() {
        Some("notifications/progress") => message["params"]["progress"].as_u64(),
        Some(_) => None,
        None => message["result"]["m"].as_u64(),
    };
    m.map(|m| m as usize)
}
