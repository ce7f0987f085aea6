//! The backend's life and the proxy's: start, exit and restart, shutdown, and how sessions
//! end (one at a time, or all at once).

use std::time::{Duration, Instant};

use super::auditing::Happened;
use super::backend::{LineFrom, Phase, StopStep};
use super::mcp::Ending;
use super::sessions::{Kind, SessionNumber};
use super::{Hub, EXIT_DRAIN};
use crate::http::Rejection;
use crate::metrics::DropReason;
use crate::output::Frame;
use crate::output::{BackendId, CloseReason, Event, Output};
use crate::routed_id::SessionId;
use crate::settings::OnBackendExit;
use crate::supervise::{AfterExit, Exit};
use crate::{sse, streamable};

impl Hub {
    /// The process of [`Output::SpawnBackend`] runs as `pid`.
    pub fn handle_backend_spawned(&mut self, now: Instant, backend: BackendId, pid: u32) {
        if !self.backend.spawned(now, backend, pid) {
            return;
        }
        self.log(Event::BackendStarted { pid });
        // A process after a crash with sessions kept is first initialized as the last one
        // was; until then client lines wait.
        match self.router.restore() {
            Some(line) => self.queue_line(line, LineFrom::Proxy),
            None => self.release_waiting(now),
        }
        if let Phase::Stopping { .. } = self.backend.phase() {
            // SIGTERM arrived while it was being started: stop it like any other.
            self.close_stdin();
        }
    }

    /// The process of [`Output::SpawnBackend`] could not be started.
    pub fn handle_spawn_failed(&mut self, now: Instant, backend: BackendId, error: String) {
        let Some(ever_started) = self.backend.spawn_failed(backend) else {
            return;
        };
        self.log(Event::SpawnFailed { error });
        if let Phase::Stopping { status, .. } = self.backend.phase() {
            self.exit(status);
            return;
        }
        if !ever_started {
            // A command that never ran is a configuration error, not a crash to ride out.
            self.log(Event::ShuttingDown { status: 1 });
            self.begin_stop(now, 1);
            return;
        }
        self.after_exit(now, Exit::SpawnFailed, Duration::ZERO);
    }

    /// `backend` exited: its sessions end and the restart policy decides what follows.
    pub fn handle_backend_exited(&mut self, now: Instant, backend: BackendId, exit: Exit) {
        let Some((pid, ran_for)) = self.backend.exited(now, backend) else {
            return;
        };
        self.log(Event::BackendExited { pid, exit });
        if let Phase::Stopping { status, .. } = self.backend.phase() {
            self.router.backend_exited(false);
            self.exit(status);
            return;
        }
        if self.settings.on_backend_exit == OnBackendExit::CloseSessions {
            self.router.backend_exited(false);
            self.end_all_sessions(now, CloseReason::BackendExited);
            self.settle_waiting(now, Rejection::BackendDown);
            self.after_exit(now, exit, ran_for);
            return;
        }
        match self.backend.after_exit(now, exit, ran_for) {
            AfterExit::Restart { after } => {
                // Sessions stay; what the old process was asked is answered here.
                self.router.backend_exited(true);
                self.observe(now, Happened::Restarted);
                self.fail_in_flight(now);
                for request in self.backend.all_health() {
                    self.respond_health(now, request, false);
                }
                self.log(Event::Restarting { after });
            }
            AfterExit::Shutdown { status } => {
                self.router.backend_exited(false);
                self.end_all_sessions(now, CloseReason::BackendExited);
                self.settle_waiting(now, Rejection::BackendDown);
                self.log(Event::ShuttingDown { status });
                self.begin_stop(now, status);
            }
        }
    }

    /// Every request the exited backend was asked and had not answered gets -32603
    /// `backend restarted`, under its own id, in session creation order.
    fn fail_in_flight(&mut self, now: Instant) {
        let numbers: Vec<SessionNumber> = self.sessions.iter().map(|(n, _)| n).collect();
        for number in numbers {
            self.end_mcp(now, number, Ending::Restarted);
            let Some(Kind::Legacy { stream }) = self.sessions.get(number).map(|s| &s.kind) else {
                continue;
            };
            let stream = *stream;
            for (_, tracked) in self.in_flight.take_all(number) {
                let message =
                    streamable::error_message(&tracked.raw_id, -32603, "backend restarted");
                self.metrics.delivered += 1;
                self.send(now, stream, Frame::Owned(sse::message_event(&message)));
                if let Some(started) = tracked.audit {
                    let answered = Happened::Answered {
                        session: number,
                        started,
                        message: &message,
                        outcome: Some(crate::audit::Outcome::Error),
                    };
                    self.observe(now, answered);
                }
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
            self.queue_line(line, LineFrom::Proxy);
        }
        for uri in self.sessions.watched() {
            let line = self.router.subscribe(&uri);
            self.queue_line(line, LineFrom::Proxy);
        }
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
        self.log(Event::ShutdownRequested);
        self.begin_stop(now, 0);
    }

    /// The backend part's timers: the restart, a stop step, the periodic ping, and the
    /// silence that makes the backend unresponsive.
    pub(super) fn backend_timeouts(&mut self, now: Instant) {
        if self.backend.restart_due(now) {
            self.spawn_backend(now);
        }
        match self.backend.stop_due(now) {
            Some(StopStep::Signal(signal)) => {
                if let Some(backend) = self.backend.current() {
                    self.log(Event::StillRunning { signal });
                    self.outputs
                        .push_back(Output::SignalBackend { backend, signal });
                }
            }
            Some(StopStep::GiveUp(status)) => {
                self.log(Event::GaveUpWaiting);
                self.exit(status);
            }
            None => {}
        }
        if self.backend.periodic_ping_due(now) {
            self.send_ping(now);
        }
        if let Some(silent) = self.backend.newly_unresponsive(now) {
            self.log(Event::Unresponsive { silent });
        }
    }

    /// The backend answered health ping `ping`.
    pub(super) fn pong(&mut self, now: Instant, ping: u64) {
        let (settled, was_unresponsive) = self.backend.pong(now, ping);
        if was_unresponsive {
            self.log(Event::Responsive);
        }
        for request in settled {
            self.respond_health(now, request, true);
        }
    }

    pub(super) fn spawn_backend(&mut self, _now: Instant) {
        let backend = BackendId(self.mint());
        self.backend.spawning(backend);
        self.outputs.push_back(Output::SpawnBackend { backend });
    }

    fn after_exit(&mut self, now: Instant, exit: Exit, ran_for: Duration) {
        match self.backend.after_exit(now, exit, ran_for) {
            AfterExit::Restart { after } => self.log(Event::Restarting { after }),
            AfterExit::Shutdown { status } => {
                self.log(Event::ShuttingDown { status });
                self.begin_stop(now, status);
            }
        }
    }

    /// Every POST waiting for the backend is refused, every `/health` request answered.
    fn settle_waiting(&mut self, now: Instant, rejection: Rejection) {
        for post in self.posts.take_all() {
            self.refuse(now, post.request, rejection);
        }
        for request in self.backend.all_health() {
            self.respond_health(now, request, false);
        }
    }

    fn begin_stop(&mut self, now: Instant, status: i32) {
        self.outputs.push_back(Output::StopAccepting);
        self.end_all_sessions(now, CloseReason::Shutdown);
        self.settle_waiting(now, Rejection::BackendDown);
        if self.backend.begin_stop(now, status) {
            self.close_stdin();
        } else {
            self.exit(status);
        }
    }

    fn close_stdin(&mut self) {
        // Lines still waiting go first, as they would have in the shell's queue.
        self.backend.release(&mut self.outputs, true);
        if let Some(backend) = self.backend.close_stdin() {
            self.outputs
                .push_back(Output::CloseBackendStdin { backend });
        }
    }

    fn exit(&mut self, status: i32) {
        self.backend.exit();
        self.streams.clear();
        self.outputs.push_back(Output::Exit {
            status,
            drain: EXIT_DRAIN,
        });
    }

    /// Ends every live session in creation order; a Streamable session's requests in
    /// flight are answered first. Unsubscribes for a backend that is gone or going are not
    /// sent.
    fn end_all_sessions(&mut self, now: Instant, reason: CloseReason) {
        let ending = match reason {
            CloseReason::BackendExited => Ending::BackendExited,
            _ => Ending::Shutdown,
        };
        let live: Vec<(SessionNumber, SessionId)> =
            self.sessions.iter().map(|(n, s)| (n, s.id)).collect();
        for (number, id) in live {
            self.close_kind(now, number, ending);
            if self.sessions.get(number).is_none() {
                // It never opened: its initialize was answered with an error just now.
                continue;
            }
            self.closing(now, number);
            self.metrics.sessions_closed += 1;
            self.log(Event::SessionClosed {
                session: id,
                reason,
            });
        }
        self.sessions.close_all();
        self.in_flight.clear();
        self.streams.clear();
    }

    /// Session `number` ends: each legacy request still unanswered is awaited no longer,
    /// then the session is closed, as observed.
    fn closing(&mut self, now: Instant, number: SessionNumber) {
        let unanswered = match self.sessions.get(number).map(|s| &s.kind) {
            Some(Kind::Legacy { .. }) => self.in_flight.take_all(number),
            _ => Vec::new(),
        };
        for started in unanswered.into_iter().filter_map(|(_, entry)| entry.audit) {
            self.observe(now, Happened::Unanswered(Some(number), started));
        }
        self.observe(now, Happened::Closed(number));
    }

    /// Ends one session (its stream ended, DELETE, idle): its streams end, its requests in
    /// flight are answered (and cancelled at the backend), and the uris only it watched are
    /// unsubscribed.
    pub(super) fn end_session(&mut self, now: Instant, number: SessionNumber, reason: CloseReason) {
        if self.sessions.get(number).is_none() {
            return;
        }
        self.close_kind(now, number, Ending::Deleted);
        self.closing(now, number);
        self.in_flight.forget(number);
        let Some((session, released)) = self.sessions.close(number) else {
            return;
        };
        self.metrics.sessions_closed += 1;
        self.log(Event::SessionClosed {
            session: session.id,
            reason,
        });
        for uri in released {
            let line = self.router.unsubscribe(&uri);
            self.queue_line(line, LineFrom::Proxy);
        }
    }

    /// Ends what a session holds while it is still in the table: its stream, or its
    /// requests in flight and streams.
    fn close_kind(&mut self, now: Instant, number: SessionNumber, ending: Ending) {
        for _ in 0..self.backend.forget(number) {
            self.drop_message(DropReason::SessionGone, None);
        }
        let legacy = match self.sessions.get(number).map(|s| &s.kind) {
            Some(Kind::Legacy { stream, .. }) => Some(*stream),
            Some(Kind::Mcp(_)) => None,
            None => return,
        };
        match legacy {
            Some(stream) => self.end_stream(stream),
            None => self.end_mcp(now, number, ending),
        }
    }
}
