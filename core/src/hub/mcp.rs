//! Streamable HTTP sessions on `/mcp` (SPEC section 7): POST, GET and DELETE in their order
//! of checks, and the small in-flight table that says which HTTP answer waits for which
//! routed id. The route to the session is still the id; the table only finds the response.

use std::collections::BTreeMap;
use std::time::Instant;

use super::auditing::Happened;
use super::backend::LineFrom;
use super::dispatch::Delivery;
use super::exchanges::{Answer, Sender};
use super::resume::{Carries, EventLog, StreamKey};
use super::sessions::{Kind, SessionNumber};
use super::{Body, Hub, Request};
use crate::audit::Outcome;
use crate::auth::Principal;
use crate::http::{Rejection, Response};
use crate::message;
use crate::message::Checked;
use crate::message::IdKey;
use crate::metrics::DropReason;
use crate::output::{CloseReason, Event, RequestId};
use crate::routed_id::SessionId;
use crate::streamable::{self, Accepts};

/// A Streamable session's own state beside the sessions table's.
#[derive(Debug, Default)]
pub(crate) struct McpSession {
    /// The standalone GET stream, at most one (its client may be away).
    pub(crate) get_stream: Option<StreamKey>,
    /// Every stream's events, for resumption.
    pub(crate) log: EventLog,
    /// Requests whose answer an HTTP exchange waits for, by id.
    pub(crate) in_flight: BTreeMap<IdKey, InFlight>,
    /// Progress tokens of requests in flight, to the ids of the requests carrying each, in
    /// the order they came (a client may reuse a token; its progress goes to the newest).
    pub(crate) tokens: BTreeMap<IdKey, Vec<IdKey>>,
    /// The last request or stream end, for `--session-idle`.
    pub(crate) last_active: Option<Instant>,
    /// Its `initialize` is unanswered: it has not opened (no one may name it yet).
    pub(crate) opening: bool,
}

impl McpSession {
    /// Whether it may expire: no request in flight and no stream with its client there.
    pub(crate) fn is_quiet(&self) -> bool {
        self.in_flight.is_empty() && self.log.attached().next().is_none()
    }
}

/// One request waiting for its answer.
#[derive(Debug)]
pub(crate) struct InFlight {
    /// The HTTP exchange that gets the answer.
    request: RequestId,
    /// Its SSE stream, when the answer is a stream (else a JSON body).
    stream: Option<StreamKey>,
    /// The id as the client wrote it.
    raw_id: String,
    /// Its progress token, if it carries one.
    token: Option<IdKey>,
    /// Its audit context.
    audit: Option<Box<super::exchanges::Started>>,
    /// An `initialize` that opens its session: the session opens only if it gets a
    /// result; until then it is held back, and so is its stream.
    opens: Option<Opens>,
}

/// How the `initialize` that opens a session is answered once its answer is known: only a
/// result opens the session (and carries `Mcp-Session-Id`); an error leaves nothing behind.
#[derive(Debug, Clone, Copy)]
struct Opens {
    /// Answered as a stream (primed for a 2025-11-25 client when `Some(true)`), else as
    /// JSON.
    stream: Option<bool>,
}

/// Why requests still in flight are answered by the proxy.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ending {
    /// DELETE (or the session's end): the backend is told to cancel each.
    Deleted,
    /// The backend exited.
    BackendExited,
    /// The proxy shuts down.
    Shutdown,
}

/// A `POST /mcp` checked in full.
#[derive(Debug)]
pub(super) struct McpPost {
    /// The session it names, or `None` for an `initialize` that starts one.
    session: Option<SessionNumber>,
    sid: SessionId,
    principal: Principal,
    source: std::sync::Arc<crate::audit::Source>,
    msg: Checked,
    accepts: Accepts,
    /// A 2025-11-25 client: its streams open with a priming event.
    priming: bool,
}

impl McpPost {
    /// The session it names (`None`: one it starts).
    pub(super) fn session(&self) -> Option<SessionNumber> {
        self.session
    }

    /// The message it carries.
    pub(super) fn message(&self) -> &Checked {
        &self.msg
    }
}

impl Hub {
    /// `POST /mcp`: SPEC section 7's checks in order, the message read once.
    pub(super) fn prepare_mcp(&self, req: Request) -> Result<McpPost, Rejection> {
        let body = match req.body {
            Body::TooLarge => return Err(Rejection::BodyTooLarge),
            body => body,
        };
        if !streamable::is_json(req.mcp.content_type.as_deref()) {
            return Err(Rejection::UnsupportedMediaType);
        }
        let accepts = Accepts::parse(req.mcp.accept.as_deref());
        if !accepts.json && !accepts.event_stream {
            return Err(Rejection::NotAcceptable);
        }
        if !streamable::supported_version(req.mcp.protocol_version.as_deref()) {
            return Err(Rejection::BadProtocolVersion);
        }
        let (session, sid, msg) = match &req.mcp.session {
            Some(text) => {
                let (number, sid) = self.mcp_session(text, &req.principal)?;
                (Some(number), sid, body.message()?)
            }
            None => {
                // Only an initialize may come without a session: it starts one.
                let msg = body
                    .message()
                    .ok()
                    .filter(|m| m.is_request("initialize"))
                    .ok_or(Rejection::MissingMcpSession)?;
                self.sessions.check_room()?;
                let sid = SessionId::mint(self.settings.instance.as_ref(), req.entropy);
                (None, sid, msg)
            }
        };
        Ok(McpPost {
            session,
            sid,
            principal: req.principal,
            source: req.source,
            msg,
            accepts,
            priming: req.mcp.protocol_version.as_deref().map(str::trim) == Some("2025-11-25"),
        })
    }

    /// A checked `POST /mcp` acts: a new session opens, a notification is taken, a request
    /// is registered in flight before its line goes to the backend.
    pub(super) fn mcp_post(
        &mut self,
        now: Instant,
        request: RequestId,
        post: McpPost,
        sender: Sender,
    ) -> Result<(), Rejection> {
        let (session, sid, msg) = (post.session, post.sid, &post.msg);
        let number = match session {
            Some(number) if self.sessions.mcp(number).is_some() => number,
            Some(_) => return Err(Rejection::SessionNotFound),
            None => match self.open_mcp_session(now, sid, (post.principal, &post.source)) {
                Err(refused @ Rejection::PrincipalSessions) => {
                    let response = refused.response_to(msg.raw_id());
                    self.respond(now, request, Answer::Refused(refused, response));
                    return Ok(());
                }
                opened => opened?,
            },
        };
        if msg.kind == message::Kind::Notification {
            self.mcp_notification(now, request, (number, sid), msg, sender);
            return Ok(());
        }
        if session.is_some() && msg.method == "initialize" {
            return Err(Rejection::InitializeWithSession);
        }
        let Some(id) = &msg.id else {
            unreachable!("admission gives every request an id");
        };
        let m = self.sessions.mcp(number).expect("found or opened above");
        if m.in_flight.contains_key(&id.key) {
            // 409 with a JSON-RPC error under the id that is taken.
            let response = with_session(streamable::id_in_flight(msg.raw_id()), sid);
            let answer = Answer::Refused(Rejection::IdInFlight, response);
            self.respond(now, request, answer);
            return Ok(());
        }
        if m.in_flight.len() >= self.settings.max_inflight {
            return Err(Rejection::TooManyInFlight);
        }
        self.touch(number, now);
        let stream_answer =
            post.accepts.event_stream && (msg.token.is_some() || !post.accepts.json);
        let stream = stream_answer.then_some(post.priming);
        let form = session.map(|_| stream).ok_or(Opens { stream });
        self.await_answer(now, request, (number, sid), msg, form);
        // Now that the answer has somewhere to go: the line for the backend, or the
        // proxy's own answer (a cached initialize).
        self.client_message(now, (number, sid), msg, sender);
        Ok(())
    }

    /// A notification of session `number` is taken: 202, then what it does.
    fn mcp_notification(
        &mut self,
        now: Instant,
        request: RequestId,
        (number, sid): (SessionNumber, SessionId),
        msg: &Checked,
        sender: Sender,
    ) {
        self.touch(number, now);
        // Accepted: a notification produces no event.
        let _ = self.exchanges.take_started(request);
        let response = with_session(streamable::notification_accepted(), sid);
        self.respond(now, request, Answer::Served(response));
        self.client_message(now, (number, sid), msg, sender);
        if let Some(cancels) = &msg.cancels {
            self.cancelled_by_client(now, number, &cancels.key);
        }
    }

    /// Registers request `msg` in flight: its stream (when the answer is one, primed or
    /// not; `Err`: the `initialize` that opens the session, whose answer decides), its
    /// timeout, its progress token.
    fn await_answer(
        &mut self,
        now: Instant,
        request: RequestId,
        (number, sid): (SessionNumber, SessionId),
        msg: &Checked,
        form: Result<Option<bool>, Opens>,
    ) {
        let key = msg.id.as_ref().expect("a request").key.clone();
        // Taken before its stream answers the exchange: it goes with the request.
        let audit = self.exchanges.take_started(request);
        let (stream, opens) = match form {
            Ok(stream) => (stream, None),
            Err(opens) => (None, Some(opens)),
        };
        let stream = stream.map(|priming| {
            let carries = Carries::Request(key.clone(), msg.raw_id().to_owned());
            self.open_mcp_stream(now, request, (number, sid), carries, priming)
        });
        if let Some(timeout) = self.settings.request_timeout {
            let timer = (number, key.clone());
            self.sessions.request_timers.set(timer, now + timeout);
        }
        let token = msg.token.as_ref().map(|t| t.key.clone());
        let m = self
            .sessions
            .mcp_mut(number)
            .expect("checked by the caller");
        if let Some(token) = &token {
            m.tokens.entry(token.clone()).or_default().push(key.clone());
        }
        let entry = InFlight {
            request,
            stream,
            raw_id: msg.raw_id().to_owned(),
            token,
            audit,
            opens,
        };
        m.in_flight.insert(key, entry);
    }

    fn open_mcp_session(
        &mut self,
        now: Instant,
        sid: SessionId,
        (principal, source): (Principal, &std::sync::Arc<crate::audit::Source>),
    ) -> Result<SessionNumber, Rejection> {
        self.check_new_session(&principal)?;
        let kind = Kind::Mcp(McpSession {
            last_active: Some(now),
            opening: true,
            ..McpSession::default()
        });
        let number = self.sessions.open(sid, principal, kind)?;
        if let Some(session) = self.sessions.get_mut(number) {
            session.source = source.clone();
        }
        Ok(number)
    }

    /// The `initialize` of session `number` got a result: the session is open.
    fn opened(&mut self, now: Instant, number: SessionNumber) {
        let Some(session) = self.sessions.get(number) else {
            return;
        };
        let (sid, principal) = (session.id, session.principal.clone());
        if let Some(m) = self.sessions.mcp_mut(number) {
            m.opening = false;
        }
        self.metrics.sessions_opened += 1;
        self.observe(now, Happened::Opened(number));
        self.log(Event::SessionOpened {
            session: sid,
            principal,
        });
    }

    /// The answer to the `initialize` that opens session `number`. A result opens it (and
    /// its answer carries `Mcp-Session-Id`); anything else (the backend's error, a timeout,
    /// a restart) leaves no session: it is removed uncounted, and the client gets the
    /// error without a session id.
    fn answer_opening(
        &mut self,
        now: Instant,
        number: SessionNumber,
        (mut entry, opens): (InFlight, Opens),
        (message, outcome): (Vec<u8>, Option<Outcome>),
    ) {
        if outcome.unwrap_or_else(|| Outcome::of_answer(&message)) == Outcome::Success {
            self.opened(now, number);
            if let (Some(priming), Some(sid)) = (opens.stream, self.sessions.get(number)) {
                let (sid, raw_id) = (sid.id, entry.raw_id.clone());
                let key = IdKey::of(&raw_id).expect("an admitted id");
                let carries = Carries::Request(key, raw_id);
                let request = entry.request;
                let stream = self.open_mcp_stream(now, request, (number, sid), carries, priming);
                entry.stream = Some(stream);
            }
            return self.answer(now, number, entry, (message, outcome));
        }
        self.backend.forget(number);
        self.sessions.close(number);
        if let Some(started) = entry.audit.take() {
            let answered = Happened::Answered {
                session: number,
                started,
                message: &message,
                outcome,
            };
            self.observe(now, answered);
        }
        let response = match opens.stream {
            Some(_) => streamable::sse_answer(&message),
            None => streamable::json_answer(message),
        };
        self.respond(now, entry.request, Answer::Served(response));
    }

    /// `GET /mcp`: the session's standalone stream; a new one replaces the old.
    pub(super) fn mcp_get(
        &mut self,
        now: Instant,
        request: RequestId,
        req: &Request,
    ) -> Result<(), Rejection> {
        if !Accepts::parse(req.mcp.accept.as_deref()).event_stream {
            return Err(Rejection::NotAcceptable);
        }
        let (number, sid) = self.named_mcp_session(req)?;
        if self.insufficient_scope(now, request, &req.grant, (None, None)) {
            return Ok(());
        }
        if let Some(last) = &req.mcp.last_event_id {
            return self.resume(now, request, (number, sid), last);
        }
        let key = self.open_mcp_stream(now, request, (number, sid), Carries::Get, false);
        let old = self
            .sessions
            .mcp_mut(number)
            .and_then(|m| m.get_stream.replace(key));
        if let Some(old) = old {
            self.drop_stream(number, old);
        }
        self.touch(number, now);
        Ok(())
    }

    /// `DELETE /mcp`: the session ends at once; its requests in flight are cancelled at the
    /// backend, its subscriptions released.
    pub(super) fn mcp_delete(
        &mut self,
        now: Instant,
        request: RequestId,
        req: &Request,
    ) -> Result<(), Rejection> {
        let (number, sid) = self.named_mcp_session(req)?;
        if self.insufficient_scope(now, request, &req.grant, (None, None)) {
            return Ok(());
        }
        // Its event is the session's own `session_close`: the 204 is no refusal.
        let _ = self.exchanges.take_started(request);
        self.end_session(now, number, CloseReason::Deleted);
        let response = with_session(streamable::deleted(), sid);
        self.respond(now, request, Answer::Served(response));
        Ok(())
    }

    /// GET's and DELETE's checks after their own: the version (400), the session header
    /// (400 without it), then the session it names (404).
    fn named_mcp_session(&self, req: &Request) -> Result<(SessionNumber, SessionId), Rejection> {
        if !streamable::supported_version(req.mcp.protocol_version.as_deref()) {
            return Err(Rejection::BadProtocolVersion);
        }
        let text = req
            .mcp
            .session
            .as_deref()
            .ok_or(Rejection::MissingMcpSession)?;
        self.mcp_session(text, &req.principal)
    }

    /// The live Streamable session `text` names for `principal`: one 404 for unknown,
    /// ended, foreign and legacy sessions alike, and for one that has not opened yet.
    fn mcp_session(
        &self,
        text: &str,
        principal: &Principal,
    ) -> Result<(SessionNumber, SessionId), Rejection> {
        match self.sessions.authorize(text, principal)? {
            (number, session) if matches!(&session.kind, Kind::Mcp(m) if !m.opening) => {
                Ok((number, session.id))
            }
            _ => Err(Rejection::SessionNotFound),
        }
    }

    /// A request or a stream end: the session is active now.
    pub(super) fn touch(&mut self, number: SessionNumber, now: Instant) {
        self.sessions.touch(number, now, self.settings.session_idle);
    }

    /// The client cancelled request `key`: its stream ends at once, a JSON waiter is told;
    /// the backend's late answer will find nothing in flight.
    fn cancelled_by_client(&mut self, now: Instant, number: SessionNumber, key: &IdKey) {
        let Some(mut entry) = self.take_in_flight(number, key) else {
            return;
        };
        if let Some(started) = entry.audit.take() {
            self.observe(now, Happened::Unanswered(Some(number), started));
        }
        match entry.stream {
            Some(key) => self.drop_stream(number, key),
            None => {
                let sid = self.sessions.get(number).expect("in flight").id;
                let message = streamable::error_message(&entry.raw_id, -32800, "Request cancelled");
                let response = with_session(streamable::json_answer(message), sid);
                self.respond(now, entry.request, Answer::Served(response));
            }
        }
        self.touch(number, now);
    }

    /// Removes request `key` of session `number` from the in-flight table, its timeout and
    /// its claim on its progress token with it.
    pub(super) fn take_in_flight(
        &mut self,
        number: SessionNumber,
        key: &IdKey,
    ) -> Option<InFlight> {
        let m = self.sessions.mcp_mut(number)?;
        let (key, entry) = m.in_flight.remove_entry(key)?;
        if let Some(token) = &entry.token {
            // Another request in flight that carries the same token keeps its progress.
            if let Some(carriers) = m.tokens.get_mut(token) {
                carriers.retain(|k| *k != key);
                if carriers.is_empty() {
                    m.tokens.remove(token);
                }
            }
        }
        self.sessions.request_timers.remove(&(number, key));
        Some(entry)
    }

    /// Request `key` of session `number`, answered on `stream`, is awaited no longer and
    /// will get no answer through the proxy (that stream is gone for good): its `error`
    /// event. A later request that reuses the id (the first was answered) is not touched.
    pub(super) fn abandon_in_flight(
        &mut self,
        now: Instant,
        (number, stream): (SessionNumber, StreamKey),
        key: &IdKey,
    ) {
        let m = self.sessions.mcp(number);
        let entry = m.and_then(|m| m.in_flight.get(key));
        if entry.is_none_or(|e| e.stream != Some(stream)) {
            return;
        }
        if let Some(started) = self.take_in_flight(number, key).and_then(|e| e.audit) {
            self.observe(now, Happened::Unanswered(Some(number), started));
        }
    }

    /// Delivers a message for a Streamable session (SPEC section 7's table).
    pub(super) fn mcp_deliver(
        &mut self,
        now: Instant,
        number: SessionNumber,
        message: Vec<u8>,
        what: Delivery,
    ) {
        match what {
            Delivery::Response { id, outcome } => {
                let key = std::str::from_utf8(&message[id]).ok().and_then(IdKey::of);
                let Some(entry) = key.and_then(|key| self.take_in_flight(number, &key)) else {
                    return self.drop_message(DropReason::NotInFlight, None);
                };
                self.answer(now, number, entry, (message, outcome));
                self.touch(number, now);
            }
            Delivery::Progress { token } => {
                let key = std::str::from_utf8(&message[token])
                    .ok()
                    .and_then(IdKey::of);
                self.progress(now, number, key, message);
            }
            Delivery::Update => {
                self.send_to_get_stream(now, number, &message, "notifications/resources/updated");
            }
        }
    }

    /// Progress goes to the stream of the newest request in flight carrying its token
    /// (whose clock it restarts), else the GET stream, else nowhere.
    fn progress(
        &mut self,
        now: Instant,
        number: SessionNumber,
        key: Option<IdKey>,
        message: Vec<u8>,
    ) {
        let timeout = self.settings.request_timeout;
        let Some(m) = self.sessions.mcp_mut(number) else {
            return;
        };
        let request = key
            .and_then(|k| m.tokens.get(&k).and_then(|c| c.last()).cloned())
            .and_then(|id| m.in_flight.get(&id).map(|e| (id, e.stream)));
        let mut target = m.get_stream;
        if let Some((id, stream)) = request {
            if let Some(t) = timeout {
                self.sessions.request_timers.set((number, id), now + t);
            }
            target = stream.or(target);
        }
        match target {
            Some(key) => self.send_event(now, number, key, &message),
            None => self.drop_message(DropReason::NoStream, Some("notifications/progress")),
        }
    }

    /// A notification for the session's GET stream, if it has one (its client there or,
    /// within the resume window, away).
    pub(super) fn send_to_get_stream(
        &mut self,
        now: Instant,
        number: SessionNumber,
        message: &[u8],
        method: &str,
    ) {
        match self.sessions.mcp(number).and_then(|m| m.get_stream) {
            Some(key) => self.send_event(now, number, key, message),
            None => self.drop_message(DropReason::NoStream, Some(method)),
        }
    }

    /// Gives `entry` its answer: the JSON body, or the last event of its stream; its audit
    /// event with `outcome` (the proxy's verdict; `None` for the backend's answer).
    fn answer(
        &mut self,
        now: Instant,
        number: SessionNumber,
        mut entry: InFlight,
        (message, outcome): (Vec<u8>, Option<Outcome>),
    ) {
        if let Some(opens) = entry.opens.take() {
            return self.answer_opening(now, number, (entry, opens), (message, outcome));
        }
        if let Some(started) = entry.audit.take() {
            let answered = Happened::Answered {
                session: number,
                started,
                message: &message,
                outcome,
            };
            self.observe(now, answered);
        }
        match entry.stream {
            Some(key) => {
                self.send_event(now, number, key, &message);
                self.finish_stream(now, number, key);
            }
            None => {
                let sid = self.sessions.get(number).expect("answered while live").id;
                let response = with_session(streamable::json_answer(message), sid);
                self.respond(now, entry.request, Answer::Served(response));
            }
        }
    }

    /// `--request-timeout` passed for request `key` (progress moves the timer): the client
    /// gets -32001 under its own id and the backend a cancellation.
    pub(super) fn request_timed_out(&mut self, now: Instant, number: SessionNumber, key: &IdKey) {
        let Some(entry) = self.take_in_flight(number, key) else {
            return;
        };
        let sid = self.sessions.get(number).expect("in flight").id;
        // An initialize is never cancelled (MCP forbids it; it went under the proxy's id).
        let line = streamable::cancel_line(&sid, &entry.raw_id, "request timed out");
        if let Some(line) = line.filter(|_| entry.opens.is_none()) {
            self.queue_line(line, LineFrom::Cancellation);
        }
        let message = streamable::error_message(&entry.raw_id, -32001, "request timed out");
        self.answer(now, number, entry, (message, Some(Outcome::Error)));
        self.touch(number, now);
    }

    /// The session's idle check is due: it ends if `--session-idle` passed since it was
    /// last active and it still is quiet; if it was active since, the check moves on; if
    /// it is busy, the touch that finds it quiet again schedules the next one.
    pub(super) fn idle_check(&mut self, now: Instant, number: SessionNumber) {
        let idle = self.settings.session_idle;
        let Some(m) = self.sessions.mcp(number) else {
            return;
        };
        let until = m.last_active.map(|t| t + idle);
        match until {
            _ if !m.is_quiet() => {}
            Some(until) if until <= now => self.end_session(now, number, CloseReason::Idle),
            Some(until) => self.sessions.idle_timers.set(number, until),
            None => {}
        }
    }

    /// The backend restarted: every request of session `number` in flight gets -32603
    /// `backend restarted` (on its stream, which ends, or as its answer); the session and
    /// its GET stream stay.
    pub(super) fn fail_mcp_in_flight(&mut self, now: Instant, number: SessionNumber) {
        let Some(m) = self.sessions.mcp_mut(number) else {
            return;
        };
        let in_flight = std::mem::take(&mut m.in_flight);
        m.tokens.clear();
        for (key, entry) in in_flight {
            self.sessions.request_timers.remove(&(number, key));
            let message = streamable::error_message(&entry.raw_id, -32603, "backend restarted");
            self.answer(now, number, entry, (message, Some(Outcome::Error)));
        }
        self.touch(number, now);
    }

    /// Answers every request of an ending Streamable session still in flight (cancelled at
    /// the backend when the session is deleted) and ends its streams; nothing is kept.
    pub(super) fn end_mcp(&mut self, now: Instant, number: SessionNumber, ending: Ending) {
        let text = match ending {
            Ending::Deleted => "session deleted",
            Ending::BackendExited => "backend restarted",
            Ending::Shutdown => "proxy shutting down",
        };
        let sid = self.sessions.get(number).expect("ending while live").id;
        let Some(m) = self.sessions.mcp_mut(number) else {
            return;
        };
        let in_flight = std::mem::take(&mut m.in_flight);
        m.tokens.clear();
        for (key, entry) in in_flight {
            self.sessions.request_timers.remove(&(number, key));
            if let Ending::Deleted = ending {
                if let Some(line) = streamable::cancel_line(&sid, &entry.raw_id, text) {
                    self.queue_line(line, LineFrom::Cancellation);
                }
            }
            let message = streamable::error_message(&entry.raw_id, -32603, text);
            self.answer(now, number, entry, (message, Some(Outcome::Error)));
        }
        let keys = self
            .sessions
            .mcp(number)
            .map(|m| m.log.keys())
            .unwrap_or_default();
        for key in keys {
            self.drop_stream(number, key);
        }
    }
}

/// An answer of session `sid`, naming it.
pub(super) fn with_session(mut response: Response, sid: SessionId) -> Response {
    response.headers.push((
        "mcp-session-id",
        std::borrow::Cow::Owned(sid.as_str().to_owned()),
    ));
    response
}
