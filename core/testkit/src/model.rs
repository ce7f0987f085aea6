//! The one reference model: sequences of [`Op`]s (sessions opening and hanging up, POSTs as
//! the owner or an impostor, backend lines, backend exits and restarts, health checks, time
//! passing) run against a [`Hub`](switchboard_core::Hub) in virtual time through the
//! [`Driver`], with SPEC section 6 checked after every step against what a small model
//! says should be live, watched and awaited:
//!
//! 1. a message produced for session A is only ever written to A's stream;
//! 2. every id, `requestId` and progress token a client sends reaches the backend carrying
//!    the client's own session id (or, for the handshake, the proxy's own id);
//! 3. an impostor's POST gets 404 and changes nothing;
//! 4. nothing reaches a stream that has ended, and session ids are never reused;
//! 5. broadcasts are the three bare `list_changed` notifications.
//!
//! Answers, progress and updates for live sessions do arrive, and the same sequence run
//! twice gives the same transcript. The fuzz target `session_ops` decodes [`Op`]s from the
//! fuzzer's bytes ([`decode_ops`]); `core/tests/model.rs` draws them from seeded generators
//! ([`random_ops`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use serde_json::value::RawValue;
use switchboard_core::http::{Endpoint, Response};
use switchboard_core::hub::{Payload, Settings};
use switchboard_core::routed_id::SessionId;
use switchboard_core::supervise::Exit;
use switchboard_core::{Action, Delivery, Event, Frame, Output, Principal, StreamId};

use crate::driver::{Answer, Driver, Record, Seen};
use crate::fuzz::{
    at, backend_line_text, check_backend_actions, echoes, is_id_like, is_proxy_initialize_id,
    json_string, members, one_line_object, routed_rest, strict_string_of, string_of, World,
    LIST_CHANGED, PROXY_ID_PREFIX,
};

/// The sessions slots [`Op`]s address; a slot holds one session at a time.
const SLOTS: usize = 4;
const PRINCIPALS: [&str; 3] = ["alice", "bob", "carol"];
/// Resources the structured ops subscribe to (a `|` and a quote included).
const URIS: [&str; 4] = ["file:///a", "file:///b", "file:///a|\"b\"", "urn:x"];
/// Live sessions the model's hub allows.
const MAX_SESSIONS: usize = 6;

/// One input, as `arbitrary` decodes it from the fuzzer's bytes.
#[derive(Debug, Clone, Arbitrary)]
pub enum Op {
    /// `GET /sse` into an empty slot as `PRINCIPALS[principal % 3]`.
    Open {
        /// Which slot.
        slot: u8,
        /// Which principal.
        principal: u8,
    },
    /// The slot's client hangs up its stream.
    Close {
        /// Which slot.
        slot: u8,
    },
    /// A POST to the slot's session (or its last one), as its owner or someone else.
    Post {
        /// Which slot.
        slot: u8,
        /// Post as another principal.
        impostor: bool,
        /// What.
        body: ClientBody,
    },
    /// `resources/subscribe`.
    Subscribe {
        /// Which slot.
        slot: u8,
        /// Which of the uris.
        uri: u8,
        /// The request id.
        id: Id,
    },
    /// `resources/unsubscribe`.
    Unsubscribe {
        /// Which slot.
        slot: u8,
        /// Which of the uris.
        uri: u8,
        /// The request id.
        id: Id,
    },
    /// A line on the backend's stdout.
    Backend(BackendMsg),
    /// The backend exits with status 1.
    BackendExit,
    /// Time passes until the backend runs again (the restart backoff).
    BackendStart,
    /// `GET /health`.
    Ping,
    /// Virtual time moves on by `seconds` (0 to 255): pings, keep-alives, timeouts.
    Wait {
        /// How long.
        seconds: u8,
    },
}

/// A JSON-RPC id as a client or backend may write it.
#[derive(Debug, Clone, Arbitrary)]
pub enum Id {
    /// A small integer.
    Small(i8),
    /// Any 64-bit integer.
    Int(i64),
    /// An integer of 1 to 60 digits, past what f64 holds.
    Digits(u8),
    /// `-0`.
    NegZero,
    /// A string.
    Str(String),
    /// A string shaped like another slot's routed id.
    Spoof {
        /// Whose.
        slot: u8,
        /// The number inside.
        n: i8,
        /// `|s:` rather than `|n:`.
        string: bool,
    },
    /// A string shaped like the proxy's own ping id.
    ProxyLike(u8),
    /// `1.5` (not an id).
    Fraction,
    /// `null` (not an id).
    Null,
}

/// A method name.
#[derive(Debug, Clone, Arbitrary)]
pub enum Method {
    /// `tools/call`.
    ToolsCall,
    /// `initialize`.
    Initialize,
    /// `ping`.
    Ping,
    /// `resources/subscribe`.
    Subscribe,
    /// `resources/unsubscribe`.
    Unsubscribe,
    /// `notifications/cancelled`.
    Cancelled,
    /// `notifications/initialized`.
    Initialized,
    /// `notifications/progress`.
    Progress,
    /// `notifications/roots/list_changed`.
    RootsListChanged,
    /// Anything.
    Custom(String),
}

/// A POST body.
#[derive(Debug, Clone, Arbitrary)]
pub enum ClientBody {
    /// A request.
    Request {
        /// Its id.
        id: Id,
        /// Its method.
        method: Method,
        /// `params.uri`.
        uri: Option<u8>,
        /// `params.requestId`.
        request_id: Option<Id>,
        /// `params._meta.progressToken`.
        progress: Option<Id>,
    },
    /// A notification.
    Notification {
        /// Its method.
        method: Method,
        /// `params.uri`.
        uri: Option<u8>,
        /// `params.requestId`.
        request_id: Option<Id>,
        /// `params._meta.progressToken`.
        progress: Option<Id>,
    },
    /// Any text.
    Raw(String),
}

/// A backend stdout line.
#[derive(Debug, Clone, Arbitrary)]
pub enum BackendMsg {
    /// A response to a routed id (or token) the hub wrote earlier, picked by index.
    Answer {
        /// Which one.
        pick: u16,
        /// An error rather than a result.
        error: bool,
        /// Every character `\u`-escaped.
        escaped: bool,
    },
    /// `notifications/progress` for a routed id or token written earlier.
    Progress {
        /// Which one.
        pick: u16,
        /// Every character `\u`-escaped.
        escaped: bool,
    },
    /// A response with an id the backend made up (or a slot's spoofed routed id).
    Forged {
        /// The id.
        id: Id,
    },
    /// One of the `list_changed` notifications, maybe with params to strip.
    ListChanged {
        /// Which.
        which: u8,
        /// With params.
        params: bool,
    },
    /// `notifications/resources/updated`.
    Updated {
        /// Which of the uris.
        uri: u8,
    },
    /// A backend request: `ping` or `sampling/createMessage`.
    Request {
        /// Its id.
        id: Id,
        /// `ping` rather than `sampling/createMessage`.
        ping: bool,
    },
    /// An answer to the proxy's ping number `n`.
    Pong {
        /// Which ping.
        n: u8,
    },
    /// Any text.
    Raw(String),
}

/// Decodes the fuzzer's bytes into operations (every byte string decodes to some sequence).
pub fn decode_ops(data: &[u8]) -> Vec<Op> {
    Vec::<Op>::arbitrary_take_rest(Unstructured::new(data)).unwrap_or_default()
}

/// Runs [`decode_ops`]`(data)` through [`check_ops`].
pub fn session_ops(data: &[u8]) {
    check_ops(&decode_ops(data));
}

/// `len` operations from a seeded generator, weighted towards what reaches deep states:
/// sessions open and post well-formed requests often, backend answers pick what was sent,
/// exits are rare. (Uniform `arbitrary` bytes, which the fuzzer mutates from, mostly miss.)
pub fn random_ops(seed: u64, len: usize) -> Vec<Op> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    (0..len).map(|_| rng.op()).collect()
}

/// xorshift64: small, seeded, good enough to pick test cases.
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

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn id(&mut self) -> Id {
        match self.below(20) {
            0..=8 => Id::Small(self.below(6) as i8),
            9..=11 => Id::Str(["a", "a|n:1", "\\u00e9", ""][self.below(4) as usize].to_owned()),
            12 => Id::Int(self.next() as i64),
            13 => Id::Digits(self.byte()),
            14 => Id::NegZero,
            15 => Id::Spoof {
                slot: self.byte(),
                n: self.below(6) as i8,
                string: self.chance(50),
            },
            16 => Id::ProxyLike(self.below(4) as u8),
            17 => Id::Fraction,
            _ => Id::Null,
        }
    }

    fn method(&mut self) -> Method {
        match self.below(20) {
            0..=9 => Method::ToolsCall,
            10..=12 => Method::Initialize,
            13 => Method::Ping,
            14 => Method::Cancelled,
            15 => Method::Initialized,
            16 => Method::Progress,
            17 => Method::RootsListChanged,
            18 => Method::Subscribe,
            _ => Method::Custom("x/y".to_owned()),
        }
    }

    fn body(&mut self) -> ClientBody {
        let uri = self.chance(20).then(|| self.byte());
        let request_id = self.chance(15).then(|| self.id());
        let progress = self.chance(40).then(|| self.id());
        match self.below(20) {
            0..=15 => ClientBody::Request {
                id: self.id(),
                method: self.method(),
                uri,
                request_id,
                progress,
            },
            16..=18 => ClientBody::Notification {
                method: self.method(),
                uri,
                request_id,
                progress,
            },
            _ => ClientBody::Raw(
                [
                    "{",
                    "[]",
                    "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}",
                    "null",
                ][self.below(4) as usize]
                    .to_owned(),
            ),
        }
    }

    fn backend(&mut self) -> BackendMsg {
        match self.below(40) {
            0..=17 => BackendMsg::Answer {
                pick: self.next() as u16,
                error: self.chance(20),
                escaped: self.chance(20),
            },
            18..=23 => BackendMsg::Progress {
                pick: self.next() as u16,
                escaped: self.chance(20),
            },
            24..=27 => BackendMsg::Updated { uri: self.byte() },
            28..=30 => BackendMsg::ListChanged {
                which: self.byte(),
                params: self.chance(50),
            },
            31..=33 => BackendMsg::Forged { id: self.id() },
            34..=35 => BackendMsg::Request {
                id: self.id(),
                ping: self.chance(50),
            },
            36..=37 => BackendMsg::Pong {
                n: self.below(4) as u8,
            },
            _ => BackendMsg::Raw(
                ["not json", "[]", "{}", "{\"jsonrpc\":\"2.0\"}"][self.below(4) as usize]
                    .to_owned(),
            ),
        }
    }

    fn op(&mut self) -> Op {
        let slot = self.below(SLOTS as u64) as u8;
        match self.below(200) {
            0..=29 => Op::Open {
                slot,
                principal: self.byte(),
            },
            30..=39 => Op::Close { slot },
            40..=99 => Op::Post {
                slot,
                impostor: self.chance(8),
                body: self.body(),
            },
            100..=111 => Op::Subscribe {
                slot,
                uri: self.byte(),
                id: self.id(),
            },
            112..=117 => Op::Unsubscribe {
                slot,
                uri: self.byte(),
                id: self.id(),
            },
            118..=183 => Op::Backend(self.backend()),
            184..=186 => Op::BackendExit,
            187..=192 => Op::BackendStart,
            193..=196 => Op::Ping,
            _ => Op::Wait {
                seconds: self.below(40) as u8,
            },
        }
    }
}

/// Runs `ops` against a hub and the model, checking SPEC section 6 after every step, then
/// replays them on a fresh hub and requires the same transcript. Returns one label per
/// step, naming what the step exercised (for coverage counts and corpus tools).
pub fn check_ops(ops: &[Op]) -> Vec<String> {
    let (first, labels) = Model::run(ops);
    let (second, _) = Model::run(ops);
    assert!(
        first == second,
        "replaying the same operations gave a different transcript"
    );
    labels
}

#[derive(Default, Clone, Copy)]
struct Slot {
    current: Option<SessionId>,
    last: Option<SessionId>,
}

#[derive(Debug, Clone)]
struct LiveSession {
    principal: Principal,
    stream: StreamId,
}

/// What the hub should believe, kept by the simplest means.
struct Model {
    driver: Driver,
    backend_up: bool,
    slots: [Slot; SLOTS],
    opened: u32,
    live: BTreeMap<SessionId, LiveSession>,
    ended: BTreeSet<StreamId>,
    subs: BTreeMap<SessionId, BTreeSet<String>>,
    /// Every routed id and token (raw JSON) a client line carried, with its session.
    minted: Vec<(SessionId, String)>,
    init_askers: BTreeSet<(SessionId, String)>,
    /// Raw proxy ids the backend's `initialize` went out under.
    init_ids: Vec<String>,
    /// What the current step produced, for the transcript.
    step_records: Vec<Record>,
}

impl Model {
    fn run(ops: &[Op]) -> (Vec<String>, Vec<String>) {
        let settings = Settings {
            max_sessions: MAX_SESSIONS,
            session_buffer: 1 << 20,
            ..Settings::default()
        };
        let mut driver = Driver::new(settings);
        driver.take_records();
        assert!(driver.backend_pid().is_some(), "the first backend starts");
        let mut model = Model {
            driver,
            backend_up: true,
            slots: [Slot::default(); SLOTS],
            opened: 0,
            live: BTreeMap::new(),
            ended: BTreeSet::new(),
            subs: BTreeMap::new(),
            minted: Vec::new(),
            init_askers: BTreeSet::new(),
            init_ids: Vec::new(),
            step_records: Vec::new(),
        };
        let mut transcript = Vec::with_capacity(ops.len());
        let mut labels = Vec::with_capacity(ops.len());
        for op in ops {
            let label = model.step(op);
            let mut records = std::mem::take(&mut model.step_records);
            records.extend(model.driver.take_records());
            model.check_streams(op);
            transcript.push(format!("{op:?} => {records:?}"));
            labels.push(label);
        }
        (transcript, labels)
    }

    /// After every step: the hub's live sessions are the model's, and no stream of an
    /// ended session received anything after it ended (property 4).
    fn check_streams(&mut self, op: &Op) {
        let hub = self.driver.hub();
        assert_eq!(
            hub.live_sessions(),
            self.live.len(),
            "live sessions disagree with the model after {op:?}"
        );
        for (sid, s) in &self.live {
            assert!(
                hub.router().is_live(sid),
                "{sid} should be live after {op:?}"
            );
            assert_eq!(hub.stream_session(s.stream), Some(*sid), "{sid}'s stream");
        }
    }

    fn slot(&mut self, slot: u8) -> &mut Slot {
        &mut self.slots[usize::from(slot) % SLOTS]
    }

    /// The slot's session, else its last one, else a session never opened.
    fn target(&mut self, slot: u8) -> SessionId {
        let s = *self.slot(slot);
        s.current
            .or(s.last)
            .unwrap_or_else(|| SessionId::from_random([0xee; 16]))
    }

    fn stream_sid(&self, stream: StreamId) -> Option<SessionId> {
        self.live
            .iter()
            .find(|(_, s)| s.stream == stream)
            .map(|(sid, _)| *sid)
    }

    /// The outputs of the last step as router actions: a message frame on a live session's
    /// stream is a Deliver to that session, the frames of one broadcast are one Broadcast
    /// (which must reach every live stream), backend lines are Rewrites (`client`) or
    /// Replies, drops are Drops. A frame for a stream that is not a live session's fails.
    fn actions(&mut self, client: bool) -> (Vec<Action>, Vec<Output>) {
        let records = self.driver_records();
        let mut actions = Vec::new();
        let mut others = Vec::new();
        let mut broadcast: Option<(Arc<[u8]>, BTreeSet<StreamId>)> = None;
        let flush = |broadcast: &mut Option<(Arc<[u8]>, BTreeSet<StreamId>)>,
                     actions: &mut Vec<Action>,
                     live: &BTreeMap<SessionId, LiveSession>| {
            if let Some((frame, reached)) = broadcast.take() {
                let all: BTreeSet<StreamId> = live.values().map(|s| s.stream).collect();
                assert_eq!(
                    reached, all,
                    "a broadcast reached other than every live stream"
                );
                actions.push(Action::Broadcast {
                    message: Arc::from(message_data(&frame)),
                });
            }
        };
        for output in records {
            match output {
                Output::ToStream {
                    stream,
                    frame: Frame::Shared(shared),
                } => {
                    let same = broadcast
                        .as_ref()
                        .is_some_and(|(f, _)| Arc::ptr_eq(f, &shared));
                    if !same {
                        flush(&mut broadcast, &mut actions, &self.live);
                        broadcast = Some((shared.clone(), BTreeSet::new()));
                    }
                    let (_, reached) = broadcast.as_mut().expect("set above");
                    assert!(
                        reached.insert(stream),
                        "a broadcast reached {stream:?} twice"
                    );
                }
                Output::ToStream { stream, frame } => {
                    flush(&mut broadcast, &mut actions, &self.live);
                    let bytes = frame.as_ref();
                    if bytes == switchboard_core::sse::KEEPALIVE
                        || bytes.starts_with(b"event: endpoint\n")
                    {
                        continue;
                    }
                    let session = self.stream_sid(stream).unwrap_or_else(|| {
                        panic!("a frame for {stream:?}, which is no live session's stream")
                    });
                    actions.push(Action::Deliver {
                        session,
                        message: message_data(bytes).to_vec(),
                        // The frame no longer says; the spans are checked by `backend_line`.
                        what: Delivery::Update,
                    });
                }
                Output::ToBackend { line, .. } => {
                    flush(&mut broadcast, &mut actions, &self.live);
                    let is_ping =
                        line.starts_with(b"{\"jsonrpc\":\"2.0\",\"id\":\"switchboard|ping:");
                    actions.push(
                        if client && !is_ping && line != crate::fuzz::INITIALIZED_LINE {
                            Action::Rewrite { line }
                        } else {
                            Action::Reply { line }
                        },
                    );
                }
                Output::Log(Event::Dropped {
                    reason,
                    method,
                    level,
                }) => {
                    flush(&mut broadcast, &mut actions, &self.live);
                    actions.push(Action::Drop {
                        reason,
                        method,
                        level,
                    });
                }
                other => {
                    flush(&mut broadcast, &mut actions, &self.live);
                    others.push(other);
                }
            }
        }
        flush(&mut broadcast, &mut actions, &self.live);
        (actions, others)
    }

    /// The outputs seen since the last step, without taking them from the transcript.
    fn driver_records(&mut self) -> Vec<Output> {
        let records = self.driver.take_records();
        let outputs = records
            .iter()
            .filter_map(|r| match &r.seen {
                Seen::Output(o) => Some(o.clone()),
                Seen::Note(_) => None,
            })
            .collect();
        self.step_records.extend(records);
        outputs
    }

    fn step(&mut self, op: &Op) -> String {
        match op {
            Op::Open { slot, principal } => self.open(*slot, *principal),
            Op::Close { slot } => self.close(*slot),
            Op::Post {
                slot,
                impostor,
                body,
            } => {
                let bytes = self.render_body(body);
                self.post(*slot, *impostor, &bytes)
            }
            Op::Subscribe { slot, uri, id } | Op::Unsubscribe { slot, uri, id } => {
                let method = if matches!(op, Op::Subscribe { .. }) {
                    "resources/subscribe"
                } else {
                    "resources/unsubscribe"
                };
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{},"method":"{method}","params":{{"uri":{}}}}}"#,
                    self.render_id(id),
                    json_string(URIS[usize::from(*uri) % URIS.len()])
                );
                self.post(*slot, false, body.as_bytes())
            }
            Op::Backend(msg) => self.backend(msg),
            Op::BackendExit => self.backend_exit(),
            Op::BackendStart => {
                if self.backend_up {
                    return "start:running".into();
                }
                self.wait(Duration::from_secs(31));
                assert!(
                    self.driver.backend_pid().is_some(),
                    "the backend was restarted"
                );
                self.backend_up = true;
                "start".into()
            }
            Op::Ping => self.health(),
            Op::Wait { seconds } => {
                self.wait(Duration::from_secs(u64::from(*seconds)));
                "wait".into()
            }
        }
    }

    /// Time passes: only pings, keep-alives and (once its backoff passed) a restart may
    /// happen, none of which reaches a session.
    fn wait(&mut self, by: Duration) {
        self.driver.advance(by);
        let (actions, others) = self.actions(false);
        for action in &actions {
            match action {
                Action::Reply { line } => {
                    let text = backend_line_text(line);
                    let m = members(text).expect("a proxy line is one object");
                    let id = m.get("id").and_then(|v| string_of(v)).unwrap_or_default();
                    assert!(id.starts_with(PROXY_ID_PREFIX), "time passing sent {text}");
                }
                Action::Drop { .. } => {}
                other => panic!("time passing produced {other:?}"),
            }
        }
        for output in others {
            assert!(
                matches!(
                    output,
                    Output::SpawnBackend { .. } | Output::Log(_) | Output::Respond { .. }
                ),
                "time passing produced {output:?}"
            );
        }
        if self.driver.backend_pid().is_some() && !self.backend_up {
            self.backend_up = true;
        }
    }

    fn health(&mut self) -> String {
        let request = self.driver.request(
            Endpoint::Health,
            Principal::anonymous(),
            "",
            Payload::Bytes(Vec::new()),
            [0; 16],
        );
        let (actions, _) = self.actions(false);
        if self.backend_up {
            assert!(
                actions.iter().any(|a| matches!(a, Action::Reply { line } if line.starts_with(b"{\"jsonrpc\":\"2.0\",\"id\":\"switchboard|ping:"))),
                "a health check with the backend up pings it: {actions:?}"
            );
        } else {
            let answer = self.driver.answer(request);
            assert!(
                matches!(answer, Some(Answer::Response(Response { status: 503, .. }))),
                "health while the backend is down: {answer:?}"
            );
        }
        "health".into()
    }

    fn backend_exit(&mut self) -> String {
        if !self.backend_up {
            return "exit:down".into();
        }
        self.driver.backend_exit(Exit::Code(1));
        let (actions, others) = self.actions(false);
        assert!(
            actions.iter().all(|a| matches!(a, Action::Drop { .. })),
            "{actions:?}"
        );
        let ended: Vec<StreamId> = others
            .iter()
            .filter_map(|o| match o {
                Output::EndStream { stream } => Some(*stream),
                _ => None,
            })
            .collect();
        let mut by_creation: Vec<(u64, StreamId)> = self
            .live
            .values()
            .map(|s| (s.stream.get(), s.stream))
            .collect();
        by_creation.sort();
        let expected: Vec<StreamId> = by_creation.into_iter().map(|(_, s)| s).collect();
        assert_eq!(
            ended, expected,
            "backend exit ends every live stream, in creation order"
        );
        self.backend_up = false;
        self.ended.extend(ended);
        self.live.clear();
        self.subs.clear();
        self.init_askers.clear();
        self.init_ids.clear();
        for slot in &mut self.slots {
            slot.last = slot.current.take().or(slot.last);
        }
        "exit".into()
    }

    fn open(&mut self, slot: u8, principal: u8) -> String {
        if self.slot(slot).current.is_some() {
            return "open:occupied".into();
        }
        self.opened += 1;
        let mut entropy = [0x5a; 16];
        entropy[..4].copy_from_slice(&self.opened.to_le_bytes());
        let sid = SessionId::from_random(entropy);
        let principal = Principal::new(PRINCIPALS[usize::from(principal) % PRINCIPALS.len()]);
        let request = self.driver.request(
            Endpoint::Stream,
            principal.clone(),
            "",
            Payload::Bytes(Vec::new()),
            entropy,
        );
        let stream = self.driver.stream_of(request);
        if let Some(stream) = stream {
            self.live.insert(
                sid,
                LiveSession {
                    principal: principal.clone(),
                    stream,
                },
            );
        }
        let (actions, _) = self.actions(false);
        let room = self.live.len() - usize::from(stream.is_some()) < MAX_SESSIONS;
        assert_eq!(
            stream.is_some(),
            self.backend_up && room,
            "GET /sse gave {:?} with the backend up = {} and {} live",
            self.driver.answer(request),
            self.backend_up,
            self.live.len() - usize::from(stream.is_some())
        );
        assert!(actions.is_empty(), "opening a session produced {actions:?}");
        let Some(stream) = stream else {
            return "open:refused".into();
        };
        let frames = &self.driver.stream(stream).expect("started").frames;
        assert_eq!(
            frames.first().map(Vec::as_slice),
            Some(format!("event: endpoint\ndata: /messages?session_id={sid}\n\n").as_bytes()),
            "the first event names the session"
        );
        let s = self.slot(slot);
        s.last = s.current.replace(sid).or(s.last);
        "open".into()
    }

    fn close(&mut self, slot: u8) -> String {
        let s = *self.slot(slot);
        let Some(sid) = s.current else {
            return "close:none".into();
        };
        let session = self
            .live
            .remove(&sid)
            .expect("a slot's current session is live");
        let watched = self.subs.remove(&sid).unwrap_or_default();
        self.driver.hang_up(session.stream);
        self.ended.insert(session.stream);
        let (actions, _) = self.actions(false);
        // The proxy unsubscribes exactly the resources no live session watches any more.
        let mut left: BTreeSet<String> = watched
            .into_iter()
            .filter(|uri| !self.subs.values().any(|s| s.contains(uri)))
            .collect();
        let mut lines = 0;
        for action in &actions {
            let Action::Reply { line } = action else {
                panic!("closing a session produced {action:?}");
            };
            lines += 1;
            let r = members(backend_line_text(line)).expect("an unsubscribe is one object");
            assert_eq!(
                r.get("method").and_then(|v| string_of(v)).as_deref(),
                Some("resources/unsubscribe")
            );
            let id = r.get("id").and_then(|v| string_of(v)).unwrap_or_default();
            assert!(
                id.starts_with(PROXY_ID_PREFIX),
                "unsubscribe under id {id:?}"
            );
            let uri = at(&r, &["params", "uri"]).and_then(string_of);
            assert!(
                uri.as_ref().is_some_and(|u| left.remove(u)),
                "unsubscribed {uri:?}, which others still watch or nobody watched"
            );
        }
        assert!(left.is_empty(), "no unsubscribe for {left:?}");
        let s = self.slot(slot);
        s.last = s.current.take();
        format!("close:{lines}")
    }

    fn post(&mut self, slot: u8, impostor: bool, body: &[u8]) -> String {
        let sid = self.target(slot);
        let owner = self.live.get(&sid).map(|s| s.principal.clone());
        let principal = match (&owner, impostor) {
            (Some(owner), true) => {
                let at = PRINCIPALS.iter().position(|p| *p == owner.as_str());
                Principal::new(PRINCIPALS[at.map_or(0, |i| (i + 1) % PRINCIPALS.len())])
            }
            (Some(owner), false) => owner.clone(),
            (None, _) => Principal::new(PRINCIPALS[0]),
        };
        let request = self.driver.request(
            Endpoint::Messages,
            principal,
            sid.as_str(),
            Payload::Bytes(body.to_vec()),
            [0; 16],
        );
        let (actions, _) = self.actions(true);
        let status = match self.driver.answer(request) {
            Some(Answer::Response(r)) => r.status,
            other => panic!("a POST was answered with {other:?}"),
        };
        if owner.is_none() || impostor {
            assert_eq!(status, 404, "a POST to a session that is not the caller's");
        }
        if status != 202 {
            assert!(actions.is_empty(), "a refused POST produced {actions:?}");
            return format!("post:{status}");
        }
        let text = std::str::from_utf8(body).expect("an accepted body is UTF-8");
        let m = members(text).expect("an accepted body is one object");
        let method = m
            .get("method")
            .and_then(|v| string_of(v))
            .unwrap_or_default();
        let id = m.get("id").map(|v| v.get().to_owned());
        let mut rewrites = 0;
        let mut answered = false;
        for action in &actions {
            match action {
                Action::Rewrite { line } => {
                    rewrites += 1;
                    self.check_prefixed(&sid, line);
                }
                Action::Deliver {
                    session, message, ..
                } => {
                    assert_eq!(*session, sid, "a POST was answered into another session");
                    let d = one_line_object(message);
                    assert_eq!(
                        d.get("id").map(|v| v.get()),
                        id.as_deref(),
                        "a proxy answer under another id"
                    );
                    answered = true;
                }
                other => panic!("a POST produced {other:?}"),
            }
        }
        assert!(
            rewrites <= 1 && !(rewrites == 1 && answered),
            "a POST is forwarded once or answered by the proxy: {actions:?}"
        );
        let uri = at(&m, &["params", "uri"]).and_then(strict_string_of);
        match (method.as_str(), &id, uri) {
            ("resources/subscribe", Some(_), Some(uri)) if rewrites == 1 => {
                self.subs.entry(sid).or_default().insert(uri);
            }
            ("resources/unsubscribe", Some(_), Some(uri)) => {
                if let Some(set) = self.subs.get_mut(&sid) {
                    set.remove(&uri);
                }
            }
            ("initialize", Some(id), _) if !answered => {
                self.init_askers.insert((sid, id.clone()));
            }
            _ => {}
        }
        let known = matches!(
            method.as_str(),
            "tools/call"
                | "initialize"
                | "ping"
                | "resources/subscribe"
                | "resources/unsubscribe"
                | "notifications/cancelled"
                | "notifications/initialized"
                | "notifications/progress"
                | "notifications/roots/list_changed"
        );
        let method = if known { method.as_str() } else { "other" };
        let how = if rewrites == 1 {
            "forwarded"
        } else if answered {
            "answered"
        } else {
            "absorbed"
        };
        format!("post:{how}:{method}")
    }

    /// Property 2: every id, cancelled requestId and progress token in a client's line is a
    /// routed id of that client's own session. Records them for later backend answers.
    fn check_prefixed(&mut self, sid: &SessionId, line: &[u8]) {
        let text = backend_line_text(line);
        let r = members(text).expect("a rewritten line is one object");
        let method = r
            .get("method")
            .and_then(|v| string_of(v))
            .unwrap_or_default();
        let mut routed = Vec::new();
        if let Some(id) = r.get("id") {
            routed.push(("id", *id));
        }
        if let Some(token) = at(&r, &["params", "_meta", "progressToken"]) {
            routed.push(("progressToken", token));
        }
        if method == "notifications/cancelled" {
            if let Some(request_id) = at(&r, &["params", "requestId"]) {
                routed.push(("requestId", request_id));
            }
        }
        for (what, value) in routed {
            if !is_id_like(value) && what != "id" {
                continue; // Not an id type: passes unchanged and can never be routed.
            }
            let text = string_of(value).unwrap_or_default();
            if what == "id" && method == "initialize" && is_proxy_initialize_id(&text) {
                self.init_ids.push(value.get().to_owned());
                continue;
            }
            assert!(
                routed_rest(&text, sid).is_some(),
                "{what} {} reached the backend without the sender's sid",
                value.get()
            );
            self.minted.push((*sid, value.get().to_owned()));
        }
    }

    fn backend(&mut self, msg: &BackendMsg) -> String {
        if !self.backend_up {
            return "backend:down".into();
        }
        // The sessions a structured line must reach while live (completeness).
        let mut must_reach: BTreeSet<SessionId> = BTreeSet::new();
        let (line, kind) = match msg {
            BackendMsg::Answer {
                pick,
                error,
                escaped,
            } => {
                let picked = if usize::from(*pick) % 2 == 1 && !self.init_ids.is_empty() {
                    // The proxy's own initialize id: whoever waits for the handshake.
                    let ids = &self.init_ids;
                    Some((None, ids[usize::from(*pick / 2) % ids.len()].clone()))
                } else {
                    self.pick(*pick, *escaped).map(|(sid, id)| (Some(sid), id))
                };
                let Some((sid, id)) = picked else {
                    return "backend:none".into();
                };
                if let Some(sid) = sid.filter(|sid| self.live.contains_key(sid)) {
                    must_reach.insert(sid);
                }
                let member = if *error {
                    r#""error":{"code":-1,"message":"no"}"#
                } else {
                    r#""result":{"content":[]}"#
                };
                (
                    format!(r#"{{"jsonrpc":"2.0","id":{id},{member}}}"#),
                    "answer",
                )
            }
            BackendMsg::Progress { pick, escaped } => {
                let Some((sid, token)) = self.pick(*pick, *escaped) else {
                    return "backend:none".into();
                };
                if self.live.contains_key(&sid) {
                    must_reach.insert(sid);
                }
                (
                    format!(
                        r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{token},"progress":1,"total":2}}}}"#
                    ),
                    "progress",
                )
            }
            BackendMsg::Forged { id } => (
                format!(
                    r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#,
                    self.render_id(id)
                ),
                "forged",
            ),
            BackendMsg::ListChanged { which, params } => {
                let method = LIST_CHANGED[usize::from(*which) % 3];
                let params = if *params {
                    r#","params":{"_meta":{"x":"<script>"},"injected":true}"#
                } else {
                    ""
                };
                (
                    format!(r#"{{"jsonrpc":"2.0","method":"{method}"{params}}}"#),
                    "list_changed",
                )
            }
            BackendMsg::Updated { uri } => {
                let uri = URIS[usize::from(*uri) % URIS.len()];
                must_reach.extend(
                    self.subs
                        .iter()
                        .filter(|(_, s)| s.contains(uri))
                        .map(|(sid, _)| *sid),
                );
                (
                    format!(
                        r#"{{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{{"uri":{}}}}}"#,
                        json_string(uri)
                    ),
                    "updated",
                )
            }
            BackendMsg::Request { id, ping } => {
                let method = if *ping {
                    "ping"
                } else {
                    "sampling/createMessage"
                };
                (
                    format!(
                        r#"{{"jsonrpc":"2.0","id":{},"method":"{method}","params":{{}}}}"#,
                        self.render_id(id)
                    ),
                    "request",
                )
            }
            BackendMsg::Pong { n } => (
                format!(r#"{{"jsonrpc":"2.0","id":"{PROXY_ID_PREFIX}ping:{n}","result":{{}}}}"#),
                "pong",
            ),
            BackendMsg::Raw(text) => (text.clone(), "raw"),
        };
        if line.contains('\n') {
            return "backend:multiline".into();
        }
        self.driver.backend_line(Some(line.as_bytes()));
        let (actions, others) = self.actions(false);
        for output in &others {
            assert!(
                matches!(output, Output::Respond { .. } | Output::Log(_)),
                "a backend line produced {output:?}"
            );
        }
        let init_ids: BTreeSet<String> = self
            .init_ids
            .iter()
            .filter_map(|raw| serde_json::from_str(raw).ok())
            .collect();
        let live: BTreeSet<SessionId> = self.live.keys().copied().collect();
        let world = World {
            live: &live,
            subs: &self.subs,
            init_askers: &self.init_askers,
            init_ids: &init_ids,
        };
        let delivered = check_backend_actions(&world, line.as_bytes(), &actions);
        assert!(
            must_reach.is_subset(&delivered),
            "{line} reached {delivered:?}, not all of {must_reach:?}"
        );
        if kind == "updated" {
            assert_eq!(delivered, must_reach, "{line} reached other sessions");
        }
        let kinds: Vec<&str> = actions
            .iter()
            .map(|a| match a {
                Action::Rewrite { .. } => "rewrite",
                Action::Reply { .. } => "reply",
                Action::Deliver { .. } => "deliver",
                Action::Broadcast { .. } => "broadcast",
                Action::Drop { .. } => "drop",
                Action::Pong { .. } => "pong",
            })
            .collect();
        format!("backend:{kind}:{}", kinds.join("+"))
    }

    /// A routed id or token written earlier, as the backend echoes it, with its session.
    fn pick(&self, pick: u16, escaped: bool) -> Option<(SessionId, String)> {
        if self.minted.is_empty() {
            return None;
        }
        let (sid, raw) = &self.minted[usize::from(pick) % self.minted.len()];
        let raw = RawValue::from_string(raw.clone()).expect("minted ids are JSON");
        let echoed = echoes(&raw);
        let text = if escaped {
            echoed.last()
        } else {
            echoed.first()
        };
        Some((*sid, text.expect("at least the raw form").clone()))
    }

    fn render_id(&mut self, id: &Id) -> String {
        match id {
            Id::Small(n) => n.to_string(),
            Id::Int(n) => n.to_string(),
            Id::Digits(n) => {
                let len = 1 + usize::from(*n % 60);
                let digits: String = "9007199254740993".chars().cycle().take(len).collect();
                if n % 2 == 1 {
                    format!("-{digits}")
                } else {
                    digits
                }
            }
            Id::NegZero => "-0".into(),
            Id::Str(s) => json_string(s),
            Id::Spoof { slot, n, string } => {
                let sid = self.target(*slot);
                let kind = if *string { 's' } else { 'n' };
                json_string(&format!("{sid}|{kind}:{n}"))
            }
            Id::ProxyLike(n) => json_string(&format!("{PROXY_ID_PREFIX}ping:{n}")),
            Id::Fraction => "1.5".into(),
            Id::Null => "null".into(),
        }
    }

    fn render_body(&mut self, body: &ClientBody) -> Vec<u8> {
        let (id, method, uri, request_id, progress) = match body {
            ClientBody::Raw(text) => return text.clone().into_bytes(),
            ClientBody::Request {
                id,
                method,
                uri,
                request_id,
                progress,
            } => (Some(id), method, uri, request_id, progress),
            ClientBody::Notification {
                method,
                uri,
                request_id,
                progress,
            } => (None, method, uri, request_id, progress),
        };
        let method = match method {
            Method::ToolsCall => "tools/call",
            Method::Initialize => "initialize",
            Method::Ping => "ping",
            Method::Subscribe => "resources/subscribe",
            Method::Unsubscribe => "resources/unsubscribe",
            Method::Cancelled => "notifications/cancelled",
            Method::Initialized => "notifications/initialized",
            Method::Progress => "notifications/progress",
            Method::RootsListChanged => "notifications/roots/list_changed",
            Method::Custom(name) => name.as_str(),
        };
        let mut params = Vec::new();
        if let Some(uri) = uri {
            params.push(format!(
                r#""uri":{}"#,
                json_string(URIS[usize::from(*uri) % URIS.len()])
            ));
        }
        if let Some(request_id) = request_id {
            params.push(format!(r#""requestId":{}"#, self.render_id(request_id)));
        }
        if let Some(progress) = progress {
            params.push(format!(
                r#""_meta":{{"progressToken":{}}}"#,
                self.render_id(progress)
            ));
        }
        if method == "initialize" {
            params.push(r#""capabilities":{"sampling":{}}"#.into());
        }
        let mut out = String::from(r#"{"jsonrpc":"2.0","#);
        if let Some(id) = id {
            out.push_str(&format!(r#""id":{},"#, self.render_id(id)));
        }
        out.push_str(&format!(r#""method":{}"#, json_string(method)));
        if !params.is_empty() {
            out.push_str(&format!(r#","params":{{{}}}"#, params.join(",")));
        }
        out.push('}');
        out.into_bytes()
    }
}

/// The data of a `message` event frame.
fn message_data(frame: &[u8]) -> &[u8] {
    frame
        .strip_prefix(b"event: message\ndata: ")
        .and_then(|r| r.strip_suffix(b"\n\n"))
        .unwrap_or_else(|| panic!("not a message event: {}", String::from_utf8_lossy(frame)))
}
