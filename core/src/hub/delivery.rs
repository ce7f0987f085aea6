//! What a message delivered to one session is, named alike by every path that delivers
//! one: a backend line carried out (`dispatch`), the proxy's own answer (`post`), a
//! Streamable session's stream or JSON answer (`mcp`). A part: it imports no behaviour file.

use std::ops::Range;

use crate::message::IdKey;

/// What a delivered message is. Spans are byte ranges of the message holding the
/// restored id or token as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Delivery {
    /// The answer to the session's request whose id is at `id`; `outcome` is the proxy's
    /// verdict on an answer it made itself (`None`: the backend's, judged by its content).
    Response {
        id: Range<usize>,
        /// The id's key, as the router or the proxy read it on the way in.
        key: Option<IdKey>,
        outcome: Option<crate::audit::Outcome>,
        /// Where the backend's result is in the message, when known as it is.
        result: Option<Range<usize>>,
    },
    /// `notifications/progress` for the token at `token`.
    Progress { token: Range<usize> },
    /// `notifications/resources/updated` for a resource the session watches.
    Update,
}
