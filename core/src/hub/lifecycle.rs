//! The backend's life and the proxy's: start, exit and restart, shutdown, and how sessions
//! end (one at a time, or all at once).

use std::time::{Duration, Instant};

use super::auditing::Happened;
use super::backend::{LineFrom, Phase};
use super::exchanges::Answer;
use super::in_flight::{Caller, Settlement};
use super::mcp::Ending;
use super::sessions::{Kind, SessionNumber};
use super::Hub;
use crate::http::Rejection;
use crate::message::IdKey;
use crate::metrics::DropReason;
use crate::output::{BackendId, CloseReason, Event, Output};
use crate::settings::OnBackendExit;
use crate::supervise::{AfterExit, Exit};

impl Hub {
    /// The process of [`Output::SpawnBackend`] runs as `pid`.
    pub fn handle_backend_spawned(&mut self, now: Instant, backend: BackendId, pid: u32) {
        if !self.backend.spawned(now, backend, pid) {
            return;
        }
        self.outputs
            .push_back(Output::Log(Event::BackendStarted { pid }));
        // A process after a crash with sessions kept is first initialized as the last one
        // was; until then client lines wait.
        match self.router.restore() {
            Some(line) => self.queue_line(now, line, LineFrom::Proxy),
            None => self.release_waiting(now),
        }
        if let Phase::Stopping { .. } = self.backend.phase() {
            // SIGTERM arrived while it was being started: stop it like any other.
            self.backend.close_stdin(now, &mut self.outputs);
        }
    }

    /// The process of [`Output::SpawnBackend`] could not be started.
    pub fn handle_spawn_failed(&mut self, now: Instant, backend: BackendId, error: String) {
        let Some(ever_started) = self.backend.spawn_failed(backend) else {
            return;
        };
        self.outputs
            .push_back(Output::Log(Event::SpawnFailed { error }));
        if let Phase::Stopping { status, .. } = self.backend.phase() {
            return self.backend.exit(status, &mut self.outputs);
        }
        let after = match ever_started {
            true => self
                .backend
                .after_exit(now, Exit::SpawnFailed, Duration::ZERO),
            // A command that never ran is a configuration error, not a crash to ride out.
            false => AfterExit::Shutdown { status: 1 },
        };
        self.outputs
            .push_back(Output::Log(Event::after_exit(after)));
        if let AfterExit::Shutdown { status } = after {
            self.begin_stop(now, status);
        }
    }

    /// `backend` exited: its sessions end and the restart policy decides what follows.
    pub fn handle_backend_exited(&mut self, now: Instant, backend: BackendId, exit: Exit) {
        let Some((pid, ran_for)) = self.backend.exited(now, backend) else {
            return;
        };
        self.outputs
            .push_back(Output::Log(Event::BackendExited { pid, exit }));
        // Its tasks went with it (SPEC section 15), and its tool list.
        self.tasks.clear();
        self.backend_tools.forget();
        self.modern.tools.forget();
        if let Phase::Stopping { status, .. } = self.backend.phase() {
            self.router.backend_exited(false);
            return self.backend.exit(status, &mut self.outputs);
        }
        // With sessions kept, the restart policy decides whether they stay; otherwise they
        // end, and waiting POSTs are refused, before it is asked.
        let keep = self.settings.on_backend_exit == OnBackendExit::KeepSessions;
        let after = keep.then(|| self.backend.after_exit(now, exit, ran_for));
        if let Some(AfterExit::Restart { .. }) = after {
            // Sessions stay; what the old process was asked is answered here.
            self.router.backend_exited(true);
            super::auditing::restarted((&self.settings, &mut self.outputs));
            self.fail_in_flight(now);
        } else {
            self.router.backend_exited(false);
            self.end_all_sessions(now, CloseReason::BackendExited);
            for post in self.posts.take_all() {
                self.respond(now, post.request, Answer::Rejected(Rejection::BackendDown));
            }
        }
        for request in self.backend.all_health() {
            self.respond(now, request, Answer::Health(false));
        }
        let after = after.unwrap_or_else(|| self.backend.after_exit(now, exit, ran_for));
        self.outputs
            .push_back(Output::Log(Event::after_exit(after)));
        if let AfterExit::Shutdown { status } = after {
            self.begin_stop(now, status);
        }
    }

    /// Every request the exited backend was asked and had not answered gets -32603
    /// `backend restarted`, under its own id, in session creation order.
    fn fail_in_flight(&mut self, now: Instant) {
        for (caller, entry) in self.in_flight.take_modern() {
            let failed = Settlement::error(&entry.raw_id, -32603, "backend restarted");
            self.settle(now, (Some(caller), entry), failed);
        }
        let numbers: Vec<SessionNumber> = self.sessions.iter().map(|(n, _)| n).collect();
        for number in numbers {
            self.end_mcp(now, number, Ending::Restarted);
            let Some(Kind::Legacy { .. }) = self.sessions.get(number).map(|s| &s.kind) else {
                continue;
            };
            for (_, tracked) in self.in_flight.take_all(number) {
                self.metrics.delivered += 1;
                let failed = Settlement::error(&tracked.raw_id, -32603, "backend restarted");
                self.settle(now, (Some(number.into()), tracked), failed);
            }
        }
    }

    /// A restarted backend answered the cached handshake. With the same protocol version
    /// the sessions carry on: the handshake completes, every watched uri is subscribed
    /// again, every session hears that the lists may have changed, and waiting requests go
    /// ahead. With another, sessions end and clients start again.
    pub(super) fn restored(&mut self, now: Instant, same: bool, initialized: Option<Vec<u8>>) {
        if !same {
            self.end_all_sessions(now, CloseReason::BackendExited);
            return self.release_waiting(now);
        }
        if let Some(line) = initialized {
            self.queue_line(now, line, LineFrom::Proxy);
        }
        super::dispatch::read_backend_tools(super::dispatch::reader!(self), now);
        let mut watched: std::collections::BTreeSet<String> =
            self.sessions.watched().into_iter().collect();
        watched.extend(self.listeners.accepted().cloned());
        for uri in watched {
            let (_, line) = self.router.subscribe(&uri);
            self.queue_line(now, line, LineFrom::Proxy);
        }
        (self.listeners).renew_awaited(now, super::listen::upstream!(self));
        for what in ["tools", "resources", "prompts"] {
            let method = format!("notifications/{what}/list_changed");
            let message = format!(r#"{{"jsonrpc":"2.0","method":"{method}"}}"#);
            self.list_changed(now, &method, message.as_bytes());
        }
        self.release_waiting(now);
    }

    /// SIGINT or SIGTERM: stop accepting, end every stream, stop the backend (SPEC section 5)
    /// and exit 0.
    pub fn handle_shutdown(&mut self, now: Instant) {
        if !self.backend.is_running() {
            return;
        }
        self.outputs
            .push_back(Output::Log(Event::ShutdownRequested));
        self.begin_stop(now, 0);
    }

    /// Stops accepting, ends every session, refuses every POST waiting for the backend,
    /// answers every `/health` request, then stops the backend (SPEC section 5).
    fn begin_stop(&mut self, now: Instant, status: i32) {
        self.outputs.push_back(Output::StopAccepting);
        self.end_all_sessions(now, CloseReason::Shutdown);
        for post in self.posts.take_all() {
            self.respond(now, post.request, Answer::Rejected(Rejection::BackendDown));
        }
        for request in self.backend.all_health() {
            self.respond(now, request, Answer::Health(false));
        }
        self.backend.begin_stop(now, status, &mut self.outputs);
    }

    /// Ends every live session in creation order; the backend is gone or going, so
    /// nothing is unsubscribed. Every request is told it failed (or its stream ends)
    /// first, and its lines still waiting for stdin are dropped: none may be written when
    /// stdin closes, nor go into a place that another's ending frees.
    fn end_all_sessions(&mut self, now: Instant, reason: CloseReason) {
        let text = match reason {
            CloseReason::Shutdown => "proxy shutting down",
            _ => "backend restarted",
        };
        for (caller, entry) in self.in_flight.take_modern() {
            // A 2026-07-28 request's lane is its principal's, never forgotten.
            if let (Caller::Modern(key), Some(id)) = (caller, IdKey::of(&entry.raw_id)) {
                self.backend.cancelled(&(*key.route(), id));
            }
            let failed = Settlement::error(&entry.raw_id, -32603, text);
            self.settle(now, (Some(caller), entry), failed);
        }
        let live: Vec<SessionNumber> = self.sessions.iter().map(|(n, _)| n).collect();
        for number in &live {
            for _ in 0..self.backend.forget((*number).into()) {
                self.drop_message(DropReason::SessionGone, None);
            }
        }
        for number in live {
            self.end_session(now, number, reason);
        }
        let parts = (&mut self.sessions, &mut self.outputs);
        (self.listeners).end_where(now, parts, |_| true);
        self.sessions.close_all();
        self.in_flight.clear();
        self.streams.clear();
    }

    /// Ends one session: what it holds ends while it is still in the table (its stream,
    /// or its requests in flight, answered, and its streams), each legacy request still
    /// unanswered is awaited no longer, the session is closed, as observed, and the uris
    /// only it watched are unsubscribed while the backend stays.
    pub(super) fn end_session(&mut self, now: Instant, number: SessionNumber, reason: CloseReason) {
        let ending = match reason {
            CloseReason::BackendExited => Ending::BackendExited,
            CloseReason::Shutdown => Ending::Shutdown,
            _ => Ending::Deleted,
        };
        for _ in 0..self.backend.forget(number.into()) {
            self.drop_message(DropReason::SessionGone, None);
        }
        // Its requests left the backend window: others' may go.
        self.backend.release(now, &mut self.outputs, false);
        let unanswered = match self.sessions.get(number).map(|s| &s.kind) {
            Some(Kind::Legacy { stream }) => {
                self.streams.end(*stream, &mut self.outputs);
                self.in_flight.take_all(number)
            }
            Some(Kind::Mcp(_)) => {
                self.end_mcp(now, number, ending);
                Vec::new()
            }
            None => return,
        };
        if self.sessions.get(number).is_none() {
            // Its initialize was answered with an error just now: it never opened.
            return;
        }
        for (_, entry) in unanswered {
            self.settle(now, (Some(number.into()), entry), Settlement::Gone);
        }
        let fault = match reason {
            CloseReason::SlowConsumer => Some("slow_consumer"),
            CloseReason::BackendExited => Some("backend_lost"),
            _ => None,
        };
        self.observe(now, Happened::Closed(number, fault));
        let Some((session, released)) = self.sessions.close(number) else {
            return;
        };
        self.metrics.sessions_closed += 1;
        (self.tasks).owner_ended(&super::tasks::Owner::Session(session.id));
        self.outputs.push_back(Output::Log(Event::SessionClosed {
            session: session.id,
            reason,
        }));
        if let Ending::Deleted = ending {
            let released: Vec<String> = (released.into_iter())
                .filter(|uri| !self.listeners.holds(uri))
                .collect();
            for uri in released {
                let line = self.router.unsubscribe(&uri);
                self.queue_line(now, line, LineFrom::Proxy);
            }
        }
    }
}
