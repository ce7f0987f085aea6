//! What the [`Hub`](crate::Hub) asks a shell to do, and the ids it hands out for the
//! shell's own things (HTTP exchanges, streams, backend processes).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::Principal;
use crate::http::Response;
use crate::metrics::{DropReason, LogLevel};
use crate::routed_id::SessionId;
use crate::supervise::{AfterExit, Exit, Signal};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub(crate) u64);

        impl $name {
            /// The number behind the id (unique for the hub's life), for logs and maps.
            pub fn get(self) -> u64 {
                self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self, f)
            }
        }
    };
}

id_type!(
    /// One HTTP exchange waiting for its answer ([`Output::Respond`] or
    /// [`Output::StartStream`]); returned by [`Hub::handle_request`](crate::Hub::handle_request).
    RequestId,
    "R"
);
id_type!(
    /// One outgoing SSE stream (a legacy session's `/sse` stream, a Streamable request's
    /// stream or a session's standalone GET stream).
    StreamId,
    "S"
);
id_type!(
    /// One fetch of a URL ([`Output::Fetch`]), reported with
    /// [`Hub::handle_fetched`](crate::Hub::handle_fetched).
    FetchId,
    "F"
);
id_type!(
    /// One backend process, from [`Output::SpawnBackend`] to its exit. Lines, write
    /// reports and exits tagged with an older id are ignored.
    BackendId,
    "B"
);

/// One chunk for a stream: owned, shared by every stream of a broadcast, or static.
#[derive(Debug, Clone)]
pub enum Frame {
    /// Bytes for this stream only.
    Owned(Vec<u8>),
    /// The same bytes queued on several streams (a broadcast).
    Shared(Arc<[u8]>),
    /// A constant (the keep-alive comment).
    Static(&'static [u8]),
}

impl Frame {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.as_ref().len()
    }

    /// Whether the frame holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl AsRef<[u8]> for Frame {
    fn as_ref(&self) -> &[u8] {
        match self {
            Frame::Owned(v) => v,
            Frame::Shared(a) => a,
            Frame::Static(s) => s,
        }
    }
}

/// Frames already waiting in a stream's queue are joined into one write up to this size.
pub(crate) const COALESCE_LIMIT: usize = 64 * 1024;

/// Joins `first` with the frames already waiting (pulled from `next` until it gives
/// `None`) into one write of about `COALESCE_LIMIT` bytes; a lone frame is not copied.
pub fn coalesce(first: Frame, mut next: impl FnMut() -> Option<Frame>) -> Frame {
    let Some(second) = next() else {
        return first;
    };
    let mut buf = Vec::with_capacity(COALESCE_LIMIT.max(first.len() + second.len()));
    buf.extend_from_slice(first.as_ref());
    buf.extend_from_slice(second.as_ref());
    while buf.len() < COALESCE_LIMIT {
        let Some(more) = next() else { break };
        buf.extend_from_slice(more.as_ref());
    }
    Frame::Owned(buf)
}

/// How a stream ended on the shell's side, reported with
/// [`Hub::handle_stream_closed`](crate::Hub::handle_stream_closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The client went away or a write failed.
    ClientGone,
    /// A frame did not fit the stream's byte budget: the slow-consumer rule.
    Full,
}

/// One thing for a shell to do, drained with [`Hub::poll_output`](crate::Hub::poll_output)
/// after every input. A shell performs each in order and decides nothing.
#[derive(Debug, Clone)]
#[must_use]
pub enum Output {
    /// Answer `request` with this complete response; the exchange is over.
    Respond {
        /// The exchange to answer.
        request: RequestId,
        /// Status, headers and body, copied onto the wire as they are.
        response: Response,
    },
    /// Answer `request` with `head` (status and headers; its body is empty) and keep the
    /// body open as `stream`: every [`Output::ToStream`] for it is written in order until
    /// [`Output::EndStream`]. The shell's queue for it holds at most `budget` bytes not yet
    /// written: a frame that does not fit ends the stream and is reported as
    /// [`StreamEnd::Full`]. A stream that ends on the shell's side is reported as
    /// [`StreamEnd::ClientGone`].
    StartStream {
        /// The exchange this stream answers.
        request: RequestId,
        /// The new stream.
        stream: StreamId,
        /// Status and headers.
        head: Response,
        /// Bytes the stream may have queued and unwritten.
        budget: usize,
    },
    /// Queue `frame` on `stream` without waiting (ignored when the shell no longer has it).
    ToStream {
        /// Where.
        stream: StreamId,
        /// What.
        frame: Frame,
    },
    /// Finish `stream`'s body once what is queued is written.
    EndStream {
        /// Which.
        stream: StreamId,
    },
    /// Start the backend process. Report it with
    /// [`Hub::handle_backend_spawned`](crate::Hub::handle_backend_spawned) or
    /// [`Hub::handle_spawn_failed`](crate::Hub::handle_spawn_failed); then its stdout lines
    /// ([`Hub::handle_backend_lines`](crate::Hub::handle_backend_lines)), the lines written to
    /// its stdin (at least every [`STDIN_REPORT_EVERY`] lines,
    /// [`Hub::handle_backend_wrote`](crate::Hub::handle_backend_wrote)) and its exit
    /// ([`Hub::handle_backend_exited`](crate::Hub::handle_backend_exited)), all tagged `backend`.
    SpawnBackend {
        /// The id the process is known by.
        backend: BackendId,
    },
    /// Queue `line` (one JSON-RPC message ending in `\n`) for the backend's stdin. The hub
    /// bounds how many lines are queued ([`STDIN_WINDOW`](crate::hub::STDIN_WINDOW)) and
    /// keeps the rest until writes are reported, so the shell's queue need not.
    ToBackend {
        /// Which process (ignored when it is no longer the shell's).
        backend: BackendId,
        /// The bytes, newline included.
        line: Vec<u8>,
    },
    /// Close the backend's stdin once the lines queued before are written.
    CloseBackendStdin {
        /// Which process.
        backend: BackendId,
    },
    /// Send `signal` to the backend process (if it has not been reaped yet).
    SignalBackend {
        /// Which process.
        backend: BackendId,
        /// What to send.
        signal: Signal,
    },
    /// `GET url` (an authorization server's metadata or a key set) over https, or http to a
    /// loopback host, within a few seconds, following no redirects; report the status, the
    /// `Cache-Control` header and the body (at most 1 MiB) or why it failed with
    /// [`Hub::handle_fetched`](crate::Hub::handle_fetched). Off the loop: it may be slow.
    Fetch {
        /// The id to report it under.
        fetch: FetchId,
        /// What to fetch.
        url: String,
    },
    /// Verify bearer JWTs with these fetched key sets (JWKS documents, each checked, each
    /// for the tokens of its issuer only) and the configured ones from now on:
    /// `KeyStore::use_fetched` on the gate's key store.
    UseKeys {
        /// Every fetched key set known now.
        sets: Arc<[crate::principal::KeySet]>,
    },
    /// Stop accepting connections; answers already under way still go out.
    StopAccepting,
    /// Exit the process with `status` once answers under way had at most `drain` to go out.
    /// No output follows.
    Exit {
        /// The process exit status.
        status: i32,
        /// How long answers already under way may still take.
        drain: Duration,
    },
    /// Write this to the log at [`Event::level`].
    Log(Event),
    /// Write this event to the audit log (`--audit-log`), through a bounded queue that
    /// never waits: an event that does not fit is reported with
    /// [`Hub::handle_lost`](crate::Hub::handle_lost).
    Audit(Box<crate::audit::AuditRecord>),
    /// Export this finished, sampled span (only with `--otlp-endpoint`), through a bounded
    /// queue that never waits: spans that do not fit are reported with
    /// [`Hub::handle_lost`](crate::Hub::handle_lost).
    Span(Box<crate::trace::SpanRecord>),
    /// Record this value into its OTLP histogram (only with `--otlp-endpoint`; `/metrics`
    /// counts it already).
    Measured(Box<crate::metrics::Measurement>),
}

/// How often a shell reports lines written to the backend's stdin, at the latest: the hub
/// counts lines queued and not yet reported against its stdin budget.
pub const STDIN_REPORT_EVERY: usize = 64;

// A shell reports writes only every STDIN_REPORT_EVERY lines: a smaller window could leave
// it waiting for lines the hub holds back until it reports.
const _: () = assert!(crate::settings::STDIN_WINDOW >= 2 * STDIN_REPORT_EVERY);

/// Why a session ended, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// Its stream ended on the client's side.
    ClientGone,
    /// It fell further behind than its buffer allows.
    SlowConsumer,
    /// The backend process exited.
    BackendExited,
    /// The proxy is shutting down.
    Shutdown,
    /// Its client sent `DELETE /mcp`.
    Deleted,
    /// No request and no open stream for `--session-idle`.
    Idle,
    /// A reload removed its principal (a static token gone from the tokens file).
    Revoked,
}

/// Something for the log; [`Event::level`] says how loud.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A session was created for `principal`.
    SessionOpened {
        /// The new session.
        session: SessionId,
        /// Its owner.
        principal: Principal,
    },
    /// A session ended.
    SessionClosed {
        /// Which.
        session: SessionId,
        /// Why.
        reason: CloseReason,
    },
    /// A backend message (or part of a client's) went nowhere, or the proxy answered it.
    Dropped {
        /// Why.
        reason: DropReason,
        /// The JSON-RPC method, when there was one.
        method: Option<String>,
        /// How loud, as the router decided (the first of each kind warns).
        level: LogLevel,
    },
    /// The backend process runs.
    BackendStarted {
        /// Its process id.
        pid: u32,
    },
    /// The backend could not be started.
    SpawnFailed {
        /// What the OS said.
        error: String,
    },
    /// The backend process exited.
    BackendExited {
        /// Its process id.
        pid: u32,
        /// How.
        exit: Exit,
    },
    /// The backend will be started again after `after`.
    Restarting {
        /// The backoff.
        after: Duration,
    },
    /// The backend will not be restarted: the proxy shuts down with `status`.
    ShuttingDown {
        /// The proxy's exit status.
        status: i32,
    },
    /// SIGINT or SIGTERM: the proxy shuts down.
    ShutdownRequested,
    /// The first audit event the shell's queue could not take (more are only counted).
    AuditDropped,
    /// The backend still runs during shutdown: `signal` is sent.
    StillRunning {
        /// What is sent now.
        signal: Signal,
    },
    /// The backend outlived every step of the stop sequence; the proxy exits anyway.
    GaveUpWaiting,
    /// The backend has not answered a ping for `silent` (it is not killed).
    Unresponsive {
        /// Time since the unanswered ping.
        silent: Duration,
    },
    /// The backend answers pings again.
    Responsive,
    /// A key set (or an authorization server's metadata) was fetched and is in use.
    KeysFetched {
        /// From where.
        url: String,
        /// Keys it holds (metadata: 0).
        keys: usize,
    },
    /// An authorization server's metadata named its key set.
    KeySetDiscovered {
        /// Where the metadata was.
        metadata: String,
        /// The key set it names.
        jwks: String,
    },
    /// A fetch failed or its document was refused; the last good keys stay in use.
    KeysFailed {
        /// From where.
        url: String,
        /// Why.
        why: String,
    },
    /// The configuration was reloaded (SIGHUP).
    Reloaded {
        /// Flags that changed but need a restart: ignored until then.
        ignored: Vec<&'static str>,
    },
    /// A reload was refused: the running configuration stays whole.
    ReloadFailed {
        /// Which file and what is wrong with it.
        why: String,
    },
    /// Names in `--tools` or `--tools-override` that match no tool of the backend's own
    /// list (SPEC section 16), once per configuration and list read.
    ToolsUnmatched {
        /// The names.
        names: Vec<String>,
    },
    /// The proxy's read of the backend's tool list stopped at its bound of pages: the
    /// names on the pages read are taken as the backend's (SPEC section 16).
    ToolsReadCut {
        /// The pages read.
        pages: usize,
    },
}

/// Log levels the hub asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Something an operator should look at.
    Warn,
    /// Normal operation.
    Info,
    /// Detail.
    Debug,
}

impl Event {
    /// What the log says of the supervisor's decision after the backend exited.
    pub(crate) fn after_exit(after: AfterExit) -> Event {
        match after {
            AfterExit::Restart { after } => Event::Restarting { after },
            AfterExit::Shutdown { status } => Event::ShuttingDown { status },
        }
    }

    /// How loud the event is.
    pub fn level(&self) -> Level {
        match self {
            Event::SessionClosed {
                reason: CloseReason::SlowConsumer,
                ..
            }
            | Event::BackendExited { .. }
            | Event::SpawnFailed { .. }
            | Event::GaveUpWaiting
            | Event::Unresponsive { .. }
            | Event::KeysFailed { .. }
            | Event::ReloadFailed { .. }
            | Event::ToolsUnmatched { .. }
            | Event::ToolsReadCut { .. }
            | Event::AuditDropped => Level::Warn,
            Event::Reloaded { ignored } if !ignored.is_empty() => Level::Warn,
            Event::Dropped {
                level: LogLevel::Warn,
                ..
            } => Level::Warn,
            Event::Dropped { .. } => Level::Debug,
            _ => Level::Info,
        }
    }

    /// The session the event is about, for the shell's per-session span or field.
    pub fn session(&self) -> Option<SessionId> {
        match self {
            Event::SessionOpened { session, .. } | Event::SessionClosed { session, .. } => {
                Some(*session)
            }
            _ => None,
        }
    }
}

impl CloseReason {
    /// Why a session closed, for its log line.
    fn explained(self) -> &'static str {
        match self {
            CloseReason::ClientGone => "stream ended",
            CloseReason::SlowConsumer => {
                "slow consumer (its buffer is full; it is disconnected, never thinned)"
            }
            CloseReason::BackendExited => "backend exited",
            CloseReason::Shutdown => "shutting down",
            CloseReason::Deleted => "deleted by its client",
            CloseReason::Idle => "idle",
            CloseReason::Revoked => "a reload removed its principal",
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::SessionOpened { principal, .. } => {
                write!(f, "session opened for principal {principal}")
            }
            Event::SessionClosed { reason, .. } => {
                write!(f, "session closed: {}", reason.explained())
            }
            Event::Dropped { reason, method, .. } => match method {
                Some(m) => write!(f, "dropped backend message ({reason}, method {m})"),
                None => write!(f, "dropped backend message ({reason})"),
            },
            Event::BackendStarted { pid } => write!(f, "backend started, pid {pid}"),
            Event::SpawnFailed { error } => write!(f, "cannot start backend: {error}"),
            Event::BackendExited { pid, exit } => match exit {
                Exit::Code(code) => write!(f, "backend pid {pid} exited with status {code}"),
                Exit::Signal => write!(f, "backend pid {pid} was killed by a signal"),
                Exit::SpawnFailed => write!(f, "backend pid {pid} could not be started"),
            },
            Event::Restarting { after } => {
                write!(f, "restarting backend in {} ms", after.as_millis())
            }
            Event::ShuttingDown { status } => write!(
                f,
                "backend will not be restarted; shutting down with status {status}"
            ),
            Event::ShutdownRequested => write!(f, "shutdown requested"),
            Event::AuditDropped => write!(
                f,
                "audit events are dropped: the queue is full or the log cannot be written (switchboard_audit_dropped_total)"
            ),
            Event::StillRunning { signal } => {
                write!(f, "backend still running; sending {signal:?}")
            }
            Event::GaveUpWaiting => write!(f, "backend did not exit after SIGKILL; exiting"),
            Event::Unresponsive { silent } => write!(
                f,
                "backend has not answered a ping for {} ms",
                silent.as_millis()
            ),
            Event::Responsive => write!(f, "backend answers pings again"),
            Event::KeysFetched { url, keys } => write!(f, "fetched {url} ({keys} keys)"),
            Event::KeySetDiscovered { metadata, jwks } => {
                write!(f, "the metadata at {metadata} names the key set {jwks}")
            }
            Event::KeysFailed { url, why } => write!(f, "cannot use {url}: {why}"),
            Event::Reloaded { .. }
            | Event::ReloadFailed { .. }
            | Event::ToolsUnmatched { .. }
            | Event::ToolsReadCut { .. } => self.fmt_configuration(f),
        }
    }
}

impl Event {
    /// What the log says of the configuration (a reload, the tools it names).
    fn fmt_configuration(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Reloaded { ignored } if ignored.is_empty() => {
                write!(f, "configuration reloaded")
            }
            Event::Reloaded { ignored } => write!(
                f,
                "configuration reloaded; changed but ignored until a restart: {}",
                ignored.join(", ")
            ),
            Event::ReloadFailed { why } => {
                write!(f, "reload refused, the running configuration stays: {why}")
            }
            Event::ToolsUnmatched { names } => write!(
                f,
                "--tools / --tools-override name tools the backend does not list: {}",
                names.join(", ")
            ),
            Event::ToolsReadCut { pages } => write!(
                f,
                "the backend's tool list still had a cursor after {pages} pages: the tools \
                 on later pages are not shown"
            ),
            _ => Ok(()),
        }
    }
}

/// What a shell's bounded queue toward an outside sink could not take
/// ([`Hub::handle_lost`](crate::Hub::handle_lost)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// Audit events (`--audit-log`).
    AuditEvents,
    /// Spans for the OTLP exporter (`--otlp-endpoint`).
    Spans,
}
