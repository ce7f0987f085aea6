//! Resumable streams and the fair share (SPEC sections 7 and 12, security properties 9 and
//! 10) as properties: seeded sequences of operations over four Streamable sessions of three
//! principals (POSTs answered as streams and as JSON, hang-ups, GET streams, backend
//! progress and responses, `Last-Event-ID`s of every kind, time within and past the resume
//! window, the backend's stdin stalled while one session floods), each property checked
//! after every step by `switchboard_testkit::resume_model`.
//!
//! Deterministic: seeds `0..SEEDS` of `STEPS` operations. A failure names its seed and
//! prints the shrunk sequence as a scenario script; rerun one seed with
//! `RESUME_SEED=<seed>`, or more seeds with `RESUME_SEEDS=<count>`:
//! `RESUME_SEEDS=20000 cargo test -p switchboard-core --release --test resume_properties`.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;

use switchboard_testkit::resume_model::{random_ops, run, shrink, Op};
use switchboard_testkit::scenario;

const SEEDS: u64 = 300;
const STEPS: usize = 200;

/// What every full run must reach at least `MIN_HITS` times.
const COVERAGE: [&str; 21] = [
    "init",
    "delete",
    "hangup",
    "get",
    "get:replace",
    "priming",
    "post:503",
    "post:admitted-while-stalled",
    "post:admitted-past-full-queue",
    "response:delivered",
    "response:json",
    "response:on-resumed-stream",
    "progress:on-resumed-stream",
    "backend:repeat-answer",
    "resume:replay",
    "resume:replayed-events",
    "resume:replay-after-eviction",
    "resume:lost",
    "resume:400",
    "resume:404",
    "resume:other-session-stream",
];
const MIN_HITS: u64 = 10;

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("RESUME_SEED") {
        return vec![seed.parse().expect("RESUME_SEED is a number")];
    }
    let count = std::env::var("RESUME_SEEDS")
        .map(|n| n.parse().expect("RESUME_SEEDS is a number"))
        .unwrap_or(SEEDS);
    (0..count).collect()
}

/// The outcome of `ops`: its coverage, or its violation (or panic's message).
fn outcome(ops: &[Op]) -> Result<BTreeMap<&'static str, u64>, String> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| run(ops))) {
        Ok(outcome) => match outcome.violation {
            Some(violation) => Err(violation),
            None => Ok(outcome.coverage),
        },
        Err(panic) => Err(format!(
            "panicked: {}",
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default()
        )),
    }
}

#[test]
fn resumption_and_fair_share_hold_after_every_step() {
    let seeds = seeds();
    let full_run = seeds.len() as u64 >= SEEDS;
    let mut coverage: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in seeds {
        let ops = random_ops(seed, STEPS);
        let hits = outcome(&ops).unwrap_or_else(|violation| {
            // Quiet while shrinking: every attempt that fails may panic.
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(|_| {}));
            let small = shrink(&ops);
            std::panic::set_hook(hook);
            let script = std::panic::catch_unwind(|| run(&small).script).unwrap_or_default();
            let small_failure = outcome(&small).err().unwrap_or_default();
            panic!(
                "seed {seed} (rerun with RESUME_SEED={seed}): {violation}\n\
                 shrunk to {} operations: {small_failure}\n{script}",
                small.len()
            );
        });
        for (what, n) in hits {
            *coverage.entry(what).or_default() += n;
        }
    }
    if full_run {
        for what in COVERAGE {
            let hits = coverage.get(what).copied().unwrap_or(0);
            assert!(
                hits >= MIN_HITS,
                "the generator reached {what} {hits} times (at least {MIN_HITS}): {coverage:#?}"
            );
        }
    }
}

/// A run's script is a scenario the scenario runner reads and runs to its end, so a
/// failure's shrunk script reproduces it in `core/tests/scenarios/`.
#[test]
fn scripts_run_as_scenarios() {
    for seed in 0..3 {
        let outcome = run(&random_ops(seed, 60));
        assert!(outcome.violation.is_none(), "{:?}", outcome.violation);
        let transcript = scenario::run(&outcome.script);
        assert!(transcript.lines().count() >= outcome.script.lines().count());
    }
}
