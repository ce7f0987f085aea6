//! Lists read once (SPEC section 16): the backend sees one client, so its `tools/list`,
//! `prompts/list`, `resources/list` and `resources/templates/list` results are the same
//! for every caller until it says otherwise (`list_changed`). The router keeps the raw
//! results, by method and cursor, for the kinds the backend declared `listChanged`;
//! every caller's copy is still filtered and renamed for it on the way out, as a
//! backend answer is. A miss is fetched under the proxy's own id, shared by concurrent
//! callers; one caller's cancel or hang-up ends only its own wait.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::message::{self, Checked, Kind};
use crate::routed_id::{Mark, SessionId};

/// What a cached list is keyed by: its method and the cursor it was asked with (raw
/// JSON text; `None`: the first page).
pub(crate) type Key = (&'static str, Option<String>);

/// A caller waiting for a fetched list: its routing key, its id as it wrote it, and what
/// its answer needs on the way out.
#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    pub(crate) session: SessionId,
    pub(crate) raw_id: String,
    pub(crate) mark: Mark,
}

/// One fetch at the backend, under the proxy's id.
#[derive(Debug)]
struct Fetch {
    key: Key,
    waiters: Vec<Waiter>,
    /// A `list_changed` came while it was out: its answer is given, not kept.
    stale: bool,
}

/// What a list request becomes.
#[derive(Debug)]
pub(crate) enum Listed {
    /// Not cached (the cache is off, the kind is not declared `listChanged`, or the request
    /// carries params the cache does not key by): forwarded as any request.
    Pass,
    /// Answered from the cache: the raw result.
    Hit(Arc<str>),
    /// A fetch for it is out: it waits with the others.
    Shared,
    /// Fetched now: the proxy's request for it, under the number `fetch`.
    Miss { fetch: u64, key: Key },
}

/// Fetches out at once, at most (each keyed by a cursor a client chose): past it a list
/// request goes to the backend as any request does, so a silent backend cannot make the
/// proxy hold waiters without bound (the router remembers 256 requests of each purpose).
const MAX_FETCHES: usize = 128;

/// Callers waiting for one fetch, at most: a waiter stays until the fetch is answered
/// (its caller may have timed out, cancelled or left long before), so past it a request
/// goes to the backend as any request does, and a backend that never answers one list
/// holds no more than [`MAX_FETCHES`] × this many.
const MAX_WAITERS: usize = 256;

/// The longest cursor (its JSON text) a list is kept or shared under: a cursor is the
/// client's text, up to `--max-body`, and a backend that answers every unknown cursor
/// with its whole list would otherwise have the cache hold each one; past it a list
/// request goes to the backend as any request does. A backend's own cursors are short.
const MAX_CURSOR: usize = 1024;

/// Counters for `/metrics`: by method, hits, misses, shared.
pub(crate) type Counts = BTreeMap<&'static str, [u64; 3]>;

/// The list cache.
#[derive(Debug, Default)]
pub(crate) struct Lists {
    /// `--list-cache on` and its byte budget.
    on: bool,
    budget: usize,
    /// Which kinds the backend declared `listChanged` for (tools, prompts, resources).
    declared: [bool; 3],
    /// Each kept result, with the use that last read it (its place in `order`).
    entries: BTreeMap<Key, (Arc<str>, u64)>,
    /// The kept keys by their last use, least recently used first: a hit moves one in
    /// O(log n), not a scan.
    order: BTreeMap<u64, Key>,
    /// Uses counted so far (each hit and each kept result takes the next).
    uses: u64,
    /// What the kept entries hold, counted against the budget: results and keys.
    bytes: usize,
    fetches: BTreeMap<u64, Fetch>,
    /// The fetch each key waits for.
    pending: BTreeMap<Key, u64>,
    pub(crate) counts: Counts,
}

/// The cached methods, and the kind (`declared`'s index) each belongs to.
const METHODS: [(&str, usize); 4] = [
    ("tools/list", 0),
    ("prompts/list", 1),
    ("resources/list", 2),
    ("resources/templates/list", 2),
];

/// Whether `method` is one the list cache may serve.
pub(crate) fn is_list(method: &str) -> bool {
    METHODS.iter().any(|(m, _)| *m == method)
}

impl Lists {
    /// `--list-cache` and `--list-cache-bytes` (at start and on reload; a cache turned
    /// off is emptied).
    pub(crate) fn configure(&mut self, on: bool, budget: usize) {
        (self.on, self.budget) = (on, budget);
        if !on {
            self.entries.clear();
            self.order.clear();
            self.bytes = 0;
        }
        // A smaller budget holds no more than itself from now on, not from the next list.
        self.trim(0);
    }

    /// The backend's `initialize` result: which kinds it declared `listChanged` for.
    pub(crate) fn declared_by(&mut self, result: &str) {
        let capability = |kind: &str| -> Option<bool> {
            let (_, caps) = message::members(result)?
                .into_iter()
                .find(|(k, _)| k == "capabilities")?;
            let (_, of) = message::members(caps)?
                .into_iter()
                .find(|(k, _)| k == kind)?;
            let (_, flag) = message::members(of)?
                .into_iter()
                .find(|(k, _)| k == "listChanged")?;
            Some(flag == "true")
        };
        self.declared = ["tools", "prompts", "resources"].map(|k| capability(k).unwrap_or(false));
    }

    /// What list request `msg` (to be answered to `waiter`) becomes.
    pub(crate) fn ask(
        &mut self,
        msg: &Checked,
        waiter: Waiter,
        next: impl FnOnce() -> u64,
    ) -> Listed {
        let Some(key) = self.key_of(msg) else {
            return Listed::Pass;
        };
        let count = self.counts.entry(key.0).or_default();
        if let Some((result, used)) = self.entries.get_mut(&key) {
            count[0] += 1;
            let result = result.clone();
            self.uses += 1;
            let key = (self.order.remove(used)).expect("every entry is in the order");
            *used = self.uses;
            self.order.insert(self.uses, key);
            return Listed::Hit(result);
        }
        if let Some(fetch) = self.pending.get(&key).and_then(|n| self.fetches.get_mut(n)) {
            if fetch.waiters.len() >= MAX_WAITERS {
                return Listed::Pass;
            }
            count[2] += 1;
            fetch.waiters.push(waiter);
            return Listed::Shared;
        }
        if self.fetches.len() >= MAX_FETCHES {
            return Listed::Pass;
        }
        count[1] += 1;
        let fetch = next();
        self.pending.insert(key.clone(), fetch);
        let waiters = vec![waiter];
        self.fetches.insert(
            fetch,
            Fetch {
                key: key.clone(),
                waiters,
                stale: false,
            },
        );
        Listed::Miss { fetch, key }
    }

    /// The key of a list request the cache serves: a cached kind the backend declared,
    /// no params but a cursor (and `_meta`), the cursor no longer than [`MAX_CURSOR`].
    fn key_of(&self, msg: &Checked) -> Option<Key> {
        if !self.on || msg.kind != Kind::Request {
            return None;
        }
        let (method, kind) = METHODS.into_iter().find(|(m, _)| *m == msg.method)?;
        if !self.declared[kind] {
            return None;
        }
        let members = message::members(&msg.text)?;
        let cursor = match members.iter().find(|(k, _)| k == "params") {
            None => None,
            Some((_, params)) => {
                let params = message::members(params)?;
                if params.iter().any(|(k, _)| k != "cursor" && k != "_meta") {
                    return None;
                }
                let cursor = params.iter().find(|(k, _)| k == "cursor");
                match cursor {
                    Some((_, c)) if c.len() > MAX_CURSOR => return None,
                    cursor => cursor.map(|(_, c)| (*c).to_owned()).filter(|c| c != "null"),
                }
            }
        };
        Some((method, cursor))
    }

    /// The backend answered fetch `fetch` with `result` (`None`: an error, never kept):
    /// who waited for it. A result is kept unless a `list_changed` came meanwhile, or it
    /// alone is over the budget; the least recently used go first past it.
    pub(crate) fn fetched(&mut self, fetch: u64, result: Option<&str>) -> Vec<Waiter> {
        let Some(fetch) = self.fetches.remove(&fetch) else {
            return Vec::new();
        };
        if self.pending.get(&fetch.key).is_some_and(|_| !fetch.stale) {
            self.pending.remove(&fetch.key);
        }
        if let (Some(result), false) = (result, fetch.stale) {
            self.keep(fetch.key, result);
        }
        fetch.waiters
    }

    fn keep(&mut self, key: Key, result: &str) {
        let size = held(&key, result);
        if !self.on || size > self.budget {
            return;
        }
        self.forget(&key);
        self.trim(size);
        self.bytes += size;
        self.uses += 1;
        self.order.insert(self.uses, key.clone());
        self.entries.insert(key, (Arc::from(result), self.uses));
    }

    /// The least recently used go until `room` more bytes fit in the budget.
    fn trim(&mut self, room: usize) {
        while self.bytes + room > self.budget {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            if let Some((gone, _)) = self.entries.remove(&old) {
                self.bytes -= held(&old, &gone);
            }
        }
    }

    /// The backend's `notifications/<kind>/list_changed`: that kind's lists go; a fetch of
    /// it still out is answered to its waiters but not kept, and nobody joins it.
    pub(crate) fn changed(&mut self, notification: &str) {
        let kind = match notification {
            "notifications/tools/list_changed" => 0,
            "notifications/prompts/list_changed" => 1,
            "notifications/resources/list_changed" => 2,
            _ => return,
        };
        let of_kind = |key: &Key| METHODS.iter().any(|(m, k)| *m == key.0 && *k == kind);
        let gone: Vec<Key> = self
            .entries
            .keys()
            .filter(|k| of_kind(k))
            .cloned()
            .collect();
        for key in gone {
            self.forget(&key);
        }
        let stale: Vec<Key> = self
            .pending
            .keys()
            .filter(|k| of_kind(k))
            .cloned()
            .collect();
        for key in stale {
            if let Some(fetch) = self
                .pending
                .remove(&key)
                .and_then(|n| self.fetches.get_mut(&n))
            {
                fetch.stale = true;
            }
        }
    }

    fn forget(&mut self, key: &Key) {
        if let Some((gone, used)) = self.entries.remove(key) {
            self.bytes -= held(key, &gone);
            self.order.remove(&used);
        }
    }

    /// Everything goes: the backend exited (its fetches with it), or the shown tools
    /// changed.
    pub(crate) fn clear(&mut self, exited: bool) {
        self.entries.clear();
        self.order.clear();
        self.bytes = 0;
        if exited {
            self.fetches.clear();
            self.pending.clear();
            self.declared = [false; 3];
        } else {
            for fetch in self.fetches.values_mut() {
                fetch.stale = true;
            }
            self.pending.clear();
        }
    }
}

/// The bytes an entry holds, as the budget counts them: its result, and its cursor twice
/// (the entry's key and its place in the order each hold one).
fn held(key: &Key, result: &str) -> usize {
    result.len() + 2 * key.1.as_ref().map_or(0, String::len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(cursor: usize) -> Checked {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"cursor":"c{cursor}"}}}}"#
        );
        Checked::admit(body.into_bytes()).expect("a list request")
    }

    fn waiter() -> Waiter {
        Waiter {
            session: SessionId::from_random([1; 16]),
            raw_id: "1".into(),
            mark: Mark::Plain,
        }
    }

    #[test]
    fn a_silent_backend_holds_a_bounded_number_of_fetches() {
        let mut lists = Lists::default();
        lists.configure(true, 1 << 20);
        lists.declared_by(r#"{"capabilities":{"tools":{"listChanged":true}}}"#);
        let mut n = 0;
        let mut outcomes = Vec::new();
        for cursor in 0..200 {
            let asked = lists.ask(&list(cursor), waiter(), || {
                n += 1;
                n
            });
            outcomes.push(matches!(asked, Listed::Miss { .. }));
        }
        assert_eq!(outcomes.iter().filter(|m| **m).count(), MAX_FETCHES);
        assert!(matches!(
            lists.ask(&list(0), waiter(), || 0),
            Listed::Shared
        ));
        // An answer frees its place.
        assert_eq!(lists.fetched(1, Some(r#"{"tools":[]}"#)).len(), 2);
        assert!(matches!(
            lists.ask(&list(500), waiter(), || 999),
            Listed::Miss { .. }
        ));
        assert!(matches!(
            lists.ask(&list(0), waiter(), || 0),
            Listed::Hit(_)
        ));
    }

    #[test]
    fn a_silent_backend_holds_a_bounded_number_of_waiters() {
        let mut lists = Lists::default();
        lists.configure(true, 1 << 20);
        lists.declared_by(r#"{"capabilities":{"tools":{"listChanged":true}}}"#);
        assert!(matches!(
            lists.ask(&list(0), waiter(), || 1),
            Listed::Miss { .. }
        ));
        // Callers that time out and ask again, or come from new sessions, each wait: up
        // to the bound, then they go to the backend themselves.
        let asked: Vec<Listed> = (0..1000)
            .map(|_| lists.ask(&list(0), waiter(), || unreachable!("one fetch")))
            .collect();
        let shared = asked.iter().filter(|a| matches!(a, Listed::Shared)).count();
        assert_eq!(shared, MAX_WAITERS - 1);
        assert!(matches!(asked.last(), Some(Listed::Pass)));
        assert_eq!(lists.fetched(1, Some(r#"{"tools":[]}"#)).len(), MAX_WAITERS);
    }
}
