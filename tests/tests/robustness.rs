//! A proxy that outlives its clients' manners and its host's limits, on both binaries:
//! a client that closes its stream is noticed whether or not anything is written to it; a
//! burst of new streams right after heavy use (and beside busy streams) is served (how soon
//! is a figure of `tests/bench_timing.sh`, in `tests/BENCHMARKS.md`); sessions past
//! `--max-sessions` or past what the host's threads and descriptors allow get 503 +
//! Retry-After while the open ones keep working; a port run out of descriptors serves again
//! once they are back; neither another client's large bodies nor another session's flood of
//! requests holds up a session's calls.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use switchboard_tests::{
    echo_body, echoed_args, figure, open_session, suite, try_open_session, wait_until, Conn,
    McpSession, OpenOptions, Proxy, Session, Target, SESSION_NOT_FOUND, WAIT,
};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");

fn departed_client_is_noticed_within_a_second(target: Target) {
    // A long keep-alive: nothing is written to the idle stream meanwhile.
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--keepalive", "1h"])
        .record()
        .start();
    let mut stay = open_session(&p, None);
    stay.initialize();
    let mut leave = open_session(&p, None);
    leave.initialize();
    let sid = leave.sid.clone();
    let post_target = leave.post_target.clone();
    let sessions = |p: &Proxy| p.metric("switchboard_sessions").unwrap_or(-1.0);
    assert_eq!(sessions(&p), 2.0);
    leave.shutdown();
    drop(leave);
    let closed_at = Instant::now();
    let marker = "MARK-DEPARTED-LATE";
    let mut accepted = 0;
    let noticed = loop {
        let r = p.request(
            "POST",
            &post_target,
            &[("Content-Type", "application/json")],
            // A notification the proxy forwards (a cancellation, SPEC 15): the backend
            // answers nothing, so nothing is written to the departed stream that could fail
            // and give the departure away.
            switchboard_tests::Body::json(&format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":"none","reason":"{marker}"}}}}"#
            )),
        );
        if r.status == 404 {
            assert_eq!(r.text(), SESSION_NOT_FOUND);
            break closed_at.elapsed();
        }
        assert_eq!(r.status, 202, "{}", r.text());
        accepted += 1;
        // Noticed at all, whether or not anything is written to the stream; how soon is a
        // figure (`tests/bench_timing.sh`), not an assertion.
        assert!(
            closed_at.elapsed() < WAIT,
            "session {sid} still accepted POSTs {:?} after its client left",
            closed_at.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    figure(target, "departure_noticed", noticed);
    assert_eq!(sessions(&p), 1.0, "the departed session is still counted");
    // Its late answers are dropped, and the other session is untouched; its call is also a
    // barrier: the backend records its stdin in order, so every line the proxy wrote before
    // it is recorded by now. What the departed session POSTed before the proxy noticed
    // (each 202) is the only trace; nothing after the 404.
    let m = stay.call("echo", json!({"still": "here"}));
    assert!(m["result"].is_object(), "{m}");
    let reached = p.recorded().iter().filter(|l| l.contains(marker)).count();
    assert_eq!(
        reached, accepted,
        "{accepted} POSTs for the departed session were accepted, {reached} reached the backend"
    );
    stay.sync();
}

/// `n` sessions opened at once from `n` threads; each must see its endpoint event (within
/// `WAIT`). Returns them, still open, and the slowest one's wait: a figure, not an assertion
/// (on a loaded machine any bound lies; `tests/bench_timing.sh` reports it).
fn open_at_once(p: &Proxy, n: usize, what: &str) -> (Vec<Session>, Duration) {
    let addr = p.addr;
    let started = Instant::now();
    let threads: Vec<_> = (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                let begun = Instant::now();
                let s = try_open_session(addr, &OpenOptions::default());
                (begun.elapsed(), s.map_err(|r| r.status))
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    let mut sessions = Vec::with_capacity(n);
    for t in threads {
        let (took, result) = t.join().expect("opener thread");
        let session = result.unwrap_or_else(|status| panic!("{what}: GET /sse answered {status}"));
        sessions.push(session);
        slowest = slowest.max(took);
    }
    println!("{what}: {n} streams opened at once, slowest endpoint event after {slowest:?} ({:?} in all)", started.elapsed());
    (sessions, slowest)
}

fn burst_of_streams_after_load_and_beside_busy_ones(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--max-sessions", "1000"])
        .start();
    // A short load run: 20 sessions, 20 calls each, on keep-alive connections.
    let mut load: Vec<Session> = (0..20).map(|_| open_session(&p, None)).collect();
    for s in &mut load {
        s.initialize();
        for i in 0..20 {
            let r = s.post_fast(&echo_body(&i.to_string(), json!({"n": i})));
            assert_eq!(r.status, 202);
        }
        for _ in 0..20 {
            s.expect_message("load answers");
        }
    }
    drop(load);
    let mut held = Vec::new();
    let mut slowest = Duration::ZERO;
    for round in 1..=3 {
        let (burst, took) = open_at_once(
            &p,
            100,
            &format!("{target:?} after a load run, burst {round}"),
        );
        held.push(burst);
        slowest = slowest.max(took);
        // Let go of the last burst's streams: their pool threads go idle, the setting in
        // which a wake-up was lost.
        held.clear();
    }

    // Again while 50 streams are busy: a thread keeps calls going on them, and the burst
    // starts once it has made a round of calls.
    let mut busy: Vec<Session> = (0..50).map(|_| open_session(&p, None)).collect();
    for s in &mut busy {
        s.initialize();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (busy_tx, busy_rx) = std::sync::mpsc::channel();
    let worker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut busy = busy;
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut calls = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                for s in &mut busy {
                    let r = s.post_fast(&echo_body(&calls.to_string(), json!({"n": calls})));
                    assert_eq!(r.status, 202);
                    s.expect_message("busy answers");
                    calls += 1;
                }
                let _ = busy_tx.send(calls);
            }
            calls
        })
    };
    busy_rx
        .recv_timeout(WAIT)
        .expect("the busy streams made a round of calls");
    figure(target, "burst_of_100_after_load_slowest", slowest);
    let (_beside, slowest) = open_at_once(&p, 100, &format!("{target:?} beside 50 busy streams"));
    figure(target, "burst_of_100_beside_busy_slowest", slowest);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let calls = worker.join().expect("busy worker");
    assert!(calls > 0, "the busy streams made no calls");
}

fn sessions_past_max_sessions_get_503(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--max-sessions", "3"])
        .start();
    let mut open: Vec<Session> = (0..3).map(|_| open_session(&p, None)).collect();
    assert_refused(&p, "past --max-sessions 3");
    for s in &mut open {
        s.initialize();
        assert!(s.call("echo", json!({"ok": 1}))["result"].is_object());
    }
}

fn assert_refused(p: &Proxy, what: &str) {
    let refused = try_open_session(p.addr, &OpenOptions::default())
        .map(|s| s.sid)
        .expect_err(what);
    assert_eq!(refused.status, 503, "{what}: {}", refused.text());
    assert_eq!(
        refused.header("retry-after"),
        Some("1"),
        "{what}: no Retry-After"
    );
}

/// Threads in use on this host (`/proc/loadavg`).
fn threads_in_use() -> u64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().nth(3)?.split('/').nth(1)?.parse().ok())
        .expect("/proc/loadavg")
}

fn sessions_past_the_thread_limit_get_503(target: Target) {
    // Room for a few hundred threads beyond those in use: the blocking binary reserves
    // 256 for its other threads and budgets the rest, one per session.
    let limit = threads_in_use() + 256 + 40;
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .nproc_limit(limit)
        .start();
    // The tokio binary spends no thread per session: the limit does not bind it.
    sessions_past_the_budget_get_503(&p, &format!("RLIMIT_NPROC {limit}"), 200, 100);
}

/// Descriptors the proxy may hold: its own few, a handful of sessions and some connections.
const FILES: u64 = 160;

fn sessions_past_the_descriptor_limit_get_503(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .nofile_limit(FILES)
        .start();
    // One descriptor a session: the limit binds the tokio binary later. The blocking
    // binary budgets two (the stream's connection and its client's POST connection).
    sessions_past_the_budget_get_503(&p, &format!("RLIMIT_NOFILE {FILES}"), 60, 20);
}

/// Under `limit`, the blocking binary's session budget is below `most` and sessions past it
/// get 503 while those open keep working; the tokio binary (not bound by it) serves
/// `tokio_sessions`.
fn sessions_past_the_budget_get_503(p: &Proxy, limit: &str, most: usize, tokio_sessions: usize) {
    let mut open = Vec::new();
    match p.target {
        Target::Blocking => {
            let budget = session_budget(p);
            assert!(budget < most, "the budget ({budget}) ignores {limit}");
            println!("blocking: {limit} allows {budget} sessions");
            for _ in 0..budget {
                open.push(open_session(p, None));
            }
            assert_refused(p, &format!("past the budget {limit} allows"));
        }
        Target::Tokio => open.extend((0..tokio_sessions).map(|_| open_session(p, None))),
    }
    for s in open.iter_mut().step_by(5) {
        s.initialize();
        assert!(s.call("echo", json!({"ok": 1}))["result"].is_object());
    }
    let (status, health) = p.health();
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["sessions"], open.len());
}

/// A flood of idle connections runs the proxy out of descriptors (accepts fail meanwhile);
/// once they are gone a new session is served, and the old one still works, on a
/// connection opened before the flood too.
fn port_recovers_after_running_out_of_descriptors(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .nofile_limit(FILES)
        .start();
    let mut old = open_session(&p, None);
    old.initialize();
    // A keep-alive connection from before the flood, accepted by the first server.
    assert_eq!(
        old.post_fast(&echo_body("1", json!({"before": 1}))).status,
        202
    );
    old.expect_message("the answer before the flood");
    let flood: Vec<TcpStream> = (0..FILES + 40)
        .filter_map(|_| TcpStream::connect_timeout(&p.addr, Duration::from_secs(1)).ok())
        .collect();
    assert!(
        flood.len() as u64 > FILES / 2,
        "the flood could not connect"
    );
    assert!(
        p.wait_log("accept failed", WAIT),
        "the flood never ran the proxy out of descriptors:\n{}",
        p.log()
    );
    drop(flood);
    let mut new = open_session(&p, None);
    new.initialize();
    assert!(new.call("echo", json!({"new": 1}))["result"].is_object());
    assert!(old.call("echo", json!({"old": 1}))["result"].is_object());
    assert_eq!(
        old.post_fast(&echo_body("2", json!({"after": 1}))).status,
        202
    );
    old.expect_message("the answer on the connection from before the flood");
    if target == Target::Blocking {
        assert!(
            p.wait_log("accepting connections again", WAIT),
            "the blocking binary never said it accepts again:\n{}",
            p.log()
        );
    }
    let (status, health) = p.health();
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["sessions"], 2);
}

/// A client that pipelines requests on one connection and reads none of the answers holds
/// up nobody else: another session's calls and `/health` are answered meanwhile, and both
/// binaries serve it one request at a time until `--max-pipelined` requests wait behind
/// unread answers, then refuse the next and close the connection.
fn a_client_reading_no_answers_holds_up_nobody(target: Target) {
    let p = Proxy::builder(target).backend([BACKEND]).start();
    let greedy = open_session(&p, None);
    let body = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let one = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        greedy.post_target,
        p.addr,
        body.len()
    );
    let burst = one.repeat(1000).into_bytes();
    let mut pipelining = TcpStream::connect(p.addr).expect("connect");
    pipelining.set_nonblocking(true).expect("nonblocking");
    // Bounded: a few seconds or a few tens of MB, whichever comes first.
    let (until, mut sent) = (Instant::now() + Duration::from_secs(3), 0usize);
    while Instant::now() < until && sent < 64 << 20 {
        // Whole requests back to back, however the writes split them.
        match std::io::Write::write(&mut pipelining, &burst[sent % burst.len()..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10))
            }
            // Cut off: what the blocking binary does.
            Err(_) => break,
        }
    }
    assert!(
        sent > one.len() * 100,
        "the pipelined requests were not sent"
    );
    let mut other = open_session(&p, None);
    other.initialize();
    assert!(other.call("echo", json!({"beside": 1}))["result"].is_object());
    let (status, health) = p.health();
    assert_eq!(status, 200, "{health}");
    pipelining.set_nonblocking(false).expect("blocking");
    pipelining.set_read_timeout(Some(WAIT)).expect("timeout");
    let closed = match std::io::Read::read_to_end(&mut pipelining, &mut Vec::new()) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(closed, "{target:?} did not close the pipelining connection");
}

/// Members of a hog's body: ~3 MiB of JSON, whose parse (every key checked for duplicates)
/// takes a debug build far longer than a `ping` takes.
const HOG_MEMBERS: usize = 180_000;

/// Issue 30 item 6: a POST's body is parsed where it arrives (its connection's thread or
/// task), not on the hub's one thread, so other clients' large bodies hold up no session.
/// Two hog threads, each with its own Streamable session and keep-alive connection, POST
/// ~3 MiB bodies in a loop (one object of many members whose last key repeats an earlier
/// one: the proxy reads it whole and refuses it 400, so nothing reaches the backend and the
/// cost is the parse alone). Meanwhile a probe session sends `ping`s one after another.
/// When the hub parsed every body, each ping waited behind a whole parse: about one ping
/// per hog post answered. Now the probe's pings outnumber the hog posts answered in the
/// same window many times over: a ratio of counts, not a time bound.
fn large_bodies_never_hold_up_another_session(target: Target) {
    const PINGS: usize = 100;
    // The probe's pings must outnumber the hog posts answered meanwhile this many times.
    const RATIO: usize = 10;
    const HOGS: usize = 2;
    let p = Proxy::builder(target).backend([BACKEND]).start();
    let probe = McpSession::start(&p, None);
    let members: Vec<String> = (0..HOG_MEMBERS).map(|n| format!(r#""k{n}":{n}"#)).collect();
    let body = Arc::new(
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{{},"k0":0}}}}}}"#,
            members.join(",")
        )
        .into_bytes(),
    );
    assert!(
        body.len() > 2 << 20 && body.len() < 8 << 20,
        "{}",
        body.len()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let answered: Arc<Vec<AtomicUsize>> =
        Arc::new((0..HOGS).map(|_| AtomicUsize::new(0)).collect());
    let hogs: Vec<_> = (0..HOGS)
        .map(|i| {
            let session = McpSession::start(&p, None);
            let (body, stop, answered) = (body.clone(), stop.clone(), answered.clone());
            std::thread::spawn(move || {
                let headers = [
                    ("Content-Type", "application/json"),
                    ("Accept", "application/json, text/event-stream"),
                    ("MCP-Protocol-Version", "2025-06-18"),
                    ("Mcp-Session-Id", session.sid.as_str()),
                ];
                let mut conn = Conn::new(session.addr, WAIT);
                // Bounded in count and time; normally ended by `stop` once the probe is done.
                let deadline = Instant::now() + 6 * WAIT;
                let mut posts = 0;
                while !stop.load(Ordering::Relaxed) && posts < 1_000 && Instant::now() < deadline {
                    let r = conn
                        .request("POST", "/mcp", &headers, &body)
                        .unwrap_or_else(|e| panic!("hog {i}: POST /mcp failed: {e}"));
                    assert_eq!(r.status, 400, "hog {i}: {}", r.text());
                    posts += 1;
                    answered[i].fetch_add(1, Ordering::Relaxed);
                }
                posts
            })
        })
        .collect();
    let total = || {
        answered
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .sum::<usize>()
    };
    // Every hog is in its loop: it has had a body answered and has sent the next.
    wait_until("every hog had a body answered", 3 * WAIT, || {
        answered
            .iter()
            .all(|a| a.load(Ordering::Relaxed) > 0)
            .then_some(())
    });
    let (before, started) = (total(), Instant::now());
    let mut pings = 0;
    // Bounded: PINGS pings, or as soon as the hogs have had enough posts answered to fail
    // the ratio (quickly, on a hub that parses), or 3 x WAIT.
    while pings < PINGS && total() - before < PINGS / RATIO && started.elapsed() < 3 * WAIT {
        let body = json!({"jsonrpc": "2.0", "id": pings + 1, "method": "ping"});
        let (_, m) = probe.post(&body.to_string()).response();
        assert!(m["result"].is_object(), "ping {pings}: {m}");
        pings += 1;
    }
    let (hog_posts, took) = (total() - before, started.elapsed());
    stop.store(true, Ordering::Relaxed);
    let posts: usize = hogs
        .into_iter()
        .map(|h| h.join().expect("a hog thread failed"))
        .sum();
    println!(
        "{target:?}: {pings} pings in {took:?} while {hog_posts} hog posts of {} bytes were answered ({posts} in all)",
        body.len()
    );
    assert!(
        pings >= RATIO * hog_posts.max(1),
        "{target:?}: the probe's {pings} pings were held up by the hogs' {hog_posts} posts of {} bytes answered meanwhile",
        body.len()
    );
}

/// Issue 30 item 7 (SPEC section 12, fair share): lines for the backend's stdin reach it in
/// turns across sessions, so a session that floods the queue delays another's line by one
/// turn, not by its whole backlog. The backend reads nothing while a `hold` call waits for
/// its gate file; meanwhile one session queues FLOOD echo calls (each ~2 KiB, so few fit the
/// pipe) and then another session queues one. Once the gate opens, the backend's record of
/// its stdin says where the other session's line came: behind what the shell already held
/// (its window and the pipe), not behind the whole flood as when stdin was one FIFO.
fn a_flooding_session_does_not_delay_another(target: Target) {
    const FLOOD: usize = 600;
    // SPEC 12: at most this many client requests written and unanswered; the rest wait
    // in the fair queue, so the other session's call waits behind the window at most.
    const WINDOW: usize = 32;
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--max-inflight", "1024", "--backend-window", "32"])
        .record()
        .start();
    let mut flooder = open_session(&p, None);
    flooder.initialize();
    let mut other = open_session(&p, None);
    other.initialize();
    let gate = p.dir().file("gate");
    let hold = json!({
        "jsonrpc": "2.0", "id": 1_000_000, "method": "tools/call",
        "params": {"name": "hold", "arguments": {"gate": gate}},
    });
    assert_eq!(flooder.post_fast(&hold.to_string()).status, 202);
    p.wait_recorded("the hold call", |l| l.contains(r#""name":"hold""#));
    let pad = "x".repeat(2_000);
    for i in 0..FLOOD {
        let body = echo_body(
            &i.to_string(),
            json!({"mark": "MARK-FLOOD", "n": i, "pad": pad}),
        );
        let r = flooder.post_fast(&body);
        assert_eq!(r.status, 202, "flood call {i}: {}", r.text());
    }
    let r = other.post_fast(&echo_body("1", json!({"mark": "MARK-OTHER"})));
    assert_eq!(r.status, 202, "{}", r.text());
    std::fs::write(&gate, b"open").expect("open the gate");
    let m = other.expect_message("the other session's answer");
    assert_eq!(echoed_args(&m)["mark"], "MARK-OTHER", "{m}");
    // Every flood call is answered too (and the hold call).
    for _ in 0..=FLOOD {
        flooder.expect_message("the flood's answers");
    }
    let recorded = p.recorded();
    let at = recorded
        .iter()
        .position(|l| l.contains("MARK-OTHER"))
        .expect("the other session's call reached the backend");
    let ahead = recorded[..at]
        .iter()
        .filter(|l| l.contains("MARK-FLOOD"))
        .count();
    let flooded = recorded.iter().filter(|l| l.contains("MARK-FLOOD")).count();
    assert_eq!(flooded, FLOOD, "the flood did not all reach the backend");
    println!("{target:?}: the other session's line reached the backend after {ahead} of the flood's {FLOOD}");
    // The hold call has one place in the window, the flood the others.
    assert!(
        ahead < WINDOW,
        "{target:?}: the other session's line waited behind {ahead} of the flood's {FLOOD} lines (window {WINDOW})"
    );
}

/// The blocking binary serves at most its session budget plus 128 connections at once (a
/// thread each): past it a connection is answered 503 at once, the threads the process
/// keeps for itself stay free, and once the idle connections go it serves again. The tokio
/// binary spends no thread per connection.
fn connections_past_the_thread_budget_get_503(target: Target) {
    if target == Target::Tokio {
        return;
    }
    let limit = threads_in_use() + 256 + 40;
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .nproc_limit(limit)
        .args(["--header-timeout", "30s"])
        .start();
    let most = session_budget(&p) + 128;
    let idle: Vec<TcpStream> = (0..most)
        .map(|_| TcpStream::connect(p.addr).expect("connect"))
        .collect();
    let health = |what: &str| {
        let mut socket = TcpStream::connect(p.addr).expect("connect");
        socket.set_read_timeout(Some(WAIT)).expect("timeout");
        let request = format!(
            "GET /health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            p.addr
        );
        socket.write_all(request.as_bytes()).expect("send");
        let mut answer = String::new();
        let _ = socket.read_to_string(&mut answer);
        let status = answer.split(' ').nth(1).unwrap_or_default().to_owned();
        println!("{what}: {status}");
        status
    };
    // The accept thread may not have taken every idle connection yet: it will in turn.
    let deadline = Instant::now() + WAIT;
    while health("past the budget") != "503" {
        assert!(
            Instant::now() < deadline,
            "never refused past {most} connections"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(idle);
    let deadline = Instant::now() + WAIT;
    while health("after the idle ones went") != "200" {
        assert!(Instant::now() < deadline, "never served again");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The session budget the blocking binary logged at start.
fn session_budget(p: &Proxy) -> usize {
    p.log()
        .lines()
        .find_map(|l| {
            l.split("session budget: ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .expect("the blocking binary logs its session budget")
}

suite!(
    a_client_reading_no_answers_holds_up_nobody,
    a_flooding_session_does_not_delay_another,
    departed_client_is_noticed_within_a_second,
    large_bodies_never_hold_up_another_session,
    port_recovers_after_running_out_of_descriptors,
    sessions_past_the_descriptor_limit_get_503,
    burst_of_streams_after_load_and_beside_busy_ones,
    sessions_past_max_sessions_get_503,
    sessions_past_the_thread_limit_get_503,
    connections_past_the_thread_budget_get_503,
);
