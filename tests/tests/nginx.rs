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
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchboard_tests::mcp::{self, Answer, McpSession};
use switchboard_tests::{
    backend_seen_id, echoed_args, suite, try_open_session, workspace_root, Body, Events,
    OpenOptions, Proxy, Session, Target, TempDir, SESSION_NOT_FOUND, WAIT,
};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");
const ALICE: (&str, &str) = ("alice", "alice-token-0123456789abcdef");
const BOB: (&str, &str) = ("bob", "bob-token-fedcba9876543210xyz");
/// The public name clients use; the instances allow it (`--allow-host`) and put it in
/// their endpoint URLs (`--public-url`), and nginx must pass it through.
const PUBLIC_HOST: &str = "mcp.example.test";
const ALLOWED_ORIGIN: &str = "https://app.example.test";
const NAMES: [&str; 3] = ["a", "b", "c"];

// ---------------------------------------------------------------------------------------
// nginx as a plain process
// ---------------------------------------------------------------------------------------

/// `$SWITCHBOARD_NGINX`, else `nginx` on `PATH` or in the sbin directories Debian uses.
fn nginx_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SWITCHBOARD_NGINX") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join("nginx"))
        .find(|p| p.is_file())
}

/// The binary, or `None` after a loud skip message; under `CI=true` a missing nginx fails.
fn nginx_or_skip(test: &str) -> Option<PathBuf> {
    let found = nginx_binary();
    if found.is_none() {
        let msg = "nginx is not installed: `tests/run.sh` installs it (apt-get install nginx), or set SWITCHBOARD_NGINX";
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{msg}");
        }
        // Past the harness's capture (which takes `eprintln!`), in one write.
        let text = format!("\n**********\nSKIPPED: {test}: {msg}\n**********\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr(), text.as_bytes());
    }
    found
}

/// A running nginx in its own prefix directory; dropping it stops it.
struct Nginx {
    child: Child,
    addr: SocketAddr,
    dir: TempDir,
}

impl Nginx {
    /// Starts nginx in front of `instances` (name, address) with the committed recipe.
    fn start(binary: &PathBuf, instances: &[(&str, SocketAddr)]) -> Nginx {
        let recipe = workspace_root().join("tests/nginx");
        let dir = TempDir::new("nginx");
        let prefix = dir.path().to_path_buf();
        let mut last = String::new();
        for _attempt in 0..5 {
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let conf = top_level_config(&prefix, &recipe, addr, instances);
            let conf_path = prefix.join("nginx.conf");
            fs::write(&conf_path, conf).expect("write nginx.conf");
            let log = fs::File::create(prefix.join("stderr.log")).expect("nginx stderr log");
            let mut child = Command::new(binary)
                .arg("-p")
                .arg(&prefix)
                .arg("-c")
                .arg(&conf_path)
                .arg("-e")
                .arg(prefix.join("error.log"))
                .args(["-g", "daemon off;"])
                .stdin(Stdio::null())
                .stdout(Stdio::from(log.try_clone().expect("dup log")))
                .stderr(Stdio::from(log))
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
            let deadline = Instant::now() + WAIT;
            loop {
                if let Some(status) = child.try_wait().ok().flatten() {
                    last = format!(
                        "nginx exited: {status}\n{}\n{}",
                        fs::read_to_string(prefix.join("stderr.log")).unwrap_or_default(),
                        fs::read_to_string(prefix.join("error.log")).unwrap_or_default()
                    );
                    break;
                }
                let health =
                    switchboard_tests::http::request(addr, "GET", "/health", &[], Body::None, WAIT);
                if matches!(&health, Ok(r) if r.status == 200) {
                    return Nginx { child, addr, dir };
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    last = format!("nginx did not answer /health with 200: {health:?}");
                    break;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            if !last.contains("in use") {
                break;
            }
        }
        panic!("nginx did not start: {last}");
    }

    fn error_log(&self) -> String {
        fs::read_to_string(self.dir.file("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own unreaped
        // child. SIGTERM is nginx's fast shutdown.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(3);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.error_log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!(
                "--- nginx error.log (last {}) ---\n{}\n---",
                tail.len(),
                tail.join("\n")
            );
        }
    }
}

/// The deployment-specific part, as `tests/nginx/README.md` shows it: the upstreams (every
/// instance, and each by its name) and the server's address. Everything else is the recipe,
/// included.
fn top_level_config(
    prefix: &std::path::Path,
    recipe: &std::path::Path,
    listen: SocketAddr,
    instances: &[(&str, SocketAddr)],
) -> String {
    let p = prefix.display();
    let all: String = instances
        .iter()
        .map(|(_, addr)| format!("        server {addr};\n"))
        .collect();
    let each: String = instances
        .iter()
        .map(|(name, addr)| {
            format!("    upstream switchboard_{name} {{\n        server {addr};\n        keepalive 16;\n    }}\n")
        })
        .collect();
    format!(
        r#"worker_processes 1;
pid {p}/nginx.pid;
error_log {p}/error.log info;
events {{
    worker_connections 1024;
}}
http {{
    access_log {p}/access.log;
    client_body_temp_path {p}/client_body_temp;
    proxy_temp_path {p}/proxy_temp;
    fastcgi_temp_path {p}/fastcgi_temp;
    uwsgi_temp_path {p}/uwsgi_temp;
    scgi_temp_path {p}/scgi_temp;

    include {recipe}/switchboard.conf;

    upstream switchboard {{
{all}        keepalive 16;
    }}
{each}
    server {{
        listen {listen};
        include {recipe}/switchboard-locations.conf;
    }}
}}
"#,
        recipe = recipe.display(),
    )
}

// ---------------------------------------------------------------------------------------
// The cluster: three instances and nginx
// ---------------------------------------------------------------------------------------

struct Cluster {
    /// `a`, `b`, `c`, in that order.
    instances: Vec<Proxy>,
    nginx: Nginx,
}

impl Cluster {
    /// `None` when nginx is missing (after a skip message).
    fn start(target: Target, test: &str) -> Option<Cluster> {
        let binary = nginx_or_skip(test)?;
        let instances: Vec<Proxy> = NAMES
            .iter()
            .map(|name| {
                Proxy::builder(target)
                    .args(["--instance", name])
                    .args(["--allow-host", PUBLIC_HOST])
                    .args(["--public-url", &format!("http://{PUBLIC_HOST}")])
                    .args(["--allow-origin", ALLOWED_ORIGIN])
                    .tokens(&[ALICE, BOB])
                    .backend([BACKEND])
                    .start()
            })
            .collect();
        let upstreams: Vec<(&str, SocketAddr)> = NAMES
            .iter()
            .zip(&instances)
            .map(|(name, p)| (*name, p.addr))
            .collect();
        let nginx = Nginx::start(&binary, &upstreams);
        Some(Cluster { instances, nginx })
    }

    fn instance(&self, name: &str) -> &Proxy {
        let i = NAMES.iter().position(|n| *n == name).expect("a, b or c");
        &self.instances[i]
    }
}

/// The instance a session id names.
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

fn instance_of(sid: &str) -> &str {
    let (name, uuid) = sid
        .split_once('.')
        .unwrap_or_else(|| panic!("session id {sid:?} names no instance"));
    assert_eq!(uuid.len(), 36, "{sid:?}: the uuid part");
    assert!(
        NAMES.contains(&name),
        "{sid:?} names an instance that does not run"
    );
    name
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

/// A Streamable session started at `addr` with the public Host header; `None` when the
/// initialize is answered `status` instead (a refusal, e.g. 503 while no instance is up).
fn try_start_mcp(addr: SocketAddr, token: &str) -> Result<McpSession, u16> {
    let auth = format!("Bearer {token}");
    let headers = [("Authorization", auth.as_str()), ("Host", PUBLIC_HOST)];
    let answer = mcp::post(addr, "/mcp", &headers, &mcp::initialize_body(1));
    if answer.status() != 200 {
        return Err(answer.status());
    }
    let sid = match &answer {
        Answer::Whole(r) => r.header("mcp-session-id").map(str::to_owned),
        Answer::Stream(e) => e.head.header("mcp-session-id").map(str::to_owned),
    }
    .expect("the initialize answer carries Mcp-Session-Id");
    let (_, response) = answer.response();
    let session = McpSession {
        addr,
        sid,
        token: Some(token.to_owned()),
        path: "/mcp".to_owned(),
        initialize_result: response["result"].clone(),
    };
    assert!(
        session.initialize_result.is_object(),
        "initialize: {response}"
    );
    let r = session.post_with(
        &[("Host", PUBLIC_HOST)],
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(r.status(), 202);
    Ok(session)
}

fn start_mcp(addr: SocketAddr, token: &str) -> McpSession {
    try_start_mcp(addr, token).unwrap_or_else(|status| panic!("initialize on /mcp: {status}"))
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
    let Some(cluster) = Cluster::start(target, "sessions_spread_and_stay_isolated") else {
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
    // Each session's calls back to back (so that its answers surely come back reordered),
    // sessions of both transports taking turns, every call in flight at once.
    let mut pending: Vec<(usize, usize, Events)> = Vec::new();
    for n in 0..legacy.len().max(streamable.len()) {
        if let Some((who, s)) = legacy.get(n) {
            for (i, id) in ids.iter().enumerate() {
                let r = s.post_with(
                    Body::json(&delay_call(id, delay(i, n), who).to_string()),
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
                let events = mcp_stream_call(s, &delay_call(id, delay(i, n), who));
                pending.push((n, i, events));
            }
        }
    }
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
    eprintln!(
        "{target:?}: 30 sessions through nginx in {:?}",
        started.elapsed()
    );
}

/// A session id is only good at the instance it names: sent straight to another instance
/// (or through nginx with another instance's name) it gets the SPEC section 1 404, while
/// its own instance serves it. Origin and Authorization pass through nginx.
fn a_sid_sent_to_another_instance_is_not_found(target: Target) {
    let Some(cluster) = Cluster::start(target, "a_sid_sent_to_another_instance_is_not_found")
    else {
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
    let Some(mut cluster) = Cluster::start(target, "killed_instance_clients_move_to_survivors")
    else {
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
    // Give the JSON requests time to reach their instances.
    std::thread::sleep(Duration::from_millis(200));

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
