//! Any bytes POSTed to a live session never panic the router; a rejected body produces no action, an accepted one exactly one backend line whose routed ids decode back to the client's own (or the documented proxy answer).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| switchboard_testkit::fuzz::client_body(data));
