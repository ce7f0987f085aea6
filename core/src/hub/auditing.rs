//! The observer: what happens to requests and sessions comes here as [`Happened`] values,
//! with the hub's `now`, through `Hub::observe`, and nowhere else; the audit log
//! (SPEC section 11) is their reader. A request's context is noted when it arrives,
//! completed once its message is read, and then either answered at once (a refusal: its
//! event is written with the HTTP answer) or carried with the request in its in-flight
//! entry (an `in_flight::Entry`, of either transport) until its JSON-RPC answer. Routing
//! never looks at any of it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::exchanges::{Exchanges, Started};
use super::measuring::{self, Measuring};
use super::sessions::{Kind, SessionNumber, Sessions};
use super::spans;
use super::Hub;
use crate::audit::Asked;
use crate::audit::{cut, field, AuditRecord, AuditType, ClientInfo, Outcome, Transport};
use crate::framing::FramingError;
use crate::http::{Body, Endpoint, Rejection, Request, Response};
use crate::message::Checked;
use crate::output::{Event, Lost, Output, RequestId};
use crate::settings::{Audit, Settings};
use crate::trace::{Ending, EndingRead, ServerSpan};

/// What happened to a request or a session, as the hub's decisions produce it.
#[derive(Debug)]
pub(super) enum Happened<'a> {
    /// The shell refused a request before the hub saw it.
    TurnedAway(Refusal, Asked),
    /// A request was refused with `response` (its exchange's answer).
    Refused(Box<Started>, &'a Response),
    /// A request's JSON-RPC answer `message` went out; `outcome` is the proxy's own
    /// verdict, `None` for the backend's answer.
    Answered {
        /// `None`: a 2026-07-28 request, which has no session.
        session: Option<SessionNumber>,
        started: Box<Started>,
        message: &'a [u8],
        outcome: Option<Outcome>,
    },
    /// A request is awaited no longer and gets no answer through the proxy: cancelled, its
    /// stream gone for good, not kept, timed out, its client gone before it was forwarded,
    /// its session ended.
    Unanswered(Option<SessionNumber>, Box<Started>),
    /// A session opened.
    Opened(SessionNumber),
    /// A session closed; the fault it was ended for, if the proxy ended it for one.
    Closed(SessionNumber, Option<&'static str>),
}

impl<'a> Happened<'a> {
    /// Request `started` of session `session` was answered with `message`.
    pub(super) fn answered(
        session: impl Into<Option<SessionNumber>>,
        started: Box<Started>,
        message: &'a [u8],
        outcome: Option<Outcome>,
    ) -> Self {
        Happened::Answered {
            session: session.into(),
            started,
            message,
            outcome,
        }
    }

    /// How a request ended, if this is a request's end.
    fn ending(&self) -> Option<Ending<'a>> {
        match *self {
            Happened::Refused(_, response) => {
                Some(Ending::Refused(response.status, &response.body))
            }
            Happened::Answered { message, .. } => Some(Ending::Answered(message)),
            Happened::Unanswered(..) => Some(Ending::Unanswered),
            _ => None,
        }
    }
}

/// The audit log's reader of what happened, over the parts it reads.
struct Auditor<'a> {
    audit: &'a Audit,
    sessions: &'a mut Sessions,
    outputs: &'a mut VecDeque<Output>,
}

/// Why the shell refused a request before the hub saw it ([`Hub::handle_refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The gate's refusal ([`crate::http::Gate::admit`]).
    Gate(Rejection),
    /// The HTTP/1.1 framing rules', for a request whose head was read
    /// ([`crate::framing::check_head`], the pipeline count, a body that is not framed
    /// correctly).
    Framing(FramingError),
}

/// A request the shell refused (and answered) before the hub saw it: what the hub counts,
/// audits and, for a token naming a key its issuer's key sets lack, refetches
/// ([`Hub::handle_refused`]).
#[derive(Debug)]
pub struct TurnedAway {
    /// Who refused it, and why.
    pub why: Refusal,
    /// Where it came from and what it asked for, for its audit event.
    pub asked: crate::audit::Asked,
    /// The issuer a token naming an unknown key claims (not verified).
    pub claimed_issuer: Option<Arc<str>>,
}

impl TurnedAway {
    /// The gate's refusal: the answer to send, and what the hub is told.
    pub fn by_gate(refused: crate::http::Refused) -> (crate::http::Response, TurnedAway) {
        let turned_away = TurnedAway {
            why: Refusal::Gate(refused.rejection),
            asked: refused.asked,
            claimed_issuer: refused.claimed_issuer,
        };
        (refused.response, turned_away)
    }

    /// The framing rules' refusal of a request whose head was read (the shell answers it
    /// with [`FramingError::response`]).
    pub fn by_framing(error: FramingError, asked: crate::audit::Asked) -> TurnedAway {
        let why = Refusal::Framing(error);
        TurnedAway {
            why,
            asked,
            claimed_issuer: None,
        }
    }
}

impl Hub {
    /// `count` records of kind `what` did not reach their sink (the shell's queue was
    /// full, or the writer or exporter failed): counted; the first lost audit event is
    /// logged.
    pub fn handle_lost(&mut self, what: Lost, count: u64) {
        match what {
            Lost::AuditEvents if count > 0 => {
                if self.metrics.audit_dropped == 0 {
                    self.outputs.push_back(Output::Log(Event::AuditDropped));
                }
                self.metrics.audit_dropped += count;
            }
            Lost::AuditEvents => {}
            Lost::Spans => self.metrics.otel_dropped += count,
        }
    }

    /// The one place what happened is read: by the histograms, by the spans (while they are made), then by
    /// the audit log (while auditing is on).
    pub(super) fn observe(&mut self, now: Instant, mut happened: Happened<'_>) {
        let measuring = Measuring {
            durations: &mut self.metrics.durations,
            outputs: &mut self.outputs,
            exported: self.settings.tracing.is_some(),
        };
        // A request's ending is read once, for its histograms and its spans alike.
        let read = happened.ending().map(Ending::attributes);
        measured((measuring, &self.sessions), now, &happened, read.as_ref());
        if let (Some(_), Some(read)) = (&self.settings.tracing, &read) {
            let parts = (&self.sessions, &mut self.outputs);
            traced(parts, now, &mut happened, read);
        }
        let Some(audit) = &self.settings.audit else {
            return;
        };
        let mut auditor = Auditor {
            audit,
            sessions: &mut self.sessions,
            outputs: &mut self.outputs,
        };
        match happened {
            Happened::TurnedAway(why, asked) => auditor.turned_away(why, asked),
            Happened::Refused(started, response) => auditor.refused(now, *started, response),
            Happened::Answered {
                session,
                started,
                message,
                outcome,
            } => {
                let outcome = outcome.unwrap_or_else(|| Outcome::of_answer(message));
                let data = (audit.include_data).then(|| String::from_utf8_lossy(message));
                let size = Some(message.len());
                let record = auditor.record(now, *started, outcome, size, data.as_deref());
                auditor.emit_in(session, record);
            }
            Happened::Unanswered(session, started) => {
                let record = auditor.record(now, *started, Outcome::Error, None, None);
                auditor.emit_in(session, record);
            }
            Happened::Opened(number) => auditor.session(number, AuditType::SessionOpen),
            Happened::Closed(number, _) => auditor.session(number, AuditType::SessionClose),
        }
    }
}

/// What happened, as the histograms read it.
fn measured(
    (mut measuring, sessions): (Measuring<'_>, &Sessions),
    now: Instant,
    happened: &Happened<'_>,
    read: Option<&EndingRead>,
) {
    let id = |number: SessionNumber| sessions.get(number).map(|s| s.id);
    match (happened, read) {
        (Happened::Refused(started, _), Some(read)) => measuring.operation(now, started, read),
        (
            Happened::Answered {
                started,
                message,
                outcome,
                ..
            },
            Some(read),
        ) => {
            // The backend's answer, whoever judged it (the router reads a session's; the
            // proxy's own answers are no lists): a list teaches the labels, from any caller.
            if !matches!(outcome, Some(Outcome::Denied | Outcome::Error)) {
                measuring.answered_by_backend(started, message);
            }
            measuring.operation(now, started, read);
        }
        (Happened::Unanswered(_, started), Some(read)) => measuring.operation(now, started, read),
        (Happened::Opened(number), _) => {
            if let Some(id) = id(*number) {
                measuring.opened(now, id);
            }
        }
        (Happened::Closed(number, fault), _) => {
            if let Some(id) = id(*number) {
                measuring.closed(now, id, *fault);
            }
        }
        _ => {}
    }
}

/// What happened, as the spans read it.
fn traced(
    (sessions, outputs): (&Sessions, &mut VecDeque<Output>),
    now: Instant,
    happened: &mut Happened<'_>,
    read: &EndingRead,
) {
    let id = |number: SessionNumber| sessions.get(number).map(|s| s.id);
    match happened {
        Happened::Refused(started, _) => spans::end(outputs, now, started, read, None),
        Happened::Answered {
            session, started, ..
        } => spans::end(outputs, now, started, read, session.and_then(id)),
        Happened::Unanswered(session, started) => {
            spans::end(outputs, now, started, read, session.and_then(id))
        }
        _ => {}
    }
}

/// A request arrived: its observation context, while auditing is on or its SERVER span
/// is sampled (a POST's JSON-RPC request, with spans made).
pub(super) fn arrived(
    (settings, router): (&Settings, &crate::router::Router),
    now: Instant,
    req: &mut Request,
) -> Option<Box<Started>> {
    let posted = matches!(req.endpoint, Endpoint::Messages | Endpoint::McpPost);
    // A legacy session names no version on its POSTs: the one it negotiated is the
    // backend's handshake's, which answered every session's `initialize`.
    let negotiated = (req.endpoint == Endpoint::Messages)
        .then(|| router.negotiated_version())
        .flatten();
    let protocol = req.mcp.protocol_version.as_deref().or(negotiated);
    let trace = match (&settings.tracing, req.trace.take(), &req.body) {
        (Some(tracing), Some(headers), Body::Message(msg)) if posted => {
            ServerSpan::begin(*headers, protocol, msg, tracing)
        }
        _ => None,
    };
    let measured = posted && matches!(req.body, Body::Message(_));
    if settings.audit.is_none() && !measured {
        return None;
    }
    let (kind, transport) = audited_as(req.endpoint)?;
    let modern = matches!(&req.body, Body::Message(msg) if msg.modern.is_some());
    let session = session_named(req);
    Some(Box::new(Started {
        at: now,
        kind,
        method: None,
        name: None,
        backend_tool: None,
        request_id: None,
        request: None,
        source: req.source.clone(),
        transport,
        principal: req.principal.clone(),
        session,
        modern,
        op: crate::metrics::Operation {
            protocol: match modern {
                true => Some(crate::http::MODERN_VERSION),
                false => protocol.map(crate::metrics::version_label),
            },
            ..Default::default()
        },
        trace,
    }))
}

/// The record a request to `endpoint` starts, and its transport (`None`: no record). A
/// `GET /mcp` or `DELETE /mcp` is audited only when refused (as `mcp_request` and
/// `session_close`): an opened stream is no request, and a session that ends says so itself.
fn audited_as(endpoint: Endpoint) -> Option<(AuditType, Transport)> {
    Some(match endpoint {
        Endpoint::Stream => (AuditType::SessionOpen, Transport::Sse),
        Endpoint::Messages => (AuditType::Request, Transport::Sse),
        Endpoint::McpPost | Endpoint::McpGet => (AuditType::Request, Transport::Streamable),
        Endpoint::McpDelete => (AuditType::SessionClose, Transport::Streamable),
        _ => return None,
    })
}

/// The session a request names: a legacy POST's `session_id`, else its `Mcp-Session-Id`.
/// A 2026-07-28 request joins no session: `Mcp-Session-Id` is ignored (SPEC 13).
fn session_named(req: &Request) -> Option<crate::routed_id::SessionId> {
    match (req.endpoint, &req.body) {
        (_, Body::Message(msg)) if msg.modern.is_some() => None,
        (Endpoint::Messages, _) => crate::routed_id::SessionId::parse(&req.session),
        _ => (req.mcp.session.as_deref()).and_then(crate::routed_id::SessionId::parse),
    }
}

impl Auditor<'_> {
    /// A refusal's event: the JSON-RPC message its response carries, if any, is the
    /// response as sent.
    fn refused(&mut self, now: Instant, started: Started, response: &Response) {
        let message = (response.body)
            .starts_with(b"{\"jsonrpc\"")
            .then_some(&response.body[..]);
        let outcome = Outcome::of_refusal(response.status);
        let text = message.map(String::from_utf8_lossy);
        let size = message.map(<[u8]>::len);
        let mut record = self.record(now, started, outcome, size, text.as_deref());
        // The client of the session it named, only if that session is the caller's own (a
        // 404 for another's session says nothing of that session's client).
        let session = record.session.and_then(|sid| self.sessions.find(&sid));
        let session = session.and_then(|n| self.sessions.get(n));
        record.client = session
            .filter(|s| record.user.as_ref() == Some(&s.principal))
            .and_then(|s| s.client.clone());
        self.emit(record);
    }

    /// A session opened or closed (`success`).
    fn session(&mut self, number: SessionNumber, kind: AuditType) {
        let Some(session) = self.sessions.get(number) else {
            return;
        };
        let mut record = plain(self.audit, kind, Outcome::Success);
        record.source = session.source.clone();
        record.transport = Some(match session.kind {
            Kind::Legacy { .. } => Transport::Sse,
            Kind::Mcp(_) => Transport::Streamable,
        });
        record.session = Some(session.id);
        record.user = Some(session.principal.clone());
        record.client = session.client.clone();
        self.emit(record);
    }

    /// The shell refused a request before the hub saw it: one event, `auth_failure`
    /// (`denied`) for a refused credential, else the event [`Asked::kind`] names with the
    /// outcome of its status ([`Outcome::of_refusal`]); its endpoint and transport from
    /// what it asked.
    fn turned_away(&mut self, why: Refusal, asked: Asked) {
        let (kind, status) = match why {
            Refusal::Gate(Rejection::Unauthorized(_)) => (AuditType::AuthFailure, 401),
            Refusal::Gate(rejection) => (asked.kind, rejection.status()),
            Refusal::Framing(error) => (asked.kind, error.status()),
        };
        let mut record = plain(self.audit, kind, Outcome::of_refusal(status));
        record.source = asked.source;
        record.transport = asked.transport;
        record.path = asked.path;
        self.emit(record);
    }

    /// A request's event at `now`.
    fn record(
        &self,
        now: Instant,
        started: Started,
        outcome: Outcome,
        response_size: Option<usize>,
        response: Option<&str>,
    ) -> AuditRecord {
        let data = started.request.map(|(request, cut_request)| {
            let (response, cut_response) = cut(response.unwrap_or_default(), self.audit.max_data);
            (request, response.to_owned(), cut_request || cut_response)
        });
        AuditRecord {
            kind: started.kind,
            outcome,
            transport: Some(started.transport),
            protocol_version: started.modern.then_some(crate::modern::VERSION),
            path: None,
            duration_ms: now.saturating_duration_since(started.at).as_millis() as u64,
            response_size,
            source: started.source,
            session: started.session,
            request_id: started.request_id,
            user: Some(started.principal),
            client: None,
            target_name: started.name,
            backend_tool: started.backend_tool,
            method: started.method,
            base_path: self.audit.base_path.clone(),
            data,
            max_data: self.audit.max_data,
        }
    }

    /// Emits a request's `record`, naming its session (`number`) and that session's client.
    fn emit_in(&mut self, number: Option<SessionNumber>, mut record: AuditRecord) {
        if let Some(session) = number.and_then(|n| self.sessions.get(n)) {
            record.session = Some(session.id);
            record.client = session.client.clone();
        }
        self.emit(record);
    }

    fn emit(&mut self, record: AuditRecord) {
        self.outputs.push_back(Output::Audit(Box::new(record)));
    }
}

/// The message of request `request` was read: its observation context learns its type,
/// method, target and id (the histograms' labels, the audit record's fields). A
/// notification keeps its context too: accepted, it produces no event (its accept path
/// drops the context); refused, its refusal does. Nothing happened yet: nothing is observed.
pub(super) fn described(
    (exchanges, settings): (&mut Exchanges, &Settings),
    request: RequestId,
    msg: &Checked,
) {
    let Some(started) = exchanges.started_mut(request) else {
        return;
    };
    measuring::described(started, msg);
    let Some(audit) = &settings.audit else {
        return;
    };
    started.kind = AuditType::of_method(&msg.method);
    started.method = Some(field(&msg.method));
    started.name = msg.name.as_deref().or(msg.uri.as_deref()).map(field);
    started.request_id = msg.id.is_some().then(|| msg.raw_id().to_owned());
    started.request = (audit.include_data).then(|| {
        let (text, truncated) = cut(msg.text(), audit.max_data);
        (text.to_owned(), truncated)
    });
}

/// Remembers the `clientInfo` of session `number`'s `initialize` for its events.
pub(super) fn introduced(
    (sessions, settings): (&mut Sessions, &Settings),
    number: SessionNumber,
    msg: &Checked,
) {
    if settings.audit.is_none() || !msg.is_request("initialize") {
        return;
    }
    #[derive(serde::Deserialize)]
    struct Params {
        params: Option<Init>,
    }
    #[derive(serde::Deserialize)]
    struct Init {
        #[serde(rename = "clientInfo")]
        client_info: Option<ClientInfo>,
    }
    let info = serde_json::from_str::<Params>(msg.text()).ok();
    let info = info
        .and_then(|p| p.params?.client_info)
        .map(|info| ClientInfo {
            name: info.name.as_deref().map(field),
            version: info.version.as_deref().map(field),
        });
    if let Some(session) = sessions.get_mut(number) {
        session.client = info.map(Arc::new);
    }
}

/// The backend exited and is restarted: the audit log's `backend_restart` event.
pub(super) fn restarted((settings, outputs): (&Settings, &mut VecDeque<Output>)) {
    if let Some(audit) = &settings.audit {
        let record = plain(audit, AuditType::BackendRestart, Outcome::Error);
        outputs.push_back(Output::Audit(Box::new(record)));
    }
}

/// An event with no request behind it.
fn plain(audit: &Audit, kind: AuditType, outcome: Outcome) -> AuditRecord {
    AuditRecord {
        kind,
        outcome,
        transport: None,
        protocol_version: None,
        path: None,
        duration_ms: 0,
        response_size: None,
        source: Arc::default(),
        session: None,
        request_id: None,
        user: None,
        client: None,
        target_name: None,
        backend_tool: None,
        method: None,
        base_path: audit.base_path.clone(),
        data: None,
        max_data: audit.max_data,
    }
}
