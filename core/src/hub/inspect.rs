//! What the hub's tables hold, read without changing anything: the Prometheus text of
//! `/metrics`, and what the tests check (that timers and tables hold only what is live).

use super::Hub;
use crate::metrics::{self, ShellGauges};
use crate::output::StreamId;
use crate::routed_id::SessionId;

/// What [`Inspect::table_sizes`] counts (for tests).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableSizes {
    /// Streams open (legacy, GET and request streams).
    pub streams: usize,
    /// Streamable requests in flight.
    pub in_flight: usize,
    /// Progress tokens of requests in flight (one per request carrying one).
    pub progress_tokens: usize,
    /// Request timeout timers.
    pub request_timers: usize,
    /// Idle expiry timers.
    pub idle_timers: usize,
    /// Subscriptions, as (session, uri) pairs in the per-session and the per-uri sets.
    pub subscriptions: (usize, usize),
    /// Resume window timers of dropped or answered Streamable streams.
    pub resume_timers: usize,
    /// Bytes of Streamable events kept for resumption, over every session.
    pub resume_bytes: usize,
    /// Principals counted for `--max-sessions-per-principal` (those with a live session).
    pub principals: usize,
    /// Tasks with an owner, and owners holding tasks or cursors (SPEC section 15).
    pub tasks: (usize, usize),
}

/// A read-only view of a [`Hub`] ([`Hub::inspect`]).
#[derive(Debug, Clone, Copy)]
pub struct Inspect<'a> {
    pub(super) hub: &'a Hub,
}

impl Inspect<'_> {
    /// How many timer entries the hub holds (keep-alives, request timeouts, idle checks):
    /// bounded by the streams, requests in flight and sessions that are live, never by how
    /// many requests came before (SPEC section 6, item 6).
    pub fn pending_timers(&self) -> usize {
        self.hub.streams.timers()
            + self.hub.in_flight.timers()
            + self.hub.sessions.idle_timers.len()
            + self.hub.sessions.resume_timers.len()
    }

    /// Live sessions.
    pub fn live_sessions(&self) -> usize {
        self.hub.sessions.len()
    }

    /// Whether `session` is live.
    pub fn is_live(&self, session: &SessionId) -> bool {
        self.hub.sessions.find(session).is_some()
    }

    /// Entry counts of the hub's per-session tables, summed over every session, so a test
    /// can check that a session leaves nothing behind when it ends. Not for shells.
    #[doc(hidden)]
    pub fn table_sizes(&self) -> TableSizes {
        let (in_flight, progress_tokens) = self.hub.in_flight.sizes();
        TableSizes {
            streams: self.hub.streams.len(),
            in_flight,
            progress_tokens,
            request_timers: self.hub.in_flight.timers(),
            idle_timers: self.hub.sessions.idle_timers.len(),
            subscriptions: self.hub.sessions.subscription_count(),
            resume_timers: self.hub.sessions.resume_timers.len(),
            resume_bytes: self.hub.sessions.resume_bytes(),
            principals: self.hub.sessions.principals(),
            tasks: self.hub.tasks.sizes(),
        }
    }

    /// The session a stream serves, while both are live.
    pub fn stream_session(&self, stream: StreamId) -> Option<SessionId> {
        let state = self.hub.streams.get(stream)?;
        self.hub.sessions.get(state.session?).map(|s| s.id)
    }

    /// The Prometheus text for `/metrics`.
    pub fn metrics_text(&self) -> String {
        let gauges = ShellGauges {
            live_sessions: self.hub.sessions.len(),
            backend_running: self.hub.backend.is_up(),
            backend_restarts: self.hub.backend.restarts(),
            instance: self.hub.settings.instance,
        };
        let mut text = metrics::render(&self.hub.metrics, gauges);
        metrics::render_list_cache(&mut text, &self.hub.router.lists.counts);
        text
    }

    /// Client requests written to the backend and not yet ended: the backend window's
    /// use (SPEC section 12; never more than `--backend-window`).
    pub fn backend_window(&self) -> usize {
        self.hub.backend.in_window()
    }

    /// Audit contexts of requests not answered yet (tests check they never outnumber them).
    pub fn audit_pending(&self) -> usize {
        self.hub.exchanges.observed()
    }
}
