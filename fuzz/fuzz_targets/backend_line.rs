//! Any backend line never panics the router; every Deliver goes to a live session the line names, every Broadcast is a bare list_changed, every Reply answers the backend request's id.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| switchboard_testkit::fuzz::backend_line(data));
