//! The audit log writer (SPEC section 11): a thread of its own behind a bounded queue, so a
//! slow disk never stalls the loop. The loop hands it each `Output::Audit`; what does not
//! fit is reported to the hub, which counts it and logs the first drop.

use std::io::Write;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;

use switchboard_core::audit::{rfc3339_millis, AuditRecord};
use switchboard_core::SessionId;

/// Events that may wait for the writer.
const QUEUE: usize = 65_536;

/// The loop's end of the audit log.
pub struct AuditLog {
    queue: SyncSender<Box<AuditRecord>>,
}

impl AuditLog {
    /// Opens `--audit-log PATH` (appending) or standard output (`-`) and starts the writer;
    /// joining the handle after the last `AuditLog` is dropped writes out what is queued.
    pub fn start(path: &str, component: String) -> std::io::Result<(AuditLog, JoinHandle<()>)> {
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
        let writer = std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || write_events(events, out, &component))?;
        Ok((AuditLog { queue }, writer))
    }

    /// Queues `record`; false when the queue is full (the record is dropped).
    pub fn push(&self, record: Box<AuditRecord>) -> bool {
        !matches!(self.queue.try_send(record), Err(TrySendError::Full(_)))
    }
}

/// Writes each event as one line, flushing whenever the queue runs dry.
fn write_events(events: Receiver<Box<AuditRecord>>, out: Box<dyn Write + Send>, component: &str) {
    let mut out = std::io::BufWriter::new(out);
    while let Ok(mut record) = events.recv() {
        loop {
            let line = record.to_json(&audit_id(), &logged_at(), component);
            if writeln!(out, "{line}").is_err() {
                return;
            }
            match events.try_recv() {
                Ok(next) => record = next,
                Err(_) => break,
            }
        }
        if out.flush().is_err() {
            return;
        }
    }
    let _ = out.flush();
}

/// A random UUID v4.
fn audit_id() -> String {
    let mut bytes = [0u8; 16];
    let _ = getrandom::fill(&mut bytes);
    SessionId::from_random(bytes).as_str().to_owned()
}

/// Now, as RFC 3339 UTC with milliseconds.
fn logged_at() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    rfc3339_millis(ms)
}
