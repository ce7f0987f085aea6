//! One SSE stream, written by the thread of the connection that asked for it: the loop's
//! end queues frames within the byte budget the hub gave, the thread writes them as chunks
//! straight to the socket, with `TCP_NODELAY`. Its read side is shut first (nothing a
//! client sends after opening a stream is read), and a departed client is noticed by the
//! connection's TCP state while idle, within [`DEPARTURE_CHECK`].

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use switchboard_core::coalesce;
use switchboard_core::http::Response;
use switchboard_core::{Frame, StreamEnd, StreamId};
use switchboard_shell::budget::QueueBudget;

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

/// Answers on `socket` with `head` and the stream's frames until the loop drops the queue
/// (the stream ended) or the client goes away; then `closed` is told, and the connection
/// is over.
pub fn serve(mut socket: TcpStream, head: &Response, body: &StreamBody, closed: &Sender<StreamId>) {
    let _ = socket.set_nodelay(true);
    // A stream may stay unread for a while: the slow-consumer rule ends its session. But a
    // write that moves nothing for [`STALLED_WRITE`] ends the connection, or a client that
    // never reads would keep it (and a thread) after its session was ended.
    let _ = socket.set_write_timeout(Some(switchboard_shell::STALLED_WRITE));
    let _ = socket.shutdown(Shutdown::Read);
    let _ = stream_frames(&mut socket, head, body);
    // The connection ends with the stream: a request pipelined behind gets nothing on it.
    let _ = socket.shutdown(Shutdown::Write);
    let _ = closed.send(body.stream);
}

/// The response head as bytes: the core's status and headers, chunked, and the connection
/// closed after the stream (it is not reused).
fn head_bytes(head: &Response) -> Vec<u8> {
    let reason = crate::server::reason(head.status);
    let mut out = format!("HTTP/1.1 {} {reason}\r\n", head.status).into_bytes();
    for (name, value) in &head.headers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.extend_from_slice(b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n");
    out
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
