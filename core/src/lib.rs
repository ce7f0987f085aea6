//! # switchboard-core
//!
//! The sans-IO heart of Switchboard: one shared stdio MCP server (the *backend*) behind
//! HTTP for many sessions, each bound to an authenticated principal. No sockets, threads,
//! processes, clocks or randomness live here: shells feed inputs in and perform the
//! [`Output`]s that come out.
//!
//! ## Loop contract
//!
//! A shell owns one [`Hub`] on one thread or task. Every input (`handle_request`,
//! `handle_stream_closed`, `handle_backend_lines`, `handle_backend_exited`, ...) but
//! `handle_lost` takes the shell's `now`, and must be followed by a complete drain
//! of [`Hub::poll_output`], performing each [`Output`] in order, before the next input. An
//! input that arises while an output is performed (a spawn's result, a full stream queue, a
//! fetch that could not start, lost audit events) is fed at once; its outputs join the
//! drain. After [`Output::Exit`], requests still queued are fed as usual (each is refused).
//! Between inputs the shell sleeps until its next I/O event or [`Hub::poll_timeout`], and
//! calls [`Hub::handle_timeout`] once that instant has passed. The hub names the shell's
//! things by the ids it hands out ([`RequestId`], [`StreamId`], [`BackendId`]). Both shells
//! keep this loop in one place, `Owner` in `switchboard-shell` (`core/shell`):
//!
//! ```
//! use std::time::{Duration, Instant};
//! use switchboard_core::hub::{Hub, Payload, Settings};
//! use switchboard_core::http::{Endpoint, Admitted};
//! use switchboard_core::{Output, Principal};
//!
//! let start = Instant::now();
//! let mut hub = Hub::new(Settings::default(), start);
//! let Some(Output::SpawnBackend { backend }) = hub.poll_output() else { unreachable!() };
//! hub.handle_backend_spawned(start, backend, 4242); // the shell started the process
//! while hub.poll_output().is_some() {}
//!
//! let open = Admitted::new(Endpoint::Stream, Principal::anonymous(), "");
//! let request = hub.handle_request(start, open.into_request(Payload::Bytes(Vec::new()), || [7; 16]));
//! match hub.poll_output() {
//!     Some(Output::StartStream { request: r, head, .. }) => assert!(r == request && head.status == 200),
//!     other => unreachable!("{other:?}"),
//! }
//! assert!(matches!(hub.poll_output(), Some(Output::ToStream { .. }))); // the endpoint event
//! assert!(hub.poll_timeout().is_some_and(|at| at <= start + Duration::from_secs(30)));
//! ```
//!
//! ## Client → backend (SPEC section 2)
//!
//! A request's id becomes the *routed id* `"<sid>|n:<digits>"` or `"<sid>|s:<string>"`
//! ([`routed_id`]); `notifications/cancelled`'s `requestId` and `_meta.progressToken` are
//! rewritten the same way. The backend is initialized once per process; later `initialize`
//! calls are answered from the cache under each client's own id.
//!
//! ## Backend → clients (SPEC section 3): the dispatch table
//!
//! | backend message | what the hub does |
//! |---|---|
//! | response whose id is a routed id of a live session | delivered to that session ([`Output::ToStream`], or its request's answer), original id restored |
//! | response with any other id | dropped ([`Output::Log`] of an [`Event::Dropped`]) |
//! | response to the proxy's own request (ping, subscribe, unsubscribe, initialize) | consumed |
//! | `notifications/{tools,resources,prompts}/list_changed` | to every live session, rebuilt without params |
//! | `notifications/progress` with a routed token of a live session | delivered, token restored; else dropped |
//! | `notifications/resources/updated` | to each subscriber of the uri; else dropped |
//! | any other notification | dropped |
//! | request `ping` | answered `{"result":{}}` ([`Output::ToBackend`]) |
//! | any other request | answered error -32601; never reaches a client |
//! | not JSON, not an object, a batch, too long | dropped |
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

// The import graph is acyclic: the top-level modules' `use crate::` lines (rustfmt keeps
// the declarations alphabetical), and inside `hub`, where a part never imports a behaviour
// file (one that adds `impl Hub` methods) and those import one another one way.
// Public: the modules whose names are the protocol's (the CLI, HTTP framing, the HTTP
// surface, the hub, routed ids, SSE frames); the rest is reached through the re-exports
// below, exactly what the shells, the test kit, the fuzz targets and the benches use.
mod admission; // whether a request goes ahead, and the refusal each verdict owes
mod audit; // SPEC 11's audit records, client addresses behind proxies
mod auth; // the auth modes
pub mod config; // the one CLI definition
#[cfg(feature = "cli")]
mod config_file; // --config FILE merged under the command line
mod demo; // the built-in demo backend
pub mod framing; // HTTP/1.1 framing rules both shells apply
pub mod http; // endpoints, the gate, rejections and answers, the hub's request input
pub mod hub; // the owner loop as a state machine
#[cfg(feature = "jwt")]
mod jwt; // JWT verification
mod limits; // rate limits' token buckets
mod lines; // newline framing of the backend's stdout
mod lists; // lists read once: the backend's list results kept for every caller (SPEC 16)
mod load; // flags and files read and checked whole, at start and on reload
mod message; // one-pass admission of a JSON-RPC object
mod methods; // the methods MCP defines for a client (SPEC 15)
mod metrics; // counters, drop reasons, Prometheus text
mod modern; // MCP 2026-07-28 requests: the era, the checks, the answers changed
mod oauth; // the OAuth resource server: metadata, challenges, the resource
mod output; // what a shell must do, ids it is told
mod policy; // Cedar policies in ToolHive's format: the entities a request becomes
mod principal; // who a caller is, why a credential was refused
pub mod routed_id; // <sid>|n:<digits> / <sid>|s:<string>, session ids
mod router; // the message-level rules, returning decisions
mod settings; // what the hub decides with
pub mod sse; // SSE frames
mod streamable; // /mcp helpers: Accept, ids as keys, proxy bodies
mod supervise; // restart policy, exits, /health
mod tools; // the tools an operator shows: --tools and --tools-override (SPEC 16)
mod trace; // W3C trace context, the sampler, finished spans

pub use audit::{rfc3339_millis, Asked, AuditRecord};
pub use auth::{Auth, Principals, TokenTable};
#[cfg(feature = "cli")]
pub use config_file::CommandLine;
pub use demo::serve as serve_demo;
pub use http::Rejection;
pub use hub::Hub;
#[cfg(feature = "jwt")]
pub use jwt::KeyStore;
pub use lines::LineFramer;
pub use load::{Front, Loaded};
pub use message::Invalid;
pub use metrics::{DropReason, Histogram, Label, LogLevel, Measurement, DURATION_BUCKETS};
pub use oauth::{check_fetchable, ResourceServer};
pub use output::{coalesce, Level, STDIN_REPORT_EVERY};
pub use output::{BackendId, Event, FetchId, Frame, Lost, Output, RequestId, StreamEnd, StreamId};
pub use policy::Policy;
pub use principal::{AuthFailure, Principal};
pub use routed_id::SessionId;
pub use settings::{Audit, KeySet, KeySource};
pub use supervise::{Exit, Signal};
pub use tools::{Override, ToolView};
pub use trace::{
    Root, Sampler, SpanContext, SpanKind, SpanLink, SpanRecord, SpanStatus, VALUE_LIMIT,
};
pub use trace::{TraceHeaders, Tracing, Value};
