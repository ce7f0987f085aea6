//! The one reference model: sequences of [`Op`]s (legacy sessions opening and hanging up,
//! POSTs as the owner or an impostor; Streamable sessions initialized, POSTed to, cancelled,
//! given GET streams, deleted and hung up on; backend lines, backend exits and restarts,
//! health checks, time passing past the request timeout and the idle time; 2026-07-28
//! requests, their hang-ups and listen streams; tasks created, asked for, listed and
//! reported on, [`TaskOp`]) run against a
//! [`Hub`](switchboard_core::Hub) in virtual time through the [`Driver`], with SPEC sections
//! 6, 7, 13 and 15 checked after every step against what a small model says should be live, open,
//! watched and in flight:
//!
//! 1. a message produced for session A is only ever written to one of A's streams (or
//!    A's JSON answer);
//! 2. every id, `requestId` and progress token a client sends reaches the backend carrying
//!    the client's own session id (or, for the handshake, the proxy's own id);
//! 3. an impostor's request, or one naming a session of the other transport, gets 404 and
//!    changes nothing;
//! 4. nothing reaches a stream that has ended, and session ids are never reused;
//! 5. broadcasts are the three bare `list_changed` notifications, on every legacy and GET
//!    stream;
//! 6. (section 7) a Streamable request gets at most one response, as its JSON body or on
//!    its own stream (which then ends), under the id it was sent with, and never on a GET
//!    stream; progress goes to the newest request in flight carrying the token, else the GET
//!    stream; the status of every `/mcp` request is the predicted one (404, 400, 409 for an
//!    id in flight, 429 past `--max-inflight`, 202, a stream or a JSON body by `Accept` and
//!    progress token); a request past `--request-timeout` gets -32001 and the backend a
//!    `notifications/cancelled` with its routed id; DELETE cancels everything in flight; a
//!    quiet session ends exactly `--session-idle` after its last activity;
//! 7. the streams open at the client and the hub's per-session tables (in flight, progress
//!    tokens, timers, subscriptions) are exactly the model's, so an ended session leaves
//!    nothing behind;
//! 8. (section 13) a 2026-07-28 request with no session, its id and token as a session's
//!    may be, is routed under a key of its own: only its own answer and progress reach its
//!    stream or JSON body, its hang-up cancels it at the backend and reaches nobody, it
//!    times out and ends on a backend exit as a session's request does, and it is no
//!    session; a `subscriptions/listen` stream takes a session's room, gets its
//!    acknowledgement and only notifications under its own subscription id (no response
//!    but its last, no progress), and ends with the sessions on a backend exit;
//! 9. (section 15) no caller learns a task id it does not own: every message that reaches
//!    a session of either transport (its stream, its POST's answer or stream) or a modern
//!    request names only tasks created for that caller (the session, or the modern
//!    request's principal); a `tasks/get`, `tasks/result` or `tasks/cancel` naming a task
//!    the caller does not own now (another's, forgotten, unknown, not a string) is
//!    answered -32602 `Task not found` and never written to the backend, an owned one is
//!    forwarded; a `tasks/list` is forwarded marked, its answer keeps only the caller's
//!    own tasks and never the backend's cursor, and a cursor not minted for the caller is
//!    refused; a status notification reaches only the live 2025 session owning the task;
//!    the task table is the model's own (owners, `ttl`, `--max-tasks-per-owner`, session
//!    ends and backend exits), so it stays bounded.
//!
//! Answers, progress and updates that have somewhere to go do arrive, and the same sequence
//! run twice gives the same transcript. The fuzz target `session_ops` decodes [`Op`]s from
//! the fuzzer's bytes ([`decode_ops`]); `core/tests/model.rs` draws them from seeded
//! generators ([`random_ops`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use serde_json::value::RawValue;
use switchboard_core::http::{Admitted, Endpoint, McpHeaders, Response};
use switchboard_core::hub::{Payload, Settings, TableSizes};
use switchboard_core::routed_id::SessionId;
use switchboard_core::Exit;
use switchboard_core::{DropReason, Event, Frame, Output, Principal, RequestId, StreamId};

use crate::driver::{Answer, Driver, Record, Seen};
use crate::fuzz::{
    at, backend_line_text, check_backend_actions, echoes, is_id_like, is_proxy_initialize_id,
    json_string, members, one_line_object, routed_rest, strict_string_of, string_of, World,
    LIST_CHANGED, PROXY_ID_PREFIX,
};
use crate::routing::{Action, Delivery};

mod modern;
mod tasks;

use modern::{Listening, ModernPending};
pub use tasks::{CursorPick, TaskCaller, TaskOp, TaskPick};

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
    /// `POST /mcp` of an `initialize` without a session, into an empty slot: a new
    /// Streamable session as `PRINCIPALS[principal % 3]`.
    McpInit {
        /// Which slot.
        slot: u8,
        /// Which principal.
        principal: u8,
        /// The request id.
        id: Id,
        /// What the client accepts.
        accept: Accept,
        /// The backend answers the handshake at once (a result): the session opens (it is
        /// 404 to everyone until its initialize has a result).
        answered: bool,
    },
    /// `POST /mcp` naming the slot's session (or its last one), as its owner or not.
    McpPost {
        /// Which slot.
        slot: u8,
        /// Post as another principal.
        impostor: bool,
        /// What the client accepts.
        accept: Accept,
        /// What.
        body: ClientBody,
    },
    /// `GET /mcp`: the slot's standalone stream (replacing the one open).
    McpGet {
        /// Which slot.
        slot: u8,
        /// As another principal.
        impostor: bool,
    },
    /// `DELETE /mcp` for the slot's session.
    McpDelete {
        /// Which slot.
        slot: u8,
        /// As another principal.
        impostor: bool,
    },
    /// The client of one of the slot's Streamable requests in flight hangs up (its stream,
    /// or its wait for a JSON answer, which the hub cannot see).
    HangUp {
        /// Which slot.
        slot: u8,
        /// Which request.
        pick: u8,
    },
    /// Virtual time moves on by `seconds` (0 to 255): pings, keep-alives, timeouts.
    Wait {
        /// How long.
        seconds: u8,
    },
    /// A 2026-07-28 `tools/call` with no session (SPEC section 13), its id and progress
    /// token as a session's may be.
    Modern {
        /// Which principal.
        principal: u8,
        /// The request id.
        id: Id,
        /// What the client accepts.
        accept: Accept,
        /// `params._meta.progressToken`.
        progress: Option<Id>,
    },
    /// The client of one modern request in flight hangs up: its cancel.
    ModernHangUp {
        /// Which request.
        pick: u8,
    },
    /// `subscriptions/listen` for the list changes.
    Listen {
        /// Which principal.
        principal: u8,
        /// The request id: the subscription id.
        id: Id,
    },
    /// The client of one listen stream closes it.
    ListenClose {
        /// Which stream.
        pick: u8,
    },
    /// SPEC section 15: tasks created, asked for, listed and reported on.
    Task(TaskOp),
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
    /// A one-character string written as a `\u` escape: `"\u0061"` (the same id as
    /// `"a"`) or a lone surrogate (`"\ud800"`).
    Escape(u16),
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

/// The `Accept` header of a `POST /mcp`.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Accept {
    /// `application/json, text/event-stream` (what SDK clients send).
    Both,
    /// `application/json` only: the answer is always a JSON body.
    Json,
    /// `text/event-stream` only: the answer is always a stream.
    Sse,
}

impl Accept {
    fn header(self) -> &'static str {
        match self {
            Accept::Both => "application/json, text/event-stream",
            Accept::Json => "application/json",
            Accept::Sse => "text/event-stream",
        }
    }

    fn json(self) -> bool {
        !matches!(self, Accept::Sse)
    }

    fn sse(self) -> bool {
        !matches!(self, Accept::Json)
    }
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

/// `len` operations from a seeded generator (and, in one sequence in three, task operations
/// between them), weighted towards what reaches deep states:
/// sessions open and post well-formed requests often, backend answers pick what was sent,
/// exits are rare. (Uniform `arbitrary` bytes, which the fuzzer mutates from, mostly miss.)
pub fn random_ops(seed: u64, len: usize) -> Vec<Op> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // One sequence in three also creates, asks for, lists and reports on tasks (SPEC
    // section 15) between those operations, a third as many again, so that owners come
    // back for their tasks and cursors while the rest is drawn as often as ever.
    let tasks = seed.is_multiple_of(3);
    let mut ops = Vec::with_capacity(len + len / 2);
    for _ in 0..len {
        ops.push(rng.op());
        if tasks && rng.chance(33) {
            let slot = rng.byte();
            ops.push(Op::Task(rng.task_op(slot)));
        }
    }
    ops
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
            18 => Id::Escape([0x61, 0xd800, 0xdc00, 0x7c][self.below(4) as usize]),
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

    fn accept(&mut self) -> Accept {
        match self.below(4) {
            0 | 1 => Accept::Both,
            2 => Accept::Json,
            _ => Accept::Sse,
        }
    }

    /// A Streamable POST body: mostly requests with small ids (colliding with the legacy
    /// sessions' and with each other, for 409s), often with progress tokens, and
    /// cancellations of small ids (in flight or not).
    fn mcp_body(&mut self) -> ClientBody {
        match self.below(20) {
            0..=12 => ClientBody::Request {
                id: Id::Small(self.below(5) as i8),
                method: if self.chance(85) {
                    Method::ToolsCall
                } else {
                    self.method()
                },
                uri: None,
                request_id: None,
                progress: self.chance(45).then(|| {
                    if self.chance(80) {
                        Id::Small(self.below(4) as i8)
                    } else {
                        self.id()
                    }
                }),
            },
            13..=15 => ClientBody::Notification {
                method: Method::Cancelled,
                uri: None,
                request_id: Some(if self.chance(85) {
                    Id::Small(self.below(5) as i8)
                } else {
                    self.id()
                }),
                progress: None,
            },
            16 => ClientBody::Request {
                id: self.id(),
                method: Method::Subscribe,
                uri: Some(self.byte()),
                request_id: None,
                progress: None,
            },
            _ => self.body(),
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
        // Legacy ops mostly use slots 0 and 1, Streamable ops 2 and 3; sometimes either
        // names the other transport's session (which must get 404).
        let any = self.below(SLOTS as u64) as u8;
        let pair = self.below(2) as u8;
        let (slot, mcp_slot) = if self.chance(75) {
            (pair, pair + 2)
        } else {
            (any, any)
        };
        match self.below(314) {
            0..=29 => Op::Open {
                slot,
                principal: self.byte(),
            },
            30..=39 | 310..=313 => Op::Close { slot },
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
            197..=199 => Op::Wait {
                seconds: self.below(40) as u8,
            },
            200..=224 => Op::McpInit {
                slot: mcp_slot,
                principal: self.byte(),
                id: if self.chance(80) {
                    Id::Small(self.below(3) as i8)
                } else {
                    self.id()
                },
                accept: self.accept(),
                answered: self.chance(90),
            },
            225..=262 | 303..=309 => Op::McpPost {
                slot: mcp_slot,
                impostor: self.chance(5),
                accept: self.accept(),
                body: self.mcp_body(),
            },
            263..=267 => Op::McpGet {
                slot: mcp_slot,
                impostor: self.chance(10),
            },
            268..=270 => Op::McpDelete {
                slot: mcp_slot,
                impostor: self.chance(10),
            },
            271..=276 => Op::HangUp {
                slot: mcp_slot,
                pick: self.byte(),
            },
            285..=294 => Op::Modern {
                principal: self.byte(),
                id: self.id(),
                accept: self.accept(),
                progress: self.chance(40).then(|| self.id()),
            },
            295..=297 => Op::ModernHangUp { pick: self.byte() },
            298..=299 => Op::Listen {
                principal: self.byte(),
                id: self.id(),
            },
            300..=302 => Op::ListenClose { pick: self.byte() },
            _ => Op::Wait {
                seconds: self.below(90) as u8,
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

/// An id or progress token as the model tells them apart: by type and value (a string by
/// its UTF-16 code units, so `"a"` and `"\u0061"` are one and lone surrogates stay apart).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Int(String),
    Str(Vec<u16>),
}

/// The key of raw JSON `raw`, when it is an id type (an integer or a string).
fn key_of(raw: &str) -> Option<Key> {
    let first = *raw.as_bytes().first()?;
    if first == b'"' {
        // A lone surrogate is not Unicode text: admission refuses it (400), so it names
        // no request.
        return utf16_of(raw)
            .filter(|units| String::from_utf16(units).is_ok())
            .map(Key::Str);
    }
    let integer = (first == b'-' || first.is_ascii_digit())
        && !raw.bytes().any(|b| matches!(b, b'.' | b'e' | b'E'));
    integer.then(|| Key::Int(raw.to_owned()))
}

/// Whether the id, progress token or cancelled request id of a body is a string that is not
/// Unicode text (a lone surrogate escape), which admission refuses.
fn has_lone_surrogate(m: &crate::fuzz::Members<'_>) -> bool {
    let values = [
        m.get("id").copied(),
        at(m, &["params", "_meta", "progressToken"]),
        at(m, &["params", "requestId"]),
    ];
    values
        .into_iter()
        .flatten()
        .any(|v| utf16_of(v.get()).is_some_and(|units| String::from_utf16(&units).is_err()))
}

/// The code units of a JSON string literal, escapes decoded (lone surrogates kept).
/// Written apart from the core's own decoder on purpose: the model is the oracle.
pub(crate) fn utf16_of(literal: &str) -> Option<Vec<u16>> {
    let inner = literal.strip_prefix('"')?.strip_suffix('"')?;
    let mut units = Vec::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            units.extend_from_slice(c.encode_utf16(&mut [0; 2]));
            continue;
        }
        units.push(match chars.next()? {
            '"' => 0x22,
            '\\' => 0x5c,
            '/' => 0x2f,
            'b' => 0x08,
            'f' => 0x0c,
            'n' => 0x0a,
            'r' => 0x0d,
            't' => 0x09,
            'u' => u16::from_str_radix(&chars.by_ref().take(4).collect::<String>(), 16).ok()?,
            _ => return None,
        });
    }
    Some(units)
}

/// The session text and request key of a routed id (raw JSON, as the backend echoes it).
fn routed_key(raw: &str) -> Option<(String, Key)> {
    let units = utf16_of(raw)?;
    let bar = units.iter().position(|&u| u == u16::from(b'|'))?;
    let sid = String::from_utf16(&units[..bar]).ok()?;
    let rest = &units[bar + 1..];
    // A list's result is marked for filtering: `|f` (SPEC section 10), `|t` (section 15).
    let rest = match rest.first() {
        Some(&u) if u == u16::from(b'f') || u == u16::from(b't') => &rest[1..],
        _ => rest,
    };
    let (kind, value) = (rest.get(..2)?, &rest[2..]);
    if kind == [u16::from(b'n'), u16::from(b':')] {
        Some((sid, Key::Int(String::from_utf16(value).ok()?)))
    } else if kind == [u16::from(b's'), u16::from(b':')] {
        Some((sid, Key::Str(value.to_vec())))
    } else {
        None
    }
}

/// What a stream carries, as the model knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    /// A legacy session's `/sse` stream.
    Legacy,
    /// A Streamable session's standalone GET stream.
    Get,
    /// The answer stream of the Streamable request with this key.
    Request(Key),
    /// The answer stream of a modern request (its routing key is the stream's "session").
    Modern,
    /// A `subscriptions/listen` stream.
    Listen,
}

/// A Streamable request in flight.
#[derive(Debug, Clone)]
struct Pending {
    request: RequestId,
    /// Its answer stream, or `None` for a JSON answer.
    stream: Option<StreamId>,
    /// The id as the client wrote it.
    raw_id: String,
    token: Option<Key>,
    /// Virtual time it times out at.
    deadline: Option<Duration>,
    /// Admission order within its session (progress for a shared token goes to the newest).
    seq: u64,
    /// The `initialize` that opens its session: only a result opens it (an error removes
    /// it, and its answer carries no session header).
    opens: bool,
}

#[derive(Debug, Clone, Default)]
struct McpState {
    get: Option<StreamId>,
    in_flight: BTreeMap<Key, Pending>,
    /// The last request, answer or stream end (`--session-idle` counts from it).
    last_active: Duration,
    seq: u64,
}

impl McpState {
    fn quiet(&self) -> bool {
        self.get.is_none() && self.in_flight.is_empty()
    }
}

#[derive(Debug, Clone)]
enum Kind {
    Legacy { stream: StreamId },
    Mcp(McpState),
}

#[derive(Debug, Clone)]
struct LiveSession {
    principal: Principal,
    /// Creation order among every session.
    created: u64,
    kind: Kind,
}

impl LiveSession {
    fn mcp(&self) -> Option<&McpState> {
        match &self.kind {
            Kind::Mcp(m) => Some(m),
            Kind::Legacy { .. } => None,
        }
    }

    fn mcp_mut(&mut self) -> Option<&mut McpState> {
        match &mut self.kind {
            Kind::Mcp(m) => Some(m),
            Kind::Legacy { .. } => None,
        }
    }
}

/// Where a message for a client went.
#[derive(Debug, Clone)]
enum Place {
    Stream(StreamId, Role),
    /// The JSON body answering this POST.
    Json(RequestId),
}

/// One message that reached a client.
#[derive(Debug, Clone)]
struct Placed {
    sid: SessionId,
    place: Place,
    message: Vec<u8>,
}

/// A step's outputs, sorted.
#[derive(Debug, Default)]
struct StepOut {
    /// As router actions (frames and JSON answers as Deliver), for the §3 checks.
    actions: Vec<Action>,
    /// Every message that reached a client, and where.
    placed: Vec<Placed>,
    /// Streams the hub ended, in order; each must be explained by the step.
    ends: Vec<StreamId>,
    /// Lines written to the backend, in order.
    lines: Vec<Vec<u8>>,
    /// Everything else.
    others: Vec<Output>,
}

/// A Streamable request answered in a step.
#[derive(Debug)]
struct Answered {
    sid: SessionId,
    raw_id: String,
    message: Vec<u8>,
}

/// The request timeout, session idle time and in-flight limit of the model's hub: small,
/// so that `Wait` reaches them.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
const SESSION_IDLE: Duration = Duration::from_secs(60);
const MAX_INFLIGHT: usize = 3;

/// What the hub should believe, kept by the simplest means.
struct Model {
    driver: Driver,
    backend_up: bool,
    slots: [Slot; SLOTS],
    opened: u32,
    live: BTreeMap<SessionId, LiveSession>,
    /// Every open stream, with its session and role.
    streams: BTreeMap<StreamId, (SessionId, Role)>,
    ended: BTreeSet<StreamId>,
    created: u64,
    subs: BTreeMap<SessionId, BTreeSet<String>>,
    /// Every routed id and token (raw JSON) a client line carried, with its session.
    minted: Vec<(SessionId, String)>,
    init_askers: BTreeSet<(SessionId, String)>,
    /// Raw proxy ids the backend's `initialize` went out under.
    init_ids: Vec<String>,
    /// What the current step produced, for the transcript.
    step_records: Vec<Record>,
    /// Modern requests in flight, by routing key.
    modern: BTreeMap<SessionId, ModernPending>,
    /// Open listen streams.
    listens: BTreeMap<StreamId, Listening>,
    /// The proxy sent the backend `notifications/initialized` since it last started: a
    /// modern request goes straight through.
    ready: bool,
    /// Who owns which task, as the model sees it (SPEC section 15).
    tasks: tasks::Tasks,
}

impl Model {
    fn run(ops: &[Op]) -> (Vec<String>, Vec<String>) {
        let settings = Settings {
            max_sessions: MAX_SESSIONS,
            session_buffer: 1 << 20,
            request_timeout: Some(REQUEST_TIMEOUT),
            session_idle: SESSION_IDLE,
            max_inflight: MAX_INFLIGHT,
            // The model's backend exits end every session (keep-sessions has its scenarios).
            on_backend_exit: switchboard_core::config::OnBackendExit::CloseSessions,
            // Small, so that an owner's oldest task is forgotten (SPEC section 15).
            max_tasks_per_owner: tasks::MAX_TASKS,
            // A hang-up ends the request's wait (resumption has its scenarios).
            resume_window: None,
            // Every event is built (and checked to be JSON by the driver) on every step.
            audit: Some(switchboard_core::Audit {
                include_data: false,
                max_data: 256,
                base_path: std::sync::Arc::from(""),
            }),
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
            streams: BTreeMap::new(),
            ended: BTreeSet::new(),
            created: 0,
            subs: BTreeMap::new(),
            minted: Vec::new(),
            init_askers: BTreeSet::new(),
            init_ids: Vec::new(),
            step_records: Vec::new(),
            modern: BTreeMap::new(),
            listens: BTreeMap::new(),
            ready: false,
            tasks: tasks::Tasks::default(),
        };
        let mut transcript = Vec::with_capacity(ops.len());
        let mut labels = Vec::with_capacity(ops.len());
        for op in ops {
            model.tasks.placed.clear();
            model.tasks.lines.clear();
            let label = model.step(op);
            let mut records = std::mem::take(&mut model.step_records);
            records.extend(model.driver.take_records());
            // SPEC section 15: no caller learned a task it does not own; an ended
            // session's tasks are forgotten.
            model.tasks.check_step(&records);
            model.tasks.sweep(&model.live);
            model.check_streams(op);
            transcript.push(format!("{op:?} => {records:?}"));
            labels.push(label);
        }
        (transcript, labels)
    }

    /// After every step: the hub's live sessions are the model's, the streams open at the
    /// client are exactly the model's, and the hub's per-session tables hold exactly what
    /// the live sessions need (so an ended session leaves nothing behind: SPEC section 7).
    fn check_streams(&mut self, op: &Op) {
        let hub = self.driver.hub();
        assert_eq!(
            hub.inspect().live_sessions(),
            self.live.len(),
            "live sessions disagree with the model after {op:?}"
        );
        for (sid, s) in &self.live {
            assert!(
                hub.inspect().is_live(sid),
                "{sid} should be live after {op:?}"
            );
            if let Kind::Legacy { stream } = s.kind {
                assert_eq!(
                    hub.inspect().stream_session(stream),
                    Some(*sid),
                    "{sid}'s stream"
                );
            }
        }
        let open: BTreeSet<StreamId> = self
            .driver
            .streams()
            .filter(|(_, s)| s.is_open())
            .map(|(id, _)| id)
            .collect();
        let modelled: BTreeSet<StreamId> = self.streams.keys().copied().collect();
        assert_eq!(
            open, modelled,
            "open streams disagree with the model after {op:?}"
        );
        let sessionless = self.sessionless();
        for (stream, (sid, _)) in &self.streams {
            let session = (!sessionless.contains(stream)).then_some(*sid);
            assert_eq!(
                hub.inspect().stream_session(*stream),
                session,
                "{stream:?}'s session (a modern or listen stream is nobody's)"
            );
        }
        let pendings = || {
            self.live
                .values()
                .filter_map(LiveSession::mcp)
                .flat_map(|m| m.in_flight.values())
        };
        let subs: usize = self.subs.values().map(BTreeSet::len).sum();
        let sizes = hub.inspect().table_sizes();
        let expected = TableSizes {
            // Listen streams keep their own table.
            streams: self.streams.len() - self.listens.len(),
            in_flight: pendings().count() + self.modern.len(),
            progress_tokens: pendings().filter(|p| p.token.is_some()).count()
                + self.modern.values().filter(|p| p.token.is_some()).count(),
            request_timers: pendings().filter(|p| p.deadline.is_some()).count() + self.modern.len(),
            idle_timers: sizes.idle_timers,
            subscriptions: (subs, subs),
            // The model runs without resumption: nothing is kept.
            resume_timers: 0,
            resume_bytes: 0,
            principals: (self.live.values())
                .map(|s| &s.principal)
                .chain(self.listens.values().map(|l| &l.principal))
                .collect::<BTreeSet<_>>()
                .len(),
            tasks: self.tasks.sizes(),
        };
        assert_eq!(sizes, expected, "the hub's tables after {op:?}");
        assert!(
            sizes.tasks.0 <= sizes.tasks.1 * tasks::MAX_TASKS,
            "more tasks than their owners may hold: {:?}",
            sizes.tasks
        );
        let mcp_sessions = self.live.values().filter(|s| s.mcp().is_some()).count();
        assert!(
            sizes.idle_timers <= mcp_sessions,
            "{} idle timers for {mcp_sessions} Streamable sessions",
            sizes.idle_timers
        );
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

    /// The streams every broadcast must reach: legacy streams and GET streams.
    fn broadcast_streams(&self) -> BTreeSet<StreamId> {
        self.streams
            .iter()
            .filter(|(_, (_, role))| matches!(role, Role::Legacy | Role::Get))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether `request` of session `sid` is the `initialize` that opens it.
    fn opens(&self, sid: SessionId, request: RequestId) -> bool {
        (self.live.get(&sid).and_then(LiveSession::mcp)).is_some_and(|m| {
            m.in_flight
                .values()
                .any(|p| p.request == request && p.opens)
        })
    }

    /// A session whose `initialize` failed never opened: the hub removed it, uncounted.
    fn never_opened(&mut self, sid: SessionId) {
        self.live.remove(&sid);
        self.init_askers.retain(|(s, _)| *s != sid);
        self.subs.remove(&sid);
        for slot in &mut self.slots {
            if slot.current == Some(sid) {
                slot.last = slot.current.take();
            }
        }
    }

    /// The session and request of the Streamable POST `request` waiting for a JSON answer.
    fn json_waiter(&self, request: RequestId) -> Option<SessionId> {
        self.live.iter().find_map(|(sid, s)| {
            s.mcp()?
                .in_flight
                .values()
                .any(|p| p.request == request && p.stream.is_none())
                .then_some(*sid)
        })
    }

    /// The outputs of the last step, sorted: a message frame on an open stream, or a JSON
    /// answer to a Streamable POST in flight, is a Deliver to the stream's session; the
    /// frames of one broadcast are one Broadcast (which must reach every legacy and GET
    /// stream once); backend lines are Rewrites (`client`) or Replies; drops are Drops. A
    /// frame for a stream the model does not hold open fails (SPEC section 6, 1 and 4).
    fn collect(&mut self, client: bool) -> StepOut {
        let records = self.driver_records();
        let mut out = StepOut::default();
        // A broadcast is one list_changed reaching every legacy stream (one shared frame)
        // and every GET stream (each its own numbered event), consecutively.
        let mut broadcast: Option<(Vec<u8>, BTreeSet<StreamId>)> = None;
        let all = self.broadcast_streams();
        let flush = |broadcast: &mut Option<(Vec<u8>, BTreeSet<StreamId>)>,
                     actions: &mut Vec<Action>| {
            if let Some((data, reached)) = broadcast.take() {
                assert_eq!(
                    reached, all,
                    "a broadcast reached other than every legacy and GET stream"
                );
                actions.push(Action::Broadcast {
                    message: Arc::from(data),
                });
            }
        };
        for output in records {
            let broadcast_frame = match &output {
                Output::ToStream { stream, frame } => {
                    let data = match frame {
                        Frame::Shared(shared) => Some(message_data(shared).to_vec()),
                        _ => None,
                    };
                    let on_get = matches!(self.streams.get(stream), Some((_, Role::Get)));
                    let listed = |d: &[u8]| {
                        LIST_CHANGED.iter().any(|m| {
                            d == format!(r#"{{"jsonrpc":"2.0","method":"{m}"}}"#).as_bytes()
                        })
                    };
                    let is_event = frame.as_ref() != switchboard_core::sse::KEEPALIVE;
                    data.or_else(|| {
                        if !(on_get && is_event) {
                            return None;
                        }
                        let d = message_data(frame.as_ref());
                        listed(d).then(|| d.to_vec())
                    })
                    .map(|d| (*stream, d))
                }
                _ => None,
            };
            if let Some((stream, data)) = broadcast_frame {
                let same = broadcast.as_ref().is_some_and(|(d, _)| *d == data);
                if !same {
                    flush(&mut broadcast, &mut out.actions);
                    broadcast = Some((data, BTreeSet::new()));
                }
                let (_, reached) = broadcast.as_mut().expect("set above");
                assert!(
                    reached.insert(stream),
                    "a broadcast reached {stream:?} twice"
                );
                continue;
            }
            match output {
                Output::ToStream { stream, frame } => {
                    flush(&mut broadcast, &mut out.actions);
                    let bytes = frame.as_ref();
                    if bytes == switchboard_core::sse::KEEPALIVE
                        || bytes.starts_with(b"event: endpoint\n")
                    {
                        continue;
                    }
                    let (session, role) = self.streams.get(&stream).cloned().unwrap_or_else(|| {
                        panic!("a frame for {stream:?}, which is no live session's open stream")
                    });
                    let message = message_data(bytes).to_vec();
                    if matches!(role, Role::Modern | Role::Listen) {
                        out.placed.push(Placed {
                            sid: session,
                            place: Place::Stream(stream, role),
                            message,
                        });
                        continue;
                    }
                    out.actions.push(Action::Deliver {
                        session,
                        message: message.clone(),
                        // The frame no longer says; the spans are checked by `backend_line`.
                        what: Delivery::Update,
                    });
                    out.placed.push(Placed {
                        sid: session,
                        place: Place::Stream(stream, role),
                        message,
                    });
                }
                Output::Respond { request, response } if self.json_waiter(request).is_some() => {
                    flush(&mut broadcast, &mut out.actions);
                    let session = self.json_waiter(request).expect("checked");
                    assert_eq!(response.status, 200, "a JSON answer is a 200");
                    let failed_opening = self.opens(session, request)
                        && one_line_object(&response.body).contains_key("error");
                    let header = response
                        .headers
                        .iter()
                        .find(|(name, _)| *name == "mcp-session-id")
                        .map(|(_, v)| v.to_string());
                    assert_eq!(
                        header.as_deref(),
                        (!failed_opening).then_some(session.as_str()),
                        "the answer's session header (none for a failed initialize)"
                    );
                    let message = response.body.to_vec();
                    out.actions.push(Action::Deliver {
                        session,
                        message: message.clone(),
                        what: Delivery::Update,
                    });
                    out.placed.push(Placed {
                        sid: session,
                        place: Place::Json(request),
                        message,
                    });
                }
                Output::Respond { request, response } if self.modern_waiter(request).is_some() => {
                    flush(&mut broadcast, &mut out.actions);
                    assert_eq!(response.status, 200, "a modern JSON answer is a 200 here");
                    out.placed.push(Placed {
                        sid: self.modern_waiter(request).expect("checked"),
                        place: Place::Json(request),
                        message: response.body.to_vec(),
                    });
                }
                Output::EndStream { stream } => {
                    flush(&mut broadcast, &mut out.actions);
                    out.ends.push(stream);
                }
                Output::ToBackend { line, .. } => {
                    flush(&mut broadcast, &mut out.actions);
                    let is_ping =
                        line.starts_with(b"{\"jsonrpc\":\"2.0\",\"id\":\"switchboard|ping:");
                    let is_cancel = line.starts_with(
                        b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":",
                    ) && line.ends_with(b"}}\n")
                        && !client;
                    out.lines.push(line.clone());
                    if line == crate::fuzz::INITIALIZED_LINE {
                        self.ready = true;
                    }
                    if is_cancel {
                        continue; // The proxy's own cancellation: checked by the step.
                    }
                    out.actions.push(
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
                    flush(&mut broadcast, &mut out.actions);
                    out.actions.push(Action::Drop {
                        reason,
                        method,
                        level,
                    });
                }
                // Audit events may follow any step; the driver checks each is JSON, and the
                // model's properties are about routing.
                Output::Audit(_) => {}
                other => {
                    flush(&mut broadcast, &mut out.actions);
                    out.others.push(other);
                }
            }
        }
        flush(&mut broadcast, &mut out.actions);
        (self.tasks.placed).extend(out.placed.iter().map(|p| (p.sid, p.message.clone())));
        self.tasks.lines.extend(out.lines.iter().cloned());
        out
    }

    /// The old shape of [`Model::collect`]: router actions and the other outputs.
    fn actions(&mut self, client: bool) -> (Vec<Action>, Vec<Output>) {
        let mut out = self.collect(client);
        let answered = self.settle(&mut out);
        assert!(
            answered.is_empty(),
            "Streamable requests answered: {answered:?}"
        );
        assert!(out.ends.is_empty(), "streams ended: {:?}", out.ends);
        (out.actions, out.others)
    }

    /// SPEC section 7 for what reached Streamable sessions: a response only ever on its own
    /// request's stream (which then ends) or as its POST's JSON body, under the id the
    /// client wrote (type and value), at most once; never on a GET stream; only progress
    /// on a request stream besides its response. Takes the answered requests out of the
    /// model and the ends they explain out of `out.ends`.
    fn settle(&mut self, out: &mut StepOut) -> Vec<Answered> {
        let mut answered = Vec::new();
        for p in std::mem::take(&mut out.placed) {
            let modern = matches!(p.place, Place::Stream(_, Role::Modern | Role::Listen))
                || self.modern.contains_key(&p.sid);
            if modern {
                answered.extend(self.settle_modern(&p, out));
                out.placed.push(p);
                continue;
            }
            out.placed.push(p.clone());
            let m = one_line_object(&p.message);
            let is_response = !m.contains_key("method");
            let method = m.get("method").and_then(|v| string_of(v));
            let (stream, key) = match &p.place {
                Place::Stream(_, Role::Legacy) => continue,
                Place::Stream(_, Role::Modern | Role::Listen) => unreachable!("settled above"),
                Place::Stream(stream, Role::Get) => {
                    assert!(!is_response, "a response on {stream:?}, a GET stream");
                    continue;
                }
                Place::Stream(stream, Role::Request(key)) => {
                    if !is_response {
                        assert_eq!(
                            method.as_deref(),
                            Some("notifications/progress"),
                            "a request stream carries its progress and its response only"
                        );
                        continue;
                    }
                    (Some(*stream), key.clone())
                }
                Place::Json(request) => {
                    assert!(is_response, "a JSON answer that is not a response");
                    let key = self.live[&p.sid]
                        .mcp()
                        .and_then(|m| m.in_flight.iter().find(|(_, e)| e.request == *request))
                        .map(|(k, _)| k.clone())
                        .expect("json_waiter found it");
                    (None, key)
                }
            };
            let id = m.get("id").map(|v| v.get().to_owned()).unwrap_or_default();
            assert_eq!(
                key_of(&id).as_ref(),
                Some(&key),
                "a response under id {id} answered the request with {key:?}"
            );
            let pending = self
                .live
                .get_mut(&p.sid)
                .and_then(LiveSession::mcp_mut)
                .and_then(|m| m.in_flight.remove(&key))
                .unwrap_or_else(|| panic!("a second response for {key:?} of {}", p.sid));
            assert_eq!(
                pending.stream, stream,
                "a response on another request's answer"
            );
            if let Some(stream) = stream {
                let at = out
                    .ends
                    .iter()
                    .position(|s| *s == stream)
                    .unwrap_or_else(|| panic!("{stream:?} carried its response and did not end"));
                out.ends.remove(at);
                self.end_stream(stream);
            }
            if pending.opens && m.contains_key("error") {
                self.never_opened(p.sid);
            }
            answered.push(Answered {
                sid: p.sid,
                raw_id: pending.raw_id,
                message: p.message.clone(),
            });
        }
        answered
    }

    /// A stream opened for `sid` in `role`: the model holds it, and knows whose it is.
    fn add_stream(&mut self, stream: StreamId, sid: SessionId, role: Role) {
        let owner = self.stream_owner(stream, sid, &role);
        self.tasks.stream(stream, owner);
        self.streams.insert(stream, (sid, role));
    }

    /// A stream ended: the model forgets it.
    fn end_stream(&mut self, stream: StreamId) {
        assert!(
            self.streams.remove(&stream).is_some(),
            "{stream:?} ended twice"
        );
        self.ended.insert(stream);
    }

    /// Consumes `stream` from the step's ends: the step was expected to end it.
    fn expect_end(&mut self, out: &mut StepOut, stream: StreamId, why: &str) {
        let at = out
            .ends
            .iter()
            .position(|s| *s == stream)
            .unwrap_or_else(|| panic!("{stream:?} should have ended ({why})"));
        out.ends.remove(at);
        self.end_stream(stream);
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
            Op::Backend(BackendMsg::Raw(text)) => {
                self.backend(&BackendMsg::Raw(tasks::harmless(text)))
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
            Op::Wait { seconds } => self.wait(Duration::from_secs(u64::from(*seconds))),
            Op::McpInit {
                slot,
                principal,
                id,
                accept,
                answered,
            } => {
                // The answer to an initialize that opens a session is held back until it
                // is known (a stream only then); the model asks for JSON (scenarios cover the
                // stream).
                let accept = match accept {
                    Accept::Sse => Accept::Both,
                    other => *other,
                };
                let label = self.mcp_init(*slot, *principal, id, accept);
                let pending = label.ends_with(":forwarded") || label.ends_with(":waiting");
                if !(*answered && pending) {
                    return label;
                }
                let result = BackendMsg::Answer {
                    pick: 3,
                    error: false,
                    escaped: false,
                };
                format!("{label}+{}", self.backend(&result))
            }
            Op::McpPost {
                slot,
                impostor,
                accept,
                body,
            } => {
                let bytes = self.render_body(body);
                self.mcp_post(*slot, *impostor, *accept, &bytes)
            }
            Op::McpGet { slot, impostor } => self.mcp_get(*slot, *impostor),
            Op::McpDelete { slot, impostor } => self.mcp_delete(*slot, *impostor),
            Op::HangUp { slot, pick } => self.hang_up(*slot, *pick),
            Op::Modern {
                principal,
                id,
                accept,
                progress,
            } => self.modern(*principal, id, *accept, progress.as_ref()),
            Op::ModernHangUp { pick } => self.modern_hang_up(*pick),
            Op::Listen { principal, id } => self.listen(*principal, id),
            Op::ListenClose { pick } => self.listen_close(*pick),
            Op::Task(op) => self.task(op),
        }
    }

    /// Time passes. Besides pings, keep-alives and (once its backoff passed) a restart,
    /// exactly the Streamable requests past `--request-timeout` time out (-32001 under
    /// their own id, `notifications/cancelled` with their routed id to the backend) and
    /// exactly the quiet Streamable sessions past `--session-idle` end, in time order.
    fn wait(&mut self, by: Duration) -> String {
        let target = self.driver.elapsed() + by;
        // What the model expects, on a copy of the Streamable sessions.
        let mut sim: BTreeMap<SessionId, McpState> = self
            .live
            .iter()
            .filter_map(|(sid, s)| Some((*sid, s.mcp()?.clone())))
            .collect();
        let mut timed_out: Vec<(SessionId, String)> = Vec::new();
        let mut expired: Vec<SessionId> = Vec::new();
        // Timed-out initializes: MCP forbids cancelling one.
        let mut uncancelled: Vec<(SessionId, String)> = Vec::new();
        loop {
            let request = sim
                .iter()
                .flat_map(|(sid, m)| {
                    m.in_flight
                        .iter()
                        .filter_map(move |(k, p)| Some((p.deadline?, *sid, k.clone())))
                })
                .min();
            let idle = sim
                .iter()
                .filter(|(_, m)| m.quiet())
                .map(|(sid, m)| (m.last_active + SESSION_IDLE, *sid))
                .min();
            match (request, idle) {
                (Some((at, sid, key)), idle)
                    if at <= target && idle.is_none_or(|(t, _)| at <= t) =>
                {
                    let m = sim.get_mut(&sid).expect("found above");
                    let p = m.in_flight.remove(&key).expect("found above");
                    m.last_active = at;
                    if p.opens {
                        // It never opened: nothing left to expire.
                        sim.remove(&sid);
                        uncancelled.push((sid, p.raw_id.clone()));
                    }
                    timed_out.push((sid, p.raw_id));
                }
                (_, Some((at, sid))) if at <= target => {
                    sim.remove(&sid);
                    expired.push(sid);
                }
                _ => break,
            }
        }
        let modern_due = self.modern_due(target);
        timed_out.extend(modern_due.iter().cloned());
        self.driver.advance(by);
        let mut out = self.collect(false);
        let answered = self.settle(&mut out);
        let mut got: Vec<(SessionId, String)> = Vec::new();
        for a in &answered {
            let m = one_line_object(&a.message);
            let error = m.get("error").map(|e| e.get()).unwrap_or_default();
            assert_eq!(
                error, r#"{"code":-32001,"message":"request timed out"}"#,
                "a request timed out with another answer"
            );
            got.push((a.sid, a.raw_id.clone()));
        }
        let mut want = timed_out.clone();
        want.sort();
        got.sort();
        assert_eq!(got, want, "the requests that timed out");
        timed_out.retain(|r| !uncancelled.contains(r));
        self.check_cancels(&out.lines, &timed_out, "request timed out");
        for (sid, m) in &sim {
            if let Some(live) = self.live.get_mut(sid).and_then(LiveSession::mcp_mut) {
                live.last_active = m.last_active;
            }
        }
        let mut watched = BTreeSet::new();
        for sid in &expired {
            let s = self.live.remove(sid).expect("a live session expired");
            assert!(
                s.mcp().is_some_and(McpState::quiet),
                "only quiet sessions expire"
            );
            watched.extend(self.subs.remove(sid).unwrap_or_default());
            self.init_askers.retain(|(s, _)| s != sid);
            for slot in &mut self.slots {
                if slot.current == Some(*sid) {
                    slot.last = slot.current.take();
                }
            }
        }
        assert!(out.ends.is_empty(), "time passing ended {:?}", out.ends);
        let mut unsubscribes = Vec::new();
        for action in &out.actions {
            match action {
                Action::Reply { line } => {
                    let text = backend_line_text(line);
                    let m = members(text).expect("a proxy line is one object");
                    let id = m.get("id").and_then(|v| string_of(v)).unwrap_or_default();
                    assert!(id.starts_with(PROXY_ID_PREFIX), "time passing sent {text}");
                    if !id.starts_with("switchboard|ping:") {
                        unsubscribes.push(action.clone());
                    }
                }
                // The timed-out answers, checked above.
                Action::Drop { .. } | Action::Deliver { .. } => {}
                other => panic!("time passing produced {other:?}"),
            }
        }
        self.check_unsubscribes(watched, &unsubscribes);
        for output in out.others {
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
        match (timed_out.is_empty(), expired.is_empty()) {
            (true, true) => "wait".into(),
            (false, true) => "wait:timeout".into(),
            (true, false) => "wait:idle".into(),
            (false, false) => "wait:timeout+idle".into(),
        }
    }

    /// The proxy's `notifications/cancelled` lines among `lines` are exactly one per
    /// `(session, raw id)` of `requests`, each naming the routed id, with `reason`.
    fn check_cancels(&self, lines: &[Vec<u8>], requests: &[(SessionId, String)], reason: &str) {
        let mut left: Vec<(SessionId, String)> = requests.to_vec();
        for line in lines {
            let text = backend_line_text(line);
            let m = members(text).expect("a backend line is one object");
            if m.get("method").and_then(|v| string_of(v)).as_deref()
                != Some("notifications/cancelled")
            {
                continue;
            }
            let id = at(&m, &["params", "requestId"])
                .map(|v| v.get().to_owned())
                .unwrap_or_default();
            assert_eq!(
                at(&m, &["params", "reason"]).and_then(string_of).as_deref(),
                Some(reason),
                "{text}"
            );
            let found = left
                .iter()
                .position(|(sid, raw)| {
                    routed_key(&id)
                        .is_some_and(|r| Some(r) == key_of(raw).map(|k| (sid.to_string(), k)))
                })
                .unwrap_or_else(|| panic!("cancelled {id:?}, which is no request of {requests:?}"));
            left.remove(found);
        }
        assert!(left.is_empty(), "no notifications/cancelled for {left:?}");
    }

    /// The proxy unsubscribes exactly the resources of `watched` no live session watches
    /// any more, under ids of its own; `actions` are the Replies of the step.
    fn check_unsubscribes(&self, watched: BTreeSet<String>, actions: &[Action]) -> usize {
        let mut left: BTreeSet<String> = watched
            .into_iter()
            .filter(|uri| !self.subs.values().any(|s| s.contains(uri)))
            .collect();
        let mut lines = 0;
        for action in actions {
            let Action::Reply { line } = action else {
                panic!("a session's end produced {action:?}");
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
        lines
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

    /// The backend exits: every Streamable request in flight gets -32603 `backend
    /// restarted`, then every stream ends, session by session in creation order.
    fn backend_exit(&mut self) -> String {
        if !self.backend_up {
            return "exit:down".into();
        }
        let pending: usize = self
            .live
            .values()
            .filter_map(LiveSession::mcp)
            .map(|m| m.in_flight.len())
            .sum::<usize>()
            + self.modern.len();
        self.driver.backend_exit(Exit::Code(1));
        let mut out = self.collect(false);
        let answered = self.settle(&mut out);
        assert_eq!(
            answered.len(),
            pending,
            "every request in flight is answered"
        );
        for a in &answered {
            let m = one_line_object(&a.message);
            assert_eq!(
                m.get("error").map(|e| e.get()),
                Some(r#"{"code":-32603,"message":"backend restarted"}"#)
            );
        }
        assert!(
            out.actions
                .iter()
                .all(|a| matches!(a, Action::Drop { .. } | Action::Deliver { .. })),
            "{:?}",
            out.actions
        );
        assert!(self.modern.is_empty(), "every modern request was answered");
        // The model's hub closes sessions on a backend exit: listens end with them.
        assert!(
            self.listens.is_empty(),
            "every listen ended with its last result"
        );
        let order: Vec<u64> = out
            .ends
            .iter()
            .filter(|s| !self.listens.contains_key(s))
            .map(|s| {
                let (sid, _) = &self.streams[s];
                self.live[sid].created
            })
            .collect();
        assert!(
            order.windows(2).all(|w| w[0] <= w[1]),
            "backend exit ends the sessions in creation order"
        );
        let ended: BTreeSet<StreamId> = out.ends.iter().copied().collect();
        let all: BTreeSet<StreamId> = (self.streams.keys())
            .filter(|s| !self.listens.contains_key(s))
            .copied()
            .collect();
        assert_eq!(
            ended, all,
            "backend exit ends every session's stream, no listen"
        );
        assert_eq!(ended.len(), out.ends.len(), "a stream ended twice");
        for stream in std::mem::take(&mut out.ends) {
            self.end_stream(stream);
        }
        self.backend_up = false;
        self.ready = false;
        self.tasks.clear();
        self.live.clear();
        self.subs.clear();
        self.init_askers.clear();
        self.init_ids.clear();
        for slot in &mut self.slots {
            slot.last = slot.current.take().or(slot.last);
        }
        "exit".into()
    }

    fn next_entropy(&mut self) -> [u8; 16] {
        self.opened += 1;
        let mut entropy = [0x5a; 16];
        entropy[..4].copy_from_slice(&self.opened.to_le_bytes());
        entropy
    }

    fn open(&mut self, slot: u8, principal: u8) -> String {
        if self.slot(slot).current.is_some() {
            return "open:occupied".into();
        }
        let entropy = self.next_entropy();
        let sid = SessionId::from_random(entropy);
        let principal = Principal::new(PRINCIPALS[usize::from(principal) % PRINCIPALS.len()]);
        let before = self.live.len();
        let request = self.driver.request(
            Endpoint::Stream,
            principal.clone(),
            "",
            Payload::Bytes(Vec::new()),
            entropy,
        );
        let stream = self.driver.stream_of(request);
        if let Some(stream) = stream {
            self.created += 1;
            self.live.insert(
                sid,
                LiveSession {
                    principal: principal.clone(),
                    created: self.created,
                    kind: Kind::Legacy { stream },
                },
            );
            self.add_stream(stream, sid, Role::Legacy);
        }
        let (actions, _) = self.actions(false);
        let room = before + self.listens.len() < MAX_SESSIONS;
        assert_eq!(
            stream.is_some(),
            self.backend_up && room,
            "GET /sse gave {:?} with the backend up = {} and {before} live",
            self.driver.answer(request),
            self.backend_up,
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

    /// The slot's client hangs up: a legacy session's stream (the session ends), or a
    /// Streamable session's GET stream (the session stays).
    fn close(&mut self, slot: u8) -> String {
        let s = *self.slot(slot);
        let Some(sid) = s.current else {
            return "close:none".into();
        };
        let now = self.driver.elapsed();
        let session = self
            .live
            .get_mut(&sid)
            .expect("a slot's current session is live");
        if let Some(m) = session.mcp_mut() {
            let Some(get) = m.get.take() else {
                return "close:no-get".into();
            };
            m.last_active = now;
            self.driver.hang_up(get);
            self.end_stream(get);
            let (actions, _) = self.actions(false);
            assert!(
                actions.is_empty(),
                "hanging up a GET stream produced {actions:?}"
            );
            return "close:get".into();
        }
        let session = self.live.remove(&sid).expect("checked above");
        let Kind::Legacy { stream } = session.kind else {
            unreachable!("a legacy session")
        };
        let watched = self.subs.remove(&sid).unwrap_or_default();
        self.driver.hang_up(stream);
        self.end_stream(stream);
        let (actions, _) = self.actions(false);
        let lines = self.check_unsubscribes(watched, &actions);
        let s = self.slot(slot);
        s.last = s.current.take();
        format!("close:{lines}")
    }

    /// Sends one `/mcp` request.
    fn mcp_send(
        &mut self,
        endpoint: Endpoint,
        principal: Principal,
        session: Option<SessionId>,
        accept: &str,
        body: &[u8],
        entropy: [u8; 16],
    ) -> RequestId {
        let admitted = Admitted {
            mcp: McpHeaders {
                session: session.map(|s| s.as_str().to_owned()),
                content_type: Some("application/json".into()),
                accept: Some(accept.to_owned().into()),
                protocol_version: None,
                last_event_id: None,
                fields: Vec::new(),
            },
            ..Admitted::new(endpoint, principal, "")
        };
        let request = self
            .driver
            .send(admitted.into_request(Payload::Bytes(body.to_vec()), || entropy));
        if let Some(sid) = session {
            self.tasks.sender(request, tasks::Owner::Session(sid));
        }
        request
    }

    /// Who posts to the slot's session, and whether the hub must refuse with 404: the
    /// session is gone, of the other transport (`mcp` says which one the request uses),
    /// or the poster is an impostor.
    fn poster(&mut self, slot: u8, impostor: bool, mcp: bool) -> (SessionId, Principal, bool) {
        let sid = self.target(slot);
        // A session whose initialize is unanswered has not opened: 404 like an unknown one.
        let session = self
            .live
            .get(&sid)
            .filter(|s| !(s.mcp()).is_some_and(|m| m.in_flight.values().any(|p| p.opens)));
        let owner = session.map(|s| s.principal.clone());
        let same_transport = session.is_some_and(|s| s.mcp().is_some() == mcp);
        let principal = match (&owner, impostor) {
            (Some(owner), true) => {
                let at = PRINCIPALS.iter().position(|p| *p == owner.as_str());
                Principal::new(PRINCIPALS[at.map_or(0, |i| (i + 1) % PRINCIPALS.len())])
            }
            (Some(owner), false) => owner.clone(),
            (None, _) => Principal::new(PRINCIPALS[0]),
        };
        (
            sid,
            principal,
            owner.is_none() || impostor || !same_transport,
        )
    }

    /// `POST /mcp` of an `initialize` without a session: a new Streamable session, unless
    /// the backend is down or `--max-sessions` are live (503), or the body is no request.
    fn mcp_init(&mut self, slot: u8, principal: u8, id: &Id, accept: Accept) -> String {
        if self.slot(slot).current.is_some() {
            return "mcp-init:occupied".into();
        }
        let entropy = self.next_entropy();
        let sid = SessionId::from_random(entropy);
        let principal = Principal::new(PRINCIPALS[usize::from(principal) % PRINCIPALS.len()]);
        let body = self.render_body(&ClientBody::Request {
            id: id.clone(),
            method: Method::Initialize,
            uri: None,
            request_id: None,
            progress: None,
        });
        let raw_id = self.render_id(id);
        let valid = key_of(&raw_id).is_some() && raw_id.len() <= 200;
        let room = self.backend_up && self.live.len() + self.listens.len() < MAX_SESSIONS;
        // Register what the hub is expected to create, before its outputs are read.
        let now = self.driver.elapsed();
        let request = self.mcp_send(
            Endpoint::McpPost,
            principal.clone(),
            None,
            accept.header(),
            &body,
            entropy,
        );
        let answer = self.driver.answer(request).cloned();
        let refused = match &answer {
            Some(Answer::Response(r)) if r.status != 200 => Some(r.status),
            _ => None,
        };
        if let Some(status) = refused {
            if valid {
                assert!(
                    !room && status == 503,
                    "initialize without a session: {status}"
                );
            }
            let (actions, _) = self.actions(true);
            assert!(
                actions.is_empty(),
                "a refused initialize produced {actions:?}"
            );
            return format!("mcp-init:{status}");
        }
        assert!(
            room,
            "a session was created past the limit or with the backend down"
        );
        self.created += 1;
        self.live.insert(
            sid,
            LiveSession {
                principal,
                created: self.created,
                kind: Kind::Mcp(McpState {
                    last_active: now,
                    ..McpState::default()
                }),
            },
        );
        let s = self.slot(slot);
        s.last = s.current.replace(sid).or(s.last);
        let how = self.mcp_accepted((sid, true), request, accept, &body, answer.as_ref());
        format!("mcp-init:{how}")
    }

    /// `POST /mcp` naming a session, checked as SPEC section 7 orders it.
    fn mcp_post(&mut self, slot: u8, impostor: bool, accept: Accept, body: &[u8]) -> String {
        let (sid, principal, not_found) = self.poster(slot, impostor, true);
        let text = std::str::from_utf8(body).ok();
        let m = text.and_then(members);
        let method = m
            .as_ref()
            .and_then(|m| m.get("method"))
            .and_then(|v| strict_string_of(v));
        let raw_id = m
            .as_ref()
            .and_then(|m| m.get("id"))
            .map(|v| v.get().to_owned());
        let key = raw_id.as_deref().and_then(key_of);
        let structured = m.is_some()
            && method.is_some()
            && !m
                .as_ref()
                .is_some_and(|m| m.contains_key("result") || m.contains_key("error"));
        let lone = m.as_ref().is_some_and(has_lone_surrogate);
        let valid = structured
            && !lone
            && raw_id
                .as_ref()
                .is_none_or(|r| key.is_some() && r.len() <= 200);
        let in_flight = self.live.get(&sid).and_then(LiveSession::mcp).map(|m| {
            (
                key.as_ref().is_some_and(|k| m.in_flight.contains_key(k)),
                m.in_flight.len(),
            )
        });
        let predicted = match (not_found, &raw_id, in_flight) {
            (true, _, _) => Some(404),
            (false, Some(_), _) if method.as_deref() == Some("initialize") => Some(400),
            (false, Some(_), Some((true, _))) => Some(409),
            (false, Some(_), Some((false, n))) if n >= MAX_INFLIGHT => Some(429),
            (false, None, _) => Some(202),
            _ => None, // accepted
        };
        let request = self.mcp_send(
            Endpoint::McpPost,
            principal,
            Some(sid),
            accept.header(),
            body,
            [0xee; 16],
        );
        let answer = self.driver.answer(request).cloned();
        let status = match &answer {
            Some(Answer::Response(r)) if r.status != 200 => Some(r.status),
            _ => None,
        };
        if not_found || valid {
            assert_eq!(status, predicted, "POST /mcp {:?}", text);
        } else if lone && structured {
            assert_eq!(status, Some(400), "a lone surrogate was admitted: {text:?}");
        }
        match status {
            Some(202) => {}
            Some(status) => {
                if status == 409 {
                    let Some(Answer::Response(r)) = &answer else {
                        unreachable!()
                    };
                    let e = one_line_object(&r.body);
                    assert_eq!(
                        e.get("id").map(|v| v.get()),
                        raw_id.as_deref(),
                        "409 under the id taken"
                    );
                    assert!(predicted == Some(409), "409 for an id not in flight");
                }
                if status == 429 {
                    assert_eq!(predicted, Some(429), "429 below --max-inflight");
                }
                let out = self.collect(true);
                assert!(
                    out.actions.is_empty() && out.placed.is_empty() && out.ends.is_empty(),
                    "a refused POST changed something: {out:?}"
                );
                return format!("mcp-post:{status}");
            }
            None => {
                let how = self.mcp_accepted((sid, false), request, accept, body, answer.as_ref());
                return format!("mcp-post:{how}");
            }
        }
        // A notification: 202, forwarded or absorbed; a cancellation ends its request.
        let now = self.driver.elapsed();
        let mcp = self
            .live
            .get_mut(&sid)
            .and_then(LiveSession::mcp_mut)
            .expect("accepted");
        mcp.last_active = now;
        let cancels = (method.as_deref() == Some("notifications/cancelled"))
            .then(|| {
                m.as_ref()
                    .and_then(|m| at(m, &["params", "requestId"]))
                    .map(|v| v.get().to_owned())
            })
            .flatten()
            .and_then(|raw| key_of(&raw));
        let cancelled = cancels.and_then(|k| mcp.in_flight.get(&k).cloned().map(|p| (k, p)));
        let mut out = self.collect(true);
        let answered = self.settle(&mut out);
        let label = match cancelled {
            Some((key, p)) => match p.stream {
                Some(stream) => {
                    assert!(answered.is_empty(), "a cancelled stream got {answered:?}");
                    self.live
                        .get_mut(&sid)
                        .and_then(LiveSession::mcp_mut)
                        .expect("live")
                        .in_flight
                        .remove(&key);
                    self.expect_end(&mut out, stream, "its request was cancelled");
                    "cancel:stream"
                }
                None => {
                    assert_eq!(answered.len(), 1, "a cancelled JSON wait is answered");
                    let e = one_line_object(&answered[0].message);
                    assert_eq!(e.get("id").map(|v| v.get()), Some(p.raw_id.as_str()));
                    assert_eq!(
                        e.get("error").map(|v| v.get()),
                        Some(r#"{"code":-32800,"message":"Request cancelled"}"#)
                    );
                    "cancel:json"
                }
            },
            None => {
                assert!(answered.is_empty(), "a notification answered {answered:?}");
                "notification"
            }
        };
        assert!(out.ends.is_empty(), "a notification ended {:?}", out.ends);
        let rewrites = self.check_rewrites(&sid, &out.actions, "a notification");
        assert!(rewrites <= 1, "one line at most for a notification");
        label.into()
    }

    /// A Streamable request the hub accepted (its answer a stream, a JSON body waited for,
    /// or a JSON body at once): registers it in flight, then checks what the step did.
    fn mcp_accepted(
        &mut self,
        (sid, opens): (SessionId, bool),
        request: RequestId,
        accept: Accept,
        body: &[u8],
        answer: Option<&Answer>,
    ) -> String {
        let now = self.driver.elapsed();
        let text = std::str::from_utf8(body).expect("an accepted body is UTF-8");
        let m = members(text).expect("an accepted body is one object");
        let raw_id = m.get("id").map(|v| v.get().to_owned()).expect("a request");
        let key = key_of(&raw_id).expect("an accepted id is an id");
        let method = m
            .get("method")
            .and_then(|v| string_of(v))
            .unwrap_or_default();
        let token = at(&m, &["params", "_meta", "progressToken"]).and_then(|v| key_of(v.get()));
        let stream = match answer {
            Some(Answer::Stream(stream)) => Some(*stream),
            _ => None,
        };
        assert_eq!(
            stream.is_some(),
            accept.sse() && (token.is_some() || !accept.json()),
            "a stream answers exactly a request with a progress token or from a client without JSON"
        );
        let mcp = self
            .live
            .get_mut(&sid)
            .and_then(LiveSession::mcp_mut)
            .expect("a Streamable session");
        mcp.seq += 1;
        mcp.last_active = now;
        mcp.in_flight.insert(
            key.clone(),
            Pending {
                request,
                stream,
                raw_id: raw_id.clone(),
                token,
                deadline: Some(now + REQUEST_TIMEOUT),
                seq: mcp.seq,
                opens,
            },
        );
        if let Some(stream) = stream {
            self.add_stream(stream, sid, Role::Request(key.clone()));
        }
        let mut out = self.collect(true);
        let answered = self.settle(&mut out);
        assert!(out.ends.is_empty(), "a request ended {:?}", out.ends);
        let rewrites = self.check_rewrites(&sid, &out.actions, "a POST");
        for a in &answered {
            assert_eq!(
                (a.sid, a.raw_id.as_str()),
                (sid, raw_id.as_str()),
                "a POST answered another request"
            );
        }
        assert!(
            rewrites + answered.len() <= 1,
            "a request is forwarded once or answered by the proxy: {:?}",
            out.actions
        );
        let uri = at(&m, &["params", "uri"]).and_then(strict_string_of);
        match (method.as_str(), uri) {
            ("resources/subscribe", Some(uri)) if rewrites == 1 => {
                self.subs.entry(sid).or_default().insert(uri);
            }
            ("resources/unsubscribe", Some(uri)) => {
                if let Some(set) = self.subs.get_mut(&sid) {
                    set.remove(&uri);
                }
            }
            ("initialize", _) if answered.is_empty() => {
                self.init_askers.insert((sid, raw_id));
            }
            _ => {}
        }
        let form = if stream.is_some() { "stream" } else { "json" };
        let how = if rewrites == 1 {
            "forwarded"
        } else if answered.is_empty() {
            "waiting"
        } else {
            "answered"
        };
        format!("{form}:{how}")
    }

    /// `GET /mcp`: the session's standalone stream; one open at a time.
    fn mcp_get(&mut self, slot: u8, impostor: bool) -> String {
        let (sid, principal, not_found) = self.poster(slot, impostor, true);
        let request = self.mcp_send(
            Endpoint::McpGet,
            principal,
            Some(sid),
            "text/event-stream",
            b"",
            [0xee; 16],
        );
        let answer = self.driver.answer(request).cloned();
        if not_found {
            assert!(
                matches!(answer, Some(Answer::Response(Response { status: 404, .. }))),
                "GET /mcp of a session not the caller's: {answer:?}"
            );
            let out = self.collect(false);
            assert!(
                out.placed.is_empty() && out.ends.is_empty(),
                "a refused GET: {out:?}"
            );
            return "mcp-get:404".into();
        }
        let Some(Answer::Stream(stream)) = answer else {
            panic!("GET /mcp answered {answer:?}");
        };
        let now = self.driver.elapsed();
        let m = self
            .live
            .get_mut(&sid)
            .and_then(LiveSession::mcp_mut)
            .expect("checked");
        let old = m.get.replace(stream);
        m.last_active = now;
        self.add_stream(stream, sid, Role::Get);
        let mut out = self.collect(false);
        if let Some(old) = old {
            self.expect_end(&mut out, old, "a new GET replaces it");
        }
        assert!(
            out.placed.is_empty() && out.ends.is_empty(),
            "a GET: {out:?}"
        );
        if old.is_some() {
            "mcp-get:replace"
        } else {
            "mcp-get:new"
        }
        .into()
    }

    /// `DELETE /mcp`: the session ends at once; each request in flight is cancelled at the
    /// backend and answered -32603, its streams end, its subscriptions are released.
    fn mcp_delete(&mut self, slot: u8, impostor: bool) -> String {
        let (sid, principal, not_found) = self.poster(slot, impostor, true);
        let request = self.mcp_send(
            Endpoint::McpDelete,
            principal,
            Some(sid),
            "application/json",
            b"",
            [0xee; 16],
        );
        let answer = self.driver.answer(request).cloned();
        let status = match &answer {
            Some(Answer::Response(r)) => r.status,
            other => panic!("DELETE answered {other:?}"),
        };
        if not_found {
            assert_eq!(status, 404, "DELETE of a session not the caller's");
            let out = self.collect(false);
            assert!(
                out.placed.is_empty() && out.ends.is_empty() && out.lines.is_empty(),
                "a refused DELETE: {out:?}"
            );
            return "mcp-delete:404".into();
        }
        assert_eq!(status, 204, "DELETE /mcp");
        let m = self.live[&sid].mcp().expect("checked").clone();
        let requests: Vec<(SessionId, String)> = m
            .in_flight
            .values()
            .map(|p| (sid, p.raw_id.clone()))
            .collect();
        let mut out = self.collect(false);
        let answered = self.settle(&mut out);
        assert_eq!(
            answered.len(),
            requests.len(),
            "every request in flight is answered"
        );
        for a in &answered {
            let e = one_line_object(&a.message);
            assert_eq!(
                e.get("error").map(|v| v.get()),
                Some(r#"{"code":-32603,"message":"session deleted"}"#)
            );
        }
        self.check_cancels(&out.lines, &requests, "session deleted");
        if let Some(get) = m.get {
            self.expect_end(&mut out, get, "its session was deleted");
        }
        assert!(out.ends.is_empty(), "DELETE ended {:?}", out.ends);
        self.live.remove(&sid);
        self.init_askers.retain(|(s, _)| *s != sid);
        let watched = self.subs.remove(&sid).unwrap_or_default();
        let replies: Vec<Action> = out
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Reply { .. }))
            .cloned()
            .collect();
        for action in &out.actions {
            assert!(
                matches!(
                    action,
                    Action::Reply { .. } | Action::Deliver { .. } | Action::Drop { .. }
                ),
                "DELETE produced {action:?}"
            );
        }
        let unsubscribed = self.check_unsubscribes(watched, &replies);
        let s = self.slot(slot);
        s.last = s.current.take();
        format!(
            "mcp-delete:{}:{unsubscribed}",
            if requests.is_empty() {
                "idle"
            } else {
                "in-flight"
            }
        )
    }

    /// The client of a Streamable request hangs up: on a stream the hub stops waiting (the
    /// backend is not told: a disconnect is no cancellation); on a JSON wait the hub cannot
    /// tell, and its answer will go to a closed exchange.
    fn hang_up(&mut self, slot: u8, pick: u8) -> String {
        let sid = self.target(slot);
        let now = self.driver.elapsed();
        let Some(m) = self.live.get_mut(&sid).and_then(LiveSession::mcp_mut) else {
            return "hangup:none".into();
        };
        if m.in_flight.is_empty() {
            return "hangup:none".into();
        }
        let key = m
            .in_flight
            .keys()
            .nth(usize::from(pick) % m.in_flight.len())
            .cloned()
            .expect("not empty");
        let Some(stream) = m.in_flight[&key].stream else {
            return "hangup:json".into();
        };
        m.in_flight.remove(&key);
        m.last_active = now;
        self.driver.hang_up(stream);
        self.end_stream(stream);
        let out = self.collect(false);
        assert!(
            out.placed.is_empty() && out.ends.is_empty() && out.lines.is_empty(),
            "a hang-up on a request stream: {out:?}"
        );
        "hangup:stream".into()
    }

    fn post(&mut self, slot: u8, impostor: bool, body: &[u8]) -> String {
        let (sid, principal, not_found) = self.poster(slot, impostor, false);
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
        if not_found {
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
                // SPEC section 15: what the proxy answers or drops itself is counted.
                Action::Drop {
                    reason:
                        DropReason::UnknownMethod
                        | DropReason::ForeignTask
                        | DropReason::LogLevel
                        | DropReason::ClientNotification,
                    ..
                } => {}
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
    /// The lines a Streamable POST's router actions forward (each checked to carry `sid`);
    /// any action but a rewrite, a delivery or a drop is a failure of `what`.
    fn check_rewrites(&mut self, sid: &SessionId, actions: &[Action], what: &str) -> usize {
        let mut rewrites = 0;
        for action in actions {
            match action {
                Action::Rewrite { line } => {
                    rewrites += 1;
                    self.check_prefixed(sid, line);
                }
                Action::Deliver { .. } | Action::Drop { .. } => {}
                other => panic!("{what} produced {other:?}"),
            }
        }
        rewrites
    }

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
            if what == "id" && method == "tasks/list" {
                self.tasks.lists.push((*sid, value.get().to_owned()));
            }
            self.minted.push((*sid, value.get().to_owned()));
        }
    }

    fn backend(&mut self, msg: &BackendMsg) -> String {
        if !self.backend_up {
            return "backend:down".into();
        }
        // The sessions a structured line must reach while live (completeness), and those
        // it must not (a Streamable session whose request is no longer in flight).
        let mut must_reach: BTreeSet<SessionId> = BTreeSet::new();
        let mut must_not: BTreeSet<SessionId> = BTreeSet::new();
        // Where a progress notification for a Streamable session must go (None: dropped),
        // and the request whose clock it restarts.
        let mut progress_to: Option<(SessionId, Option<StreamId>, Option<Key>)> = None;
        // The modern request the line answers (it must be answered), or whose progress it
        // carries (its stream gets it when it has one).
        let mut modern_due: Option<SessionId> = None;
        let mut modern_progress: Option<(SessionId, Option<StreamId>)> = None;
        let now = self.driver.elapsed();
        let (line, kind) = match msg {
            BackendMsg::Answer {
                pick,
                error,
                escaped,
            } => {
                let scripted = self.tasks.scripted.take();
                let picked = if let Some((key, id, _)) = &scripted {
                    Some((Some(*key), id.clone()))
                } else if usize::from(*pick) % 2 == 1 && !self.init_ids.is_empty() {
                    // The proxy's own initialize id: whoever waits for the handshake (mostly
                    // the newest, so that Streamable sessions open: until then they are 404).
                    let (ids, at) = (&self.init_ids, usize::from(*pick / 2));
                    let at = if at % 4 == 0 {
                        at / 4 % ids.len()
                    } else {
                        ids.len() - 1
                    };
                    Some((None, ids[at].clone()))
                } else {
                    self.pick(*pick, *escaped).map(|(sid, id)| (Some(sid), id))
                };
                let Some((sid, id)) = picked else {
                    return "backend:none".into();
                };
                modern_due = sid.filter(|sid| self.modern_named(sid, &id).is_some());
                if let Some(sid) = sid.filter(|sid| self.live.contains_key(sid)) {
                    match self.live[&sid].mcp() {
                        None => {
                            must_reach.insert(sid);
                        }
                        Some(m) => {
                            let key = routed_key(&id).map(|(_, k)| k);
                            if key.is_some_and(|k| m.in_flight.contains_key(&k)) {
                                must_reach.insert(sid);
                            } else {
                                must_not.insert(sid);
                            }
                        }
                    }
                }
                let member = match scripted {
                    Some((_, _, member)) => member,
                    None if *error => r#""error":{"code":-1,"message":"no"}"#.to_owned(),
                    None => r#""result":{"content":[]}"#.to_owned(),
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
                modern_progress = (self.modern.get(&sid))
                    .filter(|p| p.token.is_some() && p.token == routed_key(&token).map(|k| k.1))
                    .map(|p| (sid, p.stream));
                match self.live.get(&sid).map(|s| s.mcp()) {
                    None => {}
                    Some(None) => {
                        must_reach.insert(sid);
                    }
                    Some(Some(m)) => {
                        // The newest request in flight that carries the token, else the
                        // GET stream.
                        let key = routed_key(&token).map(|(_, k)| k);
                        let carrier = m
                            .in_flight
                            .iter()
                            .filter(|(_, p)| p.token.is_some() && p.token == key)
                            .max_by_key(|(_, p)| p.seq)
                            .map(|(k, p)| (k.clone(), p.stream));
                        let place = carrier.as_ref().and_then(|(_, s)| *s).or(m.get);
                        if place.is_some() {
                            must_reach.insert(sid);
                        } else {
                            must_not.insert(sid);
                        }
                        progress_to = Some((sid, place, carrier.map(|(k, _)| k)));
                    }
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
                // Legacy subscribers, and Streamable ones with a GET stream open.
                let live = &self.live;
                must_reach.extend(
                    self.subs
                        .iter()
                        .filter(|(_, s)| s.contains(uri))
                        .map(|(sid, _)| *sid)
                        .filter(|sid| {
                            live.get(sid)
                                .is_some_and(|s| s.mcp().is_none_or(|m| m.get.is_some()))
                        }),
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
        let mut out = self.collect(false);
        for output in &out.others {
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
        let tasks = self.tasks.of_sessions(now);
        let world = World {
            live: &live,
            subs: &self.subs,
            init_askers: &self.init_askers,
            init_ids: &init_ids,
            tasks: &tasks,
        };
        let delivered = check_backend_actions(&world, line.as_bytes(), &out.actions);
        assert!(
            must_reach.is_subset(&delivered),
            "{line} reached {delivered:?}, not all of {must_reach:?}"
        );
        assert!(
            must_not.is_disjoint(&delivered),
            "{line} reached {delivered:?}, which has nowhere to go in {must_not:?}"
        );
        if kind == "updated" {
            assert_eq!(delivered, must_reach, "{line} reached other sessions");
        }
        let progressed = progress_to
            .as_ref()
            .is_some_and(|(_, place, _)| place.is_some());
        if let Some((sid, place, carrier)) = progress_to {
            let places: Vec<Option<StreamId>> = out
                .placed
                .iter()
                .filter(|p| p.sid == sid)
                .map(|p| match p.place {
                    Place::Stream(stream, _) => Some(stream),
                    Place::Json(_) => None,
                })
                .collect();
            let expected: Vec<Option<StreamId>> = place.map(Some).into_iter().collect();
            assert_eq!(
                places, expected,
                "{line}: progress goes to the newest request carrying the token, else the GET stream"
            );
            if let Some(key) = carrier {
                let m = self
                    .live
                    .get_mut(&sid)
                    .and_then(LiveSession::mcp_mut)
                    .expect("live");
                let p = m.in_flight.get_mut(&key).expect("in flight");
                p.deadline = Some(now + REQUEST_TIMEOUT);
            }
        }
        let modern_places: Vec<(SessionId, Option<StreamId>)> = (out.placed.iter())
            .filter(|p| !matches!(p.place, Place::Stream(_, Role::Listen)))
            .filter(|p| self.modern.contains_key(&p.sid))
            .map(|p| match p.place {
                Place::Stream(stream, _) => (p.sid, Some(stream)),
                Place::Json(_) => (p.sid, None),
            })
            .collect();
        let answered = self.settle(&mut out);
        assert!(out.ends.is_empty(), "{line} ended {:?}", out.ends);
        let modern = self.check_modern_line(
            &line,
            (modern_due, modern_progress),
            &modern_places,
            &answered,
        );
        for a in &answered {
            if let Some(m) = self.live.get_mut(&a.sid).and_then(LiveSession::mcp_mut) {
                m.last_active = now;
            }
        }
        let mcp_answers = answered.len();
        let kinds: Vec<&str> = out
            .actions
            .iter()
            .map(|a| match a {
                Action::Rewrite { .. } => "rewrite",
                Action::Reply { .. } => "reply",
                Action::Deliver { .. } => "deliver",
                Action::Broadcast { .. } => "broadcast",
                Action::Drop { .. } => "drop",
                Action::Pong => "pong",
            })
            .collect();
        let mcp = if mcp_answers > 0 {
            ":mcp-answer"
        } else if progressed {
            ":mcp-progress"
        } else if !must_not.is_empty() {
            ":mcp-dropped"
        } else {
            ""
        };
        format!("backend:{kind}:{}{mcp}{modern}", kinds.join("+"))
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
            Id::Str(s) => json_string(&tasks::harmless(s)),
            Id::Spoof { slot, n, string } => {
                let sid = self.target(*slot);
                let kind = if *string { 's' } else { 'n' };
                json_string(&format!("{sid}|{kind}:{n}"))
            }
            Id::ProxyLike(n) => json_string(&format!("{PROXY_ID_PREFIX}ping:{n}")),
            Id::Escape(unit) => format!("\"\\u{unit:04x}\""),
            Id::Fraction => "1.5".into(),
            Id::Null => "null".into(),
        }
    }

    fn render_body(&mut self, body: &ClientBody) -> Vec<u8> {
        let (id, method, uri, request_id, progress) = match body {
            ClientBody::Raw(text) => return tasks::harmless(text).into_bytes(),
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
            Method::Custom(name) => &tasks::harmless(name),
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
    crate::driver::without_id(frame)
        .strip_prefix(b"event: message\ndata: ")
        .and_then(|r| r.strip_suffix(b"\n\n"))
        .unwrap_or_else(|| panic!("not a message event: {}", String::from_utf8_lossy(frame)))
}
