//! What the router asks a shell to do. A shell performs each action and nothing else: every
//! protocol decision has already been made.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use crate::routed_id::SessionId;

/// One thing for a shell to do, drained with [`Router::poll_action`](crate::Router::poll_action).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Action {
    /// Write `line` (one JSON-RPC message ending in `\n`) to the backend's stdin: a client's
    /// message with its ids rewritten, in the order accepted.
    Rewrite {
        /// The line, newline included.
        line: Vec<u8>,
    },
    /// Write `line` (ending in `\n`) to the backend's stdin: the proxy's own message (an
    /// answer to a backend request, a health ping, `notifications/initialized`, an
    /// unsubscribe after the last subscriber left). Never delays a client's POST.
    Reply {
        /// The line, newline included.
        line: Vec<u8>,
    },
    /// Send `message` (compact JSON, no raw newline) to exactly this session.
    Deliver {
        /// The session it is for.
        session: SessionId,
        /// The message, original ids restored.
        message: Vec<u8>,
        /// What it is, for a session that routes answers to the request waiting for them.
        what: Delivery,
    },
    /// Queue `message` on every live session's stream (the same bytes, shared).
    Broadcast {
        /// `{"jsonrpc":"2.0","method":M}`, rebuilt by the router.
        message: Arc<[u8]>,
    },
    /// Count and log a message the proxy dropped or answered itself, at `level`.
    Drop {
        /// Why.
        reason: DropReason,
        /// The JSON-RPC method, when there was one.
        method: Option<String>,
        /// How loud.
        level: LogLevel,
    },
    /// The backend answered health ping number `ping`: record it as alive now.
    Pong {
        /// The number the ping went out under.
        ping: u64,
    },
}

/// What a delivered message is. Spans are byte ranges of the message holding the
/// restored id or token as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The answer to the session's request whose id is at `id`.
    Response {
        /// Where the id is in the message.
        id: Range<usize>,
    },
    /// `notifications/progress` for the token at `token`.
    Progress {
        /// Where the token is in the message.
        token: Range<usize>,
    },
    /// `notifications/resources/updated` for a resource the session watches.
    Update,
}

/// Why a backend line (or part of a client's message) went nowhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DropReason {
    /// Not JSON, not one object, or duplicate top-level keys.
    Malformed,
    /// A JSON array (batch) from the backend.
    Batch,
    /// Longer than the maximum line length.
    LineTooLong,
    /// A response whose id the proxy never minted.
    UnroutedResponse,
    /// A response or progress for a session that is no longer live.
    SessionGone,
    /// A `notifications/progress` whose token is not a routed id.
    UnroutedProgress,
    /// A `notifications/resources/updated` no live session subscribed to.
    NoSubscriber,
    /// A broadcast-kind notification while no session is live.
    NoLiveSession,
    /// A notification the proxy cannot attribute (`notifications/message`, ...).
    UnroutableNotification,
    /// The backend sent a request the shared proxy cannot attribute; answered -32601.
    AnsweredServerRequest,
    /// The backend pinged; the proxy answered.
    AnsweredPing,
    /// The backend's stdin queue was full, so a proxy line was not written (shell-side).
    BackendQueueFull,
    /// An answer for a Streamable session's request that is no longer awaited (answered,
    /// cancelled, timed out, or its client hung up).
    NotInFlight,
    /// A message for a Streamable session that has no stream open to carry it.
    NoStream,
}

impl DropReason {
    /// Stable snake_case name, used as a metrics label and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::Batch => "batch",
            DropReason::LineTooLong => "line_too_long",
            DropReason::UnroutedResponse => "unrouted_response",
            DropReason::SessionGone => "session_gone",
            DropReason::UnroutedProgress => "unrouted_progress",
            DropReason::NoSubscriber => "no_subscriber",
            DropReason::NoLiveSession => "no_live_session",
            DropReason::UnroutableNotification => "unroutable_notification",
            DropReason::AnsweredServerRequest => "answered_server_request",
            DropReason::AnsweredPing => "answered_ping",
            DropReason::BackendQueueFull => "backend_queue_full",
            DropReason::NotInFlight => "not_in_flight",
            DropReason::NoStream => "no_stream",
        }
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The level the router chose for a drop: the first of each (reason, method) warns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// The first of its kind.
    Warn,
    /// Seen before.
    Debug,
}
