//! Streamable HTTP sessions on `/mcp` (SPEC section 7): POST, GET and DELETE in their order
//! of checks, and the small in-flight table that says which HTTP answer waits for which
//! routed id. The route to the session is still the id; the table only finds the response.

use std::collections::BTreeMap;
use std::time::Instant;

use super::{Hub, LineFrom, Request, SessionKind, StreamRole, StreamState};
use crate::action::{Delivery, DropReason};
use crate::auth::Principal;
use crate::http::{self, Rejection, Response};
use crate::hub::Payload;
use crate::message::{self, Kind};
use crate::output::{CloseReason, Event, Frame, Output, RequestId, StreamId};
use crate::routed_id::SessionId;
use crate::sse;
use crate::streamable::{self, Accepts, IdKey};

/// A Streamable session's own state beside the router's.
#[derive(Debug, Default)]
pub(super) struct McpSession {
    /// The standalone GET stream, at most one.
    pub(super) get_stream: Option<StreamId>,
    /// Requests whose answer an HTTP exchange waits for, by id.
    pub(super) in_flight: BTreeMap<IdKey, InFlight>,
    /// Progress tokens of requests in flight, to the ids of the requests carrying each, in
    /// the order they came (a client may reuse a token; its progress goes to the newest).
    pub(super) tokens: BTreeMap<IdKey, Vec<IdKey>>,
    /// The last request or stream end, for `--session-idle`.
    pub(super) last_active: Option<Instant>,
    /// The session's one entry in the hub's `idle_deadlines`, if it has one: a request
    /// only moves `last_active`, and the entry, when due, checks and moves on lazily.
    pub(super) idle_at: Option<Instant>,
}

impl McpSession {
    /// Whether it may expire: no request in flight and no stream open.
    pub(super) fn is_quiet(&self) -> bool {
        self.get_stream.is_none() && self.in_flight.is_empty()
    }
}

/// One request waiting for its answer.
#[derive(Debug)]
pub(super) struct InFlight {
    /// The HTTP exchange that gets the answer.
    request: RequestId,
    /// Its SSE stream, when the answer is a stream (else a JSON body).
    stream: Option<StreamId>,
    /// The id as the client wrote it.
    raw_id: String,
    /// Its progress token, if it carries one.
    token: Option<IdKey>,
    /// When it times out (`--request-timeout`; each progress moves it).
    pub(super) deadline: Option<Instant>,
    /// The browser origin to answer with CORS headers.
    cors: Option<String>,
}

/// Why requests still in flight are answered by the proxy.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ending {
    /// DELETE: the backend is told to cancel each.
    Deleted,
    /// The backend exited.
    BackendExited,
    /// The proxy shuts down.
    Shutdown,
}

impl Hub {
    /// `POST /mcp` after the stdin room check: SPEC section 7's checks in order, then the
    /// message. `dry_run` checks without acting (for a POST about to wait for room).
    pub(super) fn mcp_post(
        &mut self,
        now: Instant,
        request: RequestId,
        req: &Request,
        dry_run: bool,
    ) -> Result<(), Rejection> {
        let Payload::Bytes(body) = &req.body else {
            return Err(Rejection::BodyTooLarge);
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
        let (number, sid) = match &req.mcp.session {
            Some(text) => {
                let (number, sid) = self.mcp_session(text, &req.principal)?;
                (Some(number), sid)
            }
            None => {
                // Only an initialize may come without a session: it starts one.
                let starts = message::admit_client(body).is_ok_and(|m| {
                    m.kind == Kind::Request && m.method.as_deref() == Some("initialize")
                });
                if !starts {
                    return Err(Rejection::MissingMcpSession);
                }
                (
                    None,
                    SessionId::mint(self.settings.instance.as_ref(), req.entropy),
                )
            }
        };
        if dry_run {
            return match number {
                Some(_) => self.router.check_client_message(
                    sid.as_str(),
                    &req.principal,
                    req.body.as_body(),
                ),
                // Refused now as `open_mcp_session` would refuse it, not after a wait.
                None if !self.router.backend_is_up() => Err(Rejection::BackendDown),
                None if self.router.live_sessions() >= self.settings.max_sessions => {
                    Err(Rejection::TooManySessions)
                }
                None => Ok(()),
            };
        }
        let number = match number {
            Some(number) => number,
            None => self.open_mcp_session(now, sid, &req.principal)?,
        };
        let named = req.mcp.session.is_some();
        let max = self.settings.max_inflight;
        let in_flight = match &self.sessions.get(&number).map(|s| &s.kind) {
            Some(SessionKind::Mcp(m)) => &m.in_flight,
            _ => unreachable!("an mcp session was found or opened above"),
        };
        let checked = self.router.client_message_checked(
            sid.as_str(),
            &req.principal,
            req.body.as_body(),
            |info| {
                if info.kind == Kind::Notification {
                    return Ok(Admission::Notification {
                        cancels: info.cancels.and_then(IdKey::of),
                    });
                }
                if named && info.method == "initialize" {
                    return Err(Rejection::InitializeWithSession);
                }
                let raw = info.id.expect("requests have ids");
                let key = IdKey::of(raw).expect("admission checked the id");
                if in_flight.contains_key(&key) {
                    return Err(Rejection::IdInFlight);
                }
                if in_flight.len() >= max {
                    return Err(Rejection::TooManyInFlight);
                }
                Ok(Admission::Request {
                    key,
                    raw_id: raw.to_owned(),
                    token: info.progress_token.and_then(IdKey::of),
                })
            },
        );
        let admission = match checked {
            Ok((_, admission)) => admission,
            Err(rejection) => {
                if !named {
                    // The initialize that would have started it was refused.
                    self.forget_session(number);
                }
                if rejection == Rejection::IdInFlight {
                    // 409 with a JSON-RPC error under the id that is taken.
                    let raw = peek_id(body).unwrap_or_else(|| "null".to_owned());
                    let response =
                        self.mcp_decorate(streamable::id_in_flight(&raw), sid, &req.cors);
                    self.outputs
                        .push_back(Output::Respond { request, response });
                    return Ok(());
                }
                return Err(rejection);
            }
        };
        self.touch(number, now);
        match admission {
            Admission::Notification { cancels } => {
                let response =
                    self.mcp_decorate(streamable::notification_accepted(), sid, &req.cors);
                self.outputs
                    .push_back(Output::Respond { request, response });
                self.drain_router(now);
                if let Some(key) = cancels {
                    self.cancelled_by_client(now, number, &key);
                }
            }
            Admission::Request { key, raw_id, token } => {
                let stream_answer = accepts.event_stream && (token.is_some() || !accepts.json);
                let stream = stream_answer.then(|| StreamId(self.mint()));
                if let Some(stream) = stream {
                    let head = self.mcp_decorate(http::sse_head(), sid, &req.cors);
                    let role = StreamRole::Request(key.clone());
                    self.start_stream(now, request, stream, head, number, role);
                }
                let deadline = self.settings.request_timeout.map(|t| now + t);
                if let Some(at) = deadline {
                    self.request_deadlines.insert((at, number, key.clone()));
                }
                let Some(SessionKind::Mcp(m)) = self.sessions.get_mut(&number).map(|s| &mut s.kind)
                else {
                    unreachable!("checked above");
                };
                if let Some(token) = &token {
                    m.tokens.entry(token.clone()).or_default().push(key.clone());
                }
                m.in_flight.insert(
                    key,
                    InFlight {
                        request,
                        stream,
                        raw_id,
                        token,
                        deadline,
                        cors: req.cors.clone(),
                    },
                );
                // Now that the answer has somewhere to go: the line for the backend, or
                // the proxy's own answer (a cached initialize).
                self.drain_router(now);
            }
        }
        Ok(())
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
        let stream = StreamId(self.mint());
        let head = self.mcp_decorate(http::sse_head(), sid, &req.cors);
        self.start_stream(now, request, stream, head, number, StreamRole::Get);
        let old = match self.sessions.get_mut(&number).map(|s| &mut s.kind) {
            Some(SessionKind::Mcp(m)) => m.get_stream.replace(stream),
            _ => None,
        };
        if let Some(old) = old {
            self.remove_stream(old);
            self.outputs.push_back(Output::EndStream { stream: old });
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
        self.end_session(now, number, CloseReason::Deleted);
        let response = self.mcp_decorate(streamable::deleted(), sid, &req.cors);
        self.outputs
            .push_back(Output::Respond { request, response });
        Ok(())
    }

    /// GET's and DELETE's checks after their own: the version (400), the session header
    /// (400 without it), then the session it names (404).
    fn named_mcp_session(&self, req: &Request) -> Result<(u64, SessionId), Rejection> {
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
    /// ended, foreign and legacy sessions alike.
    fn mcp_session(
        &self,
        text: &str,
        principal: &Principal,
    ) -> Result<(u64, SessionId), Rejection> {
        let sid = self.router.authorize(text, principal)?;
        let number = *self.by_sid.get(&sid).ok_or(Rejection::SessionNotFound)?;
        match self.sessions.get(&number).map(|s| &s.kind) {
            Some(SessionKind::Mcp(_)) => Ok((number, sid)),
            _ => Err(Rejection::SessionNotFound),
        }
    }

    fn open_mcp_session(
        &mut self,
        now: Instant,
        sid: SessionId,
        principal: &Principal,
    ) -> Result<u64, Rejection> {
        self.router.open_session(sid, principal.clone())?;
        let kind = SessionKind::Mcp(McpSession {
            last_active: Some(now),
            ..McpSession::default()
        });
        let number = self.add_session(sid, kind);
        self.log(Event::SessionOpened {
            session: sid,
            principal: principal.clone(),
        });
        Ok(number)
    }

    /// Removes a session that never got going (its initialize was refused).
    fn forget_session(&mut self, number: u64) {
        if let Some(session) = self.sessions.remove(&number) {
            self.by_sid.remove(&session.id);
            self.router.close_session(&session.id);
            while self.router.poll_action().is_some() {}
        }
    }

    /// A request or a stream end: the session is active now. A quiet session gets an
    /// idle check unless it has one pending (which, when due, moves on to the latest
    /// `last_active`): at most one entry per session, never one per request.
    pub(super) fn touch(&mut self, number: u64, now: Instant) {
        let idle = self.settings.session_idle;
        if let Some(SessionKind::Mcp(m)) = self.sessions.get_mut(&number).map(|s| &mut s.kind) {
            m.last_active = Some(now);
            if m.is_quiet() && m.idle_at.is_none() {
                let at = now + idle;
                m.idle_at = Some(at);
                self.idle_deadlines.insert((at, number));
            }
        }
    }

    /// The client cancelled request `key`: its stream ends at once, a JSON waiter is told;
    /// the backend's late answer will find nothing in flight.
    fn cancelled_by_client(&mut self, now: Instant, number: u64, key: &IdKey) {
        let Some(entry) = self.take_in_flight(number, key) else {
            return;
        };
        let sid = self.sessions[&number].id;
        match entry.stream {
            Some(stream) => {
                self.remove_stream(stream);
                self.outputs.push_back(Output::EndStream { stream });
            }
            None => {
                let message = streamable::error_message(&entry.raw_id, -32800, "Request cancelled");
                let response =
                    self.mcp_decorate(streamable::json_answer(message), sid, &entry.cors);
                self.outputs.push_back(Output::Respond {
                    request: entry.request,
                    response,
                });
            }
        }
        self.touch(number, now);
    }

    /// Removes request `key` of session `number` from the in-flight table.
    fn take_in_flight(&mut self, number: u64, key: &IdKey) -> Option<InFlight> {
        let Some(SessionKind::Mcp(m)) = self.sessions.get_mut(&number).map(|s| &mut s.kind) else {
            return None;
        };
        let (key, entry) = m.in_flight.remove_entry(key)?;
        if let Some(token) = &entry.token {
            // Only this request's claim on the token goes: another one in flight that
            // carries the same token keeps its progress (and its clock restarts).
            if let Some(carriers) = m.tokens.get_mut(token) {
                carriers.retain(|k| *k != key);
                if carriers.is_empty() {
                    m.tokens.remove(token);
                }
            }
        }
        // Its timeout goes with it: the table holds requests in flight, not history.
        if let Some(at) = entry.deadline {
            self.request_deadlines.remove(&(at, number, key));
        }
        Some(entry)
    }

    /// Delivers a message for a Streamable session (SPEC section 7's table).
    pub(super) fn mcp_deliver(
        &mut self,
        now: Instant,
        number: u64,
        message: Vec<u8>,
        what: Delivery,
    ) {
        let sid = self.sessions[&number].id;
        match what {
            Delivery::Response { id } => {
                let key = std::str::from_utf8(&message[id]).ok().and_then(IdKey::of);
                let Some(entry) = key.and_then(|key| self.take_in_flight(number, &key)) else {
                    self.router.note_drop(DropReason::NotInFlight, None);
                    self.drain_router(now);
                    return;
                };
                self.answer(now, sid, entry, message);
                self.touch(number, now);
            }
            Delivery::Progress { token } => {
                let key = std::str::from_utf8(&message[token])
                    .ok()
                    .and_then(IdKey::of);
                let timeout = self.settings.request_timeout;
                let Some(SessionKind::Mcp(m)) = self.sessions.get_mut(&number).map(|s| &mut s.kind)
                else {
                    return;
                };
                let request = key
                    .and_then(|k| m.tokens.get(&k).and_then(|c| c.last()).cloned())
                    .and_then(|id| m.in_flight.get_mut(&id).map(|e| (id, e)));
                let mut target = m.get_stream;
                if let Some((id, entry)) = request {
                    // Progress restarts the request's clock.
                    if let Some(t) = timeout {
                        if let Some(old) = entry.deadline.replace(now + t) {
                            self.request_deadlines.remove(&(old, number, id.clone()));
                        }
                        self.request_deadlines.insert((now + t, number, id));
                    }
                    target = entry.stream.or(target);
                }
                match target {
                    Some(stream) => self.queue_on_stream(
                        now,
                        stream,
                        Frame::Owned(sse::message_event(&message)),
                    ),
                    None => {
                        self.router
                            .note_drop(DropReason::NoStream, Some("notifications/progress"));
                        self.drain_router(now);
                    }
                }
            }
            Delivery::Update => self.send_to_get_stream(
                now,
                number,
                Frame::Owned(sse::message_event(&message)),
                "notifications/resources/updated",
            ),
        }
    }

    /// A notification for the session's GET stream, if it has one open.
    pub(super) fn send_to_get_stream(
        &mut self,
        now: Instant,
        number: u64,
        frame: Frame,
        method: &str,
    ) {
        match self.sessions.get(&number).map(|s| &s.kind) {
            Some(SessionKind::Mcp(McpSession {
                get_stream: Some(stream),
                ..
            })) => {
                let stream = *stream;
                self.queue_on_stream(now, stream, frame);
            }
            _ => {
                self.router.note_drop(DropReason::NoStream, Some(method));
                self.drain_router(now);
            }
        }
    }

    /// Gives `entry` its answer: the JSON body, or the last event of its stream.
    fn answer(&mut self, now: Instant, sid: SessionId, entry: InFlight, message: Vec<u8>) {
        match entry.stream {
            Some(stream) => {
                self.queue_on_stream(now, stream, Frame::Owned(sse::message_event(&message)));
                self.remove_stream(stream);
                self.outputs.push_back(Output::EndStream { stream });
            }
            None => {
                let response =
                    self.mcp_decorate(streamable::json_answer(message), sid, &entry.cors);
                self.outputs.push_back(Output::Respond {
                    request: entry.request,
                    response,
                });
            }
        }
    }

    /// A request's stream ended on the client's side: it stops waiting (a disconnect is
    /// not a cancellation; the late answer is dropped).
    pub(super) fn request_stream_closed(&mut self, now: Instant, number: u64, key: &IdKey) {
        self.take_in_flight(number, key);
        self.touch(number, now);
    }

    /// `--request-timeout` passed for request `key` (unless progress moved its deadline):
    /// the client gets -32001 under its own id and the backend a cancellation.
    pub(super) fn request_timed_out(
        &mut self,
        now: Instant,
        at: Instant,
        number: u64,
        key: &IdKey,
    ) {
        let due = match self.sessions.get(&number).map(|s| &s.kind) {
            Some(SessionKind::Mcp(m)) => {
                m.in_flight.get(key).is_some_and(|e| e.deadline == Some(at))
            }
            _ => false,
        };
        if !due {
            return;
        }
        let entry = self.take_in_flight(number, key).expect("checked above");
        let sid = self.sessions[&number].id;
        if let Some(line) = streamable::cancel_line(&sid, &entry.raw_id, "request timed out") {
            self.queue_for_backend(line, LineFrom::Cancellation);
        }
        let message = streamable::error_message(&entry.raw_id, -32001, "request timed out");
        self.answer(now, sid, entry, message);
        self.touch(number, now);
    }

    /// The session's idle check (its entry, already taken from `idle_deadlines`) is due:
    /// it ends if `--session-idle` passed since it was last active and it still is quiet;
    /// if it was active since, the check moves to `last_active + idle`; if it is busy, the
    /// touch that finds it quiet again schedules the next one.
    pub(super) fn idle_check(&mut self, now: Instant, number: u64) {
        let idle = self.settings.session_idle;
        let Some(SessionKind::Mcp(m)) = self.sessions.get_mut(&number).map(|s| &mut s.kind) else {
            return;
        };
        m.idle_at = None;
        if !m.is_quiet() {
            return;
        }
        let Some(until) = m.last_active.map(|t| t + idle) else {
            return;
        };
        if until <= now {
            self.end_session(now, number, CloseReason::Idle);
        } else {
            m.idle_at = Some(until);
            self.idle_deadlines.insert((until, number));
        }
    }

    /// Answers every request of a Streamable session still in flight and ends its streams.
    pub(super) fn end_mcp(
        &mut self,
        now: Instant,
        number: u64,
        sid: SessionId,
        mut m: McpSession,
        ending: Ending,
    ) {
        if let Some(at) = m.idle_at.take() {
            self.idle_deadlines.remove(&(at, number));
        }
        for (key, entry) in std::mem::take(&mut m.in_flight) {
            if let Some(at) = entry.deadline {
                self.request_deadlines.remove(&(at, number, key));
            }
            if let (Ending::Deleted, Some(line)) = (
                ending,
                streamable::cancel_line(&sid, &entry.raw_id, "session deleted"),
            ) {
                self.queue_for_backend(line, LineFrom::Cancellation);
            }
            let (code, text) = match ending {
                Ending::Deleted => (-32603, "session deleted"),
                Ending::BackendExited => (-32603, "backend restarted"),
                Ending::Shutdown => (-32603, "proxy shutting down"),
            };
            let message = streamable::error_message(&entry.raw_id, code, text);
            self.answer(now, sid, entry, message);
        }
        if let Some(stream) = m.get_stream.take() {
            self.remove_stream(stream);
            self.outputs.push_back(Output::EndStream { stream });
        }
    }

    /// Adds the session header (and CORS headers) to an answer of `sid`.
    fn mcp_decorate(
        &self,
        mut response: Response,
        sid: SessionId,
        cors: &Option<String>,
    ) -> Response {
        response.headers.push((
            "mcp-session-id",
            std::borrow::Cow::Owned(sid.as_str().to_owned()),
        ));
        if let Some(origin) = cors {
            http::add_cors(&mut response, origin);
        }
        response
    }

    /// Answers `request` with the head of `stream`, which then carries `role`'s frames for
    /// `session` (with keep-alives when idle).
    pub(super) fn start_stream(
        &mut self,
        now: Instant,
        request: RequestId,
        stream: StreamId,
        head: Response,
        session: u64,
        role: StreamRole,
    ) {
        self.outputs.push_back(Output::StartStream {
            request,
            stream,
            head,
            budget: self.settings.session_buffer,
        });
        self.streams.insert(
            stream,
            StreamState {
                session,
                role,
                last_frame: now,
                keepalive_at: now + self.settings.keepalive,
            },
        );
        self.keepalives
            .insert((now + self.settings.keepalive, stream));
    }

    /// Forgets `stream`, its keep-alive timer with it.
    pub(super) fn remove_stream(&mut self, stream: StreamId) -> Option<StreamState> {
        let state = self.streams.remove(&stream)?;
        self.keepalives.remove(&(state.keepalive_at, stream));
        Some(state)
    }
}

/// What the check of a POSTed message found.
enum Admission {
    Notification {
        cancels: Option<IdKey>,
    },
    Request {
        key: IdKey,
        raw_id: String,
        token: Option<IdKey>,
    },
}

/// The raw id of a body that was admitted once already.
fn peek_id(body: &[u8]) -> Option<String> {
    let msg = message::admit_client(body).ok()?;
    msg.id.map(|id| id.get().to_owned())
}
