//! Snapshot tests of the hub's decisions: every `scenarios/*.txt` file is a script of
//! inputs in the scenario language (`switchboard_testkit::scenario`), run in virtual time,
//! and its snapshot (`snapshots/scenarios@<file>.snap`) is the transcript of what came out.
//! The driver checks the hub's invariants on every output before the snapshot is taken. A
//! reviewer reads the snapshots to review behaviour.

// `core/clippy.toml` keeps clocks and files out of the core library; its tests and benches
// read their inputs and time themselves.
#![allow(clippy::disallowed_methods)]

/// Asserts a scenario transcript against its snapshot, named after the scenario file.
macro_rules! assert_transcript {
    ($transcript:expr) => {
        insta::with_settings!({
            omit_expression => true,
            prepend_module_to_snapshot => false,
        }, {
            insta::assert_snapshot!($transcript);
        })
    };
}

#[test]
fn scenarios() {
    insta::glob!("scenarios/*.txt", |path| {
        let script = std::fs::read_to_string(path).expect("scenario files are UTF-8 text");
        assert_transcript!(switchboard_testkit::scenario::run(&script));
    });
}
