//! The router: SPEC sections 2 and 3 at the level of one message. It keeps only what a
//! message needs that no session owns (the backend's one `initialize` handshake and the
//! proxy's own requests) and **returns** its decisions: [`Router::forward`] says what a
//! client's [`Checked`] message (admitted before the hand-off) becomes,
//! [`Router::backend_line`] says where a backend line goes. Which sessions are live is the
//! hub's to know.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::{Arc, LazyLock};

use memchr::memmem::Finder;
use serde_json::value::RawValue;

use crate::message::{self, Checked, IdAt, IdKey, Invalid, Kind, Message, RawId};
use crate::metrics::DropReason;
use crate::routed_id::{self, Mark, SessionId};

/// Clients that may wait for the backend's first `initialize` at once.
pub(crate) const MAX_INITIALIZE_WAITERS: usize = 4096;

/// The proxy's own requests of one purpose awaiting an answer, at most (each purpose has
/// its own table, so no flood of subscribes can evict a health ping: SPEC section 13).
const MAX_PROXY_REQUESTS: usize = 256;

/// The subscribes of listen streams awaiting the backend's answer, at most: a listen that
/// would go past it is refused before any is sent (SPEC section 13), so that one listen's
/// uris never push out another's subscribe still awaited.
pub(crate) const MAX_PENDING_SUBSCRIBES: usize = 4096;

/// Prefix of the ids the proxy mints for its own requests. Not a UUID, so it can never be
/// mistaken for a session's routed id.
const PROXY_ID_PREFIX: &str = "switchboard|";

/// The proxy's end of the handshake, once the backend's `initialize` succeeded.
const INITIALIZED_LINE: &[u8] = b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n";

/// What one of the proxy's own requests was, so only the right answer counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ProxyRequest {
    Ping,
    Subscribe,
    Unsubscribe,
    Initialize,
    /// A list fetched for the list cache (SPEC section 16).
    List,
    /// A page of the backend's tool list, read for the operator's tool view.
    Tools,
}

/// The proxy's own answers to an admitted message.
impl Checked {
    /// The proxy's answer to this request: `{"jsonrpc":"2.0","id":<id>,"result":<value>}`.
    pub(crate) fn result(&self, value: &str) -> Vec<u8> {
        response_line(self.raw_id(), "result", value)
    }

    /// The proxy's error answer to this request.
    pub(crate) fn error(&self, code: i32, text: &str) -> Vec<u8> {
        let error = format!(
            r#"{{"code":{code},"message":{}}}"#,
            serde_json::Value::from(text)
        );
        response_line(self.raw_id(), "error", &error)
    }
}

/// What a client message becomes.
#[derive(Debug)]
pub(crate) enum Forward {
    /// A line for the backend, ids routed for the sender.
    Line(Vec<u8>),
    /// The proxy answers at once with this response (a cached `initialize`, an error).
    Answer(Vec<u8>),
    /// An `initialize` that waits for the backend's handshake in flight, or a list that
    /// waits for the fetch of it already out.
    Waiting,
    /// A list answered from the list cache: its answer, as the backend's would be routed.
    Cached(Box<Routed>),
    /// A list the proxy fetches for the cache, under its own id.
    Fetch(ListFetch),
    /// A handshake notification: accepted and not forwarded.
    Absorbed,
}

/// A list the proxy fetches for the cache (SPEC section 16).
#[derive(Debug)]
pub(crate) struct ListFetch {
    /// Its number (the proxy's id).
    pub(crate) fetch: u64,
    /// The proxy's request for it (a line of the proxy's).
    pub(crate) line: Vec<u8>,
    /// The caller's request routed as with the cache off: it goes instead if the proxy's
    /// line finds no room (see [`Router::unfetched`]).
    pub(crate) plain: Vec<u8>,
}

/// Where a backend line goes (SPEC section 3's table).
#[derive(Debug)]
pub(crate) enum Routed {
    /// A response for a routed id of `session` (live or not: the hub knows), id restored.
    Response {
        session: SessionId,
        message: Vec<u8>,
        /// Where the restored id is in `message`.
        id: Range<usize>,
        /// The restored id's key, as the request was held by (`None`: not an id MCP allows).
        key: Option<IdKey>,
        /// What its routed id was marked for: a list result to filter for the caller.
        mark: Mark,
        /// It is a JSON-RPC error (for the audit log's outcome).
        failed: bool,
        /// Where its result is in `message` (`None`: an error, or not known), so that a
        /// 2026-07-28 answer is completed without reading the message again.
        result: Option<Range<usize>>,
        /// The task its result created (a `CreateTaskResult`, SPEC section 15).
        task: Option<CreatedTask>,
        /// Answered from the list cache or a fetch of the proxy's, not by the backend to
        /// the request routed under this id: it frees no place in the backend window
        /// (another request of the caller's may hold one under the same id).
        cached: bool,
    },
    /// `notifications/tasks/status` for task `task` (SPEC section 15): to its owner only.
    TaskStatus {
        task: Option<String>,
        message: Vec<u8>,
    },
    /// Progress for a routed token of `session`, token restored.
    Progress {
        session: SessionId,
        message: Vec<u8>,
        /// Where the restored token is in `message`.
        token: Range<usize>,
    },
    /// `notifications/resources/updated` for whoever watches `uri`, rebuilt from `uri`
    /// alone (empty when it has none: it reaches nobody).
    Updated {
        uri: Option<String>,
        message: Vec<u8>,
    },
    /// A `list_changed`, rebuilt without params, for every live session.
    ListChanged { method: String, message: Arc<[u8]> },
    /// The backend asked something; the proxy answers with `line` (and counts why).
    Answer {
        line: Vec<u8>,
        reason: DropReason,
        method: String,
    },
    /// The answer to the proxy's health ping number `ping`.
    Pong { ping: u64 },
    /// A restarted backend answered the cached handshake: `same` when it negotiated the
    /// protocol version the sessions know (they carry on; `initialized` completes the
    /// handshake), else they must start again.
    Restored {
        same: bool,
        initialized: Option<Vec<u8>>,
    },
    /// The backend answered the handshake: each waiting client's answer, and the
    /// proxy's `notifications/initialized` when it succeeded.
    Initialized {
        answers: Vec<Answer>,
        initialized: Option<Vec<u8>>,
    },
    /// The answer to the proxy's `resources/subscribe` number `subscribe`: a listen stream
    /// may wait for it (SPEC section 13).
    Subscribed { subscribe: u64, accepted: bool },
    /// The answer to one of the proxy's unsubscribes: nothing to do.
    Consumed,
    /// A page of the backend's tool list the proxy read: the number of its request, and
    /// its result (`None`: an error).
    ToolsRead {
        request: u64,
        result: Option<String>,
    },
    /// The answer to a list the proxy fetched: one answer for each caller that waited
    /// for it, as the backend's would be routed.
    Listed { answers: Vec<Routed> },
    /// Nowhere: counted and logged.
    Dropped {
        reason: DropReason,
        method: Option<String>,
    },
}

/// A task the backend created for a request (its `CreateTaskResult`, SPEC section 15).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CreatedTask {
    /// `result.task.taskId`.
    pub(crate) id: String,
    /// `result.task.ttl` in milliseconds (`None`: null, missing or not a whole number).
    pub(crate) ttl_ms: Option<u64>,
}

/// The search for a result's `"task"` member, built once (every result is searched).
static TASK: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"task\""));

impl CreatedTask {
    /// The task a result creates: its member `task` is an object whose `taskId` is a
    /// string. Only a result that names `"task"` at all is read past a search.
    fn of(result: &RawValue) -> Option<CreatedTask> {
        let text = result.get();
        TASK.find(text.as_bytes())?;
        let members = message::members(text)?;
        let (_, task) = members.into_iter().find(|(key, _)| key == "task")?;
        let task = message::members(task)?;
        let member = |name: &str| task.iter().find(|(key, _)| key == name).map(|(_, v)| *v);
        let id: String = serde_json::from_str(member("taskId")?).ok()?;
        let ttl_ms = member("ttl").and_then(|ttl| ttl.parse().ok());
        Some(CreatedTask { id, ttl_ms })
    }
}

/// The proxy's answer to one client's request.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) session: SessionId,
    pub(crate) message: Vec<u8>,
    /// Where the client's id is in `message`.
    pub(crate) id: Range<usize>,
    /// The client's id's key.
    pub(crate) key: Option<IdKey>,
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
        params: String,
    },
    /// The backend's `initialize` result, answered to every later client, and the params
    /// it was asked with (to initialize a restarted process the same way).
    Ready {
        result: Box<RawValue>,
        params: String,
    },
    /// The backend restarted with sessions kept: the new process must be initialized with
    /// `params` before any client line reaches it.
    Restore {
        result: Box<RawValue>,
        params: String,
    },
    /// The cached handshake is at the new process under the proxy's id `request`.
    Reinit {
        request: u64,
        result: Box<RawValue>,
        params: String,
    },
}

/// The message-level rules between many sessions and one backend.
#[derive(Debug)]
pub(crate) struct Router {
    init: Init,
    /// The backend's list results, read once for every caller.
    pub(crate) lists: crate::lists::Lists,
    /// The protocol version the cached handshake negotiated (a label).
    negotiated: Option<&'static str>,
    next_proxy_request: u64,
    /// The proxy's own requests awaiting an answer, by purpose.
    proxy_requests: BTreeMap<ProxyRequest, BTreeSet<u64>>,
}

impl Router {
    pub(crate) fn new() -> Self {
        Router {
            init: Init::Idle,
            lists: crate::lists::Lists::default(),
            negotiated: None,
            next_proxy_request: 1,
            proxy_requests: BTreeMap::new(),
        }
    }

    /// The backend exited: the proxy's own requests are forgotten, and so is the handshake
    /// unless sessions are `kept` (then the next process is initialized as this one was).
    pub(crate) fn backend_exited(&mut self, kept: bool) {
        self.proxy_requests.clear();
        self.lists.clear(true);
        self.init = match std::mem::replace(&mut self.init, Init::Idle) {
            Init::Ready { result, params }
            | Init::Restore { result, params }
            | Init::Reinit { result, params, .. }
                if kept =>
            {
                Init::Restore { result, params }
            }
            _ => Init::Idle,
        };
    }

    /// The backend's cached `initialize` result, once it has one.
    pub(crate) fn initialize_result(&self) -> Option<&str> {
        match &self.init {
            Init::Ready { result, .. } => Some(result.get()),
            _ => None,
        }
    }

    /// The protocol version of the backend's cached handshake, as a label: what every
    /// 2025 session's `initialize` was answered with (SPEC section 14's
    /// `mcp.protocol.version`).
    pub(crate) fn negotiated_version(&self) -> Option<&'static str> {
        self.initialize_result().and(self.negotiated)
    }

    /// Whether no handshake is cached, owed or under way.
    pub(crate) fn is_idle(&self) -> bool {
        matches!(self.init, Init::Idle)
    }

    /// The proxy's own `initialize`, for a 2026-07-28 request that finds the backend never
    /// initialized (SPEC section 13: 2025-11-25, capabilities `{}`, client `switchboard`);
    /// its result is cached as a client's would be.
    pub(crate) fn own_handshake(&mut self) -> Vec<u8> {
        let request = self.next_proxy_id(ProxyRequest::Initialize);
        let params = format!(
            r#"{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"switchboard","version":"{}"}}}}"#,
            env!("CARGO_PKG_VERSION")
        );
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":\"{PROXY_ID_PREFIX}initialize:{request}\",\"method\":\"initialize\",\"params\":{params}}}\n"
        );
        self.init = Init::InFlight {
            request,
            waiting: Vec::new(),
            params,
        };
        line.into_bytes()
    }

    /// Whether client lines may reach the backend: no cached handshake is owed to it.
    pub(crate) fn is_ready(&self) -> bool {
        !matches!(self.init, Init::Restore { .. } | Init::Reinit { .. })
    }

    /// The cached handshake for a new process, when one is owed.
    pub(crate) fn restore(&mut self) -> Option<Vec<u8>> {
        let Init::Restore { .. } = self.init else {
            return None;
        };
        let request = self.next_proxy_id(ProxyRequest::Initialize);
        let Init::Restore { result, params } = std::mem::replace(&mut self.init, Init::Idle) else {
            unreachable!("matched above");
        };
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":\"{PROXY_ID_PREFIX}initialize:{request}\",\"method\":\"initialize\",\"params\":{params}}}\n"
        );
        self.init = Init::Reinit {
            request,
            result,
            params,
        };
        Some(line.into_bytes())
    }

    /// The proxy's `resources/subscribe` of `uri` (for a restarted backend, or a listen
    /// stream), under an id of its own: its number and the line.
    pub(crate) fn subscribe(&mut self, uri: &str) -> (u64, Vec<u8>) {
        let n = self.next_proxy_id(ProxyRequest::Subscribe);
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":\"{PROXY_ID_PREFIX}subscribe:{n}\",\"method\":\"resources/subscribe\",\"params\":{{\"uri\":{}}}}}\n",
            serde_json::Value::from(uri)
        );
        (n, line.into_bytes())
    }

    /// The backend's cached `initialize` result (what it declared), once it has one.
    pub(crate) fn handshake_result(&self) -> Option<&RawValue> {
        match &self.init {
            Init::Ready { result, .. }
            | Init::Restore { result, .. }
            | Init::Reinit { result, .. } => Some(result),
            Init::Idle | Init::InFlight { .. } => None,
        }
    }

    /// What `msg` of `sid` becomes (subscriptions were decided by the hub); `mark`
    /// marks its routed id so that its result is filtered for the caller on the way back
    /// (for a `notifications/cancelled`: the mark of the request it cancels).
    pub(crate) fn forward(&mut self, sid: SessionId, msg: &Checked, mark: Mark) -> Forward {
        self.forward_edited(sid, msg, mark, &[])
    }

    /// [`Router::forward`], with `more` edits of the client's text (spans inside no other
    /// edit: a trace context in `params._meta`).
    pub(crate) fn forward_edited(
        &mut self,
        sid: SessionId,
        msg: &Checked,
        mark: Mark,
        more: &[(Range<usize>, Vec<u8>)],
    ) -> Forward {
        match (msg.kind, msg.method.as_str()) {
            (Kind::Request, "initialize") => self.client_initialize(sid, msg),
            // The proxy alone completes the backend's one handshake: a client's
            // `initialized`, or an `initialize` sent without an id, goes no further.
            (Kind::Notification, "notifications/initialized" | "initialize") => Forward::Absorbed,
            (Kind::Request, _) if crate::lists::is_list(&msg.method) => self
                .list(sid, msg, mark, more)
                .unwrap_or_else(|| Forward::Line(self.routed(sid, msg, mark, more))),
            _ => Forward::Line(self.routed(sid, msg, mark, more)),
        }
    }

    /// A list request through the list cache: `None` when the cache does not serve it.
    fn list(
        &mut self,
        sid: SessionId,
        msg: &Checked,
        mark: Mark,
        more: &[(Range<usize>, Vec<u8>)],
    ) -> Option<Forward> {
        let raw_id = msg.raw_id().to_owned();
        let waiter = crate::lists::Waiter {
            session: sid,
            raw_id: raw_id.clone(),
            mark,
        };
        let next = self.next_proxy_request;
        match self.lists.ask(msg, waiter, || next) {
            crate::lists::Listed::Pass => None,
            crate::lists::Listed::Shared => Some(Forward::Waiting),
            crate::lists::Listed::Hit(result) => {
                let answer = listed(sid, &raw_id, ("result", &result), (mark, false));
                Some(Forward::Cached(Box::new(answer)))
            }
            crate::lists::Listed::Miss { fetch, key } => {
                let n = self.next_proxy_id(ProxyRequest::List);
                debug_assert_eq!(n, fetch, "the fetch is numbered as the router numbers it");
                let params = key.1.map(|c| format!(r#","params":{{"cursor":{c}}}"#));
                let line = format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":\"{PROXY_ID_PREFIX}list:{n}\",\"method\":\"{}\"{}}}\n",
                    key.0,
                    params.unwrap_or_default()
                );
                let (line, plain) = (line.into_bytes(), self.routed(sid, msg, mark, more));
                Some(Forward::Fetch(ListFetch { fetch, line, plain }))
            }
        }
    }

    /// The line of fetch `fetch` found no room in the backend's stdin queue: the fetch
    /// ends (its one caller's request goes as with the cache off), so nobody joins a
    /// fetch the backend never got.
    pub(crate) fn unfetched(&mut self, fetch: u64) {
        if let Some(awaited) = self.proxy_requests.get_mut(&ProxyRequest::List) {
            awaited.remove(&fetch);
        }
        let waiters = self.lists.fetched(fetch, None);
        debug_assert!(waiters.len() <= 1, "a fetch is queued as it is made");
    }

    /// The line of the proxy's own handshake found no room in the backend's stdin queue:
    /// no handshake is under way, so the next request that needs one sends it.
    pub(crate) fn handshake_unsent(&mut self) {
        if let Init::InFlight {
            request, waiting, ..
        } = &self.init
        {
            debug_assert!(waiting.is_empty(), "a handshake is queued as it is made");
            if let Some(awaited) = self.proxy_requests.get_mut(&ProxyRequest::Initialize) {
                awaited.remove(request);
            }
            self.init = Init::Idle;
        }
    }

    /// `msg` of `sid` as a backend line: ids routed, `more` edits made.
    fn routed(
        &mut self,
        sid: SessionId,
        msg: &Checked,
        mark: Mark,
        more: &[(Range<usize>, Vec<u8>)],
    ) -> Vec<u8> {
        // SPEC 6.2: every id, progress token and cancelled request id a client sends
        // carries its own sid.
        let mut edits = Edits::default();
        if let Some(id) = &msg.id {
            let routed = Patch::Routed(sid, id.raw(&msg.text), mark);
            edits.push(id.span.clone(), routed);
        }
        edits.route(sid, msg, msg.token.as_ref(), Mark::Plain);
        // A cancellation names the request it cancels by that request's routed id, mark
        // included (`mark` is then the cancelled request's).
        let cancelled = if msg.id.is_none() { mark } else { Mark::Plain };
        edits.route(sid, msg, msg.cancels.as_ref(), cancelled);
        for (span, bytes) in more {
            edits.push(span.clone(), Patch::Text(bytes));
        }
        splice(&msg.text, edits, true)
    }

    fn client_initialize(&mut self, sid: SessionId, msg: &Checked) -> Forward {
        match &mut self.init {
            Init::Ready { result, .. } => Forward::Answer(msg.result(result.get())),
            // Client lines wait while a restarted backend is initialized; none come here.
            Init::Restore { .. } | Init::Reinit { .. } => {
                Forward::Answer(msg.error(-32603, "backend restarting"))
            }
            Init::InFlight { waiting, .. } if waiting.len() < MAX_INITIALIZE_WAITERS => {
                waiting.push((sid, msg.raw_id().to_owned()));
                Forward::Waiting
            }
            Init::InFlight { .. } => {
                Forward::Answer(msg.error(-32603, "Too many clients waiting for initialize"))
            }
            Init::Idle => {
                let request = self.next_proxy_id(ProxyRequest::Initialize);
                self.init = Init::InFlight {
                    request,
                    waiting: vec![(sid, msg.raw_id().to_owned())],
                    params: handshake_params(&msg.text),
                };
                let own_id = format!("\"{PROXY_ID_PREFIX}initialize:{request}\"");
                let mut edits = Edits::default();
                if let Some(id) = &msg.id {
                    edits.push(id.span.clone(), Patch::Owned(own_id.into_bytes()));
                }
                edits.route(sid, msg, msg.token.as_ref(), Mark::Plain);
                if let Some(c) = &msg.capabilities {
                    // A shared backend is offered no client capabilities: its sampling,
                    // roots or elicitation requests could not be attributed.
                    edits.push(c.clone(), Patch::Text(b"{}"));
                }
                Forward::Line(splice(&msg.text, edits, true))
            }
        }
    }

    /// The proxy's own `tools/list` (a page of it, after `cursor`), read for the operator's
    /// tool view (SPEC section 16): its number and the line.
    pub(crate) fn read_tools(&mut self, cursor: Option<&str>) -> (u64, Vec<u8>) {
        let n = self.next_proxy_id(ProxyRequest::Tools);
        let params =
            cursor.map(|c| format!(r#","params":{{"cursor":{}}}"#, serde_json::Value::from(c)));
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":\"{PROXY_ID_PREFIX}tools:{n}\",\"method\":\"tools/list\"{}}}\n",
            params.unwrap_or_default()
        );
        (n, line.into_bytes())
    }

    /// The proxy's health ping: its number and the line.
    pub(crate) fn health_ping(&mut self) -> (u64, Vec<u8>) {
        let n = self.next_proxy_id(ProxyRequest::Ping);
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":\"{PROXY_ID_PREFIX}ping:{n}\",\"method\":\"ping\"}}\n"
        );
        (n, line.into_bytes())
    }

    /// The proxy's `resources/unsubscribe` of `uri` after its last subscriber left, under
    /// an id of its own (whose answer it consumes).
    pub(crate) fn unsubscribe(&mut self, uri: &str) -> Vec<u8> {
        let n = self.next_proxy_id(ProxyRequest::Unsubscribe);
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":\"{PROXY_ID_PREFIX}unsubscribe:{n}\",\"method\":\"resources/unsubscribe\",\"params\":{{\"uri\":{}}}}}\n",
            serde_json::Value::from(uri)
        )
        .into_bytes()
    }

    /// One line from the backend's stdout (without its newline): SPEC section 3.
    pub(crate) fn backend_line(&mut self, line: &[u8]) -> Routed {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Ok(text) = std::str::from_utf8(line) else {
            return dropped(DropReason::Malformed, None);
        };
        let msg = match message::parse_backend(text) {
            Ok(msg) => msg,
            Err(Invalid::Batch) => return dropped(DropReason::Batch, None),
            Err(_) => return dropped(DropReason::Malformed, None),
        };
        match msg.kind {
            Kind::Response => self.backend_response(&msg),
            Kind::Notification => {
                let routed = backend_notification(&msg);
                if let Routed::ListChanged { method, .. } = &routed {
                    self.lists.changed(method);
                }
                routed
            }
            Kind::Request => backend_request(&msg),
        }
    }

    fn backend_response(&mut self, msg: &Message<'_>) -> Routed {
        let id_raw = msg.id.map(RawValue::get).unwrap_or("null");
        if let Some(value) = msg.id.and_then(message::string_value) {
            if let Some(own) = value.strip_prefix(PROXY_ID_PREFIX) {
                return self.proxy_response(msg, own);
            }
        }
        let Some(decoded) = routed_id::decode(id_raw) else {
            return dropped(DropReason::UnroutedResponse, None);
        };
        let span = msg.span(msg.id.expect("decoded from the id"));
        let id = span.start..span.start + decoded.original.len();
        // What follows the id moves by the difference (never below the id's own end).
        let moved = |r: Range<usize>| match r.start >= span.end {
            true => r.start + id.len() - span.len()..r.end + id.len() - span.len(),
            false => r,
        };
        let result = (msg.result.filter(|_| msg.error.is_none())).map(|r| moved(msg.span(r)));
        let mut edits = Edits::default();
        edits.push(span.clone(), Patch::Text(decoded.original.as_bytes()));
        Routed::Response {
            session: decoded.session,
            message: splice(msg.text, edits, false),
            id,
            key: IdKey::of(&decoded.original),
            mark: decoded.mark,
            failed: msg.error.is_some(),
            result,
            task: msg.result.and_then(CreatedTask::of),
            cached: false,
        }
    }

    /// A response to one of the proxy's own requests (`<kind>:<n>` after the prefix): only
    /// an answer naming the request's own kind and number settles it.
    fn proxy_response(&mut self, msg: &Message<'_>, own: &str) -> Routed {
        let settled = parse_own_id(own).filter(|(kind, n)| {
            (self.proxy_requests.get_mut(kind)).is_some_and(|awaited| awaited.remove(n))
        });
        let Some((kind, n)) = settled else {
            return dropped(DropReason::UnroutedResponse, None);
        };
        match kind {
            ProxyRequest::Ping => Routed::Pong { ping: n },
            ProxyRequest::Initialize => match self.init {
                Init::InFlight { request, .. } if request == n => self.initialize_answered(msg),
                Init::Reinit { request, .. } if request == n => self.reinitialized(msg),
                _ => dropped(DropReason::UnroutedResponse, None),
            },
            ProxyRequest::Subscribe => Routed::Subscribed {
                subscribe: n,
                accepted: msg.error.is_none(),
            },
            // The answer to an unsubscribe after the last subscriber left.
            ProxyRequest::Unsubscribe => Routed::Consumed,
            ProxyRequest::Tools => Routed::ToolsRead {
                request: n,
                result: msg.result.map(|r| r.get().to_owned()),
            },
            ProxyRequest::List => {
                let (member, value) = match (msg.result, msg.error) {
                    (Some(result), _) => ("result", result),
                    (None, Some(error)) => ("error", error),
                    (None, None) => return dropped(DropReason::Malformed, None),
                };
                let waiters = (self.lists).fetched(n, msg.result.map(RawValue::get));
                let answers = (waiters.into_iter())
                    .map(|w| {
                        listed(
                            w.session,
                            &w.raw_id,
                            (member, value.get()),
                            (w.mark, member == "error"),
                        )
                    })
                    .collect();
                Routed::Listed { answers }
            }
        }
    }

    /// Numbers the proxy's own request of `kind` and remembers it until answered (the
    /// oldest of that purpose are forgotten past a bound, so a silent backend cannot grow
    /// memory, and no other purpose's requests can push one out).
    fn next_proxy_id(&mut self, kind: ProxyRequest) -> u64 {
        let n = self.next_proxy_request;
        self.next_proxy_request += 1;
        let awaited = self.proxy_requests.entry(kind).or_default();
        let most = match kind {
            ProxyRequest::Subscribe => MAX_PENDING_SUBSCRIBES,
            _ => MAX_PROXY_REQUESTS,
        };
        if awaited.len() >= most {
            awaited.pop_first();
        }
        awaited.insert(n);
        n
    }

    /// The backend answered the first `initialize`: every waiting client is answered under
    /// its own id; on success the result is cached and the handshake completed once.
    fn initialize_answered(&mut self, msg: &Message<'_>) -> Routed {
        let Init::InFlight {
            waiting, params, ..
        } = std::mem::replace(&mut self.init, Init::Idle)
        else {
            unreachable!("checked by the caller");
        };
        let (member, value) = match (msg.result, msg.error) {
            (Some(result), _) => ("result", result),
            (None, Some(error)) => ("error", error),
            (None, None) => unreachable!("responses have a result or an error"),
        };
        let answers = waiting
            .into_iter()
            .map(|(session, id)| Answer {
                session,
                message: response_line(&id, member, value.get()),
                id: RESPONSE_ID_AT..RESPONSE_ID_AT + id.len(),
                key: IdKey::of(&id),
            })
            .collect();
        let ready = member == "result";
        if ready {
            self.negotiated = protocol_version(value).map(|v| crate::metrics::version_label(&v));
            self.lists.declared_by(value.get());
            self.init = Init::Ready {
                result: value.to_owned(),
                params,
            };
        }
        Routed::Initialized {
            answers,
            initialized: ready.then(|| INITIALIZED_LINE.to_vec()),
        }
    }
}

impl Router {
    /// A restarted backend answered the cached handshake: the sessions carry on only if it
    /// negotiated the same protocol version.
    fn reinitialized(&mut self, msg: &Message<'_>) -> Routed {
        let Init::Reinit { result, params, .. } = std::mem::replace(&mut self.init, Init::Idle)
        else {
            unreachable!("checked by the caller");
        };
        let same = msg
            .result
            .is_some_and(|new| protocol_version(new) == protocol_version(&result));
        if !same {
            return Routed::Restored {
                same,
                initialized: None,
            };
        }
        self.lists
            .declared_by(msg.result.expect("checked above").get());
        self.init = Init::Ready {
            result: msg.result.expect("checked above").to_owned(),
            params,
        };
        Routed::Restored {
            same,
            initialized: Some(INITIALIZED_LINE.to_vec()),
        }
    }
}

/// The `protocolVersion` of an `initialize` result.
fn protocol_version(result: &RawValue) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(result.get()).ok()?;
    value.get("protocolVersion")?.as_str().map(str::to_owned)
}

/// The params of the first client's `initialize` as the proxy replays them to a restarted
/// backend: its capabilities `{}` and no `_meta` (its progress token named that client).
/// Read once per backend handshake, apart from admission, which keeps no params.
fn handshake_params(text: &str) -> String {
    let mut params = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|mut m| m.get_mut("params").map(serde_json::Value::take))
        .unwrap_or_else(|| serde_json::json!({}));
    if let Some(object) = params.as_object_mut() {
        object.remove("_meta");
        if object.contains_key("capabilities") {
            object.insert("capabilities".to_owned(), serde_json::json!({}));
        }
    }
    params.to_string()
}

/// `<kind>:<n>` of one of the proxy's own ids, `n` canonical.
fn parse_own_id(own: &str) -> Option<(ProxyRequest, u64)> {
    let (kind, n) = own.split_once(':')?;
    let canonical =
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0'));
    let n = canonical.then(|| n.parse::<u64>().ok())??;
    let kind = match kind {
        "ping" => ProxyRequest::Ping,
        "unsubscribe" => ProxyRequest::Unsubscribe,
        "subscribe" => ProxyRequest::Subscribe,
        "initialize" => ProxyRequest::Initialize,
        "list" => ProxyRequest::List,
        "tools" => ProxyRequest::Tools,
        _ => return None,
    };
    Some((kind, n))
}

/// A list's answer for one caller, as a backend answer routed back to it would be.
fn listed(
    sid: SessionId,
    raw_id: &str,
    (member, value): (&str, &str),
    (mark, failed): (Mark, bool),
) -> Routed {
    Routed::Response {
        session: sid,
        message: response_line(raw_id, member, value),
        id: RESPONSE_ID_AT..RESPONSE_ID_AT + raw_id.len(),
        key: IdKey::of(raw_id),
        mark,
        failed,
        result: None,
        task: None,
        cached: true,
    }
}

fn dropped(reason: DropReason, method: Option<&str>) -> Routed {
    Routed::Dropped {
        reason,
        method: method.map(str::to_owned),
    }
}

fn backend_notification(msg: &Message<'_>) -> Routed {
    let method = msg.method.as_deref().unwrap_or_default();
    match method {
        "notifications/tools/list_changed"
        | "notifications/resources/list_changed"
        | "notifications/prompts/list_changed" => Routed::ListChanged {
            method: method.to_owned(),
            message: Arc::from(format!(r#"{{"jsonrpc":"2.0","method":"{method}"}}"#).into_bytes()),
        },
        "notifications/progress" => {
            let token = msg.params.progress_token;
            let decoded = token.and_then(|t| routed_id::decode(t.get()).map(|d| (t, d)));
            let Some((token, d)) = decoded else {
                return dropped(DropReason::UnroutedProgress, Some(method));
            };
            let span = msg.span(token);
            let at = span.start..span.start + d.original.len();
            let mut edits = Edits::default();
            edits.push(span, Patch::Text(d.original.as_bytes()));
            Routed::Progress {
                session: d.session,
                message: splice(msg.text, edits, false),
                token: at,
            }
        }
        "notifications/tasks/status" => Routed::TaskStatus {
            task: msg
                .params
                .task_id
                .and_then(message::string_value)
                .map(|s| s.into_owned()),
            message: splice(msg.text, Edits::default(), false),
        },
        "notifications/resources/updated" => {
            let uri = (msg.params.uri)
                .and_then(message::string_value)
                .map(|s| s.into_owned());
            let message = uri.as_deref().map(updated).unwrap_or_default();
            Routed::Updated { uri, message }
        }
        _ => dropped(DropReason::UnroutableNotification, Some(method)),
    }
}

/// `notifications/resources/updated` of `uri`, rebuilt from its uri alone: it reaches every
/// subscriber, so nothing else the backend put in it travels (a `_meta` naming a related
/// task would tell every subscriber that task's id).
fn updated(uri: &str) -> Vec<u8> {
    let uri = serde_json::Value::from(uri);
    let text = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{{"uri":{uri}}}}}"#
    );
    text.into_bytes()
}

/// A request from the backend: a `ping` is answered `{}`, anything else -32601, since a
/// shared proxy cannot attribute it to a client.
fn backend_request(msg: &Message<'_>) -> Routed {
    let method = msg.method.as_deref().unwrap_or_default();
    let id = msg.id.map(RawValue::get).unwrap_or("null");
    let (mut line, reason) = if method == "ping" {
        (response_line(id, "result", "{}"), DropReason::AnsweredPing)
    } else {
        let text = format!(
            "Method not found: {method} (a shared proxy cannot attribute server-to-client requests to a client)"
        );
        let error = format!(
            r#"{{"code":-32601,"message":{}}}"#,
            serde_json::Value::from(text)
        );
        (
            response_line(id, "error", &error),
            DropReason::AnsweredServerRequest,
        )
    };
    line.push(b'\n');
    Routed::Answer {
        line,
        reason,
        method: method.to_owned(),
    }
}

/// Where [`response_line`] puts the id.
pub(crate) const RESPONSE_ID_AT: usize = r#"{"jsonrpc":"2.0","id":"#.len();

/// `{"jsonrpc":"2.0","id":<id>,"<member>":<value>}` without a newline, carriage returns in
/// `value` (JSON whitespace) turned into spaces.
pub(crate) fn response_line(id: &str, member: &str, value: &str) -> Vec<u8> {
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
    /// The routed id of this session's id (written straight into the output), marked
    /// when its result is a list to filter.
    Routed(SessionId, RawId<'a>, Mark),
    Text(&'a [u8]),
    Owned(Vec<u8>),
}

/// The few spans one message needs rewritten (id, progress token, request id,
/// capabilities, a trace context), kept inline: the hot path allocates only its output.
#[derive(Debug, Default)]
struct Edits<'a> {
    items: [Option<(Range<usize>, Patch<'a>)>; 6],
}

impl<'a> Edits<'a> {
    fn push(&mut self, span: Range<usize>, patch: Patch<'a>) {
        let free = self
            .items
            .iter_mut()
            .find(|slot| slot.is_none())
            .expect("a message has at most six rewritten spans");
        *free = Some((span, patch));
    }

    /// Routes an id-like value of `msg` for `sid`, its routed id marked `mark`.
    fn route(&mut self, sid: SessionId, msg: &'a Checked, value: Option<&IdAt>, mark: Mark) {
        if let Some(value) = value {
            self.push(
                value.span.clone(),
                Patch::Routed(sid, value.raw(&msg.text), mark),
            );
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
            Patch::Routed(sid, id, mark) => routed_id::encode_marked(&sid, id, mark, &mut out),
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
