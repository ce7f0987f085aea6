//! `switchboard`: one shared stdio MCP server behind HTTP+SSE for many isolated clients,
//! on tokio + hyper.

mod backend;
mod server;
mod session;
mod supervisor;

use std::sync::Arc;

use clap::Parser;
use switchboard_core::config::{Config, LogFormat};
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

use crate::server::Server;
use crate::supervisor::Supervisor;

fn main() {
    let config = Config::parse();
    if config.demo_backend {
        let stdin = std::io::stdin().lock();
        let stdout = std::io::stdout().lock();
        std::process::exit(match switchboard_core::demo::serve(stdin, stdout) {
            Ok(()) => 0,
            Err(_) => 1,
        });
    }
    init_logging(&config);
    let status = match run(config) {
        Ok(status) => status,
        Err(e) => {
            error!("{e}");
            2
        }
    };
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
    let me = std::env::current_exe()?;
    let command = config.backend_command(&me.to_string_lossy());
    let config = Arc::new(config);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        info!(
            "listening on http://{}{}/sse (backend: {})",
            listener.local_addr()?,
            config.base_path(),
            command.join(" ")
        );
        let (supervisor, inputs, closed, stdin) = Supervisor::new(config.clone(), command);
        let server = Arc::new(Server {
            config,
            gate,
            inputs,
            closed,
            stdin,
        });
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let accept = tokio::spawn(server.serve(listener, stop_rx, DRAIN));
        // On a runtime worker, not the thread blocked in `block_on`: every hand-off to and
        // from the loop is then a task wake-up instead of a futex wake across threads.
        let status = tokio::spawn(supervisor.run(shutdown_signal(), stop_tx))
            .await
            .unwrap_or(1);
        let _ = accept.await;
        Ok(status)
    })
}

/// At exit, how long answers already under way get to reach their clients.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("signal handlers install");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
