//! `subscriptions/listen` (SPEC section 13): a 2026-07-28 client's stream of exactly the
//! notifications it asked for, in place of a session's GET stream. A listen stream is no
//! session and carries nobody's traffic (no response but its last, no progress); it takes
//! a session's room under `--max-sessions`, and its resource subscriptions are shared with
//! the sessions': the backend is unsubscribed only when the last holder of a uri leaves.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::backend::{queued, LineFrom, Upstream};
use super::deadlines::Deadlines;
use super::exchanges::Answer;
use super::in_flight::{Entry, Settlement};
use super::sessions::{Sessions, MAX_SUBSCRIPTIONS_PER_SESSION};
use super::Hub;
use crate::admission::{self, Capacity};
use crate::audit::Outcome;
use crate::auth::Principal;
use crate::http::{self, Grant};
use crate::message::Checked;
use crate::output::{Frame, Output, RequestId, StreamId};
use crate::router::MAX_PENDING_SUBSCRIBES;
use crate::sse;

/// The `_meta` key that names the listen every frame of its stream belongs to.
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// `resourceSubscriptions` one listen may ask for (SPEC section 13); more: 400, -32602.
pub(crate) const MAX_LISTEN_URIS: usize = 256;

/// Each list_changed kind: its key in the listen filter, the capability that declares it,
/// its method.
const LIST_KINDS: [(&str, &str, &str); 3] = [
    (
        "toolsListChanged",
        "tools",
        "notifications/tools/list_changed",
    ),
    (
        "promptsListChanged",
        "prompts",
        "notifications/prompts/list_changed",
    ),
    (
        "resourcesListChanged",
        "resources",
        "notifications/resources/list_changed",
    ),
];

/// One open listen stream.
#[derive(Debug)]
struct Listen {
    principal: Principal,
    /// The listen request's id as JSON text: its subscription id.
    raw_id: String,
    /// The list_changed methods it gets: asked for, and declared by the backend.
    lists: Vec<&'static str>,
    /// The uris the backend accepted for it.
    uris: BTreeSet<String>,
    /// The proxy's subscribes for it still unanswered: its acknowledgement waits for them.
    awaiting: usize,
    acknowledged: bool,
    /// list_changed heard before the acknowledgement, sent right after it.
    missed: BTreeSet<&'static str>,
    last_frame: Instant,
}

/// The listen streams part: the streams, who holds each uri, the subscribes awaited, the
/// keep-alives and the acknowledgements' deadlines. It writes its streams' frames itself;
/// it reaches the backend through the parts the hub lends it ([`Upstream`]).
#[derive(Debug)]
pub(crate) struct Listeners {
    open: BTreeMap<StreamId, Listen>,
    /// The listens holding each uri (its subscribe sent or accepted).
    holders: BTreeMap<String, BTreeSet<StreamId>>,
    /// The proxy's subscribes awaited, by number: for which listen, of which uri.
    subscribing: BTreeMap<u64, (StreamId, String)>,
    keepalives: Deadlines<StreamId>,
    /// When an acknowledgement stops waiting for the backend (`--request-timeout`).
    ack_timers: Deadlines<StreamId>,
    keepalive: Duration,
}

/// The hub's [`Upstream`] parts.
macro_rules! upstream {
    ($hub:expr) => {
        (
            &mut $hub.router,
            &mut $hub.backend,
            &mut $hub.metrics,
            &mut $hub.outputs,
        )
    };
}
pub(super) use upstream;

impl Listeners {
    pub(crate) fn new(keepalive: Duration) -> Self {
        Listeners {
            open: BTreeMap::new(),
            holders: BTreeMap::new(),
            subscribing: BTreeMap::new(),
            keepalives: Deadlines::default(),
            ack_timers: Deadlines::default(),
            keepalive,
        }
    }

    /// A reload's `--keepalive`, for each stream's next keep-alive check.
    pub(crate) fn set_keepalive(&mut self, keepalive: Duration) {
        self.keepalive = keepalive;
    }

    /// Whether a listen stream holds `uri`.
    pub(crate) fn holds(&self, uri: &str) -> bool {
        self.holders.contains_key(uri)
    }

    /// Every uri the backend accepted for a listen stream (repeated when for several).
    pub(crate) fn accepted(&self) -> impl Iterator<Item = &String> {
        self.open.values().flat_map(|listen| &listen.uris)
    }

    /// Subscribes still awaited, (stream, uri): a restarted backend never answers them,
    /// so they are asked again under new numbers.
    fn take_awaited(&mut self) -> Vec<(StreamId, String)> {
        std::mem::take(&mut self.subscribing)
            .into_values()
            .collect()
    }

    /// Listen `stream` opened (acknowledged by `ack_by` at the latest): each of `uris` is
    /// subscribed under the proxy's id, and once the backend answered them all it is
    /// acknowledged.
    fn start(
        &mut self,
        (router, backend, metrics, outputs): Upstream<'_>,
        now: Instant,
        (stream, listen, ack_by): (StreamId, Listen, Option<Instant>),
        uris: Vec<String>,
    ) {
        self.open.insert(stream, listen);
        self.keepalives.set(stream, now + self.keepalive);
        if let Some(at) = ack_by {
            self.ack_timers.set(stream, at);
        }
        for uri in uris {
            let (n, line) = router.subscribe(&uri);
            self.awaits(n, stream, uri);
            if !queued((metrics, backend, outputs), now, line, LineFrom::Proxy) {
                // Never sent: the backend holds nothing for it.
                self.subscribed(now, n, false, outputs);
            }
        }
        if self.open[&stream].awaiting == 0 {
            self.acknowledge(now, stream, outputs);
        }
    }

    /// The proxy's subscribe number `n` of `uri` is for `stream`.
    fn awaits(&mut self, n: u64, stream: StreamId, uri: String) {
        if let Some(listen) = self.open.get_mut(&stream) {
            listen.awaiting += 1;
            let holders = self.holders.entry(uri.clone()).or_default();
            holders.insert(stream);
            self.subscribing.insert(n, (stream, uri));
        }
    }

    /// The backend answered the proxy's subscribe `n`: an accepted uri is the listen's, a
    /// refused one is let go (the backend holds nothing for it). A listen that waits for
    /// nothing more is acknowledged.
    pub(super) fn subscribed(
        &mut self,
        now: Instant,
        n: u64,
        accepted: bool,
        out: &mut impl Extend<Output>,
    ) {
        let Some((stream, uri)) = self.subscribing.remove(&n) else {
            return;
        };
        let Some(listen) = self.open.get_mut(&stream) else {
            return;
        };
        listen.awaiting -= 1;
        if accepted {
            listen.uris.insert(uri);
        } else {
            self.release(stream, &uri);
        }
        let listen = &self.open[&stream];
        if listen.awaiting == 0 && !listen.acknowledged {
            self.acknowledge(now, stream, out);
        }
    }

    /// `stream` holds `uri` no longer; true if no listen does.
    fn release(&mut self, stream: StreamId, uri: &str) -> bool {
        let Some(set) = self.holders.get_mut(uri) else {
            return false;
        };
        set.remove(&stream);
        if !set.is_empty() {
            return false;
        }
        self.holders.remove(uri);
        true
    }

    /// Sends `stream` its acknowledgement (what it gets), then the list_changed it missed
    /// while the backend was being asked.
    fn acknowledge(&mut self, now: Instant, stream: StreamId, out: &mut impl Extend<Output>) {
        self.ack_timers.remove(&stream);
        let Some(listen) = self.open.get_mut(&stream) else {
            return;
        };
        listen.acknowledged = true;
        let mut frames = vec![acknowledgement(listen)];
        for method in std::mem::take(&mut listen.missed) {
            frames.push(stamped(method, None, &listen.raw_id));
        }
        for frame in frames {
            self.send(now, stream, &frame, out);
        }
    }

    fn send(
        &mut self,
        now: Instant,
        stream: StreamId,
        message: &[u8],
        out: &mut impl Extend<Output>,
    ) {
        if let Some(listen) = self.open.get_mut(&stream) {
            listen.last_frame = now;
            let frame = Frame::Owned(sse::message_event(message));
            out.extend([Output::ToStream { stream, frame }]);
        }
    }

    /// `method` to every listen that asked for it (one still unacknowledged gets it after
    /// its acknowledgement); whether any did.
    pub(crate) fn list_changed(
        &mut self,
        now: Instant,
        method: &str,
        out: &mut impl Extend<Output>,
    ) -> bool {
        let mut told = Vec::new();
        for (stream, listen) in &mut self.open {
            let Some(method) = listen.lists.iter().find(|m| **m == method).copied() else {
                continue;
            };
            match listen.acknowledged {
                true => told.push((*stream, stamped(method, None, &listen.raw_id))),
                false => {
                    listen.missed.insert(method);
                }
            }
        }
        let any = !told.is_empty();
        for (stream, message) in told {
            self.send(now, stream, &message, out);
        }
        any
    }

    /// `notifications/resources/updated` of `uri` to every listen the backend accepted it
    /// for; how many.
    pub(crate) fn updated(
        &mut self,
        now: Instant,
        uri: &str,
        out: &mut impl Extend<Output>,
    ) -> usize {
        let told: Vec<(StreamId, Vec<u8>)> = (self.holders.get(uri).into_iter().flatten())
            .filter_map(|stream| Some((*stream, self.open.get(stream)?)))
            .filter(|(_, listen)| listen.acknowledged && listen.uris.contains(uri))
            .map(|(stream, l)| {
                (
                    stream,
                    stamped("notifications/resources/updated", Some(uri), &l.raw_id),
                )
            })
            .collect();
        for (stream, message) in &told {
            self.send(now, *stream, message, out);
        }
        told.len()
    }

    /// Forgets `stream`: its principal, and the uris no listen holds any more.
    fn close(&mut self, stream: StreamId) -> Option<(Principal, Vec<String>)> {
        let listen = self.open.remove(&stream)?;
        self.keepalives.remove(&stream);
        self.ack_timers.remove(&stream);
        let mut uris: Vec<String> = listen.uris.into_iter().collect();
        self.subscribing.retain(|_, (s, uri)| {
            let mine = *s == stream;
            if mine {
                uris.push(std::mem::take(uri));
            }
            !mine
        });
        let released = uris
            .into_iter()
            .filter(|uri| self.release(stream, uri))
            .collect();
        Some((listen.principal, released))
    }

    /// Ends at the proxy's end every stream of a principal `ended` names (all of them at
    /// shutdown or when the backend went with its sessions; a reload's revoked principals'):
    /// a last result under each listen's id, then the end (SPEC section 13); each gives its
    /// session's room back. Returns the uris no listen holds any more.
    pub(super) fn end_where(
        &mut self,
        now: Instant,
        (sessions, out): (&mut Sessions, &mut impl Extend<Output>),
        ended: impl Fn(&Principal) -> bool,
    ) -> Vec<String> {
        let streams: Vec<StreamId> = (self.open.iter())
            .filter(|(_, listen)| ended(&listen.principal))
            .map(|(stream, _)| *stream)
            .collect();
        let mut released = Vec::new();
        for stream in streams {
            let raw_id = &self.open[&stream].raw_id;
            let last = format!(
                r#"{{"jsonrpc":"2.0","id":{raw_id},"result":{{"resultType":"complete","_meta":{{"{SUBSCRIPTION_ID}":{raw_id}}}}}}}"#
            );
            self.send(now, stream, last.as_bytes(), out);
            out.extend([Output::EndStream { stream }]);
            if let Some((principal, uris)) = self.close(stream) {
                sessions.listen_ended(&principal);
                released.extend(uris);
            }
        }
        released
    }

    /// The client closed listen `stream` (or its queue overflowed): its session's room is
    /// given back, and the uris nobody else holds are unsubscribed.
    pub(super) fn closed(
        &mut self,
        now: Instant,
        stream: StreamId,
        sessions: &mut Sessions,
        upstream: Upstream<'_>,
    ) {
        let Some((principal, released)) = self.close(stream) else {
            return;
        };
        sessions.listen_ended(&principal);
        unsubscribe_unwatched(sessions, upstream, now, released);
    }

    /// A restarted backend holds no subscription: the subscribes still awaited are asked
    /// again (the uris the listens hold are renewed with the sessions').
    pub(super) fn renew_awaited(
        &mut self,
        now: Instant,
        (router, backend, metrics, outputs): Upstream<'_>,
    ) {
        for (stream, uri) in self.take_awaited() {
            let (n, line) = router.subscribe(&uri);
            self.subscribing.insert(n, (stream, uri));
            let parts = (&mut *metrics, &mut *backend, &mut *outputs);
            if !queued(parts, now, line, LineFrom::Proxy) {
                // Never sent, as when a listen opens: the backend holds nothing for it.
                self.subscribed(now, n, false, outputs);
            }
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        [self.keepalives.next(), self.ack_timers.next()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Keep-alives, and acknowledgements that waited `--request-timeout` for the backend:
    /// what it has not answered is left out (and unsubscribed, should it come late).
    pub(super) fn handle_timeout(
        &mut self,
        now: Instant,
        sessions: &Sessions,
        (router, backend, metrics, out): Upstream<'_>,
    ) {
        while let Some((_, stream)) = self.keepalives.pop_due(now) {
            let Some(listen) = self.open.get_mut(&stream) else {
                continue;
            };
            let idle_until = listen.last_frame + self.keepalive;
            if idle_until > now {
                self.keepalives.set(stream, idle_until);
                continue;
            }
            listen.last_frame = now;
            self.keepalives.set(stream, now + self.keepalive);
            let frame = Frame::Static(sse::KEEPALIVE);
            out.extend([Output::ToStream { stream, frame }]);
        }
        let mut due = Vec::new();
        while let Some((_, stream)) = self.ack_timers.pop_due(now) {
            due.push(stream);
        }
        for stream in due {
            let released = self.give_up(stream);
            self.acknowledge(now, stream, out);
            let upstream = (&mut *router, &mut *backend, &mut *metrics, &mut *out);
            unsubscribe_unwatched(sessions, upstream, now, released);
        }
    }

    /// Subscribes `stream` still awaits: they are given up (left out of its
    /// acknowledgement); the uris nobody holds any more.
    fn give_up(&mut self, stream: StreamId) -> Vec<String> {
        let mut given_up = Vec::new();
        self.subscribing.retain(|_, (s, uri)| {
            let mine = *s == stream;
            if mine {
                given_up.push(std::mem::take(uri));
            }
            !mine
        });
        if let Some(listen) = self.open.get_mut(&stream) {
            listen.awaiting = 0;
        }
        let released = given_up.into_iter().filter(|uri| self.release(stream, uri));
        released.collect()
    }
}

/// What a listen asked for (`params.notifications`).
struct Asked {
    lists: Vec<&'static str>,
    uris: Vec<String>,
}

impl Asked {
    /// The part of `msg`'s filter the backend can honour, as its cached `initialize`
    /// result declares: list_changed kinds it declared `listChanged` for, uris only if it
    /// declared `resources.subscribe` (at most a session's subscription cap, no repeats).
    fn honoured(msg: &Checked, declared: Option<&serde_json::value::RawValue>) -> Asked {
        let message: Value = serde_json::from_str(&msg.text).unwrap_or_default();
        let filter = message.pointer("/params/notifications");
        let capabilities: Value = declared
            .and_then(|result| serde_json::from_str(result.get()).ok())
            .unwrap_or_default();
        let declares = |path: &str| capabilities.pointer(path) == Some(&Value::Bool(true));
        let asks = |key: &str| filter.and_then(|f| f.get(key)) == Some(&Value::Bool(true));
        let lists = LIST_KINDS
            .iter()
            .filter(|(key, cap, _)| {
                asks(key) && declares(&format!("/capabilities/{cap}/listChanged"))
            })
            .map(|(_, _, method)| *method)
            .collect();
        let mut seen = BTreeSet::new();
        let uris = (filter.and_then(|f| f.get("resourceSubscriptions")))
            .and_then(Value::as_array)
            .filter(|_| declares("/capabilities/resources/subscribe"))
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|uri| seen.insert(*uri))
            .take(MAX_SUBSCRIPTIONS_PER_SESSION)
            .map(str::to_owned)
            .collect();
        Asked { lists, uris }
    }
}

/// Whether `msg` asks for more than [`MAX_LISTEN_URIS`] `resourceSubscriptions` (SPEC
/// section 13: refused 400, -32602).
fn asks_too_many(msg: &Checked) -> bool {
    // Most listens name few uris: a count of the key's occurrences decides without a parse.
    let text = msg.text.as_bytes();
    if memchr::memmem::find(text, b"resourceSubscriptions").is_none() {
        return false;
    }
    let message: Value = serde_json::from_str(&msg.text).unwrap_or_default();
    (message.pointer("/params/notifications/resourceSubscriptions"))
        .and_then(Value::as_array)
        .is_some_and(|uris| uris.len() > MAX_LISTEN_URIS)
}

impl Listen {
    /// A stream that holds no uri yet: the backend's subscribe answers add them.
    fn new(principal: Principal, msg: &Checked, lists: Vec<&'static str>, now: Instant) -> Listen {
        Listen {
            principal,
            raw_id: msg.raw_id().to_owned(),
            lists,
            uris: BTreeSet::new(),
            awaiting: 0,
            acknowledged: false,
            missed: BTreeSet::new(),
            last_frame: now,
        }
    }
}

/// A `subscriptions/listen` that passed every check opens its stream, within a
/// session's room (SPEC section 13): the backend is asked to subscribe each uri the
/// policy lets the caller read, and once it has answered them all the stream is
/// acknowledged with what it will carry. `msg` passed every check of the 2026-07-28
/// request path.
pub(super) fn open(
    hub: &mut Hub,
    now: Instant,
    request: RequestId,
    principal: Principal,
    grant: Grant,
    msg: Checked,
) {
    if asks_too_many(&msg) {
        let body = http::error_message(msg.raw_id(), -32602, "too many subscriptions");
        let response = crate::http::Response::json(400, body);
        return hub.respond(now, request, Answer::Served(response));
    }
    let parts = (&hub.backend, &hub.sessions);
    let per_principal = hub.settings.max_sessions_per_principal;
    let opening = super::mcp::opening(now, &principal, parts, per_principal);
    if let Err(refused) = admission::room(&Capacity::opening(opening)) {
        let mut refusal = refused.refusal(Some(msg.raw_id()), None);
        // The 2026-07-28 revision forbids undefined codes in -32020..-32099 (SPEC 13): not
        // section 10's -32029.
        if refused == admission::Refused::PrincipalSessions {
            let message = "Too many sessions for this principal, retry later";
            refusal.response.body = http::error_message(msg.raw_id(), -32000, message).into();
        }
        return hub.respond(now, request, refusal.into());
    }
    let Asked { lists, uris } = Asked::honoured(&msg, hub.router.handshake_result());
    let policy = hub.settings.policy.as_ref();
    let uris: Vec<String> = uris
        .into_iter()
        .filter(|uri| (hub.decisions).may_read(policy, (&principal, &grant), uri))
        .collect();
    if hub.listeners.subscribing.len() + uris.len() > MAX_PENDING_SUBSCRIBES {
        let refused = admission::Refused::BackendBusy.refusal(Some(msg.raw_id()), None);
        return hub.respond(now, request, refused.into());
    }
    let stream = StreamId(hub.mint());
    // Its observation ends as its stream opens: that is the proxy's answer.
    let started = hub.exchanges.take_started(request);
    hub.respond(now, request, Answer::Stream(stream, http::sse_head()));
    if let Some(started) = started {
        let opened = format!(r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#, msg.raw_id());
        let answered = Settlement::answered(opened.into_bytes(), Some(Outcome::Success));
        hub.settle(now, (None, Entry::unforwarded(started, now)), answered);
    }
    hub.sessions.listen_opened(&principal);
    let listen = Listen::new(principal, &msg, lists, now);
    let ack_by = hub.settings.request_timeout.map(|timeout| now + timeout);
    (hub.listeners).start(upstream!(hub), now, (stream, listen, ack_by), uris);
}

/// Unsubscribes each of `uris` (no listen holds them any more) that no session watches
/// either.
pub(super) fn unsubscribe_unwatched(
    sessions: &Sessions,
    (router, backend, metrics, outputs): Upstream<'_>,
    now: Instant,
    uris: Vec<String>,
) {
    for uri in uris {
        if sessions.watchers(&uri).is_empty() {
            let line = router.unsubscribe(&uri);
            let parts = (&mut *metrics, &mut *backend, &mut *outputs);
            queued(parts, now, line, LineFrom::Proxy);
        }
    }
}

/// `method` for a listen: `{"jsonrpc":"2.0","method":M,"params":{["uri":U,]"_meta":{<id>}}}`.
fn stamped(method: &str, uri: Option<&str>, raw_id: &str) -> Vec<u8> {
    let uri = uri
        .map(|uri| format!(r#""uri":{},"#, Value::from(uri)))
        .unwrap_or_default();
    format!(
        r#"{{"jsonrpc":"2.0","method":"{method}","params":{{{uri}"_meta":{{"{SUBSCRIPTION_ID}":{raw_id}}}}}}}"#
    )
    .into_bytes()
}

/// `notifications/subscriptions/acknowledged`: the part of its filter `listen` gets (what it
/// asked for and was not honoured is left out).
fn acknowledgement(listen: &Listen) -> Vec<u8> {
    let mut honoured = serde_json::Map::new();
    for (key, _, method) in LIST_KINDS {
        if listen.lists.contains(&method) {
            honoured.insert(key.to_owned(), Value::Bool(true));
        }
    }
    if !listen.uris.is_empty() {
        let uris = listen.uris.iter().cloned().map(Value::from).collect();
        honoured.insert("resourceSubscriptions".to_owned(), Value::Array(uris));
    }
    let (honoured, raw_id) = (Value::Object(honoured), &listen.raw_id);
    format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{{"notifications":{honoured},"_meta":{{"{SUBSCRIPTION_ID}":{raw_id}}}}}}}"#
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Admitted, Endpoint, Payload};
    use crate::output::BackendId;
    use crate::settings::Settings;
    use crate::supervise::Exit;

    const CAPABILITIES: &str = r#"{"tools":{"listChanged":true},"resources":{"subscribe":true}}"#;

    /// A hub with a backend initialized by one Streamable session, every output kept.
    struct Bench {
        hub: Hub,
        now: Instant,
        backend: BackendId,
        outputs: Vec<Output>,
        session: String,
    }

    impl Bench {
        fn new(settings: Settings, capabilities: &str) -> Bench {
            #[allow(clippy::disallowed_methods)] // the test's one origin of time
            let now = Instant::now();
            let mut hub = Hub::new(settings, now);
            let Some(Output::SpawnBackend { backend, .. }) = hub.poll_output() else {
                panic!("the backend is spawned first");
            };
            hub.handle_backend_spawned(now, backend, 7);
            let mut bench = Bench {
                hub,
                now,
                backend,
                outputs: Vec::new(),
                session: String::new(),
            };
            bench.drain();
            let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#;
            bench.mcp(None, init);
            let result = format!(
                r#"{{"jsonrpc":"2.0","id":"switchboard|initialize:1","result":{{"protocolVersion":"2025-06-18","capabilities":{capabilities},"serverInfo":{{"name":"b","version":"1"}}}}}}"#
            );
            bench.backend(&result);
            bench.session = bench
                .take()
                .iter()
                .find_map(|o| match o {
                    Output::Respond { response, .. } => response
                        .headers
                        .iter()
                        .find(|(name, _)| *name == "mcp-session-id")
                        .map(|(_, value)| value.to_string()),
                    _ => None,
                })
                .expect("the session opened");
            bench
        }

        /// Drains the hub, the shell writing every line it is given at once.
        fn drain(&mut self) {
            loop {
                let mut written = 0;
                while let Some(output) = self.hub.poll_output() {
                    written += usize::from(matches!(output, Output::ToBackend { .. }));
                    self.outputs.push(output);
                }
                if written == 0 {
                    return;
                }
                self.hub
                    .handle_backend_wrote(self.now, self.backend, written);
            }
        }

        fn take(&mut self) -> Vec<Output> {
            std::mem::take(&mut self.outputs)
        }

        fn backend(&mut self, line: &str) {
            let lines = [Some(line.as_bytes())];
            self.hub.handle_backend_lines(self.now, self.backend, lines);
            self.drain();
        }

        /// The backend exits, is restarted, and answers the cached handshake.
        fn restart(&mut self) {
            self.hub
                .handle_backend_exited(self.now, self.backend, Exit::Code(1));
            self.drain();
            let restart = self.hub.poll_timeout().expect("a restart is due");
            self.now = restart;
            self.hub.handle_timeout(restart);
            self.drain();
            let backend = self.take().iter().find_map(|o| match o {
                Output::SpawnBackend { backend, .. } => Some(*backend),
                _ => None,
            });
            self.backend = backend.expect("a new process");
            self.hub.handle_backend_spawned(self.now, self.backend, 8);
            self.drain();
            let init = to_backend(&self.take())
                .pop()
                .expect("the cached handshake");
            let n = init
                .split("initialize:")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .expect("its id");
            self.backend(&format!(
                r#"{{"jsonrpc":"2.0","id":"switchboard|initialize:{n}","result":{{"protocolVersion":"2025-06-18","capabilities":{CAPABILITIES}}}}}"#
            ));
        }

        /// A `POST /mcp` of `body` in `session` (none: it opens one) by alice.
        fn mcp(&mut self, session: Option<&str>, body: &str) -> RequestId {
            let mut admitted = Admitted::new(Endpoint::McpPost, Principal::new("alice"), "");
            admitted.mcp.session = session.map(str::to_owned);
            admitted.mcp.content_type = Some("application/json".into());
            admitted.mcp.accept = Some("application/json, text/event-stream".into());
            let payload = Payload::Bytes(body.as_bytes().to_vec());
            let request = admitted.into_request(payload, || [7; 16]);
            let id = self.hub.handle_request(self.now, request);
            self.drain();
            id
        }

        /// A checked `subscriptions/listen` of `principal` under id `id` asking `filter`:
        /// the stream it opened, if it did.
        fn listen(&mut self, principal: &str, id: u32, filter: &str) -> Option<StreamId> {
            let request = RequestId(self.hub.mint());
            self.hub.exchanges.open(request, Default::default());
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"subscriptions/listen","params":{{"notifications":{filter},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
            );
            let msg = Checked::admit(body.into_bytes()).expect("a request");
            let grant = Grant::default();
            open(
                &mut self.hub,
                self.now,
                request,
                Principal::new(principal),
                grant,
                msg,
            );
            self.drain();
            self.outputs.iter().find_map(|o| match o {
                Output::StartStream {
                    request: r, stream, ..
                } if *r == request => Some(*stream),
                _ => None,
            })
        }
    }

    /// The JSON messages written to `stream` among `outputs`, and whether it ended.
    fn on_stream(outputs: &[Output], stream: StreamId) -> (Vec<String>, bool) {
        let mut messages = Vec::new();
        let mut ended = false;
        for output in outputs {
            match output {
                Output::ToStream { stream: s, frame } if *s == stream => {
                    let text = String::from_utf8_lossy(frame.as_ref()).into_owned();
                    messages.extend(
                        text.strip_prefix("event: message\ndata: ")
                            .map(|m| m.trim_end().to_owned()),
                    );
                }
                Output::EndStream { stream: s } if *s == stream => ended = true,
                _ => {}
            }
        }
        (messages, ended)
    }

    /// The lines written to the backend among `outputs`.
    fn to_backend(outputs: &[Output]) -> Vec<String> {
        (outputs.iter())
            .filter_map(|o| match o {
                Output::ToBackend { line, .. } => {
                    Some(String::from_utf8_lossy(line).trim_end().to_owned())
                }
                _ => None,
            })
            .collect()
    }

    const META_7: &str = r#""_meta":{"io.modelcontextprotocol/subscriptionId":7}"#;

    #[test]
    fn acknowledged_once_the_backend_answered_then_only_what_was_asked() {
        let mut bench = Bench::new(Settings::default(), CAPABILITIES);
        let filter = r#"{"toolsListChanged":true,"promptsListChanged":true,"resourceSubscriptions":["file:///a","file:///a","file:///b"]}"#;
        let stream = bench.listen("bob", 7, filter).expect("a stream");
        let outputs = bench.take();
        let lines = to_backend(&outputs);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains(r#""method":"resources/subscribe","params":{"uri":"file:///a"}"#));
        assert!(
            lines[1].contains(r#""id":"switchboard|subscribe:3""#),
            "{lines:?}"
        );
        assert_eq!(
            on_stream(&outputs, stream),
            (vec![], false),
            "no ack before the answers"
        );

        bench.backend(r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#);
        bench.backend(r#"{"jsonrpc":"2.0","id":"switchboard|subscribe:2","result":{}}"#);
        assert_eq!(on_stream(&bench.take(), stream).0.len(), 0);
        bench.backend(r#"{"jsonrpc":"2.0","id":"switchboard|subscribe:3","error":{"code":-32602,"message":"no"}}"#);
        let (messages, _) = on_stream(&bench.take(), stream);
        assert_eq!(
            messages,
            [
                format!(
                    r#"{{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{{"notifications":{{"toolsListChanged":true,"resourceSubscriptions":["file:///a"]}},{META_7}}}}}"#
                ),
                format!(
                    r#"{{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{{{META_7}}}}}"#
                ),
            ]
        );

        for line in [
            r#"{"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///b"}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///a","_meta":{"x":1}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":7,"progress":1}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{}}"#,
        ] {
            bench.backend(line);
        }
        let (messages, ended) = on_stream(&bench.take(), stream);
        assert_eq!(
            messages,
            [format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{{"uri":"file:///a",{META_7}}}}}"#
            )]
        );
        assert!(!ended);
    }

    #[test]
    fn nothing_the_backend_did_not_declare_is_honoured() {
        let mut bench = Bench::new(Settings::default(), r#"{"tools":{}}"#);
        let filter = r#"{"toolsListChanged":true,"resourceSubscriptions":["file:///a"]}"#;
        let stream = bench.listen("bob", 7, filter).expect("a stream");
        let outputs = bench.take();
        assert!(to_backend(&outputs).is_empty());
        let ack = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{{"notifications":{{}},{META_7}}}}}"#
        );
        assert_eq!(on_stream(&outputs, stream).0, [ack]);
    }

    #[test]
    fn a_uri_is_unsubscribed_when_its_last_holder_of_either_kind_leaves() {
        let mut bench = Bench::new(Settings::default(), CAPABILITIES);
        let sid = bench.session.clone();
        let subscribe = r#"{"jsonrpc":"2.0","id":5,"method":"resources/subscribe","params":{"uri":"file:///a"}}"#;
        bench.mcp(Some(&sid), subscribe);
        let filter = r#"{"resourceSubscriptions":["file:///a"]}"#;
        let first = bench.listen("bob", 7, filter).expect("a stream");
        let second = bench.listen("carol", 8, filter).expect("a stream");
        bench.backend(r#"{"jsonrpc":"2.0","id":"switchboard|subscribe:2","result":{}}"#);
        bench.backend(r#"{"jsonrpc":"2.0","id":"switchboard|subscribe:3","result":{}}"#);
        bench.take();

        // The session leaves first: its unsubscribe is answered by the proxy.
        let unsubscribe = r#"{"jsonrpc":"2.0","id":6,"method":"resources/unsubscribe","params":{"uri":"file:///a"}}"#;
        bench.mcp(Some(&sid), unsubscribe);
        let outputs = bench.take();
        assert!(
            to_backend(&outputs).is_empty(),
            "{:?}",
            to_backend(&outputs)
        );
        assert!(outputs
            .iter()
            .any(|o| matches!(o, Output::Respond { response, .. }
            if String::from_utf8_lossy(&response.body).contains(r#""id":6,"result":{}"#))));

        bench
            .hub
            .handle_stream_closed(bench.now, first, crate::output::StreamEnd::ClientGone);
        bench.drain();
        assert!(
            to_backend(&bench.take()).is_empty(),
            "the other listen still holds it"
        );
        bench
            .hub
            .handle_stream_closed(bench.now, second, crate::output::StreamEnd::ClientGone);
        bench.drain();
        let lines = to_backend(&bench.take());
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].contains(r#""method":"resources/unsubscribe","params":{"uri":"file:///a"}"#)
        );
        assert_eq!(bench.hub.sessions.of(&Principal::new("bob")), 0);
    }

    #[test]
    fn a_session_leaving_keeps_what_a_listen_holds() {
        let mut bench = Bench::new(Settings::default(), CAPABILITIES);
        let sid = bench.session.clone();
        let filter = r#"{"resourceSubscriptions":["file:///a"]}"#;
        let stream = bench.listen("bob", 7, filter).expect("a stream");
        bench.backend(r#"{"jsonrpc":"2.0","id":"switchboard|subscribe:2","result":{}}"#);
        let subscribe = r#"{"jsonrpc":"2.0","id":5,"method":"resources/subscribe","params":{"uri":"file:///a"}}"#;
        bench.mcp(Some(&sid), subscribe);
        bench.take();
        let unsubscribe = r#"{"jsonrpc":"2.0","id":6,"method":"resources/unsubscribe","params":{"uri":"file:///a"}}"#;
        bench.mcp(Some(&sid), unsubscribe);
        assert!(to_backend(&bench.take()).is_empty());
        bench.backend(r#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///a"}}"#);
        assert_eq!(on_stream(&bench.take(), stream).0.len(), 1);
    }

    #[test]
    fn a_listen_takes_a_session_s_room() {
        let settings = Settings {
            max_sessions: 2,
            ..Settings::default()
        };
        let mut bench = Bench::new(settings, CAPABILITIES);
        let first = bench.listen("bob", 7, "{}").expect("room for one");
        assert_eq!(bench.listen("bob", 8, "{}"), None);
        assert!(bench
            .take()
            .iter()
            .any(|o| matches!(o, Output::Respond { response, .. } if response.status == 503)));
        bench
            .hub
            .handle_stream_closed(bench.now, first, crate::output::StreamEnd::ClientGone);
        assert!(bench.listen("bob", 9, "{}").is_some());
    }

    #[test]
    fn shutdown_ends_each_listen_with_its_last_result() {
        let mut bench = Bench::new(Settings::default(), CAPABILITIES);
        let stream = bench
            .listen("bob", 7, r#"{"toolsListChanged":true}"#)
            .expect("a stream");
        bench.take();
        bench.hub.handle_shutdown(bench.now);
        bench.drain();
        let last =
            format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"resultType":"complete",{META_7}}}}}"#);
        assert_eq!(on_stream(&bench.take(), stream), (vec![last], true));
        assert_eq!(bench.hub.sessions.of(&Principal::new("bob")), 0);
    }

    #[test]
    fn a_restarted_backend_is_subscribed_again_and_each_listen_told() {
        let mut bench = Bench::new(Settings::default(), CAPABILITIES);
        let filter =
            r#"{"toolsListChanged":true,"resourceSubscriptions":["file:///a","file:///b"]}"#;
        let stream = bench.listen("bob", 7, filter).expect("a stream");
        bench.backend(r#"{"jsonrpc":"2.0","id":"switchboard|subscribe:2","result":{}}"#);
        bench.take();
        // file:///b is still awaited when the backend exits.
        bench.restart();
        let outputs = bench.take();
        let lines = to_backend(&outputs);
        let subscribed = |uri: &str| {
            lines
                .iter()
                .filter(|l| {
                    l.contains(&format!(
                        r#""resources/subscribe","params":{{"uri":"{uri}"}}"#
                    ))
                })
                .count()
        };
        assert_eq!(
            (subscribed("file:///a"), subscribed("file:///b")),
            (1, 1),
            "{lines:?}"
        );
        // Still waiting for file:///b: the list change waits with it.
        assert_eq!(on_stream(&outputs, stream).0.len(), 0);
        let b = lines
            .iter()
            .find(|l| l.contains("file:///b"))
            .expect("asked again");
        let id = b
            .split(r#""id":"#)
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .expect("its id");
        bench.backend(&format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#));
        let (messages, _) = on_stream(&bench.take(), stream);
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages[0].contains(r#""resourceSubscriptions":["file:///a","file:///b"]"#));
        assert!(messages[1].contains("notifications/tools/list_changed"));
    }

    #[test]
    fn a_uri_the_policy_denies_is_never_asked_for() {
        let file = serde_json::json!({
            "version": "1.0", "type": "cedarv1",
            "cedar": {"policies": [
                r#"permit(principal, action == Action::"read_resource", resource) when { resource.uri like "docs://*" };"#,
            ], "entities_json": "[]"}
        });
        let policy = crate::policy::Policy::parse(&file.to_string()).expect("a policy");
        let settings = Settings {
            policy: Some(std::sync::Arc::new(policy)),
            ..Settings::default()
        };
        let mut bench = Bench::new(settings, CAPABILITIES);
        let filter = r#"{"resourceSubscriptions":["file:///etc/passwd","docs://guide"]}"#;
        let stream = bench.listen("bob", 7, filter).expect("a stream");
        let lines = to_backend(&bench.take());
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("docs://guide"));
        bench.backend(r#"{"jsonrpc":"2.0","id":"switchboard|subscribe:2","result":{}}"#);
        let (messages, _) = on_stream(&bench.take(), stream);
        assert!(messages[0].contains(r#""resourceSubscriptions":["docs://guide"]"#));
    }

    #[test]
    fn a_silent_backend_delays_the_acknowledgement_only_until_the_request_timeout() {
        let settings = Settings {
            request_timeout: Some(Duration::from_secs(60)),
            keepalive: Duration::from_secs(25),
            ..Settings::default()
        };
        let mut bench = Bench::new(settings, CAPABILITIES);
        let stream = bench.listen("bob", 7, r#"{"resourceSubscriptions":["file:///a"]}"#);
        let stream = stream.expect("a stream");
        bench.take();
        let end = bench.now + Duration::from_secs(60);
        while let Some(at) = bench.hub.poll_timeout().filter(|at| *at <= end) {
            bench.now = at;
            bench.hub.handle_timeout(at);
            bench.drain();
        }
        let outputs = bench.take();
        let keepalives = (outputs.iter())
            .filter(|o| matches!(o, Output::ToStream { stream: s, frame } if *s == stream && frame.as_ref() == sse::KEEPALIVE))
            .count();
        assert_eq!(keepalives, 2, "at 25 s and 50 s");
        let ack = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{{"notifications":{{}},{META_7}}}}}"#
        );
        assert_eq!(on_stream(&outputs, stream).0, [ack]);
        let lines = to_backend(&outputs);
        let unsubscribes = (lines.iter()).filter(|l| l.contains("resources/unsubscribe"));
        assert_eq!(unsubscribes.count(), 1, "{lines:?}");
        // The late answer finds nobody waiting.
        bench.backend(r#"{"jsonrpc":"2.0","id":"switchboard|subscribe:2","result":{}}"#);
        assert_eq!(on_stream(&bench.take(), stream).0.len(), 0);
    }

    /// `resourceSubscriptions` of `n` distinct uris starting at `from`.
    fn many_uris(from: usize, n: usize) -> String {
        let uris: Vec<String> = (from..from + n)
            .map(|i| format!(r#""file:///{i}""#))
            .collect();
        format!(r#"{{"resourceSubscriptions":[{}]}}"#, uris.join(","))
    }

    #[test]
    fn a_listen_asking_more_than_256_uris_is_refused() {
        let mut bench = Bench::new(Settings::default(), CAPABILITIES);
        assert_eq!(
            bench.listen("bob", 7, &many_uris(0, MAX_LISTEN_URIS + 1)),
            None
        );
        let outputs = bench.take();
        let refused = outputs.iter().find_map(|o| match o {
            Output::Respond { response, .. } => Some(response),
            _ => None,
        });
        let refused = refused.expect("an answer");
        assert_eq!(refused.status, 400);
        let body = String::from_utf8_lossy(&refused.body);
        assert_eq!(
            body,
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"too many subscriptions"}}"#
        );
        assert_eq!(
            to_backend(&outputs),
            Vec::<String>::new(),
            "nothing subscribed"
        );
        // 256 are accepted.
        assert!(bench
            .listen("bob", 8, &many_uris(0, MAX_LISTEN_URIS))
            .is_some());
    }

    #[test]
    fn one_listen_never_pushes_out_anothers_subscribe() {
        let mut bench = Bench::new(Settings::default(), CAPABILITIES);
        let filter = r#"{"resourceSubscriptions":["file:///x"]}"#;
        let victim = bench.listen("bob", 7, filter).expect("a stream");
        let subscribe = to_backend(&bench.take()).pop().expect("its subscribe");
        let id = subscribe
            .split(r#""id":"#)
            .nth(1)
            .and_then(|r| r.split(',').next());
        let id = id.expect("the subscribe's id").to_owned();
        // Before the backend answers, another caller asks for 256 made-up uris.
        let flood = many_uris(0, MAX_LISTEN_URIS);
        assert!(bench.listen("mallory", 8, &flood).is_some());
        bench.take();
        bench.backend(&format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#));
        let (messages, _) = on_stream(&bench.take(), victim);
        assert_eq!(
            messages,
            [format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{{"notifications":{{"resourceSubscriptions":["file:///x"]}},{META_7}}}}}"#
            )]
        );
        // Past the subscribes that may be awaited at once, a listen is refused (503) and
        // sends nothing; a listen within them still opens.
        let room = MAX_PENDING_SUBSCRIBES / MAX_LISTEN_URIS - 1;
        for i in 0..room {
            let uris = many_uris((i + 1) * MAX_LISTEN_URIS, MAX_LISTEN_URIS);
            let id = 100 + u32::try_from(i).expect("small");
            assert!(bench.listen("mallory", id, &uris).is_some());
        }
        bench.take();
        assert_eq!(bench.listen("mallory", 99, &many_uris(0, 1)), None);
        let outputs = bench.take();
        let refused = outputs.iter().find_map(|o| match o {
            Output::Respond { response, .. } => Some(response),
            _ => None,
        });
        assert_eq!(refused.expect("an answer").status, 503);
        assert_eq!(to_backend(&outputs), Vec::<String>::new());
        assert!(bench.listen("mallory", 98, "{}").is_some());
    }

    #[test]
    fn subscriptions_never_evict_a_health_ping() {
        let mut bench = Bench::new(Settings::default(), CAPABILITIES);
        let admitted = Admitted::new(Endpoint::Health, Principal::new("anonymous"), "");
        let request = admitted.into_request(Payload::Bytes(Vec::new()), || [9; 16]);
        let health = bench.hub.handle_request(bench.now, request);
        bench.drain();
        let ping = to_backend(&bench.take()).pop().expect("the health ping");
        assert!(ping.contains("switchboard|ping:"), "{ping}");
        // Listens whose subscribes the backend has not answered yet: more of the proxy's
        // own requests in flight than its table of any one purpose holds.
        for (i, principal) in ["bob", "carol"].into_iter().enumerate() {
            let filter = many_uris(i * MAX_LISTEN_URIS, MAX_LISTEN_URIS);
            let id = 10 + u32::try_from(i).expect("small");
            assert!(bench.listen(principal, id, &filter).is_some());
        }
        let subscribes = to_backend(&bench.take()).len();
        assert_eq!(subscribes, 2 * MAX_LISTEN_URIS);
        let id = ping
            .split(r#""id":"#)
            .nth(1)
            .and_then(|r| r.split(',').next());
        let id = id.expect("the ping's id");
        bench.backend(&format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#));
        let outputs = bench.take();
        let answer = outputs.iter().find_map(|o| match o {
            Output::Respond { request, response } if *request == health => Some(response),
            _ => None,
        });
        let answer = answer.expect("/health answered at the pong");
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
    }
}
