//! Load generator for Switchboard benchmarks: S sessions, C `tools/call` each, K in flight
//! per session, with the SAME ids 1..C in every session (colliding on purpose), and every
//! answer checked to come back on its own session with its own id and its own payload.
//!
//! ```text
//! loadgen --url http://127.0.0.1:8000 -s 10 -c 500 -k 4          # through a proxy (or the floor)
//! loadgen --direct 'target/release/echo-backend' -s 10 -c 500 -k 4  # the backend over its pipes
//! loadgen --url http://127.0.0.1:8000 --idle 10000 -s 10 -c 100 -k 4 --pid 1234
//! loadgen --report results.jsonl                                  # bench.sh's table
//! ```
//!
//! Each call carries `arguments.tok = "<run nonce>.<session>.<id>"`; the echo server
//! (`echo-backend`, `floor`) returns the arguments as `structuredContent`. An answer is an
//! **isolation violation** when its token names another session or another id, when its id
//! was never sent on that session or was already answered, or when it is not JSON-RPC; a
//! violation is reported (with the first examples) and the exit status is 1. Failed calls
//! (a POST not answered 202, an error response, a stream closed, the global timeout) exit 2.
//! After the last answer the streams are watched for `--drain-ms` more for strays.
//!
//! Latency is POST written → SSE `message` parsed (direct mode: line written → line read;
//! Streamable mode: POST written → its JSON answer parsed).
//! `--direct CMD` (split on whitespace) drives the backend over its pipes with no HTTP, as
//! the proxy would: ids are routed-id-shaped strings `"<sid>|n:<id>"`, one writer, one
//! reader. HTTP mode: one SSE connection per session plus K keep-alive connections for its
//! POSTs; a minimal HTTP/1.1 client on tokio (loopback only).
//!
//! `--transport mcp` drives Streamable HTTP (`<base>/mcp`, SPEC section 7) instead of the
//! legacy `/sse`: per session a POST of `initialize` with no session (answered 200 with an
//! `Mcp-Session-Id`), then `notifications/initialized` (202) on each of its K keep-alive
//! connections, then the calls as POSTs naming the session, with `Accept:
//! application/json, text/event-stream` and no progress token, each answered in its own
//! HTTP response (a JSON body; an event stream is read too, and counted). No GET stream.
//! `--idle N` then holds N initialized Streamable sessions, each with its connection open
//! (`--idle-closed`: each session's connection closed once it is initialized, as a client
//! that keeps no connection between requests leaves it).
//!
//! `--transport modern` makes the same calls on `/mcp` as MCP 2026-07-28 requests (SPEC 13):
//! no session and no `initialize`; each POST carries `MCP-Protocol-Version: 2026-07-28`,
//! `Mcp-Method` and `Mcp-Name`, and the call's `params._meta` its protocol version and client
//! capabilities. A "session" is then one client's K connections, opened after one
//! `server/discover` (which must offer 2026-07-28); its calls still use the ids 1..C.
//!
//! CPU: the generator's own (getrusage) and, with `--pid P` (repeatable; the direct
//! backend is added automatically), the CPU of P and its descendants over the measured
//! window, both per call, so a run shows whether the generator or the target was the
//! bottleneck. `--idle N` opens N more sessions that stay idle during the run and reports
//! the first `--pid`'s VmRSS/VmHWM/RssAnon with them open (and `/health`'s session count).
//!
//! `--soak ROUNDS` (with `--url` and `--pid`) churns sessions of both transports for memory
//! that must stay flat, and `--soak-report FILE [--svg OUT]` renders its lines
//! (`tests/soak.sh`; see `loadgen/soak.rs`).
//!
//! Every loop is bounded by its count and by `--timeout` (default 120 s).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::{self, Write as _};
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::timeout_at;

#[path = "loadgen/soak.rs"]
mod soak;

const USAGE: &str = "usage: loadgen (--url http://127.0.0.1:PORT[/base] | --direct CMD) \
[-s SESSIONS] [-c CALLS] [-k INFLIGHT] [--idle N [--idle-closed]] [--pid PID]... [--timeout SECS] \
[--threads N] [--open-concurrency N] [--drain-ms MS] [--transport sse|mcp|modern] \
[--tag KEY=VALUE]... \
[--json]\n       loadgen --url URL --soak ROUNDS [-s S] [-c C] [-k K] --pid PID [--budget SECS] \
[--idle-wait SECS] [--tag KEY=VALUE]...\n       loadgen --report FILE\n       \
loadgen --soak-report FILE [--svg FILE]";

/// How many examples of each problem are kept for the report.
const EXAMPLES: usize = 8;
/// The longest one network step of the set-up (a stream opened, a POST answered) may take.
const SETUP_STEP: Duration = Duration::from_secs(10);
const READ_BUFFER: usize = 64 * 1024;

/// Which HTTP transport `--url` mode speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// Legacy HTTP+SSE: `GET /sse`, answers on the stream.
    Sse,
    /// Streamable HTTP: `POST /mcp`, each answer in its own response.
    Mcp,
}

#[derive(Debug, Clone)]
struct Options {
    url: Option<String>,
    transport: Transport,
    /// `--transport modern`: `/mcp` calls as 2026-07-28 requests (transport `Mcp`, no session).
    modern: bool,
    direct: Option<String>,
    sessions: usize,
    calls: u64,
    inflight: usize,
    idle: usize,
    pids: Vec<u32>,
    timeout: Duration,
    threads: usize,
    open_concurrency: usize,
    drain: Duration,
    tags: Vec<(String, String)>,
    json: bool,
    report: Option<String>,
    /// `--soak ROUNDS`: rounds of session churn (see `soak`).
    soak: Option<usize>,
    /// The soak's time budget: no round starts later.
    budget: Duration,
    /// How long the soak waits after its load for threads and descriptors to settle.
    idle_wait: Duration,
    /// `--idle-closed`: idle Streamable sessions hold no connection.
    idle_closed: bool,
    soak_report: Option<String>,
    svg: Option<String>,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Options, String> {
    let mut o = Options {
        url: None,
        transport: Transport::Sse,
        modern: false,
        direct: None,
        sessions: 1,
        calls: 100,
        inflight: 1,
        idle: 0,
        pids: Vec::new(),
        timeout: Duration::from_secs(120),
        threads: 1,
        open_concurrency: 1,
        drain: Duration::from_millis(100),
        tags: Vec::new(),
        json: false,
        report: None,
        soak: None,
        budget: Duration::from_secs(3600),
        idle_wait: Duration::from_secs(30),
        idle_closed: false,
        soak_report: None,
        svg: None,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
            v.parse()
                .map_err(|_| format!("{flag}: not a number: {v:?}"))
        }
        match arg.as_str() {
            "--url" => o.url = Some(value()?),
            "--direct" => o.direct = Some(value()?),
            "--transport" => {
                let v = value()?;
                o.modern = v == "modern";
                o.transport = match v.as_str() {
                    "sse" => Transport::Sse,
                    "mcp" | "modern" => Transport::Mcp,
                    other => return Err(format!("--transport: sse, mcp or modern, not {other:?}")),
                }
            }
            "-s" | "--sessions" => o.sessions = num(&arg, value()?)?,
            "-c" | "--calls" => o.calls = num(&arg, value()?)?,
            "-k" | "--inflight" => o.inflight = num(&arg, value()?)?,
            "--idle" => o.idle = num(&arg, value()?)?,
            "--idle-closed" => o.idle_closed = true,
            "--pid" => o.pids.push(num(&arg, value()?)?),
            "--timeout" => o.timeout = Duration::from_secs_f64(num(&arg, value()?)?),
            "--threads" => o.threads = num(&arg, value()?)?,
            "--open-concurrency" => o.open_concurrency = num::<usize>(&arg, value()?)?.max(1),
            "--drain-ms" => o.drain = Duration::from_millis(num(&arg, value()?)?),
            "--tag" => {
                let v = value()?;
                let (k, v) = v.split_once('=').ok_or("--tag needs KEY=VALUE")?;
                o.tags.push((k.to_owned(), v.to_owned()));
            }
            "--json" => o.json = true,
            "--report" => o.report = Some(value()?),
            "--soak" => o.soak = Some(num(&arg, value()?)?),
            "--budget" => o.budget = Duration::from_secs_f64(num(&arg, value()?)?),
            "--idle-wait" => o.idle_wait = Duration::from_secs_f64(num(&arg, value()?)?),
            "--soak-report" => o.soak_report = Some(value()?),
            "--svg" => o.svg = Some(value()?),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if o.report.is_some() || o.soak_report.is_some() {
        return Ok(o);
    }
    if o.url.is_some() == o.direct.is_some() {
        return Err(format!("give exactly one of --url and --direct\n{USAGE}"));
    }
    if o.direct.is_some() && o.transport != Transport::Sse {
        return Err("--transport needs --url".to_owned());
    }
    if o.direct.is_some() && o.idle > 0 {
        return Err("--idle needs --url".to_owned());
    }
    if o.inflight == 0 || o.calls == 0 && o.sessions > 0 {
        return Err("-k and -c must be at least 1".to_owned());
    }
    if o.calls > 100_000_000 || o.sessions > 100_000 || o.inflight > 10_000 || o.idle > 100_000 {
        return Err("-s/-c/-k/--idle out of range".to_owned());
    }
    if o.idle_closed && (o.transport != Transport::Mcp || o.idle == 0) {
        return Err("--idle-closed needs --idle and --transport mcp".to_owned());
    }
    if o.modern && (o.idle > 0 || o.soak.is_some()) {
        return Err("--transport modern holds no sessions: no --idle or --soak".to_owned());
    }
    if o.soak.is_some() && (o.url.is_none() || o.pids.is_empty() || o.idle > 0) {
        return Err("--soak needs --url and --pid, and takes no --idle".to_owned());
    }
    if o.soak.is_some_and(|r| r > 1_000_000) {
        return Err("--soak: at most 1,000,000 rounds".to_owned());
    }
    Ok(o)
}

fn main() -> ExitCode {
    let options = match parse_args(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::from(64);
        }
    };
    if let Some(path) = &options.report {
        return match report::print(path) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("loadgen: --report {path}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(path) = &options.soak_report {
        return match soak::report(path, options.svg.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("loadgen: --soak-report {path}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    raise_nofile_limit();
    let runtime = if options.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.threads)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    if options.soak.is_some() {
        let code = runtime.block_on(soak::run(&options));
        runtime.shutdown_timeout(Duration::from_millis(100));
        return ExitCode::from(code);
    }
    let outcome = runtime.block_on(run(options.clone()));
    // Idle sockets and aborted tasks go with the runtime, without waiting for them.
    runtime.shutdown_timeout(Duration::from_millis(100));
    let code = outcome.exit_code();
    let line = outcome.to_json(&options);
    if options.json {
        println!("{line}");
    } else {
        outcome.print_human(&options);
    }
    let _ = io::stdout().flush();
    ExitCode::from(code)
}

/// Lets a run hold as many sockets as the hard limit allows (10,000 idle sessions).
fn raise_nofile_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass, which lives on our stack.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Shared bookkeeping

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Problems of one run: isolation violations and failed calls, counted, with examples.
#[derive(Default)]
struct Problems {
    violations: AtomicU64,
    errors: AtomicU64,
    notifications: AtomicU64,
    /// Streamable answers that came as an event stream instead of a JSON body.
    event_streams: AtomicU64,
    examples: Mutex<Vec<String>>,
}

impl Problems {
    fn violation(&self, what: String) {
        if self.violations.fetch_add(1, Ordering::Relaxed) < EXAMPLES as u64 {
            lock(&self.examples).push(format!("VIOLATION: {what}"));
        }
    }

    fn error(&self, what: String) {
        if self.errors.fetch_add(1, Ordering::Relaxed) < EXAMPLES as u64 {
            lock(&self.examples).push(format!("error: {what}"));
        }
    }
}

/// What every task shares.
struct Run {
    nonce: String,
    calls: u64,
    problems: Problems,
    /// Set when the run is over (or timed out): workers stop sending.
    stop: AtomicBool,
    /// `--soak`: id `calls + 1` of a session is its call of the tool `hang`, which the echo
    /// backend never answers: an error (cancelled, timed out) is its only right answer.
    hang: bool,
    /// `--transport modern`: each call carries the 2026-07-28 `_meta`.
    modern: bool,
}

enum Slot {
    Free,
    Waiting(oneshot::Sender<Instant>),
    Done,
}

/// One session's calls: slot 0 is its `initialize`, 1..=C its calls.
struct SessionState {
    index: usize,
    next: AtomicU64,
    slots: Mutex<Vec<Slot>>,
    closed: AtomicBool,
}

impl SessionState {
    fn new(index: usize, calls: u64) -> SessionState {
        SessionState {
            index,
            next: AtomicU64::new(1),
            slots: Mutex::new((0..=calls).map(|_| Slot::Free).collect()),
            closed: AtomicBool::new(false),
        }
    }

    fn expect(&self, id: u64) -> oneshot::Receiver<Instant> {
        let (tx, rx) = oneshot::channel();
        lock(&self.slots)[id as usize] = Slot::Waiting(tx);
        rx
    }

    fn forget(&self, id: u64) {
        lock(&self.slots)[id as usize] = Slot::Done;
    }

    /// The stream ended: every waiting call fails now instead of at the deadline.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for slot in lock(&self.slots).iter_mut() {
            if matches!(slot, Slot::Waiting(_)) {
                *slot = Slot::Done;
            }
        }
    }
}

/// The parts of an answer that are checked, borrowed from its text.
#[derive(Deserialize)]
struct Reply<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow)]
    result: Option<ReplyResult<'a>>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ReplyResult<'a> {
    #[serde(rename = "structuredContent", borrow)]
    structured: Option<EchoedArguments<'a>>,
    #[serde(rename = "protocolVersion", borrow)]
    protocol: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct EchoedArguments<'a> {
    #[serde(borrow)]
    tok: Option<Cow<'a, str>>,
}

/// How a transport names the call an answer belongs to.
enum CallRef<'a> {
    /// HTTP: the id as the client sent it, on the stream of `session`.
    Plain(&'a str),
    /// Direct: `"<sid>|n:<id>"`.
    Routed(&'a str),
}

impl Run {
    fn token(&self, session: usize, id: u64) -> String {
        format!("{}.{session}.{id}", self.nonce)
    }

    /// Checks one message that arrived for `session` (HTTP: on its stream) and completes
    /// the call it answers.
    fn on_message(&self, session: &SessionState, data: &[u8], now: Instant) {
        let reply: Reply = match serde_json::from_slice(data) {
            Ok(r) => r,
            Err(e) => {
                return self.problems.violation(format!(
                    "session {}: not a JSON-RPC message ({e}): {}",
                    session.index,
                    preview(data)
                ))
            }
        };
        let Some(raw_id) = reply.id else {
            if reply.method.is_some() {
                // A broadcast such as list_changed: not ours to judge, but counted.
                self.problems.notifications.fetch_add(1, Ordering::Relaxed);
            } else {
                self.problems.violation(format!(
                    "session {}: a message with no id: {}",
                    session.index,
                    preview(data)
                ));
            }
            return;
        };
        let id = match call_id(CallRef::Plain(raw_id.get())) {
            Some(id) if id <= self.calls + u64::from(self.hang) => id,
            _ => {
                return self.problems.violation(format!(
                    "session {}: id {} was never sent on this session: {}",
                    session.index,
                    raw_id.get(),
                    preview(data)
                ))
            }
        };
        self.complete(session, id, &reply, data, now);
    }

    fn complete(&self, session: &SessionState, id: u64, reply: &Reply, data: &[u8], now: Instant) {
        if reply.method.is_some() {
            return self.problems.violation(format!(
                "session {}: a request/notification carrying id {id}: {}",
                session.index,
                preview(data)
            ));
        }
        if self.hang && id == self.calls + 1 {
            if reply.error.is_none() {
                return self.problems.violation(format!(
                    "session {} id {id}: the never-answered call got a result: {}",
                    session.index,
                    preview(data)
                ));
            }
        } else if id > 0 {
            match reply.result.as_ref() {
                Some(result) => {
                    let tok = result.structured.as_ref().and_then(|a| a.tok.as_deref());
                    if tok != Some(self.token(session.index, id).as_str()) {
                        return self.problems.violation(format!(
                            "session {} id {id}: payload {} is not this call's ({}): {}",
                            session.index,
                            tok.map_or("(none)".to_owned(), |t| format!("{t:?}")),
                            describe_token(&self.nonce, tok),
                            preview(data)
                        ));
                    }
                }
                None => self.problems.error(format!(
                    "session {} id {id}: error response {}",
                    session.index,
                    reply.error.map_or("(no result)", RawValue::get)
                )),
            }
        } else if reply.result.as_ref().and_then(|r| r.protocol).is_none() {
            self.problems.error(format!(
                "session {}: initialize failed: {}",
                session.index,
                preview(data)
            ));
        }
        let mut slots = lock(&session.slots);
        match std::mem::replace(&mut slots[id as usize], Slot::Done) {
            Slot::Waiting(tx) => {
                let _ = tx.send(now);
            }
            Slot::Done => self.problems.violation(format!(
                "session {} id {id}: answered twice: {}",
                session.index,
                preview(data)
            )),
            Slot::Free => {
                slots[id as usize] = Slot::Free;
                self.problems.violation(format!(
                    "session {} id {id}: answered before it was sent: {}",
                    session.index,
                    preview(data)
                ));
            }
        }
    }
}

/// `5` (HTTP) or `"<sid>|n:5"` (direct) → 5; canonical decimal digits only.
fn call_id(r: CallRef) -> Option<u64> {
    let digits = match r {
        CallRef::Plain(raw) => raw,
        CallRef::Routed(text) => text.split_once("|n:")?.1,
    };
    if digits.is_empty() || digits.len() > 19 || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whose payload a wrong token was, for the report.
fn describe_token(nonce: &str, tok: Option<&str>) -> String {
    let Some(tok) = tok else {
        return "no token".to_owned();
    };
    let mut parts = tok.split('.');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(n), Some(s), Some(i)) if n == nonce => format!("it belongs to session {s} id {i}"),
        _ => "not a token of this run".to_owned(),
    }
}

fn preview(data: &[u8]) -> String {
    let text = String::from_utf8_lossy(data);
    if text.len() > 200 {
        let mut end = 200;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &text[..end])
    } else {
        text.into_owned()
    }
}

/// A `tools/call` of `echo`; `modern`: with the `_meta` a 2026-07-28 request must carry.
fn call_body(out: &mut Vec<u8>, id: &str, tok: &str, modern: bool) {
    out.clear();
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(
        br#","method":"tools/call","params":{"name":"echo","arguments":{"timezone":"Europe/Amsterdam","format":"iso8601","tok":""#,
    );
    out.extend_from_slice(tok.as_bytes());
    out.extend_from_slice(if modern { MODERN_META } else { br#""}}}"# });
}

/// The end of a modern call's body: its arguments closed, then the revision's `_meta`.
const MODERN_META: &[u8] = br#""},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;

/// A modern client's first request.
const DISCOVER: &[u8] = br#"{"jsonrpc":"2.0","id":0,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;

fn initialize_body(id: &str) -> Vec<u8> {
    initialize_body_for(id, "2024-11-05")
}

fn initialize_body_for(id: &str, version: &str) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"initialize","params":{{"protocolVersion":"{version}","capabilities":{{}},"clientInfo":{{"name":"switchboard-loadgen","version":"0"}}}}}}"#
    )
    .into_bytes()
}

/// The revision a Streamable client asks for in its `initialize`.
const MCP_VERSION: &str = "2025-06-18";

/// The messages of one Streamable answer (`200`): the JSON body, or each `message`
/// event of an event stream (counted in `problems`).
fn answer_messages<'b>(
    head: &Head,
    body: &'b [u8],
    problems: &Problems,
) -> Result<Vec<Cow<'b, [u8]>>, String> {
    match head.content_type.as_deref() {
        Some("application/json") => Ok(vec![Cow::Borrowed(body)]),
        Some("text/event-stream") => {
            problems.event_streams.fetch_add(1, Ordering::Relaxed);
            let mut out = Vec::new();
            let mut start = 0;
            while start < body.len() {
                let end = find(&body[start..], b"\n\n").map_or(body.len(), |e| start + e);
                let (event, data) = parse_event(&body[start..end]);
                if event == b"message" && !data.is_empty() {
                    out.push(data);
                }
                start = end + 2;
            }
            Ok(out)
        }
        other => Err(format!("a 200 answer of type {other:?}: {}", preview(body))),
    }
}

const INITIALIZED: &[u8] = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

// ---------------------------------------------------------------------------------------
// A minimal HTTP/1.1 client on tokio

#[derive(Debug, Clone)]
struct HttpTarget {
    addr: SocketAddr,
    host: String,
    base: String,
}

impl HttpTarget {
    fn parse(url: &str) -> Result<HttpTarget, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("--url {url:?}: only http:// URLs"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let mut base = path.trim_end_matches('/').to_owned();
        if base.ends_with("/sse") || base.ends_with("/mcp") {
            base.truncate(base.len() - 4);
        }
        let addr = authority
            .to_socket_addrs()
            .map_err(|e| format!("--url {url:?}: {e}"))?
            .next()
            .ok_or_else(|| format!("--url {url:?}: no address"))?;
        if !addr.ip().is_loopback() {
            return Err(format!("--url {url:?}: loopback only, not {}", addr.ip()));
        }
        Ok(HttpTarget {
            addr,
            host: authority.to_owned(),
            base,
        })
    }

    async fn connect(&self) -> io::Result<TcpStream> {
        let stream = TcpStream::connect(self.addr).await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

/// A response head: status and the headers that matter here.
struct Head {
    status: u16,
    length: Option<usize>,
    chunked: bool,
    close: bool,
    /// The media type of `Content-Type` (lowercase, without parameters), when present.
    content_type: Option<String>,
    /// `Mcp-Session-Id`, when present.
    mcp_session: Option<String>,
}

/// Parses a complete head (`buf[..end]`, without the blank line).
fn parse_head(head: &[u8]) -> io::Result<Head> {
    let text = std::str::from_utf8(head).map_err(|_| invalid("response head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid(format!("bad status line {status_line:?}")))?;
    let mut h = Head {
        status,
        length: None,
        chunked: false,
        close: false,
        content_type: None,
        mcp_session: None,
    };
    for line in lines {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("content-length") {
            h.length = Some(v.parse().map_err(|_| invalid("bad content-length"))?);
        } else if k.eq_ignore_ascii_case("transfer-encoding") {
            h.chunked = v.to_ascii_lowercase().contains("chunked");
        } else if k.eq_ignore_ascii_case("connection") {
            h.close = v.eq_ignore_ascii_case("close");
        } else if k.eq_ignore_ascii_case("content-type") {
            let media = v.split(';').next().unwrap_or_default().trim();
            h.content_type = Some(media.to_ascii_lowercase());
        } else if k.eq_ignore_ascii_case("mcp-session-id") {
            h.mcp_session = Some(v.to_owned());
        }
    }
    Ok(h)
}

/// Reads into `buf` until it holds a complete head; returns the head and drains it (and
/// its blank line) from `buf`. Interim 1xx responses are skipped.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Head> {
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = parse_head(&buf[..end])?;
            buf.drain(..end + 4);
            if (100..200).contains(&head.status) {
                continue;
            }
            return Ok(head);
        }
        if buf.len() > 64 * 1024 {
            return Err(invalid("response head over 64 KiB"));
        }
        read_more(stream, buf).await?;
    }
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    buf.reserve(16 * 1024);
    let n = stream.read_buf(buf).await?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    Ok(n)
}

/// Reads a whole (small) response body after its head.
async fn read_body(stream: &mut TcpStream, buf: &mut Vec<u8>, head: &Head) -> io::Result<Vec<u8>> {
    if head.status == 204 || head.status == 304 {
        return Ok(Vec::new());
    }
    if head.chunked {
        let mut decoder = Chunked::default();
        let mut body = Vec::new();
        loop {
            let used = decoder.decode(buf, &mut body)?;
            buf.drain(..used);
            if decoder.done {
                return Ok(body);
            }
            read_more(stream, buf).await?;
        }
    }
    let Some(len) = head.length else {
        // Until the server closes.
        loop {
            match stream.read_buf(buf).await? {
                0 => return Ok(std::mem::take(buf)),
                _ if buf.len() > 8 * 1024 * 1024 => return Err(invalid("body too long")),
                _ => {}
            }
        }
    };
    while buf.len() < len {
        read_more(stream, buf).await?;
    }
    Ok(buf.drain(..len).collect())
}

/// Incremental `Transfer-Encoding: chunked` decoding.
#[derive(Default)]
struct Chunked {
    /// Data bytes left in the current chunk, then its CRLF.
    left: usize,
    crlf: bool,
    /// In the trailer after the last chunk.
    trailer: bool,
    done: bool,
}

impl Chunked {
    /// Decodes what it can of `input` into `out`; returns how many input bytes were used.
    fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> io::Result<usize> {
        let mut pos = 0;
        while !self.done {
            let rest = &input[pos..];
            if self.left > 0 {
                let n = self.left.min(rest.len());
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&rest[..n]);
                self.left -= n;
                pos += n;
                self.crlf = self.left == 0;
                continue;
            }
            if self.crlf {
                if rest.len() < 2 {
                    break;
                }
                if &rest[..2] != b"\r\n" {
                    return Err(invalid("chunk not followed by CRLF"));
                }
                pos += 2;
                self.crlf = false;
                continue;
            }
            let Some(eol) = find(rest, b"\r\n") else {
                if rest.len() > 1024 {
                    return Err(invalid("chunk size line too long"));
                }
                break;
            };
            let line = &rest[..eol];
            pos += eol + 2;
            if self.trailer {
                // Trailer fields until an empty line.
                self.done = line.is_empty();
                continue;
            }
            let size_text = std::str::from_utf8(line)
                .ok()
                .and_then(|l| l.split(';').next())
                .map(str::trim)
                .unwrap_or_default();
            let size = usize::from_str_radix(size_text, 16)
                .map_err(|_| invalid(format!("bad chunk size {size_text:?}")))?;
            if size == 0 {
                self.trailer = true;
            } else {
                self.left = size;
            }
        }
        Ok(pos)
    }
}

/// A keep-alive connection for one session's POSTs.
struct PostConn {
    target: Arc<HttpTarget>,
    stream: Option<TcpStream>,
    head: Vec<u8>,
    request: Vec<u8>,
    buf: Vec<u8>,
    /// `DELETE <base>/mcp` naming its session (Streamable, once the session is known).
    delete: Option<Vec<u8>>,
}

/// What a Streamable HTTP client adds to each POST (the session and version come later).
const MCP_ACCEPT: &str = "Accept: application/json, text/event-stream\r\n";

impl PostConn {
    /// `extra`: more header lines, each ending in CRLF.
    fn new(target: Arc<HttpTarget>, post_target: &str, extra: &str) -> PostConn {
        let head = format!(
            "POST {post_target} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n{extra}Content-Length: ",
            target.host
        )
        .into_bytes();
        PostConn {
            target,
            stream: None,
            head,
            request: Vec::with_capacity(1024),
            buf: Vec::with_capacity(4096),
            delete: None,
        }
    }

    /// A Streamable HTTP connection to `<base>/mcp`, naming `session` (after initialize).
    fn mcp(target: Arc<HttpTarget>, session: Option<(&str, &str)>) -> PostConn {
        let path = format!("{}/mcp", target.base);
        let extra = match session {
            None => MCP_ACCEPT.to_owned(),
            Some((sid, version)) => {
                format!("{MCP_ACCEPT}Mcp-Session-Id: {sid}\r\nMCP-Protocol-Version: {version}\r\n")
            }
        };
        let delete = session.map(|(sid, version)| {
            format!(
                "DELETE {path} HTTP/1.1\r\nHost: {}\r\nMcp-Session-Id: {sid}\r\nMCP-Protocol-Version: {version}\r\nContent-Length: 0\r\n\r\n",
                target.host
            )
            .into_bytes()
        });
        let mut conn = PostConn::new(target, &path, &extra);
        conn.delete = delete;
        conn
    }

    /// A connection to `<base>/mcp` for 2026-07-28 requests of `method` (`Mcp-Name: name`).
    fn modern(target: Arc<HttpTarget>, method: &str, name: Option<&str>) -> PostConn {
        let path = format!("{}/mcp", target.base);
        let name = name.map_or(String::new(), |n| format!("Mcp-Name: {n}\r\n"));
        let extra = format!(
            "{MCP_ACCEPT}MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: {method}\r\n{name}"
        );
        PostConn::new(target, &path, &extra)
    }

    /// Ends its Streamable session (`DELETE`, 204 expected); the status.
    async fn delete_session(&mut self) -> io::Result<u16> {
        let request = self
            .delete
            .take()
            .ok_or_else(|| io::Error::other("no session to delete"))?;
        self.request = request;
        self.roundtrip().await.map(|(head, _)| head.status)
    }

    /// POSTs `body`; the status. A kept-alive connection found closed before anything was
    /// read is reopened once.
    async fn post(&mut self, body: &[u8]) -> io::Result<u16> {
        self.exchange(body).await.map(|(head, _)| head.status)
    }

    /// POSTs `body`; the response's head and body (reopening as [`PostConn::post`]).
    async fn exchange(&mut self, body: &[u8]) -> io::Result<(Head, Vec<u8>)> {
        self.request.clear();
        self.request.extend_from_slice(&self.head);
        self.request
            .extend_from_slice(format!("{}\r\n\r\n", body.len()).as_bytes());
        self.request.extend_from_slice(body);
        self.roundtrip().await
    }

    /// Writes `self.request` and reads its response.
    async fn roundtrip(&mut self) -> io::Result<(Head, Vec<u8>)> {
        for attempt in 0..2 {
            let reused = self.stream.is_some();
            let stream = match &mut self.stream {
                Some(s) => s,
                None => self.stream.insert(self.target.connect().await?),
            };
            self.buf.clear();
            let result = async {
                stream.write_all(&self.request).await?;
                let head = read_head(stream, &mut self.buf).await?;
                let body = read_body(stream, &mut self.buf, &head).await?;
                Ok::<_, io::Error>((head, body))
            }
            .await;
            match result {
                Ok((head, body)) => {
                    if head.close {
                        self.stream = None;
                    }
                    return Ok((head, body));
                }
                Err(e) => {
                    self.stream = None;
                    if !(reused && attempt == 0 && self.buf.is_empty()) {
                        return Err(e);
                    }
                }
            }
        }
        Err(io::Error::other("unreachable: the loop returns"))
    }
}

/// An open SSE stream: the socket and the decoding state after the endpoint event.
struct EventStream {
    stream: TcpStream,
    raw: Vec<u8>,
    chunked: Option<Chunked>,
    events: Vec<u8>,
}

impl EventStream {
    /// `GET <base>/sse`, the head, and the `endpoint` event; returns the POST target.
    async fn open(target: &HttpTarget, buffer: usize) -> io::Result<(EventStream, String)> {
        let mut stream = target.connect().await?;
        let request = format!(
            "GET {}/sse HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
            target.base, target.host
        );
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::with_capacity(buffer);
        let head = read_head(&mut stream, &mut raw).await?;
        if head.status != 200 {
            let body = read_body(&mut stream, &mut raw, &head)
                .await
                .unwrap_or_default();
            return Err(io::Error::other(format!(
                "GET /sse refused: {} {}",
                head.status,
                preview(&body)
            )));
        }
        let mut es = EventStream {
            stream,
            raw,
            chunked: head.chunked.then(Chunked::default),
            events: Vec::new(),
        };
        loop {
            es.decode()?;
            if let Some(end) = find(&es.events, b"\n\n") {
                let block = es.events[..end].to_vec();
                es.events.drain(..end + 2);
                let (event, data) = parse_event(&block);
                if event != b"endpoint" {
                    return Err(invalid(format!(
                        "first event is {:?}, not endpoint",
                        String::from_utf8_lossy(event)
                    )));
                }
                let endpoint = String::from_utf8_lossy(&data).into_owned();
                let post_target = match endpoint.split_once("://") {
                    Some((_, rest)) => rest
                        .find('/')
                        .map_or("/".to_owned(), |i| rest[i..].to_owned()),
                    None => endpoint,
                };
                return Ok((es, post_target));
            }
            if es.events.len() > 64 * 1024 {
                return Err(invalid("no endpoint event in the first 64 KiB"));
            }
            read_more(&mut es.stream, &mut es.raw).await?;
        }
    }

    /// Moves decoded body bytes from `raw` to `events`.
    fn decode(&mut self) -> io::Result<()> {
        match &mut self.chunked {
            Some(c) => {
                let used = c.decode(&self.raw, &mut self.events)?;
                self.raw.drain(..used);
                if c.done {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the event stream ended",
                    ));
                }
            }
            None => {
                self.events.extend_from_slice(&self.raw);
                self.raw.clear();
            }
        }
        Ok(())
    }

    /// Reads the stream until it ends or fails, handing each `message` event's data to
    /// `on_data`. Returns why it stopped.
    async fn pump(&mut self, mut on_data: impl FnMut(&[u8], Instant)) -> io::Error {
        loop {
            if let Err(e) = self.decode() {
                return e;
            }
            let now = Instant::now();
            let mut start = 0;
            while let Some(end) = find(&self.events[start..], b"\n\n") {
                let block = &self.events[start..start + end];
                start += end + 2;
                let (event, data) = parse_event(block);
                if event == b"message" && !data.is_empty() {
                    on_data(&data, now);
                }
            }
            self.events.drain(..start);
            self.raw.reserve(READ_BUFFER / 4);
            match self.stream.read_buf(&mut self.raw).await {
                Ok(0) => {
                    return io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the stream",
                    )
                }
                Ok(_) => {}
                Err(e) => return e,
            }
        }
    }
}

/// An SSE block's event type (default `message`) and data (lines joined by `\n`);
/// comments and other fields are skipped.
fn parse_event(block: &[u8]) -> (&[u8], Cow<'_, [u8]>) {
    let mut event: &[u8] = b"message";
    let mut data: Option<Cow<[u8]>> = None;
    for line in block.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.starts_with(b":") {
            continue;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"event" => event = value,
            b"data" => {
                data = Some(match data {
                    None => Cow::Borrowed(value),
                    Some(d) => {
                        let mut d = d.into_owned();
                        d.push(b'\n');
                        d.extend_from_slice(value);
                        Cow::Owned(d)
                    }
                })
            }
            _ => {}
        }
    }
    (event, data.unwrap_or(Cow::Borrowed(b"")))
}

/// `GET /health` on a fresh connection: the `sessions` field when the answer is 200 JSON.
async fn health_sessions(target: &HttpTarget) -> Option<u64> {
    let mut stream = target.connect().await.ok()?;
    let request = format!(
        "GET {}/health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        target.base, target.host
    );
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    let head = read_head(&mut stream, &mut buf).await.ok()?;
    let body = read_body(&mut stream, &mut buf, &head).await.ok()?;
    let v: Value = serde_json::from_slice(&body).ok()?;
    v.get("sessions")?.as_u64()
}

// ---------------------------------------------------------------------------------------
// CPU and memory of processes

fn own_cpu() -> Duration {
    // SAFETY: getrusage writes only into the zeroed struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return Duration::ZERO;
        }
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf takes an integer and touches no memory.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// utime + stime of one process, from /proc.
fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_comm.split(' ').collect();
    // Fields 14 and 15 of stat(5); the slice starts at field 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = clock_ticks();
    Some(Duration::from_micros((utime + stime) * 1_000_000 / ticks))
}

/// `pid` and all its descendants (bounded).
fn process_tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() && all.len() < 1024 {
        let p = all[i];
        i += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
                all.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
        }
    }
    all.sort_unstable();
    all.dedup();
    all
}

fn tree_cpu(pids: &[u32]) -> Duration {
    pids.iter().filter_map(|&p| process_cpu(p)).sum()
}

/// Time the threads of `pids` spent runnable but waiting for a CPU (schedstat's second
/// field): large when the host is oversubscribed, whoever the bottleneck is.
fn runqueue_wait(pids: &[u32]) -> Duration {
    let mut total = 0u64;
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
                total += stat
                    .split_whitespace()
                    .nth(1)
                    .and_then(|w| w.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Duration::from_nanos(total)
}

fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

// ---------------------------------------------------------------------------------------
// The run

#[derive(Default)]
struct Outcome {
    mode: &'static str,
    setup_error: Option<String>,
    timed_out: bool,
    completed: u64,
    violations: u64,
    errors: u64,
    notifications: u64,
    event_streams: u64,
    examples: Vec<String>,
    elapsed: Duration,
    latencies_ns: Vec<u64>,
    own_cpu: Duration,
    own_wait: Duration,
    target_cpu: Option<Duration>,
    target_wait: Option<Duration>,
    idle_open: usize,
    idle_open_time: Duration,
    idle_rss_kb: Option<u64>,
    idle_hwm_kb: Option<u64>,
    idle_anon_kb: Option<u64>,
    health_sessions: Option<u64>,
    rss_kb: Option<u64>,
    hwm_kb: Option<u64>,
}

impl Outcome {
    fn exit_code(&self) -> u8 {
        if self.violations > 0 {
            1
        } else if self.setup_error.is_some() || self.errors > 0 || self.timed_out {
            2
        } else {
            0
        }
    }

    fn percentile_us(&self, q: f64) -> Option<f64> {
        let v = &self.latencies_ns;
        if v.is_empty() {
            return None;
        }
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        Some(v[rank - 1] as f64 / 1000.0)
    }

    fn calls_per_s(&self) -> f64 {
        if self.elapsed.is_zero() {
            0.0
        } else {
            self.completed as f64 / self.elapsed.as_secs_f64()
        }
    }

    fn per_call_us(&self, cpu: Duration) -> Option<f64> {
        (self.completed > 0).then(|| cpu.as_secs_f64() * 1e6 / self.completed as f64)
    }

    fn to_json(&self, o: &Options) -> String {
        let round = |x: Option<f64>| x.map(|v| (v * 10.0).round() / 10.0);
        let secs = self.elapsed.as_secs_f64();
        // A share of the measured window, for CPU and run-queue times.
        let share =
            |d: Duration| (secs > 0.0).then(|| (d.as_secs_f64() / secs * 100.0).round() / 100.0);
        let mut v = json!({
            "mode": self.mode,
            "sessions": o.sessions,
            "calls_per_session": o.calls,
            "inflight": o.inflight,
            "ok": self.exit_code() == 0,
            "completed": self.completed,
            "violations": self.violations,
            "errors": self.errors,
            "timed_out": self.timed_out,
            "notifications": self.notifications,
            "event_stream_answers": self.event_streams,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "calls_per_s": self.calls_per_s().round(),
            "p50_us": round(self.percentile_us(0.50)),
            "p90_us": round(self.percentile_us(0.90)),
            "p99_us": round(self.percentile_us(0.99)),
            "max_us": round(self.percentile_us(1.0)),
            "loadgen_cpu_us_per_call": round(self.per_call_us(self.own_cpu)),
            "loadgen_cpu_util": share(self.own_cpu),
            "loadgen_runqueue_wait": share(self.own_wait),
            "target_cpu_us_per_call": round(self.target_cpu.and_then(|c| self.per_call_us(c))),
            "target_cpu_util": self.target_cpu.and_then(share),
            "target_runqueue_wait": self.target_wait.and_then(share),
            "examples": self.examples,
        });
        let m = v.as_object_mut().expect("an object");
        if let Some(e) = &self.setup_error {
            m.insert("setup_error".into(), json!(e));
        }
        if o.idle > 0 {
            m.insert("idle_sessions".into(), json!(self.idle_open));
            m.insert(
                "idle_open_s".into(),
                json!(self.idle_open_time.as_secs_f64()),
            );
            m.insert("idle_rss_kb".into(), json!(self.idle_rss_kb));
            m.insert("idle_hwm_kb".into(), json!(self.idle_hwm_kb));
            m.insert("idle_anon_kb".into(), json!(self.idle_anon_kb));
            m.insert("health_sessions".into(), json!(self.health_sessions));
        }
        if !o.pids.is_empty() {
            m.insert("rss_kb".into(), json!(self.rss_kb));
            m.insert("hwm_kb".into(), json!(self.hwm_kb));
        }
        for (k, val) in &o.tags {
            m.insert(k.clone(), json!(val));
        }
        v.to_string()
    }

    fn print_human(&self, o: &Options) {
        let ms = |q| {
            self.percentile_us(q)
                .map_or("-".to_owned(), |u| format!("{:.0}", u))
        };
        println!(
            "{} S={} C={} K={}: {} calls in {:.3} s = {:.0} calls/s; latency us p50 {} p90 {} p99 {} max {}",
            self.mode,
            o.sessions,
            o.calls,
            o.inflight,
            self.completed,
            self.elapsed.as_secs_f64(),
            self.calls_per_s(),
            ms(0.5),
            ms(0.9),
            ms(0.99),
            ms(1.0)
        );
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        println!(
            "loadgen thread busy {:.0}%, waiting for a CPU {:.0}% of the run",
            self.own_cpu.as_secs_f64() / secs * 100.0,
            self.own_wait.as_secs_f64() / secs * 100.0
        );
        println!(
            "cpu per call: loadgen {} us, target {} us",
            self.per_call_us(self.own_cpu)
                .map_or("-".to_owned(), |u| format!("{u:.1}")),
            self.target_cpu
                .and_then(|c| self.per_call_us(c))
                .map_or("-".to_owned(), |u| format!("{u:.1}"))
        );
        if o.idle > 0 {
            println!(
                "idle sessions: {} opened in {:.2} s; target VmRSS {:?} kB VmHWM {:?} kB; /health sessions {:?}",
                self.idle_open,
                self.idle_open_time.as_secs_f64(),
                self.idle_rss_kb,
                self.idle_hwm_kb,
                self.health_sessions
            );
        }
        if let Some(e) = &self.setup_error {
            println!("setup failed: {e}");
        }
        println!(
            "violations {}, errors {}, timed out {}, notifications {}",
            self.violations, self.errors, self.timed_out, self.notifications
        );
        for e in &self.examples {
            println!("  {e}");
        }
    }
}

fn nonce() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{:x}",
        (nanos as u64) ^ (u64::from(std::process::id()) << 40)
    )
}

async fn run(o: Options) -> Outcome {
    let deadline = tokio::time::Instant::now() + o.timeout;
    let run = Arc::new(Run {
        nonce: nonce(),
        calls: o.calls,
        problems: Problems::default(),
        stop: AtomicBool::new(false),
        hang: false,
        modern: o.modern,
    });
    let mut outcome = Outcome {
        mode: match (&o.direct, o.transport) {
            (Some(_), _) => "direct",
            (None, Transport::Sse) => "http",
            (None, Transport::Mcp) if o.modern => "modern",
            (None, Transport::Mcp) => "mcp",
        },
        ..Outcome::default()
    };
    let result = match (&o.url, &o.direct) {
        (Some(url), _) => run_http(&o, url, &run, deadline, &mut outcome).await,
        (None, Some(cmd)) => run_direct(&o, cmd, &run, deadline, &mut outcome).await,
        (None, None) => Err("nothing to run".to_owned()),
    };
    if let Err(e) = result {
        outcome.setup_error = Some(e);
    }
    let p = &run.problems;
    outcome.violations = p.violations.load(Ordering::Relaxed);
    outcome.errors = p.errors.load(Ordering::Relaxed);
    outcome.notifications = p.notifications.load(Ordering::Relaxed);
    outcome.event_streams = p.event_streams.load(Ordering::Relaxed);
    outcome.examples = lock(&p.examples).clone();
    outcome.latencies_ns.sort_unstable();
    outcome.completed = outcome.latencies_ns.len() as u64;
    if let Some(&pid) = o.pids.first() {
        outcome.rss_kb = status_kb(pid, "VmRSS");
        outcome.hwm_kb = status_kb(pid, "VmHWM");
    }
    outcome
}

/// How a worker gets its calls to the other side.
enum Sender {
    /// POSTs on its own keep-alive connection.
    Http(PostConn),
    /// Streamable POSTs on its own keep-alive connection, each answered in its response.
    Mcp(PostConn),
    /// Lines for the backend's stdin, to the one writer task.
    Pipe {
        tx: mpsc::UnboundedSender<Vec<u8>>,
        sid: String,
    },
}

impl Sender {
    fn id(&self, id: u64) -> String {
        match self {
            Sender::Http(_) | Sender::Mcp(_) => id.to_string(),
            Sender::Pipe { sid, .. } => format!("\"{sid}|n:{id}\""),
        }
    }

    /// Sends `body`; a Streamable answer is handed to `run` at once.
    async fn send(&mut self, body: &[u8], run: &Run, session: &SessionState) -> Result<(), String> {
        match self {
            Sender::Mcp(conn) => match conn.exchange(body).await {
                Ok((head, answer)) if head.status == 200 => {
                    let now = Instant::now();
                    for message in answer_messages(&head, &answer, &run.problems)? {
                        run.on_message(session, &message, now);
                    }
                    Ok(())
                }
                Ok((head, answer)) => Err(format!(
                    "POST answered {}: {}",
                    head.status,
                    preview(&answer)
                )),
                Err(e) => Err(format!("POST failed: {e}")),
            },
            Sender::Http(conn) => match conn.post(body).await {
                Ok(202) => Ok(()),
                Ok(status) => Err(format!("POST answered {status}")),
                Err(e) => Err(format!("POST failed: {e}")),
            },
            Sender::Pipe { tx, .. } => {
                let mut line = Vec::with_capacity(body.len() + 1);
                line.extend_from_slice(body);
                line.push(b'\n');
                tx.send(line)
                    .map_err(|_| "the backend's stdin is closed".to_owned())
            }
        }
    }
}

/// Sends calls of one session (sharing its counter with the session's other workers, so
/// at most K are in flight); returns their latencies.
async fn worker(
    run: Arc<Run>,
    session: Arc<SessionState>,
    mut sender: Sender,
    deadline: tokio::time::Instant,
) -> Vec<u64> {
    let mut latencies = Vec::new();
    let mut body = Vec::with_capacity(512);
    loop {
        if run.stop.load(Ordering::Relaxed) || session.closed.load(Ordering::Acquire) {
            break;
        }
        let id = session.next.fetch_add(1, Ordering::Relaxed);
        if id > run.calls {
            break;
        }
        call_body(
            &mut body,
            &sender.id(id),
            &run.token(session.index, id),
            run.modern,
        );
        let answer = session.expect(id);
        let sent_at = Instant::now();
        match timeout_at(deadline, sender.send(&body, &run, &session)).await {
            Err(_) => {
                run.problems.error(format!(
                    "session {} id {id}: not sent before the timeout",
                    session.index
                ));
                break;
            }
            Ok(Err(e)) => {
                session.forget(id);
                run.problems
                    .error(format!("session {} id {id}: {e}", session.index));
                continue;
            }
            Ok(Ok(())) => {}
        }
        if matches!(sender, Sender::Mcp(_)) {
            // The response was the answer: if it did not complete this call (an error, a
            // message for another id, already counted), nothing else will.
            let mut answer = answer;
            match answer.try_recv() {
                Ok(at) => latencies.push(at.saturating_duration_since(sent_at).as_nanos() as u64),
                Err(_) => {
                    session.forget(id);
                    run.problems.error(format!(
                        "session {} id {id}: its response did not answer it",
                        session.index
                    ));
                }
            }
            continue;
        }
        match timeout_at(deadline, answer).await {
            Ok(Ok(at)) => latencies.push(at.saturating_duration_since(sent_at).as_nanos() as u64),
            Ok(Err(_)) => {
                run.problems.error(format!(
                    "session {} id {id}: the stream closed before the answer",
                    session.index
                ));
                break;
            }
            Err(_) => {
                run.problems.error(format!(
                    "session {} id {id}: no answer before the timeout",
                    session.index
                ));
                break;
            }
        }
    }
    latencies
}

/// CPU used and time spent runnable but waiting for a CPU, by this process and by the
/// targets, at one moment.
struct Snapshot {
    at: Instant,
    own_cpu: Duration,
    own_wait: Duration,
    target_cpu: Duration,
    target_wait: Duration,
}

impl Snapshot {
    fn take(targets: &[u32]) -> Snapshot {
        Snapshot {
            own_cpu: own_cpu(),
            own_wait: runqueue_wait(&[std::process::id()]),
            target_cpu: tree_cpu(targets),
            target_wait: runqueue_wait(targets),
            at: Instant::now(),
        }
    }
}

/// Runs the workers from the moment every session is ready; fills the timing fields.
async fn measure(
    workers: Vec<tokio::task::JoinHandle<Vec<u64>>>,
    before: Snapshot,
    targets: &[u32],
    outcome: &mut Outcome,
) {
    for w in workers {
        if let Ok(l) = w.await {
            outcome.latencies_ns.extend(l);
        }
    }
    let after = Snapshot::take(targets);
    outcome.elapsed = after.at.saturating_duration_since(before.at);
    outcome.own_cpu = after.own_cpu.saturating_sub(before.own_cpu);
    outcome.own_wait = after.own_wait.saturating_sub(before.own_wait);
    if !targets.is_empty() {
        outcome.target_cpu = Some(after.target_cpu.saturating_sub(before.target_cpu));
        outcome.target_wait = Some(after.target_wait.saturating_sub(before.target_wait));
    }
}

async fn run_http(
    o: &Options,
    url: &str,
    run: &Arc<Run>,
    deadline: tokio::time::Instant,
    outcome: &mut Outcome,
) -> Result<(), String> {
    let target = Arc::new(HttpTarget::parse(url)?);

    // Idle sessions first: they stay open (unread) until the run is over.
    let mut idle = Vec::with_capacity(o.idle);
    if o.idle > 0 {
        let began = Instant::now();
        let mut opening = JoinSet::new();
        let mut next = 0;
        let (transport, closed) = (o.transport, o.idle_closed);
        while idle.len() < o.idle {
            while next < o.idle && opening.len() < o.open_concurrency {
                let t = target.clone();
                let n = next;
                opening.spawn(async move {
                    match transport {
                        Transport::Sse => step(
                            || format!("idle session {n}: GET /sse"),
                            EventStream::open(&t, 512),
                        )
                        .await
                        .map(|(stream, _)| Idle::Sse(stream)),
                        Transport::Mcp => open_idle_mcp(t, n, closed).await,
                    }
                });
                next += 1;
            }
            match timeout_at(deadline, opening.join_next()).await {
                Ok(Some(Ok(Ok(held)))) => idle.push(held),
                Ok(Some(Ok(Err(e)))) => {
                    return Err(format!("{e} ({} of {} open)", idle.len(), o.idle))
                }
                Ok(Some(Err(e))) => return Err(format!("idle session task: {e}")),
                Ok(None) => break,
                Err(_) => {
                    outcome.timed_out = true;
                    return Err(format!(
                        "timed out opening idle sessions ({} open)",
                        idle.len()
                    ));
                }
            }
        }
        outcome.idle_open = idle.iter().filter(|i| i.is_held()).count();
        outcome.idle_open_time = began.elapsed();
        if let Some(&pid) = o.pids.first() {
            outcome.idle_rss_kb = status_kb(pid, "VmRSS");
            outcome.idle_hwm_kb = status_kb(pid, "VmHWM");
            outcome.idle_anon_kb = status_kb(pid, "RssAnon");
        }
        outcome.health_sessions = timeout_at(deadline, health_sessions(&target))
            .await
            .ok()
            .flatten();
    }
    if o.sessions == 0 {
        delete_idle(idle, &run.problems, deadline).await;
        return Ok(());
    }

    // Open and initialize the measured sessions.
    let sessions: Vec<Arc<SessionState>> = (0..o.sessions)
        .map(|i| Arc::new(SessionState::new(i, o.calls)))
        .collect();
    let mut readers = JoinSet::new();
    let mut closers = Vec::new();
    let mut posts: Vec<Option<Vec<PostConn>>> = (0..o.sessions).map(|_| None).collect();
    let mut opening = JoinSet::new();
    let mut next = 0;
    let mut ready = 0;
    let opened: Result<(), String> = loop {
        if ready >= o.sessions {
            break Ok(());
        }
        while next < o.sessions && opening.len() < o.open_concurrency {
            let (t, run, session) = (target.clone(), run.clone(), sessions[next].clone());
            let inflight = o.inflight.min(o.calls as usize);
            let (transport, modern) = (o.transport, o.modern);
            opening.spawn(async move {
                match transport {
                    Transport::Sse => open_http_session(t, run, session, inflight).await,
                    Transport::Mcp if modern => open_modern_client(t, session, inflight).await,
                    Transport::Mcp => open_mcp_session(t, run, session, inflight).await,
                }
            });
            next += 1;
        }
        match timeout_at(deadline, opening.join_next()).await {
            Ok(Some(Ok(Ok(Opened {
                index,
                stream,
                conns,
                closer,
            })))) => {
                closers.extend(closer);
                if let Some(stream) = stream {
                    let (run, session) = (run.clone(), sessions[index].clone());
                    readers.spawn(read_stream(stream, run, session));
                }
                posts[index] = Some(conns);
                ready += 1;
            }
            Ok(Some(Ok(Err(e)))) => break Err(e),
            Ok(Some(Err(e))) => break Err(format!("session task: {e}")),
            Ok(None) => break Ok(()),
            Err(_) => {
                outcome.timed_out = true;
                break Err(format!("timed out opening sessions ({ready} ready)"));
            }
        }
    };
    if let Err(e) = opened {
        // What was opened goes, so that a failed run leaves nothing behind in the server.
        opening.abort_all();
        readers.abort_all();
        delete_sessions(closers, &run.problems, deadline).await;
        delete_idle(idle, &run.problems, deadline).await;
        return Err(e);
    }

    let targets: Vec<u32> = o.pids.iter().flat_map(|&p| process_tree(p)).collect();
    let before = Snapshot::take(&targets);
    let mut workers = Vec::new();
    for (i, conns) in posts.into_iter().enumerate() {
        for conn in conns.ok_or("a session was not opened")? {
            let sender = match o.transport {
                Transport::Sse => Sender::Http(conn),
                Transport::Mcp => Sender::Mcp(conn),
            };
            workers.push(tokio::spawn(worker(
                run.clone(),
                sessions[i].clone(),
                sender,
                deadline,
            )));
        }
    }
    measure(workers, before, &targets, outcome).await;
    finish(o, run, deadline, outcome).await;
    readers.abort_all();
    delete_sessions(closers, &run.problems, deadline).await;
    delete_idle(idle, &run.problems, deadline).await;
    Ok(())
}

/// After the workers: stop, time out what is left, and watch for strays a little longer.
async fn finish(
    o: &Options,
    run: &Arc<Run>,
    deadline: tokio::time::Instant,
    outcome: &mut Outcome,
) {
    run.stop.store(true, Ordering::Relaxed);
    if tokio::time::Instant::now() >= deadline {
        outcome.timed_out = true;
    }
    let drain_until = (tokio::time::Instant::now() + o.drain).min(deadline);
    tokio::time::sleep_until(drain_until).await;
}

/// A session opened: its index, its event stream (legacy only), its K connections, and
/// (Streamable) a connection for the `DELETE` that ends it after the run.
struct Opened {
    index: usize,
    stream: Option<EventStream>,
    conns: Vec<PostConn>,
    closer: Option<PostConn>,
}

/// Ends Streamable sessions as a well-behaved client does (`DELETE`, 204), so that a
/// bench's rounds do not pile sessions up in the server; each bounded, none measured.
async fn delete_sessions(
    conns: Vec<PostConn>,
    problems: &Problems,
    deadline: tokio::time::Instant,
) {
    for mut conn in conns {
        let step = tokio::time::Instant::now() + SETUP_STEP;
        match timeout_at(step.min(deadline), conn.delete_session()).await {
            Ok(Ok(204)) => {}
            Ok(Ok(status)) => problems.error(format!("DELETE /mcp answered {status}")),
            Ok(Err(e)) => problems.error(format!("DELETE /mcp failed: {e}")),
            Err(_) => {
                problems.error("DELETE /mcp: no answer in time".to_owned());
                return;
            }
        }
    }
}

/// An idle session, held open until the run is over.
enum Idle {
    /// Its event stream.
    Sse(EventStream),
    /// The connection its `initialize` went over.
    Mcp(PostConn),
}

impl Idle {
    /// Whether its socket is still connected.
    fn is_held(&self) -> bool {
        match self {
            Idle::Sse(es) => es.stream.peer_addr().is_ok(),
            // Without its connection (`--idle-closed`) a session is held once it has an id.
            Idle::Mcp(conn) => match &conn.stream {
                Some(stream) => stream.peer_addr().is_ok(),
                None => conn.delete.is_some(),
            },
        }
    }
}

/// `POST <base>/mcp` of `initialize` without a session: answered 200 with the session's
/// id and the result. Returns the answer's head and its one message.
async fn mcp_initialize(
    conn: &mut PostConn,
    run_problems: &Problems,
    what: &str,
) -> Result<(String, Vec<u8>), String> {
    let (head, body) = step(
        || format!("{what}: POST /mcp initialize"),
        conn.exchange(&initialize_body_for("0", MCP_VERSION)),
    )
    .await?;
    if head.status != 200 {
        return Err(format!(
            "{what}: POST /mcp initialize answered {}: {}",
            head.status,
            preview(&body)
        ));
    }
    let sid = head
        .mcp_session
        .clone()
        .ok_or_else(|| format!("{what}: initialize answered without an Mcp-Session-Id"))?;
    let mut messages =
        answer_messages(&head, &body, run_problems).map_err(|e| format!("{what}: {e}"))?;
    if messages.len() != 1 {
        return Err(format!(
            "{what}: initialize answered with {} messages",
            messages.len()
        ));
    }
    Ok((sid, messages.pop().expect("one").into_owned()))
}

/// The revision the server chose in its `initialize` result, which later requests name
/// (as SDK clients do); absent means 2025-03-26 (SPEC section 7).
fn negotiated_version(message: &[u8]) -> String {
    serde_json::from_slice::<Value>(message)
        .ok()
        .and_then(|v| v["result"]["protocolVersion"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "2025-03-26".to_owned())
}

/// One idle Streamable session: initialized, its connection kept open.
async fn open_idle_mcp(target: Arc<HttpTarget>, n: usize, closed: bool) -> Result<Idle, String> {
    let mut first = PostConn::mcp(target.clone(), None);
    let problems = Problems::default();
    let (sid, message) =
        mcp_initialize(&mut first, &problems, &format!("idle session {n}")).await?;
    // Held on the same socket; named so that the run can end it.
    let version = negotiated_version(&message);
    let mut conn = PostConn::mcp(target, Some((&sid, &version)));
    conn.stream = first.stream.take().filter(|_| !closed);
    Ok(Idle::Mcp(conn))
}

/// Lets idle sessions go: streams are dropped, Streamable sessions deleted.
async fn delete_idle(idle: Vec<Idle>, problems: &Problems, deadline: tokio::time::Instant) {
    let conns: Vec<PostConn> = idle
        .into_iter()
        .filter_map(|i| match i {
            Idle::Sse(_) => None,
            Idle::Mcp(conn) => Some(conn),
        })
        .collect();
    delete_sessions(conns, problems, deadline).await;
}

/// Opens one Streamable session as an SDK client does: `initialize` without a session,
/// then `notifications/initialized` naming it on each of its K connections (which warms
/// them up, so that the measured phase opens no connection).
async fn open_mcp_session(
    target: Arc<HttpTarget>,
    run: Arc<Run>,
    session: Arc<SessionState>,
    inflight: usize,
) -> Result<Opened, String> {
    let index = session.index;
    let what = format!("session {index}");
    let mut first = PostConn::mcp(target.clone(), None);
    let mut answer = session.expect(0);
    let (sid, message) = mcp_initialize(&mut first, &run.problems, &what).await?;
    run.on_message(&session, &message, Instant::now());
    if answer.try_recv().is_err() {
        return Err(format!(
            "{what}: the answer to initialize was not its answer: {}",
            preview(&message)
        ));
    }
    let version = negotiated_version(&message);
    let mut conns = Vec::with_capacity(inflight);
    while conns.len() < inflight.max(1) {
        let mut conn = PostConn::mcp(target.clone(), Some((&sid, &version)));
        if conns.is_empty() {
            conn.stream = first.stream.take();
        }
        conns.push(conn);
    }
    for (i, conn) in conns.iter_mut().enumerate() {
        let (head, body) = step(
            || format!("{what}: POST /mcp notifications/initialized on connection {i}"),
            conn.exchange(INITIALIZED),
        )
        .await?;
        if head.status != 202 {
            return Err(format!(
                "{what}: POST /mcp notifications/initialized answered {}: {}",
                head.status,
                preview(&body)
            ));
        }
    }
    let closer = PostConn::mcp(target, Some((&sid, &version)));
    Ok(Opened {
        index,
        stream: None,
        conns,
        closer: Some(closer),
    })
}

/// Opens one 2026-07-28 client: K connections, each warmed up with `server/discover`
/// (which must offer 2026-07-28, as a modern client checks first), so that the measured
/// phase opens none; no session.
async fn open_modern_client(
    target: Arc<HttpTarget>,
    session: Arc<SessionState>,
    inflight: usize,
) -> Result<Opened, String> {
    let index = session.index;
    let mut conns = Vec::with_capacity(inflight);
    while conns.len() < inflight.max(1) {
        let what = format!(
            "client {index}: POST /mcp server/discover on connection {}",
            conns.len()
        );
        let mut discover = PostConn::modern(target.clone(), "server/discover", None);
        let (head, body) = step(|| what.clone(), discover.exchange(DISCOVER)).await?;
        let offered = serde_json::from_slice::<Value>(&body)
            .ok()
            .is_some_and(|v| {
                v["result"]["supportedVersions"]
                    .as_array()
                    .is_some_and(|a| a.contains(&json!("2026-07-28")))
            });
        if head.status != 200 || !offered {
            return Err(format!(
                "{what}: answered {} without 2026-07-28: {}",
                head.status,
                preview(&body)
            ));
        }
        let mut conn = PostConn::modern(target.clone(), "tools/call", Some("echo"));
        conn.stream = discover.stream.take();
        conns.push(conn);
    }
    Ok(Opened {
        index,
        stream: None,
        conns,
        closer: None,
    })
}

/// Bounds one network step of the set-up, naming it when it does not finish.
async fn step<T>(
    what: impl FnOnce() -> String,
    fut: impl std::future::Future<Output = io::Result<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(SETUP_STEP, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{}: {e}", what())),
        Err(_) => Err(format!("{}: no answer within {SETUP_STEP:?}", what())),
    }
}

/// Opens one session's stream, initializes it (as an SDK client does) and opens its K
/// POST connections, one step after the other, each warmed up with a request so that
/// the measured phase opens no connection.
async fn open_http_session(
    target: Arc<HttpTarget>,
    run: Arc<Run>,
    session: Arc<SessionState>,
    inflight: usize,
) -> Result<Opened, String> {
    let index = session.index;
    let (mut stream, post_target) = step(
        || format!("session {index}: GET /sse"),
        EventStream::open(&target, READ_BUFFER),
    )
    .await?;
    let mut conn = PostConn::new(target.clone(), &post_target, "");
    // initialize (id 0), answered on the stream: read here, before the reader task starts.
    let answer = session.expect(0);
    let status = step(
        || format!("session {index}: POST initialize"),
        conn.post(&initialize_body("0")),
    )
    .await?;
    if status != 202 {
        return Err(format!(
            "session {index}: POST initialize answered {status}"
        ));
    }
    let waiting = async {
        let mut answer = answer;
        tokio::select! {
            e = stream.pump(|data, now| run.on_message(&session, data, now)) => Err(e),
            r = &mut answer => r.map_err(|_| io::Error::other("initialize was not answered")),
        }
    };
    step(
        || format!("session {index}: the answer to initialize"),
        waiting,
    )
    .await?;
    let mut conns = vec![conn];
    while conns.len() < inflight {
        conns.push(PostConn::new(target.clone(), &post_target, ""));
    }
    for (i, conn) in conns.iter_mut().enumerate() {
        let status = step(
            || format!("session {index}: POST notifications/initialized on connection {i}"),
            conn.post(INITIALIZED),
        )
        .await?;
        if status != 202 {
            return Err(format!(
                "session {index}: POST notifications/initialized answered {status}"
            ));
        }
    }
    Ok(Opened {
        index,
        stream: Some(stream),
        conns,
        closer: None,
    })
}

async fn read_stream(mut stream: EventStream, run: Arc<Run>, session: Arc<SessionState>) {
    let e = stream
        .pump(|data, now| run.on_message(&session, data, now))
        .await;
    if !run.stop.load(Ordering::Relaxed) {
        run.problems
            .error(format!("session {}: stream ended: {e}", session.index));
    }
    session.close();
}

/// The session id direct mode uses for session `index`, shaped like the proxy's.
fn fake_sid(salt: u32, index: usize) -> String {
    format!("{salt:08x}-0000-4000-8000-{index:012x}")
}

async fn run_direct(
    o: &Options,
    command: &str,
    run: &Arc<Run>,
    deadline: tokio::time::Instant,
    outcome: &mut Outcome,
) -> Result<(), String> {
    let argv: Vec<&str> = command.split_whitespace().collect();
    let (program, args) = argv.split_first().ok_or("--direct needs a command")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    let child_pid = child.id().unwrap_or_default();
    let stdin = child.stdin.take().ok_or("no stdin pipe")?;
    let mut stdout = child.stdout.take().ok_or("no stdout pipe")?;
    let salt = (nonce_u64() & 0xffff_ffff) as u32;
    let sessions: Arc<Vec<Arc<SessionState>>> = Arc::new(
        (0..o.sessions.max(1))
            .map(|i| Arc::new(SessionState::new(i, o.calls)))
            .collect(),
    );

    // One writer owning stdin, flushing once its queue is empty.
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        let mut out = BufWriter::with_capacity(READ_BUFFER, stdin);
        while let Some(line) = rx.recv().await {
            if out.write_all(&line).await.is_err() {
                return;
            }
            while let Ok(line) = rx.try_recv() {
                if out.write_all(&line).await.is_err() {
                    return;
                }
            }
            if out.flush().await.is_err() {
                return;
            }
        }
    });
    // One reader: each line names its session by the routed id's prefix.
    let reader = {
        let (run, sessions) = (run.clone(), sessions.clone());
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(READ_BUFFER);
            loop {
                buf.reserve(READ_BUFFER / 4);
                match stdout.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let now = Instant::now();
                let mut start = 0;
                while let Some(end) = memchr::memchr(b'\n', &buf[start..]) {
                    let line = &buf[start..start + end];
                    start += end + 1;
                    on_direct_line(&run, &sessions, salt, line, now);
                }
                buf.drain(..start);
            }
            if !run.stop.load(Ordering::Relaxed) {
                run.problems
                    .error("the backend closed its stdout".to_owned());
            }
            for s in sessions.iter() {
                s.close();
            }
        })
    };

    // initialize once, as the proxy does, on session 0's slot 0.
    let sid0 = fake_sid(salt, 0);
    let answer = sessions[0].expect(0);
    let mut line = initialize_body(&format!("\"{sid0}|n:0\""));
    line.push(b'\n');
    tx.send(line).map_err(|_| "the backend's stdin is closed")?;
    match timeout_at(
        deadline.min(tokio::time::Instant::now() + Duration::from_secs(30)),
        answer,
    )
    .await
    {
        Ok(Ok(_)) => {}
        _ => return Err("the backend did not answer initialize".to_owned()),
    }
    let mut line = INITIALIZED.to_vec();
    line.push(b'\n');
    tx.send(line).map_err(|_| "the backend's stdin is closed")?;

    if o.sessions > 0 {
        let mut targets: Vec<u32> = o.pids.iter().flat_map(|&p| process_tree(p)).collect();
        targets.extend(process_tree(child_pid));
        let before = Snapshot::take(&targets);
        let mut workers = Vec::new();
        for session in sessions.iter() {
            let sid = fake_sid(salt, session.index);
            for _ in 0..o.inflight.min(o.calls as usize) {
                let sender = Sender::Pipe {
                    tx: tx.clone(),
                    sid: sid.clone(),
                };
                workers.push(tokio::spawn(worker(
                    run.clone(),
                    session.clone(),
                    sender,
                    deadline,
                )));
            }
        }
        measure(workers, before, &targets, outcome).await;
        finish(o, run, deadline, outcome).await;
    }
    // Close stdin and let the backend exit; kill it if it lingers.
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    if tokio::time::timeout(Duration::from_secs(2), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
    reader.abort();
    Ok(())
}

fn nonce_u64() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id())
}

fn on_direct_line(run: &Run, sessions: &[Arc<SessionState>], salt: u32, line: &[u8], now: Instant) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return;
    }
    let reply: Reply = match serde_json::from_slice(line) {
        Ok(r) => r,
        Err(e) => {
            return run.problems.violation(format!(
                "backend wrote a line that is not JSON-RPC ({e}): {}",
                preview(line)
            ))
        }
    };
    let Some(raw_id) = reply.id else {
        run.problems.notifications.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let text: Option<String> = serde_json::from_str(raw_id.get()).ok();
    let routed = text.as_deref().and_then(|t| {
        let (sid, _) = t.split_once('|')?;
        let (salt_hex, index_hex) = (sid.get(..8)?, sid.get(24..)?);
        let session = usize::from_str_radix(index_hex, 16).ok()?;
        let id = call_id(CallRef::Routed(t))?;
        (salt_hex == format!("{salt:08x}") && session < sessions.len() && id <= run.calls)
            .then_some((session, id))
    });
    match routed {
        Some((session, id)) => run.complete(&sessions[session], id, &reply, line, now),
        None => run.problems.violation(format!(
            "backend answered an id that was never sent: {}",
            preview(line)
        )),
    }
}

// ---------------------------------------------------------------------------------------
// The bench report

mod report {
    //! `--report FILE`: the table of `tests/bench.sh`, from its JSON lines (loadgen results
    //! tagged `row`, `target`, `round`, `delay`; and `{"kind":"rss",...}` lines).

    use super::*;

    pub const TARGETS: [&str; 4] = ["direct", "floor", "switchboard", "switchboard-blocking"];
    /// The suffix of an older build's target (`BENCH_BEFORE`), e.g. `switchboard@before`.
    const BEFORE: &str = "@before";
    /// The HTTP transports of a row, by their `transport` tag (`sse` when untagged).
    const PATHS: [&str; 3] = ["sse", "mcp", "modern"];

    /// How the table names a path: `modern` is `/mcp` in the 2026-07-28 era.
    fn path_name(path: &str) -> &'static str {
        match path {
            "mcp" => "/mcp",
            "modern" => "/mcp 2026",
            _ => "/sse",
        }
    }

    fn transport(run: &Value) -> &str {
        run["transport"].as_str().unwrap_or("sse")
    }

    /// The median over rounds of `a`'s calls/s ÷ `b`'s in the same round (both clean).
    fn paired_ratio(a: &[&Value], b: &[&Value]) -> Option<f64> {
        let clean = |r: &&&Value| r["ok"] == json!(true);
        let ratios: Vec<f64> = a
            .iter()
            .filter(clean)
            .filter_map(|x| {
                let y = b.iter().filter(clean).find(|y| y["round"] == x["round"])?;
                ratio(x["calls_per_s"].as_f64(), y["calls_per_s"].as_f64())
            })
            .collect();
        median(ratios)
    }

    fn median(mut v: Vec<f64>) -> Option<f64> {
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        })
    }

    struct Cell {
        calls: Option<f64>,
        p50: Option<f64>,
        p99: Option<f64>,
        lg_cpu: Option<f64>,
        tgt_cpu: Option<f64>,
        spread: Option<f64>,
        runs: usize,
        failed: usize,
    }

    fn cell(runs: &[&Value]) -> Cell {
        let ok: Vec<&&Value> = runs.iter().filter(|r| r["ok"] == json!(true)).collect();
        let col = |k: &str| median(ok.iter().filter_map(|r| r[k].as_f64()).collect());
        let calls: Vec<f64> = ok
            .iter()
            .filter_map(|r| r["calls_per_s"].as_f64())
            .collect();
        let spread = match (
            calls.iter().copied().reduce(f64::min),
            calls.iter().copied().reduce(f64::max),
            median(calls.clone()),
        ) {
            (Some(lo), Some(hi), Some(m)) if m > 0.0 => Some((hi - lo) / m),
            _ => None,
        };
        Cell {
            calls: col("calls_per_s"),
            p50: col("p50_us"),
            p99: col("p99_us"),
            lg_cpu: col("loadgen_cpu_us_per_call"),
            tgt_cpu: col("target_cpu_us_per_call"),
            spread,
            runs: runs.len(),
            failed: runs.len() - ok.len(),
        }
    }

    fn f0(x: Option<f64>) -> String {
        x.map_or("-".to_owned(), |v| format!("{v:.0}"))
    }
    fn f1(x: Option<f64>) -> String {
        x.map_or("-".to_owned(), |v| format!("{v:.1}"))
    }
    fn f2(x: Option<f64>) -> String {
        x.map_or("-".to_owned(), |v| format!("{v:.2}"))
    }
    fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
        match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        }
    }
    fn mib(kb: Option<f64>) -> String {
        kb.map_or("-".to_owned(), |k| format!("{:.1} MiB", k / 1024.0))
    }

    /// One load generator process against two at once, on the floor: medians over pairs.
    fn load_generator_check(lines: &[Value]) {
        let checks: Vec<&Value> = lines
            .iter()
            .filter(|v| v["kind"] == json!("lgcheck") && v["ok"] == json!(true))
            .collect();
        let mut one = Vec::new();
        let mut two = Vec::new();
        let mut busy = Vec::new();
        let mut waiting = Vec::new();
        let pairs: std::collections::BTreeSet<&str> =
            checks.iter().filter_map(|v| v["pair"].as_str()).collect();
        for pair in pairs {
            let of = |procs: &str| -> Vec<&Value> {
                checks
                    .iter()
                    .copied()
                    .filter(|v| v["pair"] == json!(pair) && v["procs"] == json!(procs))
                    .collect()
            };
            if let [single] = of("1")[..] {
                one.extend(single["calls_per_s"].as_f64());
                busy.extend(single["loadgen_cpu_util"].as_f64());
                waiting.extend(single["loadgen_runqueue_wait"].as_f64());
            }
            let split = of("2");
            if split.len() == 2 {
                let calls: f64 = split.iter().filter_map(|v| v["completed"].as_f64()).sum();
                let secs = split
                    .iter()
                    .filter_map(|v| v["elapsed_s"].as_f64())
                    .fold(0.0, f64::max);
                if secs > 0.0 {
                    two.push(calls / secs);
                }
            }
        }
        if one.is_empty() || two.is_empty() {
            return;
        }
        let (one, two) = (median(one), median(two));
        let pct = |x: Option<f64>| x.map_or("-".to_owned(), |b| format!("{:.0}%", b * 100.0));
        println!();
        println!(
            "load generator check (floor, 10,500,4): one loadgen process {} calls/s (its one thread busy {}, \
runnable but waiting for a CPU {} of the run); the same load from two processes at once {} calls/s ({}×): {}",
            f0(one),
            pct(median(busy)),
            pct(median(waiting)),
            f0(two),
            f2(ratio(two, one)),
            if ratio(two, one).is_some_and(|r| r < 1.15) {
                "a second generator adds nothing, so the generator is not what limits the floor"
            } else {
                "two generators go faster: either one generator limits the floor, or (when it waits \
for a CPU much of the time) two processes simply win a larger share of an oversubscribed host"
            }
        );
    }

    pub fn print(path: &str) -> Result<(), String> {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        let lines: Vec<Value> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(|e| format!("{e}: {l}")))
            .collect::<Result<_, _>>()?;
        let runs: Vec<&Value> = lines
            .iter()
            .filter(|v| v.get("row").is_some() && v.get("kind").is_none())
            .collect();
        let mut rows: Vec<String> = Vec::new();
        for r in &runs {
            let row = r["row"].as_str().unwrap_or("?").to_owned();
            if !rows.contains(&row) {
                rows.push(row);
            }
        }
        // The fixed targets, then each older build's beside its own.
        let mut targets: Vec<&str> = TARGETS.to_vec();
        for t in TARGETS {
            let before = format!("{t}{BEFORE}");
            if let Some(name) = runs
                .iter()
                .find_map(|r| r["target"].as_str().filter(|n| *n == before))
            {
                targets.push(name);
            }
        }
        let targets = &targets;
        let rounds = runs
            .iter()
            .filter_map(|r| r["round"].as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        println!(
            "median of {rounds} interleaved round(s); ×floor = calls/s ÷ the floor's on the same transport \
(p99: ÷ its p99); ×direct for the delayed-backend row; /mcp÷/sse = the median over rounds of the \
target's /mcp calls/s ÷ its /sse calls/s in the same round (run back to back), 2026÷2025 likewise \
its 2026-07-28 /mcp calls/s ÷ its 2025 /mcp calls/s; cpu = µs of CPU per \
call (loadgen / server+backend, the latter from /proc in 10 ms ticks); spread = (max-min)/median calls/s."
        );
        println!();
        println!(
            "| S,C,K | backend | target | path | calls/s | p50 µs | p99 µs | ×floor calls/s | ×floor p99 | ×direct calls/s | /mcp÷/sse calls/s | 2026÷2025 calls/s | cpu loadgen | cpu server | spread | failed |"
        );
        println!("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let mut checks: Vec<(String, bool)> = Vec::new();
        let mut mcp_checks: Vec<(String, bool)> = Vec::new();
        let mut modern_checks: Vec<(String, bool)> = Vec::new();
        let mut blocking_checks: Vec<(String, bool)> = Vec::new();
        let mut before_checks: Vec<(String, bool)> = Vec::new();
        for row in &rows {
            let in_row: Vec<&Value> = runs
                .iter()
                .copied()
                .filter(|r| r["row"] == json!(row))
                .collect();
            let delay = in_row
                .iter()
                .find_map(|r| r["delay"].as_str())
                .unwrap_or("")
                .to_owned();
            let of = |t: &str, path: &str| -> Vec<&Value> {
                in_row
                    .iter()
                    .copied()
                    .filter(|r| r["target"] == json!(t) && (t == "direct" || transport(r) == path))
                    .collect()
            };
            let cells: BTreeMap<(&str, &str), Cell> = targets
                .iter()
                .flat_map(|t| PATHS.iter().map(move |p| (*t, *p)))
                .map(|(t, p)| ((t, p), cell(&of(t, p))))
                .collect();
            let direct = &cells[&("direct", "sse")];
            let x_floor_of = |t: &str, path: &str| {
                let c = cells.get(&(t, path))?;
                if c.runs == 0 {
                    return None;
                }
                ratio(c.calls, cells[&("floor", path)].calls)
            };
            for t in targets.iter().copied() {
                for path in PATHS {
                    if t == "direct" && path != "sse" {
                        continue;
                    }
                    let c = &cells[&(t, path)];
                    if c.runs == 0 {
                        continue;
                    }
                    let floor = &cells[&("floor", path)];
                    let x_floor = ratio(c.calls, floor.calls);
                    let x_floor_p99 = ratio(c.p99, floor.p99);
                    let x_direct = if delay.is_empty() {
                        None
                    } else {
                        ratio(c.calls, direct.calls)
                    };
                    let x_sse = (path == "mcp").then(|| paired_ratio(&of(t, "mcp"), &of(t, "sse")));
                    let x_2025 =
                        (path == "modern").then(|| paired_ratio(&of(t, "modern"), &of(t, "mcp")));
                    let dash = || "-".to_owned();
                    println!(
                        "| {row} | {} | {t} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} |",
                        if delay.is_empty() {
                            "echo".to_owned()
                        } else {
                            format!("echo {delay}")
                        },
                        if t == "direct" { "pipes" } else { path_name(path) },
                        f0(c.calls),
                        f0(c.p50),
                        f0(c.p99),
                        if t == "floor" || t == "direct" { dash() } else { f2(x_floor) },
                        if t == "floor" || t == "direct" { dash() } else { f2(x_floor_p99) },
                        if t == "direct" { dash() } else { f2(x_direct) },
                        x_sse.map_or_else(dash, f2),
                        x_2025.map_or_else(dash, f2),
                        f1(c.lg_cpu),
                        f1(c.tgt_cpu),
                        c.spread
                            .map_or("-".to_owned(), |s| format!("{:.0}%", s * 100.0)),
                        c.failed,
                        c.runs,
                    );
                    let sessions = row.split(',').next().unwrap_or("");
                    if path == "mcp"
                        && t.starts_with("switchboard")
                        && delay.is_empty()
                        && (sessions == "10" || sessions == "50")
                    {
                        let x = x_sse.flatten();
                        mcp_checks.push((
                            format!("{t} {row}: /mcp calls/s ≥ 0.9× /sse (got {})", f2(x)),
                            x.is_some_and(|x| x >= 0.9),
                        ));
                        if c.failed > 0 {
                            mcp_checks.push((format!("{t} {row} /mcp: every run clean"), false));
                        }
                    }
                    if path == "modern" && t.starts_with("switchboard") && delay.is_empty() {
                        let x = x_2025.flatten();
                        modern_checks.push((
                            format!(
                                "{t} {row}: 2026-07-28 calls/s ≥ 0.95× 2025 /mcp (got {})",
                                f2(x)
                            ),
                            x.is_some_and(|x| x >= 0.95),
                        ));
                        if c.failed > 0 {
                            modern_checks
                                .push((format!("{t} {row} 2026-07-28: every run clean"), false));
                        }
                    }
                    if t == "switchboard-blocking" && delay.is_empty() {
                        let tokio = &cells[&("switchboard", path)];
                        let (x_calls, x_p99) =
                            (ratio(c.calls, tokio.calls), ratio(c.p99, tokio.p99));
                        let on = path_name(path);
                        blocking_checks.push((
                            format!(
                                "{row} {on}: calls/s ≥ 0.5× switchboard (got {})",
                                f2(x_calls)
                            ),
                            x_calls.is_some_and(|x| x >= 0.5),
                        ));
                        blocking_checks.push((
                            format!("{row} {on}: p99 ≤ 3× switchboard (got {})", f2(x_p99)),
                            x_p99.is_some_and(|x| x <= 3.0),
                        ));
                    }
                    if delay.is_empty() && !t.ends_with(BEFORE) && t.starts_with("switchboard") {
                        let old = x_floor_of(&format!("{t}{BEFORE}"), path);
                        if old.is_some() {
                            let on = path_name(path);
                            before_checks.push((
                                format!(
                                    "{t} {row} {on}: ×floor ≥ the older build's (got {} against {})",
                                    f2(x_floor),
                                    f2(old)
                                ),
                                x_floor.zip(old).is_some_and(|(x, o)| x >= o),
                            ));
                        }
                    }
                    if t != "switchboard" || path != "sse" {
                        continue;
                    }
                    if delay.is_empty() {
                        checks.push((
                            format!("{row}: calls/s ≥ 0.9× floor (got {})", f2(x_floor)),
                            x_floor.is_some_and(|x| x >= 0.9),
                        ));
                    } else {
                        checks.push((
                            format!(
                                "{row} ({delay} backend): calls/s ≥ 0.9× direct (got {})",
                                f2(x_direct)
                            ),
                            x_direct.is_some_and(|x| x >= 0.9),
                        ));
                    }
                    checks.push((
                        format!(
                            "{row}{}: p99 ≤ 1.5× floor (got {})",
                            if delay.is_empty() {
                                String::new()
                            } else {
                                format!(" ({delay} backend)")
                            },
                            f2(x_floor_p99)
                        ),
                        x_floor_p99.is_some_and(|x| x <= 1.5),
                    ));
                    if c.failed > 0 {
                        checks.push((format!("{row}: every run clean"), false));
                    }
                }
            }
        }
        load_generator_check(&lines);
        // Memory.
        let rss: Vec<&Value> = lines.iter().filter(|v| v["kind"] == json!("rss")).collect();
        let kb = |target: &str, when: &str| {
            median(
                rss.iter()
                    .filter(|v| v["target"] == json!(target) && v["when"] == json!(when))
                    .filter_map(|v| v["kb"].as_f64())
                    .collect(),
            )
        };
        if !rss.is_empty() {
            println!();
            let idle_n = lines
                .iter()
                .filter(|v| v["kind"] == json!("idle"))
                .find_map(|v| v["idle_sessions"].as_u64())
                .unwrap_or(0);
            println!(
                "| target | idle RSS | RSS after the matrix | VmRSS / VmHWM with {idle_n} idle sessions |"
            );
            println!("|---|---:|---:|---:|");
            for t in targets.iter().copied().filter(|t| *t != "direct") {
                let idle = kb(t, "idle");
                let after = kb(t, "after");
                let (k_rss, k_hwm) = (kb(t, "10k-rss"), kb(t, "10k-hwm"));
                if idle.is_none() && after.is_none() && k_hwm.is_none() {
                    continue;
                }
                println!(
                    "| {t} | {} | {} | {} |",
                    mib(idle),
                    mib(after),
                    if k_hwm.is_some() {
                        format!("{} / {}", mib(k_rss), mib(k_hwm))
                    } else {
                        "-".to_owned()
                    }
                );
                if t == "switchboard" {
                    checks.push((
                        format!("idle RSS ≤ 4 MiB (got {})", mib(idle)),
                        idle.is_some_and(|k| k <= 4096.0),
                    ));
                    checks.push((
                        format!(
                            "peak RSS ≤ 20 MiB with 10,000 idle sessions (got {} with {idle_n})",
                            mib(k_hwm)
                        ),
                        k_hwm.is_some_and(|k| k <= 20.0 * 1024.0) && idle_n >= 10_000,
                    ));
                }
            }
            for v in lines.iter().filter(|v| v["kind"] == json!("idle")) {
                println!();
                println!(
                    "{} idle sessions ({}): opened in {} s, /health says {} sessions; beside them S,C,K = {}: {} calls/s, p50 {} µs, p99 {} µs{}",
                    v["idle_sessions"],
                    v["target"].as_str().unwrap_or("?"),
                    f2(v["idle_open_s"].as_f64()),
                    v["health_sessions"],
                    v["row"].as_str().unwrap_or("?"),
                    f0(v["calls_per_s"].as_f64()),
                    f0(v["p50_us"].as_f64()),
                    f0(v["p99_us"].as_f64()),
                    if v["ok"] == json!(true) { "" } else { " (FAILED)" }
                );
            }
        }
        print_targets("switchboard (/sse)", &checks);
        print_targets(
            "Streamable HTTP (/mcp against /sse on the same binary)",
            &mcp_checks,
        );
        print_targets(
            "2026-07-28 clients (/mcp 2026 against 2025 /mcp on the same binary)",
            &modern_checks,
        );
        print_targets(
            "switchboard-blocking (against switchboard on the same path)",
            &blocking_checks,
        );
        print_targets(
            "today's build against the older one (BENCH_BEFORE)",
            &before_checks,
        );
        Ok(())
    }
}

/// A list of targets, each MET or MISSed, under its title (nothing when there are none).
fn print_targets(title: &str, checks: &[(String, bool)]) {
    if checks.is_empty() {
        return;
    }
    println!();
    println!("Targets for {title}:");
    println!();
    for (what, ok) in checks {
        println!("- {} {what}", if *ok { "MET" } else { "MISS" });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> Run {
        Run {
            nonce: "abc".to_owned(),
            calls: 3,
            problems: Problems::default(),
            stop: AtomicBool::new(false),
            hang: false,
            modern: false,
        }
    }

    fn answer(id: &str, tok: &str) -> Vec<u8> {
        let mut request = Vec::new();
        call_body(&mut request, id, tok, false);
        let args_start = memchr::memmem::find(&request, b"\"arguments\":").unwrap() + 12;
        let args = &request[args_start..request.len() - 2];
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[],"structuredContent":{}}}}}"#,
            String::from_utf8_lossy(args)
        )
        .into_bytes()
    }

    #[test]
    fn own_answers_complete_their_calls() {
        let r = run();
        let s = SessionState::new(1, 3);
        let mut rx = s.expect(2);
        r.on_message(&s, &answer("2", "abc.1.2"), Instant::now());
        assert!(rx.try_recv().is_ok());
        assert_eq!(r.problems.violations.load(Ordering::Relaxed), 0);
        assert_eq!(r.problems.errors.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn foreign_payloads_ids_and_duplicates_are_violations() {
        let r = run();
        let s = SessionState::new(1, 3);
        let mut rx = s.expect(2);
        // Session 0's answer to its call 2, delivered to session 1: same id, other payload.
        r.on_message(&s, &answer("2", "abc.0.2"), Instant::now());
        assert!(
            rx.try_recv().is_err(),
            "a foreign answer must not complete the call"
        );
        // The payload of call 3 under id 2.
        r.on_message(&s, &answer("2", "abc.1.3"), Instant::now());
        // An id never sent (beyond C), a string id, a fractional one.
        r.on_message(&s, &answer("4", "abc.1.4"), Instant::now());
        r.on_message(&s, &answer("\"2\"", "abc.1.2"), Instant::now());
        r.on_message(&s, &answer("2.0", "abc.1.2"), Instant::now());
        // The right answer, then the same again.
        r.on_message(&s, &answer("2", "abc.1.2"), Instant::now());
        assert!(rx.try_recv().is_ok());
        r.on_message(&s, &answer("2", "abc.1.2"), Instant::now());
        // Answered before it was sent.
        r.on_message(&s, &answer("3", "abc.1.3"), Instant::now());
        r.on_message(&s, b"not json", Instant::now());
        assert_eq!(r.problems.violations.load(Ordering::Relaxed), 8);
        let examples = lock(&r.problems.examples).join("\n");
        assert!(examples.contains("belongs to session 0 id 2"), "{examples}");
    }

    #[test]
    fn routed_ids_and_plain_ids() {
        assert_eq!(call_id(CallRef::Plain("17")), Some(17));
        assert_eq!(call_id(CallRef::Plain("017")), None);
        assert_eq!(call_id(CallRef::Plain("-1")), None);
        assert_eq!(call_id(CallRef::Plain("1e3")), None);
        assert_eq!(call_id(CallRef::Routed("x-y|n:42")), Some(42));
        assert_eq!(call_id(CallRef::Routed("x-y|s:42")), None);
    }

    #[test]
    fn chunked_decoding_is_incremental() {
        let wire = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n";
        for split in 0..wire.len() {
            let mut d = Chunked::default();
            let mut out = Vec::new();
            let mut pending = wire[..split].to_vec();
            let used = d.decode(&pending, &mut out).unwrap();
            pending.drain(..used);
            pending.extend_from_slice(&wire[split..]);
            let used = d.decode(&pending, &mut out).unwrap();
            assert_eq!(used, pending.len());
            assert!(d.done);
            assert_eq!(out, b"hello world");
        }
    }

    #[test]
    fn events_and_their_data() {
        let (e, d) = parse_event(b"event: endpoint\ndata: /messages?session_id=x");
        assert_eq!((e, &*d), (&b"endpoint"[..], &b"/messages?session_id=x"[..]));
        let (e, d) = parse_event(b": comment\ndata: {\"a\":1}\r\ndata: 2");
        assert_eq!((e, &*d), (&b"message"[..], &b"{\"a\":1}\n2"[..]));
    }

    #[test]
    fn streamable_answers() {
        let head = parse_head(
            b"HTTP/1.1 200 OK\r\nContent-Type: Application/JSON; charset=utf-8\r\nmcp-session-id: abc\r\ncontent-length: 2",
        )
        .unwrap();
        assert_eq!(head.content_type.as_deref(), Some("application/json"));
        assert_eq!(head.mcp_session.as_deref(), Some("abc"));
        let problems = Problems::default();
        let m = answer_messages(&head, b"{}", &problems).unwrap();
        assert_eq!(m.len(), 1);
        let stream = parse_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream").unwrap();
        let body = b"event: message\ndata: {\"a\":1}\n\n: c\n\ndata: {\"b\":2}\n\n";
        let m = answer_messages(&stream, body, &problems).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(&*m[1], &b"{\"b\":2}"[..]);
        assert_eq!(problems.event_streams.load(Ordering::Relaxed), 1);
        let text = parse_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain").unwrap();
        assert!(answer_messages(&text, b"x", &problems).is_err());
        assert_eq!(
            negotiated_version(br#"{"result":{"protocolVersion":"2025-06-18"}}"#),
            "2025-06-18"
        );
    }

    #[test]
    fn urls_are_loopback_only() {
        let t = HttpTarget::parse("http://127.0.0.1:8000/base/sse").unwrap();
        assert_eq!((t.base.as_str(), t.addr.port()), ("/base", 8000));
        let t = HttpTarget::parse("http://127.0.0.1:8000/base/mcp").unwrap();
        assert_eq!(t.base.as_str(), "/base");
        assert!(HttpTarget::parse("http://192.0.2.1:80").is_err());
        assert!(HttpTarget::parse("https://127.0.0.1:80").is_err());
    }

    #[test]
    fn modern_calls_carry_the_revisions_meta() {
        let mut body = Vec::new();
        call_body(&mut body, "7", "abc.0.7", true);
        let call: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(call["params"]["arguments"]["tok"], "abc.0.7");
        let meta = &call["params"]["_meta"];
        assert_eq!(
            meta["io.modelcontextprotocol/protocolVersion"],
            "2026-07-28"
        );
        assert_eq!(
            meta["io.modelcontextprotocol/clientCapabilities"],
            json!({})
        );
        call_body(&mut body, "7", "abc.0.7", false);
        let call: Value = serde_json::from_slice(&body).expect("JSON");
        assert!(call["params"].get("_meta").is_none(), "{call}");
        let discover: Value = serde_json::from_slice(DISCOVER).expect("JSON");
        assert_eq!(discover["params"]["_meta"], meta.clone());

        let args = |a: &[&str]| parse_args(a.iter().map(|s| (*s).to_owned()));
        let o = args(&["--url", "http://127.0.0.1:1", "--transport", "modern"]).unwrap();
        assert!(o.modern && o.transport == Transport::Mcp);
        let o = args(&["--url", "http://127.0.0.1:1", "--transport", "mcp"]).unwrap();
        assert!(!o.modern);
        assert!(args(&[
            "--url",
            "http://127.0.0.1:1",
            "--transport",
            "modern",
            "--idle",
            "1"
        ])
        .is_err());
    }
}
