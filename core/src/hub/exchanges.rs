//! The exchange table: one record for each HTTP exchange the hub owes an answer, from
//! [`Hub::handle_request`](super::Hub::handle_request) until its one answer (a response, a
//! refusal or a stream's head) leaves through `Hub::respond`, which adds the CORS headers
//! the record keeps. Nothing else carries a request's origin.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::audit::{AuditType, Source, Transport};
use crate::auth::Principal;
use crate::http::{Grant, Rejection, Response};
use crate::output::{RequestId, StreamId};
use crate::routed_id::SessionId;

/// What a request's observers need of it, kept with the request until its outcome is
/// known: in its exchange while that is open, then with the request in flight. Present
/// for every JSON-RPC message posted (its duration is measured), and for other requests
/// while auditing is on.
#[derive(Debug)]
pub(crate) struct Started {
    pub(super) at: Instant,
    pub(super) kind: AuditType,
    pub(super) method: Option<String>,
    pub(super) name: Option<String>,
    /// The backend's name of the tool it called by a shown name (SPEC section 16).
    pub(super) backend_tool: Option<String>,
    pub(super) request_id: Option<String>,
    pub(super) request: Option<(String, bool)>,
    pub(super) source: Arc<Source>,
    pub(super) transport: Transport,
    pub(super) principal: Principal,
    pub(super) session: Option<SessionId>,
    /// A 2026-07-28 request (its event names the revision).
    pub(super) modern: bool,
    /// What its duration is labelled with (SPEC section 14's histograms).
    pub(super) op: crate::metrics::Operation,
    /// Its SERVER span, when spans are made (`--otlp-endpoint`) and it is sampled.
    pub(super) trace: Option<Box<crate::trace::ServerSpan>>,
}

/// What the gate and the policy said of a POST's sender.
#[derive(Debug, Default)]
pub(crate) struct Sender {
    /// What its credential grants (the session keeps it, to filter its lists).
    pub(super) grant: Grant,
    /// The policy denies its message: the proxy answers -32003.
    pub(super) forbidden: bool,
    /// Its audit context, once it is accepted.
    pub(super) started: Option<Box<Started>>,
}

/// One HTTP exchange owed an answer.
#[derive(Debug, Default)]
pub(crate) struct Exchange {
    /// The allowed browser origin its answer names in CORS headers.
    pub(crate) cors: Option<String>,
    /// Its request's observation context, until the request is accepted (it then travels
    /// with the request) or the exchange is answered (a refusal's event).
    pub(crate) started: Option<Box<Started>>,
}

/// How an exchange is answered.
#[derive(Debug)]
pub(crate) enum Answer {
    /// A response that refuses nothing: the request was served or accepted.
    Served(Response),
    /// A refusal (counted), with the response `Rejection` calls for or one built from it
    /// (an id, a challenge, `Retry-After`).
    Refused(Rejection, Response),
    /// The head of a stream that carries the rest.
    Stream(StreamId, Response),
    /// The proxy's own JSON-RPC error for a request it will not forward (SPEC sections 15
    /// and 16): observed as a denial, as a 2025 session's is, not judged by its status.
    Denied(Response),
    /// A rejection, its response built as it goes out (a 503 for want of a backend says
    /// when the backend restarts).
    Rejected(Rejection),
    /// The `/health` report, built as it goes out; whether the backend answered its ping.
    Health(bool),
}

/// The exchanges not answered yet, by id.
#[derive(Debug, Default)]
pub(crate) struct Exchanges {
    open: HashMap<RequestId, Exchange>,
}

impl Exchanges {
    pub(crate) fn open(&mut self, request: RequestId, exchange: Exchange) {
        self.open.insert(request, exchange);
    }

    /// The record of `request`, answered now.
    pub(crate) fn close(&mut self, request: RequestId) -> Option<Exchange> {
        self.open.remove(&request)
    }

    /// The observation context of `request`'s exchange, while it is open.
    pub(crate) fn started_mut(&mut self, request: RequestId) -> Option<&mut Started> {
        self.open.get_mut(&request)?.started.as_deref_mut()
    }

    /// `request` is accepted: its observation context goes with it.
    /// `request` called the backend's tool `name` by another, shown, name.
    pub(crate) fn called_as(&mut self, request: RequestId, name: String) {
        let started = self.open.get_mut(&request).and_then(|e| e.started.as_mut());
        if let Some(started) = started {
            started.backend_tool = Some(name);
        }
    }

    pub(crate) fn take_started(&mut self, request: RequestId) -> Option<Box<Started>> {
        self.open.get_mut(&request)?.started.take()
    }

    /// The origin of `request`, for an answer that writes its own CORS headers.
    pub(crate) fn take_cors(&mut self, request: RequestId) -> Option<String> {
        self.open.get_mut(&request)?.cors.take()
    }

    /// How many open exchanges keep an observation context.
    pub(crate) fn observed(&self) -> usize {
        self.open.values().filter(|e| e.started.is_some()).count()
    }
}

impl From<crate::admission::Refusal> for Answer {
    fn from(refusal: crate::admission::Refusal) -> Self {
        Answer::Refused(refusal.rejection, refusal.response)
    }
}
