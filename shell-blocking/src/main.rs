//! `switchboard-blocking`: the same proxy as `switchboard` on std threads, `httparse` and
//! crossbeam-channel, for hosts where an async runtime is unwelcome.

mod backend;
mod memory;
mod server;
mod session;
mod supervisor;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::thread;

use switchboard_core::config::{Config, LogFormat};
use switchboard_core::CommandLine;
use switchboard_core::Loaded;
use switchboard_shell::audit::{self, AuditLog};
use switchboard_shell::budget::{session_budget, HostLimits, SessionCost};
use switchboard_shell::otel::{self, Telemetry};
use switchboard_shell::Shared;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

use crate::server::Server;
use crate::supervisor::Supervisor;

fn main() {
    raise_open_files_limit();
    let (config, line) = CommandLine::from_args("switchboard-blocking", read_file);
    if config.demo_backend {
        let stdin = std::io::stdin().lock();
        let stdout = std::io::stdout().lock();
        std::process::exit(i32::from(
            switchboard_core::serve_demo(stdin, stdout).is_err(),
        ));
    }
    init_logging(&config);
    let (budget, limit) = session_budget(&host_limits(), SESSION_COST, MAX_SESSIONS_CAP);
    if config.max_sessions as u64 > budget {
        info!(
            "--max-sessions {} is more than this host's threads and descriptors allow; capped at {budget} ({limit})",
            config.max_sessions
        );
    }
    info!(
        "session budget: {budget} sessions ({limit}); --max-sessions {}",
        config.max_sessions.min(budget as usize)
    );
    let status = run(config, line, budget as usize).unwrap_or_else(|e| {
        error!("{e}");
        2
    });
    std::process::exit(status);
}

fn init_logging(config: &Config) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.log_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Reads a file the flags name (the config file, tokens, key sets).
fn read_file(path: &Path) -> std::io::Result<String> {
    std::fs::read_to_string(path)
}

/// `--max-sessions` capped at this host's `budget`: at start and on each reload alike.
fn capped(mut loaded: Loaded, budget: usize) -> Loaded {
    loaded.config.max_sessions = loaded.config.max_sessions.min(budget);
    loaded.settings.max_sessions = loaded.config.max_sessions;
    loaded
}

/// The audit log's writer, when `--audit-log` is given (its events name the instance).
fn start_audit_log(config: &Config) -> std::io::Result<Option<(AuditLog, audit::Finish)>> {
    let Some(path) = &config.audit_log else {
        return Ok(None);
    };
    let component = config.instance.clone();
    let component = component.unwrap_or_else(|| "switchboard".into());
    AuditLog::start(path, component, config.audit_buffer).map(Some)
}

/// The OTLP exporters, when `--otlp-endpoint` is given.
fn start_telemetry(config: &Config) -> Result<Option<(Telemetry, otel::Flush)>, String> {
    config
        .otlp_endpoint
        .as_deref()
        .map(Telemetry::start)
        .transpose()
}

fn run(
    config: Config,
    line: CommandLine,
    budget: usize,
) -> Result<i32, Box<dyn std::error::Error>> {
    // SIGHUP's default would end the process: handled from here on.
    let signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])?;
    let loaded = capped(config.load(read_file)?, budget);
    let (audit, writer) = start_audit_log(&loaded.config)?.unzip();
    let (telemetry, exported) = start_telemetry(&loaded.config)?.unzip();
    let me = std::env::current_exe()?;
    let command = loaded.config.backend_command(&me.to_string_lossy());
    let listener = bind(loaded.config.listen_addr())?;
    let local = listener.local_addr()?;
    info!("{}", loaded.config.listening_line(local, &command));
    for warning in loaded.start_warnings() {
        warn!("{warning}");
    }
    let key_store = loaded.front.gate.key_store();
    let front = Arc::new(Shared::new(loaded.front));
    // The loop stops the server, which needs the loop's inputs: it gets the server later.
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<Arc<server::Listening>>(1);
    let running = Arc::new(loaded.config);
    let grace = running.grace;
    let (mut supervisor, inputs, closed, shutdown) = Supervisor::new(
        running.clone(),
        loaded.settings,
        front.clone(),
        command,
        Box::new(move || {
            if let Ok(listening) = stop_rx.try_recv() {
                listening.stop();
            }
        }),
    );

    supervisor.owner().use_key_store(key_store);
    supervisor.owner().use_audit_log(audit);
    supervisor.owner().use_telemetry(telemetry);
    let reloads = inputs.clone();
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || on_signals(signals, (&line, &running), budget, &reloads, &shutdown))?;

    let server = Arc::new(Server {
        front,
        inputs,
        closed,
        busy: AtomicUsize::new(0),
        stopping: AtomicBool::new(false),
        connections: AtomicUsize::new(0),
        // A thread for each session's stream, and half the threads kept for everything
        // else for the POSTs beside them: the other half stays for the process.
        max_connections: budget + (SESSION_COST.reserved_threads / 2) as usize,
    });
    if let Err(e) = memory::start() {
        tracing::warn!("cannot start the thread that trims free memory: {e}");
    }
    let listening = Arc::new(server::Listening::new(listener, server.clone()));
    let _ = stop_tx.send(listening.clone());
    thread::Builder::new()
        .name("accept".into())
        .spawn(move || listening.serve())?;
    let (status, drain) = supervisor.run();
    server.drain(drain);
    // What is queued is written out, within --grace (a stalled sink does not keep the
    // proxy from exiting).
    let deadline = std::time::Instant::now() + grace;
    if let Some(writer) = writer {
        writer.within(grace);
    }
    if let Some(exported) = exported {
        exported.within(deadline.saturating_duration_since(std::time::Instant::now()));
    }
    Ok(status)
}

/// The listening socket, its connections' Nagle off and its backlog deep.
fn bind(listen: std::net::SocketAddr) -> Result<std::net::TcpListener, String> {
    let listener = std::net::TcpListener::bind(listen)
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    no_delay(&listener);
    deepen_backlog(&listener);
    Ok(listener)
}

/// SIGINT or SIGTERM asks the loop to shut down; each SIGHUP reads the command line, the
/// config file and every file they name again, here off the loop, and gives the loop the
/// result.
fn on_signals(
    mut signals: signal_hook::iterator::Signals,
    (line, running): (&CommandLine, &Config),
    budget: usize,
    reloads: &crossbeam_channel::Sender<supervisor::Input>,
    shutdown: &crossbeam_channel::Sender<()>,
) {
    for signal in signals.forever() {
        if signal != signal_hook::consts::SIGHUP {
            let _ = shutdown.send(());
            return;
        }
        info!("SIGHUP: reloading the configuration");
        let loaded = line.reload(read_file, running).map(|l| capped(l, budget));
        let loaded = Box::new(loaded);
        if reloads.send(supervisor::Input::Reload(loaded)).is_err() {
            return;
        }
    }
}

/// A burst of connections (hundreds of clients at once) waits in the kernel rather than
/// having SYNs dropped and retried a second later: the accept thread starts a thread per
/// connection, slower than a burst arrives. The same depth as the tokio binary's.
fn deepen_backlog(listener: &std::net::TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: listen on a socket that is already listening only changes its backlog; a
    // failure leaves the one std chose.
    unsafe {
        libc::listen(
            listener.as_raw_fd(),
            switchboard_core::config::LISTEN_BACKLOG as libc::c_int,
        );
    }
}

/// Small answers and SSE events go out at once: accepted connections inherit `TCP_NODELAY`
/// from the listening socket on Linux (each is also set when accepted).
fn no_delay(listener: &std::net::TcpListener) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from `on`, which lives on the
    // stack for the call; a failure only leaves Nagle's algorithm on.
    unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// The soft `RLIMIT_NOFILE` the process started with, which the backend gets back
/// (programs that use `select()` break past 1024 descriptors).
pub static INHERITED_OPEN_FILES: std::sync::OnceLock<libc::rlimit> = std::sync::OnceLock::new();

/// Raises the soft `RLIMIT_NOFILE` to the hard one: sessions hold descriptors, and the soft limit
/// is often a mere 1024.
fn raise_open_files_limit() {
    let mut files = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `files`, which is that large; setrlimit
    // reads it. A failure leaves the limit as it was.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut files) == 0 && files.rlim_cur < files.rlim_max
        {
            let _ = INHERITED_OPEN_FILES.set(files);
            let raised = libc::rlimit {
                rlim_cur: files.rlim_max,
                ..files
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &raised);
        }
    }
}

/// The soft `RLIMIT_NOFILE` now. `None` when unlimited or unreadable.
pub fn open_files_limit() -> Option<u64> {
    let mut files = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `files`, which is that large.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut files) } == 0;
    (read && files.rlim_cur != libc::RLIM_INFINITY).then_some(files.rlim_cur)
}

/// `--max-sessions` is checked against this (the config's own limit).
const MAX_SESSIONS_CAP: u64 = 1_000_000;

/// What a session costs this shell: its stream's connection thread, which writes the
/// stream (see `session`), and two descriptors (its stream's connection and the one its
/// client POSTs on); in reserve, POST connections between streams, the backend's pipes
/// and four threads, the listening socket, the loop, accept, signals and logs.
const SESSION_COST: SessionCost = SessionCost {
    threads: 1,
    files: 2,
    reserved_threads: 256,
    reserved_files: 64,
};

/// The host limits the session budget is computed from.
fn host_limits() -> HostLimits {
    let read =
        |path: &str| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    let mut nproc = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `nproc`, which is that large.
    let nproc = (unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut nproc) } == 0
        && nproc.rlim_cur != libc::RLIM_INFINITY)
        .then_some(nproc.rlim_cur);
    HostLimits {
        // Threads in use on the system: /proc/loadavg's "running/total".
        threads_in_use: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().nth(3)?.split('/').nth(1)?.parse().ok())
            .unwrap_or(0),
        nproc,
        threads_max: read("/proc/sys/kernel/threads-max"),
        pid_max: read("/proc/sys/kernel/pid_max"),
        cgroup_pids: read("/sys/fs/cgroup/pids.max").zip(read("/sys/fs/cgroup/pids.current")),
        max_map_count: read("/proc/sys/vm/max_map_count"),
        open_files: open_files_limit(),
    }
}
