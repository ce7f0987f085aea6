//! What the hub is told at start: every setting it decides with, from the one CLI
//! definition ([`Config::settings`](crate::config::Config::settings)) or a test.

use std::time::Duration;

#[cfg(feature = "cli")]
use clap::ValueEnum;

pub(crate) use crate::oauth::tool_matches;
pub use crate::principal::KeySet;
use crate::routed_id::Instance;

/// When the supervisor restarts the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(ValueEnum))]
pub enum Restart {
    /// Restart after a non-zero exit or a signal; a clean exit (0) shuts the proxy down.
    #[default]
    OnFailure,
    /// Restart after every exit.
    Always,
    /// Never restart: the proxy exits with the backend's status.
    Never,
}

/// What a backend exit that will be restarted does to live sessions (SPEC section 12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(ValueEnum))]
pub enum OnBackendExit {
    /// Sessions stay live: requests in flight get -32603, new ones wait for the new
    /// process, which is initialized with the cached handshake and resubscribed.
    #[default]
    KeepSessions,
    /// Every session is closed; clients start again.
    CloseSessions,
}

/// Whether `/mcp` serves MCP 2026-07-28 requests (SPEC section 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(ValueEnum))]
pub enum Modern {
    /// Served beside 2025 sessions.
    #[default]
    On,
    /// Refused with 400 and a plain -32600, so dual-era clients fall back to `initialize`.
    Off,
}

/// Client lines the hub lets wait in the backend's stdin queue by default, shared fairly
/// among the sessions that have lines queued (SPEC section 12). The proxy's own lines may
/// use as much again.
pub const STDIN_QUEUE: usize = 1024;

/// Lines for the backend's stdin a shell holds at most, not yet written; the rest wait in
/// the hub, which releases them in turns across sessions as writes are reported. Twice
/// [`STDIN_REPORT_EVERY`](crate::output::STDIN_REPORT_EVERY), so that a shell that reports
/// only every that many lines always has some to write.
pub const STDIN_WINDOW: usize = 128;

/// Client requests the proxy keeps written to the backend and unanswered by default
/// (`--backend-window`, SPEC section 12).
pub const BACKEND_WINDOW: usize = 64;

/// Bytes of Streamable events the whole proxy keeps for resumption, at most.
pub const RESUME_GLOBAL: usize = 64 << 20;

/// At exit, how long answers already under way get to reach their clients.
pub const EXIT_DRAIN: Duration = Duration::from_secs(1);

/// What the hub needs from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Most live sessions.
    pub max_sessions: usize,
    /// Byte budget of each stream's queue in the shell.
    pub session_buffer: usize,
    /// How long a dropped Streamable stream's events are kept; `None`: no resumption.
    pub resume_window: Option<Duration>,
    /// Bytes of Streamable events kept per session for resumption.
    pub resume_buffer: usize,
    /// Bytes of Streamable events kept for resumption over every session
    /// ([`RESUME_GLOBAL`]; smaller in tests).
    pub resume_global: usize,
    /// Idle time after which a stream gets a keep-alive comment.
    pub keepalive: Duration,
    /// Interval of health pings.
    pub ping_interval: Duration,
    /// Silence after a ping that makes the backend unhealthy.
    pub ping_timeout: Duration,
    /// Each wait of the stop sequence.
    pub grace: Duration,
    /// When the backend is restarted.
    pub restart: Restart,
    /// Whether sessions survive a backend restart.
    pub on_backend_exit: OnBackendExit,
    /// How long a request waits for a restarting backend before 503.
    pub restart_wait: Duration,
    /// Bytes of request bodies that may wait for a restarting backend, all together.
    pub restart_buffer: usize,
    /// Client lines that may wait in the backend's stdin queue ([`STDIN_QUEUE`]).
    pub stdin_queue: usize,
    /// Lines the shell holds for stdin at most ([`STDIN_WINDOW`]).
    pub stdin_window: usize,
    /// Client requests written to the backend and not yet answered, at most
    /// (`--backend-window`, [`BACKEND_WINDOW`]): the rest wait in the fair queue.
    pub backend_window: usize,
    /// How long a Streamable request may wait for its answer (progress restarts the
    /// clock); `None` for no limit.
    pub request_timeout: Option<Duration>,
    /// How long a Streamable session may go without a request or an open stream.
    pub session_idle: Duration,
    /// Requests one Streamable session (or one principal's 2026-07-28 requests) may have
    /// in flight.
    pub max_inflight: usize,
    /// Tasks one owner may hold (SPEC section 15).
    pub max_tasks_per_owner: usize,
    /// The list cache's byte budget (`--list-cache-bytes`); `None`: `--list-cache off`.
    pub list_cache: Option<usize>,
    /// The tools an operator shows (`--tools`, `--tools-override`; SPEC section 16).
    pub tool_view: Option<std::sync::Arc<crate::tools::ToolView>>,
    /// Methods MCP does not define that are forwarded all the same (`--pass-method`).
    pub pass_methods: std::collections::BTreeSet<String>,
    /// `--modern`.
    pub modern: Modern,
    /// Prefix of the POST URL in a session's `endpoint` event (`--public-url` and
    /// `--base-path`), without a trailing slash.
    pub endpoint_prefix: String,
    /// The `--instance` name every minted session id starts with, if any.
    pub instance: Option<Instance>,
    /// The OAuth resource server (`--oauth-issuer`): its metadata and scope rules.
    pub oauth: Option<std::sync::Arc<crate::oauth::ResourceServer>>,
    /// Where key sets are fetched from (`--oauth-issuer`, `--jwt-jwks-url`).
    pub key_sources: Vec<KeySource>,
    /// Keys are configured too (a JWKS file, a secret): auth works before any fetch.
    pub configured_keys: bool,
    /// Requests per principal (`--rate-limit`).
    pub rate_limit: Option<Rate>,
    /// Calls per principal of each tool matching a pattern (`--tool-rate-limit`; a pattern
    /// may end in `*`).
    pub tool_rate_limits: Vec<(String, Rate)>,
    /// Live sessions one principal may hold, both transports together; 0 for no cap.
    pub max_sessions_per_principal: usize,
    /// The authorization policy (`--authz-config`); `None` allows everything.
    pub policy: Option<std::sync::Arc<crate::policy::Policy>>,
    /// The audit log (`--audit-log`); `None`: no audit records.
    pub audit: Option<Audit>,
    /// Traces (`--otlp-endpoint`); `None`: no span work at all.
    pub tracing: Option<crate::trace::Tracing>,
}

/// What audit records hold (SPEC section 11).
#[derive(Debug, Clone)]
pub struct Audit {
    /// `--audit-include-data`: the request and response messages too.
    pub include_data: bool,
    /// `--audit-max-data`: each message cut to this many bytes.
    pub max_data: usize,
    /// `--base-path`, for the records' endpoints.
    pub base_path: std::sync::Arc<str>,
}

/// What a reload gives the hub (SPEC section 10), read and checked whole first
/// ([`Loaded::reload`](crate::load::Loaded::reload)).
#[derive(Debug, Clone)]
pub struct Reload {
    /// Every setting anew, replacing the running ones whole (but `instance`, which needs
    /// a restart).
    pub settings: Settings,
    /// Who may still hold sessions: the sessions of anyone else end.
    pub principals: crate::auth::Principals,
    /// Flags that changed but need a restart, for the log.
    pub ignored: Vec<&'static str>,
}

/// A rate: `tokens` per `period`, refilled continuously (`N/s`, `N/min`, `N/h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Requests a full bucket allows at once.
    pub tokens: u32,
    /// The time it takes to refill.
    pub period: Duration,
}

impl std::str::FromStr for Rate {
    type Err = String;

    fn from_str(text: &str) -> Result<Rate, String> {
        let bad = || format!("{text:?} is not a rate like 60/min (N/s, N/min or N/h)");
        let (n, unit) = text.trim().split_once('/').ok_or_else(bad)?;
        let tokens: u32 = n.trim().parse().map_err(|_| bad())?;
        let period = match unit.trim() {
            "s" | "sec" => Duration::from_secs(1),
            "min" | "m" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            _ => return Err(bad()),
        };
        if tokens == 0 {
            return Err(format!("{text:?}: a rate must allow at least one request"));
        }
        Ok(Rate { tokens, period })
    }
}

/// Where a key set comes from, and whose tokens its keys verify (SPEC section 9: a token is
/// verified only with keys of the source its `iss` names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// An authorization server: its metadata names the key set (`jwks_uri`); its keys
    /// verify its own tokens only.
    Issuer(String),
    /// A key set's URL (`--jwt-jwks-url`).
    Jwks {
        /// Where it is.
        url: String,
        /// The issuer whose tokens it verifies (`Config::configured_issuer`); `None`: any
        /// issuer the claims policy accepts (no issuer is named anywhere).
        issuer: Option<String>,
    },
}

impl KeySource {
    /// The issuer whose tokens this source's keys verify (`None`: any accepted issuer).
    pub fn issuer(&self) -> Option<&str> {
        match self {
            KeySource::Issuer(issuer) => Some(issuer),
            KeySource::Jwks { issuer, .. } => issuer.as_deref(),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_sessions: 10_000,
            session_buffer: 4 << 20,
            resume_window: Some(Duration::from_secs(60)),
            resume_buffer: 1 << 20,
            resume_global: RESUME_GLOBAL,
            keepalive: Duration::from_secs(30),
            ping_interval: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(10),
            grace: Duration::from_secs(5),
            restart: Restart::OnFailure,
            on_backend_exit: OnBackendExit::KeepSessions,
            restart_wait: Duration::from_secs(10),
            restart_buffer: 64 << 20,
            stdin_queue: STDIN_QUEUE,
            stdin_window: STDIN_WINDOW,
            backend_window: BACKEND_WINDOW,
            request_timeout: Some(Duration::from_secs(300)),
            session_idle: Duration::from_secs(1800),
            max_inflight: 256,
            max_tasks_per_owner: 1000,
            pass_methods: std::collections::BTreeSet::new(),
            tool_view: None,
            list_cache: Some(8 << 20),
            modern: Modern::On,
            endpoint_prefix: String::new(),
            instance: None,
            oauth: None,
            key_sources: Vec::new(),
            configured_keys: false,
            rate_limit: None,
            tool_rate_limits: Vec::new(),
            max_sessions_per_principal: 0,
            policy: None,
            audit: None,
            tracing: None,
        }
    }
}
