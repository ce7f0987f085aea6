//! The router: live sessions bound to principals, and the rules of SPEC sections 2 and 3.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Range;
use std::sync::Arc;

use serde_json::value::RawValue;

use crate::action::{Action, Delivery, DropReason, LogLevel};
use crate::auth::Principal;
use crate::http::Rejection;
use crate::message::{self, Kind, Message, RawId};
use crate::metrics::Metrics;
use crate::routed_id::{self, SessionId};

/// How many distinct (reason, method) pairs are remembered for warn-once logging and used
/// as metrics labels; a backend inventing method names cannot grow memory past this.
pub const WARN_SET_CAP: usize = 64;
/// Resource subscriptions one session may hold.
pub const MAX_SUBSCRIPTIONS_PER_SESSION: usize = 1024;
/// Clients that may wait for the backend's first `initialize` at once.
pub const MAX_INITIALIZE_WAITERS: usize = 4096;

/// The proxy's own requests awaiting an answer, at most.
const MAX_PROXY_REQUESTS: usize = 256;

/// What one of the proxy's own requests was, so only the right answer counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProxyRequest {
    Ping,
    Unsubscribe,
    Initialize,
}

/// Prefix of the ids the proxy mints for its own requests. Not a UUID, so it can never be
/// mistaken for a session's routed id.
const PROXY_ID_PREFIX: &str = "switchboard|";

/// The body of a POST as far as the shell could read it.
#[derive(Debug, Clone, Copy)]
pub enum Body<'a> {
    /// All of it.
    Complete(&'a [u8]),
    /// Longer than `--max-body`; the rest was not read.
    TooLarge,
}

/// How an admitted POST was handled; the HTTP answer is 202 in every case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// A [`Action::Rewrite`] for the backend was queued.
    Forwarded,
    /// The proxy answers the client itself (a cached `initialize`, an unsubscribe others
    /// still need), now or when the backend's first `initialize` completes.
    Answered,
    /// Accepted and deliberately not forwarded (the client's `notifications/initialized`).
    Absorbed,
}

#[derive(Debug)]
struct Session {
    principal: Principal,
    subscriptions: BTreeSet<String>,
}

/// The once-per-backend `initialize` handshake.
#[derive(Debug)]
enum Init {
    /// No handshake yet (or the last one failed): the next `initialize` goes to the backend.
    Idle,
    /// The first client's `initialize` is at the backend under the proxy's own id
    /// `switchboard|initialize:<request>`; every asking client (the first included) waits
    /// for its answer. A client reusing its id meanwhile cannot pass its own answer off as
    /// the handshake's.
    InFlight {
        request: u64,
        waiting: Vec<(SessionId, String)>,
    },
    /// The backend's `initialize` result, answered to every later client.
    Ready { result: Box<RawValue> },
}

/// The sans-IO state machine between many client sessions and one backend.
///
/// Loop contract: after every input (`open_session`, `close_session`, `client_message`,
/// `backend_line`, `backend_started`, `backend_exited`, `health_ping`), drain
/// [`Router::poll_action`] until it returns `None` and perform each action in order.
#[derive(Debug)]
pub struct Router {
    sessions: BTreeMap<SessionId, Session>,
    subscribers: BTreeMap<String, BTreeSet<SessionId>>,
    init: Init,
    backend_up: bool,
    max_sessions: usize,
    next_proxy_request: u64,
    proxy_requests: BTreeMap<u64, ProxyRequest>,
    actions: VecDeque<Action>,
    warned: BTreeSet<(DropReason, String)>,
    metrics: Metrics,
}

impl Router {
    /// A router with the backend not yet started and at most `max_sessions` live sessions.
    pub fn new(max_sessions: usize) -> Self {
        Router {
            sessions: BTreeMap::new(),
            subscribers: BTreeMap::new(),
            init: Init::Idle,
            backend_up: false,
            max_sessions,
            next_proxy_request: 1,
            proxy_requests: BTreeMap::new(),
            actions: VecDeque::new(),
            warned: BTreeSet::new(),
            metrics: Metrics::default(),
        }
    }

    /// The next action to perform, in order; drain until `None` after every input.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Counters for `/metrics`.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Counts a rejection the shell decided before the router saw the request (401, 403, ...).
    pub fn count_rejection(&mut self, rejection: &Rejection) {
        self.metrics.rejected(rejection);
    }

    /// Counts a proxy line the shell could not queue for the backend.
    pub fn count_backend_queue_full(&mut self) {
        self.drop_message(DropReason::BackendQueueFull, None);
    }

    /// Sessions live now.
    pub fn live_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Whether `session` is live.
    pub fn is_live(&self, session: &SessionId) -> bool {
        self.sessions.contains_key(session)
    }

    /// Live session ids in order, for shells and tests that need to enumerate them.
    pub fn sessions(&self) -> impl Iterator<Item = &SessionId> {
        self.sessions.keys()
    }

    /// Subscriptions recorded, as (session, uri) pairs counted in the per-session sets and in
    /// the per-uri sets (the two agree); for tests.
    #[doc(hidden)]
    pub fn subscription_count(&self) -> (usize, usize) {
        (
            self.sessions.values().map(|s| s.subscriptions.len()).sum(),
            self.subscribers.values().map(BTreeSet::len).sum(),
        )
    }

    /// Whether the backend runs, as far as the router was told.
    pub fn backend_is_up(&self) -> bool {
        self.backend_up
    }

    /// Binds a new session (its id drawn by the shell) to `principal` before its stream
    /// sends anything. Refused with 503 while the backend is down or `max_sessions` are live.
    pub fn open_session(
        &mut self,
        session: SessionId,
        principal: Principal,
    ) -> Result<(), Rejection> {
        let refusal = if !self.backend_up {
            Some(Rejection::BackendDown)
        } else if self.sessions.len() >= self.max_sessions {
            Some(Rejection::TooManySessions)
        } else if self.sessions.contains_key(&session) {
            // 128 random bits never collide; refuse rather than merge two streams.
            Some(Rejection::TooManySessions)
        } else {
            None
        };
        if let Some(rejection) = refusal {
            self.metrics.rejected(&rejection);
            return Err(rejection);
        }
        self.sessions.insert(
            session,
            Session {
                principal,
                subscriptions: BTreeSet::new(),
            },
        );
        self.metrics.sessions_opened += 1;
        Ok(())
    }

    /// The session's stream ended (client gone, write error, slow consumer). Its late
    /// responses will be dropped; resources only it was watching are unsubscribed.
    pub fn close_session(&mut self, session: &SessionId) {
        let Some(state) = self.sessions.remove(session) else {
            return;
        };
        self.metrics.sessions_closed += 1;
        for uri in state.subscriptions {
            self.leave_subscription(session, &uri);
        }
    }

    /// A closed session stops watching `uri`; when it was the last, the proxy unsubscribes
    /// the backend with an id of its own (whose answer it consumes).
    fn leave_subscription(&mut self, session: &SessionId, uri: &str) {
        let Some(set) = self.subscribers.get_mut(uri) else {
            return;
        };
        set.remove(session);
        if !set.is_empty() {
            return;
        }
        self.subscribers.remove(uri);
        let n = self.next_proxy_id(ProxyRequest::Unsubscribe);
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":\"{PROXY_ID_PREFIX}unsubscribe:{n}\",\"method\":\"resources/unsubscribe\",\"params\":{{\"uri\":{}}}}}\n",
            serde_json::Value::from(uri)
        );
        self.push_reply(line.into_bytes());
    }

    /// Checks that `session` (the raw query value) is live and owned by `principal`: one
    /// 404 for unknown, closed and foreign sessions, so a caller learns nothing.
    pub fn authorize(&self, session: &str, principal: &Principal) -> Result<SessionId, Rejection> {
        SessionId::parse(session)
            .filter(|sid| {
                self.sessions
                    .get(sid)
                    .is_some_and(|s| s.principal == *principal)
            })
            .ok_or(Rejection::SessionNotFound)
    }

    /// A client POSTed `body` to `session`. Checks run in SPEC section 1 order from the
    /// session on; the result is the POST's HTTP answer.
    pub fn client_message(
        &mut self,
        session: &str,
        principal: &Principal,
        body: Body<'_>,
    ) -> Result<Accepted, Rejection> {
        self.client_message_checked(session, principal, body, |_| Ok(()))
            .map(|(accepted, ())| accepted)
    }

    /// [`Router::client_message`], with `check` called once the message is admitted and
    /// before anything happens: its refusal refuses the message (nothing is forwarded,
    /// recorded or answered), its value comes back with the answer. Streamable HTTP uses it
    /// for the rules that need the message read (409 for an id in flight, 429).
    pub fn client_message_checked<T>(
        &mut self,
        session: &str,
        principal: &Principal,
        body: Body<'_>,
        check: impl FnOnce(&MessageInfo<'_>) -> Result<T, Rejection>,
    ) -> Result<(Accepted, T), Rejection> {
        let result = self.admit(session, principal, body).and_then(|(sid, msg)| {
            let value = check(&MessageInfo::of(&msg))?;
            Ok((self.act(sid, &msg), value))
        });
        match &result {
            Ok(_) => self.metrics.client_messages += 1,
            Err(rejection) => self.metrics.rejected(rejection),
        }
        result
    }

    /// Counts a message the hub dropped for a reason of its own (and logs it once loudly).
    pub fn note_drop(&mut self, reason: DropReason, method: Option<&str>) {
        self.drop_message(reason, method);
    }

    /// Runs every check of [`Router::client_message`] without acting on the message: a
    /// shell whose backend queue stays full uses it to give the right refusal before 503.
    pub fn check_client_message(
        &self,
        session: &str,
        principal: &Principal,
        body: Body<'_>,
    ) -> Result<(), Rejection> {
        self.admit(session, principal, body).map(|_| ())
    }

    fn admit<'b>(
        &self,
        session: &str,
        principal: &Principal,
        body: Body<'b>,
    ) -> Result<(SessionId, Message<'b>), Rejection> {
        if session.is_empty() {
            return Err(Rejection::MissingSessionId);
        }
        let sid = self.authorize(session, principal)?;
        let Body::Complete(bytes) = body else {
            return Err(Rejection::BodyTooLarge);
        };
        let msg = message::admit_client(bytes).map_err(Rejection::Invalid)?;
        if !self.backend_up {
            return Err(Rejection::BackendDown);
        }
        Ok((sid, msg))
    }

    fn act(&mut self, sid: SessionId, msg: &Message<'_>) -> Accepted {
        let method = msg.method.as_deref().unwrap_or_default();
        match msg.kind {
            Kind::Request => match method {
                "initialize" => self.client_initialize(sid, msg),
                "resources/unsubscribe" => self.client_unsubscribe(sid, msg),
                "resources/subscribe" => {
                    if let Some(uri) = param_uri(msg) {
                        let state = self.sessions.get_mut(&sid).expect("authorized above");
                        if !state.subscriptions.contains(&uri)
                            && state.subscriptions.len() >= MAX_SUBSCRIPTIONS_PER_SESSION
                        {
                            self.answer_error(sid, msg, -32603, "Too many subscriptions");
                            return Accepted::Answered;
                        }
                        state.subscriptions.insert(uri.clone());
                        self.subscribers.entry(uri).or_default().insert(sid);
                    }
                    self.forward_request(sid, msg)
                }
                _ => self.forward_request(sid, msg),
            },
            Kind::Notification => match method {
                // The proxy alone completes the backend's one handshake: a client's
                // `initialized`, or an `initialize` sent without an id, goes no further.
                "notifications/initialized" | "initialize" => Accepted::Absorbed,
                "notifications/cancelled" => {
                    let mut edits = Edits::default();
                    edits.route(sid, msg, msg.params.meta_progress_token);
                    edits.route(sid, msg, msg.params.request_id);
                    self.push_rewrite(msg, edits);
                    Accepted::Forwarded
                }
                _ => {
                    // SPEC 6.2: every progressToken a client sends carries its own sid.
                    let mut edits = Edits::default();
                    edits.route(sid, msg, msg.params.meta_progress_token);
                    self.push_rewrite(msg, edits);
                    Accepted::Forwarded
                }
            },
            Kind::Response => unreachable!("admit_client refuses responses"),
        }
    }

    fn client_initialize(&mut self, sid: SessionId, msg: &Message<'_>) -> Accepted {
        let id = client_id(msg).to_owned();
        match &mut self.init {
            Init::Ready { result } => {
                let answer = response_line(&id, "result", result.get());
                self.deliver(sid, answer, answer_to(&id));
                Accepted::Answered
            }
            Init::InFlight { waiting, .. } if waiting.len() < MAX_INITIALIZE_WAITERS => {
                waiting.push((sid, id));
                Accepted::Answered
            }
            Init::InFlight { .. } => {
                self.answer_error(sid, msg, -32603, "Too many clients waiting for initialize");
                Accepted::Answered
            }
            Init::Idle => {
                let request = self.next_proxy_id(ProxyRequest::Initialize);
                self.init = Init::InFlight {
                    request,
                    waiting: vec![(sid, id)],
                };
                let id_raw = msg.id.expect("requests have ids");
                let own_id = format!("\"{PROXY_ID_PREFIX}initialize:{request}\"");
                let mut edits = Edits::default();
                edits.push(msg.span(id_raw), Patch::Owned(own_id.into_bytes()));
                edits.route(sid, msg, msg.params.meta_progress_token);
                if let Some(c) = msg.params.capabilities {
                    // A shared backend is offered no client capabilities: its sampling,
                    // roots or elicitation requests could not be attributed.
                    edits.push(msg.span(c), Patch::Text(b"{}"));
                }
                self.push_rewrite(msg, edits);
                Accepted::Forwarded
            }
        }
    }

    fn client_unsubscribe(&mut self, sid: SessionId, msg: &Message<'_>) -> Accepted {
        let Some(uri) = param_uri(msg) else {
            return self.forward_request(sid, msg);
        };
        let held = self
            .sessions
            .get_mut(&sid)
            .expect("authorized above")
            .subscriptions
            .remove(&uri);
        let others = self.subscribers.get_mut(&uri).map(|set| {
            set.remove(&sid);
            set.len()
        });
        match (held, others) {
            // Others still watch: only this session leaves; the backend keeps the subscription.
            (_, Some(n)) if n > 0 => {
                let answer = response_line(client_id(msg), "result", "{}");
                self.deliver(sid, answer, answer_to(client_id(msg)));
                Accepted::Answered
            }
            _ => {
                self.subscribers.remove(&uri);
                self.forward_request(sid, msg)
            }
        }
    }

    /// Forwards a client request with its id (and progress token) routed.
    fn forward_request(&mut self, sid: SessionId, msg: &Message<'_>) -> Accepted {
        let mut edits = Edits::default();
        edits.route(sid, msg, msg.id);
        edits.route(sid, msg, msg.params.meta_progress_token);
        if msg.method.as_deref() == Some("notifications/cancelled") {
            // SPEC 6.2: a cancel sent with an id still names only the sender's requests.
            edits.route(sid, msg, msg.params.request_id);
        }
        self.push_rewrite(msg, edits);
        Accepted::Forwarded
    }

    fn push_rewrite(&mut self, msg: &Message<'_>, edits: Edits<'_>) {
        let line = splice(msg.text, edits, true);
        self.metrics.rewrites += 1;
        self.actions.push_back(Action::Rewrite { line });
    }

    fn answer_error(&mut self, sid: SessionId, msg: &Message<'_>, code: i32, text: &str) {
        let error = format!(
            r#"{{"code":{code},"message":{}}}"#,
            serde_json::Value::from(text)
        );
        let answer = response_line(client_id(msg), "error", &error);
        self.deliver(sid, answer, answer_to(client_id(msg)));
    }

    /// The backend process is running: sessions may open and POSTs may pass.
    pub fn backend_started(&mut self) {
        self.backend_up = true;
        self.init = Init::Idle;
    }

    /// The backend process exited: every session is forgotten (their clients reconnect and
    /// re-initialize against the next process) and the `initialize` cache is cleared.
    pub fn backend_exited(&mut self) {
        self.backend_up = false;
        self.init = Init::Idle;
        self.proxy_requests.clear();
        self.close_all_sessions();
    }

    /// Forgets every session at once (backend exit, shutdown), sending nothing.
    pub fn close_all_sessions(&mut self) {
        self.subscribers.clear();
        self.metrics.sessions_closed += self.sessions.len() as u64;
        self.sessions.clear();
        if let Init::InFlight { waiting, .. } = &mut self.init {
            waiting.clear();
        }
    }

    /// Sends the backend a `ping` with an id of the proxy's own; its answer comes back as
    /// [`Action::Pong`] with the returned number.
    pub fn health_ping(&mut self) -> u64 {
        let n = self.next_proxy_id(ProxyRequest::Ping);
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":\"{PROXY_ID_PREFIX}ping:{n}\",\"method\":\"ping\"}}\n"
        );
        self.push_reply(line.into_bytes());
        n
    }

    /// The backend's stdin line was longer than the maximum and was skipped.
    pub fn backend_line_too_long(&mut self) {
        self.metrics.backend_lines += 1;
        self.drop_message(DropReason::LineTooLong, None);
    }

    /// One line from the backend's stdout (without its newline): SPEC section 3.
    pub fn backend_line(&mut self, line: &[u8]) {
        self.metrics.backend_lines += 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Ok(text) = std::str::from_utf8(line) else {
            return self.drop_message(DropReason::Malformed, None);
        };
        let msg = match message::parse_backend(text) {
            Ok(msg) => msg,
            Err(message::Invalid::Batch) => return self.drop_message(DropReason::Batch, None),
            Err(_) => return self.drop_message(DropReason::Malformed, None),
        };
        match msg.kind {
            Kind::Response => self.backend_response(&msg),
            Kind::Notification => self.backend_notification(&msg),
            Kind::Request => self.backend_request(&msg),
        }
    }

    fn backend_response(&mut self, msg: &Message<'_>) {
        let id_raw = msg.id.map(RawValue::get).unwrap_or("null");
        if let Some(value) = msg.id.and_then(message::string_value) {
            if let Some(own) = value.strip_prefix(PROXY_ID_PREFIX) {
                return self.proxy_response(msg, own);
            }
        }
        let Some(decoded) = routed_id::decode(id_raw) else {
            return self.drop_message(DropReason::UnroutedResponse, None);
        };
        if !self.sessions.contains_key(&decoded.session) {
            return self.drop_message(DropReason::SessionGone, None);
        }
        let mut edits = Edits::default();
        let span = msg.span(msg.id.expect("decoded from the id"));
        let id = span.start..span.start + decoded.original.len();
        edits.push(span, Patch::Text(decoded.original.as_bytes()));
        let message = splice(msg.text, edits, false);
        self.deliver(decoded.session, message, Delivery::Response { id });
    }

    /// A response to one of the proxy's own requests (`<kind>:<n>` after the prefix).
    fn proxy_response(&mut self, msg: &Message<'_>, own: &str) {
        let request = own.split_once(':').and_then(|(kind, n)| {
            let canonical = !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_digit())
                && (n == "0" || !n.starts_with('0'));
            Some((kind, canonical.then(|| n.parse::<u64>().ok())??))
        });
        let kind = request.and_then(|(kind, n)| {
            let expected = match kind {
                "ping" => ProxyRequest::Ping,
                "unsubscribe" => ProxyRequest::Unsubscribe,
                "initialize" => ProxyRequest::Initialize,
                _ => return None,
            };
            // Only an answer naming the request's own kind and number settles it.
            (self.proxy_requests.get(&n) == Some(&expected)).then_some((expected, n))
        });
        let Some((kind, n)) = kind else {
            return self.drop_message(DropReason::UnroutedResponse, None);
        };
        self.proxy_requests.remove(&n);
        match kind {
            ProxyRequest::Ping => self.actions.push_back(Action::Pong { ping: n }),
            ProxyRequest::Initialize => {
                if matches!(self.init, Init::InFlight { request, .. } if request == n) {
                    self.initialize_answered(msg);
                } else {
                    self.drop_message(DropReason::UnroutedResponse, None);
                }
            }
            // The answer to an unsubscribe after the last subscriber left.
            ProxyRequest::Unsubscribe => {}
        }
    }

    /// Numbers the proxy's own request of `kind` and remembers it until answered (the
    /// oldest are forgotten past a bound, so a silent backend cannot grow memory).
    fn next_proxy_id(&mut self, kind: ProxyRequest) -> u64 {
        let n = self.next_proxy_request;
        self.next_proxy_request += 1;
        if self.proxy_requests.len() >= MAX_PROXY_REQUESTS {
            self.proxy_requests.pop_first();
        }
        self.proxy_requests.insert(n, kind);
        n
    }

    /// The backend answered the first `initialize`: answer every waiting client under its
    /// own id; on success cache the result and complete the handshake once.
    fn initialize_answered(&mut self, msg: &Message<'_>) {
        let Init::InFlight { waiting, .. } = std::mem::replace(&mut self.init, Init::Idle) else {
            unreachable!("checked by the caller");
        };
        let (member, value) = match (msg.result, msg.error) {
            (Some(result), _) => ("result", result),
            (None, Some(error)) => ("error", error),
            (None, None) => unreachable!("responses have a result or an error"),
        };
        for (sid, id) in waiting {
            if self.sessions.contains_key(&sid) {
                let answer = response_line(&id, member, value.get());
                self.deliver(sid, answer, answer_to(&id));
            }
        }
        if member == "result" {
            self.init = Init::Ready {
                result: value.to_owned(),
            };
            self.push_reply(
                br#"{"jsonrpc":"2.0","method":"notifications/initialized"}
"#
                .to_vec(),
            );
        }
    }

    fn backend_notification(&mut self, msg: &Message<'_>) {
        let method = msg.method.as_deref().unwrap_or_default();
        match method {
            "notifications/tools/list_changed"
            | "notifications/resources/list_changed"
            | "notifications/prompts/list_changed" => {
                if self.sessions.is_empty() {
                    return self.drop_message(DropReason::NoLiveSession, Some(method));
                }
                let rebuilt = format!(r#"{{"jsonrpc":"2.0","method":"{method}"}}"#);
                self.metrics.broadcasts += 1;
                self.actions.push_back(Action::Broadcast {
                    message: Arc::from(rebuilt.into_bytes()),
                });
            }
            "notifications/progress" => {
                let token = msg.params.progress_token;
                let decoded = token.and_then(|t| routed_id::decode(t.get()));
                match (token, decoded) {
                    (Some(token), Some(d)) if self.sessions.contains_key(&d.session) => {
                        let mut edits = Edits::default();
                        let span = msg.span(token);
                        let at = span.start..span.start + d.original.len();
                        edits.push(span, Patch::Text(d.original.as_bytes()));
                        let message = splice(msg.text, edits, false);
                        self.deliver(d.session, message, Delivery::Progress { token: at });
                    }
                    (_, Some(_)) => self.drop_message(DropReason::SessionGone, Some(method)),
                    (_, None) => self.drop_message(DropReason::UnroutedProgress, Some(method)),
                }
            }
            "notifications/resources/updated" => {
                let watchers: Vec<SessionId> = param_uri(msg)
                    .and_then(|uri| self.subscribers.get(&uri))
                    .map(|set| set.iter().copied().collect())
                    .unwrap_or_default();
                if watchers.is_empty() {
                    return self.drop_message(DropReason::NoSubscriber, Some(method));
                }
                let message = splice(msg.text, Edits::default(), false);
                for sid in watchers {
                    self.deliver(sid, message.clone(), Delivery::Update);
                }
            }
            _ => self.drop_message(DropReason::UnroutableNotification, Some(method)),
        }
    }

    fn backend_request(&mut self, msg: &Message<'_>) {
        let method = msg.method.as_deref().unwrap_or_default();
        let id = msg.id.map(RawValue::get).unwrap_or("null");
        let line = if method == "ping" {
            self.drop_message(DropReason::AnsweredPing, Some(method));
            response_line(id, "result", "{}")
        } else {
            self.drop_message(DropReason::AnsweredServerRequest, Some(method));
            let text = format!(
                "Method not found: {method} (a shared proxy cannot attribute server-to-client requests to a client)"
            );
            let error = format!(
                r#"{{"code":-32601,"message":{}}}"#,
                serde_json::Value::from(text)
            );
            response_line(id, "error", &error)
        };
        let mut line = line;
        line.push(b'\n');
        self.push_reply(line);
    }

    fn deliver(&mut self, session: SessionId, message: Vec<u8>, what: Delivery) {
        self.metrics.delivered += 1;
        self.actions.push_back(Action::Deliver {
            session,
            message,
            what,
        });
    }

    fn push_reply(&mut self, line: Vec<u8>) {
        self.metrics.replies += 1;
        self.actions.push_back(Action::Reply { line });
    }

    /// Counts a drop and decides its log level: WARN the first time a (reason, method) is
    /// seen while the remembered set has room, DEBUG after.
    fn drop_message(&mut self, reason: DropReason, method: Option<&str>) {
        let key = (reason, method.unwrap_or_default().to_owned());
        let remembered = self.warned.contains(&key);
        let level = if !remembered && self.warned.len() < WARN_SET_CAP {
            self.warned.insert(key.clone());
            if reason == DropReason::AnsweredPing {
                LogLevel::Debug
            } else {
                LogLevel::Warn
            }
        } else {
            LogLevel::Debug
        };
        let label = if self.warned.contains(&key) {
            key.1
        } else {
            "other".to_owned()
        };
        self.metrics.dropped(reason, label);
        self.actions.push_back(Action::Drop {
            reason,
            method: method.map(str::to_owned),
            level,
        });
    }
}

/// What an admitted client message is, as [`Router::client_message_checked`] shows it.
#[derive(Debug, Clone, Copy)]
pub struct MessageInfo<'a> {
    /// Request or notification.
    pub kind: Kind,
    /// Its method.
    pub method: &'a str,
    /// A request's id, as JSON text.
    pub id: Option<&'a str>,
    /// `params._meta.progressToken` when it is an integer or a string, as JSON text.
    pub progress_token: Option<&'a str>,
    /// The `requestId` of a `notifications/cancelled` when an integer or a string.
    pub cancels: Option<&'a str>,
}

impl<'a> MessageInfo<'a> {
    fn of(msg: &'a Message<'a>) -> MessageInfo<'a> {
        let id_like = |v: Option<&'a RawValue>| {
            v.map(RawValue::get)
                .filter(|raw| RawId::classify(raw).is_some())
        };
        let method = msg.method.as_deref().unwrap_or_default();
        MessageInfo {
            kind: msg.kind,
            method,
            id: msg.id.map(RawValue::get),
            progress_token: id_like(msg.params.meta_progress_token),
            cancels: (method == "notifications/cancelled")
                .then(|| id_like(msg.params.request_id))
                .flatten(),
        }
    }
}

/// The raw text of a client request's id (admission guarantees it is present).
fn client_id<'a>(msg: &Message<'a>) -> &'a str {
    msg.id.map(RawValue::get).unwrap_or("null")
}

/// The string value of `params.uri`, if it is a string.
fn param_uri(msg: &Message<'_>) -> Option<String> {
    message::string_value(msg.params.uri?).map(|s| s.into_owned())
}

/// Where [`response_line`] puts the id.
const RESPONSE_ID_AT: usize = r#"{"jsonrpc":"2.0","id":"#.len();

/// The delivery of an answer [`response_line`] built for `id`.
fn answer_to(id: &str) -> Delivery {
    Delivery::Response {
        id: RESPONSE_ID_AT..RESPONSE_ID_AT + id.len(),
    }
}

/// `{"jsonrpc":"2.0","id":<id>,"<member>":<value>}` without a newline, carriage returns in
/// `value` (JSON whitespace) turned into spaces.
fn response_line(id: &str, member: &str, value: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(id.len() + value.len() + 40);
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b",\"");
    out.extend_from_slice(member.as_bytes());
    out.extend_from_slice(b"\":");
    out.extend_from_slice(value.as_bytes());
    out.push(b'}');
    flatten_newlines(&mut out);
    out
}

/// What replaces a span of a message.
#[derive(Debug)]
enum Patch<'a> {
    /// The routed id of this session's id (written straight into the output).
    Routed(SessionId, RawId<'a>),
    Text(&'a [u8]),
    Owned(Vec<u8>),
}

/// The few spans one message needs rewritten (id, progress token, request id,
/// capabilities), kept inline: the hot path allocates only its output.
#[derive(Debug, Default)]
struct Edits<'a> {
    items: [Option<(Range<usize>, Patch<'a>)>; 4],
}

impl<'a> Edits<'a> {
    fn push(&mut self, span: Range<usize>, patch: Patch<'a>) {
        let free = self
            .items
            .iter_mut()
            .find(|slot| slot.is_none())
            .expect("a message has at most four rewritten spans");
        *free = Some((span, patch));
    }

    /// Routes `value` (an id, request id or progress token) when it is an integer or a
    /// string; any other type passes unchanged.
    fn route(&mut self, sid: SessionId, msg: &Message<'a>, value: Option<&'a RawValue>) {
        if let Some(value) = value {
            if let Some(id) = RawId::classify(value.get()) {
                self.push(msg.span(value), Patch::Routed(sid, id));
            }
        }
    }
}

/// Replaces the `edits` (non-overlapping) in `text`, flattens raw newlines, and appends
/// `\n` when the result is a backend line.
fn splice(text: &str, edits: Edits<'_>, line: bool) -> Vec<u8> {
    let mut edits = edits.items;
    edits.sort_by_key(|edit| edit.as_ref().map_or(usize::MAX, |(span, _)| span.start));
    let mut out = Vec::with_capacity(text.len() + 2 * 48 + 1);
    let mut at = 0;
    for (span, patch) in edits.into_iter().flatten() {
        out.extend_from_slice(&text.as_bytes()[at..span.start]);
        match patch {
            Patch::Routed(sid, id) => routed_id::encode(&sid, id, &mut out),
            Patch::Text(bytes) => out.extend_from_slice(bytes),
            Patch::Owned(bytes) => out.extend_from_slice(&bytes),
        }
        at = span.end;
    }
    out.extend_from_slice(&text.as_bytes()[at..]);
    flatten_newlines(&mut out);
    if line {
        out.push(b'\n');
    }
    out
}

/// Raw CR and LF can only be whitespace between JSON tokens (strings cannot hold them), so
/// turning them into spaces keeps the message identical while making it one line.
fn flatten_newlines(bytes: &mut [u8]) {
    let mut from = 0;
    while let Some(i) = memchr::memchr2(b'\n', b'\r', &bytes[from..]) {
        bytes[from + i] = b' ';
        from += i + 1;
    }
}
