//! Backend supervision decisions both shells share: restart or shut down, the backoff, and
//! what `/health` says. Time comes in as durations; the shells own the clock.

use std::time::Duration;

use crate::settings::Restart;

const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A backend that ran this long is considered healthy again: the backoff starts over.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// How a backend process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exited with this status code.
    Code(i32),
    /// Killed by a signal (or no code is known).
    Signal,
    /// The process could not be started at all.
    SpawnFailed,
}

impl Exit {
    /// The proxy's own exit status when it follows the backend out.
    pub fn proxy_status(self) -> i32 {
        match self {
            Exit::Code(code) => code,
            Exit::Signal | Exit::SpawnFailed => 1,
        }
    }
}

/// A signal the hub sends the backend while stopping it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM.
    Terminate,
    /// SIGKILL.
    Kill,
}

/// What to do after the backend exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterExit {
    /// Start it again after this delay.
    Restart {
        /// The backoff.
        after: Duration,
    },
    /// Shut the proxy down (SPEC section 5) and exit with this status.
    Shutdown {
        /// The proxy's exit status.
        status: i32,
    },
}

/// The restart policy with its exponential backoff (0.5 s doubling to 30 s, reset after a
/// minute of healthy running).
#[derive(Debug, Clone)]
pub(crate) struct Supervisor {
    policy: Restart,
    next_backoff: Duration,
    restarts: u64,
}

impl Supervisor {
    /// A supervisor for `policy`, with no restart yet.
    pub(crate) fn new(policy: Restart) -> Self {
        Supervisor {
            policy,
            next_backoff: FIRST_BACKOFF,
            restarts: 0,
        }
    }

    /// Follows `policy` from the next exit on (a reload); the backoff stays as it is.
    pub(crate) fn set_policy(&mut self, policy: Restart) {
        self.policy = policy;
    }

    /// Decides after an exit of a backend that ran for `ran_for`.
    pub(crate) fn exited(&mut self, exit: Exit, ran_for: Duration) -> AfterExit {
        let restart = match self.policy {
            Restart::Always => true,
            Restart::Never => false,
            Restart::OnFailure => exit != Exit::Code(0),
        };
        if !restart {
            return AfterExit::Shutdown {
                status: exit.proxy_status(),
            };
        }
        if ran_for >= HEALTHY_RUN {
            self.next_backoff = FIRST_BACKOFF;
        }
        let after = self.next_backoff;
        self.next_backoff = (self.next_backoff * 2).min(MAX_BACKOFF);
        self.restarts += 1;
        AfterExit::Restart { after }
    }

    /// Restarts decided so far.
    pub(crate) fn restarts(&self) -> u64 {
        self.restarts
    }
}

/// What `/health` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Health {
    /// The backend process runs.
    pub running: bool,
    /// Its process id.
    pub pid: Option<u32>,
    /// Restarts so far.
    pub restarts: u64,
    /// Time since the backend last answered a ping, if it ever did.
    pub since_last_pong: Option<Duration>,
    /// The backend answered the ping this report waited for.
    pub answered: bool,
    /// Live sessions.
    pub sessions: usize,
    /// The `--instance` name, shown when given.
    pub instance: Option<crate::routed_id::Instance>,
    /// Key sets come from URLs and none was fetched yet: requests get 503.
    pub keys_unavailable: bool,
}

impl Health {
    /// Status code and JSON body: 200 only when the backend runs and answered the ping.
    pub(crate) fn response(&self) -> (u16, Vec<u8>) {
        let healthy = self.running && self.answered && !self.keys_unavailable;
        let status = if healthy {
            "ok"
        } else if !self.running {
            "down"
        } else if !self.answered {
            "unresponsive"
        } else {
            "unavailable"
        };
        let mut body = serde_json::json!({
            "status": status,
            "backend": {
                "running": self.running,
                "pid": self.pid,
                "restarts": self.restarts,
                "last_pong_ms": self.since_last_pong.map(|d| d.as_millis() as u64),
            },
            "sessions": self.sessions,
        });
        if let Some(instance) = &self.instance {
            body["instance"] = instance.as_str().into();
        }
        if self.keys_unavailable {
            body["auth"] = "keys unavailable".into();
        }
        (
            if healthy { 200 } else { 503 },
            body.to_string().into_bytes(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let mut s = Supervisor::new(Restart::OnFailure);
        let short = Duration::from_secs(1);
        let delays: Vec<_> = (0..8)
            .map(|_| match s.exited(Exit::Code(1), short) {
                AfterExit::Restart { after } => after.as_millis(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        assert_eq!(
            s.exited(Exit::Signal, Duration::from_secs(61)),
            AfterExit::Restart {
                after: FIRST_BACKOFF
            }
        );
        assert_eq!(
            s.exited(Exit::Code(0), short),
            AfterExit::Shutdown { status: 0 }
        );
        let mut never = Supervisor::new(Restart::Never);
        assert_eq!(
            never.exited(Exit::Code(3), short),
            AfterExit::Shutdown { status: 3 }
        );
        let mut always = Supervisor::new(Restart::Always);
        assert!(matches!(
            always.exited(Exit::Code(0), short),
            AfterExit::Restart { .. }
        ));
    }
}
