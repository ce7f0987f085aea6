//! Any sequence of opens, hang-ups, posts (2026-07-28 requests and listen streams among them), backend lines, subscriptions, tasks (created, asked for, listed, reported on: SPEC section 15), exits, restarts, health checks and time passing keeps SPEC section 6 after every step (the hub in virtual time against the reference model), and replays to an identical transcript.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| switchboard_testkit::model::session_ops(data));
