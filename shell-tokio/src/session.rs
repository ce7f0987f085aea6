//! One SSE stream: the loop's end queues frames within the byte budget the hub gave, the
//! response body writes them out. Dropping the body (client gone) tells the loop.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use switchboard_core::coalesce;
use switchboard_core::{Frame, StreamEnd, StreamId};
use switchboard_shell::budget::QueueBudget;
use tokio::sync::mpsc;

/// The owner loop's end of a stream: sends never wait.
#[derive(Debug)]
pub struct Queue {
    tx: mpsc::UnboundedSender<Frame>,
    budget: QueueBudget,
}

impl Queue {
    /// Queues `frame`, or says why the stream cannot take it.
    pub fn push(&self, frame: Frame) -> Result<(), StreamEnd> {
        self.budget.admit(frame, |frame| self.tx.send(frame))
    }
}

/// The response body of a stream.
pub struct StreamBody {
    stream: StreamId,
    rx: mpsc::UnboundedReceiver<Frame>,
    budget: QueueBudget,
    closed: mpsc::UnboundedSender<StreamId>,
}

/// A new stream's two ends.
pub fn channel(
    stream: StreamId,
    budget: usize,
    closed: mpsc::UnboundedSender<StreamId>,
) -> (Queue, StreamBody) {
    let (tx, rx) = mpsc::unbounded_channel();
    let budget = QueueBudget::new(budget);
    let queue = Queue {
        tx,
        budget: budget.clone(),
    };
    let body = StreamBody {
        stream,
        rx,
        budget,
        closed,
    };
    (queue, body)
}

impl Body for StreamBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(frame)) => {
                let out = coalesce(frame, || this.rx.try_recv().ok());
                this.budget.refund(out.len());
                let out = match out {
                    Frame::Owned(v) => Bytes::from(v),
                    Frame::Shared(a) => Bytes::from_owner(a),
                    Frame::Static(s) => Bytes::from_static(s),
                };
                Poll::Ready(Some(Ok(http_body::Frame::data(out))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for StreamBody {
    fn drop(&mut self) {
        // The loop may be gone at exit; nothing is left to tell then.
        let _ = self.closed.send(self.stream);
    }
}
