//! The backend process as the hub knows it: spawn, up and down, the restart backoff, the
//! stdin budget, health pings and the `/health` requests waiting on them, and the stop
//! sequence of SPEC section 5. It decides; the hub turns its decisions into outputs.
//!
//! Lines for stdin wait here, not in the shell: the shell holds at most
//! `Settings::stdin_window` lines not yet written, and each write report releases more.
//! The proxy's own lines and cancellations go first (they are few and bounded, and a
//! health ping must not wait behind a flood), and with them the last holder's
//! unsubscribe of a uri (counted in its session's share); client lines go in turns, one per session
//! with lines waiting, in session order (round robin), so a session that floods the queue
//! delays another's line by one turn, not by its whole backlog (SPEC section 12).
//!
//! The share holds past the pipe: at most `Settings::backend_window` client requests are
//! handed to the shell and not yet answered (the *window*); the rest wait here, so a
//! victim's request waits behind at most the window, never behind a flood already in the
//! pipe. A request leaves the window when the backend answers it, when its cancellation is
//! queued, when its session ends, when the backend exits, or at `--request-timeout` after
//! it was handed over, whichever comes first (a backend that never answers cannot wedge
//! the window). The proxy's own lines, cancellations and client notifications do not count.
//! A place is one request written: a legacy client's copy of an id still in the window
//! takes a place of its own (the backend runs and answers each), so reusing an id cannot
//! pass the window.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound::{Excluded, Unbounded};
use std::time::{Duration, Instant};

use super::deadlines::Deadlines;
use super::sessions::Lane;
use crate::message::IdKey;
use crate::metrics::{DropReason, Metrics};
use crate::output::{BackendId, Event, Output, RequestId};
use crate::routed_id::{Mark, SessionId};
use crate::router::{ListFetch, Router};
use crate::settings::Restart;
use crate::settings::EXIT_DRAIN;
use crate::supervise::{AfterExit, Exit, Signal, Supervisor};

/// A client request as the backend window knows it: the routing key its id was routed
/// under (a session's id, or a 2026-07-28 request's own key) and the id.
pub(crate) type Slot = (SessionId, IdKey);

/// One lane's client lines waiting for stdin, each request with its slot.
type Waiting = VecDeque<(Vec<u8>, Option<Slot>)>;

/// Whose line is queued for the backend, which decides how much room it may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LineFrom {
    /// A client's notification of this session (or lane): within its fair share of the
    /// stdin queue.
    Client(Lane),
    /// A client's request: as [`LineFrom::Client`], and it takes a place in the backend
    /// window until it ends.
    Request(Lane, Slot),
    /// The proxy's own (pings, unsubscribes, answers to the backend's requests): within
    /// twice that; past it they are dropped and counted, they never delay a client.
    Proxy,
    /// The cancellation of a request the backend was given: always (each is owed for a
    /// request in flight, so there are never more than requests in flight).
    Cancellation,
    /// The last holder's `resources/unsubscribe` of a uri, from this session: in the
    /// proxy's own order (in its session's lane it could wait behind that session's lines
    /// while another caller's later subscribe of the uri went ahead, and then end that
    /// subscription at the backend), but within its session's fair share, so a session
    /// cannot flood the proxy's own room with them.
    Unsubscribe(Lane),
}

/// `line` from `from` queued for stdin, as the hub queues every line: counted (a client's
/// as a rewrite, the proxy's as a reply), handed on if the window lets it, or dropped and
/// counted when it does not fit (false).
pub(super) fn queued(
    (metrics, backend, outputs): (&mut Metrics, &mut BackendProcess, &mut VecDeque<Output>),
    now: Instant,
    line: Vec<u8>,
    from: LineFrom,
) -> bool {
    match from {
        LineFrom::Client(_) | LineFrom::Request(..) | LineFrom::Unsubscribe(_) => {
            metrics.rewrites += 1
        }
        LineFrom::Proxy => metrics.replies += 1,
        LineFrom::Cancellation => {}
    }
    let queued = backend.queue(from, line);
    match queued {
        true => backend.release(now, outputs, false),
        false => super::dropped((metrics, outputs), DropReason::BackendQueueFull, None),
    }
    queued
}

/// The parts through which the proxy's own lines reach the backend, borrowed from the hub
/// (by a listen's subscribes, a list fetch, the handshake): the router numbers them, the
/// backend queues them (counted as the proxy's lines), the outputs carry what they cause.
pub(super) type Upstream<'a> = (
    &'a mut Router,
    &'a mut BackendProcess,
    &'a mut Metrics,
    &'a mut VecDeque<Output>,
);

/// A list fetch for the cache (SPEC section 16) queued as the proxy's line. When the
/// queue has no room for it, the fetch ends and the caller's own request goes instead
/// (from `from`), as with the cache off: nobody waits on a line the backend never got.
pub(super) fn fetch_queued(
    (router, backend, metrics, outputs): Upstream<'_>,
    now: Instant,
    fetch: ListFetch,
    from: LineFrom,
) {
    if !queued(
        (metrics, backend, outputs),
        now,
        fetch.line,
        LineFrom::Proxy,
    ) {
        router.unfetched(fetch.fetch);
        queued((metrics, backend, outputs), now, fetch.plain, from);
    }
}

/// The proxy's own handshake (SPEC section 13) queued as the proxy's line: `false` when
/// the queue has no room for it, and then none is under way (the next request that needs
/// one sends it again; nobody waits on a line the backend never got).
pub(super) fn handshake_queued(
    (router, backend, metrics, outputs): Upstream<'_>,
    now: Instant,
) -> bool {
    let line = router.own_handshake();
    let queued = queued((metrics, backend, outputs), now, line, LineFrom::Proxy);
    if !queued {
        router.handshake_unsent();
    }
    queued
}

#[derive(Debug)]
enum State {
    /// Spawn requested, not reported yet.
    Spawning { id: BackendId },
    /// Running since `started`.
    Up {
        id: BackendId,
        pid: u32,
        started: Instant,
        /// Lines queued for its stdin and not reported written.
        queued: usize,
        /// Stdin closed by the stop sequence.
        stdin_closed: bool,
    },
    /// Not running; started again at `restart_at` if set.
    Down { restart_at: Option<Instant> },
}

/// Health ping bookkeeping.
#[derive(Debug, Default)]
struct Pings {
    next_at: Option<Instant>,
    /// The first ping still unanswered was sent then.
    unanswered_since: Option<Instant>,
    last_pong: Option<Instant>,
    /// Reported unresponsive for the current silence.
    unresponsive: bool,
}

/// A `/health` request waiting for the backend's answer to its ping.
#[derive(Debug)]
struct HealthWaiter {
    request: RequestId,
    ping: u64,
    deadline: Instant,
}

/// The proxy's life: running, stopping the backend (SPEC section 5), or exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Running,
    /// Streams are ended; waiting for the backend to exit. `step` counts the waits done.
    Stopping {
        status: i32,
        step: usize,
        at: Instant,
    },
    /// [`Output::Exit`](crate::Output::Exit) was emitted; nothing more happens.
    Exited,
}

/// The backend process part.
#[derive(Debug)]
pub(crate) struct BackendProcess {
    state: State,
    /// A backend has run at least once (a first spawn failure ends the proxy).
    ever_started: bool,
    supervisor: Supervisor,
    pings: Pings,
    health_waiters: Vec<HealthWaiter>,
    phase: Phase,
    ping_interval: Duration,
    ping_timeout: Duration,
    grace: Duration,
    stdin_queue: usize,
    /// Whose each line queued for stdin is, in order (`None`: the proxy's own), so that
    /// write reports give each session its room back.
    owners: VecDeque<Option<Lane>>,
    /// Client lines queued per session, waiting here or in the shell (sessions with none
    /// are not listed).
    queued_by: BTreeMap<Lane, usize>,
    /// Lines the shell may hold not yet written.
    stdin_window: usize,
    /// Client lines not handed to the shell yet, per session, each request with its slot.
    held: BTreeMap<Lane, Waiting>,
    /// Held client lines that are notifications (they pass a full window).
    held_notes: usize,
    /// Client requests handed to the shell and not yet ended: the window, each with its
    /// session (or lane) and the copies of it written (a legacy client may reuse an id in
    /// flight; each copy is a request the backend runs and answers).
    window: BTreeMap<Slot, (Lane, usize)>,
    /// How many of the window's requests each session holds: one below its share of the
    /// window goes even when the window is full.
    in_window: BTreeMap<Lane, usize>,
    /// Requests in the window awaited no longer at these times (`--request-timeout`).
    window_timers: Deadlines<Slot>,
    /// Client requests handed over and unanswered, at most (`--backend-window`).
    backend_window: usize,
    /// How long a request keeps its place in the window (`--request-timeout`).
    window_timeout: Option<Duration>,
    /// The proxy's own lines and cancellations not handed to the shell yet, and the
    /// sessions' unsubscribes that go in the same order (each with its session).
    held_proxy: VecDeque<(Vec<u8>, Option<Lane>)>,
    /// The session whose line was handed over last: the next turn is the next session's.
    turn: Option<Lane>,
}

impl BackendProcess {
    pub(crate) fn new(restart: Restart, settings: &super::Settings) -> Self {
        BackendProcess {
            state: State::Down { restart_at: None },
            ever_started: false,
            supervisor: Supervisor::new(restart),
            pings: Pings::default(),
            health_waiters: Vec::new(),
            phase: Phase::Running,
            ping_interval: settings.ping_interval,
            ping_timeout: settings.ping_timeout,
            grace: settings.grace,
            stdin_queue: settings.stdin_queue,
            owners: VecDeque::new(),
            queued_by: BTreeMap::new(),
            stdin_window: settings.stdin_window.max(1),
            held: BTreeMap::new(),
            held_notes: 0,
            window: BTreeMap::new(),
            window_timers: Deadlines::default(),
            in_window: BTreeMap::new(),
            backend_window: settings.backend_window.max(1),
            window_timeout: settings.request_timeout,
            held_proxy: VecDeque::new(),
            turn: None,
        }
    }

    /// A reload's settings: the restart policy, pings, grace and stdin budget from now on
    /// (the ping already scheduled keeps its time).
    pub(crate) fn reconfigure(&mut self, settings: &super::Settings) {
        self.supervisor.set_policy(settings.restart);
        self.ping_interval = settings.ping_interval;
        self.ping_timeout = settings.ping_timeout;
        self.grace = settings.grace;
        self.stdin_queue = settings.stdin_queue;
        self.stdin_window = settings.stdin_window.max(1);
        self.backend_window = settings.backend_window.max(1);
        self.window_timeout = settings.request_timeout;
    }

    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    pub(crate) fn is_running(&self) -> bool {
        self.phase == Phase::Running
    }

    /// The process running now.
    pub(crate) fn current(&self) -> Option<BackendId> {
        match self.state {
            State::Up { id, .. } => Some(id),
            _ => None,
        }
    }

    pub(crate) fn is_up(&self) -> bool {
        self.current().is_some()
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        match self.state {
            State::Up { pid, .. } => Some(pid),
            _ => None,
        }
    }

    pub(crate) fn restarts(&self) -> u64 {
        self.supervisor.restarts()
    }

    pub(crate) fn since_last_pong(&self, now: Instant) -> Option<Duration> {
        self.pings
            .last_pong
            .map(|t| now.saturating_duration_since(t))
    }

    /// Asks the shell to start process `id`.
    pub(crate) fn spawn(&mut self, id: BackendId, out: &mut impl Extend<Output>) {
        self.state = State::Spawning { id };
        out.extend([Output::SpawnBackend { backend: id }]);
    }

    /// Process `id` runs as `pid`; false if it is not the one awaited.
    pub(crate) fn spawned(&mut self, now: Instant, id: BackendId, pid: u32) -> bool {
        if !matches!(self.state, State::Spawning { id: awaited } if awaited == id) {
            return false;
        }
        self.state = State::Up {
            id,
            pid,
            started: now,
            queued: 0,
            stdin_closed: false,
        };
        self.ever_started = true;
        let running = self.is_running();
        self.pings = Pings {
            next_at: running.then(|| now + self.ping_interval),
            ..Pings::default()
        };
        true
    }

    /// Process `id` could not start: `Some(whether one ever ran)` if it was awaited.
    pub(crate) fn spawn_failed(&mut self, id: BackendId) -> Option<bool> {
        if !matches!(self.state, State::Spawning { id: awaited } if awaited == id) {
            return None;
        }
        self.state = State::Down { restart_at: None };
        Some(self.ever_started)
    }

    /// Process `id` exited: its pid and how long it ran, if it was the one running.
    pub(crate) fn exited(&mut self, now: Instant, id: BackendId) -> Option<(u32, Duration)> {
        let State::Up {
            id: running,
            pid,
            started,
            ..
        } = self.state
        else {
            return None;
        };
        if running != id {
            return None;
        }
        self.state = State::Down { restart_at: None };
        self.pings = Pings::default();
        self.owners.clear();
        self.queued_by.clear();
        self.held.clear();
        self.held_notes = 0;
        self.window.clear();
        self.window_timers.clear();
        self.in_window.clear();
        self.held_proxy.clear();
        self.turn = None;
        Some((pid, now.saturating_duration_since(started)))
    }

    /// The restart policy's answer to an exit; a restart is scheduled here.
    pub(crate) fn after_exit(&mut self, now: Instant, exit: Exit, ran_for: Duration) -> AfterExit {
        let after = self.supervisor.exited(exit, ran_for);
        if let AfterExit::Restart { after } = after {
            self.state = State::Down {
                restart_at: Some(now + after),
            };
        }
        after
    }

    /// Whether `session` (`None`: one about to start) is within its fair share of the stdin
    /// queue: the queue split equally among the sessions with lines queued, itself counted
    /// (SPEC section 12). A session at its share is refused; one below it is admitted even
    /// when others filled the queue, so one flood slows others by one share at most.
    pub(crate) fn fits(&self, session: Option<Lane>) -> bool {
        let mine = session
            .and_then(|s| self.queued_by.get(&s))
            .copied()
            .unwrap_or(0);
        let sharing = self.queued_by.len() + usize::from(mine == 0);
        mine < (self.stdin_queue / sharing).max(1)
    }

    /// Queues `line` from `from` for stdin, if it fits: a client's within its fair share,
    /// the proxy's own within twice the queue (past it they are dropped and counted), a
    /// cancellation always. False when it does not fit or no process takes lines.
    pub(crate) fn queue(&mut self, from: LineFrom, line: Vec<u8>) -> bool {
        let fits = match &from {
            LineFrom::Client(session)
            | LineFrom::Request(session, _)
            | LineFrom::Unsubscribe(session) => self.fits(Some(*session)),
            LineFrom::Proxy => self.owners.len() + self.held_proxy.len() < 2 * self.stdin_queue,
            LineFrom::Cancellation => true,
        };
        if !fits
            || !matches!(
                self.state,
                State::Up {
                    stdin_closed: false,
                    ..
                }
            )
        {
            return false;
        }
        let (session, slot) = match from {
            LineFrom::Client(session) => (session, None),
            LineFrom::Request(session, slot) => (session, Some(slot)),
            LineFrom::Unsubscribe(session) => {
                *self.queued_by.entry(session).or_default() += 1;
                self.held_proxy.push_back((line, Some(session)));
                return true;
            }
            LineFrom::Proxy | LineFrom::Cancellation => {
                self.held_proxy.push_back((line, None));
                return true;
            }
        };
        self.held_notes += usize::from(slot.is_none());
        *self.queued_by.entry(session).or_default() += 1;
        self.held
            .entry(session)
            .or_default()
            .push_back((line, slot));
        true
    }

    /// Hands the shell the lines its window has room for ([`Output::ToBackend`]), in the
    /// order of the module docs; every line waiting when `all` (stdin is about to close).
    /// A request handed over now keeps its place in the window until `--request-timeout`
    /// at most.
    pub(crate) fn release(&mut self, now: Instant, out: &mut impl Extend<Output>, all: bool) {
        while let Some((backend, line)) = self.next_line(now, all) {
            out.extend([Output::ToBackend { backend, line }]);
        }
    }

    fn next_line(&mut self, now: Instant, all: bool) -> Option<(BackendId, Vec<u8>)> {
        let State::Up {
            id,
            queued,
            stdin_closed: false,
            ..
        } = self.state
        else {
            return None;
        };
        if queued >= self.stdin_window && !all {
            return None;
        }
        let (line, owner) = match self.held_proxy.pop_front() {
            Some(held) => held,
            None => {
                let (next, line, slot) = self.next_client(all)?;
                if let Some(slot) = slot {
                    if let Some(timeout) = self.window_timeout {
                        self.window_timers.set(slot.clone(), now + timeout);
                    }
                    self.window.entry(slot).or_insert((next, 0)).1 += 1;
                    *self.in_window.entry(next).or_default() += 1;
                }
                (line, Some(next))
            }
        };
        if let State::Up { queued, .. } = &mut self.state {
            *queued += 1;
        }
        self.owners.push_back(owner);
        Some((id, line))
    }

    /// The next client line in turn: the next session's (after the last one served, in
    /// session order) whose first line may go now, a request only while the window has
    /// room (or when `all` lines go).
    fn next_client(&mut self, all: bool) -> Option<(Lane, Vec<u8>, Option<Slot>)> {
        let room = all || self.in_window() < self.backend_window;
        // The window is shared fairly too: a session holding less than its part of it
        // (the window over the sessions holding or wanting a place) goes even when it is
        // full, so one client's slow calls never hold it against another's.
        let sharers = self.in_window.len()
            + (self.held.keys())
                .filter(|s| !self.in_window.contains_key(s))
                .count();
        let share = (self.backend_window / sharers.max(1)).max(1);
        let in_window = &self.in_window;
        let below_share = |s: &Lane| in_window.get(s).copied().unwrap_or(0) < share;
        if !room && self.held_notes == 0 && !self.held.keys().any(below_share) {
            return None;
        }
        let may_go = |(session, lines): (&Lane, &Waiting)| {
            let first = lines
                .front()
                .is_some_and(|(_, slot)| room || slot.is_none() || below_share(session));
            first.then_some(*session)
        };
        let next = match self.turn {
            Some(turn) => (self
                .held
                .range((Excluded(turn), Unbounded))
                .find_map(may_go))
            .or_else(|| self.held.range(..=turn).find_map(may_go)),
            None => self.held.iter().find_map(may_go),
        }?;
        let lines = self.held.get_mut(&next)?;
        let (line, slot) = lines.pop_front()?;
        if lines.is_empty() {
            self.held.remove(&next);
        }
        self.held_notes -= usize::from(slot.is_none());
        if room {
            // A notification passing a full window does not use its session's turn.
            self.turn = Some(next);
        }
        Some((next, line, slot))
    }

    /// Request `slot` was answered: its place in the window (one copy's) is free. True if
    /// it had one.
    pub(crate) fn answered(&mut self, slot: &Slot) -> bool {
        let freed = self.leave_window(slot, 1);
        if freed && !self.window.contains_key(slot) {
            self.window_timers.remove(slot);
        }
        freed
    }

    /// Up to `copies` copies of request `slot` leave the window (its session holds as many
    /// fewer places). True if it was in.
    fn leave_window(&mut self, slot: &Slot, copies: usize) -> bool {
        let Some((session, written)) = self.window.get_mut(slot) else {
            return false;
        };
        let (session, left) = (*session, copies.min(*written));
        *written -= left;
        if *written == 0 {
            self.window.remove(slot);
        }
        if let Some(n) = self.in_window.get_mut(&session) {
            *n -= left;
            if *n == 0 {
                self.in_window.remove(&session);
            }
        }
        true
    }

    /// Tells the backend that request `raw_id` routed under `sid` is cancelled (`reason`),
    /// unless it never left the fair queue (then it is dropped there and never written);
    /// either way it leaves the backend window (SPEC section 12). False when the
    /// cancellation did not fit the queue (the caller counts the drop).
    pub(crate) fn cancel(
        &mut self,
        now: Instant,
        (sid, raw_id, reason): (&SessionId, &str, &str),
        mark: Mark,
        outputs: &mut VecDeque<Output>,
    ) -> bool {
        let slot = crate::message::IdKey::of(raw_id).map(|key| (*sid, key));
        if slot.is_some_and(|slot| self.cancelled(&slot)) {
            return true;
        }
        let line = crate::streamable::cancel_line(sid, raw_id, mark, reason);
        let queued = line.is_none_or(|line| self.queue(LineFrom::Cancellation, line));
        self.release(now, outputs, false);
        queued
    }

    /// Request `slot` is cancelled (its cancellation is about to be queued): its place in
    /// the window is free. One still waiting here is dropped instead, never written: true
    /// then (no cancellation need follow it).
    pub(crate) fn cancelled(&mut self, slot: &Slot) -> bool {
        if self.answered(slot) {
            return false;
        }
        let found = self.held.iter_mut().find_map(|(session, lines)| {
            let at = lines.iter().position(|(_, s)| s.as_ref() == Some(slot))?;
            Some((*session, lines, at))
        });
        let Some((session, lines, at)) = found else {
            return false;
        };
        lines.remove(at);
        if lines.is_empty() {
            self.held.remove(&session);
        }
        self.unqueue(session);
        true
    }

    /// Requests in the window awaited no longer at `now`; true if any left it.
    fn window_due(&mut self, now: Instant) -> bool {
        let mut freed = false;
        // Its timer restarted with its newest copy: every copy is past it.
        while let Some((_, slot)) = self.window_timers.pop_due(now) {
            freed |= self.leave_window(&slot, usize::MAX);
        }
        freed
    }

    /// Client requests in the window, each copy of a reused id counted.
    pub(crate) fn in_window(&self) -> usize {
        self.in_window.values().sum()
    }

    /// One line of `session` left the queue: its share gets its room back.
    fn unqueue(&mut self, session: Lane) {
        if let Some(n) = self.queued_by.get_mut(&session) {
            *n -= 1;
            if *n == 0 {
                self.queued_by.remove(&session);
            }
        }
    }

    /// `lines` queued for process `id` were written: their sessions get their room back.
    pub(crate) fn wrote(&mut self, id: BackendId, lines: usize) {
        let State::Up {
            id: running,
            queued,
            ..
        } = &mut self.state
        else {
            return;
        };
        if *running != id {
            return;
        }
        *queued = queued.saturating_sub(lines);
        let written: Vec<_> = self.owners.drain(..lines.min(self.owners.len())).collect();
        for session in written.into_iter().flatten() {
            self.unqueue(session);
        }
    }

    /// A session ended: its lines the shell holds count for nobody, its requests leave the
    /// window (nobody awaits them), and its lines still waiting here are dropped (nobody
    /// awaits their answers; a cancellation sent for one of them must not overtake it).
    /// How many were dropped.
    pub(crate) fn forget(&mut self, session: Lane) -> usize {
        if self.queued_by.remove(&session).is_some() {
            let held_proxy = self.held_proxy.iter_mut().map(|(_, owner)| owner);
            for owner in (self.owners.iter_mut().chain(held_proxy)).filter(|o| **o == Some(session))
            {
                *owner = None;
            }
        }
        self.in_window.remove(&session);
        let timers = &mut self.window_timers;
        self.window.retain(|slot, (lane, _)| {
            let keep = *lane != session;
            if !keep {
                timers.remove(slot);
            }
            keep
        });
        let dropped = self.held.remove(&session).unwrap_or_default();
        let notes = dropped.iter().filter(|(_, slot)| slot.is_none()).count();
        self.held_notes -= notes;
        dropped.len()
    }

    /// Whether a backend will be running again without the proxy stopping: one is up,
    /// starting, or due to restart.
    pub(crate) fn coming(&self) -> bool {
        self.is_running() && !matches!(self.state, State::Down { restart_at: None })
    }

    /// Closes stdin for the stop sequence, the first time; the lines still waiting go
    /// first, as they would have in the shell's queue.
    pub(crate) fn close_stdin(&mut self, now: Instant, out: &mut impl Extend<Output>) {
        self.release(now, out, true);
        if let State::Up {
            id, stdin_closed, ..
        } = &mut self.state
        {
            if !*stdin_closed {
                *stdin_closed = true;
                out.extend([Output::CloseBackendStdin { backend: *id }]);
            }
        }
    }

    // Pings and health

    /// A health ping of the proxy's own (numbered by the router, which awaits its answer),
    /// going out now: its number and its line.
    pub(crate) fn ping(
        &mut self,
        now: Instant,
        router: &mut crate::router::Router,
    ) -> (u64, Vec<u8>) {
        let (ping, line) = router.health_ping();
        self.ping_sent(now, None);
        (ping, line)
    }

    /// A ping numbered `ping` went out now (for `/health` when `waiter` is given).
    pub(crate) fn ping_sent(&mut self, now: Instant, waiter: Option<(RequestId, u64)>) {
        self.pings.unanswered_since.get_or_insert(now);
        if let Some((request, ping)) = waiter {
            self.health_waiters.push(HealthWaiter {
                request,
                ping,
                deadline: now + self.ping_timeout,
            });
        }
    }

    /// The periodic ping is due: true if one should go out now (the next is scheduled).
    pub(crate) fn periodic_ping_due(&mut self, now: Instant) -> bool {
        if self.pings.next_at.is_none_or(|at| at > now) {
            return false;
        }
        self.pings.next_at = Some(now + self.ping_interval);
        self.is_up()
    }

    /// The ping went unanswered for `--ping-timeout`: the silence, once per silence.
    pub(crate) fn newly_unresponsive(&mut self, now: Instant) -> Option<Duration> {
        let silent = now.saturating_duration_since(self.pings.unanswered_since?);
        if self.pings.unresponsive || silent < self.ping_timeout {
            return None;
        }
        self.pings.unresponsive = true;
        Some(silent)
    }

    /// Ping `ping` was answered: the health requests it settles. A backend unresponsive
    /// until now is logged responsive again.
    pub(crate) fn pong(
        &mut self,
        now: Instant,
        ping: u64,
        out: &mut impl Extend<Output>,
    ) -> Vec<RequestId> {
        self.pings.last_pong = Some(now);
        self.pings.unanswered_since = None;
        if std::mem::take(&mut self.pings.unresponsive) {
            out.extend([Output::Log(Event::Responsive)]);
        }
        self.take_health(|w| w.ping <= ping)
    }

    /// Health requests whose wait ran out at `now`.
    pub(crate) fn health_due(&mut self, now: Instant) -> Vec<RequestId> {
        self.take_health(|w| w.deadline <= now)
    }

    /// Every health request still waiting.
    pub(crate) fn all_health(&mut self) -> Vec<RequestId> {
        self.take_health(|_| true)
    }

    fn take_health(&mut self, settled: impl Fn(&HealthWaiter) -> bool) -> Vec<RequestId> {
        let (due, waiting) = std::mem::take(&mut self.health_waiters)
            .into_iter()
            .partition::<Vec<_>, _>(|w| settled(w));
        self.health_waiters = waiting;
        due.into_iter().map(|w| w.request).collect()
    }

    // The stop sequence

    /// Begins stopping with `status`: a backend that runs (or is starting) has its stdin
    /// closed and is waited for; without one the proxy exits at once.
    pub(crate) fn begin_stop(&mut self, now: Instant, status: i32, out: &mut impl Extend<Output>) {
        self.pings.next_at = None;
        self.pings.unanswered_since = None;
        if let State::Down { .. } = self.state {
            return self.exit(status, out);
        }
        self.phase = Phase::Stopping {
            status,
            step: 0,
            at: now + self.grace,
        };
        self.close_stdin(now, out);
    }

    /// The next step of the stop sequence, if its grace period passed at `now`: a signal
    /// to the backend, or giving up on it and exiting.
    pub(crate) fn stop_due(&mut self, now: Instant, out: &mut impl Extend<Output>) {
        let Phase::Stopping { status, step, at } = self.phase else {
            return;
        };
        if at > now {
            return;
        }
        let signal = match step {
            0 => Signal::Terminate,
            1 => Signal::Kill,
            _ => {
                out.extend([Output::Log(Event::GaveUpWaiting)]);
                return self.exit(status, out);
            }
        };
        self.phase = Phase::Stopping {
            status,
            step: step + 1,
            at: now + self.grace,
        };
        if let Some(backend) = self.current() {
            out.extend([
                Output::Log(Event::StillRunning { signal }),
                Output::SignalBackend { backend, signal },
            ]);
        }
    }

    /// How long until a scheduled restart, if one is.
    pub(crate) fn until_restart(&self, now: Instant) -> Option<Duration> {
        match self.state {
            State::Down {
                restart_at: Some(at),
            } if self.is_running() => Some(at.saturating_duration_since(now)),
            _ => None,
        }
    }

    /// What is due at `now`: a restart (the new process numbered from `next_id`), the next
    /// step of the stop sequence; true when the periodic ping is due.
    pub(crate) fn handle_timeout(
        &mut self,
        now: Instant,
        next_id: &mut u64,
        out: &mut impl Extend<Output>,
    ) -> bool {
        if matches!(self.state, State::Down { restart_at: Some(at) } if at <= now) {
            let backend = BackendId(*next_id);
            *next_id += 1;
            self.spawn(backend, out);
        }
        self.stop_due(now, out);
        if self.window_due(now) {
            self.release(now, out, false);
        }
        self.periodic_ping_due(now)
    }

    /// The proxy exits with `status`; nothing more happens.
    pub(crate) fn exit(&mut self, status: i32, out: &mut impl Extend<Output>) {
        self.phase = Phase::Exited;
        out.extend([Output::Exit {
            status,
            drain: EXIT_DRAIN,
        }]);
    }

    /// The part's next deadline.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let restart = match self.state {
            State::Down { restart_at } => restart_at,
            _ => None,
        };
        let stop = match self.phase {
            Phase::Stopping { at, .. } => Some(at),
            _ => None,
        };
        let silence = match self.pings.unanswered_since {
            Some(since) if !self.pings.unresponsive => Some(since + self.ping_timeout),
            _ => None,
        };
        let health = self.health_waiters.iter().map(|w| w.deadline).min();
        let window = self.window_timers.next();
        [restart, stop, self.pings.next_at, silence, health, window]
            .into_iter()
            .flatten()
            .min()
    }
}
