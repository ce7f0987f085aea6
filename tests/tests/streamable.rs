//! End-to-end: Streamable HTTP on `/mcp` (SPEC section 7) on both binaries, beside `/sse`:
//! every status in its order, answers as a JSON body or a stream, the in-flight table, the
//! GET stream, DELETE, idle sessions, request timeouts, hang-ups, CORS, a strict backend, and
//! isolation from legacy sessions that use the same ids and progress tokens.

use std::time::Duration;

use serde_json::{json, Value};
use switchboard_tests::mcp::{self, initialize_body};
use switchboard_tests::{
    backend_seen_id, bearer, echoed_args, open_session, request_events, suite, Answer, Body,
    Events, McpSession, Proxy, Response, Target, SESSION_NOT_FOUND, WAIT,
};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");
const ALICE: (&str, &str) = ("alice", "alice-token-0123456789abcdef");
const BOB: (&str, &str) = ("bob", "bob-token-fedcba9876543210xyz");

/// Asks for an event-stream answer only, so a POST returns as soon as its stream opens.
const STREAM_ONLY: (&str, &str) = ("Accept", "text/event-stream");

fn proxy(target: Target, args: &[&str]) -> Proxy {
    Proxy::builder(target)
        .backend([BACKEND])
        .tokens(&[ALICE, BOB])
        .args(args.iter().copied())
        .record()
        .start()
}

fn start(p: &Proxy, who: (&str, &str)) -> McpSession {
    McpSession::start(p, Some(who.1))
}

fn call_body(id: &Value, tool: &str, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}})
        .to_string()
}

/// A call that must be refused: its marker may never reach the backend.
fn marked(id: u64) -> String {
    call_body(&json!(id), "echo", json!({"m": "MARK-REJECTED"}))
}

/// POSTs to `/mcp` as `token`, naming `sid` when given, with `extra` headers.
fn raw(p: &Proxy, token: &str, sid: Option<&str>, extra: &[(&str, &str)], body: &str) -> Answer {
    let auth = bearer(token);
    let mut headers = vec![("Authorization", auth.as_str())];
    if let Some(sid) = sid {
        headers.push(("Mcp-Session-Id", sid));
    }
    headers.extend_from_slice(extra);
    mcp::post(p.addr, "/mcp", &headers, body)
}

/// The whole answer, asserting its status; the body as JSON when it has one.
fn refused(answer: Answer, status: u16, what: &str) -> Value {
    let r = whole(answer, what);
    assert_eq!(r.status, status, "{what}: {}", r.text());
    if r.body.is_empty() {
        Value::Null
    } else {
        r.json()
    }
}

fn whole(answer: Answer, what: &str) -> Response {
    match answer {
        Answer::Whole(r) => r,
        Answer::Stream(e) => panic!("{what}: answered with a stream ({})", e.head.status),
    }
}

fn stream(answer: Answer, what: &str) -> Events {
    match answer {
        Answer::Stream(e) => e,
        Answer::Whole(r) => panic!("{what}: {} {}", r.status, r.text()),
    }
}

/// A GET of `/mcp` that must be refused.
fn get_refused(p: &Proxy, headers: &[(&str, &str)], status: u16, what: &str) -> Value {
    match request_events(p.addr, "GET", "/mcp", headers, b"") {
        Ok(e) => panic!("{what}: a stream opened ({})", e.head.status),
        Err(r) => {
            assert_eq!(r.status, status, "{what}: {}", r.text());
            r.json()
        }
    }
}

fn cancelled_upstream(p: &Proxy, routed: &str) -> bool {
    p.recorded()
        .iter()
        .any(|l| l.contains("notifications/cancelled") && l.contains(routed))
}

// ---------------------------------------------------------------------------------------
// POST, GET and DELETE: every status in its order
// ---------------------------------------------------------------------------------------

fn post_refusals_follow_spec_order(target: Target) {
    let p = proxy(target, &["--max-body", "64KiB"]);
    let a = start(&p, ALICE);
    let b = start(&p, BOB);
    let sid = Some(a.sid.as_str());
    let token = ALICE.1;

    let r = mcp::post(p.addr, "/mcp", &[], &initialize_body(1));
    refused(r, 401, "no token");
    let r = raw(&p, "not-a-token", sid, &[], &marked(1));
    refused(r, 401, "a wrong token");
    let r = raw(
        &p,
        token,
        sid,
        &[("Origin", "https://evil.example")],
        &marked(1),
    );
    refused(r, 403, "a foreign Origin");
    let r = raw(&p, token, sid, &[("Host", "evil.example")], &marked(1));
    refused(r, 403, "a foreign Host (DNS rebinding)");
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"MARK-REJECTED","params":"{}"}}"#,
        "x".repeat(70_000)
    );
    let r = raw(
        &p,
        token,
        sid,
        &[("Content-Type", "text/plain"), ("Accept", "text/html")],
        &big,
    );
    refused(
        r,
        413,
        "a body past --max-body, with every later check failing too",
    );
    let r = raw(
        &p,
        token,
        sid,
        &[("Content-Type", "text/plain"), ("Accept", "text/html")],
        &marked(2),
    );
    refused(r, 415, "Content-Type text/plain");
    let r = raw(
        &p,
        token,
        sid,
        &[
            ("Accept", "text/html"),
            ("MCP-Protocol-Version", "1999-01-01"),
        ],
        &marked(3),
    );
    refused(r, 406, "Accept text/html");
    let r = raw(
        &p,
        token,
        sid,
        &[("MCP-Protocol-Version", "1999-01-01")],
        &marked(4),
    );
    refused(r, 400, "an unknown MCP-Protocol-Version");
    // A 2026-era request is served as one (SPEC 13; `--modern off` keeps the plain -32600 a
    // dual-era client falls back on, tests/modern.rs): without the revision's required
    // `_meta` fields it is -32602.
    let r = raw(
        &p,
        token,
        sid,
        &[("MCP-Protocol-Version", "2026-07-28")],
        &marked(5),
    );
    assert_eq!(
        refused(r, 400, "version 2026-07-28")["error"]["code"],
        -32602
    );
    let meta = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list",
        "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
    let r = raw(&p, token, None, &[], &meta.to_string());
    assert_eq!(
        refused(r, 400, "a sessionless 2026 request")["error"]["code"],
        -32602
    );

    // The session rules.
    refused(
        raw(&p, token, None, &[], &marked(7)),
        400,
        "a request without a session",
    );
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    refused(
        raw(&p, token, None, &[], note),
        400,
        "a notification without a session",
    );
    refused(
        raw(&p, token, sid, &[], &initialize_body(8)),
        400,
        "initialize naming a session",
    );
    let unknown = "00000000-0000-4000-8000-000000000000";
    let mut legacy = open_session(&p, Some(token));
    legacy.initialize();
    for (what, s) in [
        ("an unknown", unknown),
        ("another principal's", b.sid.as_str()),
        ("a legacy", legacy.sid.as_str()),
    ] {
        let r = whole(raw(&p, token, Some(s), &[], &marked(9)), what);
        assert_eq!(
            (r.status, r.text().as_str()),
            (404, SESSION_NOT_FOUND),
            "{what} session"
        );
    }
    // And the other way: a Streamable sid is no legacy session.
    let r = p.request(
        "POST",
        &format!("/messages?session_id={}", a.sid),
        &[
            ("Authorization", &bearer(token)),
            ("Content-Type", "application/json"),
        ],
        Body::json(&marked(10)),
    );
    assert_eq!(r.status, 404, "{}", r.text());

    // Admission as SPEC 1.
    for (what, body) in [
        ("a batch", format!("[{}]", marked(11))),
        (
            "a client response",
            r#"{"jsonrpc":"2.0","id":12,"result":{"m":"MARK-REJECTED"}}"#.to_owned(),
        ),
        (
            "a fractional id",
            r#"{"jsonrpc":"2.0","id":1.5,"method":"MARK-REJECTED"}"#.to_owned(),
        ),
        (
            "malformed JSON",
            r#"{"jsonrpc":"2.0","id":13,"method":"MARK-REJECTED""#.to_owned(),
        ),
    ] {
        refused(a.post(&body), 400, what);
    }

    // What passes: any known version (not only the negotiated one), none, `*/*`, a
    // notification (202, empty).
    let ok = raw(
        &p,
        token,
        sid,
        &[("MCP-Protocol-Version", "2025-03-26")],
        &call_body(&json!(20), "echo", json!({"v": 1})),
    );
    assert_eq!(ok.response().1["id"], 20);
    let ok = raw(
        &p,
        token,
        sid,
        &[("Accept", "*/*")],
        &call_body(&json!(21), "echo", json!({"v": 2})),
    );
    assert_eq!(whole(ok, "Accept */*").json()["id"], 21);
    let r = whole(
        a.post(r#"{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}"#),
        "a notification",
    );
    assert_eq!((r.status, r.body.len()), (202, 0));
    // The refused ones disturbed nobody.
    assert_eq!(
        echoed_args(&a.call(json!(22), "echo", json!({"still": "a"})))["still"],
        "a"
    );
    assert_eq!(
        echoed_args(&b.call(json!(22), "echo", json!({"still": "b"})))["still"],
        "b"
    );
    p.assert_nothing_rejected_reached_the_backend();
}

/// A JSON body when the client takes JSON and the request has no progress token; an event
/// stream otherwise.
fn answer_forms(target: Target) {
    let p = proxy(target, &[]);
    let a = start(&p, ALICE);
    let r = whole(
        a.post(&call_body(&json!(1), "echo", json!({"form": "json"}))),
        "JSON answer",
    );
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .unwrap_or("")
            .starts_with("application/json"),
        "{:?}",
        r.headers
    );
    assert_eq!(echoed_args(&r.json())["form"], "json");

    let e = stream(
        a.post_with(
            &[STREAM_ONLY],
            &call_body(&json!(2), "echo", json!({"form": "sse"})),
        ),
        "SSE answer",
    );
    assert_eq!(e.head.header("cache-control"), Some("no-cache"));
    assert_eq!(e.head.header("x-accel-buffering"), Some("no"));
    let (progress, response) = Answer::Stream(e).response();
    assert!(progress.is_empty());
    assert_eq!(
        (
            response["id"].clone(),
            echoed_args(&response)["form"].clone()
        ),
        (json!(2), json!("sse"))
    );
}

fn in_flight_ids_409_and_max_inflight_429(target: Target) {
    let p = proxy(target, &["--max-inflight", "2"]);
    let a = start(&p, ALICE);
    let slow = |id: Value, ms: u64, n: &str| call_body(&id, "delay", json!({"ms": ms, "n": n}));
    let first = stream(
        a.post_with(&[STREAM_ONLY], &slow(json!(1), 1500, "first")),
        "the first call",
    );
    let dup = refused(
        a.post(&slow(json!(1), 0, "dup")),
        409,
        "an id already in flight",
    );
    assert_eq!(dup["id"], 1, "the 409 carries the id: {dup}");
    assert!(dup["error"]["code"].is_i64(), "{dup}");
    // The string "1" is another id.
    let second = stream(
        a.post_with(&[STREAM_ONLY], &slow(json!("1"), 1500, "second")),
        "id \"1\"",
    );
    refused(
        a.post(&slow(json!(3), 0, "third")),
        429,
        "past --max-inflight 2",
    );
    // Another session has its own table.
    let b = start(&p, ALICE);
    assert_eq!(
        echoed_args(&b.call(json!(1), "echo", json!({"n": "b"})))["n"],
        "b"
    );

    let (_, r1) = Answer::Stream(first).response();
    assert_eq!(
        (r1["id"].clone(), echoed_args(&r1)["n"].clone()),
        (json!(1), json!("first"))
    );
    let (_, r2) = Answer::Stream(second).response();
    assert_eq!(
        (r2["id"].clone(), echoed_args(&r2)["n"].clone()),
        (json!("1"), json!("second"))
    );
    assert_eq!(
        echoed_args(&a.call(json!(1), "echo", json!({"n": "again"})))["n"],
        "again"
    );
    assert!(
        !p.recorded()
            .iter()
            .any(|l| l.contains("\"dup\"") || l.contains("\"third\"")),
        "a refused call reached the backend"
    );
}

fn get_stream_rules(target: Target) {
    let p = proxy(target, &[]);
    let a = start(&p, ALICE);
    let auth = bearer(ALICE.1);
    let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&str, &str)> {
        let mut h = vec![
            ("Authorization", auth.as_str()),
            ("Mcp-Session-Id", a.sid.as_str()),
        ];
        h.extend_from_slice(extra);
        h
    };
    get_refused(
        &p,
        &with(&[("Accept", "application/json")]),
        406,
        "GET without text/event-stream",
    );
    get_refused(
        &p,
        &[("Authorization", &auth), ("Accept", "text/event-stream")],
        400,
        "GET without a session",
    );
    let unknown = [
        ("Authorization", auth.as_str()),
        ("Accept", "text/event-stream"),
        ("Mcp-Session-Id", "nope"),
    ];
    let body = get_refused(&p, &unknown, 404, "GET of an unknown session");
    assert_eq!(
        body,
        serde_json::from_str::<Value>(SESSION_NOT_FOUND).unwrap()
    );
    get_refused(
        &p,
        &with(&[
            ("Accept", "text/event-stream"),
            ("MCP-Protocol-Version", "1999-01-01"),
        ]),
        400,
        "GET with a bad version",
    );

    let mut first = a.get_stream();
    assert_eq!(first.head.status, 200);
    let mut second = a.get_stream();
    assert_eq!(
        first.rest_until_closed(WAIT),
        Some(vec![]),
        "a new GET ends the old one"
    );
    // A call's response never reaches the GET stream: the list_changed after it comes first.
    let lines =
        json!({"lines": [{"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}]});
    a.call(json!(1), "emit", lines);
    let m = second
        .next_message(WAIT)
        .expect("list_changed on the GET stream");
    assert_eq!(
        m,
        json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    );
}

fn delete_ends_the_session_and_cancels_upstream(target: Target) {
    let p = proxy(target, &[]);
    let a = start(&p, ALICE);
    let b = start(&p, ALICE);
    let mut get = a.get_stream();
    let mut slow = stream(
        a.post_with(
            &[STREAM_ONLY],
            &call_body(&json!(42), "delay", json!({"ms": 5000})),
        ),
        "a slow call",
    );
    p.wait_recorded("the slow call", |l| l.contains("\"ms\":5000"));

    let r = a.delete();
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(
        get.rest_until_closed(WAIT),
        Some(vec![]),
        "DELETE ends the GET stream"
    );
    let rest = slow
        .rest_until_closed(WAIT)
        .expect("DELETE ends the request's stream");
    assert!(rest.iter().all(|m| m.get("result").is_none()), "{rest:?}");
    let routed = format!("{}|n:42", a.sid);
    p.wait_recorded("the cancellation of the call in flight", |l| {
        l.contains("notifications/cancelled") && l.contains(&routed)
    });

    let r = whole(
        a.post(&call_body(&json!(43), "echo", json!({}))),
        "POST after DELETE",
    );
    assert_eq!((r.status, r.text().as_str()), (404, SESSION_NOT_FOUND));
    let h = [
        ("Authorization", bearer(ALICE.1)),
        ("Accept", "text/event-stream".into()),
        ("Mcp-Session-Id", a.sid.clone()),
    ];
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    get_refused(&p, &h, 404, "GET after DELETE");
    assert_eq!(a.delete().status, 404, "a second DELETE");
    // The other session of the same principal is untouched.
    assert_eq!(
        echoed_args(&b.call(json!(42), "echo", json!({"b": 1})))["b"],
        1
    );
}

// ---------------------------------------------------------------------------------------
// Backend to clients: progress, list_changed, isolation from legacy sessions
// ---------------------------------------------------------------------------------------

/// The same id and the same progress token from a Streamable and a legacy session: each
/// gets its own progress, on its own stream, before its own result.
fn progress_on_the_post_stream_before_the_result(target: Target) {
    let p = proxy(target, &[]);
    let a = start(&p, ALICE);
    let mut legacy = open_session(&p, Some(ALICE.1));
    legacy.initialize();
    for token in [json!("tok"), json!(99)] {
        let body = |who: &str| {
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "progress", "arguments": {"who": who}, "_meta": {"progressToken": token}}})
        };
        legacy.send(&body("legacy"));
        // A progress token asks for a stream even though JSON is accepted.
        let answer = stream(
            a.post(&body("mcp").to_string()),
            "a call with a progress token",
        );
        let (progress, response) = Answer::Stream(answer).response();
        assert_eq!(progress.len(), 1, "{progress:?}");
        assert_eq!(progress[0]["method"], "notifications/progress");
        assert_eq!(
            progress[0]["params"]["progressToken"], token,
            "token restored"
        );
        assert_eq!(
            (
                response["id"].clone(),
                echoed_args(&response)["who"].clone()
            ),
            (json!(7), json!("mcp"))
        );

        let m = legacy.expect_message("legacy progress");
        assert_eq!(
            (m["method"].clone(), m["params"]["progressToken"].clone()),
            (json!("notifications/progress"), token.clone())
        );
        let m = legacy.expect_message("legacy result");
        assert_eq!(
            (m["id"].clone(), echoed_args(&m)["who"].clone()),
            (json!(7), json!("legacy"))
        );
    }
    legacy.sync();
}

/// list_changed reaches each session's GET stream once (method only), the legacy streams
/// too, and is never replayed to a GET stream opened later.
fn list_changed_once_per_session_on_the_get_stream(target: Target) {
    let p = proxy(target, &[]);
    let a = start(&p, ALICE);
    let b = start(&p, BOB);
    let late = start(&p, BOB);
    let (mut ga, mut gb) = (a.get_stream(), b.get_stream());
    let mut legacy = open_session(&p, Some(BOB.1));
    legacy.initialize();
    let tools = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {"secret": "x"}});
    let prompts = json!({"jsonrpc": "2.0", "method": "notifications/prompts/list_changed"});
    a.call(json!(1), "emit", json!({"lines": [tools, prompts.clone()]}));
    // The prompts one is the barrier: nothing came between, so the first came once.
    let want = [
        Some(json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})),
        Some(prompts.clone()),
    ];
    let got_a = [ga.next_message(WAIT), ga.next_message(WAIT)];
    let got_b = [gb.next_message(WAIT), gb.next_message(WAIT)];
    let got_legacy = [legacy.next_message(WAIT), legacy.next_message(WAIT)];
    for (who, got) in [("a", got_a), ("b", got_b), ("legacy", got_legacy)] {
        assert_eq!(got, want, "{who}");
    }
    let mut g = late.get_stream();
    let resources = json!({"jsonrpc": "2.0", "method": "notifications/resources/list_changed"});
    late.call(json!(1), "emit", json!({"lines": [resources]}));
    assert_eq!(
        g.next_message(WAIT),
        Some(resources),
        "nothing replayed before it"
    );
}

/// `resources/updated` reaches the GET stream of each subscribed session, of either kind,
/// and no other; DELETE releases the session's subscriptions (the last one unsubscribes
/// upstream).
fn resources_updated_reaches_subscribed_get_streams(target: Target) {
    let p = proxy(target, &[]);
    let (a, b) = (start(&p, ALICE), start(&p, BOB));
    let (mut ga, mut gb) = (a.get_stream(), b.get_stream());
    let mut legacy = open_session(&p, Some(BOB.1));
    legacy.initialize();
    let subscribe = |s: &McpSession, id: u64, uri: &str| {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "resources/subscribe", "params": {"uri": uri}});
        let (_, m) = s.post(&body.to_string()).response();
        assert_eq!(m["result"], json!({}), "subscribe {uri}: {m}");
    };
    subscribe(&a, 1, "test://x");
    subscribe(&a, 2, "test://both");
    subscribe(&b, 1, "test://both");
    let m = legacy.request(
        json!(1),
        "resources/subscribe",
        json!({"uri": "test://legacy"}),
    );
    assert_eq!(m["result"], json!({}), "{m}");

    let updated = |uri: &str| json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}});
    let barrier = json!({"jsonrpc": "2.0", "method": "notifications/prompts/list_changed"});
    let lines = [
        updated("test://x"),
        updated("test://both"),
        updated("test://legacy"),
        updated("test://none"),
        barrier.clone(),
    ];
    b.call(json!(2), "emit", json!({"lines": lines}));
    let uri_of = |m: Option<Value>| m.map(|m| m["params"]["uri"].clone());
    assert_eq!(uri_of(ga.next_message(WAIT)), Some(json!("test://x")));
    assert_eq!(uri_of(ga.next_message(WAIT)), Some(json!("test://both")));
    assert_eq!(
        ga.next_message(WAIT),
        Some(barrier.clone()),
        "a got nothing else"
    );
    assert_eq!(uri_of(gb.next_message(WAIT)), Some(json!("test://both")));
    assert_eq!(
        gb.next_message(WAIT),
        Some(barrier.clone()),
        "b got nothing else"
    );
    assert_eq!(
        uri_of(legacy.next_message(WAIT)),
        Some(json!("test://legacy"))
    );
    assert_eq!(
        legacy.next_message(WAIT),
        Some(barrier),
        "the legacy session got nothing else"
    );

    // a's DELETE: test://x was a's alone, test://both is still b's.
    assert_eq!(a.delete().status, 204);
    p.wait_recorded("the unsubscribe of test://x after DELETE", |l| {
        l.contains("resources/unsubscribe") && l.contains("test://x")
    });
    assert!(
        !p.recorded()
            .iter()
            .any(|l| l.contains("resources/unsubscribe") && l.contains("test://both")),
        "test://both unsubscribed while b still watches it"
    );
}

/// A legacy session and two Streamable ones (one of the same principal) send the same ids,
/// and the backend answers in reverse order: each gets exactly its own answers.
fn colliding_ids_across_transports_reordered(target: Target) {
    let p = proxy(target, &[]);
    let ids = [
        json!(1),
        json!("1"),
        json!(9007199254740993u64),
        json!("x|n:1"),
    ];
    let mut legacy = open_session(&p, Some(ALICE.1));
    legacy.initialize();
    let sessions = [("mcp-alice", start(&p, ALICE)), ("mcp-bob", start(&p, BOB))];
    let mut streams = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let ms = (ids.len() - i) as u64 * 80;
        legacy.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "delay", "arguments": {"ms": ms, "who": "legacy", "id": id}}}));
        for (n, (who, s)) in sessions.iter().enumerate() {
            let args = json!({"ms": ms + 20 * n as u64 + 10, "who": who, "id": id});
            let e = stream(
                s.post_with(&[STREAM_ONLY], &call_body(id, "delay", args)),
                who,
            );
            streams.push((*who, id.clone(), s.sid.clone(), e));
        }
    }
    for (who, id, sid, e) in streams {
        let (_, m) = Answer::Stream(e).response();
        assert_eq!(m["id"], id, "{who}: exact id, type and value");
        assert_eq!(
            echoed_args(&m)["who"],
            who,
            "{who} got someone else's answer: {m}"
        );
        let seen = backend_seen_id(&m);
        assert!(
            seen.as_str()
                .is_some_and(|s| s.starts_with(&format!("{sid}|"))),
            "{who}: routed via {seen}"
        );
    }
    for _ in &ids {
        let m = legacy.expect_message("legacy answers");
        assert_eq!(echoed_args(&m)["who"], "legacy", "{m}");
        assert_eq!(echoed_args(&m)["id"], m["id"], "{m}");
    }
    legacy.sync();
}

// ---------------------------------------------------------------------------------------
// Waiting: idle sessions, request timeouts, hang-ups, backend exit
// ---------------------------------------------------------------------------------------

fn idle_sessions_expire_but_watched_ones_stay(target: Target) {
    let p = proxy(target, &["--session-idle", "1s", "--keepalive", "1s"]);
    // The watched session first: its idle time is up before the idle one's, so once the idle
    // one is closed the watched one would have been too.
    let watched = start(&p, ALICE);
    let get = watched.get_stream();
    let idle = start(&p, ALICE);
    p.wait_metric("switchboard_sessions_closed_total", |n| n >= 1.0);
    let r = whole(
        idle.post(&call_body(&json!(1), "echo", json!({}))),
        "an idle session",
    );
    assert_eq!(
        (r.status, r.text().as_str()),
        (404, SESSION_NOT_FOUND),
        "past --session-idle"
    );
    assert_eq!(
        echoed_args(&watched.call(json!(1), "echo", json!({"w": 1})))["w"],
        1,
        "an open GET stream keeps it"
    );
    get.shutdown();
}

fn request_timeout_answers_32001_and_cancels_upstream(target: Target) {
    let p = proxy(target, &["--request-timeout", "1s"]);
    let a = start(&p, ALICE);
    let r = a.call(json!(5), "delay", json!({"ms": 2500}));
    assert_eq!(r["error"]["code"], -32001, "{r}");
    assert_eq!(r["error"]["message"], "request timed out", "{r}");
    let routed = format!("{}|n:5", a.sid);
    p.wait_recorded("the cancellation", |l| {
        l.contains("notifications/cancelled") && l.contains(&routed)
    });
    // The late answer goes nowhere; the session carries on.
    p.wait_metric(NOT_IN_FLIGHT, |n| n >= 1.0);
    assert_eq!(
        echoed_args(&a.call(json!(6), "echo", json!({"after": 1})))["after"],
        1
    );
}

/// A disconnect is not a cancellation: the backend is not told, the late answer is dropped,
/// and the session carries on.
fn client_hang_up_mid_request(target: Target) {
    let p = proxy(target, &[]);
    let a = start(&p, ALICE);
    let gone = stream(
        a.post_with(
            &[STREAM_ONLY],
            &call_body(&json!(9), "delay", json!({"ms": 600})),
        ),
        "the call",
    );
    p.wait_recorded("the call", |l| l.contains("\"ms\":600"));
    let delivered = p.metric(DELIVERED).unwrap_or(0.0);
    gone.shutdown();
    drop(gone);
    // The late answer arrives (kept for a resumption that never comes); then a call of the
    // same session is a barrier (the backend records its stdin in order): a cancellation
    // would be recorded before it.
    p.wait_metric(DELIVERED, |n| n > delivered);
    let m = a.call(json!(9), "echo", json!({"after": "hang-up"}));
    assert_eq!(echoed_args(&m)["after"], "hang-up", "{m}");
    assert!(
        !cancelled_upstream(&p, &format!("{}|n:9", a.sid)),
        "a hang-up cancelled upstream"
    );
}

/// Backend answers dropped because their request is no longer awaited.
const NOT_IN_FLIGHT: &str = r#"switchboard_drops_total{reason="not_in_flight",method=""}"#;

/// Messages the proxy put on a session's stream.
const DELIVERED: &str = r#"switchboard_messages_total{direction="proxy_to_session"}"#;

/// SPEC 12: with sessions kept (the default), a backend crash answers the request in flight
/// with -32603 and nothing else changes for the client: the same Streamable and legacy
/// sessions work against the restarted backend without initializing again, and the legacy
/// stream hears that the lists may have changed.
/// SPEC 12: a client whose connection drops mid-request resumes with Last-Event-ID and
/// gets what it missed, progress produced after the drop and the response included, exactly
/// once, without sending the request again; ids that name no stream of the session are 400.
fn a_dropped_stream_resumes_with_last_event_id(target: Target) {
    let p = proxy(target, &[]);
    let a = start(&p, ALICE);
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "delay", "arguments": {"ms": 1500}, "_meta": {"progressToken": "tok"}}});
    let version = ("MCP-Protocol-Version", "2025-11-25");
    let mut events = stream(
        raw(
            &p,
            ALICE.1,
            Some(&a.sid),
            &[STREAM_ONLY, version],
            &call.to_string(),
        ),
        "a slow call",
    );
    let primed = events.priming_id(WAIT);
    p.wait_recorded("the slow call", |l| l.contains("\"ms\":1500"));
    events.shutdown();
    drop(events);
    // Progress for the dropped stream, produced while its client is away.
    let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": format!("{}|s:tok", a.sid), "progress": 1}});
    a.call(json!(8), "emit", json!({"lines": [progress]}));
    let auth = bearer(ALICE.1);
    let resume = |last: &str| {
        request_events(
            p.addr,
            "GET",
            "/mcp",
            &[
                ("Authorization", auth.as_str()),
                ("Mcp-Session-Id", a.sid.as_str()),
                ("Accept", "text/event-stream"),
                ("Last-Event-ID", last),
            ],
            b"",
        )
    };
    let mut resumed = resume(&primed).unwrap_or_else(|r| panic!("resume refused: {}", r.text()));
    let got = resumed
        .rest_until_closed(Duration::from_secs(30))
        .expect("the resumed stream ends after the response");
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["method"], json!("notifications/progress"), "{got:?}");
    assert_eq!(got[0]["params"]["progressToken"], json!("tok"), "{got:?}");
    assert_eq!(
        (got[1]["id"].clone(), echoed_args(&got[1])["ms"].clone()),
        (json!(7), json!(1500))
    );
    for bad in ["999.1", "not-an-id"] {
        match resume(bad) {
            Err(r) => assert_eq!(r.status, 400, "{bad}: {}", r.text()),
            Ok(e) => panic!("{bad}: a stream opened ({})", e.head.status),
        }
    }
    // Another principal's session cannot name it: 404.
    let bob = bearer(BOB.1);
    let foreign = request_events(
        p.addr,
        "GET",
        "/mcp",
        &[
            ("Authorization", bob.as_str()),
            ("Mcp-Session-Id", a.sid.as_str()),
            ("Accept", "text/event-stream"),
            ("Last-Event-ID", primed.as_str()),
        ],
        b"",
    );
    assert_eq!(foreign.err().map(|r| r.status), Some(404));
}

fn backend_exit_keeps_sessions(target: Target) {
    let p = proxy(target, &[]);
    let a = start(&p, ALICE);
    let mut legacy = open_session(&p, Some(BOB.1));
    legacy.initialize();
    let slow = stream(
        a.post_with(
            &[STREAM_ONLY],
            &call_body(&json!(1), "delay", json!({"ms": 5000})),
        ),
        "a slow call",
    );
    p.wait_recorded("the slow call", |l| l.contains("\"ms\":5000"));
    let _ = a.post(&call_body(&json!(2), "exit", json!({"code": 3})));
    let (_, r) = Answer::Stream(slow).response();
    assert_eq!(
        (r["id"].clone(), r["error"]["code"].clone()),
        (json!(1), json!(-32603)),
        "{r}"
    );
    // The same session, no new initialize: answered by the restarted backend (the POST
    // waits for it while it starts).
    assert_eq!(
        echoed_args(&a.call(json!(3), "echo", json!({"n": 3})))["n"],
        3,
        "the Streamable session after the restart"
    );
    let heard: Vec<Value> = (0..3)
        .map(|_| legacy.expect_message("a list_changed after the restart"))
        .collect();
    for (m, what) in heard.iter().zip(["tools", "resources", "prompts"]) {
        let method = format!("notifications/{what}/list_changed");
        assert_eq!(m, &json!({"jsonrpc": "2.0", "method": method}));
    }
    let r = legacy.request(
        json!(4),
        "tools/call",
        json!({"name": "echo", "arguments": {"n": 4}}),
    );
    assert_eq!(
        echoed_args(&r)["n"],
        4,
        "the legacy session after the restart"
    );
    let (_, h) = p.health();
    assert_eq!(h["sessions"], json!(2), "{h}");
}

fn backend_exit_answers_in_flight_and_ends_sessions(target: Target) {
    let p = proxy(target, &["--on-backend-exit", "close-sessions"]);
    let a = start(&p, ALICE);
    let slow = stream(
        a.post_with(
            &[STREAM_ONLY],
            &call_body(&json!(1), "delay", json!({"ms": 5000})),
        ),
        "a slow call",
    );
    p.wait_recorded("the slow call", |l| l.contains("\"ms\":5000"));
    let killer = start(&p, BOB);
    let _ = killer.post(&call_body(&json!(1), "exit", json!({"code": 3})));
    let (_, r) = Answer::Stream(slow).response();
    assert_eq!(
        (r["id"].clone(), r["error"]["code"].clone()),
        (json!(1), json!(-32603)),
        "{r}"
    );
    let r = whole(
        a.post(&call_body(&json!(2), "echo", json!({}))),
        "after the backend exit",
    );
    assert_eq!((r.status, r.text().as_str()), (404, SESSION_NOT_FOUND));
    // A new session works once the backend is back.
    p.wait_health(200, WAIT);
    let fresh = start(&p, ALICE);
    assert_eq!(
        echoed_args(&fresh.call(json!(1), "echo", json!({"n": 1})))["n"],
        1
    );
}

/// Requests waiting for JSON answers, more than the blocking binary has handler threads,
/// hold up no one: health, new sessions of both kinds and other calls are answered while
/// all of them still wait.
fn json_waits_do_not_starve_other_requests(target: Target) {
    const SESSIONS: usize = 3;
    const WAITING: usize = 200;
    // Every wait at the backend at once: a window past them all (with the default one,
    // SPEC 12's fair share of it gives the fresh session its place: fair_share_window.txt).
    let p = proxy(target, &["--backend-window", "1000"]);
    let sessions: Vec<McpSession> = (0..SESSIONS).map(|_| start(&p, ALICE)).collect();
    let answered = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let waits: Vec<_> = sessions
            .iter()
            .flat_map(|s| (0..WAITING).map(move |n| (s, n)))
            .map(|(s, n)| {
                let answered = &answered;
                scope.spawn(move || {
                    let m = s.call(json!(n), "delay", json!({"ms": 4000, "n": n}));
                    answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    assert_eq!(echoed_args(&m)["n"], n, "{m}");
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + WAIT;
        let waiting = || {
            p.recorded()
                .iter()
                .filter(|l| l.contains("\"ms\":4000"))
                .count()
        };
        while waiting() < SESSIONS * WAITING {
            assert!(
                std::time::Instant::now() < deadline,
                "only {} of the calls reached the backend",
                waiting()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let (status, _) = p.health();
        assert!(status == 200 || status == 503, "/health: {status}");
        let fresh = start(&p, BOB);
        assert_eq!(
            echoed_args(&fresh.call(json!(1), "echo", json!({"f": 1})))["f"],
            1
        );
        let mut legacy = open_session(&p, Some(BOB.1));
        legacy.initialize();
        assert_eq!(
            answered.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "the other requests were answered only after the waiting ones"
        );
        for w in waits {
            w.join().expect("a waiting call");
        }
    });
}

// ---------------------------------------------------------------------------------------
// Sessions: the shared cap, one initialize upstream, CORS
// ---------------------------------------------------------------------------------------

fn both_kinds_count_against_max_sessions(target: Target) {
    let p = proxy(target, &["--max-sessions", "2"]);
    let mut legacy = open_session(&p, Some(ALICE.1));
    let a = start(&p, ALICE);
    let r = whole(
        raw(&p, ALICE.1, None, &[], &initialize_body(1)),
        "a third session",
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.header("retry-after").is_some(), "503 without Retry-After");
    assert_eq!(a.delete().status, 204);
    let b = start(&p, BOB);
    legacy.initialize();
    assert_eq!(
        echoed_args(&b.call(json!(1), "echo", json!({"b": 1})))["b"],
        1
    );
}

/// A backend that refuses a second `initialize` (as the Go SDK does) serves ten
/// Streamable sessions started at once: the proxy sends it one.
fn strict_backend_serves_ten_streamable_sessions(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND, "--fail-second-initialize"])
        .record()
        .start();
    std::thread::scope(|scope| {
        let clients: Vec<_> = (0..10)
            .map(|n| {
                let p = &p;
                scope.spawn(move || {
                    let s = McpSession::start(p, None);
                    let m = s.call(json!(1), "echo", json!({"n": n}));
                    assert_eq!(echoed_args(&m)["n"], n, "{m}");
                    s.sid
                })
            })
            .collect();
        let mut sids: Vec<String> = clients
            .into_iter()
            .map(|c| c.join().expect("client"))
            .collect();
        sids.sort();
        sids.dedup();
        assert_eq!(sids.len(), 10, "ten distinct sessions");
    });
    assert_eq!(
        p.recorded_initializes(),
        1,
        "one initialize reached the backend"
    );
}

fn cors_preflight_and_answers(target: Target) {
    let p = proxy(target, &[]);
    let origin = "http://localhost:5173";
    for path in ["/mcp", "/messages"] {
        let r = p.request(
            "OPTIONS",
            path,
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "content-type, mcp-session-id",
                ),
            ],
            Body::None,
        );
        assert_eq!(r.status, 204, "preflight of {path}: {}", r.text());
        assert_eq!(r.header("access-control-allow-origin"), Some(origin));
        assert!(
            r.header("vary").is_some_and(|v| v.contains("Origin")),
            "{:?}",
            r.headers
        );
        let methods = r
            .header("access-control-allow-methods")
            .unwrap_or("")
            .to_ascii_uppercase();
        assert!(methods.contains("POST"), "{methods}");
        let allowed = r
            .header("access-control-allow-headers")
            .unwrap_or("")
            .to_ascii_lowercase();
        for h in [
            "authorization",
            "content-type",
            "mcp-session-id",
            "mcp-protocol-version",
            "last-event-id",
        ] {
            assert!(allowed.contains(h), "{h} not in {allowed}");
        }
        let exposed = r
            .header("access-control-expose-headers")
            .unwrap_or("")
            .to_ascii_lowercase();
        assert!(exposed.contains("mcp-session-id"), "{exposed}");
        assert!(r.header("access-control-max-age").is_some());

        let r = p.request(
            "OPTIONS",
            path,
            &[
                ("Origin", "https://evil.example"),
                ("Access-Control-Request-Method", "POST"),
            ],
            Body::None,
        );
        assert_eq!(
            r.status,
            403,
            "preflight from a foreign origin: {}",
            r.text()
        );
        assert_eq!(r.header("access-control-allow-origin"), None);
    }
    let auth = bearer(ALICE.1);
    let r = whole(
        mcp::post(
            p.addr,
            "/mcp",
            &[
                ("Authorization", &auth),
                ("Origin", origin),
                ("Accept", "application/json"),
            ],
            &initialize_body(1),
        ),
        "initialize",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("access-control-allow-origin"), Some(origin));
    assert!(r
        .header("access-control-expose-headers")
        .unwrap_or("")
        .to_ascii_lowercase()
        .contains("mcp-session-id"));
    assert!(r.header("mcp-session-id").is_some());
}

/// The TS and Python SDKs default to both media types; a client that accepts JSON only
/// still gets its answer (its accept is honoured as JSON).
fn accept_json_only(target: Target) {
    let p = proxy(target, &[]);
    let a = start(&p, ALICE);
    let r = whole(
        a.post_with(
            &[("Accept", "application/json")],
            &call_body(&json!(1), "echo", json!({"j": 1})),
        ),
        "JSON only",
    );
    assert_eq!(
        (r.status, echoed_args(&r.json())["j"].clone()),
        (200, json!(1))
    );
}

/// Ids no backend can echo back exactly, or that are not ids at all, are refused at once
/// with 400 naming the reason, on both transports, and reach no backend (issue: a lone
/// surrogate id was forwarded and its answer never came back).
fn hostile_ids_are_refused_at_once(target: Target) {
    let p = proxy(target, &[]);
    let s = start(&p, ALICE);
    let mut legacy = open_session(&p, Some(ALICE.1));
    legacy.initialize();
    let lone = r#"{"jsonrpc":"2.0","id":"\ud800","method":"tools/call","params":{"name":"echo","arguments":{"m":"MARK-REJECTED"}}}"#;
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":{}1{},"method":"tools/call","params":{{"name":"echo","arguments":{{"m":"MARK-REJECTED"}}}}}}"#,
        "[".repeat(300),
        "]".repeat(300)
    );
    for (body, reason) in [(lone, "lone surrogate"), (deep.as_str(), "nested deeper")] {
        let e = refused(raw(&p, ALICE.1, Some(&s.sid), &[], body), 400, reason);
        let message = e["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(reason), "/mcp: {e}");
        let auth = bearer(ALICE.1);
        let r = p.request(
            "POST",
            &legacy.post_target,
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &auth),
            ],
            Body::json(body),
        );
        assert_eq!(r.status, 400, "/sse: {}", r.text());
        assert!(r.text().contains(reason), "/sse: {}", r.text());
    }
    // A surrogate pair is text: answered as usual.
    let pair = call_body(&json!("\u{1F600}"), "echo", json!({"m": "pair"}));
    let r = whole(
        raw(&p, ALICE.1, Some(&s.sid), &[], &pair),
        "a surrogate pair",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], json!("\u{1F600}"));
    assert!(!p.recorded().iter().any(|l| l.contains("MARK-REJECTED")));
}

/// Issue 30.4 and 30.11a: an `initialize` the backend fails creates no session. The client
/// gets the error without `Mcp-Session-Id` and nothing counts against
/// `--max-sessions-per-principal`, so the retry opens the principal's one session; past
/// it, the 429 carries the initialize's id.
fn a_failed_initialize_creates_no_session(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND, "--fail-first-initialize"])
        .tokens(&[ALICE, BOB])
        .args(["--max-sessions-per-principal", "1"])
        .start();
    let failed = whole(
        raw(&p, ALICE.1, None, &[], &initialize_body(1)),
        "the failed initialize",
    );
    assert_eq!(failed.status, 200, "{}", failed.text());
    assert_eq!(
        failed.json()["error"]["code"],
        json!(-32603),
        "{}",
        failed.text()
    );
    assert_eq!(
        failed.header("mcp-session-id"),
        None,
        "a failed initialize names no session"
    );
    assert_eq!(p.metric("switchboard_sessions"), Some(0.0));
    let a = start(&p, ALICE);
    assert!(!a.sid.is_empty());
    let over = refused(
        raw(&p, ALICE.1, None, &[], &initialize_body(7)),
        429,
        "alice's second session",
    );
    assert_eq!(over["id"], json!(7), "{over}");
    assert_eq!(p.metric("switchboard_sessions"), Some(1.0));
}

/// Issue 30.11c: a `Last-Event-ID` that is not ASCII names no stream: 400, as any id this
/// proxy never sent (it is not taken as absent, which would open the GET stream).
fn a_non_ascii_last_event_id_is_400(target: Target) {
    let p = proxy(target, &[]);
    let a = start(&p, ALICE);
    let auth = bearer(ALICE.1);
    for bad in ["1.\u{e9}", "\u{663}.\u{661}"] {
        let headers = [
            ("Authorization", auth.as_str()),
            ("Mcp-Session-Id", a.sid.as_str()),
            ("Accept", "text/event-stream"),
            ("Last-Event-ID", bad),
        ];
        get_refused(&p, &headers, 400, bad);
    }
}

suite!(
    a_failed_initialize_creates_no_session,
    a_non_ascii_last_event_id_is_400,
    a_dropped_stream_resumes_with_last_event_id,
    backend_exit_keeps_sessions,
    hostile_ids_are_refused_at_once,
    post_refusals_follow_spec_order,
    answer_forms,
    in_flight_ids_409_and_max_inflight_429,
    get_stream_rules,
    delete_ends_the_session_and_cancels_upstream,
    progress_on_the_post_stream_before_the_result,
    list_changed_once_per_session_on_the_get_stream,
    resources_updated_reaches_subscribed_get_streams,
    colliding_ids_across_transports_reordered,
    idle_sessions_expire_but_watched_ones_stay,
    request_timeout_answers_32001_and_cancels_upstream,
    client_hang_up_mid_request,
    backend_exit_answers_in_flight_and_ends_sessions,
    json_waits_do_not_starve_other_requests,
    both_kinds_count_against_max_sessions,
    strict_backend_serves_ten_streamable_sessions,
    cors_preflight_and_answers,
    accept_json_only,
);
