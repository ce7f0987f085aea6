//! Requests the hub has yet to answer, as the loop keeps them: where each one's answer
//! goes, and the ticket its handler holds, so that a handler whose client left can say so
//! without knowing the hub's [`RequestId`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use switchboard_core::RequestId;

/// A new ticket, unique for the process's life, for a request handed to the loop.
pub fn ticket() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Where each unanswered request's answer goes (`R`: a reply channel), by the hub's id
/// and by the handler's ticket.
pub struct Pending<R> {
    replies: HashMap<RequestId, (Option<u64>, R)>,
    tickets: HashMap<u64, RequestId>,
}

impl<R> Default for Pending<R> {
    fn default() -> Self {
        Pending {
            replies: HashMap::new(),
            tickets: HashMap::new(),
        }
    }
}

impl<R> Pending<R> {
    /// `request`'s answer goes to `reply`; its handler holds `ticket`, if any.
    pub fn insert(&mut self, request: RequestId, ticket: Option<u64>, reply: R) {
        if let Some(ticket) = ticket {
            self.tickets.insert(ticket, request);
        }
        self.replies.insert(request, (ticket, reply));
    }

    /// Where `request`'s answer goes, once: it is no longer pending.
    pub fn take(&mut self, request: RequestId) -> Option<R> {
        let (ticket, reply) = self.replies.remove(&request)?;
        if let Some(ticket) = ticket {
            self.tickets.remove(&ticket);
        }
        Some(reply)
    }

    /// The handler holding `ticket` saw its client leave: the request it waited for, if
    /// it is still unanswered (it is then forgotten: nobody waits for its answer).
    pub fn left(&mut self, ticket: u64) -> Option<RequestId> {
        let request = self.tickets.remove(&ticket)?;
        self.replies.remove(&request);
        Some(request)
    }
}
