//! The byte budget of one stream's queue in a shell, given by
//! [`Output::StartStream`](switchboard_core::Output::StartStream): the loop charges each
//! frame before queueing it, the stream's writer refunds it once the frame is handed to the
//! socket. A frame that does not fit is the slow-consumer rule, never a wait.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use switchboard_core::{Frame, StreamEnd};

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

/// The host limits that bound how many sessions a thread-per-stream shell may hold, as the
/// shell read them (`None`: unlimited or unreadable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostLimits {
    /// Threads in use on the system now (`/proc/loadavg`).
    pub threads_in_use: u64,
    /// `RLIMIT_NPROC`.
    pub nproc: Option<u64>,
    /// `/proc/sys/kernel/threads-max`.
    pub threads_max: Option<u64>,
    /// `/proc/sys/kernel/pid_max`.
    pub pid_max: Option<u64>,
    /// The cgroup's `pids.max` and `pids.current`.
    pub cgroup_pids: Option<(u64, u64)>,
    /// `/proc/sys/vm/max_map_count` (a thread stack and its guard page are two maps).
    pub max_map_count: Option<u64>,
    /// The soft `RLIMIT_NOFILE`.
    pub open_files: Option<u64>,
}

/// What a shell's own resources cost per session and in reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionCost {
    /// Threads a live session holds.
    pub threads: u64,
    /// Descriptors a live session holds.
    pub files: u64,
    /// Threads kept out of the budget for everything else.
    pub reserved_threads: u64,
    /// Descriptors kept out of the budget for everything else.
    pub reserved_files: u64,
}

/// How many sessions `limits` allow at `cost` each, and which limit says so: the tightest,
/// at least 1 and at most `cap` (the `--max-sessions` default).
pub fn session_budget(limits: &HostLimits, cost: SessionCost, cap: u64) -> (u64, String) {
    let in_use = limits.threads_in_use;
    let mut threads: Vec<(String, u64)> = Vec::new();
    if let Some(n) = limits.nproc {
        threads.push((format!("RLIMIT_NPROC {n}"), n.saturating_sub(in_use)));
    }
    if let Some(n) = limits.threads_max {
        threads.push((format!("threads-max {n}"), n.saturating_sub(in_use)));
    }
    if let Some(n) = limits.pid_max {
        threads.push((format!("pid_max {n}"), n.saturating_sub(in_use)));
    }
    if let Some((max, current)) = limits.cgroup_pids {
        threads.push((
            format!("cgroup pids.max {max}"),
            max.saturating_sub(current),
        ));
    }
    if let Some(maps) = limits.max_map_count {
        threads.push((format!("max_map_count {maps}"), maps / 2));
    }
    let mut budgets: Vec<(String, u64)> = threads
        .into_iter()
        .map(|(what, free)| {
            let sessions = free.saturating_sub(cost.reserved_threads) / cost.threads.max(1);
            (what, sessions)
        })
        .collect();
    if let Some(files) = limits.open_files {
        let sessions = files.saturating_sub(cost.reserved_files) / cost.files.max(1);
        budgets.push((format!("RLIMIT_NOFILE {files}"), sessions));
    }
    let (what, sessions) = budgets
        .into_iter()
        .min_by_key(|(_, sessions)| *sessions)
        .unwrap_or_else(|| ("no known limit".to_owned(), u64::MAX));
    (sessions.clamp(1, cap), what)
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn the_tightest_limit_sets_the_budget() {
        let cost = SessionCost {
            threads: 1,
            files: 3,
            reserved_threads: 256,
            reserved_files: 64,
        };
        let limits = HostLimits {
            threads_in_use: 100,
            nproc: Some(4_000),
            threads_max: Some(100_000),
            max_map_count: Some(65_530),
            open_files: Some(4_096),
            ..HostLimits::default()
        };
        assert_eq!(
            session_budget(&limits, cost, 10_000),
            (1_344, "RLIMIT_NOFILE 4096".to_owned())
        );
        let open = HostLimits::default();
        assert_eq!(session_budget(&open, cost, 10_000).0, 10_000);
        let starved = HostLimits {
            nproc: Some(10),
            ..HostLimits::default()
        };
        assert_eq!(session_budget(&starved, cost, 10_000).0, 1);
    }
}
