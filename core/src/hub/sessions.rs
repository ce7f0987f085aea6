//! The one table of live sessions, of both transports: who owns each, what kind it is,
//! what it watches, in creation order (the order every broadcast and close follows), and
//! the Streamable sessions' timers. No other part keeps a copy.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::deadlines::Deadlines;
use super::resume::{Budget, Carries, EventLog, Holders, StreamKey};
use crate::auth::Principal;
use crate::http::Rejection;
use crate::message::IdKey;
use crate::output::StreamId;
use crate::routed_id::SessionId;

/// Resource subscriptions one session may hold.
pub(crate) const MAX_SUBSCRIPTIONS_PER_SESSION: usize = 1024;

/// A session's creation number: sessions are kept, broadcast to and closed in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct SessionNumber(u64);

/// A turn in the stdin queue's fair share: a session's, or the one a principal's
/// 2026-07-28 requests take together (they belong to no session). Numbered from the
/// sessions' count, so lanes take turns in the order they were made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Lane(u64);

impl From<SessionNumber> for Lane {
    fn from(number: SessionNumber) -> Self {
        Lane(number.0)
    }
}

impl Lane {
    /// The lane numbered `n`, one no session holds.
    pub(crate) fn unheld(n: u64) -> Self {
        Lane(n)
    }
}

/// The two transports side by side (SPEC section 7).
#[derive(Debug)]
pub(crate) enum Kind {
    /// HTTP+SSE: the session is its one `/sse` stream.
    Legacy { stream: StreamId },
    /// Streamable HTTP: a standalone GET stream, and streams kept for resumption.
    Mcp(McpSession),
}

/// A Streamable session's own state beside the sessions table's (its requests in flight
/// are the in-flight part's).
#[derive(Debug, Default)]
pub(crate) struct McpSession {
    /// The standalone GET stream, at most one (its client may be away).
    pub(crate) get_stream: Option<StreamKey>,
    /// Every stream's events, for resumption.
    pub(crate) log: EventLog,
    /// The last request or stream end, for `--session-idle`.
    pub(crate) last_active: Option<Instant>,
    /// Its `initialize` is unanswered: it has not opened (no one may name it yet).
    pub(crate) opening: bool,
}

impl McpSession {
    /// Whether it may expire: no request in flight (`busy`) and no stream with its client
    /// there.
    pub(crate) fn is_quiet(&self, busy: bool) -> bool {
        !busy && self.log.attached().next().is_none()
    }
}

#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) id: SessionId,
    pub(crate) principal: Principal,
    pub(crate) kind: Kind,
    /// What its latest request's credential granted (scopes, claims): the list results
    /// of its requests are filtered for it.
    pub(crate) grant: crate::http::Grant,
    /// Where its opening request came from, for audit records.
    pub(crate) source: std::sync::Arc<crate::audit::Source>,
    /// Its client's `clientInfo`, from its `initialize` (audited sessions only).
    pub(crate) client: Option<std::sync::Arc<crate::audit::ClientInfo>>,
    /// The uris it watches (`resources/subscribe`).
    subscriptions: BTreeSet<String>,
    /// Its `initialize` got a result: a legacy session refuses another (400).
    pub(crate) initialized: bool,
}

/// A timer of a Streamable session that came due.
#[derive(Debug)]
pub(crate) enum SessionTimer {
    /// The session may have been idle for `--session-idle`.
    Idle(SessionNumber),
    /// A dropped (or finished) stream's `--resume-window` passed.
    Resume(SessionNumber, StreamKey),
}

/// How a Streamable stream lost its reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gone {
    /// Its connection dropped.
    ClientLeft,
    /// Its resume window passed with no client back.
    WindowPassed,
    /// A client resumed it past the events kept: its answer is lost.
    Lost,
    /// The hub let it go (replaced, cancelled, its session ending): nobody will resume it.
    Dropped,
}

/// What the hub carries out for a stream that lost its reader.
#[derive(Debug, Default)]
pub(crate) struct Unattended {
    /// The request it carried, awaited no longer.
    pub(crate) abandoned: Option<IdKey>,
    /// The shell's stream it was still written to, to end.
    pub(crate) attached: Option<StreamId>,
}

/// What a resumed stream leaves the hub to do.
#[derive(Debug)]
pub(crate) struct Reattached {
    /// The connection the hub still thought open, to end: the newer one carries it.
    pub(crate) previous: Option<StreamId>,
    /// The connection of the GET stream it replaced, to end.
    pub(crate) replaced: Option<StreamId>,
    /// Its request was answered: the stream ends after the replay.
    pub(crate) finished: bool,
}

/// The sessions part.
#[derive(Debug)]
pub(crate) struct Sessions {
    by_number: BTreeMap<SessionNumber, Session>,
    by_sid: BTreeMap<SessionId, SessionNumber>,
    /// Who watches each uri (kept in step with each session's own set, here only).
    subscribers: BTreeMap<String, BTreeSet<SessionId>>,
    /// Live sessions and listen streams per principal (principals with none are not
    /// listed).
    per_principal: BTreeMap<Principal, usize>,
    /// Open listen streams (SPEC section 13): each takes a session's room.
    listens: usize,
    next: u64,
    max: usize,
    /// Idle checks, at most one per Streamable session.
    pub(crate) idle_timers: Deadlines<SessionNumber>,
    /// Ends of the resume windows of dropped and finished Streamable streams.
    pub(crate) resume_timers: Deadlines<(SessionNumber, StreamKey)>,
    /// Who holds the events kept for resumption (the global cap's order of eviction).
    holders: Holders<SessionNumber>,
}

impl Sessions {
    /// A number no session holds: the turn in the stdin queue's fair share that one
    /// principal's 2026-07-28 requests take together (they belong to no session).
    pub(crate) fn lane(&mut self) -> Lane {
        let lane = Lane::unheld(self.next);
        self.next += 1;
        lane
    }

    pub(crate) fn new(max: usize) -> Self {
        Sessions {
            by_number: BTreeMap::new(),
            by_sid: BTreeMap::new(),
            subscribers: BTreeMap::new(),
            per_principal: BTreeMap::new(),
            listens: 0,
            next: 1,
            max,
            idle_timers: Deadlines::default(),
            resume_timers: Deadlines::default(),
            holders: Holders::default(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.by_number.len()
    }

    /// A reload's `--max-sessions`: sessions over it stay, new ones wait for room.
    pub(crate) fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// Whether a new session (or listen stream) may open: 503 past `--max-sessions`.
    pub(crate) fn check_room(&self) -> Result<(), Rejection> {
        if self.by_number.len() + self.listens >= self.max {
            return Err(Rejection::TooManySessions);
        }
        Ok(())
    }

    /// Adds a session of `principal` from `source`, numbered in creation order. A
    /// colliding id (128 random bits never collide) is refused rather than merged.
    pub(crate) fn open(
        &mut self,
        id: SessionId,
        principal: Principal,
        kind: Kind,
        source: std::sync::Arc<crate::audit::Source>,
    ) -> Result<SessionNumber, Rejection> {
        self.check_room()?;
        if self.by_sid.contains_key(&id) {
            return Err(Rejection::TooManySessions);
        }
        let number = SessionNumber(self.next);
        self.next += 1;
        *self.per_principal.entry(principal.clone()).or_default() += 1;
        let session = Session {
            id,
            principal,
            kind,
            grant: Default::default(),
            source,
            client: None,
            subscriptions: BTreeSet::new(),
            initialized: false,
        };
        self.by_number.insert(number, session);
        self.by_sid.insert(id, number);
        Ok(number)
    }

    /// The live session `sid` got a result for its `initialize`.
    pub(crate) fn initialized(&mut self, sid: &SessionId) {
        if let Some(session) = self.find(sid).and_then(|n| self.by_number.get_mut(&n)) {
            session.initialized = true;
        }
    }

    /// Removes a session: it, and the uris nobody watches any more (to unsubscribe).
    pub(crate) fn close(&mut self, number: SessionNumber) -> Option<(Session, Vec<String>)> {
        let mut session = self.by_number.remove(&number)?;
        self.by_sid.remove(&session.id);
        if let Kind::Mcp(m) = &session.kind {
            let held = (m.log.bytes(), 0);
            self.holders.moved(&session.principal, number, held);
        }
        self.left(&session.principal);
        self.idle_timers.remove(&number);
        let mut released = Vec::new();
        for uri in std::mem::take(&mut session.subscriptions) {
            if let Some(set) = self.subscribers.get_mut(&uri) {
                set.remove(&session.id);
                if set.is_empty() {
                    self.subscribers.remove(&uri);
                    released.push(uri);
                }
            }
        }
        Some((session, released))
    }

    /// A listen stream of `principal` opened: it counts as one of its sessions.
    pub(crate) fn listen_opened(&mut self, principal: &Principal) {
        self.listens += 1;
        *self.per_principal.entry(principal.clone()).or_default() += 1;
    }

    /// A listen stream of `principal` ended.
    pub(crate) fn listen_ended(&mut self, principal: &Principal) {
        self.listens = self.listens.saturating_sub(1);
        self.left(principal);
    }

    /// One session or listen stream of `principal` is gone.
    fn left(&mut self, principal: &Principal) {
        if let Some(n) = self.per_principal.get_mut(principal) {
            *n -= 1;
            if *n == 0 {
                self.per_principal.remove(principal);
            }
        }
    }

    /// Removes every session in creation order (nothing is unsubscribed).
    pub(crate) fn close_all(&mut self) -> Vec<(SessionNumber, Session)> {
        self.by_sid.clear();
        self.subscribers.clear();
        self.per_principal.clear();
        self.idle_timers.clear();
        self.resume_timers.clear();
        self.holders.clear();
        std::mem::take(&mut self.by_number).into_iter().collect()
    }

    /// Principals with a live session (the per-principal counts kept).
    pub(crate) fn principals(&self) -> usize {
        self.per_principal.len()
    }

    /// Live sessions of `principal`.
    pub(crate) fn of(&self, principal: &Principal) -> usize {
        self.per_principal.get(principal).copied().unwrap_or(0)
    }

    pub(crate) fn get(&self, number: SessionNumber) -> Option<&Session> {
        self.by_number.get(&number)
    }

    pub(crate) fn get_mut(&mut self, number: SessionNumber) -> Option<&mut Session> {
        self.by_number.get_mut(&number)
    }

    /// The live session with this id.
    pub(crate) fn find(&self, sid: &SessionId) -> Option<SessionNumber> {
        self.by_sid.get(sid).copied()
    }

    /// Who owns session `sid` and what its latest credential granted: whom its list
    /// results are filtered for.
    pub(crate) fn caller(&self, sid: &SessionId) -> Option<(&Principal, &crate::http::Grant)> {
        let session = self.get(self.find(sid)?)?;
        Some((&session.principal, &session.grant))
    }

    /// The live session `text` names, if `principal` owns it: one 404 for unknown, closed
    /// and foreign sessions, so a caller learns nothing.
    pub(crate) fn authorize(
        &self,
        text: &str,
        principal: &Principal,
    ) -> Result<(SessionNumber, &Session), Rejection> {
        SessionId::parse(text)
            .and_then(|sid| self.find(&sid))
            .and_then(|n| self.by_number.get(&n).map(|s| (n, s)))
            .filter(|(_, s)| s.principal == *principal)
            .ok_or(Rejection::SessionNotFound)
    }

    /// Live sessions in creation order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SessionNumber, &Session)> {
        self.by_number.iter().map(|(n, s)| (*n, s))
    }

    /// The Streamable state of session `number`.
    pub(crate) fn mcp_mut(&mut self, number: SessionNumber) -> Option<&mut McpSession> {
        match &mut self.by_number.get_mut(&number)?.kind {
            Kind::Mcp(m) => Some(m),
            Kind::Legacy { .. } => None,
        }
    }

    pub(crate) fn mcp(&self, number: SessionNumber) -> Option<&McpSession> {
        match &self.by_number.get(&number)?.kind {
            Kind::Mcp(m) => Some(m),
            Kind::Legacy { .. } => None,
        }
    }

    /// Keeps `event` as the next of stream `key` of session `number` (its id), within the
    /// session's budget and the global one: past the global cap the oldest events of the
    /// principal holding the most go first (of its session holding the most), so that one
    /// principal's sessions cannot take every other's resumption (SPEC section 12).
    pub(crate) fn keep_event(
        &mut self,
        (number, key): (SessionNumber, StreamKey),
        event: std::sync::Arc<[u8]>,
        budget: Budget,
    ) -> Option<String> {
        let session = self.by_number.get_mut(&number)?;
        let Kind::Mcp(m) = &mut session.kind else {
            return None;
        };
        let before = m.log.bytes();
        let id = m.log.push(key, event, budget.session)?;
        let held = (before, m.log.bytes());
        self.holders.moved(&session.principal, number, held);
        while self.holders.total() > budget.global {
            let Some((principal, largest)) = self.holders.largest() else {
                break;
            };
            let Some(m) = self.mcp_mut(largest) else {
                break;
            };
            let before = m.log.bytes();
            if !m.log.evict_oldest() {
                break;
            }
            let held = (before, m.log.bytes());
            self.holders.moved(&principal, largest, held);
        }
        Some(id)
    }

    /// Stream `key` of session `number` was answered: it ends (the shell's stream it was
    /// written to, if any, is returned to end), its events stay for the resume `window`
    /// (a client cut off right at the end may still ask for them), and the oldest answered
    /// stream past [`MAX_FINISHED_KEPT`](super::resume::MAX_FINISHED_KEPT) goes.
    pub(crate) fn finish_stream(
        &mut self,
        now: Instant,
        (number, key): (SessionNumber, StreamKey),
        window: Option<Duration>,
    ) -> Option<StreamId> {
        let log = self.mcp_mut(number)?.log.get_mut(key)?;
        log.finished = true;
        let attached = log.attached.take();
        if attached.is_some() {
            self.keep_for_window(now, (number, key), window);
        }
        let oldest = self.mcp(number).and_then(|m| m.log.finished_past_limit());
        if let Some(oldest) = oldest {
            self.forget_stream((number, oldest), false);
        }
        attached
    }

    /// Forgets stream `key`: nobody will resume it. The shell's stream it was written to,
    /// to end.
    fn drop_stream(&mut self, (number, key): (SessionNumber, StreamKey)) -> Option<StreamId> {
        let attached = self
            .mcp(number)
            .and_then(|m| m.log.get(key))
            .and_then(|log| log.attached);
        self.forget_stream((number, key), false);
        attached
    }

    /// Stream `key` lost its reader, as `gone` says; `None` if the log has no such stream
    /// (or, its window passed, a client came back to it).
    pub(crate) fn unattend(
        &mut self,
        now: Instant,
        (number, key): (SessionNumber, StreamKey),
        gone: Gone,
        window: Option<Duration>,
    ) -> Option<Unattended> {
        let log = self.mcp_mut(number)?.log.get_mut(key)?;
        let request = match &log.carries {
            Carries::Request(id, _) => Some(id.clone()),
            Carries::Get => None,
        };
        let (abandoned, attached) = match gone {
            Gone::ClientLeft => {
                log.attached = None;
                if let Some(window) = window {
                    self.resume_timers.set((number, key), now + window);
                    return Some(Unattended::default());
                }
                self.forget_stream((number, key), false);
                (request, None)
            }
            Gone::WindowPassed if log.attached.is_some() => return None,
            Gone::WindowPassed => {
                self.forget_stream((number, key), true);
                (request, None)
            }
            Gone::Lost => {
                let attached = log.attached;
                request.as_ref()?;
                self.forget_stream((number, key), true);
                (request, attached)
            }
            Gone::Dropped => (None, self.drop_stream((number, key))),
        };
        Some(Unattended {
            abandoned,
            attached,
        })
    }

    /// A client resumed stream `key`, now written to `stream`: it is kept no longer for
    /// a window, and a GET stream replaces the session's earlier one.
    pub(crate) fn reattach(
        &mut self,
        (number, key): (SessionNumber, StreamKey),
        stream: StreamId,
    ) -> Reattached {
        self.resume_timers.remove(&(number, key));
        let m = self.mcp_mut(number).expect("a live session");
        let log = m.log.get_mut(key).expect("replayed");
        let previous = log.attached.replace(stream);
        let finished = log.finished;
        let replaced = match log.carries {
            Carries::Get => m.get_stream.replace(key).filter(|old| *old != key),
            Carries::Request(..) => None,
        };
        let replaced = replaced.and_then(|old| self.drop_stream((number, old)));
        Reattached {
            previous,
            replaced,
            finished,
        }
    }

    /// Keeps stream `key` until the resume `window` from now passes (at once without
    /// resumption).
    fn keep_for_window(
        &mut self,
        now: Instant,
        (number, key): (SessionNumber, StreamKey),
        window: Option<Duration>,
    ) {
        match window {
            Some(window) => self.resume_timers.set((number, key), now + window),
            None => self.forget_stream((number, key), false),
        }
    }

    /// Forgets stream `key` of session `number` and its events; an `expired` request
    /// stream is remembered, so that resuming it is answered -32001.
    fn forget_stream(&mut self, (number, key): (SessionNumber, StreamKey), expired: bool) {
        self.resume_timers.remove(&(number, key));
        let Some(session) = self.by_number.get_mut(&number) else {
            return;
        };
        let Kind::Mcp(m) = &mut session.kind else {
            return;
        };
        let expired_id = match m.log.get(key).map(|log| &log.carries) {
            Some(Carries::Request(_, raw_id)) if expired => Some(raw_id.clone()),
            _ => None,
        };
        if m.get_stream == Some(key) {
            m.get_stream = None;
        }
        let before = m.log.bytes();
        m.log.forget(key, expired_id);
        let held = (before, m.log.bytes());
        self.holders.moved(&session.principal, number, held);
    }

    /// Bytes of Streamable events kept for resumption, over every session.
    pub(crate) fn resume_bytes(&self) -> usize {
        self.holders.total()
    }

    /// Session `number` watches `uri` from now on; refused past its subscription cap.
    pub(crate) fn subscribe(&mut self, number: SessionNumber, uri: &str) -> Result<(), ()> {
        let session = self.by_number.get_mut(&number).ok_or(())?;
        if !session.subscriptions.contains(uri)
            && session.subscriptions.len() >= MAX_SUBSCRIPTIONS_PER_SESSION
        {
            return Err(());
        }
        session.subscriptions.insert(uri.to_owned());
        self.subscribers
            .entry(uri.to_owned())
            .or_default()
            .insert(session.id);
        Ok(())
    }

    /// Session `number` stops watching `uri`: true if the backend keeps the subscription
    /// (the session did not watch it, or other sessions still do), so the proxy answers
    /// the unsubscribe itself; false for the last holder's, which goes to the backend.
    pub(crate) fn unsubscribe(&mut self, number: SessionNumber, uri: &str) -> bool {
        let Some(session) = self.by_number.get_mut(&number) else {
            return false;
        };
        if !session.subscriptions.remove(uri) {
            return true;
        }
        let others = self.subscribers.get_mut(uri).map(|set| {
            set.remove(&session.id);
            set.len()
        });
        if others.is_some_and(|n| n > 0) {
            return true;
        }
        self.subscribers.remove(uri);
        false
    }

    /// Every uri some session watches, in order.
    pub(crate) fn watched(&self) -> Vec<String> {
        self.subscribers.keys().cloned().collect()
    }

    /// The sessions watching `uri`, in id order.
    pub(crate) fn watchers(&self, uri: &str) -> Vec<SessionId> {
        self.subscribers
            .get(uri)
            .map(|set| set.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Subscriptions as (session, uri) pairs, counted in the per-session sets and in the
    /// per-uri sets (the two agree); for tests.
    pub(crate) fn subscription_count(&self) -> (usize, usize) {
        (
            self.by_number.values().map(|s| s.subscriptions.len()).sum(),
            self.subscribers.values().map(BTreeSet::len).sum(),
        )
    }

    /// A Streamable session was active now: if quiet (no request in flight: not `busy`),
    /// it gets an idle check unless it has one pending (which, when due, moves on to the
    /// latest activity).
    pub(crate) fn touch(
        &mut self,
        number: SessionNumber,
        now: Instant,
        idle: Duration,
        busy: bool,
    ) {
        let Some(m) = self.mcp_mut(number) else {
            return;
        };
        m.last_active = Some(now);
        let quiet = m.is_quiet(busy);
        if quiet && self.idle_timers.get(&number).is_none() {
            self.idle_timers.set(number, now + idle);
        }
    }

    /// Session `number`'s idle check is due: whether it ends, `idle` having passed since it
    /// was last active and it still quiet (not `busy`). If it was active since, the check
    /// moves on; if it is busy, the touch that finds it quiet again schedules the next one.
    pub(crate) fn idle_ends(
        &mut self,
        now: Instant,
        number: SessionNumber,
        idle: Duration,
        busy: bool,
    ) -> bool {
        let Some(m) = self.mcp(number).filter(|m| m.is_quiet(busy)) else {
            return false;
        };
        match m.last_active.map(|t| t + idle) {
            Some(until) if until <= now => true,
            Some(until) => {
                self.idle_timers.set(number, until);
                false
            }
            None => false,
        }
    }

    /// The timers' next deadline.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        [self.idle_timers.next(), self.resume_timers.next()]
            .into_iter()
            .flatten()
            .min()
    }

    /// The next timer due at `now`: idle checks first, then resume windows.
    pub(crate) fn take_due(&mut self, now: Instant) -> Option<SessionTimer> {
        if let Some((_, number)) = self.idle_timers.pop_due(now) {
            return Some(SessionTimer::Idle(number));
        }
        let (_, (number, key)) = self.resume_timers.pop_due(now)?;
        Some(SessionTimer::Resume(number, key))
    }
}
