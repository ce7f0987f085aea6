//! SPEC section 11: the hub's audit records. A POST's context is noted when it arrives,
//! completed once its message is read, and then either answered at once (a refusal: its
//! event is written with the HTTP answer) or carried with the request in flight (legacy:
//! the session's bounded in-flight table; Streamable: its `InFlight` entry) until its
//! JSON-RPC answer. Routing never looks at any of it.

use std::sync::Arc;
use std::time::Instant;

use super::exchanges::Started;
use super::sessions::SessionNumber;
use super::Hub;
use crate::audit::Asked;
use crate::audit::{cut, field, AuditRecord, AuditType, ClientInfo, Outcome, Source, Transport};
use crate::framing::FramingError;
use crate::http::{Endpoint, Rejection, Request};
use crate::message::Checked;
use crate::output::{Event, Output, RequestId};

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
    /// `lost` audit events did not reach the log (the shell's queue was full, or the
    /// writer failed): counted, the first drop logged.
    pub fn handle_audit_dropped(&mut self, lost: u64) {
        if lost == 0 {
            return;
        }
        let first = self.metrics.audit_dropped == 0;
        self.metrics.audit_dropped += lost;
        if first {
            self.log(Event::AuditDropped);
        }
    }

    /// Audit contexts of requests not answered yet (tests check they never outnumber them).
    #[doc(hidden)]
    pub fn audit_pending(&self) -> usize {
        self.exchanges.observed()
    }

    /// A request arrived: its observation context, while auditing is on.
    pub(super) fn audit_context(&self, now: Instant, req: &Request) -> Option<Box<Started>> {
        self.settings.audit.as_ref()?;
        // A `GET /mcp` or `DELETE /mcp` is audited only when refused (as `mcp_request` and
        // `session_close`): an opened stream is no request, and a session that ends says
        // so itself.
        let (kind, transport) = match req.endpoint {
            Endpoint::Stream => (AuditType::SessionOpen, Transport::Sse),
            Endpoint::Messages => (AuditType::Request, Transport::Sse),
            Endpoint::McpPost | Endpoint::McpGet => (AuditType::Request, Transport::Streamable),
            Endpoint::McpDelete => (AuditType::SessionClose, Transport::Streamable),
            _ => return None,
        };
        let started = Started {
            at: now,
            kind,
            method: None,
            name: None,
            request_id: None,
            request: None,
            source: req.source.clone(),
            transport,
            principal: req.principal.clone(),
            session: match req.endpoint {
                Endpoint::Messages => crate::routed_id::SessionId::parse(&req.session),
                _ => req
                    .mcp
                    .session
                    .as_deref()
                    .and_then(crate::routed_id::SessionId::parse),
            },
        };
        Some(Box::new(started))
    }

    /// The POST's message was read: its type, method, target and id.
    pub(super) fn audit_describe(&mut self, id: RequestId, msg: &Checked) {
        let Some(audit) = &self.settings.audit else {
            return;
        };
        let Some(started) = self.exchanges.started_mut(id) else {
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
        // A notification keeps its context too: accepted, it produces no event (its accept
        // path drops the context); refused, its refusal does.
    }

    /// The POST was accepted: its context goes with the request in flight.
    pub(super) fn audit_take(&mut self, id: RequestId) -> Option<Box<Started>> {
        self.exchanges.take_started(id)
    }

    /// A request is answered over HTTP with `response` while its context is still with
    /// its exchange: a refusal, written now.
    pub(super) fn audit_refused(
        &mut self,
        now: Instant,
        started: Box<Started>,
        response: &crate::http::Response,
    ) {
        let status = response.status;
        // The JSON-RPC message it carries, if any, is the response as sent.
        let message = response
            .body
            .starts_with(b"{\"jsonrpc\"")
            .then_some(&response.body[..]);
        let outcome = Outcome::of_refusal(status);
        let text = message.map(|m| String::from_utf8_lossy(m).into_owned());
        let mut record = self.record(now, *started, outcome, message.map(<[u8]>::len), text);
        // The client of the session it named, only if that session is the caller's own (a
        // 404 for another's session says nothing of that session's client).
        let session = record.session.and_then(|sid| self.sessions.find(&sid));
        let session = session.and_then(|n| self.sessions.get(n));
        record.client = session
            .filter(|s| record.user.as_ref() == Some(&s.principal))
            .and_then(|s| s.client.clone());
        self.emit(record);
    }

    /// `id`'s client left before it was answered (nothing will be): an `error` event.
    pub(super) fn audit_abandoned(&mut self, now: Instant, id: RequestId) {
        let Some(started) = self.exchanges.close(id).and_then(|e| e.started) else {
            return;
        };
        let record = self.record(now, *started, Outcome::Error, None, None);
        self.emit(record);
    }

    /// A request's JSON-RPC answer `message` went out: its event. `outcome` is the proxy's
    /// own verdict; `None` for the backend's answer (a result succeeded, an error failed).
    pub(super) fn audit_answered(
        &mut self,
        now: Instant,
        number: SessionNumber,
        started: Box<Started>,
        message: &[u8],
        outcome: Option<Outcome>,
    ) {
        let Some(audit) = &self.settings.audit else {
            return;
        };
        let outcome = outcome.unwrap_or_else(|| Outcome::of_answer(message));
        let response = (audit.include_data).then(|| String::from_utf8_lossy(message).into_owned());
        let mut record = self.record(now, *started, outcome, Some(message.len()), response);
        if let Some(session) = self.sessions.get(number) {
            record.session = Some(session.id);
            record.client = session.client.clone();
        }
        self.emit(record);
    }

    /// A session opened (`success`) or closed.
    pub(super) fn audit_session(&mut self, number: SessionNumber, opened: bool) {
        let Some(session) = self.sessions.get(number) else {
            return;
        };
        let kind = match opened {
            true => AuditType::SessionOpen,
            false => AuditType::SessionClose,
        };
        let Some(mut record) = self.plain(kind, Outcome::Success, session.source.clone()) else {
            return;
        };
        record.transport = Some(match session.kind {
            super::sessions::Kind::Legacy { .. } => Transport::Sse,
            super::sessions::Kind::Mcp(_) => Transport::Streamable,
        });
        record.session = Some(session.id);
        record.user = Some(session.principal.clone());
        record.client = session.client.clone();
        self.emit(record);
    }

    /// Session `number` ends: each legacy request still unanswered gets its `error` event,
    /// then the session its `session_close`.
    pub(super) fn audit_closing(&mut self, now: Instant, number: SessionNumber) {
        if self.settings.audit.is_none() {
            return;
        }
        let unanswered = match self.sessions.get_mut(number).map(|s| &mut s.kind) {
            Some(super::sessions::Kind::Legacy { in_flight, .. }) => std::mem::take(in_flight),
            _ => Default::default(),
        };
        for started in unanswered.into_values().filter_map(|t| t.audit) {
            self.audit_unanswered(now, number, started);
        }
        self.audit_session(number, false);
    }

    /// A request of session `number` will not be answered through the proxy (cancelled,
    /// its stream gone for good, its session ending): its `error` event, with no response.
    pub(super) fn audit_unanswered(
        &mut self,
        now: Instant,
        number: SessionNumber,
        started: Box<Started>,
    ) {
        if self.settings.audit.is_none() {
            return;
        }
        let mut record = self.record(now, *started, Outcome::Error, None, None);
        if let Some(session) = self.sessions.get(number) {
            record.session = Some(session.id);
            record.client = session.client.clone();
        }
        self.emit(record);
    }

    /// Notes where session `number` came from and, from its `initialize`, its client.
    pub(super) fn audit_session_origin(&mut self, number: SessionNumber, source: &Arc<Source>) {
        if self.settings.audit.is_none() {
            return;
        }
        if let Some(session) = self.sessions.get_mut(number) {
            session.source = source.clone();
        }
    }

    /// Remembers `clientInfo` of an `initialize` for the session's events.
    pub(super) fn audit_client_info(&mut self, number: SessionNumber, msg: &Checked) {
        if self.settings.audit.is_none() || !msg.is_request("initialize") {
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
        if let Some(session) = self.sessions.get_mut(number) {
            session.client = info.map(Arc::new);
        }
    }

    /// The shell refused a request before the hub saw it: one event, `auth_failure`
    /// (`denied`) for a refused credential, else the event [`Asked::kind`] names with the
    /// outcome of its status ([`Outcome::of_refusal`]); its endpoint and transport from
    /// what it asked.
    pub(super) fn audit_turned_away(&mut self, why: Refusal, asked: Asked) {
        let (kind, status) = match why {
            Refusal::Gate(Rejection::Unauthorized(_)) => (AuditType::AuthFailure, 401),
            Refusal::Gate(rejection) => (asked.kind, rejection.status()),
            Refusal::Framing(error) => (asked.kind, error.status()),
        };
        let outcome = Outcome::of_refusal(status);
        if let Some(mut record) = self.plain(kind, outcome, asked.source) {
            record.transport = asked.transport;
            record.path = asked.path;
            self.emit(record);
        }
    }

    /// The backend exited and is restarted.
    pub(super) fn audit_restart(&mut self) {
        self.emit_plain(AuditType::BackendRestart, Outcome::Error, Arc::default());
    }

    fn emit_plain(&mut self, kind: AuditType, outcome: Outcome, source: Arc<Source>) {
        if let Some(record) = self.plain(kind, outcome, source) {
            self.emit(record);
        }
    }

    /// An event with no request behind it (`None` while auditing is off).
    fn plain(&self, kind: AuditType, outcome: Outcome, source: Arc<Source>) -> Option<AuditRecord> {
        let audit = self.settings.audit.as_ref()?;
        Some(AuditRecord {
            kind,
            outcome,
            transport: None,
            path: None,
            duration_ms: 0,
            response_size: None,
            source,
            session: None,
            request_id: None,
            user: None,
            client: None,
            target_name: None,
            method: None,
            base_path: audit.base_path.clone(),
            data: None,
            max_data: audit.max_data,
        })
    }

    fn record(
        &self,
        now: Instant,
        started: Started,
        outcome: Outcome,
        response_size: Option<usize>,
        response: Option<String>,
    ) -> AuditRecord {
        let audit = self.settings.audit.as_ref().expect("audited");
        let data = started.request.map(|(request, cut_request)| {
            let response = response.unwrap_or_default();
            let (response, cut_response) = cut(&response, audit.max_data);
            (request, response.to_owned(), cut_request || cut_response)
        });
        AuditRecord {
            kind: started.kind,
            outcome,
            transport: Some(started.transport),
            path: None,
            duration_ms: now.saturating_duration_since(started.at).as_millis() as u64,
            response_size,
            source: started.source,
            session: started.session,
            request_id: started.request_id,
            user: Some(started.principal),
            client: None,
            target_name: started.name,
            method: started.method,
            base_path: audit.base_path.clone(),
            data,
            max_data: audit.max_data,
        }
    }

    fn emit(&mut self, record: AuditRecord) {
        self.outputs.push_back(Output::Audit(Box::new(record)));
    }
}
