//! The message-level properties the `fuzz/` targets `client_body` and `backend_line` check
//! (the third, `session_ops`, is [`crate::model`]), here so that ordinary tests replay the
//! committed corpus through exactly the same code on stable (`core/tests/fuzz_corpus.rs`).
//!
//! Each entry point takes the fuzzer's raw bytes and panics when a property fails. No input
//! is "invalid" here: a panic is a router bug (or a wrong property), never bad input.
//!
//! | entry point | property |
//! |---|---|
//! | [`client_body`] | any POST body: no panic; a rejected body produces no action; an accepted one produces exactly one backend line (or the proxy's documented answer) whose ids are routed for the poster and round-trip; every other byte passes unchanged |
//! | [`backend_line`] | any backend line with several live sessions: no panic; every Deliver names a live session and is justified by the line; broadcasts are the three bare `list_changed`; every Reply answers the request's id |
//!
//! The checks parse JSON independently of `message.rs` (with `serde_json` maps of raw
//! values), so a parsing bug there shows up as a disagreement here.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::value::RawValue;

use switchboard_core::routed_id::{self, SessionId};
use switchboard_core::{DropReason, Principal};

use crate::routing::{Accepted, Action, Delivery, Routing};

/// The only methods a broadcast may carry, each rebuilt as `{"jsonrpc":"2.0","method":M}`.
pub(crate) const LIST_CHANGED: [&str; 3] = [
    "notifications/tools/list_changed",
    "notifications/resources/list_changed",
    "notifications/prompts/list_changed",
];

/// The requests MCP defines for a 2025-era client (SPEC section 15): any other is answered
/// -32601 by the proxy.
pub(crate) const MCP_REQUESTS: [&str; 17] = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
    "logging/setLevel",
    "tasks/get",
    "tasks/result",
    "tasks/list",
    "tasks/cancel",
];

/// What the proxy answers itself before the router (SPEC section 15) for a request of
/// `method` from a session that owns no task: the member and value of its answer.
pub(crate) fn answered_before_routing(method: &str) -> Option<(&'static str, &'static str)> {
    match method {
        "logging/setLevel" => Some(("result", "{}")),
        "tasks/get" | "tasks/result" | "tasks/cancel" => {
            Some(("error", r#"{"code":-32602,"message":"Task not found"}"#))
        }
        "tasks/list" => Some(("error", r#"{"code":-32602,"message":"Invalid cursor"}"#)),
        m if !MCP_REQUESTS.contains(&m) => {
            Some(("error", r#"{"code":-32601,"message":"Method not found"}"#))
        }
        _ => None,
    }
}

/// What the proxy answers itself before the router (SPEC section 15) for the request `m`
/// of `method` from a session that owns no task, `_meta` considered: a request it would
/// forward that names a related task (necessarily another's) is answered as a foreign
/// `tasks/get` is.
fn answered_for(method: &str, m: &Members<'_>) -> Option<(&'static str, &'static str)> {
    match answered_before_routing(method) {
        Some(answer) if method != "tasks/list" || has_cursor(m) => Some(answer),
        _ => names_related_task(m)
            .then_some(("error", r#"{"code":-32602,"message":"Task not found"}"#)),
    }
}

/// Whether a client message names, in `params._meta`, the task it relates to (SPEC
/// section 15: the fixtures' poster owns none, so such a message never reaches the backend).
fn names_related_task(m: &Members<'_>) -> bool {
    at(
        m,
        &["params", "_meta", "io.modelcontextprotocol/related-task"],
    )
    .is_some()
}

/// Whether a `tasks/list` names a cursor (one the proxy never minted, in the fixtures).
fn has_cursor(m: &Members<'_>) -> bool {
    at(m, &["params", "cursor"]).is_some_and(|c| c.get() != "null")
}

/// The proxy's own end of the handshake, written once when the first `initialize` succeeds.
pub(crate) const INITIALIZED_LINE: &[u8] =
    b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n";

/// Prefix of the ids the proxy mints for its own requests.
pub(crate) const PROXY_ID_PREFIX: &str = "switchboard|";
/// The proxy's own id for the backend's single `initialize` (`<prefix><n>`), when the
/// router forwards the first client's `initialize` under an id of its own rather than the
/// client's routed id. Either is accepted: neither can name another session.
const PROXY_INITIALIZE_PREFIX: &str = "switchboard|initialize:";

pub(crate) fn is_proxy_initialize_id(value: &str) -> bool {
    value
        .strip_prefix(PROXY_INITIALIZE_PREFIX)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The string value of a backend line's `id`, when it is the proxy's `initialize` id.
fn proxy_initialize_id(line: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(line).ok()?;
    let id = string_of(members(text)?.get("id")?)?;
    is_proxy_initialize_id(&id).then_some(id)
}

/// The id of the fixtures' `n`-th session: `SessionId::from_random([n; 16])`, numbered as
/// the scenario harness numbers its labels, so `<A>` in a scenario is `fixture_sid(1)`.
pub fn fixture_sid(n: u8) -> SessionId {
    SessionId::from_random([n; 16])
}

// ---------------------------------------------------------------------------------------
// client_body

/// The `initialize` result the warmed fixture cached.
const CACHED_RESULT: &str = r#"{"protocolVersion":"2024-11-05","capabilities":{"resources":{"subscribe":true}},"serverInfo":{"name":"fixture","version":"1"}}"#;
/// A resource both fixture sessions watch, so the poster's unsubscribe is answered by the
/// proxy (as is one of any uri the poster does not watch).
pub const SHARED_URI: &str = "file:///shared";

/// `data` POSTed to a live session, in each of the three `initialize` states: no panic; a
/// rejected body produces no action; an accepted body produces exactly one `Rewrite`
/// (one line, ids routed for the poster, every other member unchanged, the routed id and
/// progress token restored exactly when the backend echoes them) or the documented proxy
/// answer (`initialize` from the cache or after the in-flight one, `resources/unsubscribe`
/// while another session still watches, `notifications/initialized` absorbed).
pub fn client_body(data: &[u8]) {
    for init in [InitState::Idle, InitState::InFlight, InitState::Ready] {
        ClientFixture::new(init).check(data);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InitState {
    /// No `initialize` yet: the poster's goes to the backend.
    Idle,
    /// The other session's `initialize` is at the backend.
    InFlight,
    /// The backend answered; both sessions watch [`SHARED_URI`].
    Ready,
}

struct ClientFixture {
    router: Routing,
    init: InitState,
    poster: SessionId,
    alice: Principal,
    /// The raw id the other session's `initialize` reached the backend under.
    init_id: String,
}

impl ClientFixture {
    fn new(init: InitState) -> Self {
        let mut router = Routing::new(16);
        let (poster, other) = (fixture_sid(1), fixture_sid(2));
        let (alice, bob) = (Principal::new("alice"), Principal::new("bob"));
        setup_open(&mut router, poster, &alice);
        setup_open(&mut router, other, &bob);
        let mut init_id = String::new();
        if init != InitState::Idle {
            let actions = setup_post(
                &mut router,
                other,
                &bob,
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}"#,
            );
            let Some(Action::Rewrite { line }) = actions.first() else {
                panic!("the first initialize is forwarded: {actions:?}");
            };
            let text = std::str::from_utf8(line).expect("backend lines are UTF-8");
            init_id = members(text).expect("one object")["id"].get().to_owned();
        }
        if init == InitState::Ready {
            router.backend_line(
                format!(r#"{{"jsonrpc":"2.0","id":{init_id},"result":{CACHED_RESULT}}}"#)
                    .as_bytes(),
            );
            let subscribe = format!(
                r#"{{"jsonrpc":"2.0","id":"sub","method":"resources/subscribe","params":{{"uri":"{SHARED_URI}"}}}}"#
            );
            setup_post(&mut router, poster, &alice, &subscribe);
            setup_post(&mut router, other, &bob, &subscribe);
        }
        ClientFixture {
            router,
            init,
            poster,
            alice,
            init_id,
        }
    }

    fn check(mut self, body: &[u8]) {
        let (result, actions) = self.router.post(self.poster.as_str(), &self.alice, body);
        let accepted = match result {
            Err(rejection) => {
                assert!(
                    actions.is_empty(),
                    "a rejected body ({rejection:?}) produced {actions:?}"
                );
                assert_eq!(
                    rejection.status, 400,
                    "a live session's body was refused with {rejection:?}"
                );
                assert!(
                    self.router.is_live(&self.poster),
                    "a rejected body disturbed its session"
                );
                return;
            }
            Ok(accepted) => accepted,
        };
        let text = std::str::from_utf8(body).expect("an accepted body is UTF-8");
        let m = members(text).expect("an accepted body is one JSON object");
        assert_eq!(
            m.get("jsonrpc").and_then(|v| string_of(v)).as_deref(),
            Some("2.0"),
            "accepted without jsonrpc 2.0"
        );
        let method = m
            .get("method")
            .and_then(|v| string_of(v))
            .expect("an accepted body has a string method");
        assert!(
            !m.contains_key("result") && !m.contains_key("error"),
            "accepted a body with a method and a result or error"
        );
        let id = m.get("id").copied();
        if let Some(id) = id {
            assert!(is_id_like(id), "accepted the id {}", id.get());
            assert!(
                id.get().len() <= 256,
                "accepted a {}-byte id",
                id.get().len()
            );
        }
        match accepted {
            Accepted::Forwarded => {
                let [Action::Rewrite { line }] = &actions[..] else {
                    panic!("a forwarded body produced {actions:?}");
                };
                assert!(
                    id.is_some() || method == "notifications/cancelled",
                    "a client notification other than a cancellation reached the backend"
                );
                // SPEC section 15: a method MCP does not define never reaches the backend,
                // nor a message naming a task its poster does not own.
                assert!(
                    id.is_none() || answered_for(&method, &m).is_none(),
                    "{method} reached the backend"
                );
                assert!(
                    !names_related_task(&m),
                    "{method} naming another's task reached the backend"
                );
                let first_initialize =
                    self.init == InitState::Idle && method == "initialize" && id.is_some();
                let routed = check_rewrite(&self.poster, text, &m, first_initialize, line);
                self.round_trip(&m, &routed, first_initialize);
            }
            Accepted::Answered => self.check_answered(&method, id, &m, &actions),
            Accepted::Absorbed => {
                assert!(id.is_none(), "absorbed a request");
                if names_related_task(&m) {
                    // Dropped, as another's task (or, not passed, as any notification).
                    let [Action::Drop { reason, .. }] = &actions[..] else {
                        panic!("absorbed {method} naming a task with {actions:?}");
                    };
                    let reasons = [DropReason::ForeignTask, DropReason::ClientNotification];
                    assert!(reasons.contains(reason), "{method} dropped as {reason:?}");
                    return;
                }
                match method.as_str() {
                    "notifications/initialized" | "initialize" => {
                        assert!(actions.is_empty(), "absorbed with {actions:?}")
                    }
                    "notifications/cancelled" => panic!("a cancellation was absorbed"),
                    // SPEC section 15: a notification nobody passed is dropped, counted.
                    _ => assert!(
                        matches!(
                            &actions[..],
                            [Action::Drop {
                                reason: DropReason::ClientNotification,
                                ..
                            }]
                        ),
                        "absorbed {method} with {actions:?}"
                    ),
                }
            }
        }
    }

    /// The proxy answered the poster itself: `initialize` (from the cache, or after the
    /// in-flight one) or an unsubscribe that is not the last holder's.
    fn check_answered(
        &mut self,
        method: &str,
        id: Option<&RawValue>,
        m: &Members<'_>,
        actions: &[Action],
    ) {
        let id = id.expect("only requests are answered");
        let task_refused = answered_for(method, m).filter(|_| names_related_task(m));
        let expected = match (method, self.init) {
            _ if task_refused.is_some() => return self.check_refused(id, actions, task_refused),
            ("initialize", InitState::InFlight) => {
                assert!(actions.is_empty(), "a waiting initialize got {actions:?}");
                // The backend answers the first client's initialize: this one is answered too.
                let line = format!(
                    r#"{{"jsonrpc":"2.0","id":{},"result":{CACHED_RESULT}}}"#,
                    self.init_id
                );
                let after = self.router.backend_line(line.as_bytes());
                let mine: Vec<&Vec<u8>> = after
                    .iter()
                    .filter_map(|a| match a {
                        Action::Deliver {
                            session, message, ..
                        } if *session == self.poster => Some(message),
                        _ => None,
                    })
                    .collect();
                let [message] = mine[..] else {
                    panic!("a waiting initialize was answered with {after:?}");
                };
                check_answer(message, id, "result", CACHED_RESULT);
                return;
            }
            ("initialize", InitState::Ready) => CACHED_RESULT,
            // The poster never holds a uri alone: it watches only SHARED_URI, which the other
            // session watches too, so no unsubscribe of it is the last holder's (SPEC 13).
            ("resources/unsubscribe", _) => {
                let uri = at(m, &["params", "uri"]).and_then(strict_string_of);
                assert!(uri.is_some(), "answered an unsubscribe without a uri");
                "{}"
            }
            _ => match answered_for(method, m) {
                Some(answer) => return self.check_refused(id, actions, Some(answer)),
                None => panic!(
                    "{method} was answered by the proxy in state {:?}",
                    self.init
                ),
            },
        };
        let [Action::Deliver {
            session,
            message,
            what,
        }] = actions
        else {
            panic!("an answered {method} produced {actions:?}");
        };
        assert_eq!(*session, self.poster, "an answer went to another session");
        check_delivery_span(message, what);
        check_answer(message, id, "result", expected);
    }

    /// The proxy's own `answer` (SPEC section 15) to the poster's request `id`: counted,
    /// then delivered to the poster.
    fn check_refused(
        &self,
        id: &RawValue,
        actions: &[Action],
        answer: Option<(&'static str, &'static str)>,
    ) {
        let (member, expected) = answer.expect("an answer");
        let [Action::Drop { .. }, Action::Deliver {
            session,
            message,
            what,
        }] = actions
        else {
            panic!("an answered request produced {actions:?}");
        };
        assert_eq!(*session, self.poster, "an answer went to another session");
        check_delivery_span(message, what);
        check_answer(message, id, member, expected);
    }

    /// The backend echoes what the rewrite routed: the poster gets its own id (and
    /// progress token) back exactly, whether the backend kept the routed string's bytes or
    /// re-escaped every character.
    fn round_trip(&mut self, original: &Members<'_>, routed: &Routed, first_initialize: bool) {
        if let Some(id) = &routed.id {
            let original_id = original["id"];
            // The proxy's own id is echoed as sent: its answer completes the handshake once.
            let forms = if routed.proxy_initialize {
                vec![id.get().to_owned()]
            } else {
                echoes(id)
            };
            for echoed in forms {
                let line = format!(r#"{{"jsonrpc":"2.0","id":{echoed},"result":{{"echo":1}}}}"#);
                let actions = self.router.backend_line(line.as_bytes());
                let mut delivered = None;
                for action in &actions {
                    match action {
                        Action::Deliver {
                            session, message, ..
                        } if *session == self.poster => {
                            assert!(delivered.is_none(), "two answers for one id: {actions:?}");
                            delivered = Some(message);
                        }
                        Action::Reply { line } if first_initialize => {
                            assert_eq!(line, INITIALIZED_LINE, "unexpected proxy line");
                        }
                        other => panic!("echoing {echoed} produced {other:?}"),
                    }
                }
                let message = delivered
                    .unwrap_or_else(|| panic!("echoing {echoed} reached nobody: {actions:?}"));
                let d = one_line_object(message);
                let back = d.get("id").expect("a delivered response has an id");
                if echoed == id.get() {
                    assert_eq!(
                        back.get(),
                        original_id.get(),
                        "the id did not come back byte for byte"
                    );
                } else {
                    assert_same_id(original_id, back);
                }
            }
        }
        if let Some(token) = &routed.progress_token {
            let original_token = at(original, &["params", "_meta", "progressToken"])
                .expect("a routed token was in the body");
            for echoed in echoes(token) {
                let line = format!(
                    r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{echoed},"progress":1}}}}"#
                );
                let actions = self.router.backend_line(line.as_bytes());
                let [Action::Deliver {
                    session,
                    message,
                    what,
                }] = &actions[..]
                else {
                    panic!("progress for {echoed} produced {actions:?}");
                };
                assert_eq!(*session, self.poster, "progress went to another session");
                check_delivery_span(message, what);
                let d = one_line_object(message);
                let back = at(&d, &["params", "progressToken"]).expect("the token is kept");
                if echoed == token.get() {
                    assert_eq!(back.get(), original_token.get(), "token not restored");
                } else {
                    assert_same_id(original_token, back);
                }
            }
        }
    }
}

/// What a rewrite routed, as raw JSON text in the backend line.
#[derive(Default)]
struct Routed {
    id: Option<Box<RawValue>>,
    /// The id is the proxy's own `initialize` id, not a routed one.
    proxy_initialize: bool,
    progress_token: Option<Box<RawValue>>,
}

/// Checks one rewritten line against the body it came from: one line; the id, an integer
/// or string `_meta.progressToken` and a cancelled `requestId` routed for `sid`; the first
/// `initialize`'s capabilities emptied; every other member unchanged.
fn check_rewrite(
    sid: &SessionId,
    body: &str,
    m: &Members<'_>,
    first_initialize: bool,
    line: &[u8],
) -> Routed {
    let text = backend_line_text(line);
    let r = members(text).expect("a rewritten line is one JSON object");
    assert!(
        m.keys().eq(r.keys()),
        "members changed: {:?} -> {:?}",
        m.keys().collect::<Vec<_>>(),
        r.keys().collect::<Vec<_>>()
    );
    let method = m
        .get("method")
        .and_then(|v| string_of(v))
        .unwrap_or_default();
    let mut edited: Vec<&[&str]> = Vec::new();
    let mut routed = Routed::default();
    if let Some(id) = m.get("id") {
        let proxy_id = string_of(r["id"]).filter(|v| is_proxy_initialize_id(v));
        if first_initialize && proxy_id.is_some() {
            routed.proxy_initialize = true;
        } else {
            assert_routed(sid, id, r["id"], "id");
        }
        routed.id = Some(r["id"].to_owned());
        edited.push(&["id"]);
    }
    const TOKEN: &[&str] = &["params", "_meta", "progressToken"];
    const REQUEST_ID: &[&str] = &["params", "requestId"];
    const CAPABILITIES: &[&str] = &["params", "capabilities"];
    if let Some(token) = at(m, TOKEN).filter(|t| is_id_like(t)) {
        let now = at(&r, TOKEN).expect("the token is kept");
        assert_routed(sid, token, now, "_meta.progressToken");
        routed.progress_token = Some(now.to_owned());
        edited.push(TOKEN);
    }
    if method == "notifications/cancelled" {
        if let Some(request_id) = at(m, REQUEST_ID).filter(|t| is_id_like(t)) {
            let now = at(&r, REQUEST_ID).expect("requestId is kept");
            assert_routed(sid, request_id, now, "requestId");
            edited.push(REQUEST_ID);
        }
    }
    if first_initialize && at(m, CAPABILITIES).is_some() {
        let now = at(&r, CAPABILITIES).expect("capabilities are kept");
        assert_eq!(
            now.get(),
            "{}",
            "the first initialize kept client capabilities"
        );
        edited.push(CAPABILITIES);
    }
    let (mut before, mut after) = (canon_text(body), canon_text(text));
    for path in edited {
        blank(&mut before, path);
        blank(&mut after, path);
    }
    assert_eq!(before, after, "bytes other than the routed ids changed");
    routed
}

/// Asserts `routed` is `original` (an integer or string id) routed for `sid`: the string
/// `<sid>|n:<digits>` or `<sid>|s:<value>`, which `routed_id::decode` takes back apart.
fn assert_routed(sid: &SessionId, original: &RawValue, routed: &RawValue, what: &str) {
    let integer = is_integer(original);
    let value = string_of(routed);
    match string_of(original) {
        Some(text) => assert_eq!(
            value,
            Some(format!("{sid}|s:{text}")),
            "{what} {} routed as {}",
            original.get(),
            routed.get()
        ),
        None if integer => assert_eq!(
            value,
            Some(format!("{sid}|n:{}", original.get())),
            "{what} {} routed as {}",
            original.get(),
            routed.get()
        ),
        // A string whose escapes serde_json refuses (a lone surrogate): the raw text
        // must still be carried over unchanged.
        None => assert_eq!(
            routed.get(),
            format!("\"{sid}|s:{}", &original.get()[1..]),
            "{what} routed wrongly"
        ),
    }
    let decoded = routed_id::decode(routed.get())
        .unwrap_or_else(|| panic!("routed {what} {} does not decode", routed.get()));
    assert_eq!(decoded.session, *sid, "routed {what} names another session");
    assert_eq!(decoded.is_integer, integer, "routed {what} changed type");
    if integer {
        assert_eq!(decoded.original, original.get(), "integer {what} changed");
    } else {
        let back = RawValue::from_string(decoded.original.into_owned())
            .expect("decode gives back a JSON string");
        assert_same_id(original, &back);
    }
}

/// The same id value: exact digit text for integers, the parsed value for strings.
fn assert_same_id(original: &RawValue, back: &RawValue) {
    if is_integer(original) {
        assert_eq!(back.get(), original.get(), "integer id changed");
        return;
    }
    match (string_of(original), string_of(back)) {
        (Some(a), Some(b)) => assert_eq!(a, b, "string id changed"),
        _ => assert_eq!(back.get(), original.get(), "string id changed"),
    }
}

/// The forms a backend may echo a routed string in: its exact bytes, and every character
/// `\u`-escaped (what a re-serialising backend may do, and the decoder's slow path).
pub(crate) fn echoes(routed: &RawValue) -> Vec<String> {
    let mut out = vec![routed.get().to_owned()];
    // Only a string serde_json accepts can be re-escaped (a lone surrogate cannot be).
    if let Some(value) = strict_string_of(routed) {
        let mut escaped = String::from("\"");
        for unit in value.encode_utf16() {
            escaped.push_str(&format!("\\u{unit:04x}"));
        }
        escaped.push('"');
        out.push(escaped);
    }
    out
}

/// A proxy answer: one line, the client's own id, and `member` equal to `expected`.
fn check_answer(message: &[u8], id: &RawValue, member: &str, expected: &str) {
    let d = one_line_object(message);
    assert_eq!(
        d.get("id").map(|v| v.get()),
        Some(id.get()),
        "answered under another id"
    );
    let value = d
        .get(member)
        .unwrap_or_else(|| panic!("answer without {member}"));
    assert_eq!(
        canon_text(value.get()),
        canon_text(expected),
        "unexpected answer"
    );
}

// ---------------------------------------------------------------------------------------
// backend_line

/// `data` as a backend line while sessions A, B (alice) and C (bob) are live, D (carol) has
/// closed, C's `initialize` is in flight with B waiting behind it, A and B have requests
/// out and watch resources: no panic; every Deliver names a live session and is justified
/// by the line (its routed id or token names that session, it watches the updated uri, or
/// it waits for the `initialize` being answered), with the original id restored and every
/// other member unchanged; every Broadcast is one of the three bare `list_changed`; every
/// Reply is one JSON-RPC line answering the backend request's id; nothing is rewritten.
pub fn backend_line(data: &[u8]) {
    let mut fixture = BackendFixture::new();
    let actions = fixture.router.backend_line(data);
    check_backend_actions(&fixture.world(), data, &actions);
}

/// What the backend-line fixture set up, for seeds and tests: `(session, principal, posts)`
/// in order, then session D is closed and a health ping is sent.
pub fn backend_fixture_posts() -> Vec<(SessionId, &'static str, Vec<String>)> {
    let (a, b, c, d) = (
        fixture_sid(1),
        fixture_sid(2),
        fixture_sid(3),
        fixture_sid(4),
    );
    let posts = |bodies: &[&str]| bodies.iter().map(|b| (*b).to_owned()).collect();
    vec![
        (
            c,
            "bob",
            posts(&[
                r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{"sampling":{}},"clientInfo":{"name":"c","version":"1"}}}"#,
            ]),
        ),
        (
            b,
            "alice",
            posts(&[
                r#"{"jsonrpc":"2.0","id":"init-b","method":"initialize","params":{"capabilities":{}}}"#,
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"progressToken":"p"}}}"#,
                r#"{"jsonrpc":"2.0","id":3,"method":"resources/subscribe","params":{"uri":"file:///b"}}"#,
                r#"{"jsonrpc":"2.0","id":4,"method":"resources/subscribe","params":{"uri":"file:///a"}}"#,
            ]),
        ),
        (
            a,
            "alice",
            posts(&[
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"progressToken":7}}}"#,
                r#"{"jsonrpc":"2.0","id":"x|y","method":"tools/list"}"#,
                r#"{"jsonrpc":"2.0","id":9007199254740993,"method":"tools/list"}"#,
                r#"{"jsonrpc":"2.0","id":2,"method":"resources/subscribe","params":{"uri":"file:///a"}}"#,
            ]),
        ),
        (
            d,
            "carol",
            posts(&[
                r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"t"}}"#,
                r#"{"jsonrpc":"2.0","id":6,"method":"resources/subscribe","params":{"uri":"file:///d"}}"#,
            ]),
        ),
    ]
}

struct BackendFixture {
    router: Routing,
    live: BTreeSet<SessionId>,
    subs: BTreeMap<SessionId, BTreeSet<String>>,
    init_askers: BTreeSet<(SessionId, String)>,
    init_ids: BTreeSet<String>,
    /// One line per run: no task was ever created.
    tasks: BTreeMap<String, SessionId>,
}

impl BackendFixture {
    fn new() -> Self {
        let mut router = Routing::new(16);
        let mut live = BTreeSet::new();
        let setup = backend_fixture_posts();
        for (sid, principal, _) in &setup {
            setup_open(&mut router, *sid, &Principal::new(principal));
            live.insert(*sid);
        }
        let mut init_ids = BTreeSet::new();
        for (sid, principal, bodies) in &setup {
            for body in bodies {
                for action in setup_post(&mut router, *sid, &Principal::new(principal), body) {
                    if let Action::Rewrite { line } = action {
                        init_ids.extend(proxy_initialize_id(&line));
                    }
                }
            }
        }
        let closed = fixture_sid(4);
        router.close(closed);
        live.remove(&closed);
        router.health_ping();
        let set = |uris: &[&str]| uris.iter().map(|u| (*u).to_owned()).collect();
        BackendFixture {
            router,
            live,
            subs: BTreeMap::from([
                (fixture_sid(1), set(&["file:///a"])),
                (fixture_sid(2), set(&["file:///a", "file:///b"])),
            ]),
            init_askers: BTreeSet::from([
                (fixture_sid(3), "0".to_owned()),
                (fixture_sid(2), "\"init-b\"".to_owned()),
            ]),
            init_ids,
            tasks: BTreeMap::new(),
        }
    }

    fn world(&self) -> World<'_> {
        World {
            live: &self.live,
            subs: &self.subs,
            init_askers: &self.init_askers,
            init_ids: &self.init_ids,
            tasks: &self.tasks,
        }
    }
}

/// The state a backend line's actions are judged against.
pub(crate) struct World<'a> {
    pub(crate) live: &'a BTreeSet<SessionId>,
    /// Each live session's watched uris (string values).
    pub(crate) subs: &'a BTreeMap<SessionId, BTreeSet<String>>,
    /// Sessions that asked `initialize`, with their raw ids: the first one's answer may be
    /// fanned out to all of them.
    pub(crate) init_askers: &'a BTreeSet<(SessionId, String)>,
    /// String values of the proxy's own ids the `initialize` went out under.
    pub(crate) init_ids: &'a BTreeSet<String>,
    /// The tasks live sessions own now (SPEC section 15): a status notification reaches
    /// only its task's owner, a `tasks/list` result keeps only the caller's own.
    pub(crate) tasks: &'a BTreeMap<String, SessionId>,
}

impl World<'_> {
    /// Does a response with this id value answer the backend's single `initialize`?
    fn answers_initialize(&self, id: &str) -> bool {
        self.init_ids.contains(id)
            || self
                .init_askers
                .iter()
                .any(|(s, i)| is_routed_form(id, s, i))
    }
}

/// What one backend line may cause, whatever its bytes. Returns the sessions delivered to.
///
/// One line reaches a session at most once, except the answer to the backend's single
/// `initialize`, which reaches each waiting request (a session may have asked twice).
pub(crate) fn check_backend_actions(
    world: &World<'_>,
    data: &[u8],
    actions: &[Action],
) -> BTreeSet<SessionId> {
    let line = std::str::from_utf8(data)
        .ok()
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .and_then(members);
    let mut delivered = BTreeSet::new();
    for action in actions {
        match action {
            Action::Deliver {
                session,
                message,
                what,
            } => {
                check_delivery_span(message, what);
                assert!(
                    world.live.contains(session),
                    "delivered to {session}, which is not live"
                );
                let answers_initialize = line.as_ref().is_some_and(|m| {
                    !m.contains_key("method")
                        && m.get("id")
                            .and_then(|v| string_of(v))
                            .is_some_and(|id| world.answers_initialize(&id))
                });
                assert!(
                    delivered.insert(*session) || answers_initialize,
                    "two deliveries to one session for {:?}: {actions:?}",
                    String::from_utf8_lossy(data)
                );
                let line = line
                    .as_ref()
                    .unwrap_or_else(|| panic!("delivered from a line that is not an object"));
                justify_delivery(world, line, session, message);
            }
            Action::Broadcast { message } => {
                let method = line
                    .as_ref()
                    .and_then(|m| m.get("method"))
                    .and_then(|v| string_of(v));
                check_broadcast(message, method.as_deref());
                assert!(!world.live.is_empty(), "broadcast with no live session");
            }
            Action::Reply { line: reply } => check_reply(world, line.as_ref(), reply),
            Action::Pong => {
                let id = line
                    .as_ref()
                    .and_then(|m| m.get("id"))
                    .and_then(|v| string_of(v))
                    .unwrap_or_default();
                assert!(id.starts_with(PROXY_ID_PREFIX), "a pong for id {id:?}");
            }
            Action::Drop { .. } => {}
            Action::Rewrite { .. } => {
                panic!("a backend line produced {action:?}")
            }
        }
    }
    delivered
}

/// A delivery is one JSON object (where its id or token is, the message itself says).
pub(crate) fn check_delivery_span(message: &[u8], what: &Delivery) {
    let Delivery::Update = what;
    let text = std::str::from_utf8(message).expect("a delivered message is UTF-8");
    members(text).expect("a delivered message is one object");
}

/// A Deliver to `session` must be explained by the line itself (SPEC section 3).
fn justify_delivery(world: &World<'_>, m: &Members<'_>, session: &SessionId, message: &[u8]) {
    let d = one_line_object(message);
    let method = m.get("method").map(|v| string_of(v));
    match method {
        // A response: the first initialize's answer fanned out to a session that asked
        // initialize, or routed to `session` by its id.
        None => {
            if is_initialize_answer(world, m, session, &d) {
                return;
            }
            let id = m.get("id").and_then(|v| string_of(v)).unwrap_or_default();
            let rest = routed_rest(&id, session)
                .unwrap_or_else(|| panic!("response {id:?} delivered to {session}"));
            match rest.strip_prefix('t') {
                // A `tasks/list` of the session's (SPEC section 15).
                Some(rest) => check_task_list(world, m, &d, session, rest),
                None => check_restored(m, &d, &["id"], rest),
            }
        }
        Some(Some(method)) if method == "notifications/tasks/status" => {
            let task = at(m, &["params", "taskId"]).and_then(strict_string_of);
            assert!(
                (task.as_ref()).is_some_and(|t| world.tasks.get(t) == Some(session)),
                "status of task {task:?} delivered to {session}, which does not own it"
            );
            assert_eq!(
                canon_text(std::str::from_utf8(message).expect("checked")),
                canon_members(m),
                "tasks/status changed on the way"
            );
        }
        Some(Some(method)) if method == "notifications/progress" => {
            let token = at(m, &["params", "progressToken"])
                .and_then(string_of)
                .unwrap_or_default();
            let rest = routed_rest(&token, session)
                .unwrap_or_else(|| panic!("progress {token:?} delivered to {session}"));
            // A backend may echo a marked request id as a token: the mark means nothing.
            let rest = rest.strip_prefix(['f', 't']).unwrap_or(rest);
            check_restored(m, &d, &["params", "progressToken"], rest);
        }
        Some(Some(method)) if method == "notifications/resources/updated" => {
            let uri = at(m, &["params", "uri"]).and_then(strict_string_of);
            let watched = uri
                .as_ref()
                .is_some_and(|u| world.subs.get(session).is_some_and(|s| s.contains(u)));
            assert!(watched, "update of {uri:?} delivered to {session}");
            // Rebuilt from its uri alone: nothing else the backend wrote travels.
            let uri = serde_json::Value::from(uri.expect("watched"));
            let rebuilt = format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{{"uri":{uri}}}}}"#
            );
            assert_eq!(
                canon_text(std::str::from_utf8(message).expect("checked")),
                canon_text(&rebuilt),
                "resources/updated not rebuilt from its uri"
            );
        }
        other => panic!("{other:?} delivered to {session}"),
    }
}

/// SPEC section 15: the answer to `session`'s `tasks/list` (`rest` its routed id past the
/// mark). An error keeps its code and none of the backend's words (they may quote a
/// cursor that is another caller's task id); a result keeps only entries naming a task
/// the session owns, each as the backend wrote it, every other member as it was, and a
/// `nextCursor` that is not the backend's (a task id, maybe someone else's); a result
/// that cannot be filtered becomes -32603.
fn check_task_list(
    world: &World<'_>,
    m: &Members<'_>,
    d: &Members<'_>,
    session: &SessionId,
    rest: &str,
) {
    if !m.contains_key("result") || d.contains_key("error") && !m.contains_key("error") {
        let unfiltered = r#"{"code":-32603,"message":"task list could not be filtered"}"#;
        if m.contains_key("result") {
            assert_eq!(
                d.get("error").map(|e| e.get()),
                Some(unfiltered),
                "a tasks/list result became another error"
            );
            check_id_restored(d, &["id"], rest);
        } else {
            check_id_restored(d, &["id"], rest);
            check_list_error(m, d);
        }
        return;
    }
    check_id_restored(d, &["id"], rest);
    let (Some(line), Some(out)) = (
        m.get("result").and_then(|r| members(r.get())),
        d.get("result").and_then(|r| members(r.get())),
    ) else {
        panic!("a tasks/list result delivered as {d:?}");
    };
    let entries = |m: &Members<'_>| -> Vec<Canon> {
        let list = m.get("tasks").map(|t| t.get()).unwrap_or("[]");
        let list: Vec<&RawValue> = serde_json::from_str(list).unwrap_or_default();
        list.iter().map(|e| canon(e, 0)).collect()
    };
    let before = entries(&line);
    let list = out.get("tasks").map(|t| t.get()).unwrap_or("[]");
    let kept: Vec<&RawValue> = serde_json::from_str(list).expect("a filtered list is an array");
    for entry in kept {
        let task =
            members(entry.get()).and_then(|e| e.get("taskId").and_then(|t| strict_string_of(t)));
        assert!(
            (task.as_ref()).is_some_and(|t| world.tasks.get(t) == Some(session)),
            "tasks/list showed {session} task {task:?}, not its own"
        );
        assert!(
            before.contains(&canon(entry, 0)),
            "tasks/list showed an entry the backend did not list"
        );
    }
    let cursor = |m: &Members<'_>| m.get("nextCursor").and_then(|c| strict_string_of(c));
    if let Some(backend) = cursor(&line) {
        assert_ne!(
            cursor(&out).as_ref(),
            Some(&backend),
            "a backend cursor reached {session}"
        );
    }
    let others = |m: &Members<'_>| -> Vec<(String, Canon)> {
        (m.iter())
            .filter(|(k, _)| *k != "tasks" && *k != "nextCursor")
            .map(|(k, v)| (k.clone(), canon(v, 0)))
            .collect()
    };
    assert_eq!(
        others(&line),
        others(&out),
        "a tasks/list result changed beyond its tasks"
    );
}

/// Is `d` (delivered to `session`) the proxy's rebuilt answer to the first `initialize`:
/// the line answers some asker's routed id, and `session` asked under `d`'s id?
fn is_initialize_answer(
    world: &World<'_>,
    m: &Members<'_>,
    session: &SessionId,
    d: &Members<'_>,
) -> bool {
    let id = m.get("id").and_then(|v| string_of(v)).unwrap_or_default();
    let asker = d.get("id").map(|v| v.get().to_owned()).unwrap_or_default();
    let member = if m.contains_key("result") {
        "result"
    } else {
        "error"
    };
    let mut keys = vec!["id", "jsonrpc", member];
    keys.sort_unstable();
    world.init_askers.contains(&(*session, asker))
        && world.answers_initialize(&id)
        && d.keys().map(String::as_str).eq(keys)
        && d["jsonrpc"].get() == "\"2.0\""
        && m.get(member).map(|v| canon(v, 0)) == Some(canon(d[member], 0))
}

/// `value` split as a routed id of `session`: what follows `<sid>|`.
pub(crate) fn routed_rest<'v>(value: &'v str, session: &SessionId) -> Option<&'v str> {
    let (sid, rest) = value.split_once('|')?;
    (sid == session.as_str()).then_some(rest)
}

/// Is `value` the routed form of the raw id `original` of `session`?
pub(crate) fn is_routed_form(value: &str, session: &SessionId, original: &str) -> bool {
    let Some(rest) = routed_rest(value, session) else {
        return false;
    };
    match (rest.strip_prefix("n:"), rest.strip_prefix("s:")) {
        (Some(digits), _) => digits == original,
        (_, Some(text)) => serde_json::from_str::<String>(original).is_ok_and(|o| o == text),
        _ => false,
    }
}

/// The delivered `d` is the line `m` with the routed value at `path` restored from `rest`
/// (`n:<digits>` or `s:<string>`) and nothing else changed.
/// A backend error answering a `tasks/list`, delivered as the proxy's: its code (an
/// integer one, else -32603) and a message of the proxy's own, nothing else.
fn check_list_error(m: &Members<'_>, d: &Members<'_>) {
    let code_of = |answer: &Members<'_>| -> Option<i64> {
        let error = answer.get("error").and_then(|e| members(e.get()))?;
        error.get("code")?.get().parse().ok()
    };
    let backend = code_of(m).filter(|c| i32::try_from(*c).is_ok());
    assert_eq!(
        code_of(d),
        Some(backend.unwrap_or(-32603)),
        "a task list error's code"
    );
    let error = d
        .get("error")
        .and_then(|e| members(e.get()))
        .expect("an error");
    assert_eq!(
        error.len(),
        2,
        "a task list error carries only code and message"
    );
    let words = [
        "Parse error",
        "Invalid Request",
        "Method not found",
        "Invalid cursor",
    ];
    let text = error.get("message").and_then(|t| strict_string_of(t));
    assert!(
        (text.as_deref()).is_some_and(|t| words.contains(&t)
            || t == "Internal error"
            || t == "Task list unavailable"),
        "a task list error's message is the proxy's: {text:?}"
    );
}

fn check_restored(m: &Members<'_>, d: &Members<'_>, path: &[&str], rest: &str) {
    check_id_restored(d, path, rest);
    let mut before = Canon::Object(m.iter().map(|(k, v)| (k.clone(), canon(v, 0))).collect());
    let mut after = Canon::Object(d.iter().map(|(k, v)| (k.clone(), canon(v, 0))).collect());
    blank(&mut before, path);
    blank(&mut after, path);
    assert_eq!(
        before, after,
        "a delivered message changed beyond its routed value"
    );
}

/// The routed value at `path` of `d` is the client's own again (`rest`: what followed
/// `<sid>|`).
fn check_id_restored(d: &Members<'_>, path: &[&str], rest: &str) {
    let restored = at(d, path).expect("the restored member is there");
    if let Some(digits) = rest.strip_prefix("n:") {
        assert_eq!(restored.get(), digits, "integer not restored");
    } else if let Some(text) = rest.strip_prefix("s:") {
        assert_eq!(
            string_of(restored).as_deref(),
            Some(text),
            "string not restored"
        );
    } else {
        panic!("delivered a routed value of unknown kind {rest:?}");
    }
}

pub(crate) fn check_broadcast(message: &[u8], line_method: Option<&str>) {
    let ok = LIST_CHANGED.iter().any(|m| {
        message == format!(r#"{{"jsonrpc":"2.0","method":"{m}"}}"#).as_bytes()
            && line_method == Some(*m)
    });
    assert!(
        ok,
        "broadcast {:?} for a line with method {line_method:?}",
        String::from_utf8_lossy(message)
    );
}

/// A proxy line to the backend: the answer to a backend request (same id; `{}` for ping,
/// -32601 otherwise) or, after the first `initialize` succeeded, `notifications/initialized`.
fn check_reply(world: &World<'_>, line: Option<&Members<'_>>, reply: &[u8]) {
    let text = backend_line_text(reply);
    serde_json::from_str::<&RawValue>(text).expect("a reply is valid JSON");
    let r = members(text).expect("a reply is one JSON object");
    assert_eq!(
        r.get("jsonrpc").and_then(|v| string_of(v)).as_deref(),
        Some("2.0")
    );
    let m = line.expect("a reply answers a JSON object");
    let method = m.get("method").and_then(|v| string_of(v));
    let Some(method) = method else {
        // The answer to the first initialize: the proxy completes the handshake once.
        assert_eq!(reply, INITIALIZED_LINE, "unexpected proxy line");
        let id = m.get("id").and_then(|v| string_of(v)).unwrap_or_default();
        assert!(
            world.answers_initialize(&id),
            "initialized sent for response {id:?}"
        );
        assert!(m.contains_key("result"), "initialized after an error");
        return;
    };
    let id = m.get("id").expect("only requests are answered");
    assert_eq!(
        canon(r.get("id").expect("a reply has an id"), 0),
        canon(id, 0),
        "a reply answers another id"
    );
    if method == "ping" {
        assert_eq!(r.get("result").map(|v| v.get()), Some("{}"), "ping answer");
        assert!(!r.contains_key("error"));
    } else {
        assert!(!r.contains_key("result"), "a server request got a result");
        let code = r
            .get("error")
            .and_then(|e| at(&members(e.get())?, &["code"]));
        assert_eq!(
            code.map(|c| c.get()),
            Some("-32601"),
            "server request answer"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Shared helpers: fixture set-up and an independent reading of JSON.

fn setup_open(router: &mut Routing, sid: SessionId, principal: &Principal) {
    let n = (1..=u8::MAX)
        .find(|n| fixture_sid(*n) == sid)
        .expect("fixture sessions are numbered");
    assert_eq!(router.open(n, principal), sid);
}

fn setup_post(
    router: &mut Routing,
    sid: SessionId,
    principal: &Principal,
    body: &str,
) -> Vec<Action> {
    let (result, actions) = router.post(sid.as_str(), principal, body.as_bytes());
    result.expect("fixture bodies are accepted");
    actions
}

/// A backend line's text: UTF-8, one `\n` at the end and no other raw CR or LF.
pub(crate) fn backend_line_text(line: &[u8]) -> &str {
    let body = line
        .strip_suffix(b"\n")
        .expect("a backend line ends in \\n");
    assert!(
        !body.contains(&b'\n') && !body.contains(&b'\r'),
        "a raw newline inside a backend line"
    );
    std::str::from_utf8(body).expect("a backend line is UTF-8")
}

/// A message for a client: one JSON object, no raw CR or LF (one SSE `data:` line).
pub(crate) fn one_line_object(message: &[u8]) -> Members<'_> {
    assert!(
        !message.contains(&b'\n') && !message.contains(&b'\r'),
        "a raw newline in a client message"
    );
    let text = std::str::from_utf8(message).expect("a client message is UTF-8");
    serde_json::from_str::<&RawValue>(text).expect("a client message is valid JSON");
    members(text).expect("a client message is one JSON object")
}

/// An object's members as raw values (the last of duplicate keys wins).
pub(crate) type Members<'a> = BTreeMap<String, &'a RawValue>;

pub(crate) fn members(text: &str) -> Option<Members<'_>> {
    serde_json::from_str(text).ok()
}

/// The value at `path` of nested objects.
pub(crate) fn at<'a>(m: &Members<'a>, path: &[&str]) -> Option<&'a RawValue> {
    let (first, rest) = path.split_first()?;
    let mut value = *m.get(*first)?;
    for key in rest {
        value = *members(value.get())?.get(*key)?;
    }
    Some(value)
}

/// The value of a JSON string as serde_json (and so the router) reads it: `None` for a
/// lone surrogate escape. Used where the router itself reads a value (uris).
pub(crate) fn strict_string_of(raw: &RawValue) -> Option<String> {
    serde_json::from_str(raw.get()).ok()
}

/// The value of a JSON string. Lone surrogate escapes, which serde_json refuses but the
/// proxy (rightly) passes through byte for byte, become U+FFFD.
pub(crate) fn string_of(raw: &RawValue) -> Option<String> {
    let text = raw.get();
    if let Some(value) = strict_string_of(raw) {
        return Some(value);
    }
    let units = crate::model::utf16_of(text)?;
    Some(String::from_utf16_lossy(&units))
}

pub(crate) fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialise")
}

/// An integer literal: a JSON number without fraction or exponent.
fn is_integer(raw: &RawValue) -> bool {
    let text = raw.get();
    matches!(text.as_bytes().first(), Some(b'-' | b'0'..=b'9'))
        && !text.bytes().any(|b| matches!(b, b'.' | b'e' | b'E'))
}

/// An integer or a string: the id types the proxy routes.
pub(crate) fn is_id_like(raw: &RawValue) -> bool {
    is_integer(raw) || raw.get().starts_with('"')
}

/// A JSON value with whitespace and member order made irrelevant; leaves keep their raw
/// text (so escapes and number spellings must match exactly).
#[derive(Debug, PartialEq)]
enum Canon {
    Object(BTreeMap<String, Canon>),
    Array(Vec<Canon>),
    Leaf(String),
    /// A member the proxy was allowed to change.
    Edited,
}

const MAX_CANON_DEPTH: usize = 48;

fn canon(raw: &RawValue, depth: usize) -> Canon {
    canon_str(raw.get(), depth)
}

fn canon_text(text: &str) -> Canon {
    canon_str(text, 0)
}

fn canon_members(m: &Members<'_>) -> Canon {
    Canon::Object(m.iter().map(|(k, v)| (k.clone(), canon(v, 1))).collect())
}

fn canon_str(text: &str, depth: usize) -> Canon {
    let text = text.trim_matches([' ', '\t', '\n', '\r']);
    // Past the depth limit, compare the text itself: the proxy only ever turns raw CR and
    // LF (whitespace) into spaces.
    let leaf = || Canon::Leaf(text.replace(['\r', '\n'], " "));
    if depth > MAX_CANON_DEPTH {
        return leaf();
    }
    match text.as_bytes().first() {
        Some(b'{') => match serde_json::from_str::<BTreeMap<String, &RawValue>>(text) {
            Ok(m) => Canon::Object(
                m.into_iter()
                    .map(|(k, v)| (k, canon(v, depth + 1)))
                    .collect(),
            ),
            Err(_) => leaf(),
        },
        Some(b'[') => match serde_json::from_str::<Vec<&RawValue>>(text) {
            Ok(items) => Canon::Array(items.into_iter().map(|v| canon(v, depth + 1)).collect()),
            Err(_) => leaf(),
        },
        _ => leaf(),
    }
}

/// Marks the member at `path` (if present) as one the proxy may change.
fn blank(canon: &mut Canon, path: &[&str]) {
    let Some((first, rest)) = path.split_first() else {
        *canon = Canon::Edited;
        return;
    };
    if let Canon::Object(members) = canon {
        if let Some(next) = members.get_mut(*first) {
            blank(next, rest);
        }
    }
}
