//! The audit log writer (SPEC section 11): a thread of its own behind a queue bounded in
//! count and in bytes (`--audit-buffer`), so a slow disk never stalls the loop nor grows
//! memory. The loop hands it each `Output::Audit` without waking it (the writer looks every
//! few milliseconds and writes what came as one batch); what does not fit, and what the
//! writer could not write, is reported to the hub, which counts it and logs the first drop.
//! At exit the writer gets a bounded time to write out what waits ([`Finish::within`]): a
//! sink that stalls never keeps the proxy from exiting.

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::mpsc::{Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use switchboard_core::SessionId;
use switchboard_core::{rfc3339_millis, AuditRecord};

/// Events that may wait for the writer.
const QUEUE: usize = 65_536;

/// How often the writer looks for events: a bound on how late a line is written, and on
/// how often the writer runs (never once per event).
const BATCH_EVERY: Duration = Duration::from_millis(5);

/// The loop's end of the audit log.
pub struct AuditLog {
    queue: SyncSender<Box<AuditRecord>>,
    /// Events the writer failed to write, not reported yet.
    unwritten: Arc<AtomicU64>,
    /// Bytes of the events queued ([`AuditRecord::held_bytes`]), at most `budget`.
    queued: Arc<AtomicUsize>,
    budget: usize,
}

/// The writer's end, to wait for at exit.
pub struct Finish {
    /// Disconnected once the writer returned.
    done: Receiver<()>,
}

impl Finish {
    /// Waits, at most `within` (`--grace`), for the writer to write out what is queued
    /// once the last `AuditLog` is dropped; a sink that does not take it by then is given
    /// up on (the events still queued are lost; the process exits anyway).
    pub fn within(self, within: Duration) {
        if let Err(RecvTimeoutError::Timeout) = self.done.recv_timeout(within) {
            tracing::warn!(
                "the audit log did not take its last events within {within:?}; exiting without them"
            );
        }
    }
}

impl AuditLog {
    /// Opens `--audit-log PATH` (appending) or standard output (`-`) and starts the writer,
    /// whose queue holds at most `budget` bytes of events.
    pub fn start(
        path: &str,
        component: String,
        budget: usize,
    ) -> std::io::Result<(AuditLog, Finish)> {
        let out: Box<dyn Write + Send> = match path {
            "-" => Box::new(std::io::stdout()),
            path => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| std::io::Error::other(format!("--audit-log {path}: {e}")))?,
            ),
        };
        let (queue, events) = sync_channel(QUEUE);
        let unwritten = Arc::new(AtomicU64::new(0));
        let queued = Arc::new(AtomicUsize::new(0));
        let (done_tx, done) = channel();
        let writer = Writer {
            out,
            component,
            unwritten: unwritten.clone(),
            queued: queued.clone(),
            _done: done_tx,
        };
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || writer.run(events))?;
        let log = AuditLog {
            queue,
            unwritten,
            queued,
            budget,
        };
        Ok((log, Finish { done }))
    }

    /// Queues `record`. Returns how many events were lost since the last call: this one
    /// if the queue is full (in count or in bytes), and those the writer failed to write.
    pub fn push(&self, record: Box<AuditRecord>) -> u64 {
        let unwritten = match self.unwritten.load(Ordering::Relaxed) {
            0 => 0,
            _ => self.unwritten.swap(0, Ordering::Relaxed),
        };
        let size = record.held_bytes();
        // Only this thread adds: the writer only takes away, so the check cannot overshoot.
        if self.queued.load(Ordering::Acquire) + size > self.budget {
            return unwritten + 1;
        }
        self.queued.fetch_add(size, Ordering::AcqRel);
        if self.queue.try_send(record).is_err() {
            self.queued.fetch_sub(size, Ordering::AcqRel);
            return unwritten + 1;
        }
        unwritten
    }
}

/// The writer thread's side.
struct Writer {
    out: Box<dyn Write + Send>,
    component: String,
    unwritten: Arc<AtomicU64>,
    queued: Arc<AtomicUsize>,
    /// Dropped when the writer returns: [`Finish`] learns it is done.
    _done: Sender<()>,
}

impl Writer {
    /// Writes each event as one line, a batch at a time, until the loop's end is gone. A
    /// batch that fails to write is counted lost (the first failure of a run is logged)
    /// and the next batch tried again: a full disk that frees up loses only what came
    /// meanwhile.
    fn run(mut self, events: Receiver<Box<AuditRecord>>) {
        let (mut ids, mut clock) = (Ids::new(), Clock::default());
        let mut batch = String::with_capacity(1 << 16);
        let mut failing = false;
        loop {
            std::thread::sleep(BATCH_EVERY);
            batch.clear();
            if failing {
                // The failed write may have left a partial line: never glue onto it.
                batch.push('\n');
            }
            let mut lines = 0;
            let gone = loop {
                match events.try_recv() {
                    Ok(record) => {
                        self.queued.fetch_sub(record.held_bytes(), Ordering::AcqRel);
                        let id = ids.next();
                        let meta = [id.as_str(), clock.now(), self.component.as_str()];
                        record.write_json(&mut batch, meta);
                        batch.push('\n');
                        lines += 1;
                    }
                    Err(TryRecvError::Empty) => break false,
                    Err(TryRecvError::Disconnected) => break true,
                }
            };
            if lines > 0 {
                let written = self.out.write_all(batch.as_bytes());
                match written.and_then(|()| self.out.flush()) {
                    Ok(()) => failing = false,
                    Err(error) => {
                        if !failing {
                            tracing::error!(%error, "cannot write the audit log; events are lost until it can");
                        }
                        failing = true;
                        self.unwritten.fetch_add(lines, Ordering::Relaxed);
                    }
                }
            }
            if gone {
                return;
            }
        }
    }
}

/// Audit ids: random UUIDs v4 from one seed from the OS (a system call per event would
/// cost more than the event).
struct Ids {
    seed: [u64; 2],
    n: u64,
}

impl Ids {
    fn new() -> Ids {
        let mut bytes = [0u8; 16];
        let _ = getrandom::fill(&mut bytes);
        let (a, b) = bytes.split_at(8);
        let seed = [a, b].map(|half| u64::from_le_bytes(half.try_into().expect("8 bytes")));
        Ids { seed, n: 0 }
    }

    fn next(&mut self) -> SessionId {
        self.n += 1;
        let [a, b] = self
            .seed
            .map(|s| splitmix64(s ^ self.n.wrapping_mul(0xA076_1D64_78BD_642F)));
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&a.to_le_bytes());
        bytes[8..].copy_from_slice(&b.to_le_bytes());
        SessionId::from_random(bytes)
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The wall-clock time as RFC 3339, formatted once per millisecond.
#[derive(Default)]
struct Clock {
    ms: u64,
    text: String,
}

impl Clock {
    fn now(&mut self) -> &str {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if ms != self.ms || self.text.is_empty() {
            self.ms = ms;
            self.text = rfc3339_millis(ms);
        }
        &self.text
    }
}
