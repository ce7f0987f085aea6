//! Any sequence of opens, closes, posts, backend lines, subscriptions and restarts keeps SPEC section 6 properties 1, 2, 4 and 5 after every step, and replays to identical actions.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| switchboard_core::fuzzing::session_ops(data));
