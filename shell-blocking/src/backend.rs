//! The backend process: spawned with its pipes, stdout framed into lines, stderr logged,
//! stdin written by the loop while the pipe has room and by a thread of its own when it
//! has not, the exit reported; one thread each.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use switchboard_core::lines::LineFramer;
use switchboard_core::output::STDIN_REPORT_EVERY;
use switchboard_core::supervise::{Exit, Signal};
use switchboard_core::BackendId;
use tracing::{debug, info, warn};

use crate::supervisor::Input;

/// How long the exit report waits for the stdout reader to finish.
const READER_DRAIN: Duration = Duration::from_secs(1);
/// How often the waiter looks for an exit or a signal to send.
const WAIT_POLL: Duration = Duration::from_millis(20);
/// A burst of stdin lines is written once it is this large, idle or not.
const BURST_BYTES: usize = 64 * 1024;
/// The backend's threads only move bytes.
const BACKEND_STACK: usize = 256 * 1024;

/// A running backend, as the loop holds it.
pub struct Backend {
    /// Which process the hub knows this as.
    pub id: BackendId,
    /// Its process id.
    pub pid: u32,
    /// Its stdin; dropped to close it once what is queued is written.
    pub stdin: Option<Stdin>,
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

    set_nonblocking(&stdin)?;
    let pipe = Arc::new(stdin);
    let queued = Arc::new(AtomicUsize::new(0));
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
    let (writer_pipe, writer_queued) = (pipe.clone(), queued.clone());
    let started = waiter
        .and_then(|_| {
            thread_builder("backend-stdin").spawn(move || {
                write_stdin(&writer_pipe, stdin_rx, &writer_queued, id, &writer_inputs)
            })
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
        stdin: Some(Stdin {
            pipe,
            queued,
            bursts: stdin_tx,
            burst: Burst::default(),
        }),
        signals: signal_tx,
    })
}

fn thread_builder(name: &str) -> thread::Builder {
    thread::Builder::new()
        .name(name.into())
        .stack_size(BACKEND_STACK)
}

/// The backend's stdin as the loop holds it. Lines gather while the loop has inputs
/// waiting, then go into the pipe in one write from the loop itself when the pipe has room
/// and nothing is queued before them (no hand-off to another thread on the way); what the
/// pipe does not take is queued for the writer thread, which waits for room.
pub struct Stdin {
    /// The pipe, non-blocking, shared with the writer thread.
    pipe: Arc<ChildStdin>,
    /// Bursts handed to the writer thread and not yet written.
    queued: Arc<AtomicUsize>,
    bursts: Sender<Burst>,
    /// Lines gathered for the next write.
    burst: Burst,
}

/// Lines for the pipe, and how many they are (the hub counts lines).
#[derive(Default)]
struct Burst {
    bytes: Vec<u8>,
    lines: usize,
}

impl Stdin {
    /// Adds `line` to the next write.
    pub fn push(&mut self, line: &[u8]) {
        self.burst.bytes.extend_from_slice(line);
        self.burst.lines += 1;
    }

    /// Whether enough has gathered to write it without waiting for the loop to go idle.
    pub fn is_full(&self) -> bool {
        self.burst.lines >= STDIN_REPORT_EVERY || self.burst.bytes.len() >= BURST_BYTES
    }

    /// Writes what has gathered, or queues what the pipe does not take for the writer
    /// thread (which reports it once written); returns the lines written now.
    pub fn flush(&mut self) -> usize {
        if self.burst.lines == 0 {
            return 0;
        }
        let mut burst = std::mem::take(&mut self.burst);
        // Only the loop adds to `queued`: zero means the writer has nothing left to write.
        if self.queued.load(Ordering::Acquire) == 0 {
            match (&*self.pipe).write(&burst.bytes) {
                Ok(n) if n == burst.bytes.len() => {
                    burst.bytes.clear();
                    self.burst.bytes = burst.bytes;
                    return burst.lines;
                }
                Ok(n) => {
                    burst.bytes.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                // Closed by the backend: its exit is reported by the waiter.
                Err(_) => return 0,
            }
        }
        self.queued.fetch_add(1, Ordering::AcqRel);
        let _ = self.bursts.send(burst);
        0
    }
}

impl Drop for Stdin {
    /// Closing stdin: what has gathered still goes, then the writer closes the pipe.
    fn drop(&mut self) {
        if self.burst.lines > 0 {
            let _ = self.bursts.send(std::mem::take(&mut self.burst));
        }
    }
}

fn set_nonblocking(pipe: &ChildStdin) -> std::io::Result<()> {
    let fd = pipe.as_raw_fd();
    // SAFETY: fcntl with F_GETFL/F_SETFL reads and sets the flags of a descriptor we own;
    // it touches no memory of ours.
    let ok = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) >= 0
    };
    if ok {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Writes the bursts the loop queued (waiting for room in the pipe) and reports their
/// lines written, at least every [`STDIN_REPORT_EVERY`] lines and whenever it catches up.
fn write_stdin(
    pipe: &ChildStdin,
    bursts: Receiver<Burst>,
    queued: &AtomicUsize,
    id: BackendId,
    inputs: &Sender<Input>,
) {
    let mut unreported = 0;
    while let Ok(burst) = bursts.recv() {
        if write_waiting(pipe, &burst.bytes).is_err() {
            return;
        }
        queued.fetch_sub(1, Ordering::AcqRel);
        unreported += burst.lines;
        if unreported >= STDIN_REPORT_EVERY || bursts.is_empty() {
            let lines = std::mem::take(&mut unreported);
            let _ = inputs.send(Input::BackendWrote { backend: id, lines });
        }
    }
    debug!("backend stdin closed");
}

/// Writes all of `bytes` to the non-blocking `pipe`, waiting for room when it is full.
fn write_waiting(mut pipe: &ChildStdin, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match pipe.write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let mut ready = libc::pollfd {
                    fd: pipe.as_raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: poll reads and writes one pollfd, which lives on the stack.
                unsafe { libc::poll(&mut ready, 1, -1) };
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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
