//! The backend process: spawned with its pipes, stdout framed into lines, stderr logged,
//! stdin fed from a queue the hub keeps bounded, the exit reported.

use std::process::Stdio;

use switchboard_core::BackendId;
use switchboard_core::LineFramer;
use switchboard_core::STDIN_REPORT_EVERY;
use switchboard_core::{Exit, Signal};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tracing::{debug, info, warn, Instrument};

use crate::supervisor::Input;

/// How long the exit report waits for the stdout reader to finish.
const READER_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// A running backend, as the loop holds it.
pub struct Backend {
    /// Which process the hub knows this as.
    pub id: BackendId,
    /// Its process id.
    pub pid: u32,
    /// Lines for its stdin; dropped to close stdin.
    pub stdin: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// Signals for the process; the waiter task reports the exit.
    pub signals: mpsc::UnboundedSender<Signal>,
}

/// Starts `command` and the tasks around it; every line, write report and the exit are
/// sent to `inputs` tagged with `id`, so a restarted backend's leftovers are never mistaken.
pub fn spawn(
    command: &[String],
    env: &[(String, String)],
    max_line: usize,
    id: BackendId,
    inputs: mpsc::Sender<Input>,
) -> std::io::Result<Backend> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| std::io::Error::other("no backend command"))?;
    let mut backend = Command::new(program);
    backend
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(&inherited) = crate::INHERITED_OPEN_FILES.get() {
        // SAFETY: the closure runs in the child between fork and exec and only calls
        // setrlimit(2), which is async-signal-safe and reads only its argument.
        unsafe {
            backend.pre_exec(move || {
                libc::setrlimit(libc::RLIMIT_NOFILE, &inherited);
                Ok(())
            });
        }
    }
    let mut child = backend.spawn()?;
    let pid = child.id().unwrap_or_default();
    let span = tracing::info_span!("backend", pid);
    let stdin = child.stdin.take().expect("stdin is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");

    let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
    // The pipes' tasks run for every call: they carry no span (entered on each poll), and
    // the one line they log names the pid itself.
    tokio::spawn(write_stdin(stdin, stdin_rx, (id, pid), inputs.clone()));
    tokio::spawn(log_stderr(stderr).instrument(span.clone()));
    let (signal_tx, signal_rx) = mpsc::unbounded_channel();
    let reader_inputs = inputs.clone();
    let reader =
        tokio::spawn(async move { read_stdout(stdout, max_line, id, &reader_inputs).await });
    tokio::spawn(
        async move {
            let exit = wait(child, signal_rx).await;
            // Report the lines it wrote before it died first; a grandchild still holding
            // stdout open must not keep the exit from being reported.
            let _ = tokio::time::timeout(READER_DRAIN, reader).await;
            let _ = inputs
                .send(Input::BackendExited { backend: id, exit })
                .await;
        }
        .instrument(span),
    );
    Ok(Backend {
        id,
        pid,
        stdin: Some(stdin_tx),
        signals: signal_tx,
    })
}

/// Writes queued lines, one flush per burst, and reports them written at least every
/// [`STDIN_REPORT_EVERY`] lines.
async fn write_stdin(
    stdin: ChildStdin,
    mut lines: mpsc::UnboundedReceiver<Vec<u8>>,
    (id, pid): (BackendId, u32),
    inputs: mpsc::Sender<Input>,
) {
    let mut out = BufWriter::with_capacity(64 * 1024, stdin);
    let mut unreported = 0;
    while let Some(line) = lines.recv().await {
        if out.write_all(&line).await.is_err() {
            break;
        }
        unreported += 1;
        while let Ok(line) = lines.try_recv() {
            if out.write_all(&line).await.is_err() {
                return;
            }
            unreported += 1;
        }
        if out.flush().await.is_err() {
            break;
        }
        if unreported >= STDIN_REPORT_EVERY {
            let lines = std::mem::take(&mut unreported);
            let _ = inputs
                .send(Input::BackendWrote { backend: id, lines })
                .await;
        }
    }
    debug!(pid, "backend stdin closed");
}

/// Lines read in one go are handed over as one batch.
async fn read_stdout(
    mut stdout: tokio::process::ChildStdout,
    max_line: usize,
    id: BackendId,
    inputs: &mpsc::Sender<Input>,
) {
    let mut framer = LineFramer::new(max_line);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match stdout.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let batch = framer.push_batch(&buf[..n]);
        if !batch.is_empty()
            && inputs
                .send(Input::BackendLines { backend: id, batch })
                .await
                .is_err()
        {
            break;
        }
    }
}

async fn log_stderr(stderr: tokio::process::ChildStderr) {
    let mut lines = BufReader::new(stderr).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => info!(target: "backend", "{line}"),
            Ok(None) => break,
            Err(e) => {
                warn!(target: "backend", "stderr unreadable: {e}");
                break;
            }
        }
    }
}

/// Waits for the exit, sending the signals the hub asks for meanwhile.
async fn wait(mut child: Child, mut signals: mpsc::UnboundedReceiver<Signal>) -> Exit {
    loop {
        tokio::select! {
            status = child.wait() => return to_exit(status),
            signal = signals.recv() => match (signal, child.id()) {
                (Some(Signal::Terminate), Some(pid)) => send_sigterm(pid),
                (Some(Signal::Kill), _) => { let _ = child.start_kill(); }
                // Our handle is gone (the proxy is exiting): kill rather than orphan it.
                (None, _) => { let _ = child.start_kill(); return to_exit(child.wait().await); }
                (Some(Signal::Terminate), None) => {}
            },
        }
    }
}

fn to_exit(status: std::io::Result<std::process::ExitStatus>) -> Exit {
    match status.ok().and_then(|s| s.code()) {
        Some(code) => Exit::Code(code),
        None => Exit::Signal,
    }
}

fn send_sigterm(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; the pid is our
    // own child's, which has not been reaped yet (we still hold its `Child`).
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
}
