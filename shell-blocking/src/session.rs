//! One SSE stream per session: a writer thread with a small stack, fed by a queue bounded
//! in bytes.

use std::io::Write;
use std::thread;
use std::time::Duration;

use chunked_transfer::Encoder;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use switchboard_core::hub::{self, Frame, Full, QueueBudget, SessionQueue};
use switchboard_core::{sse, SessionId};

/// Stream writer threads only move bytes; a small stack lets thousands of idle sessions
/// cost little memory.
const STREAM_STACK: usize = 64 * 1024;

/// The owner loop's end of a session: sends never wait.
#[derive(Debug)]
pub struct Queue {
    tx: Sender<Frame>,
    budget: QueueBudget,
}

impl SessionQueue for Queue {
    fn push(&self, frame: Frame) -> Result<(), Full> {
        self.budget.admit(frame, |frame| self.tx.send(frame))
    }
}

/// The writer's end: frames to write and the budget to refund.
pub struct SessionStream {
    rx: Receiver<Frame>,
    budget: QueueBudget,
}

/// A new session's two ends.
pub fn channel(limit: usize) -> (Queue, SessionStream) {
    let (tx, rx) = crossbeam_channel::unbounded();
    let budget = QueueBudget::new(limit);
    let queue = Queue {
        tx,
        budget: budget.clone(),
    };
    (queue, SessionStream { rx, budget })
}

const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\n\r\n";

/// Answers `GET /sse` on a thread of its own: the endpoint event, then queued frames with
/// keep-alive comments while idle, until the loop drops the queue (session closed) or the
/// client goes away. Then `closed` is told.
pub fn serve(
    request: tiny_http::Request,
    session: SessionId,
    endpoint_url: String,
    stream: SessionStream,
    keepalive: Duration,
    closed: Sender<SessionId>,
) {
    let spawned = thread::Builder::new()
        .name("sse".into())
        .stack_size(STREAM_STACK)
        .spawn(move || {
            let _ = write_stream(request, &endpoint_url, &stream, keepalive);
            let _ = closed.send(session);
        });
    if let Err(e) = spawned {
        tracing::warn!(session = %session, "cannot start stream thread: {e}");
    }
}

fn write_stream(
    request: tiny_http::Request,
    endpoint_url: &str,
    stream: &SessionStream,
    keepalive: Duration,
) -> std::io::Result<()> {
    let mut out = request.into_writer();
    out.write_all(HEAD)?;
    {
        let mut body = Encoder::with_flush_after_write(&mut out);
        body.write_all(&sse::endpoint_event(endpoint_url))?;
        body.get_mut().flush()?;
        loop {
            match stream.rx.recv_timeout(keepalive) {
                Ok(frame) => {
                    let frame = hub::coalesce(frame, || stream.rx.try_recv().ok());
                    stream.budget.refund(frame.len());
                    body.write_all(frame.as_ref())?;
                }
                Err(RecvTimeoutError::Timeout) => body.write_all(sse::KEEPALIVE)?,
                // The loop closed the session: end the chunked body.
                Err(RecvTimeoutError::Disconnected) => break,
            }
            body.get_mut().flush()?;
        }
        // Dropping the encoder writes the last, empty chunk.
    }
    out.flush()
}
