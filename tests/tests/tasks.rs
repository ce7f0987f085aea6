//! SPEC 15 end to end: every task has an owner. The real `@modelcontextprotocol/server-everything`
//! (TS SDK 1.x: 2025-11-25 tasks in an in-memory store shared by the one backend session the
//! proxy keeps) behind each binary, with two principals (`--auth-tokens`) calling from
//! legacy `/sse` sessions, Streamable `/mcp` sessions and 2026-07-28 requests (whose owner is
//! the principal, not a session). Each caller starts two `simulate-research-query` tasks (4 s
//! of work, a status notification a second) and probes everyone's:
//! - a foreign `tasks/get`, `tasks/result` or `tasks/cancel` is answered -32602 `Task not found`
//!   by the proxy and never reaches the backend; a foreign cancel leaves the owner's task
//!   running;
//! - `tasks/list` shows each caller its own tasks only, and its `nextCursor` (server-everything
//!   pages by ten, its cursor the last task id of a page) is a cursor minted by the proxy: no
//!   task id, refused to another caller;
//! - the owner's own get, list, cancel and result work, and the result is its own report;
//! - `notifications/tasks/status` reach the owning 2025 session, never another;
//! - ten fresh sessions of both principals poll random task ids (and ids no one owns: a
//!   number, null, none, an unknown string, 300 bytes) and all fail;
//! - a session that ends leaves nothing a later session (same principal) can read;
//! - a method MCP does not define gets -32601 and `logging/setLevel` gets `{}` from the proxy,
//!   neither forwarded, unless `--pass-method` names the method.
//!
//! What reaches the backend is read from a record of its stdin, written by a `--require`d
//! preload (`record.cjs`, one process, so the proxy's signals still reach the server).
//! The isolation test collects every violation before failing, so one run lists all leaks.
//!
//! Needs `node` and `@modelcontextprotocol/server-everything` in the Node folder
//! (`SWITCHBOARD_NODE_DIR`, else `tests/node`); without them the tests skip loudly, or fail when
//! `CI=true`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchboard_tests::mcp::{post, Answer};
use switchboard_tests::node::{node_with, one_at_a_time, recorded_everything, Node, EVERYTHING};
use switchboard_tests::{
    open_session, suite, wait_until, Events, Frame, McpSession, Proxy, Session, Target, TempDir,
    QUIET, WAIT,
};

const MODERN: &str = "2026-07-28";
const ALICE: (&str, &str) = ("alice", "alice-secret-token");
const BOB: (&str, &str) = ("bob", "bob-secret-token");
const TOOL: &str = "simulate-research-query";

/// Marks every probe that must never reach the backend (in `params`, which the backend ignores).
const FOREIGN: &str = "MARK-FOREIGN";
/// Marks the owners' own probes, which must reach it.
const OWN: &str = "MARK-OWN";

/// A proxy in front of server-everything, with both principals' tokens and a record of what
/// the backend reads.
struct Everything {
    proxy: Proxy,
    record: PathBuf,
    _scratch: TempDir,
}

impl Everything {
    fn start(target: Target, node: &Node, args: &[&str]) -> Everything {
        let scratch = TempDir::new("tasks-backend");
        let (backend, (key, value), record) = recorded_everything(node, scratch.path());
        let proxy = Proxy::builder(target)
            .tokens(&[ALICE, BOB])
            .args(args.iter().copied())
            .env(key, value)
            .backend(backend)
            .start();
        Everything {
            proxy,
            record,
            _scratch: scratch,
        }
    }

    /// Every line the backend has read so far.
    fn recorded(&self) -> Vec<String> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// How a caller reaches the proxy.
enum Via {
    /// `GET /sse` and POSTs to its endpoint; answers and notifications on the one stream.
    Legacy(Box<Session>),
    /// An `/mcp` session; notifications on its GET stream.
    Streamable(McpSession, Box<Events>),
    /// 2026-07-28 requests: no session, the principal is the owner.
    Modern,
}

/// One owner of tasks (or a prober): a session, or a principal's modern requests.
struct Caller {
    name: String,
    token: &'static str,
    addr: std::net::SocketAddr,
    via: Via,
    next_id: u64,
    /// Notifications seen on the caller's streams.
    notes: Vec<Value>,
    /// The task ids it created, in order.
    tasks: Vec<String>,
}

impl Caller {
    /// A legacy session of `who`, initialized (the first one initializes the backend, as a
    /// 2025-11-25 client with no capabilities).
    fn legacy(p: &Proxy, name: &str, who: (&str, &'static str)) -> Caller {
        let session = open_session(p, Some(who.1));
        let mut c = Caller::new(p, name, who, Via::Legacy(Box::new(session)));
        let (_, init) = c.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "tasks-suite", "version": "1"}}),
        );
        assert!(
            init["result"]["capabilities"]["tasks"].is_object(),
            "{init}"
        );
        if let Via::Legacy(s) = &c.via {
            s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        }
        c
    }

    /// A Streamable session of `who` with its GET stream open.
    fn streamable(p: &Proxy, name: &str, who: (&str, &'static str)) -> Caller {
        let session = McpSession::start(p, Some(who.1));
        let get = Box::new(session.get_stream());
        Caller::new(p, name, who, Via::Streamable(session, get))
    }

    /// `who`'s 2026-07-28 requests.
    fn modern(p: &Proxy, name: &str, who: (&str, &'static str)) -> Caller {
        Caller::new(p, name, who, Via::Modern)
    }

    fn new(p: &Proxy, name: &str, who: (&str, &'static str), via: Via) -> Caller {
        Caller {
            name: name.to_owned(),
            token: who.1,
            addr: p.addr,
            via,
            next_id: 0,
            notes: Vec::new(),
            tasks: Vec::new(),
        }
    }

    fn is_session(&self) -> bool {
        !matches!(self.via, Via::Modern)
    }

    /// Sends a request (ids count from 1 for every caller, so they collide) and returns its
    /// response message with the HTTP status it came with (200 for a legacy answer, whose POST
    /// said 202).
    fn request(&mut self, method: &str, params: Value) -> (u16, Value) {
        self.next_id += 1;
        let id = self.next_id;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let auth = format!("Bearer {}", self.token);
        let (status, answer) = match &mut self.via {
            Via::Legacy(s) => {
                s.send(&body);
                loop {
                    let m = s.expect_message(&format!("{}: the answer to {method}", self.name));
                    if m.get("method").is_some() {
                        self.notes.push(m);
                    } else {
                        break (200, m);
                    }
                }
            }
            Via::Streamable(s, _) => {
                let answer = s.post(&body.to_string());
                answer_of(answer, &mut self.notes)
            }
            Via::Modern => {
                let mut body = body;
                body["params"]["_meta"] = json!({
                    "io.modelcontextprotocol/protocolVersion": MODERN,
                    "io.modelcontextprotocol/clientCapabilities": {},
                });
                let name = body["params"]["name"].as_str().map(str::to_owned);
                let mut headers = vec![
                    ("MCP-Protocol-Version", MODERN),
                    ("Mcp-Method", method),
                    ("Authorization", auth.as_str()),
                ];
                if method == "tools/call" {
                    headers.extend(name.as_deref().map(|n| ("Mcp-Name", n)));
                }
                let answer = post(self.addr, "/mcp", &headers, &body.to_string());
                answer_of(answer, &mut self.notes)
            }
        };
        assert_eq!(
            answer["id"], id,
            "{} sent {method} under id {id} and got another's answer: {answer}",
            self.name
        );
        (status, answer)
    }

    /// Starts a research task on a private topic; returns its id.
    fn create_task(&mut self, topic: &str) -> String {
        let (_, m) = self.request(
            "tools/call",
            json!({"name": TOOL, "arguments": {"topic": topic}, "task": {"ttl": 60000}}),
        );
        let id = m["result"]["task"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no CreateTaskResult: {m}", self.name))
            .to_owned();
        self.tasks.push(id.clone());
        id
    }

    /// `tasks/list`, following the caller's own cursors (at most 8 pages): the ids listed and
    /// every cursor given, or the error that ended the walk.
    fn list_all(&mut self) -> Result<(Vec<String>, Vec<String>), Value> {
        let (mut ids, mut cursors) = (Vec::new(), Vec::new());
        for _ in 0..8 {
            let mut params = json!({"marker": OWN});
            if let Some(c) = cursors.last() {
                params["cursor"] = json!(c);
            }
            let (_, m) = self.request("tasks/list", params);
            let Some(result) = m.get("result") else {
                return Err(m);
            };
            for t in result["tasks"].as_array().into_iter().flatten() {
                ids.push(t["taskId"].as_str().unwrap_or_default().to_owned());
            }
            match result["nextCursor"].as_str() {
                Some(c) => cursors.push(c.to_owned()),
                None => return Ok((ids, cursors)),
            }
        }
        panic!("{}: tasks/list gave more than 8 pages", self.name);
    }

    /// Reads the caller's notification stream until `done` says so (at most `wait`), then for
    /// `QUIET` more; everything read is added to `notes`.
    fn drain_notes(&mut self, wait: Duration, done: impl Fn(&[Value]) -> bool) {
        let deadline = Instant::now() + wait.max(QUIET);
        let mut quiet_from: Option<Instant> = None;
        loop {
            if quiet_from.is_none() && done(&self.notes) {
                quiet_from = Some(Instant::now());
            }
            let now = Instant::now();
            let until = match quiet_from {
                Some(q) => q + QUIET,
                None => deadline,
            };
            if now >= until {
                return;
            }
            let step = (until - now).min(Duration::from_millis(200));
            match &mut self.via {
                Via::Legacy(s) => {
                    if let Some(m) = s.next_message(step) {
                        assert!(m.get("method").is_some(), "{}: stray {m}", self.name);
                        self.notes.push(m);
                    }
                }
                Via::Streamable(_, get) => match get.next_frame(step) {
                    Frame::Event { data, .. } if !data.is_empty() => {
                        let m: Value = serde_json::from_str(&data).expect("a JSON event");
                        assert!(m.get("method").is_some(), "{}: a GET stream {m}", self.name);
                        self.notes.push(m);
                    }
                    Frame::Closed => panic!("{}: the GET stream ended", self.name),
                    _ => {}
                },
                Via::Modern => return,
            }
        }
    }

    /// The task ids of the `notifications/tasks/status` seen, with their status.
    fn statuses(&self) -> Vec<(String, String)> {
        self.notes
            .iter()
            .filter(|m| m["method"] == "notifications/tasks/status")
            .map(|m| {
                (
                    m["params"]["taskId"].as_str().unwrap_or("?").to_owned(),
                    m["params"]["status"].as_str().unwrap_or("?").to_owned(),
                )
            })
            .collect()
    }

    /// Ends the session: the legacy stream hangs up, a Streamable one is deleted.
    fn end(self) {
        match self.via {
            Via::Legacy(s) => s.shutdown(),
            Via::Streamable(s, get) => {
                let r = s.delete();
                assert_eq!(r.status, 204, "DELETE: {} {}", r.status, r.text());
                drop(get);
            }
            Via::Modern => {}
        }
    }
}

/// The one response of a `/mcp` POST with its status; notifications streamed before it go to
/// `notes`.
fn answer_of(answer: Answer, notes: &mut Vec<Value>) -> (u16, Value) {
    match answer {
        Answer::Whole(r) => {
            let body: Value = serde_json::from_slice(&r.body)
                .unwrap_or_else(|e| panic!("{} not JSON ({e}): {}", r.status, r.text()));
            (r.status, body)
        }
        Answer::Stream(mut e) => {
            let status = e.head.status;
            let mut messages = e
                .rest_until_closed(WAIT)
                .unwrap_or_else(|| panic!("an answer stream did not end within {WAIT:?}"));
            let last = messages.pop().expect("the stream carried the response");
            notes.extend(messages);
            (status, last)
        }
    }
}

/// Violations, collected so that one failing run names every leak at once.
#[derive(Default)]
struct Findings {
    checks: usize,
    violations: Vec<String>,
}

impl Findings {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        self.checks += 1;
        if !ok {
            self.violations.push(what());
        }
    }

    /// `m` must be the proxy's -32602 `Task not found` (a modern one as HTTP 400, SPEC 13).
    fn not_found(&mut self, kind: &str, c: &Caller, status: u16, m: &Value, task: &str) {
        let error = &m["error"];
        let ok = error["code"] == -32602
            && error["message"] == "Task not found"
            && m.get("result").is_none()
            && (c.is_session() || status == 400);
        self.check(ok, || {
            format!(
                "[{kind}] {} probing {task} got {status} {}",
                c.name,
                shorten(m)
            )
        });
    }

    /// Fails with every violation, grouped by kind (a count and the first three of each).
    fn assert_none(&self, target: Target) {
        println!(
            "{target:?}: {} checks, {} violations",
            self.checks,
            self.violations.len()
        );
        if self.violations.is_empty() {
            return;
        }
        let mut kinds: Vec<(&str, Vec<&String>)> = Vec::new();
        for v in &self.violations {
            let kind = v.split(']').next().unwrap_or_default();
            match kinds.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, all)) => all.push(v),
                None => kinds.push((kind, vec![v])),
            }
        }
        let mut report = String::new();
        for (kind, all) in &kinds {
            report.push_str(&format!("{kind}] x{}:\n", all.len()));
            for v in all.iter().take(3) {
                report.push_str(&format!("    {v}\n"));
            }
        }
        panic!(
            "{target:?}: {} violations of SPEC 15:\n{report}",
            self.violations.len()
        );
    }
}

/// A message cut to a readable length (reports quote private topics, not whole reports).
fn shorten(m: &Value) -> String {
    let text = m.to_string();
    if text.len() <= 240 {
        return text;
    }
    let mut end = 240;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// A small seeded generator for the random polls (the seed is printed; `TASKS_SEED` repeats a
/// run).
struct XorShift(u64);

impl XorShift {
    fn seeded() -> XorShift {
        let seed = std::env::var("TASKS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            })
            | 1;
        println!("TASKS_SEED={seed}");
        XorShift(seed)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn everything_node(what: &str) -> Option<Node> {
    node_with(what, &[EVERYTHING])
}

/// The three probes of one task id.
const PROBES: [&str; 3] = ["tasks/get", "tasks/result", "tasks/cancel"];

/// Two principals' legacy sessions, Streamable sessions and modern requests each start two
/// tasks; every foreign probe fails, every own one works, lists and cursors stay per caller,
/// status notifications reach only the owner, and ten fresh sessions polling at random learn
/// nothing.
fn tasks_are_isolated_between_callers(target: Target) {
    let Some(node) = everything_node("tasks isolation against server-everything") else {
        return;
    };
    let _turn = one_at_a_time();
    let started = Instant::now();
    let e = Everything::start(target, &node, &[]);
    let p = &e.proxy;
    let mut callers = [
        Caller::legacy(p, "legacy-alice", ALICE),
        Caller::legacy(p, "legacy-bob", BOB),
        Caller::streamable(p, "streamable-alice", ALICE),
        Caller::streamable(p, "streamable-bob", BOB),
        Caller::modern(p, "modern-alice", ALICE),
        Caller::modern(p, "modern-bob", BOB),
    ];
    // Twelve tasks: more than server-everything's page of ten, so its lists carry a cursor.
    for round in 0..2 {
        for c in callers.iter_mut() {
            let topic = format!("private topic of {} #{round}", c.name);
            c.create_task(&topic);
        }
    }
    let all: Vec<(usize, String)> = callers
        .iter()
        .enumerate()
        .flat_map(|(i, c)| c.tasks.iter().map(move |t| (i, t.clone())))
        .collect();
    let distinct: BTreeSet<&String> = all.iter().map(|(_, t)| t).collect();
    assert_eq!(distinct.len(), 12, "task ids: {all:?}");
    let mut f = Findings::default();

    // Lists: own tasks only, a cursor that is no task id and that no one else may use.
    let mut given: Vec<Vec<String>> = Vec::new();
    for c in callers.iter_mut() {
        match c.list_all() {
            Err(m) => {
                f.check(false, || format!("[own list] {}: {}", c.name, shorten(&m)));
                given.push(Vec::new());
            }
            Ok((ids, cursors)) => {
                let own: BTreeSet<&String> = c.tasks.iter().collect();
                let foreign: Vec<&String> = ids.iter().filter(|t| !own.contains(t)).collect();
                f.check(foreign.is_empty(), || {
                    format!("[foreign list] {} was shown {foreign:?}", c.name)
                });
                let seen: BTreeSet<&String> = ids.iter().collect();
                f.check(own.iter().all(|t| seen.contains(t)), || {
                    format!("[own list] {} did not see all of {own:?}: {ids:?}", c.name)
                });
                f.check(!cursors.is_empty(), || {
                    format!(
                        "[own list] {}: no nextCursor although the backend holds 12 tasks",
                        c.name
                    )
                });
                for cursor in &cursors {
                    f.check(!distinct.contains(cursor), || {
                        format!(
                            "[cursor] {} was given a task id as its cursor: {cursor}",
                            c.name
                        )
                    });
                }
                given.push(cursors);
            }
        }
    }
    let n = callers.len();
    for (i, c) in callers.iter_mut().enumerate() {
        // Another caller's first cursor; skipped if the proxy happened to give this caller
        // the same string (cursors need only be unique per owner).
        let Some(theirs) = given[(i + 1) % n].first().cloned() else {
            continue;
        };
        if given[i].contains(&theirs) {
            continue;
        }
        let (status, m) = c.request("tasks/list", json!({"cursor": theirs, "marker": FOREIGN}));
        let ok = m["error"]["code"] == -32602
            && m["error"]["message"] == "Invalid cursor"
            && (c.is_session() || status == 400);
        f.check(ok, || {
            format!(
                "[foreign cursor] {} used another caller's cursor {theirs}: {status} {}",
                c.name,
                shorten(&m)
            )
        });
    }

    // Every foreign probe, the attacker first: get, result (which must neither wait for the
    // task nor read its report), cancel (which must not stop it).
    for method in PROBES {
        for (i, c) in callers.iter_mut().enumerate() {
            for (owner, task) in &all {
                if *owner == i {
                    continue;
                }
                let (status, m) = c.request(method, json!({"taskId": task, "marker": FOREIGN}));
                f.not_found(&format!("foreign {method}"), c, status, &m, task);
            }
        }
    }

    // The owners' own probes all work: get (still working: no one cancelled it), cancel of
    // the second task, and the first one's result, its own report.
    for c in callers.iter_mut() {
        let (first, second) = (c.tasks[0].clone(), c.tasks[1].clone());
        let (_, m) = c.request("tasks/get", json!({"taskId": first, "marker": OWN}));
        let status = m["result"]["status"].as_str().unwrap_or_default();
        f.check(
            m["result"]["taskId"] == first.as_str() && ["working", "completed"].contains(&status),
            || format!("[own get] {}: {}", c.name, shorten(&m)),
        );
        let (_, m) = c.request("tasks/cancel", json!({"taskId": second, "marker": OWN}));
        f.check(m["result"]["status"] == "cancelled", || {
            format!("[own cancel] {}: {}", c.name, shorten(&m))
        });
    }
    for c in callers.iter_mut() {
        let first = c.tasks[0].clone();
        let (_, m) = c.request("tasks/result", json!({"taskId": first, "marker": OWN}));
        let text = m["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        let topic = format!("private topic of {} #0", c.name);
        f.check(text.contains(&topic), || {
            format!("[own result] {}: {}", c.name, shorten(&m))
        });
        let (_, m) = c.request("tasks/get", json!({"taskId": first, "marker": OWN}));
        f.check(m["result"]["status"] == "completed", || {
            format!("[own get after result] {}: {}", c.name, shorten(&m))
        });
    }

    // Status notifications: the owner's first task's progress reaches its 2025 session, and
    // no session hears of a task it does not own. (The very first status of a task precedes
    // its CreateTaskResult, so the proxy cannot attribute it yet: it is dropped.)
    let deadline = Instant::now() + WAIT;
    for c in callers.iter_mut().filter(|c| c.is_session()) {
        let first = c.tasks[0].clone();
        let wait = deadline.saturating_duration_since(Instant::now());
        c.drain_notes(wait, |notes| {
            notes.iter().any(|m| {
                m["method"] == "notifications/tasks/status"
                    && m["params"]["taskId"] == first.as_str()
                    && m["params"]["status"] == "completed"
            })
        });
        let statuses = c.statuses();
        println!("{}: {} status notifications", c.name, statuses.len());
        let foreign: Vec<&(String, String)> = statuses
            .iter()
            .filter(|(t, _)| !c.tasks.contains(t))
            .collect();
        f.check(foreign.is_empty(), || {
            format!("[foreign notification] {} heard of {foreign:?}", c.name)
        });
        f.check(
            statuses
                .iter()
                .any(|(t, s)| *t == first && s == "completed"),
            || {
                format!(
                    "[own notification] {} never heard its task {first} complete: {statuses:?}",
                    c.name
                )
            },
        );
    }

    // Ten fresh sessions of both principals and transports poll at random and list: nothing.
    let mut rng = XorShift::seeded();
    for k in 0..10 {
        let who = if k % 2 == 0 { ALICE } else { BOB };
        let name = format!("poller-{k}");
        let mut c = if k < 5 {
            Caller::legacy(p, &name, who)
        } else {
            Caller::streamable(p, &name, who)
        };
        for _ in 0..6 {
            let method = PROBES[rng.below(PROBES.len())];
            let (_, task) = &all[rng.below(all.len())];
            let (status, m) = c.request(method, json!({"taskId": task, "marker": FOREIGN}));
            f.not_found(&format!("random {method}"), &c, status, &m, task);
        }
        // Ids no one owns: a number, null, a missing one, an unknown string, one too long to
        // record (SPEC 15: all "not owned", answered by the proxy).
        let method = PROBES[k % PROBES.len()];
        let long = "f".repeat(300);
        for id in [json!(7), Value::Null, json!("no-such-task"), json!(long)] {
            let (status, m) = c.request(method, json!({"taskId": id, "marker": FOREIGN}));
            f.not_found(&format!("odd {method}"), &c, status, &m, &id.to_string());
        }
        let (status, m) = c.request(method, json!({"marker": FOREIGN}));
        f.not_found(&format!("odd {method}"), &c, status, &m, "(no taskId)");
        match c.list_all() {
            Ok((ids, _)) => f.check(ids.is_empty(), || {
                format!("[foreign list] {name}, a new session, was shown {ids:?}")
            }),
            Err(m) => f.check(false, || format!("[list] {name}: {}", shorten(&m))),
        }
    }

    // Nothing marked foreign reached the backend; the owners' probes did (the record works).
    let recorded = e.recorded();
    let leaked: Vec<&String> = recorded.iter().filter(|l| l.contains(FOREIGN)).collect();
    f.check(leaked.is_empty(), || {
        format!(
            "[forwarded] {} foreign probes reached the backend, e.g. {}",
            leaked.len(),
            leaked.first().map(|l| l.as_str()).unwrap_or_default()
        )
    });
    assert!(
        recorded.iter().any(|l| l.contains(OWN)),
        "the backend's record shows no own probe: {recorded:?}"
    );
    f.assert_none(target);
    switchboard_tests::figure(target, "tasks_isolation", started.elapsed());
}

/// A session that ends (a legacy stream that hangs up, a deleted Streamable session) leaves
/// nothing a later session of the same principal, or that principal's modern requests, can
/// read: its task ids answer `Task not found`, and lists never show them.
fn an_ended_session_leaves_nothing(target: Target) {
    let Some(node) = everything_node("ended sessions' tasks against server-everything") else {
        return;
    };
    let _turn = one_at_a_time();
    let started = Instant::now();
    let e = Everything::start(target, &node, &[]);
    let p = &e.proxy;
    let mut gone = Vec::new();
    for c in [
        Caller::legacy(p, "legacy-alice", ALICE),
        Caller::streamable(p, "streamable-alice", ALICE),
    ] {
        let mut c = c;
        let task = c.create_task(&format!("private topic of {}", c.name));
        let (_, m) = c.request("tasks/get", json!({"taskId": task}));
        assert_eq!(m["result"]["taskId"], task.as_str(), "{}: {m}", c.name);
        gone.push(task);
        c.end();
    }
    wait_until("both sessions ended", WAIT, || {
        (p.health().1["sessions"] == json!(0)).then_some(())
    });
    let mut f = Findings::default();
    let later = [
        Caller::legacy(p, "later-legacy-alice", ALICE),
        Caller::streamable(p, "later-streamable-alice", ALICE),
        Caller::modern(p, "modern-alice", ALICE),
    ];
    for mut c in later {
        for task in &gone {
            for method in PROBES {
                let (status, m) = c.request(method, json!({"taskId": task, "marker": FOREIGN}));
                f.not_found(&format!("ended {method}"), &c, status, &m, task);
            }
        }
        match c.list_all() {
            Ok((ids, _)) => f.check(ids.is_empty(), || {
                format!("[ended list] {} was shown {ids:?}", c.name)
            }),
            Err(m) => f.check(false, || format!("[list] {}: {}", c.name, shorten(&m))),
        }
    }
    let leaked = e.recorded().iter().filter(|l| l.contains(FOREIGN)).count();
    f.check(leaked == 0, || {
        format!("[forwarded] {leaked} probes of ended sessions' tasks reached the backend")
    });
    f.assert_none(target);
    switchboard_tests::figure(target, "tasks_ended_session", started.elapsed());
}

/// `foo/bar` (no MCP method) gets -32601 and `logging/setLevel` `{}` from the proxy on both
/// transports (a modern `foo/bar` 404 with -32601); neither reaches the backend, nor does a
/// client notification MCP does not define.
fn unknown_methods_and_set_level_stay_at_the_proxy(target: Target) {
    let Some(node) = everything_node("unknown methods against server-everything") else {
        return;
    };
    let _turn = one_at_a_time();
    let e = Everything::start(target, &node, &[]);
    let p = &e.proxy;
    let mut callers = [
        Caller::legacy(p, "legacy-alice", ALICE),
        Caller::streamable(p, "streamable-bob", BOB),
        Caller::modern(p, "modern-alice", ALICE),
    ];
    for c in callers.iter_mut() {
        let (status, m) = c.request("foo/bar", json!({"marker": FOREIGN}));
        assert_eq!(m["error"]["code"], -32601, "{}: {m}", c.name);
        let want = if c.is_session() { 200 } else { 404 };
        assert_eq!(status, want, "{}: {m}", c.name);
        if c.is_session() {
            let (status, m) = c.request("logging/setLevel", json!({"level": "debug"}));
            assert_eq!((status, &m["result"]), (200, &json!({})), "{}: {m}", c.name);
        }
        let note =
            json!({"jsonrpc": "2.0", "method": "notifications/foo", "params": {"marker": FOREIGN}});
        let status = match &c.via {
            Via::Legacy(s) => s.post(&note.to_string()).status,
            Via::Streamable(s, _) => s.post(&note.to_string()).status(),
            Via::Modern => continue,
        };
        assert_eq!(status, 202, "{}: a client notification", c.name);
    }
    // The backend reads in order: a forwarded request after them proves they would be there.
    let (_, m) = callers[0].request(
        "tools/call",
        json!({"name": "echo", "arguments": {"message": OWN}}),
    );
    assert_eq!(
        m["result"]["content"][0]["text"],
        format!("Echo: {OWN}"),
        "{m}"
    );
    let recorded = wait_until("the echo at the backend", WAIT, || {
        let r = e.recorded();
        r.iter().any(|l| l.contains(OWN)).then_some(r)
    });
    let leaked: Vec<&String> = recorded
        .iter()
        .filter(|l| l.contains(FOREIGN) || l.contains("logging/setLevel"))
        .collect();
    assert!(leaked.is_empty(), "forwarded to the backend: {leaked:?}");
}

/// `--pass-method foo/bar` lets that method through to the backend (whose own -32601 answers).
fn a_passed_method_reaches_the_backend(target: Target) {
    let Some(node) = everything_node("--pass-method against server-everything") else {
        return;
    };
    let _turn = one_at_a_time();
    let e = Everything::start(target, &node, &["--pass-method", "foo/bar"]);
    let mut c = Caller::legacy(&e.proxy, "legacy-alice", ALICE);
    let (_, m) = c.request("foo/bar", json!({"marker": OWN}));
    assert_eq!(m["error"]["code"], -32601, "{m}");
    let line = wait_until("foo/bar at the backend", WAIT, || {
        e.recorded().into_iter().find(|l| l.contains(OWN))
    });
    assert!(line.contains(r#""method":"foo/bar""#), "{line}");
}

suite!(
    tasks_are_isolated_between_callers,
    an_ended_session_leaves_nothing,
    unknown_methods_and_set_level_stay_at_the_proxy,
    a_passed_method_reaches_the_backend,
);
