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

/// SPEC section 11: auditing never changes what a client gets. The same legacy exchanges
/// (an id already in flight, more than `--max-inflight` in flight, a cancellation, requests
/// past `--request-timeout`, a restart) give the same transcript with auditing on and off,
/// but for the audit events.
#[test]
fn auditing_never_changes_what_a_legacy_client_gets() {
    let script = r#"with max-inflight 2
open A alice
post A {"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}
post A {"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}
post A {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow"}}
post A {"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"slow"}}
post A {"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"slow"}}
post A {"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}
backend {"jsonrpc":"2.0","id":"<A>|n:1","result":{}}
post A {"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"slow"}}
at +6m
post A {"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"slow"}}
post A {"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"slow"}}
backend-exit
at +2s
post A {"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow"}}
"#;
    let run = |first: &str| switchboard_testkit::scenario::run(&format!("{first}{script}"));
    let (audited, plain) = (run("with audit on\n"), run(""));
    let client_side = |transcript: &str| {
        (transcript.lines())
            .filter(|line| !line.trim_start().starts_with("-> audit") && *line != "with audit on")
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(audited.contains("-> audit mcp_tool_call"), "{audited}");
    assert!(!plain.contains("-> audit"), "{plain}");
    assert_eq!(client_side(&audited), client_side(&plain));
    for refused in ["= 409", "= 429"] {
        assert!(!audited.contains(refused), "{audited}");
    }
}
