//! MCP 2026-07-28 requests on `/mcp` (SPEC section 13): a kind of exchange of its own
//! beside the two 2025 transports. A modern request never enters the session table: it
//! is routed under a key minted for it alone, so its answer, and its cancellation when its
//! client hangs up, belong to its POST.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::time::{Duration, Instant};

use super::backend::{fetch_queued, LineFrom};
use super::delivery::Delivery;
use super::exchanges::{Answer, Sender};
use super::in_flight::{Caller, Entry, InFlight, RequestKey, Settlement, Waiting};
use super::listen::upstream;
use super::sessions::Lane;
use super::streams::Streams;
use super::tasks::{Asked, Owner, Tasks};
use super::{Body, Hub, Request};
use crate::admission::Refused;
use crate::audit::Outcome;
use crate::auth::Principal;
use crate::http::{Grant, Rejection, Response};
use crate::message::{self, Checked, IdKey};
use crate::metrics::{DropReason, Metrics};
use crate::modern::{self, ToolHeaders};
use crate::output::Output;
use crate::output::{Frame, RequestId, StreamId};
use crate::routed_id::{Instance, Mark};
use crate::router::{Forward, Router};
use crate::settings::{Modern, Settings};
use crate::streamable::{self, Accepts};

/// Principals whose lanes are kept while they have no request in flight.
const MAX_LANES: usize = 1024;

/// A modern `POST /mcp` checked in full.
#[derive(Debug)]
pub(super) struct ModernPost {
    /// Its routing key: the routed id `<key>|n:<id>` names this request and no other.
    key: RequestKey,
    principal: Principal,
    msg: Checked,
    accepts: Accepts,
}

impl ModernPost {
    /// Its turn in the stdin queue's fair share (`None`: its principal's first in flight).
    pub(super) fn lane(&self, modern: &ModernRequests) -> Option<Lane> {
        modern.lane(&self.principal)
    }

    /// Whether it needs the backend initialized first: every request but
    /// `server/discover` (which is the proxy's handshake when none was made).
    pub(super) fn needs_handshake(&self) -> bool {
        self.msg.kind == message::Kind::Request && self.msg.method != "server/discover"
    }

    /// The message it carries.
    pub(super) fn message(&self) -> &Checked {
        &self.msg
    }

    /// The message it carries, to show the operator's tools (SPEC section 16).
    pub(super) fn message_mut(&mut self) -> &mut Checked {
        &mut self.msg
    }

    /// SPEC section 7's header checks, then section 13's in order; a section 13 refusal
    /// is the answer itself (`Err(Ok(response))`).
    pub(super) fn prepare(
        req: Request,
        instance: Option<&Instance>,
        tools: (&ToolHeaders, Option<&crate::tools::ToolView>),
    ) -> Result<ModernPost, Result<Response, Rejection>> {
        if matches!(req.body, Body::TooLarge) {
            return Err(Err(Rejection::BodyTooLarge));
        }
        if !streamable::is_json(req.mcp.content_type.as_deref()) {
            return Err(Err(Rejection::UnsupportedMediaType));
        }
        let accepts = Accepts::parse(req.mcp.accept.as_deref());
        if !accepts.json && !accepts.event_stream {
            return Err(Err(Rejection::NotAcceptable));
        }
        let msg = req.body.message().map_err(Err)?;
        if msg.kind == message::Kind::Request {
            modern::check(&msg, &req.mcp, tools).map_err(|r| Ok(r.response(msg.raw_id())))?;
        }
        Ok(ModernPost {
            key: RequestKey::mint(instance, req.entropy),
            principal: req.principal,
            msg,
            accepts,
        })
    }
}

/// The modern requests in flight, by routing key, and what the backend's last
/// `tools/list` said about headers.
#[derive(Debug, Default)]
pub(crate) struct ModernRequests {
    waiting: BTreeMap<RequestKey, Waiting>,
    by_exchange: BTreeMap<RequestId, RequestKey>,
    per_principal: BTreeMap<Principal, usize>,
    /// Each principal's turn in the stdin queue's fair share: its modern requests share
    /// one, as a session's requests do. Kept after its last request is answered (the
    /// shell reports written lines in batches, so the lane may still count a few), so that
    /// a principal's bursts never count as several sharers; idle lanes go past
    /// [`MAX_LANES`].
    lanes: BTreeMap<Principal, Lane>,
    /// The `Mcp-Param-*` annotations of the backend's tools, from its own lists.
    pub(crate) tools: ToolHeaders,
    /// The backend's `serverInfo`, read once from the `initialize` result it came from
    /// (every answer carries it).
    server_info: Option<(String, Option<String>)>,
}

impl ModernRequests {
    /// The backend answered the modern request under `key` with `message` (its result at
    /// `result` when the router found it), as the backend wrote it: a page of its tool list
    /// teaches the tools' headers.
    pub(super) fn learn_tools(
        &mut self,
        key: &RequestKey,
        (message, result): (&[u8], Option<Range<usize>>),
    ) {
        if self
            .waiting
            .get(key)
            .is_none_or(|w| w.method != "tools/list")
        {
            return;
        }
        let result = match result {
            Some(at) => std::str::from_utf8(&message[at]).ok(),
            None => crate::message::parse_backend_result(message),
        };
        self.tools.learn(result);
    }

    fn insert(&mut self, key: RequestKey, waiting: Waiting, lane: Lane) {
        *self
            .per_principal
            .entry(waiting.principal.clone())
            .or_default() += 1;
        if self.lanes.len() >= MAX_LANES {
            let busy = &self.per_principal;
            self.lanes
                .retain(|principal, _| busy.contains_key(principal));
        }
        self.lanes.entry(waiting.principal.clone()).or_insert(lane);
        self.by_exchange.insert(waiting.exchange, key);
        self.waiting.insert(key, waiting);
    }

    pub(super) fn remove(&mut self, key: &RequestKey) -> Option<Waiting> {
        let waiting = self.waiting.remove(key)?;
        self.by_exchange.remove(&waiting.exchange);
        if let Some(count) = self.per_principal.get_mut(&waiting.principal) {
            *count -= 1;
            if *count == 0 {
                self.per_principal.remove(&waiting.principal);
            }
        }
        Some(waiting)
    }

    /// The turn in the stdin queue of `principal`'s modern requests (`None`: one it starts).
    pub(crate) fn lane(&self, principal: &Principal) -> Option<Lane> {
        self.lanes.get(principal).copied()
    }

    /// Who sent the modern request routed under `key`, for filtering its list result.
    pub(crate) fn caller(&self, key: &RequestKey) -> Option<(&Principal, &Grant)> {
        let waiting = self.waiting.get(key)?;
        Some((&waiting.principal, &waiting.grant))
    }

    /// The routing key of the modern request `exchange` waits for.
    pub(crate) fn of_exchange(&self, exchange: RequestId) -> Option<RequestKey> {
        self.by_exchange.get(&exchange).copied()
    }
}

/// An admitted modern POST acts: a notification is absorbed (202), `server/discover`
/// is answered by the proxy, any other request is forwarded under its own key.
pub(super) fn post(
    hub: &mut Hub,
    now: Instant,
    request: RequestId,
    post: ModernPost,
    sender: Sender,
) {
    let ModernPost {
        key,
        principal,
        msg,
        accepts,
    } = post;
    let Some(id) = msg
        .id
        .clone()
        .filter(|_| msg.kind == message::Kind::Request)
    else {
        // Accepted: a notification produces no event.
        let _ = hub.exchanges.take_started(request);
        let response = streamable::notification_accepted();
        return hub.respond(now, request, Answer::Served(response));
    };
    if msg.method == "subscriptions/listen" {
        return super::listen::open(hub, now, request, principal, sender.grant, msg);
    }
    let parts = (&hub.settings, &hub.router, &mut hub.tasks, &hub.modern);
    let counters = (&mut hub.metrics, &mut hub.outputs);
    let msg = match answered_here(parts, counters, now, (&principal, sender.forbidden), msg) {
        Ok(msg) => msg,
        Err(answer) => return hub.respond(now, request, answer),
    };
    let waiting = Waiting {
        method: msg.method.clone(),
        filtered: super::authz::filters(&hub.settings, &msg),
        principal,
        grant: sender.grant,
        exchange: request,
        // As SPEC section 7: a stream when the client asks for progress or takes no JSON.
        stream: (accepts.event_stream && (msg.token.is_some() || !accepts.json))
            .then(|| StreamId(hub.mint())),
    };
    forward(hub, now, (key, id.key), msg, waiting);
}

/// Modern request `msg`, awaited under `key` with its id, goes to the backend (a
/// `server/discover` as the proxy's own handshake).
fn forward(
    hub: &mut Hub,
    now: Instant,
    (key, id): (RequestKey, IdKey),
    msg: Checked,
    waiting: Waiting,
) {
    let request = waiting.exchange;
    let shown = crate::tools::shows_list(hub.settings.tool_view.as_deref(), &msg);
    let mark = match (waiting.filtered || shown, msg.method.as_str()) {
        (true, _) => Mark::Filtered,
        (false, "tasks/list") => Mark::Tasks,
        (false, _) => Mark::Plain,
    };
    // Accepted: its observation goes with it (taken before a stream answers the exchange),
    // ended when it is answered.
    let audit = hub.exchanges.take_started(request);
    if let Some(stream) = waiting.stream {
        let head = Answer::Stream(stream, crate::http::sse_head());
        hub.respond(now, request, head);
        hub.streams.open_modern(now, stream, key);
    }
    let mut entry = Entry::awaited(&msg, (now, request), None, (audit, None));
    entry.mark = mark;
    let deadline = hub.settings.request_timeout.map(|timeout| now + timeout);
    (hub.in_flight).insert(Caller::Modern(key), id.clone(), entry, deadline);
    let lane = (hub.modern.lane(&waiting.principal)).unwrap_or_else(|| hub.sessions.lane());
    hub.modern.insert(key, waiting, lane);
    let outbound = match msg.method.as_str() {
        "server/discover" => handshake(&msg),
        _ => msg,
    };
    let hop = (&mut hub.router, &mut hub.in_flight, hub.settings.tracing);
    let route = *key.route();
    let from = match outbound.method.as_str() {
        "initialize" => LineFrom::Client(lane),
        _ => LineFrom::Request(lane, (route, id.clone())),
    };
    match super::spans::forward(hop, (route, Caller::Modern(key), now), &outbound, mark) {
        Forward::Line(line) => hub.queue_line(now, line, from),
        Forward::Answer(answer) => {
            let at = crate::router::RESPONSE_ID_AT;
            let (key, id) = (Some(id), at..at + outbound.raw_id().len());
            let what = Delivery::Response {
                id,
                key,
                outcome: None,
                result: None,
            };
            hub.deliver(now, route, answer, what);
        }
        Forward::Cached(answer) => hub.dispatch(now, *answer),
        Forward::Fetch(fetch) => fetch_queued(upstream!(hub), now, fetch, from),
        Forward::Waiting | Forward::Absorbed => {}
    }
}

/// What the proxy answers a modern request itself, in SPEC's order: a tool not shown
/// (section 16, before any admission), the policy's -32003 and 429 past `--max-inflight` of
/// its principal (section 13), `server/discover` from the cached handshake, a task the
/// principal does not own and a method MCP does not define (section 15). `Err` of its
/// answer, else the message to forward (a task list's cursor mapped back).
fn answered_here(
    (settings, router, tasks, modern): (&Settings, &Router, &mut Tasks, &ModernRequests),
    (metrics, outputs): (&mut Metrics, &mut VecDeque<Output>),
    now: Instant,
    (principal, forbidden): (&Principal, bool),
    msg: Checked,
) -> Result<Checked, Answer> {
    if forbidden {
        metrics.policy_denied += 1;
    }
    if msg.unknown_tool {
        *metrics.rejections.entry("unknown_tool").or_default() += 1;
        let answer = Response::json(400, crate::tools::unknown_tool(&msg));
        return Err(Answer::Denied(answer));
    }
    let held = modern
        .per_principal
        .get(principal)
        .copied()
        .unwrap_or_default();
    let refused = match forbidden {
        true => Some(Refused::Forbidden),
        false => (held >= settings.max_inflight).then_some(Refused::PrincipalInFlight),
    };
    if let Some(refused) = refused {
        return Err(refused.modern_refusal(Some(msg.raw_id())).into());
    }
    // `server/discover` from the cached handshake (else it is the proxy's own, forwarded).
    if let Some(result) = (router.initialize_result()).filter(|_| msg.method == "server/discover") {
        let answer = streamable::json_answer(msg.result(&modern::discover(result)));
        return Err(Answer::Served(answer));
    }
    let owner = Owner::Principal(principal.clone());
    match tasks.ask(now, &owner, &msg, &settings.pass_methods) {
        Asked::Forward(_) | Asked::Dropped(_) => Ok(msg),
        Asked::Rewritten(checked) => Ok(*checked),
        Asked::Answer(answer, reason) => {
            super::dropped((metrics, outputs), reason, Some(&msg.method));
            let status = if reason == DropReason::UnknownMethod {
                404
            } else {
                400
            };
            Err(Answer::Denied(Response::json(status, answer)))
        }
    }
}

impl ModernRequests {
    /// The answer to the modern request under `key` from the backend's `message` (its id
    /// the client's, `raw_id`), as section 13 completes it, and its HTTP status; `None`
    /// when no modern request waits under `key`. The `initialize` result `init` gives the
    /// server's info.
    fn completed(
        &mut self,
        key: &RequestKey,
        raw_id: &str,
        (message, result): (&[u8], Option<Range<usize>>),
        init: Option<&str>,
    ) -> Option<(Vec<u8>, u16)> {
        let waiting = self.waiting.get(key)?;
        Some(match waiting.method.as_str() {
            "server/discover" => discovered(raw_id, message),
            method => {
                let info = server_info(&mut self.server_info, init);
                modern::complete(method, (message, result), waiting.filtered, info)
            }
        })
    }
}

/// The backend's answer `message` (its `result` where the router found it, its id's key
/// `id`, `outcome` the router's verdict) to the modern request under `key`: its record,
/// taken, and its settlement (the answer as section 13 completes it, with its status).
/// `None` when no modern request waits under `key` with that id.
pub(super) fn answered(
    (modern, in_flight): (&mut ModernRequests, &mut InFlight),
    init: Option<&str>,
    key: RequestKey,
    (message, result): (&[u8], Option<Range<usize>>),
    (id, outcome): (Option<IdKey>, Option<Outcome>),
) -> Option<((Option<Caller>, Entry), Settlement)> {
    let caller = Caller::Modern(key);
    let entry = in_flight.take(caller, &id?)?;
    let (message, status) = modern.completed(&key, &entry.raw_id, (message, result), init)?;
    let settlement = Settlement::Answered {
        message,
        outcome,
        status,
    };
    Some(((Some(caller), entry), settlement))
}

/// Progress for the modern request under `key` (its token at `token` in `message`): to its
/// stream, whose request's timeout restarts, else dropped. False when no modern request
/// waits under `key`.
pub(super) fn progress(
    (modern, in_flight, streams): (&ModernRequests, &mut InFlight, &mut Streams),
    (metrics, outputs): (&mut Metrics, &mut VecDeque<Output>),
    (now, timeout): (Instant, Option<Duration>),
    key: RequestKey,
    (message, token): (&[u8], Range<usize>),
) -> bool {
    let Some(stream) = modern.waiting.get(&key).map(|w| w.stream) else {
        return false;
    };
    let token = std::str::from_utf8(&message[token])
        .ok()
        .and_then(IdKey::of);
    let carried = token.and_then(|t| in_flight.progress(now, Caller::Modern(key), &t, timeout));
    match stream.filter(|_| carried.is_some()) {
        Some(stream) => {
            let frame = Frame::Owned(crate::sse::message_event(message));
            streams.send(now, (stream, frame), outputs);
        }
        None => {
            let method = Some("notifications/progress");
            super::dropped((metrics, outputs), DropReason::NoStream, method);
        }
    }
    true
}

/// Whether SPEC section 13 serves this `POST /mcp` (the era was read where the body was
/// admitted): not under `--modern off`.
pub(super) fn is_modern(req: &Request, settings: &Settings) -> bool {
    if settings.modern == Modern::Off {
        return false;
    }
    match &req.body {
        Body::Message(msg) => msg.modern.is_some(),
        _ => req.mcp.protocol_version.as_deref().map(str::trim) == Some(modern::VERSION),
    }
}

/// The proxy's own `initialize` for a `server/discover` that finds no cached handshake
/// (SPEC section 13: 2025-11-25, capabilities `{}`, client info `switchboard`), under
/// the discover's id.
fn handshake(discover: &Checked) -> Checked {
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"switchboard","version":"{}"}}}}}}"#,
        discover.raw_id(),
        env!("CARGO_PKG_VERSION")
    );
    // Built from an id that was admitted: it admits.
    Checked::admit(line.into_bytes()).expect("a well-formed initialize")
}

/// `server/discover`'s answer from the backend's answer to the handshake.
fn discovered(raw_id: &str, message: &[u8]) -> (Vec<u8>, u16) {
    match crate::message::parse_backend_result(message) {
        Some(result) => (
            crate::router::response_line(raw_id, "result", &modern::discover(result)),
            200,
        ),
        None => modern::complete("server/discover", (message, None), false, None),
    }
}

/// The backend's `serverInfo` in `initialize` result `init`, read again only when the
/// result changed (a restarted backend).
fn server_info<'a>(
    read: &'a mut Option<(String, Option<String>)>,
    init: Option<&str>,
) -> Option<&'a str> {
    let init = init?;
    if read.as_ref().is_none_or(|(from, _)| from != init) {
        *read = Some((init.to_owned(), modern::server_info(init)));
    }
    read.as_ref()?.1.as_deref()
}
