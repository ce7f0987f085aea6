//! The reference model's tasks part (SPEC section 15 with section 6): the scripted backend
//! answers a session's or a modern request's call with a `CreateTaskResult`, pages of
//! `tasks/list` holding everybody's task ids (a task id for a cursor), and status
//! notifications for any task; callers of both transports and modern requests ask for
//! tasks of their own, of others, forgotten and unknown, and list them with and without
//! cursors (their own, others', the backend's). The model keeps its own table of who owns
//! what (the creator, until its session ends, the `ttl` runs out or the backend exits) and
//! checks after every step that no caller learns a task id it did not create.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use arbitrary::Arbitrary;
use switchboard_core::routed_id::SessionId;
use switchboard_core::{Output, Principal, RequestId, StreamId};

use super::{Accept, BackendMsg, Model, Rng, Role, PRINCIPALS};
use crate::driver::{Record, Seen};
use crate::fuzz::{at, backend_line_text, json_string, members, one_line_object, string_of};

/// `--max-tasks-per-owner` of the model's hub: small, so the oldest is forgotten.
pub(super) const MAX_TASKS: usize = 3;
/// Cursors the hub keeps per owner.
const MAX_CURSORS: usize = 64;
/// A task id longer than this is delivered but nobody's.
const MAX_TASK_ID: usize = 256;
/// What every task id starts with; no string the fuzzer writes may hold it.
const TASK_MARK: &str = "tk~";
/// Task ids the backend never created.
const UNKNOWN: [&str; 2] = ["tk~u0~", "tk~u1~"];
/// A cursor the hub never mints (its counter starts at 1).
const NEVER_MINTED: &str = "switchboard-tasks-0";

/// One task operation.
#[derive(Debug, Clone, Arbitrary)]
pub enum TaskOp {
    /// The backend answers a routed id written earlier (picked as `BackendMsg::Answer`
    /// picks) with a `CreateTaskResult` for a new task.
    Create {
        /// Which routed id.
        pick: u16,
        /// `ttl`: null, missing, or one of a few durations.
        ttl: u8,
        /// A task id over 256 bytes (nobody's).
        long: bool,
    },
    /// `tasks/get`, `tasks/result` or `tasks/cancel` naming a task.
    Ask {
        /// Who asks.
        caller: TaskCaller,
        /// Which of the three.
        method: u8,
        /// Which task.
        task: TaskPick,
    },
    /// `tasks/list`, with a cursor or none.
    List {
        /// Who asks.
        caller: TaskCaller,
        /// Its cursor.
        cursor: Option<CursorPick>,
    },
    /// The backend answers a `tasks/list` written earlier with a page of everybody's tasks.
    Page {
        /// Which `tasks/list`.
        pick: u16,
        /// The tasks listed (a pick among every task id; 255: a non-string id).
        entries: [u8; 4],
        /// How many of them.
        count: u8,
        /// Its `nextCursor`: none, a number, an opaque string, a task id.
        next: u8,
        /// A result that cannot be filtered (`tasks` not an array), or an error.
        shape: u8,
    },
    /// `notifications/tasks/status` for a task (255: a non-string id).
    Status {
        /// Which task.
        task: u8,
    },
}

/// Who sends a task request.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum TaskCaller {
    /// The slot's session (either transport), or its last one.
    Slot {
        /// Which slot.
        slot: u8,
        /// What a Streamable client accepts.
        accept: Accept,
    },
    /// A 2026-07-28 request of a principal.
    Modern {
        /// Which principal.
        principal: u8,
        /// What it accepts.
        accept: Accept,
    },
    /// Whoever owns some task now (a session, or a principal's modern request), else
    /// the first slot's session.
    Owner {
        /// Which owner.
        pick: u8,
        /// What it accepts.
        accept: Accept,
    },
}

/// A task id as a caller names it.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum TaskPick {
    /// One it owns (as the model says).
    Own(u8),
    /// One another owns.
    Foreign(u8),
    /// One the backend created that nobody owns any more (or ever did).
    Forgotten(u8),
    /// One the backend never created.
    Unknown(u8),
    /// A number.
    NotString,
}

/// A `tasks/list` cursor.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum CursorPick {
    /// `null`.
    Null,
    /// One minted for the caller.
    Mine(u8),
    /// One minted for another owner.
    Others(u8),
    /// A cursor of the backend's (a task id).
    Backend(u8),
}

/// Who a task belongs to, and who a message reaches: a 2025 session, or the principal of
/// 2026-07-28 requests.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Owner {
    Session(SessionId),
    Principal(String),
}

/// A task the hub should hold.
#[derive(Debug, Clone)]
struct Held {
    owner: Owner,
    seq: u64,
    expires: Option<Duration>,
}

/// The model's own view of the hub's task table, and what it needs to check SPEC 15.
#[derive(Debug, Default)]
pub(super) struct Tasks {
    /// Every task id the backend created, by number, with the caller it was created for
    /// (`None`: nobody waited for the answer).
    made: Vec<(String, Option<Owner>)>,
    held: BTreeMap<String, Held>,
    seq: u64,
    /// Cursors minted per owner, oldest first: (the cursor, when the caller was given
    /// it; the backend's).
    cursors: BTreeMap<Owner, VecDeque<(Option<String>, String)>>,
    /// Routed ids of the `tasks/list` requests written to the backend, with their key.
    pub(super) lists: Vec<(SessionId, String)>,
    /// Who each stream and POST answer reaches (`None`: no owner of tasks).
    streams: BTreeMap<StreamId, Option<Owner>>,
    senders: BTreeMap<RequestId, Owner>,
    /// What reached callers, and the lines the backend got, in the current step (cleared
    /// before each).
    pub(super) placed: Vec<(SessionId, Vec<u8>)>,
    pub(super) lines: Vec<Vec<u8>>,
    /// The answer the next `BackendMsg::Answer` gives instead: (key, routed id, its
    /// `result` or `error` member).
    pub(super) scripted: Option<(SessionId, String, String)>,
    /// Task requests sent (their ids cycle through a few small ones).
    next_id: u64,
}

/// The short form of task number `n`: every message holding task `n` holds this.
fn short(n: usize) -> String {
    format!("{TASK_MARK}{n:03}~")
}

/// A string the fuzzer chose, unable to name a task.
pub(super) fn harmless(text: &str) -> String {
    text.replace(TASK_MARK, "tk-")
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

impl Tasks {
    /// Who owns `id` now, forgetting it when its `ttl` ran out (as the hub does whenever
    /// it looks a task up).
    fn lookup(&mut self, now: Duration, id: &str) -> Option<Owner> {
        let held = self.held.get(id)?;
        if held.expires.is_some_and(|at| at <= now) {
            self.held.remove(id);
            return None;
        }
        Some(held.owner.clone())
    }

    /// [`Tasks::lookup`] without forgetting.
    fn peek(&self, now: Duration, id: &str) -> Option<&Owner> {
        let held = self.held.get(id)?;
        held.expires
            .is_none_or(|at| at > now)
            .then_some(&held.owner)
    }

    fn created(&mut self, now: Duration, owner: Owner, id: String, ttl_ms: Option<u64>) {
        if id.len() > MAX_TASK_ID || self.held.contains_key(&id) {
            return;
        }
        self.seq += 1;
        let mine: Vec<(u64, String)> = (self.held.iter())
            .filter(|(_, h)| h.owner == owner)
            .map(|(id, h)| (h.seq, id.clone()))
            .collect();
        if mine.len() >= MAX_TASKS {
            let (_, oldest) = mine.into_iter().min().expect("not empty");
            self.held.remove(&oldest);
        }
        let expires = ttl_ms.map(|ms| now + Duration::from_millis(ms));
        let seq = self.seq;
        self.held.insert(
            id,
            Held {
                owner,
                seq,
                expires,
            },
        );
    }

    fn mint(&mut self, owner: &Owner, backend: String) {
        let cursors = self.cursors.entry(owner.clone()).or_default();
        if cursors.len() >= MAX_CURSORS {
            cursors.pop_front();
        }
        cursors.push_back((None, backend));
    }

    /// The backend exited: its tasks went with it.
    pub(super) fn clear(&mut self) {
        self.held.clear();
        self.cursors.clear();
    }

    /// Sessions that ended leave nothing behind.
    pub(super) fn sweep(&mut self, live: &BTreeMap<SessionId, super::LiveSession>) {
        let gone = |owner: &Owner| matches!(owner, Owner::Session(sid) if !live.contains_key(sid));
        self.held.retain(|_, h| !gone(&h.owner));
        self.cursors.retain(|owner, _| !gone(owner));
    }

    /// The hub's `TableSizes::tasks`: tasks held, and owners holding tasks or cursors.
    pub(super) fn sizes(&self) -> (usize, usize) {
        let owners: BTreeSet<&Owner> = (self.held.values().map(|h| &h.owner))
            .chain(
                (self.cursors.iter())
                    .filter(|(_, c)| !c.is_empty())
                    .map(|(o, _)| o),
            )
            .collect();
        (self.held.len(), owners.len())
    }

    /// The tasks live sessions own now, for the backend-line oracle.
    pub(super) fn of_sessions(&self, now: Duration) -> BTreeMap<String, SessionId> {
        (self.held.keys())
            .filter_map(|id| match self.peek(now, id)? {
                Owner::Session(sid) => Some((id.clone(), *sid)),
                Owner::Principal(_) => None,
            })
            .collect()
    }

    /// Every task id a message may name: the backend's, then the unknown ones.
    fn all_ids(&self) -> Vec<String> {
        (self.made.iter().map(|(id, _)| id.clone()))
            .chain(UNKNOWN.iter().map(|id| (*id).to_owned()))
            .collect()
    }

    /// A message reached `caller`: it names no task `caller` did not create (SPEC 15:
    /// no caller learns a task it does not own).
    fn check_learns(&self, caller: Option<&Owner>, message: &[u8], what: &str) {
        if !contains(message, TASK_MARK) {
            return;
        }
        let unknown = UNKNOWN.iter().map(|id| ((*id).to_owned(), None));
        let made =
            (self.made.iter().enumerate()).map(|(n, (_, creator))| (short(n), creator.as_ref()));
        for (id, creator) in made.chain(unknown) {
            assert!(
                !contains(message, &id) || (caller.is_some() && creator == caller),
                "{what} of {caller:?} names task {id}, created for {creator:?}: {}",
                String::from_utf8_lossy(message)
            );
        }
    }

    /// The caller of a stream just opened.
    pub(super) fn stream(&mut self, stream: StreamId, caller: Option<Owner>) {
        self.streams.insert(stream, caller);
    }

    /// The caller of a POST just sent.
    pub(super) fn sender(&mut self, request: RequestId, caller: Owner) {
        self.senders.insert(request, caller);
    }

    /// After every step: what reached any caller names only its own tasks.
    pub(super) fn check_step(&self, records: &[Record]) {
        for record in records {
            let Seen::Output(output) = &record.seen else {
                continue;
            };
            match output {
                Output::ToStream { stream, frame } => {
                    let caller = self.streams.get(stream).cloned().flatten();
                    self.check_learns(caller.as_ref(), frame.as_ref(), "a frame");
                }
                Output::Respond { request, response } => {
                    let caller = self.senders.get(request);
                    self.check_learns(caller, &response.body, "an answer");
                }
                _ => {}
            }
        }
    }
}

/// What a task request should get.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    /// Forwarded; a `tasks/list` with this cursor (`None`: as the caller wrote it).
    Forward(Option<String>),
    /// Answered -32602 with this message, never written to the backend.
    Refuse(&'static str),
}

impl Model {
    /// Who owns what a response routed under `key` creates: its live session, else the
    /// principal of the modern request waiting under it.
    fn owner_of_key(&self, key: &SessionId) -> Option<Owner> {
        if self.live.contains_key(key) {
            return Some(Owner::Session(*key));
        }
        let pending = self.modern.get(key)?;
        Some(Owner::Principal(pending.principal.as_str().to_owned()))
    }

    /// Whether `owner` can send a request now: a session some slot holds, or a principal.
    fn is_caller(&self, owner: &Owner) -> bool {
        match owner {
            Owner::Session(sid) => self.slots.iter().any(|s| s.current == Some(*sid)),
            Owner::Principal(_) => true,
        }
    }

    /// The caller of a stream opened for session or key `sid` in `role`.
    pub(super) fn stream_owner(
        &self,
        stream: StreamId,
        sid: SessionId,
        role: &Role,
    ) -> Option<Owner> {
        let principal = |p: &Principal| Owner::Principal(p.as_str().to_owned());
        match role {
            Role::Legacy | Role::Get | Role::Request(_) => Some(Owner::Session(sid)),
            Role::Modern => self.modern.get(&sid).map(|p| principal(&p.principal)),
            Role::Listen => self.listens.get(&stream).map(|l| principal(&l.principal)),
        }
    }

    pub(super) fn task(&mut self, op: &TaskOp) -> String {
        match op {
            TaskOp::Create { pick, ttl, long } => self.task_create(*pick, *ttl, *long),
            TaskOp::Ask {
                caller,
                method,
                task,
            } => self.task_ask(*caller, *method, *task),
            TaskOp::List { caller, cursor } => self.task_list(*caller, *cursor),
            TaskOp::Page {
                pick,
                entries,
                count,
                next,
                shape,
            } => self.task_page(*pick, *entries, (*count, *next, *shape)),
            TaskOp::Status { task } => self.task_status(*task),
        }
    }

    /// A `CreateTaskResult` for a routed id: the task is its caller's from then on (a
    /// session's even if its request is no longer awaited; nobody's when nobody waits).
    fn task_create(&mut self, pick: u16, ttl: u8, long: bool) -> String {
        if !self.backend_up {
            return "task-create:down".into();
        }
        let Some((key, id)) = self.pick(pick, false) else {
            return "task-create:none".into();
        };
        let owner = self.owner_of_key(&key);
        let n = self.tasks.made.len();
        let mut task = short(n);
        if long {
            task.push_str(&"x".repeat(MAX_TASK_ID));
        }
        let (member, ttl_ms) = match ttl % 5 {
            0 => (r#","ttl":null"#.to_owned(), None),
            1 => (String::new(), None),
            k => {
                let ms = [1_000, 15_000, 120_000][usize::from(k - 2)];
                (format!(r#","ttl":{ms}"#), Some(ms))
            }
        };
        let result = format!(r#"{{"task":{{"taskId":"{task}","status":"working"{member}}}}}"#);
        self.tasks.made.push((task.clone(), owner.clone()));
        let now = self.driver.elapsed();
        if let Some(owner) = &owner {
            self.tasks.created(now, owner.clone(), task, ttl_ms);
        }
        self.tasks.scripted = Some((key, id, format!(r#""result":{result}"#)));
        self.backend(&BackendMsg::Answer {
            pick,
            error: false,
            escaped: false,
        });
        let delivered =
            (self.tasks.placed.iter()).any(|(s, m)| *s == key && contains(m, &short(n)));
        let whose = match owner {
            Some(Owner::Session(_)) => "session",
            Some(Owner::Principal(_)) => "principal",
            None => "nobody",
        };
        let long = if long { ":long" } else { "" };
        format!(
            "task-create:{whose}:{}{long}",
            if delivered { "delivered" } else { "dropped" }
        )
    }

    /// Who a task request comes from: the slot's session (or its last one), or a modern
    /// request's principal (`None`: modern requests wait for the handshake), with the
    /// caller an owner pick stands for.
    fn task_caller(&mut self, caller: TaskCaller, cursors: bool) -> Option<(Owner, TaskCaller)> {
        let caller = match caller {
            TaskCaller::Owner { pick, accept } => {
                let mut owners: BTreeSet<&Owner> = (self.tasks.cursors.iter())
                    .filter(|(o, c)| {
                        cursors && c.iter().any(|(m, _)| m.is_some()) && self.is_caller(o)
                    })
                    .map(|(o, _)| o)
                    .collect();
                if owners.is_empty() {
                    owners = self.tasks.held.values().map(|h| &h.owner).collect();
                }
                let owner = (!owners.is_empty()).then(|| {
                    (*owners
                        .iter()
                        .nth(usize::from(pick) % owners.len())
                        .expect("some"))
                    .clone()
                });
                match owner {
                    Some(Owner::Principal(p)) => TaskCaller::Modern {
                        principal: PRINCIPALS
                            .iter()
                            .position(|n| *n == p)
                            .expect("a principal") as u8,
                        accept,
                    },
                    Some(Owner::Session(sid)) => {
                        let slot = (self.slots.iter()).position(|s| s.current == Some(sid));
                        TaskCaller::Slot {
                            slot: slot.expect("a live session is a slot's") as u8,
                            accept,
                        }
                    }
                    None => TaskCaller::Slot { slot: 0, accept },
                }
            }
            other => other,
        };
        let owner = match caller {
            TaskCaller::Slot { slot, .. } => Owner::Session(self.target(slot)),
            TaskCaller::Modern { principal, .. } => {
                if !(self.backend_up && self.ready) {
                    return None;
                }
                Owner::Principal(PRINCIPALS[usize::from(principal) % PRINCIPALS.len()].into())
            }
            TaskCaller::Owner { .. } => unreachable!("resolved above"),
        };
        Some((owner, caller))
    }

    /// A task id `caller` names, and what kind it is (`None`: a number).
    fn task_pick(&self, caller: &Owner, pick: TaskPick) -> (Option<String>, &'static str) {
        let nth = |ids: Vec<&String>, i: u8| -> Option<String> {
            (!ids.is_empty()).then(|| ids[usize::from(i) % ids.len()].clone())
        };
        let held = &self.tasks.held;
        let found = match pick {
            TaskPick::Own(i) => {
                let ids = (held.iter())
                    .filter(|(_, h)| h.owner == *caller)
                    .map(|(id, _)| id);
                nth(ids.collect(), i).map(|id| (id, "own"))
            }
            TaskPick::Foreign(i) => {
                let ids = (held.iter())
                    .filter(|(_, h)| h.owner != *caller)
                    .map(|(id, _)| id);
                nth(ids.collect(), i).map(|id| (id, "foreign"))
            }
            TaskPick::Forgotten(i) => {
                let ids = (self.tasks.made.iter()).map(|(id, _)| id);
                nth(ids.filter(|id| !held.contains_key(*id)).collect(), i)
                    .map(|id| (id, "forgotten"))
            }
            TaskPick::NotString => return (None, "number"),
            TaskPick::Unknown(_) => None,
        };
        match (found, pick) {
            (Some((id, kind)), _) => (Some(id), kind),
            (None, TaskPick::Unknown(i) | TaskPick::Own(i))
            | (None, TaskPick::Foreign(i) | TaskPick::Forgotten(i)) => (
                Some(UNKNOWN[usize::from(i) % UNKNOWN.len()].to_owned()),
                "unknown",
            ),
            (None, TaskPick::NotString) => (None, "number"),
        }
    }

    /// `tasks/get`, `tasks/result` or `tasks/cancel`: forwarded exactly when the caller
    /// owns the task now, else -32602 `Task not found` from the proxy.
    fn task_ask(&mut self, caller: TaskCaller, method: u8, pick: TaskPick) -> String {
        let method = ["tasks/get", "tasks/result", "tasks/cancel"][usize::from(method) % 3];
        let Some((owner, caller)) = self.task_caller(caller, false) else {
            return "task-ask:not-ready".into();
        };
        let now = self.driver.elapsed();
        let (task, kind) = self.task_pick(&owner, pick);
        let params = match &task {
            Some(task) => format!(r#""taskId":{}"#, json_string(task)),
            None => r#""taskId":7"#.to_owned(),
        };
        let owned = (task.as_deref()).is_some_and(|t| self.tasks.peek(now, t) == Some(&owner));
        let expect = match owned {
            true => Expect::Forward(None),
            false => Expect::Refuse("Task not found"),
        };
        let (label, accepted) = self.task_send(caller, &owner, method, &params, &expect);
        if accepted {
            if let Some(task) = &task {
                self.tasks.lookup(now, task);
            }
        }
        if accepted && owned {
            let text = self.task_line(method);
            let line = members(&text).expect("one object");
            let named = at(&line, &["params", "taskId"]).and_then(string_of);
            assert_eq!(named, task, "{method} forwarded naming another task");
        }
        format!("task-ask:{kind}:{label}")
    }

    /// `tasks/list`: forwarded (a cursor minted for the caller mapped back to the
    /// backend's), or -32602 `Invalid cursor` for any other cursor.
    fn task_list(&mut self, caller: TaskCaller, cursor: Option<CursorPick>) -> String {
        let mine = matches!(cursor, Some(CursorPick::Mine(_)));
        let Some((owner, caller)) = self.task_caller(caller, mine) else {
            return "task-list:not-ready".into();
        };
        let minted = |tasks: &Tasks, mine: bool| -> Vec<(String, String)> {
            (tasks.cursors.iter())
                .filter(|(o, _)| (**o == owner) == mine)
                .flat_map(|(_, c)| c.iter())
                .filter_map(|(m, b)| Some((m.clone()?, b.clone())))
                .collect()
        };
        let nth = |v: Vec<(String, String)>, i: u8| {
            (!v.is_empty()).then(|| v[usize::from(i) % v.len()].clone())
        };
        let (params, expect, kind) = match cursor {
            None => (String::new(), Expect::Forward(None), "none"),
            Some(CursorPick::Null) => (r#""cursor":null"#.into(), Expect::Forward(None), "null"),
            Some(CursorPick::Mine(i)) => match nth(minted(&self.tasks, true), i) {
                Some((m, b)) => (
                    format!(r#""cursor":{}"#, json_string(&m)),
                    Expect::Forward(Some(b)),
                    "mine",
                ),
                None => (r#""cursor":null"#.into(), Expect::Forward(None), "null"),
            },
            Some(CursorPick::Others(i)) => {
                let m = nth(minted(&self.tasks, false), i).map_or(NEVER_MINTED.into(), |(m, _)| m);
                let params = format!(r#""cursor":{}"#, json_string(&m));
                (params, Expect::Refuse("Invalid cursor"), "others")
            }
            Some(CursorPick::Backend(i)) => {
                let ids = self.tasks.all_ids();
                let id = &ids[usize::from(i) % ids.len()];
                let params = format!(r#""cursor":{}"#, json_string(id));
                (params, Expect::Refuse("Invalid cursor"), "backend")
            }
        };
        let (label, accepted) = self.task_send(caller, &owner, "tasks/list", &params, &expect);
        if let (true, Expect::Forward(cursor)) = (accepted, &expect) {
            let text = self.task_line("tasks/list");
            let line = members(&text).expect("one object");
            let sent = at(&line, &["params", "cursor"]).and_then(string_of);
            assert_eq!(&sent, cursor, "tasks/list forwarded with another cursor");
            let id = line
                .get("id")
                .and_then(|v| string_of(v))
                .unwrap_or_default();
            assert!(
                id.split_once('|')
                    .is_some_and(|(_, rest)| rest.starts_with('t')),
                "tasks/list forwarded unmarked: {id}"
            );
        }
        format!("task-list:{kind}:{label}")
    }

    /// The one line a forwarded task request became (checked to be `method`).
    fn task_line(&self, method: &str) -> String {
        let lines: Vec<&Vec<u8>> = (self.tasks.lines.iter())
            .filter(|l| {
                let m = members(backend_line_text(l));
                m.and_then(|m| m.get("method").and_then(|v| string_of(v)))
                    .as_deref()
                    == Some(method)
            })
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "{method} forwarded once: {:?}",
            self.tasks.lines
        );
        backend_line_text(lines[0]).to_owned()
    }

    /// Sends a task request of `owner` as `caller` says; checks that a request the proxy
    /// should answer is answered -32602 and never reaches the backend. Returns the label
    /// and whether the request was accepted (got past 404, 409 and 429).
    fn task_send(
        &mut self,
        caller: TaskCaller,
        owner: &Owner,
        method: &str,
        params: &str,
        expect: &Expect,
    ) -> (String, bool) {
        // Small ids, as the other Streamable requests use (a 409 when one is in flight).
        self.tasks.next_id += 1;
        let id = self.tasks.next_id % 5;
        let params = match params {
            "" => String::new(),
            p => format!(r#","params":{{{p}}}"#),
        };
        let (label, accepted, answer) = match caller {
            TaskCaller::Slot { slot, accept } => {
                let Owner::Session(sid) = *owner else {
                    unreachable!("a slot's caller is its session")
                };
                let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}"{params}}}"#);
                let mcp = match self.live.get(&sid) {
                    Some(s) => s.mcp().is_some(),
                    None => usize::from(slot) % super::SLOTS >= 2,
                };
                let label = match mcp {
                    true => self.mcp_post(slot, false, accept, body.as_bytes()),
                    false => self.post(slot, false, body.as_bytes()),
                };
                let accepted = ["forwarded", "answered", "waiting"]
                    .iter()
                    .any(|how| label.contains(how));
                let answer = (self.tasks.placed.iter())
                    .filter(|(s, _)| *s == sid)
                    .map(|(_, m)| m.clone())
                    .find(|m| {
                        one_line_object(m).get("id").map(|v| v.get()) == Some(&id.to_string())
                    });
                (if mcp { "mcp" } else { "legacy" }, accepted, answer)
            }
            TaskCaller::Owner { .. } => unreachable!("resolved by task_caller"),
            TaskCaller::Modern { accept, .. } => {
                let Owner::Principal(principal) = owner else {
                    unreachable!("a modern caller is a principal")
                };
                let meta = super::modern::meta("");
                let params = match params.as_str() {
                    "" => format!(r#","params":{{{meta}}}"#),
                    p => format!("{},{meta}}}", p.strip_suffix('}').expect("an object")),
                };
                let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}"{params}}}"#);
                let refused = matches!(expect, Expect::Refuse(_)).then_some(400);
                let (label, answer) = self.modern_request(
                    Principal::new(principal),
                    (id.to_string(), None),
                    accept,
                    (method, None),
                    body,
                    refused,
                );
                ("modern", !label.ends_with(":429"), answer)
            }
        };
        if !accepted {
            return (format!("{label}:not-accepted"), false);
        }
        match expect {
            Expect::Forward(_) => return (format!("{label}:forwarded"), true),
            Expect::Refuse(message) => {
                let written = (self.tasks.lines.iter())
                    .any(|l| contains(l, method) || contains(l, TASK_MARK));
                let lines = self.tasks.lines.iter().map(|l| String::from_utf8_lossy(l));
                assert!(
                    !written,
                    "a refused {method} reached the backend: {:?}",
                    lines.collect::<Vec<_>>()
                );
                let answer = answer.unwrap_or_else(|| panic!("{method} was not answered"));
                let m = one_line_object(&answer);
                assert_eq!(
                    m.get("error").map(|v| v.get().to_owned()),
                    Some(format!(r#"{{"code":-32602,"message":"{message}"}}"#)),
                    "{method} of a task not the caller's"
                );
            }
        }
        (format!("{label}:refused"), true)
    }

    /// A page of `tasks/list` for a routed `tasks/list`: its caller (a live session, a
    /// modern request waiting under its key) is shown only its own tasks, and a cursor
    /// minted for it in place of the backend's.
    fn task_page(
        &mut self,
        pick: u16,
        entries: [u8; 4],
        (count, next, shape): (u8, u8, u8),
    ) -> String {
        if !self.backend_up || self.tasks.lists.is_empty() {
            return "task-page:none".into();
        }
        // Mostly one of the newest (whose caller still waits), sometimes any.
        let lists = &self.tasks.lists;
        let at = match pick % 4 {
            0 => usize::from(pick / 4) % lists.len(),
            _ => lists.len() - 1 - usize::from(pick / 4) % lists.len().min(2),
        };
        let (key, id) = lists[at].clone();
        let all = self.tasks.all_ids();
        // Even picks name the caller's own tasks when it has some, odd ones anybody's.
        let theirs: Vec<String> = match self.owner_of_key(&key) {
            Some(owner) => (self.tasks.held.iter())
                .filter(|(_, h)| h.owner == owner)
                .map(|(id, _)| id.clone())
                .collect(),
            None => Vec::new(),
        };
        let listed: Vec<Option<String>> = entries[..usize::from(count % 5)]
            .iter()
            .map(|&e| match e {
                255 => None,
                e if e % 2 == 0 && !theirs.is_empty() => {
                    Some(theirs[usize::from(e / 2) % theirs.len()].clone())
                }
                e => Some(all[usize::from(e / 2) % all.len()].clone()),
            })
            .collect();
        let tasks: Vec<String> = (listed.iter())
            .map(|t| match t {
                Some(t) => format!(r#"{{"taskId":"{t}","status":"working"}}"#),
                None => r#"{"taskId":7}"#.to_owned(),
            })
            .collect();
        let backend_next: Option<Option<String>> = match next % 6 {
            0 | 1 => None,
            2 => Some(None),
            3 => Some(Some("c-opaque".to_owned())),
            k => Some(Some(all[usize::from(next / 6 + k) % all.len()].clone())),
        };
        let cursor = match &backend_next {
            None => String::new(),
            Some(None) => r#","nextCursor":5"#.to_owned(),
            Some(Some(c)) => format!(r#","nextCursor":{}"#, json_string(c)),
        };
        let filterable = shape % 8 < 6;
        let result = match shape % 8 {
            6 => format!(r#"{{"tasks":{{"taskId":"{}"}}}}"#, all[0]),
            7 => String::new(),
            _ => format!(
                r#"{{"tasks":[{}]{cursor},"_meta":{{"page":1}}}}"#,
                tasks.join(",")
            ),
        };
        let owner = self.owner_of_key(&key);
        let now = self.driver.elapsed();
        // What the hub does, in its order: each listed task looked up, then a cursor minted.
        let kept: Option<Vec<String>> = match (&owner, filterable) {
            (Some(owner), true) => {
                let kept = (listed.iter().flatten())
                    .filter(|t| self.tasks.lookup(now, t).as_ref() == Some(owner))
                    .cloned()
                    .collect();
                if let Some(Some(backend)) = &backend_next {
                    self.tasks.mint(owner, backend.clone());
                }
                Some(kept)
            }
            _ => None,
        };
        let member = match result.as_str() {
            "" => r#""error":{"code":-1,"message":"no"}"#.to_owned(),
            result => format!(r#""result":{result}"#),
        };
        self.tasks.scripted = Some((key, id, member));
        self.backend(&BackendMsg::Answer {
            pick: 0,
            error: false,
            escaped: false,
        });
        let answers: Vec<Vec<u8>> = (self.tasks.placed.iter())
            .filter(|(s, _)| *s == key)
            .map(|(_, m)| m.clone())
            .collect();
        assert!(answers.len() <= 1, "a page reached its caller twice");
        let Some(answer) = answers.first() else {
            return "task-page:dropped".into();
        };
        let m = one_line_object(answer);
        let Some(kept) = kept else {
            let error = m
                .get("error")
                .map(|v| v.get().to_owned())
                .unwrap_or_default();
            if shape % 8 == 6 {
                assert_eq!(
                    error,
                    r#"{"code":-32603,"message":"task list could not be filtered"}"#
                );
            }
            return "task-page:error".into();
        };
        let result = m
            .get("result")
            .and_then(|r| members(r.get()))
            .expect("a page");
        let shown: Vec<&serde_json::value::RawValue> =
            serde_json::from_str(result.get("tasks").map_or("[]", |t| t.get())).expect("an array");
        let shown: Vec<String> = (shown.iter())
            .filter_map(|e| members(e.get())?.get("taskId").and_then(|v| string_of(v)))
            .collect();
        assert_eq!(shown, kept, "a page shows exactly the caller's own tasks");
        let given = result.get("nextCursor").map(|v| v.get().to_owned());
        match &backend_next {
            None => assert_eq!(given, None, "a nextCursor out of nowhere"),
            Some(None) => assert_eq!(given.as_deref(), Some("null"), "a cursor not a string"),
            Some(Some(backend)) => {
                let given: String = serde_json::from_str(&given.unwrap_or_default())
                    .expect("a minted cursor is a string");
                assert!(
                    given != *backend && !given.contains(TASK_MARK),
                    "the backend's cursor {backend} reached its caller"
                );
                let owner = owner.expect("filtered for an owner");
                let cursors = self.tasks.cursors.get_mut(&owner).expect("minted");
                cursors.back_mut().expect("minted").0 = Some(given);
            }
        }
        format!(
            "task-page:shown-{}",
            if kept.is_empty() { "none" } else { "some" }
        )
    }

    /// `notifications/tasks/status`: to the task's owner if it is a live 2025 session
    /// (a legacy stream, a Streamable GET stream), else nowhere.
    fn task_status(&mut self, pick: u8) -> String {
        if !self.backend_up {
            return "task-status:down".into();
        }
        let all = self.tasks.all_ids();
        let held: Vec<&String> = self.tasks.held.keys().collect();
        let task = match pick {
            255 => None,
            p if p % 2 == 0 && !held.is_empty() => {
                Some(held[usize::from(p / 2) % held.len()].clone())
            }
            p => Some(all[usize::from(p / 2) % all.len()].clone()),
        };
        let now = self.driver.elapsed();
        let owner = task.as_ref().and_then(|t| self.tasks.lookup(now, t));
        let reaches = match &owner {
            Some(Owner::Session(sid)) => self
                .live
                .get(sid)
                .filter(|s| s.mcp().is_none_or(|m| m.get.is_some()))
                .map(|_| *sid),
            _ => None,
        };
        let named = task.as_deref().map_or("7".to_owned(), json_string);
        let line = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/tasks/status","params":{{"taskId":{named},"status":"completed"}}}}"#
        );
        self.backend(&BackendMsg::Raw(line));
        let reached: Vec<SessionId> = self.tasks.placed.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            reached,
            reaches.into_iter().collect::<Vec<_>>(),
            "a status of {task:?} (owned by {owner:?}) reached other than its live owner"
        );
        let whose = match owner {
            Some(Owner::Session(_)) if reaches.is_some() => "delivered",
            Some(Owner::Session(_)) => "no-stream",
            Some(Owner::Principal(_)) => "principal",
            None => "nobody",
        };
        format!("task-status:{whose}")
    }
}

impl Rng {
    /// A task operation: mostly tasks created and asked for by their owners, often
    /// others', with pages and status notifications naming anybody's.
    pub(super) fn task_op(&mut self, slot: u8) -> TaskOp {
        let caller = match self.below(20) {
            0..=3 => TaskCaller::Modern {
                principal: self.byte(),
                accept: self.accept(),
            },
            4..=11 => TaskCaller::Owner {
                pick: self.byte(),
                accept: self.accept(),
            },
            _ => TaskCaller::Slot {
                slot,
                accept: self.accept(),
            },
        };
        let pick = |rng: &mut Rng| match rng.below(10) {
            0..=3 => TaskPick::Own(rng.byte()),
            4..=6 => TaskPick::Foreign(rng.byte()),
            7 => TaskPick::Forgotten(rng.byte()),
            8 => TaskPick::Unknown(rng.byte()),
            _ => TaskPick::NotString,
        };
        match self.below(20) {
            0..=5 => TaskOp::Create {
                pick: self.next() as u16,
                ttl: self.byte(),
                long: self.chance(5),
            },
            6..=9 => TaskOp::Ask {
                caller,
                method: self.byte(),
                task: pick(self),
            },
            10..=13 => {
                let cursor = match self.below(8) {
                    0 | 1 => None,
                    2 => Some(CursorPick::Null),
                    3..=5 => Some(CursorPick::Mine(self.byte())),
                    6 => Some(CursorPick::Others(self.byte())),
                    _ => Some(CursorPick::Backend(self.byte())),
                };
                // A cursor of its own is sent by someone who was given one.
                let caller = match cursor {
                    Some(CursorPick::Mine(_)) => TaskCaller::Owner {
                        pick: self.byte(),
                        accept: self.accept(),
                    },
                    _ => caller,
                };
                TaskOp::List { caller, cursor }
            }
            14..=16 => TaskOp::Page {
                pick: self.next() as u16,
                entries: [self.byte(), self.byte(), self.byte(), self.byte()],
                count: self.byte(),
                next: self.byte(),
                shape: self.byte(),
            },
            _ => TaskOp::Status { task: self.byte() },
        }
    }
}
