//! One SSE stream per session, fed by a queue bounded in bytes.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use switchboard_core::hub::{self, Frame, Full, QueueBudget, SessionQueue};
use switchboard_core::{sse, SessionId};
use tokio::sync::mpsc;
use tokio::time::{Interval, MissedTickBehavior};

/// The owner loop's end of a session: sends never wait.
#[derive(Debug)]
pub struct Queue {
    tx: mpsc::UnboundedSender<Frame>,
    budget: QueueBudget,
}

impl SessionQueue for Queue {
    fn push(&self, frame: Frame) -> Result<(), Full> {
        self.budget.admit(frame, |frame| self.tx.send(frame))
    }
}

/// The response body of `GET /sse`: the endpoint event, then queued frames, with keep-alive
/// comments while idle. Dropping it (client gone) tells the owner loop the session ended.
pub struct SessionStream {
    session: SessionId,
    first: Option<Bytes>,
    rx: mpsc::UnboundedReceiver<Frame>,
    budget: QueueBudget,
    keepalive: Interval,
    closed: mpsc::UnboundedSender<SessionId>,
}

/// A new session's two ends.
pub fn channel(
    session: SessionId,
    endpoint_url: &str,
    limit: usize,
    keepalive: Duration,
    closed: mpsc::UnboundedSender<SessionId>,
) -> (Queue, SessionStream) {
    let (tx, rx) = mpsc::unbounded_channel();
    let budget = QueueBudget::new(limit);
    let mut keepalive =
        tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
    keepalive.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let queue = Queue {
        tx,
        budget: budget.clone(),
    };
    let stream = SessionStream {
        session,
        first: Some(Bytes::from(sse::endpoint_event(endpoint_url))),
        rx,
        budget,
        keepalive,
        closed,
    };
    (queue, stream)
}

impl Body for SessionStream {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(first))));
        }
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(frame)) => {
                let out = hub::coalesce(frame, || this.rx.try_recv().ok());
                this.budget.refund(out.len());
                this.keepalive.reset();
                let out = match out {
                    Frame::Owned(v) => Bytes::from(v),
                    Frame::Shared(a) => Bytes::from_owner(a),
                };
                Poll::Ready(Some(Ok(http_body::Frame::data(out))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.keepalive.poll_tick(cx) {
                Poll::Ready(_) => Poll::Ready(Some(Ok(http_body::Frame::data(
                    Bytes::from_static(sse::KEEPALIVE),
                )))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl Drop for SessionStream {
    fn drop(&mut self) {
        // The loop may be gone at shutdown; nothing is left to tell then.
        let _ = self.closed.send(self.session);
    }
}
