//! `subscriptions/listen` (SPEC section 13): a 2026-07-28 client's stream of exactly the
//! notifications it asked for, in place of a session's GET stream. A listen stream is no
//! session and carries nobody's traffic (no response but its last, no progress); it takes
//! a session's room under `--max-sessions`, and its resource subscriptions are shared with
//! the sessions': the backend is unsubscribed only when the last holder of a uri leaves.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::backend::LineFrom;
use super::deadlines::Deadlines;
use super::exchanges::Answer;
use super::sessions::MAX_SUBSCRIPTIONS_PER_SESSION;
use super::Hub;
use crate::admission::{self, Capacity};
use crate::auth::Principal;
use crate::http::{self, Grant};
use crate::message::Checked;
use crate::output::{Frame, Output, RequestId, StreamId};
use crate::sse;

/// The `_meta` key that names the listen every frame of its stream belongs to.
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

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
/// keep-alives and the acknowledgements' deadlines. It writes its streams' frames itself.
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

    /// Every uri a listen stream holds, in order.
    pub(crate) fn held(&self) -> impl Iterator<Item = &String> {
        self.holders.keys()
    }

    /// Subscribes still awaited, (stream, uri): a restarted backend never answers them,
    /// so they are asked again under new numbers.
    fn take_awaited(&mut self) -> Vec<(StreamId, String)> {
        std::mem::take(&mut self.subscribing)
            .into_values()
            .collect()
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

    /// The backend answered subscribe `n`: an accepted uri is the listen's, a refused one
    /// is let go (the backend holds nothing for it). The listen to acknowledge, once it
    /// waits for nothing more.
    fn subscribed(&mut self, n: u64, accepted: bool) -> Option<StreamId> {
        let (stream, uri) = self.subscribing.remove(&n)?;
        let listen = self.open.get_mut(&stream)?;
        listen.awaiting -= 1;
        if accepted {
            listen.uris.insert(uri);
        } else {
            self.release(stream, &uri);
        }
        let listen = &self.open[&stream];
        (listen.awaiting == 0 && !listen.acknowledged).then_some(stream)
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

    /// Ends every stream at the proxy's end: a last result under each listen's id, then
    /// the end (SPEC section 13). The principals whose listens ended.
    fn end_all(&mut self, now: Instant, out: &mut impl Extend<Output>) -> Vec<Principal> {
        let streams: Vec<StreamId> = self.open.keys().copied().collect();
        let mut principals = Vec::new();
        for stream in streams {
            let raw_id = &self.open[&stream].raw_id;
            let last = format!(
                r#"{{"jsonrpc":"2.0","id":{raw_id},"result":{{"resultType":"complete","_meta":{{"{SUBSCRIPTION_ID}":{raw_id}}}}}}}"#
            );
            self.send(now, stream, last.as_bytes(), out);
            out.extend([Output::EndStream { stream }]);
            principals.extend(self.close(stream).map(|(principal, _)| principal));
        }
        principals
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        [self.keepalives.next(), self.ack_timers.next()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Keep-alives due at `now`; the listens whose acknowledgement waited long enough.
    fn handle_timeout(&mut self, now: Instant, out: &mut impl Extend<Output>) -> Vec<StreamId> {
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
        due
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

impl Hub {
    /// A `subscriptions/listen` that passed every check opens its stream, within a
    /// session's room (SPEC section 13): the backend is asked to subscribe each uri the
    /// policy lets the caller read, and once it has answered them all the stream is
    /// acknowledged with what it will carry. Called by the 2026-07-28 request path once
    /// `request`'s exchange is open and `msg` passed every check.
    pub fn open_listen(
        &mut self,
        now: Instant,
        request: RequestId,
        principal: Principal,
        grant: Grant,
        msg: Checked,
    ) {
        let parts = (&self.backend, &self.sessions);
        let per_principal = self.settings.max_sessions_per_principal;
        let opening = super::mcp::opening(now, &principal, parts, per_principal);
        if let Err(refused) = admission::room(&Capacity::opening(opening)) {
            let refusal = refused.refusal(Some(msg.raw_id()), None);
            return self.respond(now, request, refusal.into());
        }
        let Asked { lists, uris } = Asked::honoured(&msg, self.router.handshake_result());
        let policy = self.settings.policy.as_ref();
        let uris: Vec<String> = uris
            .into_iter()
            .filter(|uri| (self.decisions).may_read(policy, (&principal, &grant), uri))
            .collect();
        let stream = StreamId(self.mint());
        self.respond(now, request, Answer::Stream(stream, http::sse_head()));
        self.sessions.listen_opened(&principal);
        let listen = Listen {
            principal,
            raw_id: msg.raw_id().to_owned(),
            lists,
            uris: BTreeSet::new(),
            awaiting: 0,
            acknowledged: false,
            missed: BTreeSet::new(),
            last_frame: now,
        };
        let listeners = &mut self.listeners;
        listeners.open.insert(stream, listen);
        listeners.keepalives.set(stream, now + listeners.keepalive);
        if let Some(timeout) = self.settings.request_timeout {
            listeners.ack_timers.set(stream, now + timeout);
        }
        for uri in uris {
            let (n, line) = self.router.subscribe(&uri);
            self.listeners.awaits(n, stream, uri);
            self.queue_line(line, LineFrom::Proxy);
        }
        if self.listeners.open[&stream].awaiting == 0 {
            self.listeners.acknowledge(now, stream, &mut self.outputs);
        }
    }
}

/// The backend answered the proxy's subscribe `n`: a listen waiting for it may now be
/// acknowledged.
pub(super) fn subscribed(hub: &mut Hub, now: Instant, n: u64, accepted: bool) {
    if let Some(stream) = hub.listeners.subscribed(n, accepted) {
        hub.listeners.acknowledge(now, stream, &mut hub.outputs);
    }
}

/// The client closed listen `stream` (or its queue overflowed): the uris nobody else holds
/// are unsubscribed.
pub(super) fn closed(hub: &mut Hub, stream: StreamId) {
    let Some((principal, released)) = hub.listeners.close(stream) else {
        return;
    };
    hub.sessions.listen_ended(&principal);
    unsubscribe_unwatched(hub, released);
}

/// Unsubscribes each of `uris` that no session watches either.
fn unsubscribe_unwatched(hub: &mut Hub, uris: Vec<String>) {
    for uri in uris {
        if hub.sessions.watchers(&uri).is_empty() {
            let line = hub.router.unsubscribe(&uri);
            hub.queue_line(line, LineFrom::Proxy);
        }
    }
}

/// Keep-alives, and acknowledgements that waited `--request-timeout` for the backend: what
/// it has not answered is left out (and unsubscribed, should it come late).
pub(super) fn handle_timeout(hub: &mut Hub, now: Instant) {
    for stream in hub.listeners.handle_timeout(now, &mut hub.outputs) {
        let released = hub.listeners.give_up(stream);
        hub.listeners.acknowledge(now, stream, &mut hub.outputs);
        unsubscribe_unwatched(hub, released);
    }
}

/// Every listen stream ends with the proxy's last result (shutdown, or the backend gone
/// with its sessions).
pub(super) fn end_all(hub: &mut Hub, now: Instant) {
    for principal in hub.listeners.end_all(now, &mut hub.outputs) {
        hub.sessions.listen_ended(&principal);
    }
}

/// A restarted backend holds no subscription: the subscribes still awaited are asked again
/// (the uris the listens hold are renewed with the sessions').
pub(super) fn renew_awaited(hub: &mut Hub) {
    for (stream, uri) in hub.listeners.take_awaited() {
        let (n, line) = hub.router.subscribe(&uri);
        hub.listeners.subscribing.insert(n, (stream, uri));
        hub.queue_line(line, LineFrom::Proxy);
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
