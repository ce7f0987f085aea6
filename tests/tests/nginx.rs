//! Several instances behind a real nginx (SPEC section 8), on both binaries: three
//! instances started with `--instance a|b|c`, fronted by nginx running the committed recipe
//! (`tests/nginx/switchboard.conf` and `switchboard-locations.conf`, included verbatim by a
//! generated top-level config that supplies only the ports). New sessions spread over the
//! instances; every request naming a session reaches the instance its id names; a killed
//! instance's clients get the SPEC section 1 404 and start over on a survivor.
//!
//! nginx runs as an ordinary process (`nginx -p PREFIX -c CONF -g 'daemon off;'`) on
//! loopback ports with every path inside its prefix. Without nginx the tests skip loudly,
//! except under `CI=true`, where they fail (`tests/run.sh` installs it).

use std::fs;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchboard_tests::mcp::{Answer, McpSession};
use switchboard_tests::nginx::{
    instance_of, start_mcp, try_start_mcp, Cluster, ALLOWED_ORIGIN, NAMES, PUBLIC_HOST,
};
use switchboard_tests::{
    backend_seen_id, echoed_args, suite, try_open_session, workspace_root, Body, Events,
    OpenOptions, Session, Target, SESSION_NOT_FOUND, WAIT,
};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");
const ALICE: (&str, &str) = ("alice", "alice-token-0123456789abcdef");
const BOB: (&str, &str) = ("bob", "bob-token-fedcba9876543210xyz");

/// POSTs `ping` (JSON) to `target` at `addr` with `auth`.
fn post_ping(
    addr: SocketAddr,
    target: &str,
    auth: &str,
    ping: &str,
) -> switchboard_tests::http::Response {
    switchboard_tests::http::request(
        addr,
        "POST",
        target,
        &[
            ("Authorization", auth),
            ("Content-Type", "application/json"),
        ],
        Body::json(ping),
        WAIT,
    )
    .unwrap_or_else(|e| panic!("POST {target} to {addr}: {e}"))
}

/// A legacy session opened at `addr` with the public Host header.
fn open_legacy(addr: SocketAddr, token: &str) -> Session {
    let options = OpenOptions {
        token: Some(token.to_owned()),
        headers: vec![("Host".into(), PUBLIC_HOST.into())],
        ..OpenOptions::default()
    };
    let mut s = try_open_session(addr, &options)
        .unwrap_or_else(|r| panic!("GET /sse refused: {} {}", r.status, r.text()));
    assert_eq!(
        s.endpoint,
        format!("http://{PUBLIC_HOST}/messages?session_id={}", s.sid),
        "--public-url shapes the endpoint, with the instance's sid"
    );
    s.initialize();
    s
}

/// A delayed echo call: the test backend answers after `ms`, from its own thread.
fn delay_call(id: &Value, ms: u64, who: &str) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "delay", "arguments": {"ms": ms, "who": who, "id": id}},
    })
}

/// Asserts `m` answers `who`'s call `id`, routed through `sid` at the backend.
fn assert_own_answer(m: &Value, who: &str, id: &Value, sid: &str) {
    let args = echoed_args(m);
    assert_eq!(
        args["who"], who,
        "{who} received someone else's answer: {m}"
    );
    assert_eq!(m["id"], *id, "{who}: an answer under another id: {m}");
    assert_eq!(
        args["id"], *id,
        "{who}: the answer is for another call: {m}"
    );
    let seen = backend_seen_id(m);
    assert!(
        seen.as_str()
            .is_some_and(|s| s.starts_with(&format!("{sid}|"))),
        "{who}: the backend saw id {seen}, not one routed through {sid}"
    );
}

/// Reads the one response of a request stream and its end.
fn stream_response(events: &mut Events, what: &str) -> Value {
    let messages = events
        .rest_until_closed(WAIT)
        .unwrap_or_else(|| panic!("{what}: the answer stream did not end within {WAIT:?}"));
    assert_eq!(
        messages.len(),
        1,
        "{what}: one response per request stream: {messages:?}"
    );
    messages.into_iter().next().expect("one message")
}

/// POSTs a call to a Streamable session asking for an event-stream answer.
fn mcp_stream_call(s: &McpSession, body: &Value) -> Events {
    match s.post_with(
        &[("Accept", "text/event-stream"), ("Host", PUBLIC_HOST)],
        &body.to_string(),
    ) {
        Answer::Stream(events) => events,
        Answer::Whole(r) => panic!("POST {body} on {}: {} {}", s.sid, r.status, r.text()),
    }
}

// ---------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------

/// 30 sessions through nginx, both transports, two principals, every session using the
/// same ids at once and a backend answering out of order: new sessions spread over all
/// three instances, and every answer reaches its own session and no other.
fn sessions_spread_and_stay_isolated(target: Target) {
    let started = Instant::now();
    let Some(cluster) = Cluster::start(
        target,
        "sessions_spread_and_stay_isolated",
        BACKEND,
        &[ALICE, BOB],
    ) else {
        return;
    };
    let addr = cluster.nginx.addr;
    let mut legacy: Vec<(String, Session)> = Vec::new();
    let mut streamable: Vec<(String, McpSession)> = Vec::new();
    for n in 0..30 {
        let (principal, token) = if n % 4 < 2 { ALICE } else { BOB };
        let who = format!("{principal}-{n}");
        if n % 2 == 0 {
            legacy.push((who, open_legacy(addr, token)));
        } else {
            streamable.push((who, start_mcp(addr, token)));
        }
    }
    let sids: Vec<&str> = legacy
        .iter()
        .map(|(_, s)| s.sid.as_str())
        .chain(streamable.iter().map(|(_, s)| s.sid.as_str()))
        .collect();
    for name in NAMES {
        let mine = sids.iter().filter(|sid| instance_of(sid) == name).count();
        assert!(mine > 0, "instance {name} got no session of 30: {sids:?}");
    }
    for transport in [
        legacy
            .iter()
            .map(|(_, s)| s.sid.as_str())
            .collect::<Vec<_>>(),
        streamable.iter().map(|(_, s)| s.sid.as_str()).collect(),
    ] {
        let names: std::collections::BTreeSet<&str> =
            transport.iter().map(|sid| instance_of(sid)).collect();
        assert!(
            names.len() > 1,
            "one transport's sessions all went to one instance: {transport:?}"
        );
    }

    // The same ids in every session, later ones answered sooner.
    let ids = [json!(1), json!("same"), json!(0), json!(-3), json!(2)];
    const STEP_MS: u64 = 60;
    let delay = |i: usize, n: usize| (ids.len() - i) as u64 * STEP_MS + (n % 5) as u64 * 7;
    // Each session's calls back to back, sessions of both transports taking turns, every
    // call in flight at once; the delays start together once all are sent (the backends wait
    // for this gate file), so the answers come back reordered however loaded the machine.
    let gate = std::env::temp_dir().join(format!(
        "switchboard-tests-nginx-reorder-{}-{target:?}",
        std::process::id()
    ));
    let _ = fs::remove_file(&gate);
    let gated = |mut call: Value| {
        call["params"]["arguments"]["gate"] = json!(gate);
        call
    };
    let mut pending: Vec<(usize, usize, Events)> = Vec::new();
    for n in 0..legacy.len().max(streamable.len()) {
        if let Some((who, s)) = legacy.get(n) {
            for (i, id) in ids.iter().enumerate() {
                let r = s.post_with(
                    Body::json(&gated(delay_call(id, delay(i, n), who)).to_string()),
                    &[("Host", PUBLIC_HOST)],
                );
                assert_eq!(
                    r.status,
                    202,
                    "{who}: POST through nginx: {} {}",
                    r.status,
                    r.text()
                );
            }
        }
        if let Some((who, s)) = streamable.get(n) {
            for (i, id) in ids.iter().enumerate() {
                let events = mcp_stream_call(s, &gated(delay_call(id, delay(i, n), who)));
                pending.push((n, i, events));
            }
        }
    }
    fs::write(&gate, b"open").expect("open the reorder gate");
    for (n, i, events) in pending.iter_mut() {
        let (who, s) = &streamable[*n];
        let m = stream_response(events, who);
        assert_own_answer(&m, who, &ids[*i], &s.sid);
    }
    for (who, s) in legacy.iter_mut() {
        let mut seen = Vec::new();
        for _ in 0..ids.len() {
            let m = s.expect_message(&format!("{who}'s delayed answers"));
            let id = m["id"].clone();
            assert!(
                ids.contains(&id),
                "{who}: an answer under a foreign id: {m}"
            );
            assert_own_answer(&m, who, &id, &s.sid);
            seen.push(id);
        }
        let mut got: Vec<String> = seen.iter().map(Value::to_string).collect();
        let mut want: Vec<String> = ids.iter().map(Value::to_string).collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{who}: the wrong set of answers");
        assert_ne!(
            seen, ids,
            "{who}: answers came back in order; the test proves less"
        );
        // Nothing else was queued for this session.
        s.sync();
    }
    let _ = fs::remove_file(&gate);
    eprintln!(
        "{target:?}: 30 sessions through nginx in {:?}",
        started.elapsed()
    );
}

/// A session id is only good at the instance it names: sent straight to another instance
/// (or through nginx with another instance's name) it gets the SPEC section 1 404, while
/// its own instance serves it. Origin and Authorization pass through nginx.
fn a_sid_sent_to_another_instance_is_not_found(target: Target) {
    let Some(cluster) = Cluster::start(
        target,
        "a_sid_sent_to_another_instance_is_not_found",
        BACKEND,
        &[ALICE, BOB],
    ) else {
        return;
    };
    let (a, b) = (cluster.instance("a"), cluster.instance("b"));
    let mut legacy = open_legacy(a.addr, ALICE.1);
    let streamable = start_mcp(a.addr, ALICE.1);
    assert_eq!(instance_of(&legacy.sid), "a");
    assert_eq!(instance_of(&streamable.sid), "a");
    let auth = format!("Bearer {}", ALICE.1);
    let ping = r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;

    // Straight to b: 404, both transports.
    let r = post_ping(b.addr, &legacy.post_target, &auth, ping);
    assert_eq!((r.status, r.text().as_str()), (404, SESSION_NOT_FOUND));
    let moved = McpSession {
        addr: b.addr,
        sid: streamable.sid.clone(),
        token: streamable.token.clone(),
        path: streamable.path.clone(),
        initialize_result: Value::Null,
    };
    match moved.post(ping) {
        Answer::Whole(r) => assert_eq!((r.status, r.text().as_str()), (404, SESSION_NOT_FOUND)),
        Answer::Stream(_) => panic!("b answered a's session with a stream"),
    }

    // The same uuid under b's name, through nginx: routed to b, which does not know it.
    let uuid = legacy.sid.split_once('.').expect("a prefixed sid").1;
    let r = post_ping(
        cluster.nginx.addr,
        &format!("/messages?session_id=b.{uuid}"),
        &auth,
        ping,
    );
    assert_eq!((r.status, r.text().as_str()), (404, SESSION_NOT_FOUND));

    // Through nginx, a's sessions reach a, untouched by the attempts above.
    let through = |sid: &str| McpSession {
        addr: cluster.nginx.addr,
        sid: sid.to_owned(),
        token: Some(ALICE.1.to_owned()),
        path: "/mcp".to_owned(),
        initialize_result: Value::Null,
    };
    let m = through(&streamable.sid).call(json!(8), "echo", json!({"via": "nginx"}));
    assert_eq!(echoed_args(&m)["via"], "nginx");
    let r = post_ping(cluster.nginx.addr, &legacy.post_target, &auth, ping);
    assert_eq!(r.status, 202, "{}", r.text());
    let m = legacy.expect_message("the ping's answer");
    assert_eq!(m["id"], 7);

    // Origin and Authorization reach the instance as the client sent them.
    let post = |headers: &[(&str, &str)]| {
        let mut all = vec![("Content-Type", "application/json")];
        all.extend_from_slice(headers);
        switchboard_tests::http::request(
            cluster.nginx.addr,
            "POST",
            &legacy.post_target,
            &all,
            Body::json(ping),
            WAIT,
        )
        .expect("POST through nginx")
    };
    assert_eq!(post(&[]).status, 401, "no credentials");
    let bob = format!("Bearer {}", BOB.1);
    assert_eq!(
        post(&[("Authorization", &bob)]).status,
        404,
        "another principal's session"
    );
    let evil = post(&[("Authorization", &auth), ("Origin", "https://evil.example")]);
    assert_eq!(evil.status, 403, "{}", evil.text());
    let ok = post(&[("Authorization", &auth), ("Origin", ALLOWED_ORIGIN)]);
    assert_eq!(ok.status, 202, "{}", ok.text());
    legacy.expect_message("the ping's answer");

    // /health and /metrics name their instance.
    let (status, health) = a.health();
    assert_eq!((status, &health["instance"]), (200, &json!("a")));
    assert_eq!(
        a.metric(r#"switchboard_instance_info{instance="a"}"#),
        Some(1.0)
    );
}

/// One instance killed (SIGKILL) while calls are in flight everywhere: its clients' streams
/// end and their next requests get the SPEC section 1 404 through nginx, so they start new
/// sessions, which land on survivors; every other session's calls finish without error.
fn killed_instance_clients_move_to_survivors(target: Target) {
    let Some(mut cluster) = Cluster::start(
        target,
        "killed_instance_clients_move_to_survivors",
        BACKEND,
        &[ALICE, BOB],
    ) else {
        return;
    };
    let addr = cluster.nginx.addr;
    let mut legacy: Vec<(String, Session)> = Vec::new();
    let mut streamable: Vec<(String, McpSession)> = Vec::new();
    for n in 0..12 {
        let (principal, token) = if n % 2 == 0 { ALICE } else { BOB };
        let who = format!("{principal}-{n}");
        if (n / 3) % 2 == 0 {
            legacy.push((who, open_legacy(addr, token)));
        } else {
            streamable.push((who, start_mcp(addr, token)));
        }
    }
    let victim = "c";
    let on_victim = |sid: &str| instance_of(sid) == victim;
    assert!(
        legacy.iter().any(|(_, s)| on_victim(&s.sid))
            || streamable.iter().any(|(_, s)| on_victim(&s.sid)),
        "no session landed on {victim}"
    );

    // A slow call in flight in every session.
    const SLOW_MS: u64 = 1_500;
    let id = json!(42);
    for (who, s) in &legacy {
        let r = s.post_with(
            Body::json(&delay_call(&id, SLOW_MS, who).to_string()),
            &[("Host", PUBLIC_HOST)],
        );
        assert_eq!(r.status, 202, "{who}: {}", r.text());
    }
    let mut in_flight: Vec<Events> = streamable
        .iter()
        .map(|(who, s)| mcp_stream_call(s, &delay_call(&id, SLOW_MS, who)))
        .collect();
    // And, in every Streamable session, one waiting for a JSON answer.
    let waiting: Vec<_> = streamable
        .iter()
        .map(|(who, s)| {
            let (who, sid, token) = (who.clone(), s.sid.clone(), s.token.clone());
            let body = delay_call(&json!("json"), SLOW_MS, &who).to_string();
            std::thread::spawn(move || {
                let s = McpSession {
                    addr,
                    sid,
                    token,
                    path: "/mcp".to_owned(),
                    initialize_result: Value::Null,
                };
                match s.post_with(
                    &[("Accept", "application/json"), ("Host", PUBLIC_HOST)],
                    &body,
                ) {
                    Answer::Whole(r) => (r.status, r.text()),
                    Answer::Stream(_) => panic!("{who}: a stream for a JSON-only client"),
                }
            })
        })
        .collect();
    // Wait until the JSON requests have reached their instances' backends.
    for (who, s) in &streamable {
        let needle = format!("\"who\":\"{who}\"");
        cluster
            .instance(instance_of(&s.sid))
            .wait_recorded(&format!("{who}'s JSON call"), |l| {
                l.contains(&needle) && l.contains("\"id\":\"json\"")
            });
    }

    // Kill c, hard.
    let killed_at = Instant::now();
    let i = NAMES.iter().position(|n| *n == victim).expect("a name");
    cluster.instances[i].signal(libc::SIGKILL);
    assert!(
        cluster.instances[i].wait_exit(WAIT).is_some(),
        "instance {victim} did not die"
    );

    // Survivors: their calls finish, answered under their own ids, without error.
    for ((who, s), events) in streamable.iter().zip(in_flight.iter_mut()) {
        if on_victim(&s.sid) {
            let rest = events
                .rest_until_closed(WAIT)
                .unwrap_or_else(|| panic!("{who}: the dead instance's stream stayed open"));
            assert!(
                rest.iter().all(|m| m.get("result").is_none()),
                "{who}: an answer from a dead instance: {rest:?}"
            );
        } else {
            let m = stream_response(events, who);
            assert_own_answer(&m, who, &id, &s.sid);
        }
    }
    for ((who, s), waiter) in streamable.iter().zip(waiting) {
        let (status, text) = waiter.join().expect("the JSON request's thread");
        if on_victim(&s.sid) {
            // nginx lost the instance before the answer's head: the SPEC 404.
            assert_eq!((status, text.as_str()), (404, SESSION_NOT_FOUND), "{who}");
        } else {
            assert_eq!(status, 200, "{who}: {text}");
            let m: Value = serde_json::from_str(&text).expect("a JSON answer");
            assert_own_answer(&m, who, &json!("json"), &s.sid);
        }
    }
    for (who, s) in legacy.iter_mut() {
        if on_victim(&s.sid) {
            assert!(
                s.wait_closed(WAIT),
                "{who}: the dead instance's stream stayed open"
            );
        } else {
            let m = s.expect_message(&format!("{who}'s slow answer"));
            assert_own_answer(&m, who, &id, &s.sid);
        }
    }
    assert!(
        killed_at.elapsed() < Duration::from_millis(SLOW_MS) + WAIT,
        "the survivors' answers took too long"
    );

    // The victim's clients: 404 with the SPEC body through nginx, then a new session on a
    // survivor, which works.
    let ping = r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#;
    let mut moved = 0;
    for (who, s) in legacy.iter_mut().filter(|(_, s)| on_victim(&s.sid)) {
        let r = s.post_with(Body::json(ping), &[("Host", PUBLIC_HOST)]);
        assert_eq!(
            (r.status, r.text().as_str()),
            (404, SESSION_NOT_FOUND),
            "{who}"
        );
        assert_eq!(r.header("content-type"), Some("application/json"), "{who}");
        let token = s.token.clone().expect("a token");
        let mut fresh = reopen(|| {
            let options = OpenOptions {
                token: Some(token.clone()),
                headers: vec![("Host".into(), PUBLIC_HOST.into())],
                ..OpenOptions::default()
            };
            try_open_session(addr, &options).map_err(|r| r.status)
        });
        assert_ne!(
            instance_of(&fresh.sid),
            victim,
            "{who} started over on the dead instance"
        );
        fresh.initialize();
        let m = fresh.call("echo", json!({"who": who}));
        assert_eq!(echoed_args(&m)["who"], who.as_str());
        *s = fresh;
        moved += 1;
    }
    for (who, s) in streamable.iter_mut().filter(|(_, s)| on_victim(&s.sid)) {
        match s.post_with(&[("Host", PUBLIC_HOST)], ping) {
            Answer::Whole(r) => {
                assert_eq!(
                    (r.status, r.text().as_str()),
                    (404, SESSION_NOT_FOUND),
                    "{who}"
                );
            }
            Answer::Stream(_) => panic!("{who}: a stream from a dead instance"),
        }
        let token = s.token.clone().expect("a token");
        let fresh = reopen(|| try_start_mcp(addr, &token));
        assert_ne!(
            instance_of(&fresh.sid),
            victim,
            "{who} started over on the dead instance"
        );
        let m = fresh.call(json!(10), "echo", json!({"who": who}));
        assert_eq!(echoed_args(&m)["who"], who.as_str());
        *s = fresh;
        moved += 1;
    }
    assert!(moved > 0);

    // Every session, old survivors and moved ones, still works.
    for (who, s) in legacy.iter_mut() {
        let m = s.call("echo", json!({"who": who}));
        assert_eq!(echoed_args(&m)["who"], who.as_str());
        s.sync();
    }
    for (n, (who, s)) in streamable.iter().enumerate() {
        let m = s.call(json!(100 + n), "echo", json!({"who": who}));
        assert_eq!(echoed_args(&m)["who"], who.as_str());
    }
}

/// A new session, retried while nginx answers 503 (it may still be finding out that an
/// instance is gone); at most a few tries within `WAIT`.
fn reopen<T>(mut open: impl FnMut() -> Result<T, u16>) -> T {
    let deadline = Instant::now() + WAIT;
    for _ in 0..20 {
        match open() {
            Ok(session) => return session,
            Err(503) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(status) => panic!("a new session through nginx was refused: {status}"),
        }
    }
    panic!("no new session through nginx within 20 tries");
}

/// The recipe's README (`tests/nginx/README.md`) shows the files the tests run, verbatim.
#[test]
fn readme_shows_the_tested_recipe() {
    let recipe = workspace_root().join("tests/nginx");
    let readme = fs::read_to_string(recipe.join("README.md")).expect("tests/nginx/README.md");
    for file in ["switchboard.conf", "switchboard-locations.conf"] {
        let text = fs::read_to_string(recipe.join(file)).expect("the recipe file");
        assert!(
            readme.contains(&format!("```nginx\n{text}```\n")),
            "tests/nginx/README.md does not show tests/nginx/{file} verbatim in an nginx code block"
        );
    }
}

suite!(
    sessions_spread_and_stay_isolated,
    a_sid_sent_to_another_instance_is_not_found,
    killed_instance_clients_move_to_survivors,
);
