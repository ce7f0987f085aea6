//! # switchboard-shell
//!
//! What both shells share that is not sans-IO, so that neither copies the other: the
//! common part of the owner loop ([`Owner`]: the hub, the requests waiting for answers,
//! every output but those only a shell can perform, which it asks of its [`Perform`]), the
//! audit log writer, the key fetcher, stream and session budgets, and the front that request
//! handlers read. Only std and blocking I/O: the blocking binary stays without an async
//! runtime.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod audit;
pub mod budget;
mod entropy;
pub mod fetch;
pub mod head;
pub mod otel;
mod owner;
pub mod pending;
mod shared;

pub use entropy::entropy;
pub use owner::{Input, Owner, Perform, Process, StreamQueue};
pub use shared::Shared;

/// How long a write to a client's stream may move nothing before the connection is ended:
/// a client that never reads would otherwise keep it (a task and its queued frames, or a
/// thread) after the slow-consumer rule ended its session.
pub const STALLED_WRITE: std::time::Duration = std::time::Duration::from_secs(60);
