//! One SSE stream on a writer thread of its own with a small stack: the loop's end queues
//! frames within the byte budget the hub gave, the thread writes them as chunks.

use std::io::Write;
use std::thread;

use chunked_transfer::Encoder;
use crossbeam_channel::{Receiver, Sender};
use switchboard_core::budget::QueueBudget;
use switchboard_core::http::Response;
use switchboard_core::output::coalesce;
use switchboard_core::{Frame, StreamEnd, StreamId};

/// Stream writer threads only move bytes; a small stack lets thousands of idle sessions
/// cost little memory.
const STREAM_STACK: usize = 64 * 1024;

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
/// loop drops the queue (the stream ended) or the client goes away; then `closed` is told.
/// A thread that cannot be started is a stream that ended at once.
pub fn serve(
    request: tiny_http::Request,
    head: Response,
    body: StreamBody,
    closed: Sender<StreamId>,
) {
    let stream = body.stream;
    let failed = closed.clone();
    let spawned = thread::Builder::new()
        .name("sse".into())
        .stack_size(STREAM_STACK)
        .spawn(move || {
            let _ = write_stream(request, &head, &body);
            let _ = closed.send(body.stream);
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start a stream thread: {e}");
        let _ = failed.send(stream);
    }
}

/// The response head as bytes: the core's status and headers, chunked.
fn head_bytes(head: &Response) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {} OK\r\n", head.status).into_bytes();
    for (name, value) in &head.headers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
    out
}

fn write_stream(
    request: tiny_http::Request,
    head: &Response,
    stream: &StreamBody,
) -> std::io::Result<()> {
    let mut out = request.into_writer();
    out.write_all(&head_bytes(head))?;
    out.flush()?;
    {
        let mut body = Encoder::with_flush_after_write(&mut out);
        // Until the loop drops the queue: then the chunked body is ended.
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
