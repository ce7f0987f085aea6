//! Messages per second through the hub: a ~200-byte `tools/call` POSTed to a legacy
//! session, its ~300-byte result back as a backend line, on one thread (the router's
//! rewrite and routing with everything the hub does around them).
//!
//! `cargo bench -p switchboard-core` prints the best of several rounds.

// `core/clippy.toml` keeps clocks and files out of the core library; its tests and benches
// read their inputs and time themselves.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use switchboard_core::http::{Admitted, Endpoint};
use switchboard_core::hub::{Payload, Settings};
use switchboard_core::{Frame, Hub, Output, Principal};

const ROUND_TRIPS: u64 = 500_000;
const ROUNDS: usize = 5;

fn main() {
    // `ROUTER_BENCH_ROUND_TRIPS=20000 valgrind --tool=callgrind <bench>` counts instructions
    // per message, repeatable on a busy machine.
    let round_trips: u64 = std::env::var("ROUTER_BENCH_ROUND_TRIPS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(ROUND_TRIPS);
    let rounds = if round_trips == ROUND_TRIPS {
        ROUNDS
    } else {
        1
    };
    let principal = Principal::new("alice");
    let now = Instant::now();
    let mut hub = Hub::new(Settings::default(), now);
    let Some(Output::SpawnBackend { backend }) = hub.poll_output() else {
        unreachable!("a new hub starts its backend")
    };
    hub.handle_backend_spawned(now, backend, 1);
    while hub.poll_output().is_some() {}
    let sid_text: Vec<String> = (0..16u8)
        .map(|i| {
            let open = Admitted::new(Endpoint::Stream, principal.clone(), "");
            let entropy = [i.wrapping_mul(37).wrapping_add(1); 16];
            hub.handle_request(
                now,
                open.into_request(Payload::Bytes(Vec::new()), || entropy),
            );
            let mut sid = String::new();
            while let Some(output) = hub.poll_output() {
                if let Output::ToStream { frame, .. } = output {
                    let text = String::from_utf8_lossy(frame.as_ref()).into_owned();
                    sid = text
                        .split("session_id=")
                        .nth(1)
                        .unwrap_or_default()
                        .trim()
                        .to_owned();
                }
            }
            sid
        })
        .collect();
    let sessions = sid_text.clone();

    let request = |id: u64| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"get_current_time","arguments":{{"timezone":"Europe/Amsterdam","format":"iso8601"}},"_meta":{{"progressToken":{id}}}}}}}"#
        )
    };
    let result_tail = r#","result":{"content":[{"type":"text","text":"{\"timezone\":\"Europe/Amsterdam\",\"datetime\":\"2026-12-02T12:34:56+01:00\",\"is_dst\":false}"}],"structuredContent":{"timezone":"Europe/Amsterdam","is_dst":false},"isError":false}}"#;
    println!(
        "request {} bytes, result {} bytes",
        request(1000).len(),
        r#"{"jsonrpc":"2.0","id":"00000000-0000-4000-8000-000000000000|n:1000""#.len()
            + result_tail.len()
    );

    let bodies: Vec<String> = (0..1000).map(request).collect();
    let mut best = Duration::MAX;
    let mut line = Vec::with_capacity(512);
    for _ in 0..rounds {
        let start = Instant::now();
        for i in 0..round_trips {
            let s = (i % sessions.len() as u64) as usize;
            let body = &bodies[(i % 1000) as usize];
            let post = Admitted::new(Endpoint::Messages, principal.clone(), &sid_text[s]);
            hub.handle_request(
                now,
                post.into_request(Payload::Bytes(body.as_bytes().to_vec()), || [0; 16]),
            );
            let mut rewritten = Vec::new();
            while let Some(output) = hub.poll_output() {
                if let Output::ToBackend { line, .. } = output {
                    rewritten = line;
                }
            }
            hub.handle_backend_wrote(now, backend, 1);
            // The backend echoes the routed id: cut it out of the rewritten line.
            let id_start = memchr_find(&rewritten, b"\"id\":") + 5;
            let id_end = id_start + 1 + memchr_find(&rewritten[id_start + 1..], b"\"") + 1;
            line.clear();
            line.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
            line.extend_from_slice(&rewritten[id_start..id_end]);
            line.extend_from_slice(result_tail.as_bytes());
            hub.handle_backend_lines(now, backend, [Some(&line)]);
            match hub.poll_output() {
                Some(Output::ToStream {
                    frame: Frame::Owned(message),
                    ..
                }) => {
                    black_box(message);
                }
                other => panic!("expected a delivery, got {other:?}"),
            }
        }
        best = best.min(start.elapsed());
    }
    let messages = 2 * round_trips;
    let per_second = messages as f64 / best.as_secs_f64();
    println!(
        "hub: {messages} messages ({round_trips} round trips) in {best:?} (best of {rounds}): {:.0} messages/s, {:.0} ns/message",
        per_second,
        best.as_nanos() as f64 / messages as f64
    );
}

fn memchr_find(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("needle present")
}
