//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, server scenarios,
//! the default active suite) against Streamable HTTP `/mcp` of each binary, in front of the
//! `conformance-backend` fixture: every scenario passes except the five of
//! `tests/conformance-baseline.yml`, which a shared backend cannot pass by design.
//!
//! Needs the pinned Node packages (`tests/run.sh` installs them into `tests/node`); without
//! them the test skips loudly, or fails when `CI=true`.

use std::collections::BTreeSet;
use std::time::Duration;

use switchboard_tests::{node, parse_metric, suite, workspace_root, Proxy, Target};

const BACKEND: &str = env!("CARGO_BIN_EXE_conformance-backend");

/// The baseline's scenarios: each needs the backend's log notifications or its requests to
/// the client, which the proxy drops or refuses (SPEC section 3).
const EXPECTED_FAILURES: [&str; 5] = [
    "tools-call-with-logging",
    "tools-call-sampling",
    "tools-call-elicitation",
    "elicitation-sep1034-defaults",
    "elicitation-sep1330-enums",
];

/// Scenarios of the active suite of 0.1.13 (32 in all, 2 pending).
const ACTIVE_SCENARIOS: usize = 30;

/// A whole run takes seconds; this bounds a hung one (the SDK's own request timeout is 60 s).
const SUITE_TIMEOUT: Duration = Duration::from_secs(240);

/// The scenario names of the baseline file's `server:` list.
fn baseline_entries(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("- "))
        .map(|name| name.trim().to_owned())
        .collect()
}

/// The names of the summary lines `✓ name: N passed, M failed` (or `✗`).
fn summary(output: &str, mark: char) -> BTreeSet<String> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix(mark))
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(name, _)| name.to_owned())
        .collect()
}

fn conformance_suite_passes_but_for_the_baseline(target: Target) {
    let Some(node) = node("the MCP conformance suite") else {
        return;
    };
    let baseline = workspace_root().join("tests/conformance-baseline.yml");
    let listed = baseline_entries(&std::fs::read_to_string(&baseline).expect("read the baseline"));
    let expected: BTreeSet<String> = EXPECTED_FAILURES.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        listed, expected,
        "tests/conformance-baseline.yml must list exactly the scenarios a shared backend cannot pass"
    );

    let _turn = node::one_at_a_time();
    // Defaults on purpose: the suite opens a session per scenario and never DELETEs one,
    // so this also shows that --max-sessions and --session-idle leave room for a run, and
    // its dns-rebinding scenario exercises the default loopback Host and Origin gate.
    let p = Proxy::builder(target).backend([BACKEND]).start();
    let url = format!("http://{}/mcp", p.addr);
    let run = node.spawn(
        "npx",
        [
            "--no",
            "--",
            "conformance",
            "server",
            "--url",
            &url,
            "--expected-failures",
            &baseline.display().to_string(),
        ],
        p.dir().path(),
        "conformance",
    );
    let out = run.wait(SUITE_TIMEOUT);
    let transcript = out.transcript();
    assert!(
        out.status.success(),
        "the conformance suite failed ({}) against {target:?}:\n{transcript}",
        out.status
    );
    let failed = summary(&out.stdout, '✗');
    let passed = summary(&out.stdout, '✓');
    assert_eq!(failed, expected, "failed scenarios:\n{transcript}");
    assert_eq!(
        passed.len() + failed.len(),
        ACTIVE_SCENARIOS,
        "the suite did not run every active scenario:\n{transcript}"
    );
    for must in [
        "server-initialize",
        "tools-call-with-progress",
        "server-sse-multiple-streams",
        "resources-subscribe",
        "dns-rebinding-protection",
    ] {
        assert!(passed.contains(must), "{must} did not pass:\n{transcript}");
    }
    assert!(
        out.stdout.contains("Baseline check passed"),
        "no baseline verdict:\n{transcript}"
    );

    // The five fail for the designed reason only, and the gate refused the suite's one
    // foreign request (dns-rebinding-protection's evil Origin) and nothing else.
    let metrics = p.metrics();
    let dropped = |reason: &str, method: &str| {
        parse_metric(
            &metrics,
            &format!(r#"switchboard_drops_total{{reason="{reason}",method="{method}"}}"#),
        )
        .unwrap_or(0.0)
    };
    assert!(
        dropped("answered_server_request", "sampling/createMessage") >= 1.0,
        "{metrics}"
    );
    assert!(
        dropped("answered_server_request", "elicitation/create") >= 3.0,
        "{metrics}"
    );
    assert!(
        dropped("unroutable_notification", "notifications/message") >= 3.0,
        "{metrics}"
    );
    let rejections: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("switchboard_rejections_total") && !l.ends_with(" 0"))
        .collect();
    assert_eq!(
        rejections,
        [r#"switchboard_rejections_total{reason="origin_not_allowed"} 1"#],
        "the proxy refused something of the suite's own:\n{transcript}"
    );
    assert_eq!(p.health().0, 200, "the backend is unhealthy after the run");
}

suite!(conformance_suite_passes_but_for_the_baseline);
