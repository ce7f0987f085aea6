//! One SSE stream per session, fed by a queue bounded in bytes.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame};
use switchboard_core::{sse, SessionId};
use tokio::sync::mpsc;
use tokio::time::{Interval, MissedTickBehavior};

/// Frames queued beyond this are coalesced into one write.
const COALESCE_LIMIT: usize = 64 * 1024;

/// The owner loop's end of a session: sends never wait.
#[derive(Debug)]
pub struct SessionQueue {
    tx: mpsc::UnboundedSender<Bytes>,
    queued: Arc<AtomicUsize>,
    limit: usize,
}

/// A frame did not fit: the session must be closed (slow consumer), never thinned.
#[derive(Debug)]
pub struct Full;

impl SessionQueue {
    /// Queues one SSE frame, or reports the session as a slow consumer (or already gone).
    pub fn send(&self, frame: Bytes) -> Result<(), Full> {
        let len = frame.len();
        let before = self.queued.fetch_add(len, Ordering::AcqRel);
        if before + len > self.limit {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            return Err(Full);
        }
        self.tx.send(frame).map_err(|_| Full)
    }
}

/// The response body of `GET /sse`: the endpoint event, then queued frames, with keep-alive
/// comments while idle. Dropping it (client gone) tells the owner loop the session ended.
pub struct SessionStream {
    session: SessionId,
    first: Option<Bytes>,
    rx: mpsc::UnboundedReceiver<Bytes>,
    queued: Arc<AtomicUsize>,
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
) -> (SessionQueue, SessionStream) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let mut keepalive =
        tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
    keepalive.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let queue = SessionQueue {
        tx,
        queued: queued.clone(),
        limit,
    };
    let stream = SessionStream {
        session,
        first: Some(Bytes::from(sse::endpoint_event(endpoint_url))),
        rx,
        queued,
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
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(frame)) => {
                let mut taken = frame.len();
                // Coalesce what is already queued into one write.
                let out = if let Ok(next) = this.rx.try_recv() {
                    let mut buf =
                        BytesMut::with_capacity(COALESCE_LIMIT.max(frame.len() + next.len()));
                    buf.extend_from_slice(&frame);
                    buf.extend_from_slice(&next);
                    taken += next.len();
                    while buf.len() < COALESCE_LIMIT {
                        match this.rx.try_recv() {
                            Ok(more) => {
                                taken += more.len();
                                buf.extend_from_slice(&more);
                            }
                            Err(_) => break,
                        }
                    }
                    buf.freeze()
                } else {
                    frame
                };
                this.queued.fetch_sub(taken, Ordering::AcqRel);
                this.keepalive.reset();
                Poll::Ready(Some(Ok(Frame::data(out))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.keepalive.poll_tick(cx) {
                Poll::Ready(_) => {
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(sse::KEEPALIVE)))))
                }
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
