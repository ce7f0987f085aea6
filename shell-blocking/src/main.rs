//! `switchboard-blocking`: the same proxy as `switchboard` on std threads, tiny_http and
//! crossbeam-channel, for hosts where an async runtime is unwelcome.

mod backend;
mod server;
mod session;
mod supervisor;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::thread;

use switchboard_core::config::{Config, LogFormat};
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

use crate::server::Server;
use crate::supervisor::Supervisor;

fn main() {
    let config = Config::from_args("switchboard-blocking");
    if config.demo_backend {
        let stdin = std::io::stdin().lock();
        let stdout = std::io::stdout().lock();
        std::process::exit(i32::from(
            switchboard_core::demo::serve(stdin, stdout).is_err(),
        ));
    }
    init_logging(&config);
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
    let me = std::env::current_exe()?;
    let command = config.backend_command(&me.to_string_lossy());
    let listen = config.listen_addr();
    let http =
        tiny_http::Server::http(listen).map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let http = Arc::new(http);
    info!(
        "listening on http://{}{}/sse (backend: {})",
        http.server_addr(),
        config.base_path(),
        command.join(" ")
    );
    let config = Arc::new(config);
    let accepting = http.clone();
    let (supervisor, inputs, closed, shutdown) = Supervisor::new(
        config.clone(),
        command,
        Box::new(move || accepting.unblock()),
    );

    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                let _ = shutdown.send(());
            }
        })?;

    let server = Arc::new(Server {
        gate,
        max_body: config.max_body,
        inputs,
        closed,
        busy: AtomicUsize::new(0),
    });
    let serving = server.clone();
    thread::Builder::new()
        .name("accept".into())
        .spawn(move || serving.serve(http))?;
    let (status, drain) = supervisor.run();
    server.drain(drain);
    Ok(status)
}
