//! # switchboard-core
//!
//! The sans-IO heart of Switchboard: one shared stdio MCP server (the *backend*) behind
//! HTTP for many sessions, each bound to an authenticated principal. No sockets, threads,
//! processes, clocks or randomness live here: shells feed inputs in and perform the
//! [`Action`]s that come out.
//!
//! ## Loop contract
//!
//! Every input to the [`Router`] (`open_session`, `close_session`, `client_message`,
//! `backend_line`, `backend_line_too_long`, `backend_started`, `backend_exited`,
//! `health_ping`) must be followed by a complete drain of [`Router::poll_action`],
//! performing each action in order, before the next input:
//!
//! ```
//! use switchboard_core::{Action, Principal, Router, SessionId, Body};
//!
//! let mut router = Router::new(10_000);
//! router.backend_started();
//! let sid = SessionId::from_random([7; 16]);
//! router.open_session(sid, Principal::anonymous()).unwrap();
//! let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
//! router.client_message(sid.as_str(), &Principal::anonymous(), Body::Complete(body)).unwrap();
//! while let Some(action) = router.poll_action() {
//!     match action {
//!         Action::Rewrite { line } => assert!(line.ends_with(b"\n")), // to backend stdin
//!         _ => unreachable!(),
//!     }
//! }
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
//! | backend message | action |
//! |---|---|
//! | response whose id is a routed id of a live session | [`Action::Deliver`] to that session, original id restored |
//! | response with any other id | [`Action::Drop`] |
//! | response to the proxy's own request (ping, unsubscribe) | consumed ([`Action::Pong`] for pings) |
//! | `notifications/{tools,resources,prompts}/list_changed` | [`Action::Broadcast`], rebuilt without params |
//! | `notifications/progress` with a routed token of a live session | [`Action::Deliver`], token restored; else drop |
//! | `notifications/resources/updated` | [`Action::Deliver`] to each subscriber of the uri; else drop |
//! | any other notification | [`Action::Drop`] |
//! | request `ping` | [`Action::Reply`] `{"result":{}}` |
//! | any other request | [`Action::Reply`] error -32601; never reaches a client |
//! | not JSON, not an object, a batch, too long | [`Action::Drop`] |
#![forbid(unsafe_code)]

pub mod action;
pub mod auth;
pub mod config;
pub mod demo;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod http;
pub mod hub;
#[cfg(feature = "jwt")]
pub mod jwt;
pub mod lines;
pub mod message;
pub mod metrics;
pub mod routed_id;
pub mod router;
pub mod sse;
pub mod supervise;

pub use action::{Action, DropReason, LogLevel};
pub use auth::{Auth, Principal};
pub use http::Rejection;
pub use routed_id::SessionId;
pub use router::{Accepted, Body, Router};
