//! The backend process: spawned with its pipes, stdout framed into lines, stderr logged,
//! stdin fed from a queue the hub keeps bounded, the exit reported; one thread each.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use switchboard_core::BackendId;
use switchboard_core::LineFramer;
use switchboard_core::STDIN_REPORT_EVERY;
use switchboard_core::{Exit, Signal};
use tracing::{debug, info, warn};

use crate::supervisor::Input;

/// How long the exit report waits for the stdout reader to finish.
const READER_DRAIN: Duration = Duration::from_secs(1);
/// How often the waiter looks for an exit or a signal to send.
const WAIT_POLL: Duration = Duration::from_millis(20);
/// The backend's threads only move bytes.
const BACKEND_STACK: usize = 256 * 1024;

/// A running backend, as the loop holds it.
pub struct Backend {
    /// Which process the hub knows this as.
    pub id: BackendId,
    /// Its process id.
    pub pid: u32,
    /// Lines for its stdin; dropped to close stdin.
    pub stdin: Option<Sender<Vec<u8>>>,
    /// Signals for the process; the waiter thread reports the exit.
    pub signals: Sender<Signal>,
}

/// Starts `command` and the threads around it; every line, write report and the exit are
/// sent to `inputs` tagged with `id`, so a restarted backend's leftovers are never mistaken.
pub fn spawn(
    command: &[String],
    env: &[(String, String)],
    max_line: usize,
    id: BackendId,
    inputs: Sender<Input>,
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
        .stderr(Stdio::piped());
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
    let pid = child.id();
    let stdin = child.stdin.take().expect("stdin is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");

    let (stdin_tx, stdin_rx) = crossbeam_channel::unbounded();
    let (signal_tx, signal_rx) = crossbeam_channel::unbounded();
    let (reader_done_tx, reader_done) = crossbeam_channel::bounded::<()>(1);
    // The waiter starts first and is handed the child after, so that a thread that cannot
    // be started leaves the child with us to kill, never an orphan.
    let (child_tx, child_rx) = crossbeam_channel::bounded::<Child>(1);
    let exits = inputs.clone();
    let waiter = thread_builder("backend-wait").spawn(move || {
        let Ok(child) = child_rx.recv() else { return };
        let exit = wait(child, signal_rx);
        // Report the lines it wrote before it died first; a grandchild still holding
        // stdout open must not keep the exit from being reported.
        let _ = reader_done.recv_timeout(READER_DRAIN);
        let _ = exits.send(Input::BackendExited { backend: id, exit });
    });
    let writer_inputs = inputs.clone();
    let started = waiter
        .and_then(|_| {
            thread_builder("backend-stdin")
                .spawn(move || write_stdin(stdin, stdin_rx, id, &writer_inputs))
        })
        .and_then(|_| thread_builder("backend-stderr").spawn(move || log_stderr(pid, stderr)))
        .and_then(|_| {
            thread_builder("backend-stdout").spawn(move || {
                read_stdout(stdout, max_line, id, &inputs);
                drop(reader_done_tx);
            })
        });
    if let Err(e) = started {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    let _ = child_tx.send(child);
    Ok(Backend {
        id,
        pid,
        stdin: Some(stdin_tx),
        signals: signal_tx,
    })
}

fn thread_builder(name: &str) -> thread::Builder {
    thread::Builder::new()
        .name(name.into())
        .stack_size(BACKEND_STACK)
}

/// Writes queued lines, one flush per burst, and reports them written at least every
/// [`STDIN_REPORT_EVERY`] lines.
fn write_stdin(stdin: ChildStdin, lines: Receiver<Vec<u8>>, id: BackendId, inputs: &Sender<Input>) {
    let mut out = BufWriter::with_capacity(64 * 1024, stdin);
    let mut unreported = 0;
    while let Ok(line) = lines.recv() {
        if out.write_all(&line).is_err() {
            return;
        }
        unreported += 1;
        while let Ok(line) = lines.try_recv() {
            if out.write_all(&line).is_err() {
                return;
            }
            unreported += 1;
        }
        if out.flush().is_err() {
            return;
        }
        if unreported >= STDIN_REPORT_EVERY {
            let lines = std::mem::take(&mut unreported);
            let _ = inputs.send(Input::BackendWrote { backend: id, lines });
        }
    }
    debug!("backend stdin closed");
}

/// Lines read in one go are handed over as one batch.
fn read_stdout(mut stdout: ChildStdout, max_line: usize, id: BackendId, inputs: &Sender<Input>) {
    let mut framer = LineFramer::new(max_line);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match stdout.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let batch = framer.push_batch(&buf[..n]);
        if !batch.is_empty()
            && inputs
                .send(Input::BackendLines { backend: id, batch })
                .is_err()
        {
            return;
        }
    }
}

fn log_stderr(pid: u32, stderr: std::process::ChildStderr) {
    for line in BufReader::new(stderr).lines() {
        match line {
            Ok(line) => info!(target: "backend", pid, "{line}"),
            Err(e) => {
                warn!(target: "backend", pid, "stderr unreadable: {e}");
                return;
            }
        }
    }
}

/// Waits for the exit, sending the signals the hub asks for meanwhile. The child is only
/// reaped here, so a signal never reaches a recycled pid.
fn wait(mut child: Child, signals: Receiver<Signal>) -> Exit {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return to_exit(status.code()),
            Ok(None) => {}
            Err(_) => return Exit::Signal,
        }
        match signals.recv_timeout(WAIT_POLL) {
            Ok(Signal::Terminate) => send_sigterm(child.id()),
            Ok(Signal::Kill) => {
                let _ = child.kill();
            }
            Err(RecvTimeoutError::Timeout) => {}
            // Our handle is gone (the proxy is exiting): kill rather than orphan it.
            Err(RecvTimeoutError::Disconnected) => {
                let _ = child.kill();
                return to_exit(child.wait().ok().and_then(|s| s.code()));
            }
        }
    }
}

fn to_exit(code: Option<i32>) -> Exit {
    code.map_or(Exit::Signal, Exit::Code)
}

fn send_sigterm(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; the pid is our
    // own child's, which has not been reaped yet (only `wait` reaps it).
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
}
