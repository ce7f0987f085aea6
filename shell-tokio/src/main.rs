//! `switchboard`: one shared stdio MCP server behind HTTP for many isolated clients, on
//! tokio + hyper.

mod backend;
mod fetch;
mod server;
mod session;
mod supervisor;

use std::sync::Arc;

use switchboard_core::config::{Config, LogFormat};
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

use crate::server::Server;
use crate::supervisor::Supervisor;

fn main() {
    let config = Config::from_args("switchboard");
    if config.demo_backend {
        let stdin = std::io::stdin().lock();
        let stdout = std::io::stdout().lock();
        std::process::exit(i32::from(
            switchboard_core::demo::serve(stdin, stdout).is_err(),
        ));
    }
    init_logging(&config);
    raise_open_files_limit();
    let status = run(config).unwrap_or_else(|e| {
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

fn run(config: Config) -> Result<i32, Box<dyn std::error::Error>> {
    let gate = config.gate(|path| std::fs::read_to_string(path))?;
    let settings = config.settings_with(|path| std::fs::read_to_string(path))?;
    let me = std::env::current_exe()?;
    let command = config.backend_command(&me.to_string_lossy());
    let listen = config.listen_addr();
    let config = Arc::new(config);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = bind(listen).map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        info!(
            "{}",
            config.listening_line(listener.local_addr()?, &command)
        );
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let (mut supervisor, inputs) = Supervisor::new(config.clone(), settings, command, stop_tx);
        supervisor.use_key_store(gate.key_store());
        let server = Arc::new(Server {
            gate,
            max_body: config.max_body,
            framing: config.framing(),
            inputs,
        });
        let accept = tokio::spawn(server.serve(listener, stop_rx));
        // On a runtime worker, not the thread blocked in `block_on`: every hand-off to and
        // from the loop is then a task wake-up instead of a futex wake across threads.
        let (status, drain) = tokio::spawn(supervisor.run(shutdown_signal()))
            .await
            .unwrap_or((1, std::time::Duration::ZERO));
        if tokio::time::timeout(drain, accept).await.is_err() {
            info!("connections still open after the drain period");
        }
        Ok(status)
    })
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
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
