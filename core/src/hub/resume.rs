//! The events of a Streamable session's SSE streams, kept so that a client whose
//! connection dropped can resume a stream with `Last-Event-ID` (SPEC section 12): every
//! event is numbered within its stream, and the most recent ones are kept within a byte
//! budget per session and one for the whole proxy, oldest first out.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::message::IdKey;
use crate::output::StreamId;
use crate::principal::Principal;
use crate::settings::Settings;

/// A stream's number within its session; with an event's position it makes the event id
/// `<stream>.<position>`.
pub(crate) type StreamKey = u32;

/// What a Streamable stream carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Carries {
    /// The session's standalone GET stream.
    Get,
    /// The answer to this request (its key, and its id as the client wrote it).
    Request(IdKey, String),
}

/// One stream of the session, open or dropped.
#[derive(Debug)]
pub(crate) struct StreamLog {
    pub(crate) carries: Carries,
    /// The shell's stream it is written to now; `None` while its client is away.
    pub(crate) attached: Option<StreamId>,
    /// Its response was written: nothing follows, the stream ends after a replay.
    pub(crate) finished: bool,
    /// The position of the next event (the first is 1; 0 is the priming event).
    next: u64,
    /// Events up to this position are gone (evicted).
    gone_through: u64,
}

/// An event to replay: its id and the event without its id line.
pub(crate) type Replayed = (String, Arc<[u8]>);

/// What a session remembers of a request stream whose events expired.
#[derive(Debug, Clone)]
struct Expired {
    /// The request's id as the client wrote it.
    raw_id: String,
    /// The position of its answer, when the answer was written before the events went.
    answered_at: Option<u64>,
}

/// Why a `Last-Event-ID` cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unreplayable {
    /// It names no stream of this session.
    Unknown,
    /// Its stream's request, whose events are gone: the raw id to answer -32001 under.
    Lost(Option<String>),
    /// An expired stream resumed at or after its answer: the client has it; nothing more
    /// comes (a second, contradictory answer would break "at most once").
    Answered,
}

/// A session's event log.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    streams: BTreeMap<StreamKey, StreamLog>,
    /// Kept events, oldest first: (stream, position, the event without its id line).
    kept: VecDeque<(StreamKey, u64, Arc<[u8]>)>,
    bytes: usize,
    next_key: StreamKey,
    /// Request streams whose events expired, with the raw id of their request, until the
    /// session ends (at most [`MAX_EXPIRED`]).
    expired: BTreeMap<StreamKey, Expired>,
}

/// Expired request streams a session remembers, at most (the oldest are forgotten; resuming
/// one of those is then a 400, not a -32001).
const MAX_EXPIRED: usize = 1024;

/// Answered streams a session keeps for a client that may have missed their end, at most
/// (the oldest go first): what a session holds stays bounded by what is live, not by how
/// many requests it made within the window.
pub const MAX_FINISHED_KEPT: usize = 64;

/// The byte budgets events are kept within.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    /// Per session (`--resume-buffer`).
    pub(crate) session: usize,
    /// For the whole proxy.
    pub(crate) global: usize,
}

impl Budget {
    /// The budgets `settings` give; nothing is kept per session without a resume window.
    pub(crate) fn of(settings: &Settings) -> Self {
        let session = match settings.resume_window {
            Some(_) => settings.resume_buffer,
            None => 0,
        };
        Budget {
            session,
            global: settings.resume_global,
        }
    }
}

/// An event id as sent: `<stream>.<position>`.
pub(crate) fn event_id(key: StreamKey, position: u64) -> String {
    format!("{key}.{position}")
}

/// Reads an event id; `None` for anything this proxy never sent.
pub(crate) fn parse_event_id(text: &str) -> Option<(StreamKey, u64)> {
    let (key, position) = text.trim().split_once('.')?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 19 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(key) || !digits(position) {
        return None;
    }
    Some((key.parse().ok()?, position.parse().ok()?))
}

impl EventLog {
    /// A new stream carrying `carries`, written to `attached`.
    pub(crate) fn open(&mut self, carries: Carries, attached: StreamId) -> StreamKey {
        self.next_key += 1;
        let key = self.next_key;
        let log = StreamLog {
            carries,
            attached: Some(attached),
            finished: false,
            next: 1,
            gone_through: 0,
        };
        self.streams.insert(key, log);
        key
    }

    pub(crate) fn get(&self, key: StreamKey) -> Option<&StreamLog> {
        self.streams.get(&key)
    }

    pub(crate) fn get_mut(&mut self, key: StreamKey) -> Option<&mut StreamLog> {
        self.streams.get_mut(&key)
    }

    /// Keeps `event` as the next of stream `key`, evicting this session's oldest events
    /// past its budget `session` (the global cap is [`Holders`]'). Its id.
    pub(crate) fn push(
        &mut self,
        key: StreamKey,
        event: Arc<[u8]>,
        session: usize,
    ) -> Option<String> {
        let log = self.streams.get_mut(&key)?;
        let position = log.next;
        log.next += 1;
        self.bytes += event.len();
        self.kept.push_back((key, position, event));
        while self.bytes > session && self.evict_oldest() {}
        Some(event_id(key, position))
    }

    /// Evicts the oldest event kept; false if none was.
    pub(crate) fn evict_oldest(&mut self) -> bool {
        let Some((old_key, old_position, old)) = self.kept.pop_front() else {
            return false;
        };
        self.bytes -= old.len();
        if let Some(log) = self.streams.get_mut(&old_key) {
            log.gone_through = log.gone_through.max(old_position);
        }
        true
    }

    /// The events of stream `key` after `position`, with their ids.
    pub(crate) fn replay(
        &self,
        key: StreamKey,
        position: u64,
    ) -> Result<Vec<Replayed>, Unreplayable> {
        let Some(log) = self.streams.get(&key) else {
            return match self.expired.get(&key) {
                Some(e) if e.answered_at.is_some_and(|at| position >= at) => {
                    Err(Unreplayable::Answered)
                }
                Some(e) => Err(Unreplayable::Lost(Some(e.raw_id.clone()))),
                None => Err(Unreplayable::Unknown),
            };
        };
        if position >= log.next {
            return Err(Unreplayable::Unknown);
        }
        // A request's answer may be among the lost events; a GET stream carries
        // notifications, and what is left of them is replayed.
        let position = match &log.carries {
            Carries::Request(_, raw_id) if position < log.gone_through => {
                return Err(Unreplayable::Lost(Some(raw_id.clone())));
            }
            _ => position.max(log.gone_through),
        };
        Ok(self
            .kept
            .iter()
            .filter(|(k, p, _)| *k == key && *p > position)
            .map(|(k, p, event)| (event_id(*k, *p), event.clone()))
            .collect())
    }

    /// Forgets stream `key` and its events; a request stream is remembered as expired
    /// (its request's raw id) when `expired_id` is given.
    pub(crate) fn forget(&mut self, key: StreamKey, expired_id: Option<String>) {
        let answered_at = self
            .streams
            .remove(&key)
            .filter(|log| log.finished)
            .map(|log| log.next - 1);
        let mut freed = 0;
        self.kept.retain(|(k, _, event)| {
            let keep = *k != key;
            if !keep {
                freed += event.len();
            }
            keep
        });
        self.bytes -= freed;
        if let Some(raw_id) = expired_id {
            self.remember_expired(key, raw_id, answered_at);
        }
    }

    /// Remembers stream `key` as expired: its request's raw id to answer a resumption
    /// with, and where its answer was, if it was written.
    fn remember_expired(&mut self, key: StreamKey, raw_id: String, answered_at: Option<u64>) {
        if self.expired.len() >= MAX_EXPIRED {
            self.expired.pop_first();
        }
        let expired = Expired {
            raw_id,
            answered_at,
        };
        self.expired.insert(key, expired);
    }

    /// The oldest answered stream with no client, when more than [`MAX_FINISHED_KEPT`]
    /// are kept.
    pub(crate) fn finished_past_limit(&self) -> Option<StreamKey> {
        let mut finished = self
            .streams
            .iter()
            .filter(|(_, log)| log.finished && log.attached.is_none());
        let oldest = finished.next().map(|(key, _)| *key);
        (finished.count() + 1 > MAX_FINISHED_KEPT)
            .then_some(oldest)
            .flatten()
    }

    /// Every stream's number.
    pub(crate) fn keys(&self) -> Vec<StreamKey> {
        self.streams.keys().copied().collect()
    }

    /// Streams with a client attached.
    pub(crate) fn attached(&self) -> impl Iterator<Item = (StreamKey, StreamId)> + '_ {
        self.streams
            .iter()
            .filter_map(|(key, log)| log.attached.map(|s| (*key, s)))
    }

    /// Bytes kept.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Who holds the events kept for resumption, over every session, so that the global cap
/// takes from the principal holding the most (from its session holding the most): one
/// principal's many sessions cannot push every other principal's events out (SPEC section
/// 12). Each change is `O(log n)`: no scan over sessions. `S` names a session.
#[derive(Debug)]
pub(crate) struct Holders<S> {
    total: usize,
    principals: BTreeMap<Principal, Held<S>>,
    /// Principals by the bytes they hold.
    by_bytes: BTreeSet<(usize, Principal)>,
}

/// What one principal holds: in all, and per session (by bytes).
#[derive(Debug)]
struct Held<S> {
    bytes: usize,
    sessions: BTreeSet<(usize, S)>,
}

impl<S> Default for Holders<S> {
    fn default() -> Self {
        Holders {
            total: 0,
            principals: BTreeMap::new(),
            by_bytes: BTreeSet::new(),
        }
    }
}

impl<S: Ord + Copy> Holders<S> {
    /// Bytes kept over every session.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// Session `number` of `principal` now holds `after` bytes instead of `before`.
    pub(crate) fn moved(
        &mut self,
        principal: &Principal,
        number: S,
        (before, after): (usize, usize),
    ) {
        if before == after {
            return;
        }
        let held = (self.principals.entry(principal.clone())).or_insert_with(|| Held {
            bytes: 0,
            sessions: BTreeSet::new(),
        });
        self.by_bytes.remove(&(held.bytes, principal.clone()));
        held.sessions.remove(&(before, number));
        if after > 0 {
            held.sessions.insert((after, number));
        }
        held.bytes = held.bytes + after - before;
        self.total = self.total + after - before;
        if held.bytes == 0 {
            self.principals.remove(principal);
        } else {
            self.by_bytes.insert((held.bytes, principal.clone()));
        }
    }

    /// Where the global cap takes from first: the session holding the most of the
    /// principal holding the most.
    pub(crate) fn largest(&self) -> Option<(Principal, S)> {
        let (_, principal) = self.by_bytes.last()?;
        let (_, number) = self.principals.get(principal)?.sessions.last()?;
        Some((principal.clone(), *number))
    }

    /// Forgets everyone (every session ended at once).
    pub(crate) fn clear(&mut self) {
        *self = Holders::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_one_stream_within_its_budget() {
        let mut log = EventLog::default();
        let a = log.open(Carries::Get, StreamId(1));
        let b = log.open(
            Carries::Request(IdKey::of("1").unwrap(), "1".into()),
            StreamId(2),
        );
        for (key, event) in [(a, "aaaa"), (b, "bbbb"), (a, "cccc")] {
            log.push(key, Arc::from(event.as_bytes()), 10);
        }
        // 12 bytes against a budget of 10: the oldest event went.
        assert_eq!(log.bytes(), 8);
        // The GET stream lost its first event: what is left is replayed.
        let replayed = log.replay(a, 0).unwrap();
        assert_eq!(replayed.len(), 1);
        assert_eq!(replayed[0].0, "1.2");
        assert_eq!(log.replay(b, 0).unwrap()[0].0, "2.1");
        assert_eq!(log.replay(3, 0), Err(Unreplayable::Unknown));
        log.forget(b, Some("1".into()));
        assert_eq!(log.replay(b, 1), Err(Unreplayable::Lost(Some("1".into()))));
        log.forget(a, None);
        assert_eq!(log.bytes(), 0);
        assert_eq!(parse_event_id("12.3"), Some((12, 3)));
        assert_eq!(parse_event_id("12"), None);
        assert_eq!(parse_event_id("-1.2"), None);
    }

    #[test]
    fn the_global_cap_takes_from_the_largest_principal_first() {
        let (mallory, alice) = (Principal::new("mallory"), Principal::new("alice"));
        let n = |number: u64| number;
        let mut holders = Holders::default();
        // Mallory's three sessions hold 300 bytes in all, alice's one session 150.
        holders.moved(&mallory, n(1), (0, 100));
        holders.moved(&mallory, n(2), (0, 120));
        holders.moved(&mallory, n(3), (0, 80));
        holders.moved(&alice, n(4), (0, 150));
        assert_eq!(holders.total(), 450);
        // Alice's one session is the largest, but mallory holds the most: hers go first,
        // from her session holding the most.
        assert_eq!(holders.largest(), Some((mallory.clone(), n(2))));
        holders.moved(&mallory, n(2), (120, 0));
        holders.moved(&mallory, n(1), (100, 40));
        assert_eq!(holders.largest(), Some((alice.clone(), n(4))));
        holders.moved(&alice, n(4), (150, 0));
        holders.moved(&mallory, n(1), (40, 0));
        holders.moved(&mallory, n(3), (80, 0));
        assert_eq!((holders.total(), holders.largest()), (0, None));
        assert!(holders.principals.is_empty() && holders.by_bytes.is_empty());
    }
}
