//! The tasks the backend keeps, each with an owner (SPEC section 15). The backend keeps one
//! session, the proxy's, so its tasks utility would show every client's tasks to every
//! other; the proxy learns who created each task from the `CreateTaskResult` it delivers
//! and answers for every task id a caller names. Bounded per owner, per id and in all.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::auth::Principal;
use crate::message::{self, Checked, Kind};
use crate::methods;
use crate::metrics::DropReason;
use crate::routed_id::{Mark, SessionId};
use crate::router::CreatedTask;

/// A task id longer than this is delivered but recorded as nobody's.
pub(crate) const MAX_TASK_ID: usize = 256;

/// Cursors of `tasks/list` remembered per owner (the oldest forgotten first).
const MAX_CURSORS: usize = 64;

/// The `_meta` key by which a message says which task it belongs to; a backend routes the
/// message (and what answers it) into that task.
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// Owners the table holds at once. Sessions are bounded by `--max-sessions` and forgotten
/// when they end; the principals of 2026-07-28 requests never end, so a new owner past it
/// takes the place of the principal owner used least recently (its tasks and cursors
/// forgotten); only when every owner is a session is a new owner's task nobody's.
const MAX_OWNERS: usize = 65_536;

/// Who a task belongs to: the 2025 session whose request created it, or the principal
/// of a 2026-07-28 request (which has no session).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Owner {
    Session(SessionId),
    Principal(Principal),
}

#[derive(Debug)]
struct Task {
    owner: Owner,
    /// Its place in its owner's creation order.
    seq: u64,
    /// When its `ttl` runs out (`None`: when its owner ends).
    expires: Option<Instant>,
}

/// What one owner holds: its tasks in creation order and the cursors minted for it.
#[derive(Debug, Default)]
struct Holdings {
    tasks: BTreeMap<u64, String>,
    /// (minted cursor, the backend's cursor), oldest first.
    cursors: VecDeque<(String, String)>,
    /// When the owner last created, listed or named a task (the table's counter then):
    /// the least recent principal gives way when the table is full.
    used: u64,
}

/// The task table: task id → owner, and each owner's tasks and cursors.
#[derive(Debug)]
pub(crate) struct Tasks {
    tasks: HashMap<String, Task>,
    owners: HashMap<Owner, Holdings>,
    max_per_owner: usize,
    next: u64,
}

/// What the proxy does with a client's message before the router (SPEC section 15).
#[derive(Debug)]
pub(crate) enum Asked {
    /// It goes to the backend, its id marked so.
    Forward(Mark),
    /// This goes to the backend instead: a `tasks/list` whose cursor was mapped back to
    /// the backend's, marked for filtering.
    Rewritten(Box<Checked>),
    /// The proxy answers with this response (counted by the reason).
    Answer(Vec<u8>, DropReason),
    /// A client notification the backend is not given: accepted and dropped (counted by
    /// the reason).
    Dropped(DropReason),
}

impl Asked {
    /// Whether the proxy's answer refuses the request (audited as a denial).
    pub(crate) fn refuses(reason: DropReason) -> bool {
        matches!(reason, DropReason::ForeignTask | DropReason::UnknownMethod)
    }
}

/// A `tasks/list` result filtered for its caller.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Listed {
    /// The result's JSON text.
    pub(crate) result: String,
    /// How many of the backend's entries were left out.
    pub(crate) hidden: u64,
}

impl Tasks {
    pub(crate) fn new(max_per_owner: usize) -> Self {
        Tasks {
            tasks: HashMap::new(),
            owners: HashMap::new(),
            max_per_owner: max_per_owner.max(1),
            next: 1,
        }
    }

    /// `--max-tasks-per-owner` after a reload: an owner past a lowered bound forgets its
    /// oldest tasks at once, down to it.
    pub(crate) fn set_max(&mut self, max_per_owner: usize) {
        self.max_per_owner = max_per_owner.max(1);
        for holdings in self.owners.values_mut() {
            while holdings.tasks.len() > self.max_per_owner {
                if let Some((_, oldest)) = holdings.tasks.pop_first() {
                    self.tasks.remove(&oldest);
                }
            }
        }
    }

    /// `owner` was delivered the result that created `task`: the task is its own, the
    /// owner's oldest forgotten past `--max-tasks-per-owner`. A task id over
    /// [`MAX_TASK_ID`] bytes, one already held, or one with no room in [`MAX_OWNERS`],
    /// stays nobody's.
    pub(crate) fn created(&mut self, now: Instant, owner: Owner, task: &CreatedTask) {
        if task.id.len() > MAX_TASK_ID || self.tasks.contains_key(&task.id) {
            return;
        }
        let max = self.max_per_owner;
        let Some((seq, holdings)) = self.place(&owner) else {
            return;
        };
        holdings.tasks.insert(seq, task.id.clone());
        let evicted = (holdings.tasks.len() > max)
            .then(|| holdings.tasks.pop_first())
            .flatten();
        if let Some((_, oldest)) = evicted {
            self.tasks.remove(&oldest);
        }
        let expires = (task.ttl_ms).and_then(|ms| now.checked_add(Duration::from_millis(ms)));
        let record = Task {
            owner,
            seq,
            expires,
        };
        self.tasks.insert(task.id.clone(), record);
    }

    /// Whether `owner` owns task `id` now (a task whose `ttl` ran out is forgotten).
    pub(crate) fn owns(&mut self, now: Instant, owner: &Owner, id: &str) -> bool {
        self.owner_of(now, id) == Some(owner)
    }

    /// Who owns task `id` now, if anyone.
    pub(crate) fn owner_of(&mut self, now: Instant, id: &str) -> Option<&Owner> {
        let expired = self.tasks.get(id)?.expires.is_some_and(|at| at <= now);
        if expired {
            self.forget(id);
            return None;
        }
        self.tasks.get(id).map(|task| &task.owner)
    }

    fn forget(&mut self, id: &str) {
        let Some(task) = self.tasks.remove(id) else {
            return;
        };
        if let Some(holdings) = self.owners.get_mut(&task.owner) {
            holdings.tasks.remove(&task.seq);
            if holdings.tasks.is_empty() && holdings.cursors.is_empty() {
                self.owners.remove(&task.owner);
            }
        }
    }

    /// The owner ended (its session closed, or a principal gave its place up): its tasks
    /// and cursors are forgotten.
    pub(crate) fn owner_ended(&mut self, owner: &Owner) {
        if let Some(holdings) = self.owners.remove(owner) {
            for id in holdings.tasks.values() {
                self.tasks.remove(id);
            }
        }
    }

    /// The backend process exited: its tasks are gone, and so is every record.
    pub(crate) fn clear(&mut self) {
        self.tasks.clear();
        self.owners.clear();
    }

    /// The backend's cursor for the cursor `minted` for `owner` (`None`: it was not
    /// given this cursor, or it was forgotten).
    pub(crate) fn cursor(&self, owner: &Owner, minted: &str) -> Option<&str> {
        let holdings = self.owners.get(owner)?;
        let (_, backend) = holdings.cursors.iter().find(|(m, _)| m == minted)?;
        Some(backend)
    }

    /// A `tasks/list` result for `owner`: only its own tasks kept in `tasks`, every other
    /// member kept, a `nextCursor` replaced by one minted for it. `None` when the result
    /// is not an object with a `tasks` array (it cannot be filtered, so it is not passed
    /// on).
    pub(crate) fn list_for(&mut self, now: Instant, owner: &Owner, result: &str) -> Option<Listed> {
        // Rebuilt from the result's own members, in order and byte for byte but for the
        // two it changes.
        let members = message::members(result)?;
        let (_, entries) = members.iter().find(|(key, _)| key == "tasks")?;
        let entries: Vec<&serde_json::value::RawValue> = serde_json::from_str(entries).ok()?;
        let before = entries.len() as u64;
        let mine: Vec<&str> = (entries.into_iter())
            .map(|entry| entry.get())
            .filter(|entry| {
                let members = message::members(entry).unwrap_or_default();
                let id = members.iter().find(|(key, _)| key == "taskId");
                let id = id.and_then(|(_, id)| serde_json::from_str::<String>(id).ok());
                id.is_some_and(|id| self.owns(now, owner, &id))
            })
            .collect();
        let hidden = before - mine.len() as u64;
        let mut out = String::with_capacity(result.len());
        out.push('{');
        for (key, value) in &members {
            let value = match &**key {
                "tasks" => format!("[{}]", mine.join(",")),
                "nextCursor" => match serde_json::from_str::<String>(value) {
                    Ok(backend) => Value::from(self.mint_cursor(owner, backend)?).to_string(),
                    // A cursor that is not a string cannot be minted for: the last page.
                    Err(_) => "null".to_owned(),
                },
                _ => (*value).to_owned(),
            };
            message::push_key(&mut out, key);
            out.push_str(&value);
        }
        out.push('}');
        Some(Listed {
            result: out,
            hidden,
        })
    }

    /// Whether `owner` has a place in the table: it holds one, there is room, or the
    /// principal owner used least recently gave its place up (a scan, only when full).
    /// A live session's place is never taken.
    fn make_room(&mut self, owner: &Owner) -> bool {
        if self.owners.contains_key(owner) || self.owners.len() < MAX_OWNERS {
            return true;
        }
        let idle = (self.owners.iter())
            .filter(|(owner, _)| matches!(owner, Owner::Principal(_)))
            .min_by_key(|(_, holdings)| holdings.used)
            .map(|(owner, _)| owner.clone());
        match idle {
            Some(idle) => {
                self.owner_ended(&idle);
                true
            }
            None => false,
        }
    }

    /// `owner`'s holdings, made room for, with the next number (a task's order, a cursor's
    /// name), noted as its latest use; `None` when the table has no room for it.
    fn place(&mut self, owner: &Owner) -> Option<(u64, &mut Holdings)> {
        if !self.make_room(owner) {
            return None;
        }
        let seq = self.next;
        self.next += 1;
        let holdings = self.owners.entry(owner.clone()).or_default();
        holdings.used = seq;
        Some((seq, holdings))
    }

    /// A cursor for `owner` standing for the backend's `backend`.
    fn mint_cursor(&mut self, owner: &Owner, backend: String) -> Option<String> {
        let (seq, holdings) = self.place(owner)?;
        let minted = format!("switchboard-tasks-{seq}");
        if holdings.cursors.len() >= MAX_CURSORS {
            holdings.cursors.pop_front();
        }
        holdings.cursors.push_back((minted.clone(), backend));
        Some(minted)
    }

    /// What `owner`'s message `msg` becomes (SPEC section 15), `passed` the methods the
    /// operator forwards although MCP does not define them: a task it does not own and a
    /// method nobody passed are answered here; a notification nobody passed is dropped;
    /// `logging/setLevel` is answered `{}`; a `tasks/list` is marked for filtering (its
    /// cursor, if one was minted for this owner, mapped back). A message that would be
    /// forwarded but names, in `params._meta`, a related task it does not own is answered
    /// as a foreign `tasks/get` is (a notification dropped): the backend would file it,
    /// and what answers it, under that task.
    pub(crate) fn ask(
        &mut self,
        now: Instant,
        owner: &Owner,
        msg: &Checked,
        passed: &std::collections::BTreeSet<String>,
    ) -> Asked {
        // Only a principal's place can be given up, so only a principal's use is noted.
        if matches!(owner, Owner::Principal(_)) {
            if let Some(holdings) = self.owners.get_mut(owner) {
                holdings.used = self.next;
            }
        }
        let asked = self.decide(now, owner, msg, passed);
        if !matches!(asked, Asked::Forward(_) | Asked::Rewritten(_)) {
            return asked;
        }
        match related_task(msg) {
            Some(task) if !task.as_deref().is_some_and(|id| self.owns(now, owner, id)) => {
                match msg.kind {
                    Kind::Request => {
                        Asked::Answer(msg.error(-32602, "Task not found"), DropReason::ForeignTask)
                    }
                    _ => Asked::Dropped(DropReason::ForeignTask),
                }
            }
            _ => asked,
        }
    }

    /// [`Tasks::ask`] by method alone.
    fn decide(
        &mut self,
        now: Instant,
        owner: &Owner,
        msg: &Checked,
        passed: &std::collections::BTreeSet<String>,
    ) -> Asked {
        let method = msg.method.as_str();
        if msg.kind != Kind::Request {
            return match methods::is_notification(method) || passed.contains(method) {
                true => Asked::Forward(Mark::Plain),
                false => Asked::Dropped(DropReason::ClientNotification),
            };
        }
        let modern = msg.modern.is_some();
        match method {
            "logging/setLevel" if !modern => Asked::Answer(msg.result("{}"), DropReason::LogLevel),
            "tasks/get" | "tasks/result" | "tasks/cancel" => {
                match (msg.task.as_deref()).is_some_and(|id| self.owns(now, owner, id)) {
                    true => Asked::Forward(Mark::Plain),
                    false => {
                        Asked::Answer(msg.error(-32602, "Task not found"), DropReason::ForeignTask)
                    }
                }
            }
            "tasks/list" => self.list_asked(owner, msg),
            _ if !methods::is_request(method, modern) && !passed.contains(method) => Asked::Answer(
                msg.error(-32601, "Method not found"),
                DropReason::UnknownMethod,
            ),
            _ => Asked::Forward(Mark::Plain),
        }
    }

    /// A `tasks/list`: forwarded marked, a cursor minted for `owner` mapped back to the
    /// backend's; any other cursor is refused.
    fn list_asked(&self, owner: &Owner, msg: &Checked) -> Asked {
        let invalid =
            || Asked::Answer(msg.error(-32602, "Invalid cursor"), DropReason::ForeignTask);
        let Some(raw) = cursor_in(&msg.text) else {
            return Asked::Forward(Mark::Tasks);
        };
        let minted: Option<String> = serde_json::from_str(raw).ok();
        let Some(backend) = minted.and_then(|m| self.cursor(owner, &m).map(str::to_owned)) else {
            return invalid();
        };
        // `raw` lies inside `msg.text`: its place is where it starts in it.
        let at = raw.as_ptr() as usize - msg.text.as_ptr() as usize;
        let value = Value::from(backend).to_string();
        let text = [&msg.text[..at], &value, &msg.text[at + raw.len()..]].concat();
        match msg.edited(text) {
            Ok(edited) => Asked::Rewritten(Box::new(edited)),
            Err(_) => invalid(),
        }
    }

    /// Tasks held, and owners (for the tests' table sizes).
    pub(crate) fn sizes(&self) -> (usize, usize) {
        (self.tasks.len(), self.owners.len())
    }

    /// Every task id `owner` holds (for the model's checks).
    #[cfg(test)]
    pub(crate) fn of(&self, owner: &Owner) -> std::collections::BTreeSet<String> {
        (self.owners.get(owner))
            .map(|h| h.tasks.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// The task `msg` names in `params._meta` (keys read as decoded, so escapes cannot hide
/// it): `None` when it names none, `Some(None)` when its `taskId` is not a string (or
/// missing). A 2026-07-28 request has none: its reserved keys were removed.
fn related_task(msg: &Checked) -> Option<Option<String>> {
    let meta = &msg.text[msg.meta.clone()?];
    let (_, related) = message::members(meta)?
        .into_iter()
        .find(|(k, _)| k == RELATED_TASK)?;
    let id = message::members(related)
        .and_then(|m| m.into_iter().find(|(k, _)| k == "taskId"))
        .and_then(|(_, id)| serde_json::from_str::<String>(id).ok());
    Some(id)
}

/// The raw text of `params.cursor` in message `text`, unless missing or `null`.
fn cursor_in(text: &str) -> Option<&str> {
    let (_, params) = message::members(text)?
        .into_iter()
        .find(|(k, _)| k == "params")?;
    let (_, cursor) = message::members(params)?
        .into_iter()
        .find(|(k, _)| k == "cursor")?;
    (cursor != "null").then_some(cursor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Instant {
        #[allow(clippy::disallowed_methods)] // the test's one origin of time
        Instant::now()
    }

    fn session(n: u8) -> Owner {
        Owner::Session(SessionId::from_random([n; 16]))
    }

    fn created(id: &str, ttl_ms: Option<u64>) -> CreatedTask {
        CreatedTask {
            id: id.into(),
            ttl_ms,
        }
    }

    #[test]
    fn a_task_belongs_to_its_creator_alone() {
        let now = origin();
        let (a, b) = (session(1), session(2));
        let mut tasks = Tasks::new(10);
        tasks.created(now, a.clone(), &created("t1", None));
        assert!(tasks.owns(now, &a, "t1"));
        assert!(!tasks.owns(now, &b, "t1"));
        assert!(!tasks.owns(now, &a, "t2"));
        // Created again for another: still the first's.
        tasks.created(now, b.clone(), &created("t1", None));
        assert!(tasks.owns(now, &a, "t1") && !tasks.owns(now, &b, "t1"));
        tasks.owner_ended(&a);
        assert!(!tasks.owns(now, &a, "t1") && !tasks.owns(now, &b, "t1"));
        assert_eq!(tasks.sizes(), (0, 0));
    }

    #[test]
    fn bounds_ttl_and_long_ids() {
        let now = origin();
        let a = session(1);
        let mut tasks = Tasks::new(2);
        for id in ["t1", "t2", "t3"] {
            tasks.created(now, a.clone(), &created(id, None));
        }
        assert_eq!(tasks.of(&a), ["t2", "t3"].map(String::from).into());
        tasks.created(now, session(2), &created(&"x".repeat(257), None));
        assert!(!tasks.owns(now, &session(2), &"x".repeat(257)));
        tasks.created(now, session(3), &created("short", Some(1000)));
        assert!(tasks.owns(now, &session(3), "short"));
        let later = now + Duration::from_millis(1000);
        assert!(!tasks.owns(later, &session(3), "short"));
        assert_eq!(tasks.sizes(), (2, 1));
        tasks.clear();
        assert_eq!(tasks.sizes(), (0, 0));
    }

    #[test]
    fn a_lowered_bound_trims_every_owner_at_once() {
        let now = origin();
        let (a, b) = (session(1), session(2));
        let mut tasks = Tasks::new(3);
        for id in ["a1", "a2", "a3"] {
            tasks.created(now, a.clone(), &created(id, None));
        }
        tasks.created(now, b.clone(), &created("b1", None));
        tasks.set_max(1);
        assert_eq!(tasks.of(&a), ["a3"].map(String::from).into());
        assert_eq!(tasks.of(&b), ["b1"].map(String::from).into());
        assert!(!tasks.owns(now, &a, "a1") && !tasks.owns(now, &a, "a2"));
        assert_eq!(tasks.sizes(), (2, 2));
    }

    #[test]
    fn a_full_table_gives_the_least_recently_used_principals_place_to_a_new_owner() {
        let now = origin();
        let principal = |n: usize| Owner::Principal(Principal::new(&format!("p{n}")));
        let mut tasks = Tasks::new(10);
        tasks.created(now, session(1), &created("s", None));
        for n in 1..MAX_OWNERS {
            tasks.created(now, principal(n), &created(&format!("t{n}"), None));
        }
        assert_eq!(tasks.sizes(), (MAX_OWNERS, MAX_OWNERS));
        // p1 asks about its task: p2 is now the least recently used.
        let get = r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"t1"}}"#;
        let get = Checked::admit(get.into()).unwrap();
        let asked = tasks.ask(now, &principal(1), &get, &Default::default());
        assert!(matches!(asked, Asked::Forward(_)));
        tasks.created(now, principal(0), &created("new", None));
        assert!(tasks.owns(now, &principal(0), "new"));
        assert!(!tasks.owns(now, &principal(2), "t2"));
        assert!(tasks.owns(now, &principal(1), "t1") && tasks.owns(now, &session(1), "s"));
        assert_eq!(tasks.sizes(), (MAX_OWNERS, MAX_OWNERS));
    }

    #[test]
    fn a_list_shows_only_its_callers_tasks_and_mints_its_cursor() {
        let now = origin();
        let (a, b) = (session(1), session(2));
        let mut tasks = Tasks::new(10);
        tasks.created(now, a.clone(), &created("ta", None));
        tasks.created(now, b.clone(), &created("tb", None));
        let result = r#"{"tasks":[{"taskId":"ta","status":"working"},{"taskId":"tb"},{"x":1}],"nextCursor":"tb","_meta":{"k":1}}"#;
        let listed = tasks.list_for(now, &a, result).unwrap();
        let value: Value = serde_json::from_str(&listed.result).unwrap();
        assert_eq!(
            value["tasks"],
            serde_json::json!([{"taskId":"ta","status":"working"}])
        );
        assert_eq!(value["_meta"], serde_json::json!({"k":1}));
        assert_eq!(listed.hidden, 2);
        let cursor = value["nextCursor"].as_str().unwrap();
        assert!(!cursor.contains("tb"));
        assert_eq!(tasks.cursor(&a, cursor), Some("tb"));
        assert_eq!(tasks.cursor(&b, cursor), None);
        assert!(tasks.list_for(now, &a, r#"{"tasks":3}"#).is_none());
        assert!(tasks.list_for(now, &a, "[]").is_none());
    }
}
