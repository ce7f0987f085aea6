//! What the hub is told: its settings, and the admitted HTTP requests that are its inputs.

use std::time::Duration;

use crate::auth::Principal;
use crate::config::{OnBackendExit, Restart};
use crate::http::{Endpoint, McpHeaders};
use crate::routed_id::Instance;

/// Client lines the hub lets wait in the backend's stdin queue by default, shared fairly
/// among the sessions that have lines queued (SPEC section 12). The proxy's own lines may
/// use as much again.
pub const STDIN_QUEUE: usize = 1024;

/// At exit, how long answers already under way get to reach their clients.
pub const EXIT_DRAIN: Duration = Duration::from_secs(1);

/// What the hub needs from the command line; see [`Config::settings`](crate::config::Config::settings).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Most live sessions.
    pub max_sessions: usize,
    /// Byte budget of each stream's queue in the shell.
    pub session_buffer: usize,
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
    /// Client lines that may wait in the backend's stdin queue ([`STDIN_QUEUE`]).
    pub stdin_queue: usize,
    /// How long a Streamable request may wait for its answer (progress restarts the
    /// clock); `None` for no limit.
    pub request_timeout: Option<Duration>,
    /// How long a Streamable session may go without a request or an open stream.
    pub session_idle: Duration,
    /// Requests one Streamable session may have in flight.
    pub max_inflight: usize,
    /// Prefix of the POST URL in a session's `endpoint` event (`--public-url` and
    /// `--base-path`), without a trailing slash.
    pub endpoint_prefix: String,
    /// The `--instance` name every minted session id starts with, if any.
    pub instance: Option<Instance>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_sessions: 10_000,
            session_buffer: 4 << 20,
            keepalive: Duration::from_secs(30),
            ping_interval: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(10),
            grace: Duration::from_secs(5),
            restart: Restart::OnFailure,
            on_backend_exit: OnBackendExit::KeepSessions,
            restart_wait: Duration::from_secs(10),
            stdin_queue: STDIN_QUEUE,
            request_timeout: Some(Duration::from_secs(300)),
            session_idle: Duration::from_secs(1800),
            max_inflight: 256,
            endpoint_prefix: String::new(),
            instance: None,
        }
    }
}

/// An HTTP request the gate admitted ([`crate::http::Gate::admit`]), with its body and
/// fresh randomness for a session it may create.
#[derive(Debug, Clone)]
pub struct Request {
    /// What it asks for.
    pub endpoint: Endpoint,
    /// Who asks.
    pub principal: Principal,
    /// The session `session_id` names, as sent (empty when none), for `/messages`.
    pub session: String,
    /// The Streamable HTTP headers, for `/mcp`.
    pub mcp: McpHeaders,
    /// The browser origin to answer with CORS headers, when present and allowed.
    pub cors: Option<String>,
    /// The body as far as the shell read it.
    pub body: Payload,
    /// 16 random bytes from the OS, for the id of a session this request may create.
    pub entropy: [u8; 16],
}

/// A request body as the shell read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// The whole body (empty for none).
    Bytes(Vec<u8>),
    /// Longer than `--max-body`; the rest was not read.
    TooLarge,
}

/// What [`Hub::table_sizes`](super::Hub::table_sizes) counts (for tests).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableSizes {
    /// Streams open (legacy, GET and request streams).
    pub streams: usize,
    /// Streamable requests in flight.
    pub in_flight: usize,
    /// Progress tokens of requests in flight (one per request carrying one).
    pub progress_tokens: usize,
    /// Request timeout timers.
    pub request_timers: usize,
    /// Idle expiry timers.
    pub idle_timers: usize,
    /// Subscriptions, as (session, uri) pairs in the per-session and the per-uri sets.
    pub subscriptions: (usize, usize),
}
