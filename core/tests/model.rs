//! Model-based property test: seeded random operation sequences (legacy sessions opening
//! and hanging up across three principals, POSTs as owners and impostors; Streamable
//! sessions initialized, POSTed to with JSON and stream answers, cancellations, 409s and
//! 429s, GET streams opened and replaced, DELETEs, hang-ups, request timeouts and idle
//! expiry, with ids and tokens colliding across sessions and transports; 2026-07-28
//! requests with no session, their hang-ups, and listen streams; backend answers
//! in and out of order, progress, updates, forged ids and requests, backend exits and
//! restarts, health checks, time passing; in one sequence in three, tasks created for
//! sessions and modern requests, asked for, listed and reported on by owners and others)
//! run through the one reference model (`switchboard_testkit::model`), which drives the
//! hub in virtual time and checks SPEC sections 6, 7 and 15 after every step.
//!
//! Deterministic: seeds `0..SEQUENCES`. A failure names its seed; rerun one sequence with
//! `MODEL_SEED=<seed> cargo test -p switchboard-core --test model`. The full run asserts
//! that the generator reached each interesting case (`COVERAGE`) often enough to matter.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;

use switchboard_testkit::model::{check_ops, random_ops};

const SEQUENCES: u64 = 5_000;
const STEPS: usize = 40;

/// What every full run must reach at least `MIN_HITS` times (label prefixes of
/// `check_ops`).
const COVERAGE: [&str; 65] = [
    "open",
    "open:refused",
    "close:0",
    "close:1",
    "close:get",
    "post:forwarded:tools/call",
    "post:forwarded:initialize",
    "post:answered:initialize",
    "post:404",
    "post:400",
    "backend:answer:deliver",
    "backend:progress:deliver",
    "backend:updated:deliver",
    "backend:list_changed:broadcast",
    "backend:request:drop+reply",
    "exit",
    "start",
    "mcp-init:json:forwarded",
    "mcp-init:json:answered",
    // An initialize that opens a session is answered once its answer is known, so the
    // model asks for JSON (scenarios show the stream: mcp_initialize_failed, _shared).
    "mcp-init:json:waiting",
    "mcp-init:503",
    "mcp-post:json:forwarded",
    "mcp-post:stream:forwarded",
    "mcp-post:404",
    "mcp-post:409",
    "mcp-post:429",
    "cancel:json",
    "cancel:stream",
    "mcp-get:new",
    "mcp-get:replace",
    "mcp-delete:in-flight",
    "hangup:stream",
    "hangup:json",
    "wait:timeout",
    "wait:idle",
    "backend:progress:deliver:mcp-progress",
    "modern:json",
    "modern:stream",
    "modern:400",
    "modern-hangup:json",
    "modern-hangup:stream",
    "backend:answer::mcp-answer:modern-answer",
    "backend:progress::modern-progress",
    "listen:acknowledged",
    "listen:refused",
    "listen-close",
    // SPEC section 15: tasks.
    "task-create:session:delivered",
    "task-create:principal:delivered",
    "task-create:nobody",
    "task-ask:own:legacy:forwarded",
    "task-ask:own:mcp:forwarded",
    "task-ask:own:modern:forwarded",
    "task-ask:foreign",
    "task-ask:forgotten",
    "task-ask:unknown:legacy:refused",
    "task-ask:unknown:mcp:refused",
    "task-ask:unknown:modern:refused",
    "task-list:mine",
    "task-list:others",
    "task-list:backend",
    "task-page:shown-some",
    "task-page:shown-none",
    "task-status:delivered",
    "task-status:nobody",
    "task-status:principal",
];
const MIN_HITS: u64 = 20;

#[test]
fn hub_matches_model() {
    let seeds: Vec<u64> = match std::env::var("MODEL_SEED") {
        Ok(seed) => vec![seed.parse().expect("MODEL_SEED is a number")],
        Err(_) => (0..SEQUENCES).collect(),
    };
    let full_run = seeds.len() > 1;
    let mut coverage: BTreeMap<String, u64> = BTreeMap::new();
    for seed in seeds {
        let ops = random_ops(seed, STEPS);
        let labels = std::panic::catch_unwind(AssertUnwindSafe(|| check_ops(&ops))).unwrap_or_else(
            |panic| {
                eprintln!(
                    "model test failed for seed {seed} (rerun with MODEL_SEED={seed}); operations:"
                );
                for op in &ops {
                    eprintln!("  {op:?}");
                }
                std::panic::resume_unwind(panic)
            },
        );
        for label in labels {
            *coverage.entry(label).or_default() += 1;
        }
    }
    eprintln!("model coverage: {coverage:#?}");
    if full_run {
        for wanted in COVERAGE {
            let hits: u64 = coverage
                .iter()
                .filter(|(label, _)| *label == wanted || label.starts_with(&format!("{wanted}:")))
                .map(|(_, n)| n)
                .sum();
            assert!(
                hits >= MIN_HITS,
                "the generator reached {wanted:?} only {hits} times in {SEQUENCES} sequences"
            );
        }
    }
}
