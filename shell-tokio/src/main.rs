//! `switchboard`: one shared stdio MCP server behind HTTP for many isolated clients, on
//! tokio + hyper.

mod backend;
mod direct;
mod server;
mod session;
mod supervisor;

use std::path::Path;
use std::sync::Arc;

use switchboard_core::config::{Config, LogFormat};
use switchboard_core::CommandLine;
use switchboard_shell::audit::{self, AuditLog};
use switchboard_shell::otel::{self, Telemetry};
use switchboard_shell::Shared;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

use crate::server::Server;
use crate::supervisor::{Input, Supervisor};

fn main() {
    let (config, line) = CommandLine::from_args("switchboard", read_file);
    if config.demo_backend {
        let stdin = std::io::stdin().lock();
        let stdout = std::io::stdout().lock();
        std::process::exit(i32::from(
            switchboard_core::serve_demo(stdin, stdout).is_err(),
        ));
    }
    init_logging(&config);
    raise_open_files_limit();
    let status = run(config, line).unwrap_or_else(|e| {
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

fn run(config: Config, line: CommandLine) -> Result<i32, Box<dyn std::error::Error>> {
    let loaded = config.load(read_file)?;
    let (audit, writer) = start_audit_log(&loaded.config)?.unzip();
    let (telemetry, exported) = start_telemetry(&loaded.config)?.unzip();
    let grace = loaded.config.grace;
    let me = std::env::current_exe()?;
    let command = loaded.config.backend_command(&me.to_string_lossy());
    let listen = loaded.config.listen_addr();
    // One loop by default (issue 42): the hub, the connections and the backend's pipes on
    // one thread, so a call is no hand-off between workers.
    let runtime = match loaded.config.workers {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
    };
    let status = runtime.block_on(async move {
        // Before anything else: SIGHUP's default would end the process.
        let hangup = signal(SignalKind::hangup())?;
        let listener = bind(listen).map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        let local = listener.local_addr()?;
        info!("{}", loaded.config.listening_line(local, &command));
        for warning in loaded.start_warnings() {
            warn!("{warning}");
        }
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let key_store = loaded.front.gate.key_store();
        let front = Arc::new(Shared::new(loaded.front));
        let config = Arc::new(loaded.config);
        let (mut supervisor, inputs) = Supervisor::new(
            config.clone(),
            loaded.settings,
            front.clone(),
            command,
            stop_tx,
        );
        supervisor.owner().use_key_store(key_store);
        supervisor.owner().use_audit_log(audit);
        supervisor.owner().use_telemetry(telemetry);
        tokio::spawn(reload_on_hangup(
            hangup,
            (line, config.clone()),
            inputs.clone(),
        ));
        let server = Arc::new(Server { front, inputs });
        let accept = tokio::spawn(server.serve(listener, stop_rx));
        // The signals are watched on a task of their own: polled in the loop's `select!`,
        // their two receivers cost ~1,800 instructions a call (polled at every input).
        let (signalled, shutdown) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = signalled.send(());
        });
        let shutdown = async move {
            let _ = shutdown.await;
        };
        // A task of its own: with --workers past 1, on a runtime worker, not the thread
        // blocked in `block_on` (a hand-off is then a task wake-up, not a futex wake).
        let (status, drain) = tokio::spawn(supervisor.run(shutdown))
            .await
            .unwrap_or((1, std::time::Duration::ZERO));
        if tokio::time::timeout(drain, accept).await.is_err() {
            info!("connections still open after the drain period");
        }
        Ok::<_, Box<dyn std::error::Error>>(status)
    })?;
    // The loop is gone with its end of the queue: what is queued is written out, within
    // --grace (a stalled sink does not keep the proxy from exiting).
    let deadline = std::time::Instant::now() + grace;
    if let Some(writer) = writer {
        writer.within(grace);
    }
    if let Some(exported) = exported {
        exported.within(deadline.saturating_duration_since(std::time::Instant::now()));
    }
    Ok(status)
}

/// On each SIGHUP the command line, the config file and every file they name are read
/// again off the loop, and the loop gets the result.
async fn reload_on_hangup(
    mut hangup: Signal,
    (line, running): (CommandLine, Arc<Config>),
    inputs: mpsc::Sender<Input>,
) {
    while hangup.recv().await.is_some() {
        info!("SIGHUP: reloading the configuration");
        let (line, running) = (line.clone(), running.clone());
        let loaded = tokio::task::spawn_blocking(move || line.reload(read_file, &running))
            .await
            .unwrap_or_else(|e| Err(format!("the reload task failed: {e}")));
        if inputs.send(Input::Reload(Box::new(loaded))).await.is_err() {
            return;
        }
    }
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    let mut term = signal(SignalKind::terminate()).expect("signal handlers install");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// The listening socket, with a backlog deep enough for a burst of connections (hundreds of
/// clients at once wait in the kernel instead of having their SYNs dropped).
fn bind(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(switchboard_core::config::LISTEN_BACKLOG)
}

/// The soft `RLIMIT_NOFILE` the process started with, which the backend gets back
/// (programs that use `select()` break past 1024 descriptors).
pub static INHERITED_OPEN_FILES: std::sync::OnceLock<libc::rlimit> = std::sync::OnceLock::new();

/// Raises the soft `RLIMIT_NOFILE` to the hard one: each session holds a descriptor, and the soft limit
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
