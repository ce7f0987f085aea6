//! Streamable HTTP sessions on `/mcp` (SPEC section 7): POST, GET and DELETE in their order
//! of checks, and how a request in flight gets its answer. The route to the session is
//! still the id; the in-flight part only finds the response's exchange.

use std::time::Instant;

use super::backend::BackendProcess;
use super::delivery::Delivery;
use super::exchanges::{Answer, Sender};
use super::in_flight::{Caller, Entry, Opens, RequestKey, Settlement};
use super::resume::Carries;
use super::sessions::{Gone, Kind, McpSession, SessionNumber, Sessions};
use super::{Body, Hub, Request};
use crate::admission::{self, Arrival, Capacity, Opening};
use crate::audit::Outcome;
use crate::auth::Principal;
use crate::http::{Endpoint, Rejection};
use crate::message;
use crate::message::Checked;
use crate::message::IdKey;
use crate::metrics::DropReason;
use crate::output::{CloseReason, Event, Output, RequestId};
use crate::routed_id::{Instance, SessionId};
use crate::settings::Modern;
use crate::streamable::{self, Accepts};

/// Why requests still in flight are answered by the proxy.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ending {
    /// DELETE (or the session's end): the backend is told to cancel each.
    Deleted,
    /// The backend exited.
    BackendExited,
    /// The proxy shuts down.
    Shutdown,
    /// The backend restarted: the session stays.
    Restarted,
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

    /// The message it carries, to show the operator's tools (SPEC section 16).
    pub(super) fn message_mut(&mut self) -> &mut Checked {
        &mut self.msg
    }

    /// `POST /mcp`: SPEC section 7's checks in order, the message read once.
    pub(super) fn prepare(
        req: Request,
        sessions: &Sessions,
        instance: Option<&Instance>,
    ) -> Result<McpPost, Rejection> {
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
                let (number, sid) = live_session(sessions, text, &req.principal)?;
                (Some(number), sid, body.message()?)
            }
            None => {
                // Only an initialize may come without a session: it starts one.
                let msg = body
                    .message()
                    .ok()
                    .filter(|m| m.is_request("initialize"))
                    .ok_or(Rejection::MissingMcpSession)?;
                sessions.check_room()?;
                let sid = SessionId::mint(instance, req.entropy);
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
}

impl Hub {
    /// A checked `POST /mcp` acts: a new session opens, a notification is taken (202),
    /// a request goes on to `mcp_request`.
    pub(super) fn mcp_post(
        &mut self,
        now: Instant,
        request: RequestId,
        post: McpPost,
        sender: Sender,
    ) -> Result<(), Rejection> {
        let number = match post.session {
            Some(number) if self.sessions.mcp(number).is_some() => number,
            Some(_) => return Err(Rejection::SessionNotFound),
            None => {
                let parts = (&self.backend, &self.sessions);
                let per_principal = self.settings.max_sessions_per_principal;
                let opening = opening(now, &post.principal, parts, per_principal);
                if let Err(refused) = admission::room(&Capacity::opening(opening)) {
                    let refusal = refused.refusal(Some(post.msg.raw_id()), None);
                    self.respond(now, request, refusal.into());
                    return Ok(());
                }
                let kind = Kind::Mcp(McpSession {
                    last_active: Some(now),
                    opening: true,
                    ..McpSession::default()
                });
                let source = post.source.clone();
                (self.sessions).open(post.sid, post.principal.clone(), kind, source)?
            }
        };
        let (sid, msg) = (post.sid, &post.msg);
        if msg.kind != message::Kind::Notification {
            return self.mcp_request(now, request, (number, &post), sender);
        }
        self.touch(number, now);
        // Accepted: a notification produces no event.
        let _ = self.exchanges.take_started(request);
        let response = streamable::with_session(streamable::notification_accepted(), sid);
        self.respond(now, request, Answer::Served(response));
        self.client_message(now, (number, sid), msg, sender);
        if let Some(cancels) = &msg.cancels {
            self.cancelled_by_client(now, number, &cancels.key);
        }
        Ok(())
    }

    /// A request of session `number`, within its room, is registered in flight before its
    /// line goes to the backend: its stream (when the answer is one, primed or not; held
    /// back for the `initialize` that opens the session, whose answer decides), its
    /// timeout, its progress token.
    fn mcp_request(
        &mut self,
        now: Instant,
        request: RequestId,
        (number, post): (SessionNumber, &McpPost),
        sender: Sender,
    ) -> Result<(), Rejection> {
        let (sid, msg) = (post.sid, &post.msg);
        if post.session.is_some() && msg.method == "initialize" {
            return Err(Rejection::InitializeWithSession);
        }
        let Some(id) = &msg.id else {
            unreachable!("admission gives every request an id");
        };
        let in_flight = (self.in_flight).room(number, &id.key, self.settings.max_inflight);
        if let Err(refused) = admission::room(&Capacity::in_flight(in_flight)) {
            let refusal = refused.refusal(Some(msg.raw_id()), Some(&sid));
            self.respond(now, request, refusal.into());
            return Ok(());
        }
        self.touch(number, now);
        let stream_answer =
            post.accepts.event_stream && (msg.token.is_some() || !post.accepts.json);
        let stream = stream_answer.then_some(post.priming);
        // Taken before its stream answers the exchange: it goes with the request.
        let audit = self.exchanges.take_started(request);
        let (stream, opens) = match post.session {
            Some(_) => (stream, None),
            None => (None, Some(Opens { stream })),
        };
        let stream = stream.map(|priming| {
            let carries = Carries::Request(id.key.clone(), msg.raw_id().to_owned());
            self.open_mcp_stream(now, request, (number, sid), carries, priming)
        });
        let entry = Entry::awaited(msg, (now, request), stream, (audit, opens));
        let deadline = self.settings.request_timeout.map(|timeout| now + timeout);
        self.in_flight
            .insert(number, id.key.clone(), entry, deadline);
        // Now that the answer has somewhere to go: the line for the backend, or the
        // proxy's own answer (a cached initialize).
        self.client_message(now, (number, sid), msg, sender);
        Ok(())
    }

    /// Settles the `initialize` that opens session `number`, if `entry` is one, as
    /// `settlement` says. A result opens it (its answer carries `Mcp-Session-Id`, on a
    /// stream when asked for); anything else (the backend's error, a timeout, a restart)
    /// leaves no session: it is removed uncounted, and its answer (`Some(as a stream)`)
    /// goes without a session id.
    pub(super) fn settle_opening(
        &mut self,
        now: Instant,
        (number, entry): (SessionNumber, &mut Entry),
        settlement: &Settlement,
    ) -> Option<bool> {
        let opens = entry.opens.take()?;
        let Settlement::Answered {
            message, outcome, ..
        } = settlement
        else {
            return None;
        };
        if outcome.unwrap_or_else(|| Outcome::of_answer(message)) != Outcome::Success {
            self.backend.forget(number.into());
            self.sessions.close(number);
            return Some(opens.stream.is_some());
        }
        let session = self.sessions.get(number)?;
        let (sid, principal) = (session.id, session.principal.clone());
        if let Some(m) = self.sessions.mcp_mut(number) {
            m.opening = false;
        }
        self.session_opened(now, number);
        self.outputs.push_back(Output::Log(Event::SessionOpened {
            session: sid,
            principal,
        }));
        if let Some(priming) = opens.stream {
            let raw_id = entry.raw_id.clone();
            let key = IdKey::of(&raw_id).expect("an admitted id");
            let carries = Carries::Request(key, raw_id);
            let request = entry.exchange();
            let stream = self.open_mcp_stream(now, request, (number, sid), carries, priming);
            entry.stream = Some(stream);
        }
        None
    }

    /// `GET /mcp` and `DELETE /mcp`, on the session they name after the same checks. GET
    /// opens the session's standalone stream (a new one replaces the old) or resumes one;
    /// DELETE ends the session at once: its requests in flight are cancelled at the
    /// backend, its subscriptions released.
    pub(super) fn mcp_named(
        &mut self,
        now: Instant,
        request: RequestId,
        req: &Request,
    ) -> Result<(), Rejection> {
        let get = req.endpoint == Endpoint::McpGet;
        // A 2026-07-28 client has no session to read or end (SPEC section 13).
        let version = req.mcp.protocol_version.as_deref().map(str::trim);
        if self.settings.modern == Modern::On && version == Some(crate::modern::VERSION) {
            return Err(Rejection::MethodNotAllowed { allow: "POST" });
        }
        if get && !Accepts::parse(req.mcp.accept.as_deref()).event_stream {
            return Err(Rejection::NotAcceptable);
        }
        let (number, sid) = named_session(&self.sessions, req)?;
        let arrival = Arrival::without_message(&req.principal, &req.grant);
        if self.admit(now, request, arrival, None).is_none() {
            return Ok(());
        }
        if !get {
            // Its event is the session's own `session_close`: the 204 is no refusal.
            let _ = self.exchanges.take_started(request);
            self.end_session(now, number, CloseReason::Deleted);
            let response = streamable::with_session(streamable::deleted(), sid);
            self.respond(now, request, Answer::Served(response));
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
            self.stream_gone(now, number, old, Gone::Dropped);
        }
        self.touch(number, now);
        Ok(())
    }

    /// A request or a stream end: the session is active now.
    pub(super) fn touch(&mut self, number: SessionNumber, now: Instant) {
        let busy = self.in_flight.count(number) > 0;
        self.sessions
            .touch(number, now, self.settings.session_idle, busy);
    }

    /// The client of session `number` cancelled request `key`: it is awaited no longer and
    /// its event says so. A Streamable request's stream ends at once, a JSON waiter is told;
    /// the backend's late answer finds nothing in flight (a legacy one still goes to the
    /// stream).
    pub(super) fn cancelled_by_client(&mut self, now: Instant, number: SessionNumber, key: &IdKey) {
        // Its cancellation is queued: it leaves the backend window, or the fair queue.
        if let Some(sid) = self.sessions.get(number).map(|s| s.id) {
            self.backend.cancelled(&(sid, key.clone()));
            self.backend.release(now, &mut self.outputs, false);
        }
        let Some(entry) = self.in_flight.take(number, key) else {
            return;
        };
        self.settle(now, (Some(number.into()), entry), Settlement::Cancelled);
        self.touch(number, now);
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
            Delivery::Response { key, outcome, .. } => {
                let Some(entry) = key.and_then(|key| self.in_flight.take(number, &key)) else {
                    return self.drop_message(DropReason::NotInFlight, None);
                };
                self.settle(
                    now,
                    (Some(number.into()), entry),
                    Settlement::answered(message, outcome),
                );
                self.touch(number, now);
            }
            Delivery::Progress { token } => {
                // To the stream of the newest request in flight carrying the token (whose
                // clock it restarts), else the GET stream, else nowhere.
                let key = std::str::from_utf8(&message[token])
                    .ok()
                    .and_then(IdKey::of);
                let timeout = self.settings.request_timeout;
                let Some(get_stream) = self.sessions.mcp(number).map(|m| m.get_stream) else {
                    return;
                };
                let carrier = key.and_then(|k| self.in_flight.progress(now, number, &k, timeout));
                match carrier.flatten().or(get_stream) {
                    Some(key) => self.send_event(now, number, key, &message),
                    None => self.drop_message(DropReason::NoStream, Some("notifications/progress")),
                }
            }
            // The GET stream, if the session has one (its client there or, within the
            // resume window, away).
            Delivery::Update => match self.sessions.mcp(number).and_then(|m| m.get_stream) {
                Some(key) => self.send_event(now, number, key, &message),
                None => {
                    let method = "notifications/resources/updated";
                    self.drop_message(DropReason::NoStream, Some(method));
                }
            },
        }
    }

    /// `--request-timeout` passed for request `key` of `caller` (progress moves the timer):
    /// the client gets -32001 under its own id and the backend a cancellation.
    pub(super) fn request_timed_out(&mut self, now: Instant, caller: Caller, key: &IdKey) {
        let Some(entry) = self.in_flight.take(caller, key) else {
            return;
        };
        let (route, number) = match caller {
            Caller::Session(number) => (
                self.sessions.get(number).expect("in flight").id,
                Some(number),
            ),
            Caller::Modern(key) => (*key.route(), None),
        };
        // An initialize is never cancelled (MCP forbids it; it went under the proxy's id).
        if entry.opens.is_none() {
            let cancel = (&route, entry.raw_id.as_str(), "request timed out");
            if !self
                .backend
                .cancel(now, cancel, entry.mark, &mut self.outputs)
            {
                self.drop_message(DropReason::BackendQueueFull, None);
            }
        }
        let timed_out = Settlement::error(&entry.raw_id, -32001, "request timed out");
        self.settle(now, (Some(caller), entry), timed_out);
        if let Some(number) = number {
            self.touch(number, now);
        }
    }

    /// The client of the 2026-07-28 request under `key` hung up (its stream, or the
    /// connection its JSON answer was due on): it is cancelled at the backend and its late
    /// answer dropped (SPEC section 13).
    pub(super) fn modern_client_left(&mut self, now: Instant, key: RequestKey) {
        let caller = Caller::Modern(key);
        let ids = self.in_flight.keys(caller);
        for id in &ids {
            let Some(entry) = self.in_flight.take(caller, id) else {
                continue;
            };
            let (raw_id, mark) = (entry.raw_id.clone(), entry.mark);
            self.settle(now, (Some(caller), entry), Settlement::Gone);
            let cancel = (key.route(), raw_id.as_str(), "client disconnected");
            if !self.backend.cancel(now, cancel, mark, &mut self.outputs) {
                self.drop_message(DropReason::BackendQueueFull, None);
            }
        }
        if !ids.is_empty() {
            self.drop_message(DropReason::ClientLeft, None);
        }
    }

    /// Answers every request of a Streamable session still in flight with -32603 (on its
    /// stream, which ends, or as its answer; cancelled at the backend when the session is
    /// deleted). An ending session's streams end and nothing is kept; after a restart the
    /// session and its GET stream stay.
    pub(super) fn end_mcp(&mut self, now: Instant, number: SessionNumber, ending: Ending) {
        let text = match ending {
            Ending::Deleted => "session deleted",
            Ending::BackendExited | Ending::Restarted => "backend restarted",
            Ending::Shutdown => "proxy shutting down",
        };
        let Some(sid) = self.sessions.get(number).map(|s| s.id) else {
            return;
        };
        if self.sessions.mcp(number).is_none() {
            return;
        }
        for (_, entry) in self.in_flight.take_all(number) {
            if let Ending::Deleted = ending {
                let cancel = (&sid, entry.raw_id.as_str(), text);
                if !self
                    .backend
                    .cancel(now, cancel, entry.mark, &mut self.outputs)
                {
                    self.drop_message(DropReason::BackendQueueFull, None);
                }
            }
            let failed = Settlement::error(&entry.raw_id, -32603, text);
            self.settle(now, (Some(number.into()), entry), failed);
        }
        if let Ending::Restarted = ending {
            return self.touch(number, now);
        }
        let keys = self
            .sessions
            .mcp(number)
            .map(|m| m.log.keys())
            .unwrap_or_default();
        for key in keys {
            self.stream_gone(now, number, key, Gone::Dropped);
        }
    }
}

/// GET's and DELETE's checks after their own: the version (400), the session header
/// (400 without it), then the session it names (404).
fn named_session(
    sessions: &Sessions,
    req: &Request,
) -> Result<(SessionNumber, SessionId), Rejection> {
    if !streamable::supported_version(req.mcp.protocol_version.as_deref()) {
        return Err(Rejection::BadProtocolVersion);
    }
    let text = req
        .mcp
        .session
        .as_deref()
        .ok_or(Rejection::MissingMcpSession)?;
    live_session(sessions, text, &req.principal)
}

/// The live Streamable session `text` names for `principal`: one 404 for unknown,
/// ended, foreign and legacy sessions alike, and for one that has not opened yet.
fn live_session(
    sessions: &Sessions,
    text: &str,
    principal: &Principal,
) -> Result<(SessionNumber, SessionId), Rejection> {
    match sessions.authorize(text, principal)? {
        (number, session) if matches!(&session.kind, Kind::Mcp(m) if !m.opening) => {
            Ok((number, session.id))
        }
        _ => Err(Rejection::SessionNotFound),
    }
}

/// What a new session of `principal` would find at `now`, with at most `per_principal`
/// sessions each (SPEC sections 7 and 10).
pub(super) fn opening(
    now: Instant,
    principal: &Principal,
    (backend, sessions): (&BackendProcess, &Sessions),
    per_principal: usize,
) -> Opening {
    Opening {
        backend_up: backend.is_up(),
        restart_in: backend.until_restart(now),
        sessions_full: sessions.check_room().is_err(),
        of_principal: (sessions.of(principal), per_principal),
    }
}
