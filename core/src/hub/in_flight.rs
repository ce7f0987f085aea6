//! Every request in flight, of both transports: what each client is still owed an answer
//! for, keyed by who asked (classified once, on the way in) and the id it wrote, with its
//! progress token and its one deadline. A legacy request is kept only to answer it should
//! the backend restart first and to audit it; its route back stays in its routed id.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::deadlines::Deadlines;
use super::exchanges::Started;
use super::resume::StreamKey;
use super::sessions::SessionNumber;
use crate::admission;
use crate::audit::Outcome;
use crate::auth::Principal;
use crate::http::Grant;
use crate::message::{Checked, IdKey};
use crate::output::{RequestId, StreamId};
use crate::routed_id::{Instance, Mark, SessionId};

/// A 2026-07-28 request's own routing key (SPEC section 13): minted for it alone and
/// written where a session's id goes in a routed id (`<key>|n:<id>`), so its answer and
/// its progress come back to it; it names no session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct RequestKey(SessionId);

impl RequestKey {
    pub(crate) fn mint(instance: Option<&Instance>, entropy: [u8; 16]) -> Self {
        RequestKey(SessionId::mint(instance, entropy))
    }

    /// The key a route back names when no session holds it.
    pub(crate) fn routed(route: SessionId) -> Self {
        RequestKey(route)
    }

    /// What its routed ids carry before the id.
    pub(crate) fn route(&self) -> &SessionId {
        &self.0
    }
}

/// Who a request in flight belongs to. A request without a session (answered on its own
/// exchange) gets a variant of its own; the table does not care which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Caller {
    Session(SessionNumber),
    /// A 2026-07-28 request, by the routing key minted for it alone (SPEC section 13).
    Modern(RequestKey),
}

impl Caller {
    /// The session of a 2025 request.
    pub(crate) fn session(self) -> Option<SessionNumber> {
        match self {
            Caller::Session(number) => Some(number),
            Caller::Modern(_) => None,
        }
    }
}

impl From<SessionNumber> for Caller {
    fn from(number: SessionNumber) -> Self {
        Caller::Session(number)
    }
}

/// Legacy requests awaited no longer, each with when it expired.
pub(crate) type Expired = Vec<(Instant, Entry)>;

/// A request awaiting its answer.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The id as the client wrote it.
    pub(crate) raw_id: String,
    /// When it came.
    pub(crate) at: Instant,
    /// The HTTP exchange waiting for the answer; `None` for a legacy request, whose answer
    /// goes to its session's stream.
    pub(crate) exchange: Option<RequestId>,
    /// Its SSE stream, when the answer is a stream (else a JSON body).
    pub(crate) stream: Option<StreamKey>,
    /// Its progress token, if it carries one.
    pub(crate) token: Option<IdKey>,
    /// Its audit context.
    pub(crate) audit: Option<Box<Started>>,
    /// An `initialize` that opens its session: the session opens only if it gets a
    /// result; until then it is held back, and so is its stream.
    pub(crate) opens: Option<Opens>,
    /// What its routed id was marked for (a list to filter, a task list): the proxy's own
    /// cancellation names the same routed id.
    pub(crate) mark: Mark,
}

impl Entry {
    /// A legacy request: answered on its session's stream.
    pub(crate) fn legacy(raw_id: String, at: Instant, audit: Option<Box<Started>>) -> Self {
        Entry {
            raw_id,
            at,
            exchange: None,
            stream: None,
            token: None,
            audit,
            opens: None,
            mark: Mark::Plain,
        }
    }

    /// A request never forwarded (it waited for the backend, or its answer is the proxy's
    /// stream): only its observation context, to settle.
    pub(crate) fn unforwarded(audit: Box<Started>, at: Instant) -> Self {
        Entry::legacy(String::new(), at, Some(audit))
    }

    /// A Streamable request `msg`, awaited on its own exchange `request` since `at`, with
    /// its stream (if its answer is one), its audit context and, for the `initialize` that
    /// opens its session, how that is answered.
    pub(crate) fn awaited(
        msg: &Checked,
        (at, request): (Instant, RequestId),
        stream: Option<StreamKey>,
        (audit, opens): (Option<Box<Started>>, Option<Opens>),
    ) -> Self {
        Entry {
            raw_id: msg.raw_id().to_owned(),
            at,
            exchange: Some(request),
            stream,
            token: msg.token.as_ref().map(|t| t.key.clone()),
            audit,
            opens,
            mark: Mark::Plain,
        }
    }

    /// The exchange of a request that has one (every Streamable request).
    pub(crate) fn exchange(&self) -> RequestId {
        self.exchange
            .expect("a request answered on its own exchange")
    }
}

/// A modern request awaiting its answer: what its answer needs that the in-flight entry
/// does not hold.
#[derive(Debug)]
pub(crate) struct Waiting {
    pub(crate) method: String,
    /// Its list result is filtered for its caller: always `private`.
    pub(crate) filtered: bool,
    pub(crate) principal: Principal,
    pub(crate) grant: Grant,
    pub(crate) exchange: RequestId,
    /// Its answer stream (progress, then the answer), when the answer is not a JSON body.
    pub(crate) stream: Option<StreamId>,
}

/// How a request owed an answer ends.
#[derive(Debug)]
pub(crate) enum Settlement {
    /// Answered with `message`, under the client's id: `outcome` is the proxy's verdict
    /// (`None`: the backend's answer, judged by its content); `status` is the HTTP status
    /// of a 2026-07-28 JSON answer.
    Answered {
        message: Vec<u8>,
        outcome: Option<Outcome>,
        status: u16,
    },
    /// Cancelled by its client: a Streamable request's stream ends, a JSON waiter is told
    /// -32800.
    Cancelled,
    /// Awaited no longer with nobody to tell: its client, its stream or its session gone
    /// for good, or (a legacy request) no longer kept.
    Gone,
}

impl Settlement {
    /// The backend's answer `message` (or the proxy's, `outcome` its verdict).
    pub(crate) fn answered(message: Vec<u8>, outcome: Option<Outcome>) -> Self {
        Settlement::Answered {
            message,
            outcome,
            status: 200,
        }
    }

    /// The proxy's error `code` (`text`) under the client's `raw_id`.
    pub(crate) fn error(raw_id: &str, code: i32, text: &str) -> Self {
        let message = crate::streamable::error_message(raw_id, code, text);
        Self::answered(message, Some(Outcome::Error))
    }
}

/// How the `initialize` that opens a session is answered once its answer is known: only a
/// result opens the session (and carries `Mcp-Session-Id`); an error leaves nothing behind.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Opens {
    /// Answered as a stream (primed for a 2025-11-25 client when `Some(true)`), else as
    /// JSON.
    pub(crate) stream: Option<bool>,
}

/// The in-flight part.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    requests: BTreeMap<Caller, BTreeMap<IdKey, Entry>>,
    /// Progress tokens of requests in flight, to the ids of the requests carrying each, in
    /// the order they came (a client may reuse a token; its progress goes to the newest).
    tokens: BTreeMap<(Caller, IdKey), Vec<IdKey>>,
    /// Request timeouts.
    timers: Deadlines<(Caller, IdKey)>,
}

impl InFlight {
    /// Request `key` of `caller`.
    pub(crate) fn get(&self, caller: impl Into<Caller>, key: &IdKey) -> Option<&Entry> {
        self.requests.get(&caller.into())?.get(key)
    }

    /// Request `key` of `caller`, to change its observation context.
    pub(crate) fn get_mut(&mut self, caller: impl Into<Caller>, key: &IdKey) -> Option<&mut Entry> {
        self.requests.get_mut(&caller.into())?.get_mut(key)
    }

    /// Requests of session `number` in flight.
    pub(crate) fn count(&self, number: SessionNumber) -> usize {
        self.requests
            .get(&Caller::Session(number))
            .map_or(0, BTreeMap::len)
    }

    /// What admission needs to know of session `number`'s requests in flight before it
    /// sends request `key`, within `max`.
    pub(crate) fn room(
        &self,
        number: SessionNumber,
        key: &IdKey,
        max: usize,
    ) -> admission::InFlight {
        admission::InFlight {
            id_taken: self.get(number, key).is_some(),
            count: (self.count(number), max),
        }
    }

    /// Awaits request `key` of session `number` (replacing one under the same id), its
    /// timeout due at `deadline`.
    pub(crate) fn insert(
        &mut self,
        caller: impl Into<Caller>,
        key: IdKey,
        entry: Entry,
        deadline: Option<Instant>,
    ) {
        let caller = caller.into();
        self.take(caller, &key);
        if let Some(token) = &entry.token {
            let carriers = self.tokens.entry((caller, token.clone())).or_default();
            carriers.push(key.clone());
        }
        if let Some(at) = deadline {
            self.timers.set((caller, key.clone()), at);
        }
        self.requests.entry(caller).or_default().insert(key, entry);
    }

    /// Keeps legacy request `key` of session `number` until its answer, to answer it
    /// should the backend restart first and to observe its outcome. Routing never needs
    /// it and nothing here refuses (SPEC sections 1 and 11), so what a client gets never
    /// depends on it. At most `max` per session: when the session's are that many or one
    /// holds its id, those unanswered for `timeout` are awaited no longer; an earlier
    /// request with its id is replaced; past `max` it is not kept. The observation
    /// contexts of those awaited no longer come back, each with when that happened.
    pub(crate) fn track(
        &mut self,
        now: Instant,
        (number, key): (SessionNumber, IdKey),
        entry: Entry,
        (max, timeout): (usize, Option<Duration>),
    ) -> Expired {
        let mut unawaited = Vec::new();
        let crowded = self.count(number) >= max || self.get(number, &key).is_some();
        if let (true, Some(timeout)) = (crowded, timeout) {
            let expired: Vec<IdKey> = (self.requests.get(&Caller::Session(number)))
                .into_iter()
                .flatten()
                .filter(|(_, e)| e.at + timeout <= now)
                .map(|(key, _)| key.clone())
                .collect();
            for key in expired {
                let entry = self.take(number, &key).expect("listed above");
                unawaited.push((entry.at + timeout, entry));
            }
        }
        if let Some(earlier) = self.take(number, &key) {
            unawaited.push((now, earlier));
        }
        if self.count(number) < max {
            self.insert(number, key, entry, None);
        } else {
            unawaited.push((now, entry));
        }
        unawaited
    }

    /// Removes request `key` of session `number`, its timeout and its claim on its
    /// progress token with it.
    pub(crate) fn take(&mut self, caller: impl Into<Caller>, key: &IdKey) -> Option<Entry> {
        let caller = caller.into();
        let requests = self.requests.get_mut(&caller)?;
        let (key, entry) = requests.remove_entry(key)?;
        if requests.is_empty() {
            self.requests.remove(&caller);
        }
        if let Some(token) = &entry.token {
            // Another request in flight that carries the same token keeps its progress.
            let claim = (caller, token.clone());
            if let Some(carriers) = self.tokens.get_mut(&claim) {
                carriers.retain(|k| *k != key);
                if carriers.is_empty() {
                    self.tokens.remove(&claim);
                }
            }
        }
        self.timers.remove(&(caller, key));
        Some(entry)
    }

    /// Request `key` of session `number`, answered on `stream`, is awaited no longer and
    /// will get no answer through the proxy (that stream is gone for good): its record,
    /// to settle. A later request that reuses the id (the first was answered) is not
    /// touched.
    pub(crate) fn abandon(
        &mut self,
        (number, stream): (SessionNumber, StreamKey),
        key: &IdKey,
    ) -> Option<Entry> {
        let entry = self.get(number, key)?;
        if entry.stream != Some(stream) {
            return None;
        }
        self.take(number, key)
    }

    /// Removes every request of session `number`, in id order.
    pub(crate) fn take_all(&mut self, number: SessionNumber) -> Vec<(IdKey, Entry)> {
        let keys: Vec<IdKey> = self
            .requests
            .get(&Caller::Session(number))
            .map(|r| r.keys().cloned().collect())
            .unwrap_or_default();
        let take = |key: IdKey| Some((key.clone(), self.take(number, &key)?));
        keys.into_iter().filter_map(take).collect()
    }

    /// Removes every 2026-07-28 request, in key order.
    pub(crate) fn take_modern(&mut self) -> Vec<(Caller, Entry)> {
        let keys: Vec<(Caller, IdKey)> = (self.requests.iter())
            .filter(|(caller, _)| matches!(caller, Caller::Modern(_)))
            .flat_map(|(caller, r)| r.keys().map(|key| (*caller, key.clone())))
            .collect();
        let take = |(caller, key): (Caller, IdKey)| Some((caller, self.take(caller, &key)?));
        keys.into_iter().filter_map(take).collect()
    }

    /// The ids of `caller`'s requests in flight.
    pub(crate) fn keys(&self, caller: Caller) -> Vec<IdKey> {
        (self.requests.get(&caller).into_iter())
            .flat_map(|r| r.keys().cloned())
            .collect()
    }

    /// Forgets every request (the sessions all ended).
    pub(crate) fn clear(&mut self) {
        *self = InFlight::default();
    }

    /// The newest request of session `number` in flight carrying progress `token`: its
    /// stream, if it has one; its timeout, if any, restarts at `now`.
    pub(crate) fn progress(
        &mut self,
        now: Instant,
        caller: impl Into<Caller>,
        token: &IdKey,
        timeout: Option<Duration>,
    ) -> Option<Option<StreamKey>> {
        let caller = caller.into();
        let key = self.tokens.get(&(caller, token.clone()))?.last()?.clone();
        let stream = self.get(caller, &key)?.stream;
        if let Some(timeout) = timeout {
            self.timers.set((caller, key), now + timeout);
        }
        Some(stream)
    }

    /// The next request timeout.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// The next request whose timeout is due at `now` (its timer gone, its entry kept).
    pub(crate) fn take_due(&mut self, now: Instant) -> Option<(Caller, IdKey)> {
        let (_, due) = self.timers.pop_due(now)?;
        Some(due)
    }

    /// Request timers set.
    pub(crate) fn timers(&self) -> usize {
        self.timers.len()
    }

    /// Requests answered on their own exchange, and the progress token claims among them
    /// (for the tests that check a session leaves nothing behind).
    pub(crate) fn sizes(&self) -> (usize, usize) {
        let entries = self.requests.values().flat_map(BTreeMap::values);
        let awaited = entries.filter(|e| e.exchange.is_some());
        let tokens = self.tokens.values().map(Vec::len).sum();
        (awaited.count(), tokens)
    }
}
