//! The byte budget of one stream's queue in a shell, given by
//! [`Output::StartStream`](crate::Output::StartStream): the loop charges each frame before
//! queueing it, the stream's writer refunds it once the frame is handed to the socket. A
//! frame that does not fit is the slow-consumer rule, never a wait.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::output::{Frame, StreamEnd};

/// Bytes queued and not yet written, shared by the loop and one stream's writer.
#[derive(Debug, Clone)]
pub struct QueueBudget {
    queued: Arc<AtomicUsize>,
    limit: usize,
}

impl QueueBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        QueueBudget {
            queued: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// Charges `frame` and hands it to `send` (a non-blocking channel send). A frame that
    /// does not fit is [`StreamEnd::Full`]; one whose receiver is gone is
    /// [`StreamEnd::ClientGone`]; neither is charged.
    pub fn admit<E>(
        &self,
        frame: Frame,
        send: impl FnOnce(Frame) -> Result<(), E>,
    ) -> Result<(), StreamEnd> {
        let len = frame.len();
        let before = self.queued.fetch_add(len, Ordering::AcqRel);
        if before + len > self.limit {
            self.refund(len);
            return Err(StreamEnd::Full);
        }
        send(frame).map_err(|_| {
            self.refund(len);
            StreamEnd::ClientGone
        })
    }

    /// `bytes` were written.
    pub fn refund(&self, bytes: usize) {
        self.queued.fetch_sub(bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_and_gone() {
        let budget = QueueBudget::new(10);
        let ok = |_: Frame| Ok::<(), ()>(());
        assert_eq!(budget.admit(Frame::Static(b"123456"), ok), Ok(()));
        assert_eq!(
            budget.admit(Frame::Static(b"123456"), ok),
            Err(StreamEnd::Full)
        );
        budget.refund(6);
        assert_eq!(
            budget.admit(Frame::Static(b"123456"), |_| Err(())),
            Err(StreamEnd::ClientGone)
        );
        assert_eq!(budget.admit(Frame::Static(b"1234567890"), ok), Ok(()));
    }
}
