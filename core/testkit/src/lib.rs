//! # switchboard-testkit
//!
//! Test support for `switchboard-core`, kept out of the core's own source:
//!
//! - [`driver`]: the hub in virtual time, with a scripted backend and scripted clients
//!   (quinn's `Pair` idea), checking every output on the way;
//! - [`scenario`]: the scenario language of `core/tests/scenarios/*.txt`, its one parser,
//!   and the transcript the snapshot tests compare;
//! - [`model`]: the one reference model, run on operations from the fuzzer
//!   (`session_ops`) or from seeded generators (`core/tests/model.rs`);
//! - [`resume_model`]: resumable streams and the fair share (SPEC sections 7 and 12) as
//!   properties checked after every step of seeded sequences (`core/tests/resume_properties.rs`);
//! - [`fuzz`]: the message-level properties of the `client_body` and `backend_line`
//!   fuzz targets, judged on the hub's outputs read back by [`routing`].
#![forbid(unsafe_code)]

pub mod driver;
pub mod fuzz;
pub mod model;
pub mod resume_model;
pub mod routing;
pub mod scenario;
