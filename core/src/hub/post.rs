//! Legacy sessions (`GET /sse`, `POST /messages`) and what every admitted client message
//! does, on either transport. A POST is checked in full once. Its session must be within
//! its fair share of the backend's stdin (else 503 at once); while a restarted backend is
//! not ready, it waits its turn, in order and already checked, for `--restart-wait`.

use std::collections::VecDeque;
use std::time::Instant;

use super::auditing::{self, Happened};
use super::backend::{fetch_queued, handshake_queued, BackendProcess, LineFrom};
use super::delivery::Delivery;
use super::exchanges::{Answer, Sender, Started};
use super::in_flight::{Entry, Expired, InFlight, Settlement};
use super::listen::upstream;
use super::mcp::{self, McpPost};
use super::modern::ModernPost;
use super::sessions::{Kind, Lane, SessionNumber, Sessions};
use super::spans;
use super::streams::Role;
use super::tasks::{Asked, Owner, Tasks};
use super::{Hub, Request, Response};
use crate::admission::{self, Arrival, Capacity, Refused, Verdict};
use crate::audit::Outcome;
use crate::http::{self, Endpoint, Rejection};
use crate::message;
use crate::message::Checked;
use crate::metrics::{DropReason, Metrics};
use crate::modern::ToolHeaders;
use crate::output::{Event, Frame, Output, RequestId, StreamId};
use crate::routed_id::{Mark, SessionId};
use crate::router::{Forward, Router, RESPONSE_ID_AT};
use crate::settings::{OnBackendExit, Settings};
use crate::sse;

/// A POST checked in full, ready to act on.
#[derive(Debug)]
pub(super) enum Prepared {
    /// A message for a legacy session.
    Legacy {
        session: SessionNumber,
        msg: Checked,
    },
    /// A Streamable POST.
    Mcp(McpPost),
    /// A 2026-07-28 request (SPEC section 13).
    Modern(ModernPost),
}

impl Prepared {
    /// SPEC section 1's checks of a legacy POST, in order.
    /// What a POST is, by its endpoint and era; a 2026-07-28 request the proxy answers
    /// itself (`server/discover`, a notification) is `Err` of its answer.
    fn of(
        req: Request,
        settings: &Settings,
        sessions: &Sessions,
        tools: &ToolHeaders,
    ) -> Result<Result<Prepared, Response>, Rejection> {
        Ok(Ok(match req.endpoint {
            Endpoint::McpPost if super::modern::is_modern(&req, settings) => {
                let tools = (tools, settings.tool_view.as_deref());
                match ModernPost::prepare(req, settings.instance.as_ref(), tools) {
                    Ok(post) => Prepared::Modern(post),
                    Err(Ok(answer)) => return Ok(Err(answer)),
                    Err(Err(rejection)) => return Err(rejection),
                }
            }
            Endpoint::McpPost => {
                let instance = settings.instance.as_ref();
                Prepared::Mcp(McpPost::prepare(req, sessions, instance)?)
            }
            _ => Prepared::legacy(req, sessions)?,
        }))
    }

    fn legacy(req: Request, sessions: &Sessions) -> Result<Prepared, Rejection> {
        if req.session.is_empty() {
            return Err(Rejection::MissingSessionId);
        }
        let (session, state) = sessions.authorize(&req.session, &req.principal)?;
        if !matches!(state.kind, Kind::Legacy { .. }) {
            return Err(Rejection::SessionNotFound);
        }
        let msg = req.body.message()?;
        // Once initialized, a legacy session stays as it was (its audited client too).
        if state.initialized && msg.is_request("initialize") {
            return Err(Rejection::AlreadyInitialized);
        }
        Ok(Prepared::Legacy { session, msg })
    }

    /// The message it carries.
    fn message(&self) -> &Checked {
        match self {
            Prepared::Legacy { msg, .. } => msg,
            Prepared::Mcp(post) => post.message(),
            Prepared::Modern(post) => post.message(),
        }
    }

    /// Its `tools/call` through the operator's tool view (SPEC section 16): a shown name
    /// rewritten to the backend's, before admission judges it by that name; any other
    /// name marked to be answered "Unknown tool" by the proxy.
    /// The backend's name, when it differs from the one called.
    fn show_tools(
        &mut self,
        settings: &Settings,
        backend: Option<&std::collections::BTreeSet<String>>,
    ) -> Option<String> {
        let view = settings.tool_view.as_ref()?;
        let msg = match self {
            Prepared::Legacy { msg, .. } => msg,
            Prepared::Mcp(post) => post.message_mut(),
            Prepared::Modern(post) => post.message_mut(),
        };
        match msg.shown_call(view, backend) {
            Ok(None) => None,
            Ok(Some(edited)) => {
                *msg = edited;
                msg.tool.clone()
            }
            Err(()) => {
                msg.unknown_tool = true;
                None
            }
        }
    }

    /// The id of the request it carries, as the client wrote it.
    fn request_id(&self) -> Option<&str> {
        let msg = self.message();
        msg.id.is_some().then(|| msg.raw_id())
    }

    /// The session it is for (`None`: one it starts).
    fn session(&self) -> Option<SessionNumber> {
        match self {
            Prepared::Legacy { session, .. } => Some(*session),
            Prepared::Mcp(post) => post.session(),
            Prepared::Modern(_) => None,
        }
    }
}

/// A POST with its answer's destination, waiting for the backend or about to be dispatched.
#[derive(Debug)]
pub(super) struct Post {
    pub(super) request: RequestId,
    prepared: Prepared,
    sender: Sender,
    deadline: Instant,
}

/// POSTs waiting for a restarted backend to be ready, in arrival order, within a count
/// (`Settings::stdin_queue`) and a byte budget (`--restart-buffer`) over their bodies.
#[derive(Debug, Default)]
pub(super) struct WaitingPosts {
    queue: VecDeque<Post>,
    /// Bytes of the messages waiting.
    bytes: usize,
}

impl Post {
    /// What it holds while it waits: its message's bytes.
    fn size(&self) -> usize {
        self.prepared.message().text().len()
    }
}

impl WaitingPosts {
    pub(super) fn pop(&mut self) -> Option<Post> {
        let post = self.queue.pop_front()?;
        self.bytes -= post.size();
        Some(post)
    }

    /// Whether `post` may wait behind the others: fewer than `--stdin-queue` wait, and its
    /// bytes fit within `--restart-buffer` with theirs.
    fn fits(&self, post: &Post, settings: &Settings) -> bool {
        self.queue.len() < settings.stdin_queue
            && self.bytes + post.size() <= settings.restart_buffer
    }

    fn push(&mut self, post: Post) {
        self.bytes += post.size();
        self.queue.push_back(post);
    }

    pub(super) fn take_all(&mut self) -> VecDeque<Post> {
        self.bytes = 0;
        std::mem::take(&mut self.queue)
    }

    /// The oldest waiting POST, if its wait ran out at `now`.
    pub(super) fn take_due(&mut self, now: Instant) -> Option<Post> {
        let due = self.queue.front().is_some_and(|p| p.deadline <= now);
        due.then(|| self.pop())?
    }

    /// The POST of `request`, which stops waiting (its client left).
    fn remove(&mut self, request: RequestId) -> Option<Post> {
        let at = self.queue.iter().position(|p| p.request == request)?;
        let post = self.queue.remove(at)?;
        self.bytes -= post.size();
        Some(post)
    }

    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.queue.front().map(|p| p.deadline)
    }
}

impl Hub {
    /// `GET /sse`: a new legacy session, bound to its principal before its stream sends
    /// anything; its first event names the POST URL.
    pub(super) fn open_legacy(
        &mut self,
        now: Instant,
        request: RequestId,
        req: Request,
    ) -> Result<(), Rejection> {
        let arrival = Arrival::without_message(&req.principal, &req.grant);
        if self.admit(now, request, arrival, None).is_none() {
            return Ok(());
        }
        let parts = (&self.backend, &self.sessions);
        let per_principal = self.settings.max_sessions_per_principal;
        let opening = mcp::opening(now, &req.principal, parts, per_principal);
        if let Err(refused) = admission::room(&Capacity::opening(opening)) {
            self.respond(now, request, refused.refusal(None, None).into());
            return Ok(());
        }
        let sid = SessionId::mint(self.settings.instance.as_ref(), req.entropy);
        let stream = StreamId(self.mint());
        let kind = Kind::Legacy { stream };
        let source = req.source.clone();
        let number = (self.sessions).open(sid, req.principal.clone(), kind, source)?;
        // The stream is its answer: no refusal event is due.
        let _ = self.exchanges.take_started(request);
        self.session_opened(now, number);
        let head = http::sse_head();
        self.start_stream(now, request, (stream, head), number, Role::Legacy);
        let url = format!(
            "{}/messages?session_id={sid}",
            self.settings.endpoint_prefix
        );
        self.streams.send(
            now,
            (stream, Frame::Owned(sse::endpoint_event(&url))),
            &mut self.outputs,
        );
        self.outputs.push_back(Output::Log(Event::SessionOpened {
            session: sid,
            principal: req.principal,
        }));
        Ok(())
    }

    /// A session of either transport opened: counted and observed.
    pub(super) fn session_opened(&mut self, now: Instant, number: SessionNumber) {
        self.metrics.sessions_opened += 1;
        self.observe(now, Happened::Opened(number));
    }

    /// Admission on arrival (SPEC sections 9 and 10): `Some(denied)` for a request that
    /// goes ahead; one refused is answered here (under `id`, when it has one).
    pub(super) fn admit(
        &mut self,
        now: Instant,
        request: RequestId,
        arrival: Arrival<'_>,
        id: Option<&str>,
    ) -> Option<bool> {
        // SPEC 16: a call of a tool not shown is answered before any admission.
        if arrival.msg.is_some_and(|m| m.unknown_tool) {
            return Some(false);
        }
        // The 2026-07-28 revision forbids undefined codes in -32020..-32099 (SPEC 13).
        let modern = arrival.msg.is_some_and(|m| m.modern.is_some());
        let (settings, decisions) = (&self.settings, &mut self.decisions);
        let denies = |msg: &Checked| {
            let sender = (arrival.principal, arrival.grant);
            decisions.denies(settings.policy.as_ref(), sender, msg)
        };
        match admission::admit(now, settings, &mut self.buckets, arrival, denies) {
            Verdict::Admit { denied } => Some(denied),
            Verdict::Refuse(refused) => {
                if refused == Refused::Denied {
                    self.metrics.policy_denied += 1;
                }
                let refusal = match modern {
                    true => refused.modern_refusal(id),
                    false => refused.refusal(id, None),
                };
                self.respond(now, request, refusal.into());
                None
            }
        }
    }

    /// A POST to `/messages` or `/mcp`, checked in full now. It goes ahead at once when the
    /// backend is ready; while a restarted one is not, it waits (a bounded queue).
    pub(super) fn post(
        &mut self,
        now: Instant,
        request: RequestId,
        req: Request,
    ) -> Result<(), Rejection> {
        let (grant, principal) = (req.grant.clone(), req.principal.clone());
        let modern_tools = &self.modern.tools;
        let mut prepared = match Prepared::of(req, &self.settings, &self.sessions, modern_tools)? {
            Ok(prepared) => prepared,
            Err(answer) => {
                self.respond(now, request, Answer::Served(answer));
                return Ok(());
            }
        };
        let parts = (&mut self.exchanges, &self.settings);
        auditing::described(parts, request, prepared.message());
        super::dispatch::read_unread_tools(super::dispatch::reader!(self), now);
        if let Some(tool) = prepared.show_tools(&self.settings, self.backend_tools.known()) {
            self.exchanges.called_as(request, tool);
        }
        let arrival = Arrival {
            principal: &principal,
            grant: &grant,
            msg: Some(prepared.message()),
        };
        let Some(forbidden) = self.admit(now, request, arrival, prepared.request_id()) else {
            return Ok(());
        };
        let post = Post {
            request,
            prepared,
            sender: Sender {
                grant,
                forbidden,
                started: None,
            },
            deadline: now + self.settings.restart_wait,
        };
        let parts = (&self.settings, &self.backend, &self.router);
        let (waits, unshaken) = readiness(parts, &post.prepared);
        // A handshake the queue has no room for: refused as a full queue refuses a request.
        if unshaken && self.router.is_idle() && !handshake_queued(upstream!(self), now) {
            return Err(Rejection::BackendBusy);
        }
        // Client lines may go to the backend: it runs and owes no handshake.
        if self.backend.is_up() && self.router.is_ready() && !unshaken {
            self.dispatch_post(now, post);
        } else if (waits || unshaken) && self.posts.fits(&post, &self.settings) {
            self.posts.push(post);
        } else {
            return Err(Rejection::BackendDown);
        }
        Ok(())
    }

    /// The backend is ready (again): the POSTs that waited go ahead, in order.
    pub(super) fn release_waiting(&mut self, now: Instant) {
        while self.backend.is_up() && self.router.is_ready() {
            let Some(post) = self.posts.pop() else {
                break;
            };
            self.dispatch_post(now, post);
        }
    }

    /// The client of `request` went away before its answer (the shell saw its connection
    /// close). A request still waiting for a restarting backend stops waiting: it is never
    /// forwarded nor answered, its room is free again, and it is counted
    /// (`client_left`; audited as an `error`). Any other request goes on as usual.
    pub fn handle_client_left(&mut self, now: Instant, request: RequestId) {
        let Some(post) = self.posts.remove(request) else {
            if let Some(key) = self.modern.of_exchange(request) {
                self.modern_client_left(now, key);
            }
            return;
        };
        let exchange = self.exchanges.close(request);
        if let Some(started) = exchange.and_then(|e| e.started) {
            let entry = Entry::unforwarded(started, now);
            self.settle(now, (None, entry), Settlement::Gone);
        }
        let method = post.prepared.message().method.clone();
        self.drop_message(DropReason::ClientLeft, Some(&method));
    }

    /// Acts on a checked POST now that the backend is ready, if its session is within its
    /// share of the stdin queue (else 503 at once). Its session may have ended while it
    /// waited (404).
    pub(super) fn dispatch_post(&mut self, now: Instant, post: Post) {
        let Post {
            request,
            prepared,
            sender,
            ..
        } = post;
        let lane = match &prepared {
            Prepared::Modern(post) => post.lane(&self.modern),
            other => other.session().map(Lane::from),
        };
        let within_share = self.backend.fits(lane);
        if let Err(refused) = admission::room(&Capacity::share(within_share)) {
            return self.respond(now, request, refused.refusal(None, None).into());
        }
        let (session, msg, mut sender) = match prepared {
            Prepared::Legacy { session, msg } => (session, msg, sender),
            Prepared::Mcp(mcp) => {
                if let Err(rejection) = self.mcp_post(now, request, mcp, sender) {
                    self.respond(now, request, Answer::Rejected(rejection));
                }
                return;
            }
            Prepared::Modern(post) => return super::modern::post(self, now, request, post, sender),
        };
        let Some(sid) = self.sessions.get(session).map(|s| s.id) else {
            return self.respond(now, request, Answer::Rejected(Rejection::SessionNotFound));
        };
        sender.started = self.exchanges.take_started(request);
        self.client_message(now, (session, sid), &msg, sender);
        if let Some(cancels) = &msg.cancels {
            self.cancelled_by_client(now, session, &cancels.key);
        }
        self.respond(now, request, Answer::Served(http::accepted()));
    }

    /// What an admitted message of session `number` does: a request the policy denies is
    /// answered -32003; subscriptions are recorded, then the router's decision is carried
    /// out. The proxy's own answer is delivered as the backend's would be.
    pub(super) fn client_message(
        &mut self,
        now: Instant,
        (number, sid): (SessionNumber, SessionId),
        msg: &Checked,
        mut sender: Sender,
    ) {
        self.metrics.client_messages += 1;
        auditing::introduced((&mut self.sessions, &self.settings), number, msg);
        let parts = (&self.sessions, &mut self.in_flight, &self.settings);
        for (at, entry) in track_legacy(parts, now, number, msg, &mut sender.started) {
            self.settle(at, (Some(number.into()), entry), Settlement::Gone);
        }
        let parts = (&mut self.tasks, &mut self.sessions, &self.listeners);
        let (answer, outcome) = match own_answer(
            parts,
            &self.settings,
            now,
            number,
            msg,
            (sender.forbidden, &sender.grant),
        ) {
            Own::Answer(answer, outcome, counted) => {
                counted.record((&mut self.metrics, &mut self.outputs), &msg.method);
                (answer, outcome)
            }
            Own::Dropped(reason) => return self.drop_message(reason, Some(&msg.method)),
            Own::Forward(rewritten, mark) => {
                let msg = rewritten.as_deref().unwrap_or(msg);
                let mark = marked(&mut self.in_flight, number, msg, mark);
                let from = client_line(number, sid, msg);
                let hop = (&mut self.router, &mut self.in_flight, self.settings.tracing);
                match spans::forward(hop, (sid, number.into(), now), msg, mark) {
                    Forward::Line(line) => return self.queue_line(now, line, from),
                    Forward::Answer(answer) => {
                        let outcome = Outcome::of_answer(&answer);
                        if outcome == Outcome::Success && msg.is_request("initialize") {
                            self.sessions.initialized(&sid);
                        }
                        (answer, outcome)
                    }
                    Forward::Cached(answer) => return self.dispatch(now, *answer),
                    Forward::Fetch(f) => return fetch_queued(upstream!(self), now, f, from),
                    Forward::Waiting | Forward::Absorbed => return,
                }
            }
        };
        let id = RESPONSE_ID_AT..RESPONSE_ID_AT + msg.raw_id().len();
        let what = Delivery::Response {
            id,
            key: msg.id.as_ref().map(|id| id.key.clone()),
            outcome: Some(outcome),
            result: None,
        };
        self.deliver(now, sid, answer, what);
    }
}

/// Whether a POST that finds the backend not ready waits for it (sessions are kept across
/// restarts and one is coming), and whether it needs the proxy's own handshake first (a
/// 2026-07-28 request, and no 2025 client initialized the backend: it waits for that
/// like a restart).
fn readiness(
    (settings, backend, router): (&Settings, &BackendProcess, &Router),
    prepared: &Prepared,
) -> (bool, bool) {
    let waits = settings.on_backend_exit == OnBackendExit::KeepSessions && backend.coming();
    let unshaken = matches!(prepared, Prepared::Modern(m) if m.needs_handshake())
        && backend.is_up()
        && router.handshake_result().is_none();
    (waits, unshaken)
}

/// A legacy request is tracked before anything answers it (routing never needs it), to
/// answer it should the backend restart first and to observe its outcome: it takes the
/// request's observation context from `started`. Returns the requests the table awaits no
/// longer, to observe as unanswered.
fn track_legacy(
    (sessions, in_flight, settings): (&Sessions, &mut InFlight, &Settings),
    now: Instant,
    number: SessionNumber,
    msg: &Checked,
    started: &mut Option<Box<Started>>,
) -> Expired {
    let legacy = matches!(sessions.get(number), Some(s) if matches!(s.kind, Kind::Legacy { .. }));
    let (true, Some(id), message::Kind::Request) = (legacy, &msg.id, msg.kind) else {
        return Expired::new();
    };
    let entry = Entry::legacy(msg.raw_id().to_owned(), now, started.take());
    let limits = (settings.max_inflight, settings.request_timeout);
    in_flight.track(now, (number, id.key.clone()), entry, limits)
}

/// The mark `msg` of session `number` is routed with: a request's is kept in its record
/// (the proxy's own cancellation of it names the same routed id); a cancellation takes the
/// mark of the request it cancels, as that request's record has it.
fn marked(in_flight: &mut InFlight, number: SessionNumber, msg: &Checked, mark: Mark) -> Mark {
    if let Some(id) = &msg.id {
        if let Some(entry) = in_flight.get_mut(number, &id.key) {
            entry.mark = mark;
        }
        return mark;
    }
    let cancelled = msg
        .cancels
        .as_ref()
        .and_then(|c| in_flight.get(number, &c.key));
    cancelled.map_or(mark, |entry| entry.mark)
}

/// What the proxy does with a message of a 2025 session before the router.
enum Own {
    /// It answers with this, the outcome, and how it is counted.
    Answer(Vec<u8>, Outcome, Count),
    /// A client notification not passed (or naming a task not its own): dropped, counted
    /// by the reason.
    Dropped(DropReason),
    /// The message (or what replaces it) goes to the router with this mark.
    Forward(Option<Box<Checked>>, Mark),
}

/// How the proxy's own answer is counted.
enum Count {
    /// As a drop (answered by the proxy) for this reason and the method.
    Drop(DropReason),
    /// As the policy's denial.
    Policy,
    /// As a refusal of this reason (`switchboard_rejections_total`).
    Rejected(&'static str),
    /// Not at all (a subscription the proxy answers).
    Nothing,
}

impl Count {
    /// Counts the proxy's answer to a request of `method`.
    fn record(self, (metrics, outputs): (&mut Metrics, &mut VecDeque<Output>), method: &str) {
        match self {
            Count::Drop(reason) => super::dropped((metrics, outputs), reason, Some(method)),
            Count::Policy => metrics.policy_denied += 1,
            Count::Rejected(why) => *metrics.rejections.entry(why).or_default() += 1,
            Count::Nothing => {}
        }
    }
}

/// The proxy's own answer to `msg` of session `number`, in SPEC's order: a tool not shown
/// (section 16, before every admission), the policy's
/// -32003, then what the tasks and unknown methods rules answer (section 15), then a
/// subscription's; else the message is forwarded, a filtered list's grant left with its
/// session.
fn own_answer(
    (tasks, sessions, listeners): (&mut Tasks, &mut Sessions, &super::listen::Listeners),
    settings: &Settings,
    now: Instant,
    number: SessionNumber,
    msg: &Checked,
    (forbidden, grant): (bool, &crate::http::Grant),
) -> Own {
    // A notification is never answered: one naming a tool not shown goes nowhere.
    if msg.unknown_tool && msg.kind == message::Kind::Notification {
        return Own::Dropped(DropReason::ClientNotification);
    }
    if msg.unknown_tool {
        let answer = crate::tools::unknown_tool(msg);
        return Own::Answer(answer, Outcome::Denied, Count::Rejected("unknown_tool"));
    }
    if forbidden {
        let answer = msg.error(-32003, "forbidden by policy");
        return Own::Answer(answer, Outcome::Denied, Count::Policy);
    }
    let Some(session) = sessions.get(number) else {
        return Own::Dropped(DropReason::ClientNotification);
    };
    let owner = Owner::Session(session.id);
    let (rewritten, mark) = match tasks.ask(now, &owner, msg, &settings.pass_methods) {
        Asked::Answer(answer, reason) => {
            let outcome = match Asked::refuses(reason) {
                true => Outcome::Denied,
                false => Outcome::Success,
            };
            return Own::Answer(answer, outcome, Count::Drop(reason));
        }
        Asked::Dropped(reason) => return Own::Dropped(reason),
        Asked::Rewritten(checked) => (Some(checked), Mark::Tasks),
        Asked::Forward(mark) => (None, mark),
    };
    if let Some((answer, outcome)) = subscription((sessions, listeners), number, msg) {
        return Own::Answer(answer, outcome, Count::Nothing);
    }
    // A list filtered for its caller (the policy, scopes or the operator's tools): the
    // session keeps the grant its result is filtered by.
    if super::authz::filters(settings, msg)
        || crate::tools::shows_list(settings.tool_view.as_deref(), msg)
    {
        if let Some(session) = sessions.get_mut(number) {
            session.grant = grant.clone();
        }
        return Own::Forward(rewritten, Mark::Filtered);
    }
    Own::Forward(rewritten, mark)
}

/// The proxy's own answer to a subscription request of session `number`, if it has one: a
/// `resources/subscribe` over the cap is refused; a `resources/unsubscribe` of a uri this
/// session does not hold, or that others (a session or a listen stream) still watch, is
/// answered `{}` (only this session leaves; the backend keeps it), so only the last
/// holder's reaches the backend.
fn subscription(
    (sessions, listeners): (&mut Sessions, &super::listen::Listeners),
    number: SessionNumber,
    msg: &Checked,
) -> Option<(Vec<u8>, Outcome)> {
    if msg.kind != message::Kind::Request {
        return None;
    }
    match (msg.method.as_str(), &msg.uri) {
        ("resources/subscribe", Some(uri)) if sessions.subscribe(number, uri).is_err() => {
            Some((msg.error(-32603, "Too many subscriptions"), Outcome::Error))
        }
        ("resources/unsubscribe", Some(uri))
            if sessions.unsubscribe(number, uri) || listeners.holds(uri) =>
        {
            Some((msg.result("{}"), Outcome::Success))
        }
        _ => None,
    }
}

/// How a client line of session `number` (routed under `sid`) is queued: a request (not
/// the handshake, which goes under the proxy's own id) takes a place in the backend window;
/// the last holder's unsubscribe of a uri goes in the proxy's own order, within its
/// session's share ([`LineFrom::Unsubscribe`]).
pub(super) fn client_line(number: SessionNumber, sid: SessionId, msg: &Checked) -> LineFrom {
    if msg.is_request("resources/unsubscribe") && msg.uri.is_some() {
        return LineFrom::Unsubscribe(number.into());
    }
    match (&msg.id, msg.kind) {
        (Some(id), message::Kind::Request) if msg.method != "initialize" => {
            LineFrom::Request(number.into(), (sid, id.key.clone()))
        }
        _ => LineFrom::Client(number.into()),
    }
}
