//! The spans' way out: a queue of [`QUEUE`] spans (`OTEL_BSP_MAX_QUEUE_SIZE`) and
//! [`QUEUE_BYTES`] between the loop and an exporter thread of its own (SPEC section 14).
//! The loop only `try_send`s (a span that does not fit either bound is lost, and counted); the
//! thread turns each span into the SDK's form, batches them ([`BATCH`] at most, or what
//! came within `OTEL_BSP_SCHEDULE_DELAY`) and sends each batch with the OTLP exporter.
//! Spans the collector did not take (down, stalled past the timeout, refusing) are
//! counted lost too.
//!
//! The thread wakes once a batch, not once a span: the first span of a batch wakes it, and
//! then it sleeps until the batch is due or full ([`BATCH`] spans pushed wake it early). A
//! wake-up a span cost the loop a futex call and the machine a context switch per span.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry_sdk::trace::{SpanData, SpanExporter};

/// Spans that may wait for the exporter (SPEC section 14).
pub(crate) const QUEUE: usize = 2_048;
/// Bytes of spans (by their weight) that may wait for the exporter (SPEC section 14).
pub(crate) const QUEUE_BYTES: usize = 8 << 20;

/// How much a queue holds at most: spans, and bytes by `weigh`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds<T> {
    pub(crate) count: usize,
    pub(crate) bytes: usize,
    pub(crate) weigh: fn(&T) -> usize,
}
/// The most spans sent in one request (the SDK's `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` default).
pub(crate) const BATCH: usize = 512;

/// The loop's end.
pub(crate) struct Queue<T> {
    /// `None` once dropped, so the thread sees the channel closed when it wakes.
    items: Option<SyncSender<(T, usize)>>,
    /// Spans pushed since the thread last took what was queued.
    pushed: Arc<AtomicUsize>,
    /// Bytes of the spans in the channel, by weight.
    queued_bytes: Arc<AtomicUsize>,
    max_bytes: usize,
    weigh: fn(&T) -> usize,
    thread: std::thread::Thread,
    /// Spans the exporter failed to send, not reported yet.
    unsent: Arc<AtomicU64>,
}

impl<T: Send + 'static> Queue<T> {
    /// Starts the exporter thread; the receiver is disconnected once it has sent what was
    /// queued when the last `Queue` was dropped.
    pub(crate) fn start<E: SpanExporter + 'static>(
        convert: impl Fn(T) -> SpanData + Send + 'static,
        exporter: E,
        (delay, bounds): (Duration, Bounds<T>),
    ) -> std::io::Result<(Queue<T>, Receiver<()>)> {
        let (items, received) = sync_channel(bounds.count.max(1));
        let (unsent, pushed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicUsize::new(0)));
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let (done_tx, done) = channel();
        let thread = Thread {
            exporter,
            delay,
            unsent: unsent.clone(),
            pushed: pushed.clone(),
            queued_bytes: queued_bytes.clone(),
            failing: false,
            _done: done_tx,
        };
        let handle = std::thread::Builder::new()
            .name("otlp-spans".into())
            .spawn(move || thread.run(received, convert))?;
        let thread = handle.thread().clone();
        let items = Some(items);
        Ok((
            Queue {
                items,
                pushed,
                queued_bytes,
                max_bytes: bounds.bytes,
                weigh: bounds.weigh,
                thread,
                unsent,
            },
            done,
        ))
    }

    /// Queues `item` without waiting. Returns how many spans were lost since the last
    /// call: this one if the queue is full, and those the collector did not take.
    pub(crate) fn push(&self, item: T) -> u64 {
        let unsent = match self.unsent.load(Ordering::Relaxed) {
            0 => 0,
            _ => self.unsent.swap(0, Ordering::Relaxed),
        };
        let Some(items) = &self.items else {
            return unsent + 1;
        };
        // Only the loop adds bytes, so a span that fits now still fits when it is in.
        let weight = (self.weigh)(&item);
        if self.queued_bytes.load(Ordering::Relaxed) + weight > self.max_bytes {
            return unsent + 1;
        }
        self.queued_bytes.fetch_add(weight, Ordering::Relaxed);
        match items.try_send((item, weight)) {
            Ok(()) => {
                if self.pushed.fetch_add(1, Ordering::Relaxed) + 1 >= BATCH {
                    self.thread.unpark();
                }
                unsent
            }
            Err(_) => {
                self.queued_bytes.fetch_sub(weight, Ordering::Relaxed);
                unsent + 1
            }
        }
    }
}

impl<T> Drop for Queue<T> {
    fn drop(&mut self) {
        self.items = None;
        self.thread.unpark();
    }
}

struct Thread<E> {
    exporter: E,
    delay: Duration,
    unsent: Arc<AtomicU64>,
    pushed: Arc<AtomicUsize>,
    queued_bytes: Arc<AtomicUsize>,
    /// The last export failed (only the first failure of a run is a warning).
    failing: bool,
    _done: Sender<()>,
}

impl<E: SpanExporter> Thread<E> {
    fn run<T>(mut self, items: Receiver<(T, usize)>, convert: impl Fn(T) -> SpanData) {
        let mut batch = Vec::with_capacity(BATCH);
        // A span's bytes count until its batch was sent (or given up on).
        let take = |(item, weight): (T, usize)| (convert(item), weight);
        // The first span of a batch: the one wake-up that waits on the channel.
        while let Ok(first) = items.recv() {
            batch.push(take(first));
            let due = Instant::now() + self.delay;
            let open = loop {
                self.pushed.store(0, Ordering::Relaxed);
                let open = loop {
                    match items.try_recv() {
                        Ok(item) => batch.push(take(item)),
                        Err(TryRecvError::Empty) => break true,
                        Err(TryRecvError::Disconnected) => break false,
                    }
                    if batch.len() == BATCH {
                        self.export(&mut batch);
                    }
                };
                let left = due.saturating_duration_since(Instant::now());
                if !open || left.is_zero() {
                    break open;
                }
                std::thread::park_timeout(left);
            };
            self.export(&mut batch);
            if !open {
                break;
            }
        }
        self.export(&mut batch);
        let _ = self.exporter.shutdown();
    }

    fn export(&mut self, batch: &mut Vec<(SpanData, usize)>) {
        if batch.is_empty() {
            return;
        }
        let (spans, weights): (Vec<SpanData>, Vec<usize>) =
            std::mem::replace(batch, Vec::with_capacity(BATCH))
                .into_iter()
                .unzip();
        let count = spans.len() as u64;
        match futures_executor::block_on(self.exporter.export(spans)) {
            Ok(()) => self.failing = false,
            Err(error) => {
                if !self.failing {
                    tracing::warn!(%error, "cannot export spans; they are counted lost until the collector takes them");
                }
                self.failing = true;
                self.unsent.fetch_add(count, Ordering::Relaxed);
            }
        }
        let sent: usize = weights.into_iter().sum();
        self.queued_bytes.fetch_sub(sent, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceState;
    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId};
    use opentelemetry::InstrumentationScope;
    use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use std::sync::Mutex;
    use std::time::SystemTime;

    /// Collects the batches it is given, or refuses them all.
    #[derive(Debug, Clone, Default)]
    struct Collector {
        batches: Arc<Mutex<Vec<Vec<String>>>>,
        down: bool,
    }

    impl SpanExporter for Collector {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            if self.down {
                return Err(OTelSdkError::InternalFailure("down".into()));
            }
            let names = batch.into_iter().map(|s| s.name.into_owned()).collect();
            self.batches.lock().unwrap().push(names);
            Ok(())
        }
    }

    /// The default bounds, a span's name its weight.
    fn bounds() -> Bounds<String> {
        Bounds {
            count: QUEUE,
            bytes: QUEUE_BYTES,
            weigh: String::len,
        }
    }

    /// Holds the exporter thread until told, so the queue fills.
    #[derive(Debug)]
    struct Stalled(Mutex<std::sync::mpsc::Receiver<()>>);
    impl SpanExporter for Stalled {
        async fn export(&self, _: Vec<SpanData>) -> OTelSdkResult {
            let _ = self.0.lock().unwrap().recv();
            Ok(())
        }
    }

    #[test]
    fn the_queue_is_bounded_by_bytes_too() {
        let (release, stalled) = channel();
        let exporter = Stalled(Mutex::new(stalled));
        let bounds = Bounds {
            bytes: 8 * 1_000_000,
            ..bounds()
        };
        let (queue, _done) = Queue::start(span, exporter, (Duration::ZERO, bounds)).unwrap();
        // 200 spans of 1 MB (the red team's calls, were names not cut) against 8 MB: those
        // queued and those in the batch under way count until sent, so 8 fit; the rest are
        // lost and counted, far fewer than the count bound would keep.
        let big = "x".repeat(1_000_000);
        let lost: u64 = (0..200).map(|_| queue.push(big.clone())).sum();
        assert!(lost >= 200 - 8, "lost {lost}");
        assert!(queue.queued_bytes.load(Ordering::Relaxed) <= 8 * 1_000_000);
        drop(release);
    }

    fn span(name: String) -> SpanData {
        let context = SpanContext::new(
            TraceId::from_bytes([1; 16]),
            SpanId::from_bytes([2; 8]),
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        );
        SpanData {
            span_context: context,
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Server,
            name: name.into(),
            start_time: SystemTime::UNIX_EPOCH,
            end_time: SystemTime::UNIX_EPOCH,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::builder("test").build(),
        }
    }

    #[test]
    fn what_is_queued_is_sent_in_order_when_the_loop_lets_go() {
        let collector = Collector::default();
        let hour = Duration::from_secs(3600);
        let (queue, done) = Queue::start(span, collector.clone(), (hour, bounds())).unwrap();
        let names: Vec<String> = (0..BATCH + 3).map(|n| n.to_string()).collect();
        for name in &names {
            assert_eq!(queue.push(name.clone()), 0);
        }
        drop(queue);
        assert!(done.recv_timeout(Duration::from_secs(10)).is_err());
        let batches = collector.batches.lock().unwrap().clone();
        assert!(batches.iter().all(|b| b.len() <= BATCH));
        assert_eq!(batches.concat(), names);
    }

    #[test]
    fn spans_a_collector_refuses_are_counted_lost() {
        let collector = Collector {
            down: true,
            ..Collector::default()
        };
        let delay = Duration::from_millis(1);
        let (queue, _done) = Queue::start(span, collector, (delay, bounds())).unwrap();
        assert_eq!(queue.push("a".into()), 0);
        assert_eq!(queue.push("b".into()), 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut lost = 0;
        while lost < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
            lost += queue.unsent.swap(0, Ordering::Relaxed);
        }
        assert_eq!(lost, 2);
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let (release, stalled) = channel();
        let exporter = Stalled(Mutex::new(stalled));
        let (queue, _done) = Queue::start(span, exporter, (Duration::ZERO, bounds())).unwrap();
        let started = Instant::now();
        // The thread takes at most one batch before it stalls; the rest of the pushes fill
        // the queue, and what does not fit comes back counted.
        let lost: u64 = (0..QUEUE + BATCH + 10)
            .map(|n| queue.push(n.to_string()))
            .sum();
        assert!(lost >= 10, "lost {lost}");
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(release);
    }
}
