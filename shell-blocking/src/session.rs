//! One SSE stream on a writer thread of its own with a small stack: the loop's end queues
//! frames within the byte budget the hub gave, the thread writes them as chunks.
//!
//! tiny_http hands a response only a writer, and keeps one of its pool threads parked on
//! the connection, reading for a next request that an SSE client never sends. So the
//! stream takes the connection's socket itself: it finds its file descriptor by the peer
//! address, shuts the socket's read side (the pool thread sees the end and is free again:
//! one thread per stream, not two), writes the chunked body straight to the socket with
//! `TCP_NODELAY`, and notices a departed client by the connection's TCP state while idle,
//! within [`DEPARTURE_CHECK`]. Where the socket cannot be found (not Linux, not TCP) the
//! stream falls back to tiny_http's writer and notices departure on its next write.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, RawFd};
use std::thread;
use std::time::Duration;

use chunked_transfer::Encoder;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use switchboard_core::budget::QueueBudget;
use switchboard_core::http::Response;
use switchboard_core::output::coalesce;
use switchboard_core::{Frame, StreamEnd, StreamId};

/// Stream writer threads only move bytes; a small stack lets thousands of idle sessions
/// cost little memory.
pub const STREAM_STACK: usize = 64 * 1024;

/// How often an idle stream looks whether its client is still there.
pub const DEPARTURE_CHECK: Duration = Duration::from_millis(250);

/// The owner loop's end of a stream: sends never wait.
#[derive(Debug)]
pub struct Queue {
    tx: Sender<Frame>,
    budget: QueueBudget,
}

impl Queue {
    /// Queues `frame`, or says why the stream cannot take it.
    pub fn push(&self, frame: Frame) -> Result<(), StreamEnd> {
        self.budget.admit(frame, |frame| self.tx.send(frame))
    }
}

/// The writer's end: frames to write and the budget to refund.
pub struct StreamBody {
    stream: StreamId,
    rx: Receiver<Frame>,
    budget: QueueBudget,
}

/// A new stream's two ends.
pub fn channel(stream: StreamId, budget: usize) -> (Queue, StreamBody) {
    let (tx, rx) = crossbeam_channel::unbounded();
    let budget = QueueBudget::new(budget);
    let queue = Queue {
        tx,
        budget: budget.clone(),
    };
    (queue, StreamBody { stream, rx, budget })
}

/// Answers `request` with `head` and the stream's frames on a thread of its own, until the
/// loop drops the queue (the stream ended) or the client goes away; then `closed` is told
/// and `ended` runs (once the connection's writer is gone).
/// A thread that cannot be started is a 503 and a stream that ended at once.
pub fn serve(
    request: tiny_http::Request,
    head: Response,
    body: StreamBody,
    local_port: u16,
    closed: Sender<StreamId>,
    ended: Box<dyn FnOnce() + Send>,
) -> Result<(), Box<tiny_http::Request>> {
    let stream = body.stream;
    let failed = closed.clone();
    // The request goes to the thread once it runs, so that a failed start still has it.
    let (give, take) = crossbeam_channel::bounded::<tiny_http::Request>(1);
    let spawned = thread::Builder::new()
        .name("sse".into())
        .stack_size(STREAM_STACK)
        .spawn(move || {
            let Ok(request) = take.recv() else { return };
            let socket = request
                .remote_addr()
                .copied()
                .and_then(|peer| connection_socket(peer, local_port));
            let _ = match socket {
                Some(socket) => write_to_socket(request, socket, &head, &body),
                None => write_through_tiny_http(request, &head, &body),
            };
            let _ = closed.send(body.stream);
            ended();
        });
    match spawned {
        Ok(_) => {
            let _ = give.send(request);
            Ok(())
        }
        Err(e) => {
            tracing::warn!("cannot start a stream thread: {e}");
            let _ = failed.send(stream);
            Err(Box::new(request))
        }
    }
}

/// The response head as bytes: the core's status and headers, chunked, and the connection
/// closed after the stream (it is not reused).
fn head_bytes(head: &Response) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {} OK\r\n", head.status).into_bytes();
    for (name, value) in &head.headers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.extend_from_slice(b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n");
    out
}

/// Writes the stream straight to the connection's socket (see the module docs).
fn write_to_socket(
    request: tiny_http::Request,
    mut socket: TcpStream,
    head: &Response,
    stream: &StreamBody,
) -> std::io::Result<()> {
    // tiny_http's writer shuts the connection's write side when dropped: keep it until the
    // stream is over.
    let _writer = request.into_writer();
    let _ = socket.set_nodelay(true);
    // The pool thread parked on this connection reads the end and goes back to its pool.
    let _ = socket.shutdown(Shutdown::Read);
    let streamed = stream_frames(&mut socket, head, stream);
    // The connection ends with the stream: a request pipelined behind gets nothing on it.
    let _ = socket.shutdown(Shutdown::Write);
    streamed
}

/// The head, then the stream's frames as chunks, until the stream ends or the client goes.
fn stream_frames(
    socket: &mut TcpStream,
    head: &Response,
    stream: &StreamBody,
) -> std::io::Result<()> {
    socket.write_all(&head_bytes(head))?;
    let mut chunk = Vec::with_capacity(16 * 1024);
    loop {
        match stream.rx.recv_timeout(DEPARTURE_CHECK) {
            Ok(frame) => {
                let frame = coalesce(frame, || stream.rx.try_recv().ok());
                stream.budget.refund(frame.len());
                chunk.clear();
                chunk.extend_from_slice(format!("{:x}\r\n", frame.len()).as_bytes());
                chunk.extend_from_slice(frame.as_ref());
                chunk.extend_from_slice(b"\r\n");
                socket.write_all(&chunk)?;
            }
            Err(RecvTimeoutError::Timeout) => {
                if departed(socket) {
                    return Ok(());
                }
            }
            // The loop ended the stream: the last, empty chunk.
            Err(RecvTimeoutError::Disconnected) => return socket.write_all(b"0\r\n\r\n"),
        }
    }
}

/// The fallback: tiny_http's writer, which notices a departed client only on a write.
fn write_through_tiny_http(
    request: tiny_http::Request,
    head: &Response,
    stream: &StreamBody,
) -> std::io::Result<()> {
    let mut out = request.into_writer();
    out.write_all(&head_bytes(head))?;
    out.flush()?;
    {
        let mut body = Encoder::with_flush_after_write(&mut out);
        while let Ok(frame) = stream.rx.recv() {
            let frame = coalesce(frame, || stream.rx.try_recv().ok());
            stream.budget.refund(frame.len());
            body.write_all(frame.as_ref())?;
            body.get_mut().flush()?;
        }
        // Dropping the encoder writes the last, empty chunk.
    }
    out.flush()
}

/// A socket of our own for the TCP connection from `peer` to our `local_port`: a duplicate
/// of the descriptor tiny_http holds, found among this process's open descriptors.
pub fn connection_socket(peer: SocketAddr, local_port: u16) -> Option<TcpStream> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    for entry in entries.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<RawFd>().ok())
        else {
            continue;
        };
        if peer_of(fd) != Some(peer) {
            continue;
        }
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) reads no memory of ours; a negative result means
        // the descriptor was closed meanwhile, and nothing is owned.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            continue;
        }
        // SAFETY: `dup` is a descriptor we just created and own; the TcpStream closes it.
        let socket = unsafe { TcpStream::from_raw_fd(dup) };
        // Checked again on our own descriptor: the number may have been reused meanwhile.
        let ours = socket.peer_addr().ok() == Some(peer)
            && socket.local_addr().ok().map(|a| a.port()) == Some(local_port);
        if ours {
            return Some(socket);
        }
    }
    None
}

/// The peer address of socket `fd`, if it is a connected IP socket.
fn peer_of(fd: RawFd) -> Option<SocketAddr> {
    // SAFETY: an all-zero sockaddr_storage is a valid value of the plain C struct.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getpeername writes at most `len` bytes into `storage`, which is that large;
    // an fd that is not a socket only makes it fail.
    let rc = unsafe {
        libc::getpeername(
            fd,
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a: libc::sockaddr_in =
                unsafe { std::ptr::read((&storage as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a: libc::sockaddr_in6 =
                unsafe { std::ptr::read((&storage as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::new(ip.into(), u16::from_be(a.sin6_port)))
        }
        _ => None,
    }
}

/// Whether the peer has closed or reset the connection (its TCP state left ESTABLISHED).
fn departed(socket: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero tcp_info is a valid value of the plain C struct.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, which is that large.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    const TCP_ESTABLISHED: u8 = 1;
    rc == 0 && info.tcpi_state != TCP_ESTABLISHED
}
