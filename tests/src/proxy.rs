//! The binary under test as a real process: which one (a [`Target`]), how it is started on
//! a free loopback port, and how it is watched and stopped.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http::{self, Body, Response};
use crate::WAIT;

/// One implementation of the product; every suite runs against each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `switchboard` (shell-tokio).
    Tokio,
    /// `switchboard-blocking` (shell-blocking).
    Blocking,
}

impl Target {
    pub const ALL: [Target; 2] = [Target::Tokio, Target::Blocking];

    /// The Cargo package that builds this target's binary.
    pub fn package(self) -> &'static str {
        match self {
            Target::Tokio => "switchboard",
            Target::Blocking => "switchboard-blocking",
        }
    }

    pub fn bin_name(self) -> &'static str {
        self.package()
    }

    /// Environment variable that overrides the binary's path (e.g. a release build).
    pub fn env_override(self) -> &'static str {
        match self {
            Target::Tokio => "SWITCHBOARD_BIN",
            Target::Blocking => "SWITCHBOARD_BLOCKING_BIN",
        }
    }

    /// `$SWITCHBOARD_BIN` (or `$SWITCHBOARD_BLOCKING_BIN`), else `<target-dir>/debug/<bin>`.
    pub fn binary(self) -> PathBuf {
        if let Some(p) = std::env::var_os(self.env_override()) {
            return PathBuf::from(p);
        }
        target_dir().join("debug").join(self.bin_name())
    }

    pub fn is_built(self) -> bool {
        self.binary().is_file()
    }
}

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives inside the workspace")
        .to_path_buf()
}

/// `$CARGO_TARGET_DIR` (relative to the workspace root when relative), else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                workspace_root().join(dir)
            }
        }
        None => workspace_root().join("target"),
    }
}

/// Runs one test against `target`. A binary that is not built fails the test with the
/// command to build it under `CI=true`; elsewhere a missing `switchboard-blocking` skips
/// with a loud message (a missing `switchboard` always fails).
pub fn run(target: Target, name: &str, test: fn(Target)) {
    if !target.is_built() {
        let build = format!(
            "{} is missing: run `cargo build -p {}` first (or `tests/run.sh`)",
            target.binary().display(),
            target.package()
        );
        if target == Target::Tokio || std::env::var("CI").as_deref() == Ok("true") {
            panic!("{build}");
        }
        // Once per test binary, past the harness's capture, in one write.
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            let msg = format!(
                "\n**********\nSKIPPED: the {target:?} target's tests (e.g. {name}): {build}\n**********\n"
            );
            let _ = std::io::stderr().write_all(msg.as_bytes());
        });
        return;
    }
    test(target);
}

/// A scratch directory, removed on drop unless the test is failing (kept for debugging).
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "switchboard-tests-{label}-{}-{n}-{nanos}",
            std::process::id()
        ));
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} for debugging", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// How to start a proxy; see [`Proxy::builder`].
pub struct ProxyBuilder {
    target: Target,
    args: Vec<String>,
    command: Vec<String>,
    env: Vec<(String, String)>,
    tokens: Vec<(String, String)>,
    record: bool,
    wait_healthy: bool,
    health_path: String,
    nproc: Option<u64>,
    nofile: Option<u64>,
}

impl ProxyBuilder {
    /// Starts the proxy under `RLIMIT_NPROC = limit` (threads of its user, the thread
    /// budget's tightest limit in the tests).
    pub fn nproc_limit(mut self, limit: u64) -> Self {
        self.nproc = Some(limit);
        self
    }

    /// Starts the proxy under `RLIMIT_NOFILE = limit` (soft and hard, so that the binary
    /// cannot raise it).
    pub fn nofile_limit(mut self, limit: u64) -> Self {
        self.nofile = Some(limit);
        self
    }

    /// One more flag for the binary (before `--`).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// The backend command and its arguments (after `--`).
    pub fn backend<I: IntoIterator<Item = S>, S: Into<String>>(mut self, command: I) -> Self {
        self.command = command.into_iter().map(Into::into).collect();
        self
    }

    /// An environment variable for the proxy process (the backend inherits it).
    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((key.to_owned(), value.into()));
        self
    }

    /// Enables `--auth-tokens` with a file of these `(principal, token)` lines.
    pub fn tokens(mut self, tokens: &[(&str, &str)]) -> Self {
        self.tokens = tokens
            .iter()
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect();
        self
    }

    /// Sets `TEST_BACKEND_RECORD` to a file in the proxy's scratch dir ([`Proxy::recorded`]).
    pub fn record(mut self) -> Self {
        self.record = true;
        self
    }

    /// Where start-up polls for health (default `/health`; under `--base-path` give the prefix).
    pub fn health_path(mut self, path: &str) -> Self {
        self.health_path = path.to_owned();
        self
    }

    /// Returns as soon as the port answers, without waiting for `/health` to say 200.
    pub fn no_health_wait(mut self) -> Self {
        self.wait_healthy = false;
        self
    }

    pub fn start(self) -> Proxy {
        let dir = TempDir::new(&format!("{:?}", self.target).to_lowercase());
        let mut args = self.args.clone();
        if !self.tokens.is_empty() {
            let path = dir.file("tokens.txt");
            let text: String = self
                .tokens
                .iter()
                .map(|(p, t)| format!("{p} {t}\n"))
                .collect();
            fs::write(&path, format!("# principal token\n{text}")).expect("write token file");
            args.push("--auth-tokens".into());
            args.push(path.display().to_string());
        }
        let record = self.record.then(|| dir.file("backend-record.jsonl"));
        let binary = self.target.binary();
        let mut last_error = String::new();
        for attempt in 0..5 {
            let port = free_port();
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let stderr_path = dir.file(&format!("proxy-{attempt}.log"));
            let log = File::create(&stderr_path).expect("create the proxy log");
            let mut cmd = Command::new(&binary);
            cmd.arg("--listen")
                .arg(addr.to_string())
                .args(&args)
                .arg("--")
                .args(&self.command)
                .stdin(Stdio::null())
                .stdout(Stdio::from(log.try_clone().expect("dup log")))
                .stderr(Stdio::from(log));
            for (k, v) in &self.env {
                cmd.env(k, v);
            }
            let limits: Vec<_> = [
                (libc::RLIMIT_NPROC, self.nproc),
                (libc::RLIMIT_NOFILE, self.nofile),
            ]
            .into_iter()
            .filter_map(|(resource, limit)| Some((resource, limit?)))
            .collect();
            if !limits.is_empty() {
                use std::os::unix::process::CommandExt;
                // SAFETY: the closure runs in the child between fork and exec and only calls
                // setrlimit(2), which is async-signal-safe and touches only its argument.
                unsafe {
                    cmd.pre_exec(move || {
                        for &(resource, limit) in &limits {
                            let rlimit = libc::rlimit {
                                rlim_cur: limit,
                                rlim_max: limit,
                            };
                            if libc::setrlimit(resource, &rlimit) != 0 {
                                return Err(std::io::Error::last_os_error());
                            }
                        }
                        Ok(())
                    });
                }
            }
            if let Some(r) = &record {
                cmd.env("TEST_BACKEND_RECORD", r);
            }
            let mut child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
            match wait_ready(&mut child, addr, &self.health_path, self.wait_healthy) {
                Ok(()) => {
                    return Proxy {
                        child: Some(child),
                        addr,
                        target: self.target,
                        stderr_path,
                        record,
                        dir,
                    }
                }
                Err(e) => {
                    let exited = child.try_wait().ok().flatten().is_some();
                    let _ = child.kill();
                    let _ = child.wait();
                    let log = fs::read_to_string(&stderr_path).unwrap_or_default();
                    last_error = format!("{e}\n--- proxy output ---\n{log}");
                    // Only a lost race for the port is worth another try.
                    if !(exited && log.to_lowercase().contains("in use")) {
                        break;
                    }
                }
            }
        }
        panic!(
            "{} did not become ready (args {:?}): {last_error}",
            binary.display(),
            args
        );
    }
}

fn wait_ready(
    child: &mut Child,
    addr: SocketAddr,
    health: &str,
    healthy: bool,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::from("no answer yet");
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().ok().flatten() {
            return Err(format!("the proxy exited during start-up: {status}"));
        }
        match http::request(addr, "GET", health, &[], Body::None, WAIT) {
            Ok(r) if r.status == 200 || !healthy => return Ok(()),
            Ok(r) => last = format!("{health} said {} {}", r.status, r.text()),
            Err(e) => last = format!("/health: {e}"),
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Err(format!("not healthy within 30 s: {last}"))
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// A running proxy. Dropping it stops the process (SIGTERM, then SIGKILL) and, when the
/// test is failing, prints the tail of its log.
pub struct Proxy {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub target: Target,
    stderr_path: PathBuf,
    record: Option<PathBuf>,
    dir: TempDir,
}

impl Proxy {
    pub fn builder(target: Target) -> ProxyBuilder {
        ProxyBuilder {
            target,
            args: Vec::new(),
            command: Vec::new(),
            env: Vec::new(),
            tokens: Vec::new(),
            record: false,
            wait_healthy: true,
            health_path: "/health".to_owned(),
            nproc: None,
            nofile: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("proxy process").id()
    }

    /// The proxy's stdout and stderr so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Waits until the log contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log().contains(needle) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The scratch directory of this proxy.
    pub fn dir(&self) -> &TempDir {
        &self.dir
    }

    /// The file the backend appends every line it receives to (with [`ProxyBuilder::record`]),
    /// for a client process that waits for its own requests to reach the backend.
    pub fn record_path(&self) -> &Path {
        self.record
            .as_deref()
            .expect("start the proxy with .record() to record backend input")
    }

    /// How many `initialize` requests the backend received.
    pub fn recorded_initializes(&self) -> usize {
        self.recorded()
            .iter()
            .filter(|l| l.contains("\"method\":\"initialize\""))
            .count()
    }

    /// Tests mark bodies that must be refused with `MARK-REJECTED`: none may reach the
    /// backend.
    pub fn assert_nothing_rejected_reached_the_backend(&self) {
        let leaked: Vec<String> = self
            .recorded()
            .into_iter()
            .filter(|l| l.contains("MARK-REJECTED"))
            .collect();
        assert!(
            leaked.is_empty(),
            "refused requests reached the backend: {leaked:?}"
        );
    }

    /// Every line the backend received so far (with [`ProxyBuilder::record`]).
    pub fn recorded(&self) -> Vec<String> {
        let path = self
            .record
            .as_ref()
            .expect("start the proxy with .record() to record backend input");
        let mut text = String::new();
        if let Ok(mut f) = File::open(path) {
            let _ = f.seek(SeekFrom::Start(0));
            let _ = f.read_to_string(&mut text);
        }
        text.lines().map(str::to_owned).collect()
    }

    /// Waits until some recorded backend line satisfies `pred`, and returns it.
    pub fn wait_recorded(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(l) = self.recorded().into_iter().find(|l| pred(l)) {
                return l;
            }
            if Instant::now() >= deadline {
                panic!(
                    "the backend never received {what}; it received:\n{}",
                    self.recorded().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Any request on a fresh connection.
    pub fn request(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: Body,
    ) -> Response {
        http::request(self.addr, method, target, headers, body, WAIT)
            .unwrap_or_else(|e| panic!("{method} {target} failed: {e}"))
    }

    pub fn get(&self, target: &str) -> Response {
        self.request("GET", target, &[], Body::None)
    }

    /// `GET /health`: status and JSON body.
    pub fn health(&self) -> (u16, Value) {
        let r = self.get("/health");
        (r.status, r.json())
    }

    /// Polls `/health` until it says `status`; returns the body.
    pub fn wait_health(&self, status: u16, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let (s, body) = self.health();
            if s == status {
                return body;
            }
            if Instant::now() >= deadline {
                panic!("/health did not turn {status} within {timeout:?}; last {s} {body}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET /metrics` text (asserts 200).
    pub fn metrics(&self) -> String {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200, "/metrics: {}", r.text());
        r.text()
    }

    /// The value of one sample line, `name{labels}` exactly as exposed.
    pub fn metric(&self, series: &str) -> Option<f64> {
        parse_metric(&self.metrics(), series)
    }

    /// Waits (at most [`WAIT`]) until `series` (as [`Proxy::metric`] names it; absent counts
    /// as 0) satisfies `ready`; returns its value.
    pub fn wait_metric(&self, series: &str, ready: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + WAIT;
        loop {
            let metrics = self.metrics();
            let value = parse_metric(&metrics, series).unwrap_or(0.0);
            if ready(value) {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "{series} still {value} after {WAIT:?}:\n{metrics}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A field of `/proc/<pid>/status` in kB (`VmRSS`, `VmHWM`).
    pub fn proc_status_kb(&self, field: &str) -> u64 {
        proc_status_kb(self.pid(), field)
            .unwrap_or_else(|| panic!("no {field} in /proc/{}/status", self.pid()))
    }

    /// Sends a signal to the proxy process.
    pub fn signal(&self, signal: i32) {
        let pid = self.pid() as libc::pid_t;
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child,
        // not yet reaped (we hold its `Child`), so it cannot name another process.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal}) failed");
    }

    /// The exit status if the process has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if child.try_wait().ok().flatten().is_none() {
            // SAFETY: as in `signal`: our unreaped child.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(3);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(60)..];
            eprintln!(
                "--- last {} lines of the {:?} proxy's log ({}) ---\n{}\n---",
                tail.len(),
                self.target,
                self.stderr_path.display(),
                tail.join("\n")
            );
        }
    }
}

/// A field of `/proc/<pid>/status` in kB.
pub fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The value of the sample `series` (`name` or `name{labels}`) in Prometheus text.
pub fn parse_metric(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}
