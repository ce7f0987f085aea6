//! End-to-end under stress and failure: huge bodies, a crashing backend, a slow consumer,
//! a thousand idle sessions, shutdown. SPEC sections 4, 5 and 6.6, against the real binary.

use std::time::{Duration, Instant};

use serde_json::json;
use switchboard_tests::{
    echoed_args, figure, open_session, suite, try_open_session, Body, OpenOptions, Proxy, Session,
    Target, SESSION_NOT_FOUND, WAIT,
};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");

/// A 100 MB body is refused with 413 whether announced or chunked, and the proxy never
/// holds it: its peak RSS stays far below 100 MB.
fn hundred_megabyte_body_gets_413_in_bounded_memory(target: Target) {
    let p = Proxy::builder(target).backend([BACKEND]).start();
    let mut a = open_session(&p, None);
    a.initialize();
    let before = p.proc_status_kb("VmHWM");
    const HUNDRED_MB: u64 = 100 * 1000 * 1000;
    for chunked in [false, true] {
        let started = Instant::now();
        let r = a.post_with(
            Body::Repeat {
                chunk: vec![b' '; 64 * 1024],
                total: HUNDRED_MB,
                chunked,
            },
            &[],
        );
        assert_eq!(
            r.status,
            413,
            "100 MB body (chunked: {chunked}): {}",
            r.text()
        );
        println!(
            "{target:?}: 100 MB body (chunked: {chunked}) refused in {:?}",
            started.elapsed()
        );
    }
    let after = p.proc_status_kb("VmHWM");
    println!("{target:?}: proxy VmHWM before {before} kB, after the 100 MB bodies {after} kB");
    assert!(
        after < 64 * 1024,
        "the proxy's peak RSS reached {after} kB (from {before} kB) while refusing 100 MB bodies"
    );
    a.sync();
}

/// The backend dies mid-call: every stream ends, /health goes 503, the backend comes back
/// (a new process that is initialized afresh) and new sessions work.
fn backend_crash_closes_sessions_and_restarts(target: Target) {
    let marker = switchboard_tests::TempDir::new("restart-marker");
    let marker_path = marker.file("started");
    let p = Proxy::builder(target)
        .backend([
            BACKEND.to_owned(),
            "--fail-second-initialize".to_owned(),
            "--slow-restart".to_owned(),
            marker_path.display().to_string(),
        ])
        .args([
            "--ping-timeout",
            "500ms",
            "--on-backend-exit",
            "close-sessions",
        ])
        .record()
        .start();
    let (_, h) = p.health();
    let old_pid = h["backend"]["pid"].as_u64().expect("backend.pid");
    let mut a = open_session(&p, None);
    let mut b = open_session(&p, None);
    a.initialize();
    b.initialize();
    let r = a.post(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exit","arguments":{"code":1}}}"#);
    assert_eq!(r.status, 202, "{}", r.text());

    // The outage lasts the restart backoff (0.5 s at first) plus the 2 s the restarted
    // test-backend sleeps before it answers pings (`--slow-restart`).
    let deadline = Instant::now() + WAIT;
    let mut saw_503 = None;
    let mut refused_stream = None;
    while Instant::now() < deadline && saw_503.is_none() {
        let (status, body) = p.health();
        if status == 503 {
            assert!(
                body["backend"]["running"].is_boolean(),
                "503 /health keeps its shape: {body}"
            );
            saw_503 = Some(body);
            refused_stream = Some(try_open_session(p.addr, &OpenOptions::default()));
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let body = saw_503.expect("/health never said 503 after the backend died");
    println!("{target:?}: /health while down: {body}");
    match refused_stream.expect("tried") {
        Ok(s) => {
            // The backend may have come back between the two requests; then it must work.
            println!(
                "{target:?}: the backend was back before GET /sse ({})",
                s.sid
            );
        }
        Err(r) => {
            assert_eq!(
                r.status,
                503,
                "GET /sse while the backend is down: {}",
                r.text()
            );
            assert!(r.header("retry-after").is_some(), "503 without Retry-After");
        }
    }
    assert!(
        a.wait_closed(WAIT),
        "session a's stream did not end when the backend died"
    );
    assert!(
        b.wait_closed(WAIT),
        "session b's stream did not end when the backend died"
    );

    let h = p.wait_health(200, Duration::from_secs(20));
    assert!(h["backend"]["restarts"].as_u64().unwrap_or(0) >= 1, "{h}");
    assert_ne!(
        h["backend"]["pid"].as_u64(),
        Some(old_pid),
        "same backend pid after a restart: {h}"
    );
    let r = a.post(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#);
    assert_eq!(
        r.status, 404,
        "a session closed by the crash still accepts POSTs"
    );
    assert_eq!(r.text(), SESSION_NOT_FOUND);

    let mut c = open_session(&p, None);
    let init = c.initialize();
    assert_eq!(init["serverInfo"]["name"], "test-backend");
    let m = c.call("echo", json!({"after": "restart"}));
    assert_eq!(echoed_args(&m), json!({"after": "restart"}));
    let inits = p.recorded_initializes();
    assert_eq!(
        inits, 2,
        "each backend process must be initialized exactly once"
    );
}

/// A backend that exits 0 under `--restart on-failure` (the default) stops the proxy with
/// status 0; under `--restart never` the proxy exits with the backend's status.
fn backend_exit_without_restart_stops_the_proxy(target: Target) {
    for (args, code) in [(vec![], 0), (vec!["--restart", "never"], 3)] {
        let mut p = Proxy::builder(target)
            .backend([BACKEND])
            .args(args.clone())
            .args(["--grace", "1s"])
            .start();
        let mut a = open_session(&p, None);
        a.initialize();
        let r = a.post(&format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"exit","arguments":{{"code":{code}}}}}}}"#
        ));
        assert_eq!(r.status, 202);
        let status = p.wait_exit(Duration::from_secs(15)).unwrap_or_else(|| {
            panic!("args {args:?}: the proxy kept running after its backend exited {code}")
        });
        assert_eq!(
            status.code(),
            Some(code),
            "args {args:?}: proxy exit status {status}"
        );
        assert!(a.wait_closed(WAIT), "the stream outlived the proxy");
    }
}

/// One client never reads its stream and floods the backend while another runs 10,000
/// calls: every call of the reader is accepted (202) and answered exactly once, however slow
/// the machine (SPEC 12's fair share: the flood only ever costs the flooder, which may get
/// 503 for its own POSTs), and the slow session is closed (not thinned, not stalling
/// anyone). No timing is asserted: only that nobody stalls past the usual wait.
fn slow_consumer_is_closed_and_never_stalls_others(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--session-buffer", "64KiB"])
        .start();
    let mut fast = open_session(&p, None);
    fast.initialize();
    let slow = try_open_session(
        p.addr,
        &OpenOptions {
            recv_buffer: Some(4096),
            ..OpenOptions::default()
        },
    )
    .unwrap_or_else(|r| panic!("slow stream refused: {}", r.status));
    let slow_target = slow.post_target.clone();
    let slow_sid = slow.sid.clone();
    let addr = p.addr;

    // The slow client floods its own stream with 16 KiB answers it never reads.
    let flooder = std::thread::spawn(move || {
        let mut conn = switchboard_tests::Conn::new(addr, WAIT);
        let pad = "p".repeat(16 * 1024);
        let (mut accepted, mut busy) = (0, 0);
        for i in 0..2_000 {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"echo","arguments":{{"pad":"{pad}"}}}}}}"#
            );
            let r = conn
                .request(
                    "POST",
                    &slow_target,
                    &[("Content-Type", "application/json")],
                    body.as_bytes(),
                )
                .expect("POST for the slow session");
            match r.status {
                202 => accepted += 1,
                // Its own fair share of the backend is full: only it is refused.
                503 => busy += 1,
                404 => return (accepted, busy, true),
                other => panic!("slow session POST answered {other}: {}", r.text()),
            }
        }
        (accepted, busy, false)
    });

    const N: u64 = 10_000;
    const K: u64 = 32;
    let started = Instant::now();
    let (mut sent, mut received) = (0u64, 0u64);
    let mut seen = vec![false; N as usize];
    while received < N {
        while sent < N && sent - received < K {
            let r = fast.post_fast(&format!(
                r#"{{"jsonrpc":"2.0","id":{sent},"method":"tools/call","params":{{"name":"echo","arguments":{{"n":{sent}}}}}}}"#
            ));
            assert_eq!(r.status, 202, "call {sent}: {}", r.text());
            sent += 1;
        }
        let m = fast
            .next_message(WAIT)
            .unwrap_or_else(|| panic!("the fast session stalled after {received} of {N} answers"));
        let id = m["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("unexpected message {m}"));
        assert_eq!(echoed_args(&m)["n"], id, "{m}");
        assert!(!seen[id as usize], "answer {id} delivered twice");
        seen[id as usize] = true;
        received += 1;
    }
    let elapsed = started.elapsed();
    println!(
        "{target:?}: 10,000 echo calls ({K} in flight) beside a stalled client in {elapsed:?} ({:.0} calls/s)",
        N as f64 / elapsed.as_secs_f64()
    );
    let (accepted, busy, closed_while_posting) = flooder.join().expect("flooder panicked");
    println!("{target:?}: the slow session accepted {accepted} calls, {busy} got 503; closed while posting: {closed_while_posting}");

    // The slow session must have been closed: its POSTs get 404 and its stream ends.
    let deadline = Instant::now() + WAIT;
    loop {
        let r = p.request(
            "POST",
            &format!("/messages?session_id={slow_sid}"),
            &[],
            Body::json(r#"{"jsonrpc":"2.0","method":"notifications/x"}"#),
        );
        if r.status == 404 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow session ({accepted} × 16 KiB queued against a 64 KiB --session-buffer) was never closed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut slow = slow;
    assert!(
        slow.wait_closed(Duration::from_secs(30)),
        "the slow session's stream did not end after it was closed"
    );
    fast.sync();
}

/// A thousand idle sessions at once; every one is live and usable, and they all go away.
fn thousand_idle_sessions(target: Target) {
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--keepalive", "1s"])
        .start();
    let rss_before = p.proc_status_kb("VmRSS");
    let started = Instant::now();
    let mut sessions: Vec<Session> = Vec::with_capacity(1000);
    for i in 0..1000 {
        match try_open_session(p.addr, &OpenOptions::default()) {
            Ok(s) => sessions.push(s),
            Err(r) => panic!("session {i} refused: {} {}", r.status, r.text()),
        }
    }
    let opened_in = started.elapsed();
    let (_, h) = p.health();
    assert_eq!(h["sessions"], 1000, "{h}");
    assert_eq!(p.metric("switchboard_sessions"), Some(1000.0));
    let rss = p.proc_status_kb("VmRSS");
    println!(
        "{target:?}: 1,000 idle sessions opened in {opened_in:?}; proxy VmRSS {rss} kB (was {rss_before} kB, {:.1} kB per session)",
        (rss.saturating_sub(rss_before)) as f64 / 1000.0
    );
    let mut ids = std::collections::BTreeSet::new();
    for s in &sessions {
        assert!(ids.insert(s.sid.clone()), "duplicate sid {}", s.sid);
    }
    for i in [0, 499, 999] {
        let s = &mut sessions[i];
        s.initialize();
        let m = s.call("echo", json!({"session": i}));
        assert_eq!(echoed_args(&m), json!({"session": i}));
    }
    // An idle session receives nothing but keep-alives (the barrier's answer comes next).
    sessions[1].sync();
    for s in &sessions {
        s.shutdown();
    }
    drop(sessions);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, h) = p.health();
        if h["sessions"] == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sessions of closed clients were never reaped: {h}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SIGTERM with live sessions and a call in flight: streams end and the proxy exits 0
/// within the grace period.
fn sigterm_with_live_sessions_exits_zero(target: Target) {
    let mut p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--grace", "2s"])
        .start();
    let mut a = open_session(&p, None);
    let mut b = open_session(&p, None);
    a.initialize();
    b.initialize();
    let r = a.post(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delay","arguments":{"ms":60000}}}"#);
    assert_eq!(r.status, 202);
    let started = Instant::now();
    p.signal(libc::SIGTERM);
    let status = p
        .wait_exit(Duration::from_secs(10))
        .expect("the proxy did not exit within 10 s of SIGTERM (--grace 2s)");
    // It does not wait for the 60 s call (the bound above); how soon it exits is a figure
    // (`tests/bench_timing.sh`), not an assertion.
    figure(target, "sigterm_exit_grace_2s", started.elapsed());
    assert_eq!(
        status.code(),
        Some(0),
        "exit status after SIGTERM: {status}"
    );
    assert!(
        a.wait_closed(WAIT),
        "session a's stream did not end on shutdown"
    );
    assert!(
        b.wait_closed(WAIT),
        "session b's stream did not end on shutdown"
    );
}

/// SPEC sections 5 and 11: the audit log's sink stalls (a FIFO whose reader never reads,
/// so its pipe fills up): the proxy still exits after SIGTERM, giving the writer at most
/// `--grace`, and its audit queue stays within `--audit-buffer` meanwhile.
fn sigterm_with_stalled_audit_sink_exits(target: Target) {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = switchboard_tests::TempDir::new("audit-fifo");
    let fifo = dir.file("audit.fifo");
    let path = std::ffi::CString::new(fifo.display().to_string()).expect("no NUL");
    // SAFETY: mkfifo reads the NUL-terminated path, which lives for the call.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "mkfifo");
    // Opened for reading (so the proxy's open for writing succeeds), never read.
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("open the FIFO for reading");
    let mut p = Proxy::builder(target)
        .backend([BACKEND])
        .args([
            "--grace",
            "1s",
            "--audit-include-data",
            "--audit-buffer",
            "1MiB",
        ])
        .arg(format!("--audit-log={}", fifo.display()))
        .start();
    let mut a = open_session(&p, None);
    a.initialize();
    // Events of about 8 KiB each: far more than the pipe holds (64 KiB).
    let big = "x".repeat(4096);
    for n in 0..200 {
        let m = a.call("echo", json!({ "n": n, "pad": big }));
        assert_eq!(echoed_args(&m)["n"], n);
    }
    let started = Instant::now();
    p.signal(libc::SIGTERM);
    let status = p
        .wait_exit(Duration::from_secs(60))
        .expect("the proxy did not exit within 60 s of SIGTERM while its audit sink stalled");
    println!(
        "{target:?}: exited {status} {:?} after SIGTERM",
        started.elapsed()
    );
    assert_eq!(
        status.code(),
        Some(0),
        "exit status after SIGTERM: {status}"
    );
}

/// SPEC section 12: a request waiting for a restarting backend whose client hangs up stops
/// waiting: it never reaches the new process, and it is counted (`client_left`).
fn request_whose_client_left_stops_waiting(target: Target) {
    use std::io::{Read, Write};
    let marker = switchboard_tests::TempDir::new("restart-marker");
    let marker_path = marker.file("started");
    let p = Proxy::builder(target)
        .backend([
            BACKEND.to_owned(),
            "--slow-restart".to_owned(),
            marker_path.display().to_string(),
        ])
        .record()
        .start();
    let mut a = open_session(&p, None);
    a.initialize();
    let r = a.post(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exit","arguments":{"code":1}}}"#);
    assert_eq!(r.status, 202, "{}", r.text());
    // The restarted process sleeps 2 s before it reads its handshake: requests wait.
    p.wait_health(503, WAIT);
    let body = r#"{"jsonrpc":"2.0","id":"left","method":"tools/call","params":{"name":"echo","arguments":{"left":true}}}"#;
    let mut client = std::net::TcpStream::connect(p.addr).expect("connect");
    write!(
        client,
        "POST /messages?session_id={} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        a.sid,
        body.len()
    )
    .expect("write the POST");
    // It waits for the backend: no answer comes while the restart sleeps (a pause long
    // enough for the request to reach the hub; under load an answer could only come late,
    // never wrongly, and the metric below proves it waited).
    client
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let read = client.read(&mut [0u8; 64]);
    assert!(read.is_err(), "a waiting POST was answered: {read:?}");
    drop(client);
    let series = r#"switchboard_drops_total{reason="client_left",method="tools/call"}"#;
    let deadline = Instant::now() + WAIT;
    while p.metric(series) != Some(1.0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(p.metric(series), Some(1.0), "{}", p.metrics());
    p.wait_health(200, Duration::from_secs(20));
    let mut b = open_session(&p, None);
    b.initialize();
    let m = b.call("echo", json!({"after": "restart"}));
    assert_eq!(echoed_args(&m), json!({"after": "restart"}));
    let reached = p
        .recorded()
        .into_iter()
        .filter(|l| l.contains("left"))
        .count();
    assert_eq!(
        reached, 0,
        "the request whose client left reached the backend"
    );
}

suite!(
    sigterm_with_stalled_audit_sink_exits,
    request_whose_client_left_stops_waiting,
    hundred_megabyte_body_gets_413_in_bounded_memory,
    backend_crash_closes_sessions_and_restarts,
    backend_exit_without_restart_stops_the_proxy,
    slow_consumer_is_closed_and_never_stalls_others,
    thousand_idle_sessions,
    sigterm_with_live_sessions_exits_zero,
);
