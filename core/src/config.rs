//! Every flag of both binaries, defined once. With the `cli` feature the same struct is
//! parsed by clap, so `--help` is written once for both shells.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

#[cfg(feature = "cli")]
use clap::{Parser, ValueEnum};

use crate::auth::{Auth, TokenTable};
use crate::http::{Gate, OriginPolicy};
use crate::routed_id::Instance;
pub use crate::settings::{Modern, OnBackendExit, Restart};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(ValueEnum))]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Switchboard: one shared stdio MCP server behind Streamable HTTP (/mcp) and HTTP+SSE (/sse)
/// for many isolated clients.
///
/// Every client request id is rewritten to carry its session before it reaches the backend,
/// so each reply returns to exactly the session that asked; whatever cannot be attributed
/// is dropped or answered by the proxy, never broadcast. Without a command, a built-in demo
/// MCP server is started.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(Parser))]
#[cfg_attr(
    feature = "cli",
    command(
        version,
        after_help = "Examples:\n  switchboard                                  # the built-in demo backend on http://127.0.0.1:8000/sse\n  switchboard --port 9000 -- uvx mcp-server-time\n  switchboard --host 0.0.0.0 --auth-tokens tokens.txt -- ./my-mcp-server --flag"
    )
)]
pub struct Config {
    /// Flags from a TOML file too: each key a long flag without `--` (`auth-tokens =
    /// "tokens.txt"`, `rate-limit = "60/min"`, a repeatable flag an array, a switch true or
    /// false). Flags on the command line win; a relative path in the file is taken from the
    /// file's folder. SIGHUP reads it and the files it names again; what needs a restart
    /// (the listen address, --instance, the backend, --env, --max-line, logging) is ignored.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub config: Option<std::path::PathBuf>,

    /// Address to listen on (default 127.0.0.1:8000). Binding off loopback needs an auth
    /// mode other than none, or --allow-unauthenticated.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_name = "ADDR", conflicts_with_all = ["host", "port"])
    )]
    pub listen: Option<SocketAddr>,

    /// Interface to listen on, as an IP address or `localhost` (default 127.0.0.1); the
    /// same as the host part of --listen.
    #[cfg_attr(feature = "cli", arg(long, value_name = "HOST", value_parser = parse_host))]
    pub host: Option<IpAddr>,

    /// Port to listen on (default 8000; 0 picks a free one); the same as the port part of
    /// --listen.
    #[cfg_attr(feature = "cli", arg(long, value_name = "PORT"))]
    pub port: Option<u16>,

    /// Serve under this path prefix (e.g. /mcp-proxy): /sse becomes /mcp-proxy/sse.
    #[cfg_attr(feature = "cli", arg(long, default_value = "", value_name = "PATH"))]
    pub base_path: String,

    /// Absolute URL clients reach the proxy at; the endpoint event then carries an absolute
    /// POST URL (e.g. https://mcp.example.com).
    #[cfg_attr(feature = "cli", arg(long, value_name = "URL"))]
    pub public_url: Option<String>,

    /// Name of this instance when several run behind one load balancer (1 to 32 of a-z,
    /// 0-9, -): every session id it mints starts with `NAME.`, so the balancer routes a
    /// session's requests by its id alone.
    #[cfg_attr(feature = "cli", arg(long, value_name = "NAME"))]
    pub instance: Option<String>,

    /// Static bearer tokens: a file of `principal token` lines. Sessions belong to the
    /// principal whose token opened them.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub auth_tokens: Option<std::path::PathBuf>,

    /// JWT bearer auth: a JWKS file of verification keys (RSA, EC P-256, Ed25519), chosen
    /// by the token's `kid`. Sessions belong to the token's issuer + subject.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub jwt_jwks: Option<std::path::PathBuf>,

    /// JWT bearer auth with an HS256 shared secret read from FILE (at least 32 bytes).
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub jwt_secret_file: Option<std::path::PathBuf>,

    /// The issuer whose tokens the keys of --jwt-jwks, --jwt-secret-file and
    /// --jwt-jwks-url verify: alone, the only accepted JWT `iss`; beside --oauth-issuer,
    /// one more accepted issuer (needed with those keys beside several --oauth-issuer:
    /// each issuer's tokens are verified with its own keys only).
    #[cfg_attr(feature = "cli", arg(long, value_name = "ISSUER"))]
    pub jwt_issuer: Option<String>,

    /// Accepted JWT `aud` (repeatable); when given, a token must name one of them.
    #[cfg_attr(feature = "cli", arg(long = "jwt-audience", value_name = "AUDIENCE"))]
    pub jwt_audiences: Vec<String>,

    /// Clock skew allowed on JWT `exp` and `nbf`.
    #[cfg_attr(feature = "cli", arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION"))]
    pub jwt_leeway: Duration,

    /// A trusted OAuth authorization server (repeatable; with --jwt-jwks): clients discover
    /// it from this proxy's protected resource metadata (RFC 9728) and sign users in there;
    /// tokens must be issued by one of them, and are verified with that issuer's keys only.
    #[cfg_attr(feature = "cli", arg(long = "oauth-issuer", value_name = "URL"))]
    pub oauth_issuers: Vec<String>,

    /// JWT bearer auth with the key set at this URL (https, or http to 127.0.0.0/8, [::1]
    /// or localhost; no user@ part), fetched
    /// and refreshed by the proxy (`Cache-Control: max-age`; an unknown kid refetches it).
    #[cfg_attr(feature = "cli", arg(long = "jwt-jwks-url", value_name = "URL"))]
    pub jwt_jwks_url: Option<String>,

    /// This proxy's canonical resource URI, which tokens' `aud` must name (default:
    /// --public-url with --base-path, else http://<listen address><base-path>).
    #[cfg_attr(feature = "cli", arg(long, value_name = "URL"))]
    pub resource: Option<String>,

    /// `resource_name` in the protected resource metadata.
    #[cfg_attr(
        feature = "cli",
        arg(long, default_value = "Switchboard", value_name = "NAME")
    )]
    pub resource_name: String,

    /// Scopes offered in the protected resource metadata, space-separated (repeatable).
    #[cfg_attr(feature = "cli", arg(long = "oauth-scopes", value_name = "SCOPES"))]
    pub oauth_scopes: Vec<String>,

    /// A scope every request needs (repeatable): without it, 403 insufficient_scope with
    /// the scopes to ask for.
    #[cfg_attr(feature = "cli", arg(long = "required-scope", value_name = "SCOPE"))]
    pub required_scopes: Vec<String>,

    /// A scope a `tools/call` of TOOL needs, TOOL=SCOPE (repeatable; TOOL may end in `*`;
    /// with --oauth-issuer): without it, 403 insufficient_scope, and the tool is left out
    /// of that token's tools/list.
    #[cfg_attr(feature = "cli", arg(long = "tool-scope", value_name = "TOOL=SCOPE", value_parser = parse_tool_scope))]
    pub tool_scopes: Vec<(String, String)>,

    /// Requests one principal may make, as N/s, N/min or N/h (a bucket of N refilled
    /// continuously); past it 429 with Retry-After.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N/PERIOD", value_parser = parse_rate))]
    pub rate_limit: Option<crate::settings::Rate>,

    /// Calls one principal may make of a tool, TOOL=N/PERIOD (repeatable; TOOL may end in
    /// `*`); past it 429 with Retry-After.
    #[cfg_attr(feature = "cli", arg(long = "tool-rate-limit", value_name = "TOOL=N/PERIOD", value_parser = parse_tool_rate))]
    pub tool_rate_limits: Vec<(String, crate::settings::Rate)>,

    /// Live sessions one principal may hold, both transports together (default 1000 with an
    /// auth mode on, else none; 0: no cap); past it 429 for new sessions.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub max_sessions_per_principal: Option<usize>,

    /// Authorization policy: a Cedar policy file in ToolHive's format (JSON or YAML). A
    /// request no policy permits gets JSON-RPC error -32003 and never reaches the backend;
    /// tools/list, prompts/list and resources/list show only what the caller may use.
    /// Without it, everything is allowed.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub authz_config: Option<std::path::PathBuf>,

    /// Audit log: one JSON event per line (ToolHive's AuditEvent shape) for every MCP
    /// request, refusal, session open and close, auth failure and backend restart, to FILE
    /// (appended) or `-` for standard output.
    #[cfg_attr(feature = "cli", arg(long, value_name = "PATH|-"))]
    pub audit_log: Option<String>,

    /// Put each request and response message in its audit event (`data`), cut to
    /// --audit-max-data.
    #[cfg_attr(feature = "cli", arg(long, requires = "audit_log"))]
    pub audit_include_data: bool,

    /// Most bytes of each message in an audit event's `data` (cut on a UTF-8 boundary,
    /// `truncated: true`).
    #[cfg_attr(feature = "cli", arg(long, default_value = "4KiB", value_name = "SIZE", value_parser = parse_size))]
    pub audit_max_data: usize,

    /// Bytes of audit events that may wait for the audit log's writer (a slow or stalled
    /// sink); events that do not fit are dropped and counted
    /// (switchboard_audit_dropped_total). At shutdown the writer gets --grace to write
    /// out what waits; then the proxy exits anyway.
    #[cfg_attr(feature = "cli", arg(long, default_value = "16MiB", value_name = "SIZE", value_parser = parse_size))]
    pub audit_buffer: usize,

    /// OpenTelemetry: export spans and the MCP histograms over OTLP/HTTP protobuf to this
    /// base URL (spans to URL/v1/traces, metrics to URL/v1/metrics). Off when absent.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_name = "URL", env = "OTEL_EXPORTER_OTLP_ENDPOINT")
    )]
    pub otlp_endpoint: Option<String>,

    /// Which spans are sampled (OpenTelemetry's names: always_on, always_off,
    /// traceidratio, parentbased_always_on, parentbased_always_off,
    /// parentbased_traceidratio).
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            hide = true,
            value_name = "NAME",
            env = "OTEL_TRACES_SAMPLER",
            default_value = "parentbased_always_on"
        )
    )]
    pub otel_traces_sampler: String,

    /// The sampler's argument: the ratio of a traceidratio sampler, in [0, 1].
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            hide = true,
            value_name = "RATIO",
            env = "OTEL_TRACES_SAMPLER_ARG"
        )
    )]
    pub otel_traces_sampler_arg: Option<String>,

    /// Bytes of each span attribute value and span name taken from a request (tool, prompt
    /// and method names, URIs, request ids), cut at a character boundary.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            hide = true,
            value_name = "BYTES",
            env = "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
            default_value_t = crate::trace::VALUE_LIMIT
        )
    )]
    pub otel_attribute_value_length_limit: usize,

    /// A proxy whose X-Forwarded-For names the client, as an address or CIDR block
    /// (repeatable): the audit log's client address is then the rightmost address in that
    /// header that is not itself a trusted proxy. Without it, the peer's address.
    #[cfg_attr(feature = "cli", arg(long = "trusted-proxy", value_name = "CIDR", value_parser = parse_cidr))]
    pub trusted_proxies: Vec<crate::audit::Cidr>,

    /// Allow a non-loopback --listen address without authentication.
    #[cfg_attr(feature = "cli", arg(long))]
    pub allow_unauthenticated: bool,

    /// Require authentication for /metrics too.
    #[cfg_attr(feature = "cli", arg(long))]
    pub metrics_auth: bool,

    /// Also allow this browser Origin (repeatable). Loopback origins are always allowed.
    #[cfg_attr(feature = "cli", arg(long = "allow-origin", value_name = "ORIGIN"))]
    pub allow_origins: Vec<String>,

    /// Also allow this Host header value, without port (repeatable). On a loopback bind
    /// only loopback hosts are allowed by default; elsewhere Host is checked only if given.
    #[cfg_attr(feature = "cli", arg(long = "allow-host", value_name = "HOST"))]
    pub allow_hosts: Vec<String>,

    /// Most live sessions, both transports together; more get 503. The blocking binary
    /// caps it at what the host's threads and descriptors allow (a thread and three
    /// descriptors per session) and logs that budget at start.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10_000, value_name = "N"))]
    pub max_sessions: usize,

    /// Largest POST body (e.g. 8MiB, 64KiB, 1000000); larger ones get 413.
    #[cfg_attr(feature = "cli", arg(long, default_value = "8MiB", value_parser = parse_size, value_name = "SIZE"))]
    pub max_body: usize,

    /// Longest backend stdout line; longer lines are dropped.
    #[cfg_attr(feature = "cli", arg(long, default_value = "8MiB", value_parser = parse_size, value_name = "SIZE"))]
    pub max_line: usize,

    /// How long a dropped Streamable stream's events are kept for the client to resume it
    /// with Last-Event-ID (0: no resumption).
    #[cfg_attr(feature = "cli", arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION"))]
    pub resume_window: Duration,

    /// Bytes of recent Streamable events kept per session for resumption (the oldest go
    /// first; the whole proxy keeps at most 64 MiB).
    #[cfg_attr(feature = "cli", arg(long, default_value = "1MiB", value_parser = parse_size, value_name = "SIZE"))]
    pub resume_buffer: usize,

    /// Bytes one session's stream may have queued; a client that falls further behind is
    /// disconnected (never thinned, never allowed to stall others).
    #[cfg_attr(feature = "cli", arg(long, default_value = "4MiB", value_parser = parse_size, value_name = "SIZE"))]
    pub session_buffer: usize,

    /// How long a Streamable HTTP request may wait for its answer before the client gets
    /// -32001 and the backend a cancellation; each progress notification restarts the
    /// clock. 0 means no limit.
    #[cfg_attr(feature = "cli", arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION"))]
    pub request_timeout: Duration,

    /// A Streamable HTTP session with no request and no open stream for this long ends
    /// (its client starts a new one with initialize).
    #[cfg_attr(feature = "cli", arg(long, default_value = "30m", value_parser = parse_duration, value_name = "DURATION"))]
    pub session_idle: Duration,

    /// Client requests written to the backend and not yet answered, at most; the rest wait
    /// in the proxy's fair queue (one share per session), not in the backend's stdin pipe,
    /// so one client's flood delays another's call by at most this many requests. A request
    /// leaves the window when answered, cancelled, timed out (--request-timeout) or when its
    /// session ends.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = crate::settings::BACKEND_WINDOW, value_name = "N"))]
    pub backend_window: usize,

    /// Requests one Streamable HTTP session (and, with --audit-log, one legacy session) may
    /// have in flight; more get 429.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 256, value_name = "N"))]
    pub max_inflight: usize,

    /// Tasks (MCP 2025-11-25) one owner may hold: a session, or one principal's
    /// 2026-07-28 requests. Past it the oldest is forgotten: its id then answers
    /// "Task not found", as every task of another owner does.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1000, value_name = "N"))]
    pub max_tasks_per_owner: usize,

    /// Forward this method although MCP does not define it (repeatable; a request or a
    /// client notification). Name only methods that keep no state across requests beyond
    /// their id: the backend has one session for every client. Others get -32601.
    #[cfg_attr(feature = "cli", arg(long = "pass-method", value_name = "METHOD"))]
    pub pass_methods: Vec<String>,

    /// Show only this tool (repeatable; a shown name, after --tools-override): every
    /// other tool is left out of tools/list and a call of it is answered "Unknown tool"
    /// by the proxy. ToolHive's `thv run --tools`.
    #[cfg_attr(feature = "cli", arg(long = "tools", value_name = "NAME"))]
    pub tools: Vec<String>,

    /// Rename and redescribe tools: ToolHive's JSON file
    /// `{"toolsOverride": {"<backend name>": {"name": "...", "description": "..."}}}`.
    /// Clients see and call the new names; the backend's names stay for policies, scopes
    /// and rate limits, and are not callable.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub tools_override: Option<std::path::PathBuf>,

    /// How long a request head may take to arrive (on a new connection, or an idle one
    /// after its last answer); the connection is then closed.
    #[cfg_attr(feature = "cli", arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION"))]
    pub header_timeout: Duration,

    /// Requests one connection may pipeline behind unread answers; the next is refused
    /// with 503 and the connection closed.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 32, value_name = "N"))]
    pub max_pipelined: usize,

    /// Threads running `switchboard`'s event loop. 1 (the default) runs the hub, every
    /// connection and the backend's pipes on one thread: with the backend on the other
    /// core, more workers only add cross-thread wake-ups (tests/BENCHMARKS.md). Large
    /// bodies are still parsed, and spans exported, off the loop. `switchboard-blocking`
    /// ignores it (a thread per connection).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1, value_name = "N"))]
    pub workers: usize,

    /// Interval of `: keep-alive` comments on idle streams.
    #[cfg_attr(feature = "cli", arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION"))]
    pub keepalive: Duration,

    /// Environment variable for the backend, on top of the inherited ones (repeatable).
    #[cfg_attr(feature = "cli", arg(long = "env", value_name = "K=V", value_parser = parse_env))]
    pub env: Vec<(String, String)>,

    /// When to restart the backend after it exits.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Restart::OnFailure))]
    pub restart: Restart,

    /// What a backend crash does to live sessions: keep-sessions (they survive the restart)
    /// or close-sessions (clients start again).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = OnBackendExit::KeepSessions))]
    pub on_backend_exit: OnBackendExit,

    /// Serve MCP 2026-07-28 clients on /mcp beside 2025 sessions (on), or refuse them with
    /// 400 -32600 so that dual-era clients fall back to initialize (off).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Modern::On))]
    pub modern: Modern,

    /// Keep the backend's tools/list, prompts/list and resources/list results (by cursor)
    /// and answer every caller from them until the backend says the list changed (on), or
    /// forward every list request (off). Only kinds the backend declared listChanged for.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = Modern::On))]
    pub list_cache: Modern,

    /// Bytes of list results the list cache keeps (the least recently used go first).
    #[cfg_attr(feature = "cli", arg(long, default_value = "8MiB", value_parser = parse_size, value_name = "SIZE"))]
    pub list_cache_bytes: usize,

    /// How long a request waits for a restarting backend before 503.
    #[cfg_attr(feature = "cli", arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION"))]
    pub restart_wait: Duration,

    /// Bytes of request bodies that may wait, all together, for a restarting backend
    /// (--restart-wait); a request that does not fit gets 503 at once. A request whose
    /// client hangs up stops waiting and frees its room.
    #[cfg_attr(feature = "cli", arg(long, default_value = "64MiB", value_parser = parse_size, value_name = "SIZE"))]
    pub restart_buffer: usize,

    /// Interval of health pings to the backend.
    #[cfg_attr(feature = "cli", arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION"))]
    pub ping_interval: Duration,

    /// A backend silent this long after a ping is reported unhealthy (it is not killed).
    #[cfg_attr(feature = "cli", arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION"))]
    pub ping_timeout: Duration,

    /// On shutdown, time the backend gets after its stdin closes before SIGTERM, and again
    /// before SIGKILL.
    #[cfg_attr(feature = "cli", arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION"))]
    pub grace: Duration,

    /// Log filter when RUST_LOG is unset (error, warn, info, debug, trace).
    #[cfg_attr(
        feature = "cli",
        arg(long, default_value = "info", value_name = "LEVEL")
    )]
    pub log_level: String,

    /// Log line format.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = LogFormat::Text))]
    pub log_format: LogFormat,

    /// Run as the built-in demo MCP server on stdio (used by the proxy itself).
    #[cfg_attr(feature = "cli", arg(long, hide = true))]
    pub demo_backend: bool,

    /// The stdio MCP server to run, after `--`. Omit it to run the built-in demo server.
    #[cfg_attr(feature = "cli", arg(last = true, value_name = "CMD"))]
    pub command: Vec<String>,
}

/// Sizes: a number of bytes with an optional `KiB`, `MiB`, `GiB` (or `K`, `M`, `G`) suffix.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: usize = digits
        .parse()
        .map_err(|_| format!("not a size: {text:?}"))?;
    let scale: usize = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" | "kb" | "KB" => 1 << 10,
        "M" | "MiB" | "MB" | "m" => 1 << 20,
        "G" | "GiB" | "GB" | "g" => 1 << 30,
        _ => {
            return Err(format!(
                "unknown size unit in {text:?} (use KiB, MiB or GiB)"
            ))
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("size too large: {text:?}"))
}

/// Durations: a number with `ms`, `s`, `m` or `h` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("not a duration: {text:?}"))?;
    Ok(match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => {
            return Err(format!(
                "unknown duration unit in {text:?} (use ms, s, m or h)"
            ))
        }
    })
}

/// `--host`: an IP address, or `localhost` for 127.0.0.1.
pub fn parse_host(text: &str) -> Result<IpAddr, String> {
    if text.eq_ignore_ascii_case("localhost") {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    bare.parse()
        .map_err(|_| format!("not an IP address or `localhost`: {text:?}"))
}

/// `K=V` for `--env`.
pub fn parse_env(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected K=V, got {text:?}")),
    }
}

/// A flag whose value the proxy refuses to run with; printed as `invalid value for
/// --flag: problem` and exit status 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The flag, dashes included.
    pub flag: &'static str,
    /// What is wrong with its value.
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid value for {}: {}", self.flag, self.problem)
    }
}

impl std::error::Error for ConfigError {}

/// Connections the kernel holds for the listening socket before the proxy accepts them
/// (capped by `net.core.somaxconn`): a burst of clients waits instead of retrying a second
/// later.
pub const LISTEN_BACKLOG: u32 = 1024;

/// The default listen address.
pub(crate) const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8000);

const MS: Duration = Duration::from_millis(1);
const HOUR: Duration = Duration::from_secs(3600);
const KIB: usize = 1 << 10;
const GIB: usize = 1 << 30;

impl Config {
    /// Refuses values no deployment means: zero or absurd durations and sizes.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.request_timeout.is_zero()
            && !(100 * MS..=24 * HOUR).contains(&self.request_timeout)
        {
            return Err(ConfigError {
                flag: "--request-timeout",
                problem: format!(
                    "{} is out of range (0 for no limit, or 100ms to 86400s)",
                    show_duration(self.request_timeout)
                ),
            });
        }
        self.validate_durations()?;
        self.validate_sizes()?;
        self.validate_counts()?;
        self.validate_key_sources()?;
        if !self.tool_scopes.is_empty() && self.oauth_issuers.is_empty() {
            return Err(ConfigError {
                flag: "--tool-scope",
                problem: "needs --oauth-issuer (scopes come with its tokens)".to_owned(),
            });
        }
        if let Some(name) = &self.instance {
            Instance::new(name).map_err(|problem| ConfigError {
                flag: "--instance",
                problem,
            })?;
        }
        if !self.base_path.is_empty() && !self.base_path.starts_with('/') {
            return Err(ConfigError {
                flag: "--base-path",
                problem: format!("{:?} must start with /", self.base_path),
            });
        }
        Ok(())
    }

    fn validate_durations(&self) -> Result<(), ConfigError> {
        let durations: [(&'static str, Duration, Duration, Duration); 9] = [
            ("--restart-wait", self.restart_wait, 10 * MS, HOUR),
            ("--resume-window", self.resume_window, Duration::ZERO, HOUR),
            ("--keepalive", self.keepalive, 100 * MS, HOUR),
            ("--header-timeout", self.header_timeout, 100 * MS, HOUR),
            ("--ping-interval", self.ping_interval, 100 * MS, 24 * HOUR),
            ("--ping-timeout", self.ping_timeout, 10 * MS, HOUR),
            ("--grace", self.grace, 10 * MS, HOUR),
            ("--jwt-leeway", self.jwt_leeway, Duration::ZERO, HOUR),
            ("--session-idle", self.session_idle, 100 * MS, 7 * 24 * HOUR),
        ];
        for (flag, value, min, max) in durations {
            if value < min || value > max {
                return Err(ConfigError {
                    flag,
                    problem: format!(
                        "{} is out of range ({} to {})",
                        show_duration(value),
                        show_duration(min),
                        show_duration(max)
                    ),
                });
            }
        }
        Ok(())
    }

    fn validate_sizes(&self) -> Result<(), ConfigError> {
        let sizes: [(&'static str, usize); 7] = [
            ("--resume-buffer", self.resume_buffer),
            ("--list-cache-bytes", self.list_cache_bytes),
            ("--restart-buffer", self.restart_buffer),
            ("--audit-buffer", self.audit_buffer),
            ("--max-body", self.max_body),
            ("--max-line", self.max_line),
            ("--session-buffer", self.session_buffer),
        ];
        for (flag, value) in sizes {
            if !(KIB..=GIB).contains(&value) {
                return Err(ConfigError {
                    flag,
                    problem: format!("{value} bytes is out of range (1KiB to 1GiB)"),
                });
            }
        }
        Ok(())
    }

    fn validate_counts(&self) -> Result<(), ConfigError> {
        if !(1..=1_000_000).contains(&self.max_tasks_per_owner) {
            return Err(ConfigError {
                flag: "--max-tasks-per-owner",
                problem: format!(
                    "{} is out of range (1 to 1000000)",
                    self.max_tasks_per_owner
                ),
            });
        }
        if !(1..=65_536).contains(&self.max_inflight) {
            return Err(ConfigError {
                flag: "--max-inflight",
                problem: format!("{} is out of range (1 to 65536)", self.max_inflight),
            });
        }
        if !(1..=65_536).contains(&self.backend_window) {
            return Err(ConfigError {
                flag: "--backend-window",
                problem: format!("{} is out of range (1 to 65536)", self.backend_window),
            });
        }
        if !(1..=256).contains(&self.workers) {
            return Err(ConfigError {
                flag: "--workers",
                problem: format!("{} is out of range (1 to 256)", self.workers),
            });
        }
        if !(1..=65_536).contains(&self.max_pipelined) {
            return Err(ConfigError {
                flag: "--max-pipelined",
                problem: format!("{} is out of range (1 to 65536)", self.max_pipelined),
            });
        }
        if !(1..=1_000_000).contains(&self.max_sessions) {
            return Err(ConfigError {
                flag: "--max-sessions",
                problem: format!("{} is out of range (1 to 1000000)", self.max_sessions),
            });
        }
        Ok(())
    }

    /// Key set URLs are https (or http to a loopback host), and keys given beside several
    /// `--oauth-issuer`s say whose tokens they verify (SPEC section 9).
    fn validate_key_sources(&self) -> Result<(), ConfigError> {
        let urls = self.oauth_issuers.iter().map(|u| ("--oauth-issuer", u));
        for (flag, url) in urls.chain(self.jwt_jwks_url.iter().map(|u| ("--jwt-jwks-url", u))) {
            if let Err(why) = crate::oauth::check_fetchable(url) {
                let problem = format!("{url} {why}");
                return Err(ConfigError { flag, problem });
            }
        }
        let configured_keys = self.jwt_jwks.is_some()
            || self.jwt_secret_file.is_some()
            || self.jwt_jwks_url.is_some();
        if configured_keys && self.oauth_issuers.len() > 1 && self.jwt_issuer.is_none() {
            return Err(ConfigError {
                flag: "--jwt-issuer",
                problem: "--jwt-jwks, --jwt-secret-file or --jwt-jwks-url beside several --oauth-issuer needs --jwt-issuer, the issuer whose tokens those keys verify (each --oauth-issuer's tokens are verified with its own key set only)".to_owned(),
            });
        }
        Ok(())
    }

    /// The address to listen on: --listen, or --host and --port, or the default.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen.unwrap_or_else(|| {
            SocketAddr::new(
                self.host.unwrap_or(DEFAULT_LISTEN.ip()),
                self.port.unwrap_or(DEFAULT_LISTEN.port()),
            )
        })
    }

    /// The path prefix without a trailing slash (`""` or `/prefix`).
    pub fn base_path(&self) -> &str {
        self.base_path.trim_end_matches('/')
    }

    /// The start-up line both binaries log once bound to `addr`: where each transport is
    /// served, the instance name, and the backend `command`.
    pub fn listening_line(&self, addr: impl std::fmt::Display, command: &[String]) -> String {
        let base = self.base_path();
        let instance = self
            .instance
            .as_deref()
            .map(|name| format!(" as instance {name}"))
            .unwrap_or_default();
        format!(
            "listening on http://{addr}{base} (Streamable HTTP: {base}/mcp, HTTP+SSE: {base}/sse){instance} (backend: {})",
            command.join(" ")
        )
    }

    /// What an operator should know about these flags, each logged once at start as a
    /// warning by both binaries: with a policy and tokens of several issuers, Cedar's
    /// principal is `Client::"<sub>"` whatever the issuer (SPEC section 10).
    pub fn start_warnings(&self) -> Vec<String> {
        let jwt = self.jwt_jwks.is_some()
            || self.jwt_secret_file.is_some()
            || !self.key_sources().is_empty();
        let issuers = match (&self.jwt_issuer, self.oauth_issuers.as_slice()) {
            (Some(_), _) | (None, [_]) => None,
            (None, []) => {
                Some("any issuer (no --jwt-issuer or --oauth-issuer names one)".to_owned())
            }
            (None, several) => Some(format!("several issuers ({})", several.join(", "))),
        };
        let (Some(issuers), true, Some(_)) = (issuers, jwt, &self.authz_config) else {
            return Vec::new();
        };
        vec![format!(
            "--authz-config: tokens of {issuers} are accepted, and the policy sees every caller as Client::\"<sub>\" whatever its issuer, so the same sub at two issuers is one principal to Cedar; tell them apart with the claim_iss attribute (e.g. `when {{ principal.claim_iss == \"https://idp.example\" }}`)"
        )]
    }

    /// The `--instance` name, once [`Config::validate`] accepted it.
    pub fn instance(&self) -> Option<Instance> {
        self.instance
            .as_deref()
            .and_then(|name| Instance::new(name).ok())
    }

    /// The HTTP/1.1 framing bounds both shells hold connections to.
    pub fn framing(&self) -> crate::framing::Limits {
        crate::framing::Limits {
            header_timeout: self.header_timeout,
            max_pipelined: self.max_pipelined,
            ..crate::framing::Limits::default()
        }
    }

    /// What the hub needs of these flags.
    pub fn settings(&self) -> crate::settings::Settings {
        let base = self
            .public_url
            .as_deref()
            .unwrap_or("")
            .trim_end_matches('/');
        crate::settings::Settings {
            max_sessions: self.max_sessions,
            session_buffer: self.session_buffer,
            resume_window: (!self.resume_window.is_zero()).then_some(self.resume_window),
            resume_buffer: self.resume_buffer,
            resume_global: crate::settings::RESUME_GLOBAL,
            keepalive: self.keepalive,
            ping_interval: self.ping_interval,
            ping_timeout: self.ping_timeout,
            grace: self.grace,
            restart: self.restart,
            stdin_queue: crate::settings::STDIN_QUEUE,
            stdin_window: crate::settings::STDIN_WINDOW,
            backend_window: self.backend_window,
            request_timeout: (!self.request_timeout.is_zero()).then_some(self.request_timeout),
            on_backend_exit: self.on_backend_exit,
            oauth: self.resource_server().map(std::sync::Arc::new),
            restart_wait: self.restart_wait,
            restart_buffer: self.restart_buffer,
            session_idle: self.session_idle,
            max_inflight: self.max_inflight,
            max_tasks_per_owner: self.max_tasks_per_owner,
            pass_methods: self.pass_methods.iter().cloned().collect(),
            tool_view: None,
            list_cache: (self.list_cache == Modern::On).then_some(self.list_cache_bytes),
            modern: self.modern,
            endpoint_prefix: format!("{base}{}", self.base_path()),
            instance: self.instance(),
            key_sources: self.key_sources(),
            configured_keys: self.jwt_jwks.is_some() || self.jwt_secret_file.is_some(),
            rate_limit: self.rate_limit,
            tool_rate_limits: self.tool_rate_limits.clone(),
            policy: None,
            audit: self.audit(),
            tracing: self.tracing().ok().flatten(),
            max_sessions_per_principal: self.max_sessions_per_principal.unwrap_or(
                if self.auth_tokens.is_some()
                    || self.jwt_jwks.is_some()
                    || self.jwt_secret_file.is_some()
                    || !self.key_sources().is_empty()
                {
                    1000
                } else {
                    0
                },
            ),
        }
    }

    /// [`Config::settings`] with the files they name read by `read` and checked in full:
    /// the `--authz-config` policy.
    pub(crate) fn settings_with(
        &self,
        mut read: impl FnMut(&std::path::Path) -> std::io::Result<String>,
    ) -> Result<crate::settings::Settings, String> {
        let policy = match &self.authz_config {
            Some(path) => {
                let text = read(path)
                    .map_err(|e| format!("cannot read --authz-config {}: {e}", path.display()))?;
                let policy = crate::policy::Policy::parse(&text)
                    .map_err(|e| format!("--authz-config {}: {e}", path.display()))?;
                Some(std::sync::Arc::new(policy))
            }
            None => None,
        };
        let overrides = match &self.tools_override {
            Some(path) => Some(
                read(path)
                    .map_err(|e| format!("cannot read --tools-override {}: {e}", path.display()))?,
            ),
            None => None,
        };
        let tool_view = crate::tools::ToolView::new(&self.tools, overrides.as_deref()).map_err(
            |e| match &self.tools_override {
                Some(path) => format!("--tools-override {}: {e}", path.display()),
                None => format!("--tools: {e}"),
            },
        )?;
        Ok(crate::settings::Settings {
            policy,
            tool_view: tool_view.map(std::sync::Arc::new),
            tracing: self.tracing()?,
            ..self.settings()
        })
    }

    /// What the hub decides spans with, when `--otlp-endpoint` is given; an unknown sampler
    /// is refused at load.
    pub fn tracing(&self) -> Result<Option<crate::trace::Tracing>, String> {
        if self.otlp_endpoint.is_none() {
            return Ok(None);
        }
        let name = match self.otel_traces_sampler.as_str() {
            "" => "parentbased_always_on",
            name => name,
        };
        let sampler = crate::trace::Sampler::parse(name, self.otel_traces_sampler_arg.as_deref())?;
        Ok(Some(crate::trace::Tracing {
            sampler,
            value_limit: self.otel_attribute_value_length_limit,
        }))
    }

    /// What audit records hold, when `--audit-log` is given.
    pub(crate) fn audit(&self) -> Option<crate::settings::Audit> {
        self.audit_log.as_ref()?;
        Some(crate::settings::Audit {
            include_data: self.audit_include_data,
            max_data: self.audit_max_data,
            base_path: std::sync::Arc::from(self.base_path()),
        })
    }

    /// Where key sets are fetched from: each `--oauth-issuer`'s metadata (for its own
    /// tokens), `--jwt-jwks-url` (for those of `Config::configured_issuer`).
    pub fn key_sources(&self) -> Vec<crate::settings::KeySource> {
        use crate::settings::KeySource;
        let issuers = self.oauth_issuers.iter().cloned().map(KeySource::Issuer);
        let urls = self.jwt_jwks_url.iter().map(|url| KeySource::Jwks {
            url: url.clone(),
            issuer: self.configured_issuer(),
        });
        issuers.chain(urls).collect()
    }

    /// Whose tokens the keys given by `--jwt-jwks`, `--jwt-secret-file` and
    /// `--jwt-jwks-url` verify: `--jwt-issuer`, else the one `--oauth-issuer`, else (no
    /// issuer named) any. Beside several `--oauth-issuer`s [`Config::validate`] asks for
    /// `--jwt-issuer`, so those keys never sign for an issuer that has keys of its own.
    pub(crate) fn configured_issuer(&self) -> Option<String> {
        match (&self.jwt_issuer, self.oauth_issuers.as_slice()) {
            (Some(issuer), _) => Some(issuer.clone()),
            (None, [only]) => Some(only.clone()),
            (None, _) => None,
        }
    }

    #[cfg(feature = "jwt")]
    fn jwt_auth(
        &self,
        read: &mut impl FnMut(&str, &std::path::Path) -> Result<String, String>,
    ) -> Result<Auth, String> {
        let jwks = match &self.jwt_jwks {
            Some(path) => Some(read("--jwt-jwks", path)?),
            None => None,
        };
        let secret = match &self.jwt_secret_file {
            Some(path) => Some(read("--jwt-secret-file", path)?),
            None => None,
        };
        // With OAuth on, tokens are for this resource and from a trusted issuer, unless
        // --jwt-audience says which audiences instead.
        let audiences = match (&self.resource_server(), self.jwt_audiences.is_empty()) {
            (Some(oauth), true) => oauth.audiences(),
            _ => self.jwt_audiences.clone(),
        };
        let policy = crate::jwt::ClaimsPolicy {
            issuer: self.jwt_issuer.clone(),
            issuers: self.oauth_issuers.clone(),
            audiences,
            leeway: self.jwt_leeway.as_secs(),
        };
        let secret = secret.map(String::into_bytes);
        let keys = crate::jwt::KeyStore::new(jwks, secret, self.configured_issuer(), policy)?;
        Ok(Auth::Jwt(std::sync::Arc::new(keys)))
    }

    #[cfg(not(feature = "jwt"))]
    fn jwt_auth(
        &self,
        _read: &mut impl FnMut(&str, &std::path::Path) -> Result<String, String>,
    ) -> Result<Auth, String> {
        Err("this build has no JWT support (the `jwt` feature of switchboard-core)".into())
    }

    /// The backend to run: the command after `--`, or this binary's demo mode.
    pub fn backend_command(&self, current_exe: &str) -> Vec<String> {
        if self.command.is_empty() {
            vec![current_exe.to_owned(), "--demo-backend".to_owned()]
        } else {
            self.command.clone()
        }
    }

    /// The request gate for these flags; `read` loads the `--auth-tokens` file. Refuses to
    /// expose an unauthenticated proxy off loopback unless asked to.
    pub fn gate(
        &self,
        mut read: impl FnMut(&std::path::Path) -> std::io::Result<String>,
    ) -> Result<Gate, String> {
        let mut read = |flag: &str, path: &std::path::Path| {
            read(path).map_err(|e| format!("cannot read {flag} {}: {e}", path.display()))
        };
        let jwt = self.jwt_jwks.is_some()
            || self.jwt_secret_file.is_some()
            || !self.key_sources().is_empty();
        let auth = match (&self.auth_tokens, jwt) {
            (Some(_), true) => {
                return Err("--auth-tokens and --jwt-* cannot be combined: choose one".into())
            }
            (Some(path), false) => Auth::Tokens(
                TokenTable::parse(&read("--auth-tokens", path)?)
                    .map_err(|e| format!("--auth-tokens {}: {e}", path.display()))?,
            ),
            (None, true) => self.jwt_auth(&mut read)?,
            (None, false) => Auth::None,
        };
        let listen = self.listen_addr();
        let loopback = listen.ip().is_loopback();
        if matches!(auth, Auth::None) && !loopback && !self.allow_unauthenticated {
            return Err(format!(
                "refusing to serve {listen} without authentication: use --auth-tokens or --jwt-*, or --allow-unauthenticated"
            ));
        }
        Ok(Gate {
            auth,
            origins: OriginPolicy {
                allow_origins: self.allow_origins.clone(),
                allow_hosts: self.allow_hosts.clone(),
                loopback_bind: loopback,
            },
            base_path: self.base_path().to_owned(),
            metrics_auth: self.metrics_auth,
            oauth: self.resource_server().map(std::sync::Arc::new),
            trusted_proxies: self.trusted_proxies.clone(),
            tracing: self.otlp_endpoint.is_some(),
        })
    }

    /// The OAuth resource server these flags describe, when `--oauth-issuer` is given.
    pub(crate) fn resource_server(&self) -> Option<crate::oauth::ResourceServer> {
        if self.oauth_issuers.is_empty() {
            return None;
        }
        let public_url = self
            .public_url
            .as_deref()
            .map(|u| u.trim_end_matches('/').to_owned());
        let own = match &public_url {
            Some(url) => format!("{url}{}", self.base_path()),
            None => format!("http://{}{}", self.listen_addr(), self.base_path()),
        };
        let resource = self.resource.clone().unwrap_or_else(|| {
            if own.ends_with('/') || own.matches('/').count() > 2 {
                own
            } else {
                format!("{own}/")
            }
        });
        Some(crate::oauth::ResourceServer {
            resource,
            issuers: self.oauth_issuers.clone(),
            scopes: self
                .oauth_scopes
                .iter()
                .flat_map(|s| s.split_ascii_whitespace().map(str::to_owned))
                .collect(),
            required: self.required_scopes.clone(),
            tool_scopes: self.tool_scopes.clone(),
            name: self.resource_name.clone(),
            public_url,
            listen_origin: format!("http://{}", self.listen_addr()),
            base_path: self.base_path().to_owned(),
        })
    }
}

/// `10.0.0.0/8`, `::1` (a flag's value).
pub fn parse_cidr(text: &str) -> Result<crate::audit::Cidr, String> {
    text.parse()
}

/// `60/min` and the like (a flag's value).
pub fn parse_rate(text: &str) -> Result<crate::settings::Rate, String> {
    text.parse()
}

/// `TOOL=N/PERIOD` (a flag's value).
pub fn parse_tool_rate(text: &str) -> Result<(String, crate::settings::Rate), String> {
    let (tool, rate) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not TOOL=N/PERIOD"))?;
    if tool.is_empty() {
        return Err(format!("{text:?} names no tool"));
    }
    Ok((tool.to_owned(), rate.parse()?))
}

/// `TOOL=SCOPE` (a flag's value).
pub fn parse_tool_scope(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((tool, scope)) if !tool.is_empty() && !scope.is_empty() && !scope.contains(' ') => {
            Ok((tool.to_owned(), scope.to_owned()))
        }
        _ => Err(format!("{text:?} is not TOOL=SCOPE")),
    }
}

/// `1500ms` as `1.5s`, for messages.
fn show_duration(d: Duration) -> String {
    if d.is_zero() {
        "0s".to_owned()
    } else if d.subsec_millis() != 0 || d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", d.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("1 XB").is_err());
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert!(parse_duration("1.5s").is_err());
        assert_eq!(parse_env("A=b=c"), Ok(("A".into(), "b=c".into())));
    }

    #[cfg(feature = "cli")]
    #[test]
    fn configured_keys_say_whose_tokens_they_verify() {
        use crate::settings::KeySource;
        let config = |args: &[&str]| {
            let argv = ["switchboard"].iter().chain(args);
            <Config as clap::Parser>::try_parse_from(argv).unwrap()
        };
        let (a, b) = ("https://a.example", "https://b.example");
        let url = "https://keys.example/jwks";
        // One issuer: its tokens; none named: any; --jwt-issuer: that one.
        let one = config(&["--oauth-issuer", a, "--jwt-jwks-url", url]);
        assert_eq!(one.validate(), Ok(()));
        assert_eq!(
            one.key_sources(),
            [
                KeySource::Issuer(a.into()),
                KeySource::Jwks {
                    url: url.into(),
                    issuer: Some(a.into())
                }
            ]
        );
        assert_eq!(config(&["--jwt-jwks-url", url]).configured_issuer(), None);
        let named = config(&["--oauth-issuer", a, "--oauth-issuer", b, "--jwt-issuer", b]);
        assert_eq!(named.configured_issuer().as_deref(), Some(b));
        // Several issuers and keys of no named issuer: refused, naming --jwt-issuer.
        for keys in [
            ["--jwt-jwks", "k.json"],
            ["--jwt-secret-file", "s"],
            ["--jwt-jwks-url", url],
        ] {
            let mut args = vec!["--oauth-issuer", a, "--oauth-issuer", b];
            args.extend(keys);
            let refused = config(&args).validate().unwrap_err();
            assert_eq!(refused.flag, "--jwt-issuer", "{keys:?}");
        }
        assert_eq!(
            config(&["--oauth-issuer", a, "--oauth-issuer", b]).validate(),
            Ok(())
        );
        // A key set URL that is not https nor loopback is refused with the reason.
        let refused = config(&["--jwt-jwks-url", "http://127.0.0.1@keys.example/jwks"]);
        let refused = refused.validate().unwrap_err();
        assert_eq!(refused.flag, "--jwt-jwks-url");
        assert!(
            refused.problem.contains("user information"),
            "{}",
            refused.problem
        );
    }

    #[cfg(feature = "cli")]
    #[test]
    fn a_policy_beside_several_issuers_is_warned_about() {
        let config = |args: &[&str]| {
            let argv = ["switchboard", "--authz-config", "p.yaml"].into_iter();
            <Config as clap::Parser>::try_parse_from(argv.chain(args.iter().copied())).unwrap()
        };
        let (a, b) = ("https://a.example", "https://b.example");
        let two = config(&["--oauth-issuer", a, "--oauth-issuer", b]).start_warnings();
        assert_eq!(two.len(), 1);
        assert!(two[0].contains("Client::\"<sub>\"") && two[0].contains("claim_iss"));
        assert!(
            two[0].contains("https://a.example, https://b.example"),
            "{}",
            two[0]
        );
        let any = config(&["--jwt-jwks", "k.json"]).start_warnings();
        assert!(any[0].contains("any issuer"), "{any:?}");
        for quiet in [
            &["--oauth-issuer", a][..],
            &["--jwt-jwks", "k.json", "--jwt-issuer", a],
            &["--oauth-issuer", a, "--oauth-issuer", b, "--jwt-issuer", a],
            &[],
        ] {
            assert_eq!(
                config(quiet).start_warnings(),
                Vec::<String>::new(),
                "{quiet:?}"
            );
        }
    }
}
