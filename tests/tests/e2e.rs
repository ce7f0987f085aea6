//! End-to-end: the HTTP surface of SPEC section 1 and the routing rules of sections 2, 3
//! and 6, against the real binary with the scripted `test-backend` behind it.

use std::time::Duration;

use serde_json::{json, Value};
use switchboard_tests::{
    assert_colliding_ids_stay_isolated, backend_seen_id, bearer, echo_body, echoed_args,
    open_session, raw_member, suite, try_open_session, Body, Frame, OpenOptions, Proxy, Session,
    Target, SESSION_NOT_FOUND, WAIT,
};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");
const ALICE: (&str, &str) = ("alice", "alice-token-0123456789abcdef");
const BOB: (&str, &str) = ("bob", "bob-token-fedcba9876543210xyz");

fn proxy(target: Target) -> Proxy {
    Proxy::builder(target).backend([BACKEND]).record().start()
}

fn authed(target: Target) -> Proxy {
    Proxy::builder(target)
        .backend([BACKEND])
        .tokens(&[ALICE, BOB])
        .record()
        .start()
}

fn is_uuid_v4(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() == 36
        && [8, 13, 18, 23].iter().all(|&i| b[i] == b'-')
        && s.chars()
            .enumerate()
            .all(|(i, c)| [8, 13, 18, 23].contains(&i) || c.is_ascii_hexdigit())
        && b[14] == b'4'
        && matches!(b[19], b'8' | b'9' | b'a' | b'b' | b'A' | b'B')
}

fn recorded_json(proxy: &Proxy) -> Vec<Value> {
    proxy
        .recorded()
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

// ---------------------------------------------------------------------------------------
// SPEC 1: routes, the stream, and every POST refusal in its order
// ---------------------------------------------------------------------------------------

fn unknown_paths_404_and_wrong_methods_405(target: Target) {
    let p = proxy(target);
    for path in ["/", "/nope", "/sse/extra", "/messages/x/y", "/healthz"] {
        let r = p.get(path);
        assert_eq!(r.status, 404, "GET {path}: {}", r.text());
    }
    for (method, path, allow) in [
        ("POST", "/sse", "GET"),
        ("DELETE", "/sse", "GET"),
        ("GET", "/messages?session_id=x", "POST"),
        ("PUT", "/messages?session_id=x", "POST"),
        ("POST", "/health", "GET"),
        ("POST", "/metrics", "GET"),
    ] {
        let body = if method == "GET" || method == "DELETE" {
            Body::None
        } else {
            Body::json("{}")
        };
        let r = p.request(method, path, &[], body);
        assert_eq!(r.status, 405, "{method} {path}: {}", r.text());
        let got = r
            .header("allow")
            .unwrap_or_else(|| panic!("405 for {method} {path} has no Allow header"));
        assert!(
            got.split(',').any(|m| m.trim() == allow),
            "{method} {path}: Allow is {got:?}, expected it to list {allow}"
        );
    }
}

fn sse_stream_starts_with_endpoint_event(target: Target) {
    let p = proxy(target);
    let mut a = open_session(&p, None);
    let b = open_session(&p, None);
    assert_eq!(a.head.status, 200);
    let ct = a.head.header("content-type").unwrap_or_default();
    assert!(ct.starts_with("text/event-stream"), "content-type {ct:?}");
    let cc = a.head.header("cache-control").unwrap_or_default();
    assert!(cc.contains("no-cache"), "cache-control {cc:?}");
    for s in [&a, &b] {
        assert_eq!(s.endpoint, format!("/messages?session_id={}", s.sid));
        assert!(
            is_uuid_v4(&s.sid),
            "sid {:?} is not a canonical UUID v4",
            s.sid
        );
        assert!(!s.sid.contains('|'));
    }
    assert_ne!(a.sid, b.sid, "two sessions got the same id");
    // Nothing but the endpoint event until the client asks for something: the answer to
    // `initialize` must be the very next message.
    a.initialize();
    a.sync();
}

fn base_path_and_public_url_shape_the_endpoint(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args([
            "--base-path",
            "/mcp-proxy",
            "--public-url",
            "https://mcp.example.com",
        ])
        .health_path("/mcp-proxy/health")
        .start();
    let r = p.get("/sse");
    assert_eq!(r.status, 404, "GET /sse outside --base-path: {}", r.text());
    let options = OpenOptions {
        path: Some("/mcp-proxy/sse".into()),
        ..OpenOptions::default()
    };
    let mut s = try_open_session(p.addr, &options)
        .unwrap_or_else(|r| panic!("GET /mcp-proxy/sse refused: {} {}", r.status, r.text()));
    assert_eq!(
        s.endpoint,
        format!(
            "https://mcp.example.com/mcp-proxy/messages?session_id={}",
            s.sid
        )
    );
    s.initialize();
    let m = s.call("echo", json!({"under": "base"}));
    assert_eq!(echoed_args(&m), json!({"under": "base"}));
}

/// Every POST refusal, each request violating its rule and all the later ones at once, so
/// the status proves the order of the checks.
fn post_refusals_follow_spec_order(target: Target) {
    let p = authed(target);
    let mut a = open_session(&p, Some(ALICE.1));
    let mut b = open_session(&p, Some(BOB.1));
    a.initialize();
    b.initialize();
    let own = a.post_target.clone();
    let alice = bearer(ALICE.1);
    let bob = bearer(BOB.1);
    let bad_json = Body::json("{not json MARK-REJECTED");
    let nine_mib = || Body::Repeat {
        chunk: b"MARK-REJECTED ".repeat(4096),
        total: 9 << 20,
        chunked: false,
    };

    // 401 before everything: no credentials, bad Origin, bad Host, no session id, bad JSON.
    for auth in [
        None,
        Some("Bearer wrong-token-0000000000000000"),
        Some("Basic YWxpY2U6eA=="),
    ] {
        let mut headers = vec![("Origin", "http://evil.example"), ("Host", "evil.example")];
        if let Some(a) = auth {
            headers.push(("Authorization", a));
        }
        let r = p.request("POST", "/messages", &headers, bad_json.clone());
        assert_eq!(r.status, 401, "auth {auth:?}: {}", r.text());
        let www = r.header("www-authenticate").unwrap_or_default();
        assert!(www.starts_with("Bearer"), "WWW-Authenticate is {www:?}");
        let body = r.json();
        assert_eq!(body["jsonrpc"], "2.0");
        assert!(body["error"]["code"].is_i64(), "401 body {body}");
        assert!(
            body.get("id").is_none(),
            "401 body must carry no id: {body}"
        );
    }

    // 403 Origin before Host, session id and body.
    let r = p.request(
        "POST",
        "/messages",
        &[
            ("Authorization", &alice),
            ("Origin", "http://evil.example"),
            ("Host", "evil.example"),
        ],
        bad_json.clone(),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], -32600);
    assert_eq!(r.json()["error"]["message"], "Origin not allowed");
    // A lookalike of a loopback origin is not one.
    let r = p.request(
        "POST",
        &own,
        &[
            ("Authorization", &alice),
            ("Origin", "http://localhost.evil.example"),
        ],
        Body::json(&echo_body("1", json!({}))),
    );
    assert_eq!(r.status, 403, "{}", r.text());

    // 403 Host (with an allowed Origin) before session id and body.
    let r = p.request(
        "POST",
        "/messages",
        &[
            ("Authorization", &alice),
            ("Origin", "http://localhost:3000"),
            ("Host", "evil.example:80"),
        ],
        bad_json.clone(),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], -32600);
    assert_eq!(r.json()["error"]["message"], "Host not allowed");

    // Loopback origins and hosts of any port pass.
    for (origin, host) in [
        ("http://localhost:5173", "localhost:1"),
        ("https://127.0.0.1", "127.0.0.1"),
        ("http://[::1]:8080", "[::1]:9"),
    ] {
        let r = p.request(
            "POST",
            &own,
            &[
                ("Authorization", &alice),
                ("Origin", origin),
                ("Host", host),
            ],
            Body::json(r#"{"jsonrpc":"2.0","method":"notifications/loopback-ok"}"#),
        );
        assert_eq!(r.status, 202, "origin {origin} host {host}: {}", r.text());
    }

    // 400 missing session id, before the size check.
    for target_path in ["/messages", "/messages?session_id=", "/messages?other=1"] {
        let r = p.request(
            "POST",
            target_path,
            &[("Authorization", &alice)],
            nine_mib(),
        );
        assert_eq!(r.status, 400, "POST {target_path}: {}", r.text());
    }

    // 404 unknown session, before the size check and the body's validity.
    let unknown = "/messages?session_id=3f0c2a4e-1b7d-4c8e-9f00-123456789abc";
    for body in [nine_mib(), bad_json.clone()] {
        let r = p.request("POST", unknown, &[("Authorization", &alice)], body);
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.text(), SESSION_NOT_FOUND);
    }
    // 404 for another principal's session: the same answer, no oracle.
    for body in [
        nine_mib(),
        bad_json.clone(),
        Body::json(&echo_body("1", json!({"MARK-REJECTED": 1}))),
    ] {
        let r = p.request("POST", &own, &[("Authorization", &bob)], body);
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.text(), SESSION_NOT_FOUND);
    }

    // 413 by Content-Length and by counting a chunked body, before the body's validity.
    let r = p.request("POST", &own, &[("Authorization", &alice)], nine_mib());
    assert_eq!(r.status, 413, "{}", r.text());
    let r = p.request(
        "POST",
        &own,
        &[("Authorization", &alice)],
        Body::Repeat {
            chunk: b"MARK-REJECTED ".repeat(4096),
            total: 9 << 20,
            chunked: true,
        },
    );
    assert_eq!(r.status, 413, "chunked: {}", r.text());

    // 400 for a bad body.
    let r = p.request("POST", &own, &[("Authorization", &alice)], bad_json.clone());
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], -32700);

    // 202 with the body `Accepted`, by Content-Length and chunked.
    let r = p.request(
        "POST",
        &own,
        &[
            ("Authorization", &alice),
            ("Content-Type", "application/json"),
        ],
        Body::json(&echo_body("7", json!({"ok": "length"}))),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.text(), "Accepted");
    let m = a.expect_message("the answer to id 7");
    assert_eq!(m["id"], 7);
    assert_eq!(echoed_args(&m), json!({"ok": "length"}));
    let body = echo_body("8", json!({"ok": "chunked"})).into_bytes();
    let (x, y) = body.split_at(10);
    let r = p.request(
        "POST",
        &own,
        &[("Authorization", &alice)],
        Body::Chunked(vec![x.to_vec(), y.to_vec()]),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let m = a.expect_message("the answer to id 8");
    assert_eq!(echoed_args(&m), json!({"ok": "chunked"}));

    // Nothing refused reached the backend, and the sessions are undisturbed.
    a.sync();
    b.sync();
    p.assert_nothing_rejected_reached_the_backend();
}

fn closed_session_gets_404(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--keepalive", "1s"])
        .start();
    let a = open_session(&p, None);
    let target_path = a.post_target.clone();
    a.shutdown();
    drop(a);
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let r = p.request(
            "POST",
            &target_path,
            &[],
            Body::json(&echo_body("1", json!({}))),
        );
        if r.status == 404 {
            assert_eq!(r.text(), SESSION_NOT_FOUND);
            break;
        }
        assert_eq!(r.status, 202, "{}", r.text());
        assert!(
            std::time::Instant::now() < deadline,
            "a closed session still accepts POSTs after {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn invalid_bodies_get_400_and_never_reach_the_backend(target: Target) {
    let p = proxy(target);
    let mut a = open_session(&p, None);
    a.initialize();
    let long_id = format!("\"{}\"", "i".repeat(300));
    let m = |id: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"MARK-REJECTED","params":{{}}}}"#)
    };
    let cases: Vec<(&str, Vec<u8>, &[i64])> = vec![
        ("not UTF-8", b"{\"jsonrpc\":\"2.0\",\"method\":\"MARK-REJECTED\xff\xfe\"}".to_vec(), &[-32700, -32600]),
        ("not JSON", b"MARK-REJECTED".to_vec(), &[-32700]),
        ("trailing garbage", format!("{} x", m("1")).into_bytes(), &[-32700, -32600]),
        ("empty", Vec::new(), &[-32700, -32600]),
        ("batch", format!("[{}]", m("1")).into_bytes(), &[-32600]),
        ("empty batch", b"[]".to_vec(), &[-32600]),
        ("string", b"\"MARK-REJECTED\"".to_vec(), &[-32600]),
        ("number", b"42".to_vec(), &[-32600]),
        ("null", b"null".to_vec(), &[-32600]),
        ("duplicate key", br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"MARK-REJECTED"}"#.to_vec(), &[-32600]),
        ("duplicate method", br#"{"jsonrpc":"2.0","id":1,"method":"a","method":"MARK-REJECTED"}"#.to_vec(), &[-32600]),
        ("jsonrpc 1.0", br#"{"jsonrpc":"1.0","id":1,"method":"MARK-REJECTED"}"#.to_vec(), &[-32600]),
        ("no jsonrpc", br#"{"id":1,"method":"MARK-REJECTED"}"#.to_vec(), &[-32600]),
        ("method and result", br#"{"jsonrpc":"2.0","id":1,"method":"MARK-REJECTED","result":{}}"#.to_vec(), &[-32600]),
        ("method and error", br#"{"jsonrpc":"2.0","id":1,"method":"MARK-REJECTED","error":{"code":1,"message":"x"}}"#.to_vec(), &[-32600]),
        ("method not a string", br#"{"jsonrpc":"2.0","id":1,"method":5,"params":"MARK-REJECTED"}"#.to_vec(), &[-32600]),
        ("id null", m("null").into_bytes(), &[-32600]),
        ("id fraction", m("1.5").into_bytes(), &[-32600]),
        ("id 1.0", m("1.0").into_bytes(), &[-32600]),
        ("id exponent", m("1e3").into_bytes(), &[-32600]),
        ("id bool", m("true").into_bytes(), &[-32600]),
        ("id object", m("{}").into_bytes(), &[-32600]),
        ("id array", m("[1]").into_bytes(), &[-32600]),
        ("id over 256 bytes", m(&long_id).into_bytes(), &[-32600]),
    ];
    for (what, body, codes) in cases {
        let r = a.post_with(Body::Bytes(body), &[]);
        assert_eq!(r.status, 400, "{what}: {} {}", r.status, r.text());
        let j = r.json();
        let code = j["error"]["code"].as_i64().unwrap_or(0);
        assert!(
            codes.contains(&code),
            "{what}: code {code} not in {codes:?}: {j}"
        );
        assert_eq!(j["jsonrpc"], "2.0", "{what}: {j}");
    }
    for (what, body) in [
        (
            "result",
            r#"{"jsonrpc":"2.0","id":"MARK-REJECTED","result":{}}"#,
        ),
        (
            "error",
            r#"{"jsonrpc":"2.0","id":"MARK-REJECTED","error":{"code":-32601,"message":"no"}}"#,
        ),
    ] {
        let r = a.post(body);
        assert_eq!(r.status, 400, "client {what} response: {}", r.text());
        let j = r.json();
        assert_eq!(j["error"]["code"], -32600, "{j}");
        let msg = j["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("responses from clients are not accepted"),
            "client {what} response: message {msg:?}"
        );
    }
    // A number past a 64-bit float is named as such (it was called a duplicate key).
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"MARK-REJECTED":1e400}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","MARK-REJECTED":[1e400]}}"#,
    ] {
        let r = a.post(body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        let j = r.json();
        assert_eq!(j["error"]["code"], -32700, "{j}");
        let msg = j["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("number is out of range"), "{body}: {msg:?}");
    }
    a.sync();
    p.assert_nothing_rejected_reached_the_backend();
}

fn session_id_aliases(target: Target) {
    let p = proxy(target);
    let mut a = open_session(&p, None);
    let other = open_session(&p, None);
    a.initialize();
    let ts = format!("/messages?sessionId={}", a.sid);
    let r = p.request(
        "POST",
        &ts,
        &[],
        Body::json(&echo_body("21", json!({"via": "sessionId"}))),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(
        echoed_args(&a.expect_message("answer via sessionId")),
        json!({"via": "sessionId"})
    );
    let same = format!("/messages?session_id={0}&sessionId={0}", a.sid);
    let r = p.request(
        "POST",
        &same,
        &[],
        Body::json(&echo_body("22", json!({"via": "both"}))),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(
        echoed_args(&a.expect_message("answer via both")),
        json!({"via": "both"})
    );
    let conflict = format!("/messages?session_id={}&sessionId={}", a.sid, other.sid);
    let r = p.request(
        "POST",
        &conflict,
        &[],
        Body::json(&echo_body("23", json!({"via": "conflict"}))),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.text(), SESSION_NOT_FOUND);
    a.sync();
}

fn stream_refusals_create_nothing(target: Target) {
    let p = authed(target);
    let with = |headers: Vec<(&str, &str)>, token: Option<&str>| OpenOptions {
        token: token.map(str::to_owned),
        headers: headers
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        ..OpenOptions::default()
    };
    let refusals = [
        (with(vec![], None), 401),
        (with(vec![], Some("not-a-valid-token-at-all-000")), 401),
        (
            with(vec![("Origin", "https://evil.example")], Some(ALICE.1)),
            403,
        ),
        (with(vec![("Host", "evil.example")], Some(ALICE.1)), 403),
    ];
    for (options, status) in refusals {
        match try_open_session(p.addr, &options) {
            Ok(s) => panic!("GET /sse with {options:?} opened session {}", s.sid),
            Err(r) => {
                assert_eq!(r.status, status, "{options:?}: {}", r.text());
                if status == 401 {
                    assert!(r
                        .header("www-authenticate")
                        .unwrap_or_default()
                        .starts_with("Bearer"));
                }
            }
        }
    }
    let (_, h) = p.health();
    assert_eq!(h["sessions"], 0, "refused streams created sessions: {h}");
    assert_eq!(p.metric("switchboard_sessions"), Some(0.0));
    let _ok = open_session(&p, Some(ALICE.1));
    assert_eq!(p.health().1["sessions"], 1);
}

fn max_sessions_gives_503(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--max-sessions", "2", "--keepalive", "1s"])
        .start();
    let a = open_session(&p, None);
    let mut b = open_session(&p, None);
    match try_open_session(p.addr, &OpenOptions::default()) {
        Ok(s) => panic!("a third session {} opened past --max-sessions 2", s.sid),
        Err(r) => {
            assert_eq!(r.status, 503, "{}", r.text());
            assert!(r.header("retry-after").is_some(), "503 without Retry-After");
        }
    }
    a.shutdown();
    drop(a);
    let deadline = std::time::Instant::now() + WAIT;
    let mut c = loop {
        match try_open_session(p.addr, &OpenOptions::default()) {
            Ok(c) => break c,
            Err(r) => assert_eq!(r.status, 503, "{}", r.text()),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the closed session's slot never freed"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    b.initialize();
    c.initialize();
    c.sync();
    b.sync();
}

// ---------------------------------------------------------------------------------------
// SPEC 2 and 6: isolation, ids, the rewrite
// ---------------------------------------------------------------------------------------

/// Two principals send the same ids; the backend answers out of order; each gets exactly
/// its own answers.
fn colliding_ids_two_principals_reordered(target: Target) {
    let p = authed(target);
    let mut sessions = [
        ("alice", open_session(&p, Some(ALICE.1))),
        ("bob", open_session(&p, Some(BOB.1))),
    ];
    for (_, s) in sessions.iter_mut() {
        s.initialize();
    }
    const N: u64 = 20;
    let ids: Vec<Value> = (1..=N)
        .map(|n| json!(n))
        .chain([json!("same"), json!(0), json!(-3)])
        .collect();
    assert_colliding_ids_stay_isolated(&mut sessions, &ids, 15);
    for (_, s) in sessions.iter_mut() {
        s.sync();
    }
}

/// Integer ids beyond 2^53 and string ids come back byte for byte.
fn big_and_string_ids_round_trip_exactly(target: Target) {
    let p = proxy(target);
    let mut a = open_session(&p, None);
    a.initialize();
    let ints = [
        "9007199254740993",
        "-9007199254740993",
        "1234567890123456789012345678901234567890",
        "-98765432109876543210987654321098765432109876543210",
        "0",
        "-1",
        "18446744073709551616",
    ];
    for (i, raw) in ints.iter().enumerate() {
        let r = a.post(&echo_body(raw, json!({"case": i})));
        assert_eq!(r.status, 202, "id {raw}: {}", r.text());
        let data = a.expect_raw(&format!("the answer to id {raw}"));
        assert_eq!(
            raw_member(&data, "id").as_deref(),
            Some(*raw),
            "id changed in {data}"
        );
        let m: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(
            backend_seen_id(&m),
            json!(format!("{}|n:{raw}", a.sid)),
            "the backend must see the routed id with the digits as written"
        );
    }
    let strings = [
        "\"abc\"",
        "\"a|n:5\"",
        "\"\"",
        "\"ünï 😀\"",
        "\"9007199254740993\"",
        "\"  spaced  \"",
    ];
    for raw in strings {
        let r = a.post(&echo_body(raw, json!({"s": raw})));
        assert_eq!(r.status, 202, "id {raw}: {}", r.text());
        let data = a.expect_raw(&format!("the answer to id {raw}"));
        assert_eq!(
            raw_member(&data, "id").as_deref(),
            Some(raw),
            "id changed in {data}"
        );
        let m: Value = serde_json::from_str(&data).unwrap();
        let inner: String = serde_json::from_str(raw).unwrap();
        assert_eq!(backend_seen_id(&m), json!(format!("{}|s:{inner}", a.sid)));
    }
    // Escapes: the same string comes back (its spelling may be normalised).
    for raw in [r#""q\"uote\\back""#, r#""\u0041\n""#] {
        let r = a.post(&echo_body(raw, json!({})));
        assert_eq!(r.status, 202, "id {raw}: {}", r.text());
        let m = a.expect_message(&format!("the answer to id {raw}"));
        let want: Value = serde_json::from_str(raw).unwrap();
        assert_eq!(m["id"], want);
    }
    a.sync();
    let rec = p.recorded().join("\n");
    assert!(
        rec.contains(&format!(
            "\"{}|n:1234567890123456789012345678901234567890\"",
            a.sid
        )),
        "the 40-digit id did not reach the backend intact"
    );
}

/// A client-chosen id that looks like another session's routed id stays the client's own.
fn forged_routed_ids_stay_with_their_sender(target: Target) {
    let p = proxy(target);
    let mut a = open_session(&p, None);
    let mut b = open_session(&p, None);
    a.initialize();
    b.initialize();
    let forged = format!("{}|n:1", b.sid);
    let m = a.request(
        json!(forged),
        "tools/call",
        json!({"name": "echo", "arguments": {"forged": true}}),
    );
    assert_eq!(echoed_args(&m), json!({"forged": true}));
    assert_eq!(backend_seen_id(&m), json!(format!("{}|s:{forged}", a.sid)));
    // A progress token and a cancelled requestId that name b are prefixed with a's sid too.
    a.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": forged, "reason": "forge"}}),
    );
    let line = p.wait_recorded("the forged cancel", |l| l.contains("\"forge\""));
    assert!(
        line.contains(&format!("\"{}|s:{forged}\"", a.sid)),
        "cancel not prefixed with the sender's sid: {line}"
    );
    b.sync();
    a.sync();
}

fn cancelled_and_progress_tokens_are_rewritten(target: Target) {
    let p = proxy(target);
    let mut a = open_session(&p, None);
    a.initialize();
    for (request_id, marker) in [
        ("7", "c-int"),
        ("\"str-7\"", "c-str"),
        ("1.5", "c-frac"),
        ("{\"x\":1}", "c-obj"),
    ] {
        let r = a.post(&format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{request_id},"reason":"{marker}"}}}}"#
        ));
        assert_eq!(r.status, 202, "cancel {request_id}: {}", r.text());
    }
    let sid = a.sid.clone();
    let line = p.wait_recorded("the integer cancel", |l| l.contains("c-int"));
    assert!(
        line.contains(&format!(r#""requestId":"{sid}|n:7""#)),
        "{line}"
    );
    let line = p.wait_recorded("the string cancel", |l| l.contains("c-str"));
    assert!(
        line.contains(&format!(r#""requestId":"{sid}|s:str-7""#)),
        "{line}"
    );
    let line = p.wait_recorded("the fraction cancel", |l| l.contains("c-frac"));
    assert!(
        line.contains(r#""requestId":1.5"#),
        "other types pass unchanged: {line}"
    );
    let line = p.wait_recorded("the object cancel", |l| l.contains("c-obj"));
    assert!(
        line.contains(r#""requestId":{"x":1}"#),
        "other types pass unchanged: {line}"
    );

    let r = a.post(r#"{"jsonrpc":"2.0","id":31,"method":"tools/call","params":{"name":"echo","arguments":{"p":"tok"},"_meta":{"progressToken":42}}}"#);
    assert_eq!(r.status, 202);
    a.expect_message("the answer to id 31");
    let line = p.wait_recorded("the request with a progress token", |l| {
        l.contains("\"p\":\"tok\"")
    });
    assert!(
        line.contains(&format!(r#""progressToken":"{sid}|n:42""#)),
        "{line}"
    );
    assert!(line.contains(&format!(r#""id":"{sid}|n:31""#)), "{line}");
}

fn progress_reaches_only_its_session(target: Target) {
    let p = proxy(target);
    let mut a = open_session(&p, None);
    let mut b = open_session(&p, None);
    a.initialize();
    b.initialize();
    for token in ["42", "\"tok-a\"", "9007199254740993"] {
        let r = a.post(&format!(
            r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"progress","arguments":{{}},"_meta":{{"progressToken":{token}}}}}}}"#
        ));
        assert_eq!(r.status, 202);
        let data = a.expect_raw("notifications/progress");
        let n: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(n["method"], "notifications/progress", "{data}");
        let params = raw_member(&data, "params").unwrap();
        assert_eq!(
            raw_member(&params, "progressToken").as_deref(),
            Some(token),
            "the original token must come back exactly: {data}"
        );
        assert_eq!(n["params"]["progress"], 1);
        let m = a.expect_message("the progress tool's result");
        assert_eq!(m["id"], 5);
    }
    // A token of another type cannot be routed: its progress is dropped, the result is not.
    let r = a.post(r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"progress","arguments":{},"_meta":{"progressToken":{"x":1}}}}"#);
    assert_eq!(r.status, 202);
    let m = a.expect_message("the result after an unroutable progress");
    assert_eq!(m["id"], 6, "an unroutable progress was delivered: {m}");
    b.sync();
    a.sync();
}

fn initialize_reaches_the_backend_once(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND, "--fail-second-initialize"])
        .record()
        .start();
    let mut sessions: Vec<Session> = (0..3).map(|_| open_session(&p, None)).collect();
    let ids = [json!(1), json!("init-b"), json!(9007199254740993u64)];
    // All three at once: later ones wait for (or are served from) the first.
    for (s, id) in sessions.iter().zip(&ids) {
        s.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
            "protocolVersion": "2024-11-05",
            "capabilities": {"sampling": {}, "roots": {"listChanged": true}, "elicitation": {}},
            "clientInfo": {"name": "t", "version": "0"}}}),
        );
    }
    for (s, id) in sessions.iter_mut().zip(&ids) {
        let m = s.expect_message("the initialize result");
        assert_eq!(&m["id"], id, "{m}");
        assert_eq!(m["result"]["protocolVersion"], "2024-11-05", "{m}");
        assert_eq!(m["result"]["serverInfo"]["name"], "test-backend", "{m}");
        assert_eq!(m["result"]["capabilities"]["resources"]["subscribe"], true);
        s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    }
    let mut late = open_session(&p, None);
    let r = late.initialize();
    assert_eq!(r["serverInfo"]["name"], "test-backend");
    for s in sessions.iter_mut() {
        s.sync();
    }
    late.sync();
    let rec = recorded_json(&p);
    let inits: Vec<&Value> = rec.iter().filter(|m| m["method"] == "initialize").collect();
    assert_eq!(
        inits.len(),
        1,
        "the backend saw {} initialize requests: {inits:?}",
        inits.len()
    );
    assert_eq!(
        inits[0]["params"]["capabilities"],
        json!({}),
        "client capabilities must be replaced by {{}}"
    );
    let initialized = rec
        .iter()
        .filter(|m| m["method"] == "notifications/initialized")
        .count();
    assert_eq!(
        initialized, 1,
        "the backend must get exactly one notifications/initialized"
    );
}

// ---------------------------------------------------------------------------------------
// SPEC 3: the dispatch table
// ---------------------------------------------------------------------------------------

fn list_changed_broadcast_without_params(target: Target) {
    let p = proxy(target);
    let mut sessions: Vec<Session> = (0..3).map(|_| open_session(&p, None)).collect();
    for s in sessions.iter_mut() {
        s.initialize();
    }
    let methods = [
        "notifications/tools/list_changed",
        "notifications/resources/list_changed",
        "notifications/prompts/list_changed",
    ];
    let lines: Vec<Value> = methods
        .iter()
        .map(|m| json!({"jsonrpc": "2.0", "method": m, "params": {"_meta": {"evil": "meta"}, "payload": "evil-payload"}}))
        .collect();
    sessions[0].send(
        &json!({"jsonrpc": "2.0", "id": "emit-1", "method": "tools/call",
        "params": {"name": "emit", "arguments": {"lines": lines}}}),
    );
    for (i, s) in sessions.iter_mut().enumerate() {
        for method in methods {
            let got = s.expect_message(&format!("broadcast {method}"));
            assert_eq!(
                got,
                json!({"jsonrpc": "2.0", "method": method}),
                "session {i}: broadcasts must be rebuilt without params"
            );
        }
    }
    let result = sessions[0].expect_message("the emit result");
    assert_eq!(result["id"], "emit-1", "{result}");
    for s in sessions.iter_mut() {
        s.sync();
    }
}

fn unattributable_backend_messages_never_reach_clients(target: Target) {
    let p = proxy(target);
    let mut a = open_session(&p, None);
    a.initialize();
    let lines = json!([
        {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "LEAK-1"}},
        {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "file:///nobody"}},
        {"jsonrpc": "2.0", "method": "notifications/custom", "params": {"x": "LEAK-2"}},
        {"jsonrpc": "2.0", "id": "srv-ping-1", "method": "ping"},
        {"jsonrpc": "2.0", "id": "srv-sampling-1", "method": "sampling/createMessage",
         "params": {"messages": [{"role": "user", "content": {"type": "text", "text": "LEAK-3"}}], "maxTokens": 5}},
        {"jsonrpc": "2.0", "id": 17, "method": "elicitation/create", "params": {"message": "LEAK-4"}},
        {"jsonrpc": "2.0", "id": "srv-roots-1", "method": "roots/list"},
        {"jsonrpc": "2.0", "id": 77, "result": {"leak": "LEAK-5"}},
        {"jsonrpc": "2.0", "id": "00000000-0000-4000-8000-000000000000|n:1", "result": {"leak": "LEAK-6"}},
        {"jsonrpc": "2.0", "id": format!("{}|n:999", "not-a-session"), "result": {"leak": "LEAK-7"}},
        {"jsonrpc": "2.0", "id": null, "error": {"code": -1, "message": "LEAK-8"}},
        "this is not json LEAK-9",
        "[{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}]",
        "42",
        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"unknown\",\"progress\":1}}",
    ]);
    let m = a.call("emit", json!({"lines": lines}));
    assert!(
        m.get("result").is_some(),
        "the first message after the emit must be its result: {m}"
    );
    let mut b = open_session(&p, None);
    b.initialize();
    b.sync();
    a.sync();

    let rec = recorded_json(&p);
    let answer = |id: &Value| {
        rec.iter()
            .find(|m| &m["id"] == id && m.get("method").is_none())
            .cloned()
            .unwrap_or_else(|| {
                panic!("the proxy never answered the backend's request {id}; backend got {rec:?}")
            })
    };
    let ping = answer(&json!("srv-ping-1"));
    assert_eq!(
        ping,
        json!({"jsonrpc": "2.0", "id": "srv-ping-1", "result": {}})
    );
    for (id, method) in [
        (json!("srv-sampling-1"), "sampling/createMessage"),
        (json!(17), "elicitation/create"),
        (json!("srv-roots-1"), "roots/list"),
    ] {
        let reply = answer(&id);
        assert_eq!(reply["error"]["code"], -32601, "{method}: {reply}");
        let msg = reply["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(method),
            "the -32601 for {method} must name it: {msg:?}"
        );
    }
    // Every drop and reply is counted by reason and method.
    let metrics = p.metrics();
    for method in ["sampling/createMessage", "notifications/message"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("switchboard_drops_total") && l.contains(method)),
            "no drop counted for {method}:\n{metrics}"
        );
    }
}

fn resources_updated_reaches_subscribers_only(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--keepalive", "1s"])
        .record()
        .start();
    let mut a = open_session(&p, None);
    let mut b = open_session(&p, None);
    let mut c = open_session(&p, None);
    for s in [&mut a, &mut b, &mut c] {
        s.initialize();
    }
    let subscribe = |s: &mut Session, uri: &str| {
        let id = s.fresh_id();
        let m = s.request(json!(id), "resources/subscribe", json!({"uri": uri}));
        assert_eq!(m["result"], json!({}), "subscribe {uri}: {m}");
    };
    subscribe(&mut a, "test://x");
    subscribe(&mut b, "test://y");
    subscribe(&mut a, "test://z");
    subscribe(&mut b, "test://z");
    let updated = |uri: &str| json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}});
    let m = c.call("emit", json!({"lines": [updated("test://x"), updated("test://y"), updated("test://z"), updated("test://w")]}));
    assert!(
        m.get("result").is_some(),
        "c subscribed to nothing but got {m}"
    );
    for (s, uris) in [
        (&mut a, ["test://x", "test://z"]),
        (&mut b, ["test://y", "test://z"]),
    ] {
        for uri in uris {
            let m = s.expect_message(&format!("resources/updated {uri}"));
            assert_eq!(m["method"], "notifications/resources/updated", "{m}");
            assert_eq!(m["params"]["uri"], uri, "{m}");
        }
        s.sync();
    }
    c.sync();

    let unsubscribes = |p: &Proxy, uri: &str| {
        recorded_json(p)
            .iter()
            .filter(|m| m["method"] == "resources/unsubscribe" && m["params"]["uri"] == uri)
            .count()
    };
    // a leaves z while b still watches it: answered by the proxy, not forwarded.
    let m = a.request(
        json!(501),
        "resources/unsubscribe",
        json!({"uri": "test://z"}),
    );
    assert_eq!(m["result"], json!({}), "{m}");
    a.sync();
    assert_eq!(
        unsubscribes(&p, "test://z"),
        0,
        "unsubscribe forwarded while another session still subscribed"
    );
    // b was the last: forwarded.
    let m = b.request(
        json!(502),
        "resources/unsubscribe",
        json!({"uri": "test://z"}),
    );
    assert_eq!(m["result"], json!({}), "{m}");
    p.wait_recorded("the last unsubscribe of test://z", |l| {
        l.contains("resources/unsubscribe") && l.contains("test://z")
    });
    // A disconnect counts as leaving: a held test://x alone.
    a.shutdown();
    drop(a);
    p.wait_recorded("the proxy's unsubscribe of test://x after a left", |l| {
        l.contains("resources/unsubscribe") && l.contains("test://x")
    });
    let m = c.call("emit", json!({"lines": [updated("test://x")]}));
    assert!(m.get("result").is_some(), "{m}");
    b.sync();
}

fn foreign_post_is_404_and_owner_undisturbed(target: Target) {
    let p = authed(target);
    let mut a = open_session(&p, Some(ALICE.1));
    let mut b = open_session(&p, Some(BOB.1));
    a.initialize();
    b.initialize();
    let bob = bearer(BOB.1);
    for path in [
        a.post_target.clone(),
        format!("/messages?sessionId={}", a.sid),
    ] {
        let r = p.request(
            "POST",
            &path,
            &[("Authorization", &bob)],
            Body::json(&echo_body("1", json!({"INTRUSION": "bob"}))),
        );
        assert_eq!(
            r.status,
            404,
            "bob posting into alice's session: {}",
            r.text()
        );
        assert_eq!(
            r.text(),
            SESSION_NOT_FOUND,
            "must look exactly like an unknown session"
        );
    }
    // The refusal is indistinguishable from an unknown session for bob.
    let r = p.request(
        "POST",
        "/messages?session_id=3f0c2a4e-1b7d-4c8e-9f00-123456789abc",
        &[("Authorization", &bob)],
        Body::json(&echo_body("1", json!({}))),
    );
    assert_eq!(r.text(), SESSION_NOT_FOUND);
    a.sync();
    b.sync();
    assert!(
        !p.recorded().iter().any(|l| l.contains("INTRUSION")),
        "bob's POST into alice's session reached the backend"
    );
    // Bob cannot open a stream as alice either by reusing her session's URL: a new GET is his.
    let m = a.call("echo", json!({"still": "alice"}));
    assert_eq!(echoed_args(&m), json!({"still": "alice"}));
}

fn late_answers_to_a_closed_session_are_dropped(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--keepalive", "1s"])
        .start();
    let mut a = open_session(&p, None);
    a.initialize();
    let r = a.post(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delay","arguments":{"ms":1500,"LATE":"a"}}}"#,
    );
    assert_eq!(r.status, 202);
    a.shutdown();
    drop(a);
    let mut b = open_session(&p, None);
    b.initialize();
    // The late answer arrives for a session that is gone, and is dropped.
    p.wait_metric(
        r#"switchboard_drops_total{reason="session_gone",method=""}"#,
        |n| n >= 1.0,
    );
    b.sync();
    let mut c = open_session(&p, None);
    c.initialize();
    c.sync();
}

fn long_backend_lines_are_dropped(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--max-line", "64KiB"])
        .start();
    let mut a = open_session(&p, None);
    a.initialize();
    for bytes in [300_000, 1_000, 65_537] {
        let m = a.call("flood", json!({"bytes": bytes}));
        assert_eq!(
            echoed_args(&m),
            json!({"bytes": bytes}),
            "after a {bytes}-byte garbage line"
        );
    }
    // A valid message longer than --max-line is dropped too.
    let big = "y".repeat(70_000);
    let line = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {"pad": big}});
    let id = a.fresh_id();
    let r = a.post(&format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"emit","arguments":{{"lines":[{line}]}}}}}}"#
    ));
    assert_eq!(r.status, 202);
    // The emit result itself echoes the long line, so it is over the limit as well: nothing
    // (the barrier's answer is the very next message).
    a.sync();
}

// ---------------------------------------------------------------------------------------
// /health, /metrics, keep-alive, backend stderr
// ---------------------------------------------------------------------------------------

fn health_json_shape(target: Target) {
    let p = proxy(target);
    let (status, h) = p.health();
    assert_eq!(status, 200, "{h}");
    assert!(h["status"].is_string(), "status: {h}");
    let backend = &h["backend"];
    assert_eq!(backend["running"], true, "{h}");
    let pid = backend["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("backend.pid: {h}")) as u32;
    assert_eq!(backend["restarts"], 0, "{h}");
    assert!(
        backend["last_pong_ms"].is_u64() || backend["last_pong_ms"].is_null(),
        "backend.last_pong_ms: {h}"
    );
    assert_eq!(h["sessions"], 0, "{h}");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("backend pid {pid} is not a live process: {e}"));
    let ppid: u32 = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    assert_eq!(ppid, p.pid(), "backend.pid is not the proxy's child");
    let _a = open_session(&p, None);
    let _b = open_session(&p, None);
    let (status, h) = p.health();
    assert_eq!(status, 200);
    assert_eq!(h["sessions"], 2, "{h}");
    let r = p.get("/health");
    assert!(
        r.header("content-type")
            .unwrap_or_default()
            .contains("json"),
        "/health content-type {:?}",
        r.header("content-type")
    );
}

fn metrics_exposition(target: Target) {
    let p = proxy(target);
    let mut a = open_session(&p, None);
    a.initialize();
    a.call("echo", json!({}));
    let r = p.request(
        "POST",
        "/messages?session_id=3f0c2a4e-1b7d-4c8e-9f00-123456789abc",
        &[],
        Body::json(&echo_body("1", json!({}))),
    );
    assert_eq!(r.status, 404);
    let r = p.get("/metrics");
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .unwrap_or_default()
            .starts_with("text/plain"),
        "content-type {:?}",
        r.header("content-type")
    );
    let text = r.text();
    assert!(text.contains("# TYPE switchboard_sessions gauge"), "{text}");
    assert_eq!(
        switchboard_tests::parse_metric(&text, "switchboard_sessions"),
        Some(1.0),
        "{text}"
    );
    let client_msgs = switchboard_tests::parse_metric(
        &text,
        r#"switchboard_messages_total{direction="client_to_proxy"}"#,
    );
    assert!(
        client_msgs.unwrap_or(0.0) >= 3.0,
        "client message counter: {client_msgs:?}\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("switchboard_rejections_total")
                && l.contains("session_not_found")),
        "no session_not_found rejection counted:\n{text}"
    );
    assert!(
        text.contains("switchboard_backend_restarts_total"),
        "{text}"
    );
    drop(a);
}

fn metrics_auth_requires_a_token(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .tokens(&[ALICE])
        .arg("--metrics-auth")
        .start();
    let r = p.get("/metrics");
    assert_eq!(r.status, 401, "{}", r.text());
    let alice = bearer(ALICE.1);
    let r = p.request("GET", "/metrics", &[("Authorization", &alice)], Body::None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("switchboard_sessions"));
    // /health never needs auth.
    assert_eq!(p.get("/health").status, 200);
}

fn keepalive_comments_on_idle_streams(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--keepalive", "1s"])
        .start();
    let mut a = open_session(&p, None);
    let mut seen = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while seen < 2 && std::time::Instant::now() < deadline {
        match a.next_frame(Duration::from_secs(3)) {
            Frame::Comment(c) => {
                assert_eq!(c, "keep-alive");
                seen += 1;
            }
            other => panic!("expected a keep-alive comment, got {other:?}"),
        }
    }
    assert_eq!(seen, 2, "no keep-alive comments with --keepalive 1s");
}

fn backend_stderr_is_logged_and_env_passed(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--env", "SB_TEST_MARK=from-env"])
        .start();
    let mut a = open_session(&p, None);
    a.initialize();
    a.call("stderr", json!({"text": "STDERR-MARK-1729"}));
    let m = a.call("env", json!({"name": "SB_TEST_MARK"}));
    assert_eq!(
        m["result"]["content"][0]["text"], "from-env",
        "--env K=V did not reach the backend: {m}"
    );
    assert!(
        p.wait_log("STDERR-MARK-1729", WAIT),
        "the backend's stderr line never appeared in the proxy's log:\n{}",
        p.log()
    );
    let log = p.log();
    let line = log
        .lines()
        .find(|l| l.contains("STDERR-MARK-1729"))
        .unwrap();
    assert!(
        line.contains("INFO"),
        "backend stderr must be logged at INFO: {line}"
    );
}

fn allow_origin_and_allow_host_extend_the_defaults(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args([
            "--allow-origin",
            "https://app.example",
            "--allow-host",
            "mcp.example",
        ])
        .start();
    let mut a = open_session(&p, None);
    a.initialize();
    let body = || Body::json(r#"{"jsonrpc":"2.0","method":"notifications/allowed"}"#);
    let t = a.post_target.clone();
    for (origin, host, status) in [
        ("https://app.example", "mcp.example:443", 202),
        ("https://app.example", "127.0.0.1", 202),
        ("http://localhost:1", "MCP.EXAMPLE", 202),
        ("https://app.example:8443", "mcp.example", 403),
        ("http://app.example", "mcp.example", 403),
        ("https://app.example", "other.example", 403),
    ] {
        let r = p.request("POST", &t, &[("Origin", origin), ("Host", host)], body());
        assert_eq!(
            r.status,
            status,
            "Origin {origin} Host {host}: {}",
            r.text()
        );
    }
    let options = OpenOptions {
        headers: vec![
            ("Origin".into(), "https://app.example".into()),
            ("Host".into(), "mcp.example".into()),
        ],
        ..OpenOptions::default()
    };
    let mut s = try_open_session(p.addr, &options)
        .unwrap_or_else(|r| panic!("allowed origin and host refused: {} {}", r.status, r.text()));
    s.initialize();
    a.sync();
}

/// A failed first `initialize` reaches every client that waited for it, each under its own
/// id; the next `initialize` tries the backend again.
fn failed_initialize_is_shared_then_retried(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND, "--fail-first-initialize"])
        .record()
        .start();
    let mut a = open_session(&p, None);
    let mut b = open_session(&p, None);
    let init = |id: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
            "protocolVersion": "2024-11-05", "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"}}})
    };
    a.send(&init(json!(1)));
    b.send(&init(json!("b-1")));
    for (s, id) in [(&mut a, json!(1)), (&mut b, json!("b-1"))] {
        let m = s.expect_message("the failed initialize");
        assert_eq!(m["id"], id, "{m}");
        assert_eq!(
            m["error"]["code"], -32603,
            "every waiter gets the backend's error: {m}"
        );
        assert!(m.get("result").is_none(), "{m}");
    }
    let r = b.initialize();
    assert_eq!(r["serverInfo"]["name"], "test-backend");
    let r = a.initialize();
    assert_eq!(r["serverInfo"]["name"], "test-backend");
    let inits = recorded_json(&p)
        .iter()
        .filter(|m| m["method"] == "initialize")
        .count();
    assert_eq!(
        inits, 2,
        "one failed and one successful initialize must reach the backend"
    );
}

/// Issue 30.11b: a legacy session whose `initialize` succeeded refuses another with 400 (its
/// audited client cannot change); other sessions are still answered from the cache.
fn second_initialize_in_a_legacy_session_is_400(target: Target) {
    let p = Proxy::builder(target).backend([BACKEND]).record().start();
    let mut a = open_session(&p, None);
    a.initialize();
    let again = json!({"jsonrpc": "2.0", "id": "again", "method": "initialize", "params": {
        "protocolVersion": "2024-11-05", "capabilities": {},
        "clientInfo": {"name": "someone-else", "version": "0"}}});
    let r = a.post(&again.to_string());
    assert_eq!(r.status, 400, "a second initialize: {}", r.text());
    assert_eq!(r.json()["error"]["code"], json!(-32600), "{}", r.text());
    let mut b = open_session(&p, None);
    assert_eq!(b.initialize()["serverInfo"]["name"], "test-backend");
    a.sync();
    assert_eq!(p.recorded_initializes(), 1);
}

suite!(
    unknown_paths_404_and_wrong_methods_405,
    sse_stream_starts_with_endpoint_event,
    base_path_and_public_url_shape_the_endpoint,
    post_refusals_follow_spec_order,
    closed_session_gets_404,
    invalid_bodies_get_400_and_never_reach_the_backend,
    session_id_aliases,
    stream_refusals_create_nothing,
    max_sessions_gives_503,
    colliding_ids_two_principals_reordered,
    big_and_string_ids_round_trip_exactly,
    forged_routed_ids_stay_with_their_sender,
    cancelled_and_progress_tokens_are_rewritten,
    progress_reaches_only_its_session,
    initialize_reaches_the_backend_once,
    list_changed_broadcast_without_params,
    unattributable_backend_messages_never_reach_clients,
    resources_updated_reaches_subscribers_only,
    foreign_post_is_404_and_owner_undisturbed,
    late_answers_to_a_closed_session_are_dropped,
    long_backend_lines_are_dropped,
    health_json_shape,
    metrics_exposition,
    metrics_auth_requires_a_token,
    keepalive_comments_on_idle_streams,
    backend_stderr_is_logged_and_env_passed,
    allow_origin_and_allow_host_extend_the_defaults,
    failed_initialize_is_shared_then_retried,
    second_initialize_in_a_legacy_session_is_400,
);
