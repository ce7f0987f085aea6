//! The backend process: spawned with its pipes, stdout framed into lines, stderr logged,
//! stdin fed from a bounded queue; one thread each.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use switchboard_core::hub::{BackendPipe, Full};
use switchboard_core::lines::LineFramer;
use switchboard_core::supervise::{Exit, Signal};
use tracing::{debug, info, warn};

use crate::supervisor::Input;

/// Lines waiting for the backend's stdin: a POST waits (briefly) for one of this many
/// permits; proxy lines that find no room are dropped and counted.
pub const STDIN_QUEUE: usize = 1024;

/// How long the exit report waits for the stdout reader to finish.
const READER_DRAIN: Duration = Duration::from_secs(1);
/// How often the waiter looks for an exit or a signal to send.
const WAIT_POLL: Duration = Duration::from_millis(20);

/// Room for one client line in the backend's stdin queue; returned when dropped.
pub struct Permit(Sender<()>);

impl Drop for Permit {
    fn drop(&mut self) {
        let _ = self.0.try_send(());
    }
}

/// The pool of stdin permits, shared by POST handlers for the process's whole life.
#[derive(Clone)]
pub struct Permits {
    give: Sender<()>,
    take: Receiver<()>,
}

impl Permits {
    pub fn new() -> Self {
        let (give, take) = crossbeam_channel::bounded(STDIN_QUEUE);
        for _ in 0..STDIN_QUEUE {
            let _ = give.send(());
        }
        Permits { give, take }
    }

    /// A permit, waiting at most `within`.
    pub fn reserve(&self, within: Duration) -> Option<Permit> {
        self.take
            .recv_timeout(within)
            .ok()
            .map(|()| Permit(self.give.clone()))
    }
}

/// A running backend.
pub struct Backend {
    pub pid: u32,
    /// Lines for the backend's stdin, each with the permit it used (if any).
    pub stdin: Sender<(Vec<u8>, Option<Permit>)>,
    /// Signals for the process; the waiter thread reports the exit.
    pub signals: Sender<Signal>,
}

impl BackendPipe for Backend {
    type Permit = Permit;

    fn pid(&self) -> u32 {
        self.pid
    }

    fn write_client_line(&mut self, permit: Permit, line: Vec<u8>) {
        // Room is guaranteed: client lines hold permits, proxy lines stay under their share.
        let _ = self.stdin.try_send((line, Some(permit)));
    }

    fn write_proxy_line(&mut self, line: Vec<u8>) -> Result<(), Full> {
        if self.stdin.len() >= STDIN_QUEUE {
            return Err(Full);
        }
        self.stdin.try_send((line, None)).map_err(|_| Full)
    }
}

/// Starts `command` and the threads around it; every line and the exit are sent to
/// `inputs` tagged with `generation`, so a restarted backend's leftovers are never mistaken.
pub fn spawn(
    command: &[String],
    env: &[(String, String)],
    max_line: usize,
    generation: u64,
    inputs: Sender<Input>,
) -> std::io::Result<Backend> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| std::io::Error::other("no backend command"))?;
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let stdin = child.stdin.take().expect("stdin is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");

    let (stdin_tx, stdin_rx) = crossbeam_channel::bounded(2 * STDIN_QUEUE);
    let (signal_tx, signal_rx) = crossbeam_channel::unbounded();
    let (reader_done_tx, reader_done) = crossbeam_channel::bounded::<()>(1);
    let reader_inputs = inputs.clone();
    thread::Builder::new()
        .name("backend-stdin".into())
        .spawn(move || write_stdin(stdin, stdin_rx))?;
    thread::Builder::new()
        .name("backend-stderr".into())
        .spawn(move || log_stderr(pid, stderr))?;
    thread::Builder::new()
        .name("backend-stdout".into())
        .spawn(move || {
            read_stdout(stdout, max_line, generation, &reader_inputs);
            drop(reader_done_tx);
        })?;
    thread::Builder::new()
        .name("backend-wait".into())
        .spawn(move || {
            let exit = wait(child, signal_rx);
            // Report the lines it wrote before it died first; a grandchild still holding
            // stdout open must not keep the exit from being reported.
            let _ = reader_done.recv_timeout(READER_DRAIN);
            let _ = inputs.send(Input::BackendExited { generation, exit });
        })?;
    Ok(Backend {
        pid,
        stdin: stdin_tx,
        signals: signal_tx,
    })
}

fn write_stdin(stdin: ChildStdin, lines: Receiver<(Vec<u8>, Option<Permit>)>) {
    let mut out = BufWriter::with_capacity(64 * 1024, stdin);
    while let Ok((line, permit)) = lines.recv() {
        if out.write_all(&line).is_err() {
            return;
        }
        drop(permit);
        // Flush once the queue is drained, so bursts become one write.
        while let Ok((line, permit)) = lines.try_recv() {
            if out.write_all(&line).is_err() {
                return;
            }
            drop(permit);
        }
        if out.flush().is_err() {
            return;
        }
    }
    debug!("backend stdin closed");
}

/// Lines read in one go are handed over as one batch.
fn read_stdout(mut stdout: ChildStdout, max_line: usize, generation: u64, inputs: &Sender<Input>) {
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
                .send(Input::BackendLines { generation, batch })
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

/// Waits for the exit, sending the signals the supervisor asks for meanwhile. The child
/// is only reaped here, so a signal never reaches a recycled pid.
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
