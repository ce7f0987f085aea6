//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/*`) through the same property
//! checks the fuzz targets run (`switchboard_testkit::{fuzz, model}`), on stable, so every `cargo
//! test` holds the targets to their properties, and mutates it a little with a fixed seed.
//!
//! The seeds are written by the ignored test `generate_seed_corpus`:
//! `cargo test -p switchboard-core --test fuzz_corpus -- --ignored generate_seed_corpus`.
//! It rewrites only the `seed-*` files; inputs libFuzzer found are kept.

// `core/clippy.toml` keeps clocks and files out of the core library; its tests and benches
// read their inputs and time themselves.
#![allow(clippy::disallowed_methods)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use switchboard_testkit::fuzz::{self as fuzzing, fixture_sid, SHARED_URI};
use switchboard_testkit::model;
use switchboard_testkit::scenario::{self, Command, Labels, PostBody};

/// A target's property check over the fuzzer's bytes.
type Check = fn(&[u8]);

/// Each target's name (its corpus folder) and property check.
const TARGETS: [(&str, Check); 3] = [
    ("client_body", fuzzing::client_body),
    ("backend_line", fuzzing::backend_line),
    ("session_ops", model::session_ops),
];

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

fn corpus_files(target: &str) -> Vec<PathBuf> {
    let dir = corpus_dir(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("readable corpus folder").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

/// Runs `check` on `data`, turning a failed property into `Err(message)`.
fn run(check: fn(&[u8]), data: &[u8]) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| check(data))).map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default()
    })
}

#[test]
fn committed_corpus_holds_every_property() {
    let mut failures = Vec::new();
    for (target, check) in TARGETS {
        let files = corpus_files(target);
        assert!(
            files.len() >= 20,
            "{target}: only {} corpus files; regenerate the seeds",
            files.len()
        );
        for path in files {
            let data = std::fs::read(&path).expect("readable corpus file");
            if let Err(message) = run(check, &data) {
                failures.push(format!("{}: {message}", path.display()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A few thousand cheap mutations of the corpus (byte flips, truncations, splices), with a
/// fixed seed: a small fuzzing run on stable in every test run.
#[test]
fn mutated_corpus_holds_every_property() {
    let mut rng = fastrand::Rng::with_seed(0x005b_0a2d);
    let mut failures = Vec::new();
    for (target, check) in TARGETS {
        let corpus: Vec<Vec<u8>> = corpus_files(target)
            .iter()
            .map(|p| std::fs::read(p).expect("readable corpus file"))
            .collect();
        for _ in 0..600 {
            let mut data = corpus[rng.usize(..corpus.len())].clone();
            for _ in 0..rng.usize(1..4) {
                mutate(&mut rng, &mut data, &corpus);
            }
            if let Err(message) = run(check, &data) {
                failures.push(format!(
                    "{target} {:?}: {message}",
                    String::from_utf8_lossy(&data)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn mutate(rng: &mut fastrand::Rng, data: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    const INTERESTING: [&[u8]; 10] = [
        b"\"",
        b"\\",
        b"|",
        b"\\u0000",
        b"{",
        b"}",
        b"-0",
        b"\n",
        b"\xff",
        b"99999999999999999999",
    ];
    match rng.u8(..5) {
        0 if !data.is_empty() => {
            let at = rng.usize(..data.len());
            data[at] = rng.u8(..);
        }
        1 if !data.is_empty() => data.truncate(rng.usize(..data.len())),
        2 => {
            let at = rng.usize(..=data.len());
            let piece = INTERESTING[rng.usize(..INTERESTING.len())];
            data.splice(at..at, piece.iter().copied());
        }
        3 if !data.is_empty() => {
            let at = rng.usize(..data.len());
            data.remove(at);
        }
        _ => {
            let other = &corpus[rng.usize(..corpus.len())];
            if !other.is_empty() {
                let from = rng.usize(..other.len());
                let to = rng.usize(from..=other.len());
                let at = rng.usize(..=data.len());
                data.splice(at..at, other[from..to].iter().copied());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The seed generator.

#[test]
#[ignore = "writes fuzz/corpus/*/seed-*; run by hand to regenerate the seeds"]
fn generate_seed_corpus() {
    let scenarios = scenario_lines();
    let mut client: Vec<(String, Vec<u8>)> = client_seeds()
        .into_iter()
        .map(|(n, b)| (n.to_owned(), b.into_bytes()))
        .collect();
    client.push((
        "invalid-utf8".into(),
        scenario::unescape(r#"{"jsonrpc":"2.0","id":1,"method":"\xff"}"#),
    ));
    client.extend(pick_scenarios(&scenarios.posts, 25));
    let mut backend: Vec<(String, Vec<u8>)> = backend_seeds()
        .into_iter()
        .map(|(n, b)| (n.to_owned(), b.into_bytes()))
        .collect();
    backend.push((
        "invalid-utf8".into(),
        scenario::unescape(r#"{"jsonrpc":"2.0","method":"\xff"}"#),
    ));
    backend.extend(pick_scenarios(&scenarios.backend, 25));
    let mut failures = write_seeds("client_body", fuzzing::client_body, client);
    failures.extend(write_seeds("backend_line", fuzzing::backend_line, backend));
    failures.extend(write_seeds(
        "session_ops",
        model::session_ops,
        session_seeds(40),
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Replaces the target's `seed-*` files with `seeds` (first of identical contents wins),
/// returning those that fail their property.
fn write_seeds(target: &str, check: fn(&[u8]), seeds: Vec<(String, Vec<u8>)>) -> Vec<String> {
    let dir = corpus_dir(target);
    std::fs::create_dir_all(&dir).expect("corpus folder");
    for path in corpus_files(target) {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with("seed-") {
            std::fs::remove_file(&path).expect("remove an old seed");
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for (name, data) in seeds {
        if !seen.insert(data.clone()) {
            continue;
        }
        if let Err(e) = run(check, &data) {
            failures.push(format!("{target} seed {name} fails: {e}"));
        }
        std::fs::write(dir.join(format!("seed-{name}")), &data).expect("write a seed");
    }
    println!("{target}: {} seeds", seen.len());
    failures
}

fn client_seeds() -> Vec<(&'static str, String)> {
    let req = |id: &str, method: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{}}}}"#)
    };
    let sid = fixture_sid(2);
    vec![
        ("id-zero", req("0", "tools/list")),
        ("id-minus-one", req("-1", "tools/list")),
        ("id-2pow53-plus-1", req("9007199254740993", "tools/list")),
        ("id-40-digits", req(&"1234567890".repeat(4), "tools/list")),
        ("id-negative-40-digits", req(&format!("-{}", "9".repeat(40)), "tools/list")),
        ("id-minus-zero", req("-0", "tools/list")),
        ("id-string-escapes", req(r#""a\"b\\c\u00e9\n\t""#, "tools/list")),
        ("id-string-bars", req(r#""a|n:5|s:x""#, "tools/list")),
        ("id-string-empty", req(r#""""#, "tools/list")),
        ("id-string-unicode", req("\"é😀\"", "tools/list")),
        ("id-string-surrogate-pair", req(r#""\ud83d\ude00""#, "tools/list")),
        ("id-string-lone-surrogate", req(r#""\ud800""#, "tools/list")),
        ("id-spoofed-routed", req(&format!(r#""{sid}|n:1""#), "tools/list")),
        ("id-proxy-like", req(r#""switchboard|ping:1""#, "tools/list")),
        ("id-257-bytes", req(&format!("\"{}\"", "a".repeat(255)), "tools/list")),
        ("id-null", req("null", "tools/list")),
        ("id-fraction", req("1.5", "tools/list")),
        ("id-exponent", req("1e3", "tools/list")),
        ("id-bool", req("true", "tools/list")),
        ("id-object", req(r#"{"a":1}"#, "tools/list")),
        ("id-array", req("[1]", "tools/list")),
        ("duplicate-id", r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"x"}"#.into()),
        ("duplicate-nested", r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"_meta":{"a":1,"\u0061":2}}}"#.into()),
        ("batch", r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#.into()),
        ("not-json", "{\"jsonrpc\":\"2.0\",".into()),
        ("not-object", "\"2.0\"".into()),
        ("version-1", r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#.into()),
        ("version-escaped", r#"{"jsonrpc":"\u0032.0","id":1,"method":"ping"}"#.into()),
        ("client-response", r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.into()),
        ("method-and-result", r#"{"jsonrpc":"2.0","id":1,"method":"x","result":{}}"#.into()),
        ("method-not-string", r#"{"jsonrpc":"2.0","id":1,"method":5}"#.into()),
        ("no-method", r#"{"jsonrpc":"2.0","id":1}"#.into()),
        ("cancelled-int", r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"user"}}"#.into()),
        ("cancelled-string", r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"a|b"}}"#.into()),
        ("cancelled-spoofed", format!(r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":"{sid}|n:1"}}}}"#)),
        ("cancelled-null", r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":null}}"#.into()),
        ("cancelled-as-request", r#"{"jsonrpc":"2.0","id":3,"method":"notifications/cancelled","params":{"requestId":1}}"#.into()),
        ("progress-int", r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"progressToken":7}}}"#.into()),
        ("progress-string", r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"_meta":{"progressToken":"p|q","x":1},"name":"t"}}"#.into()),
        ("progress-big", r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"_meta":{"progressToken":-9223372036854775809}}}"#.into()),
        ("progress-object", r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"_meta":{"progressToken":{"t":1}}}}"#.into()),
        ("progress-in-notification", format!(r#"{{"jsonrpc":"2.0","method":"notifications/custom","params":{{"_meta":{{"progressToken":"{sid}|n:1"}}}}}}"#)),
        ("progress-not-meta", r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"progressToken":1,"arguments":{"_meta":{"progressToken":1}}}}"#.into()),
        ("initialize", r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{"sampling":{},"roots":{"listChanged":true}},"clientInfo":{"name":"c","version":"1"}}}"#.into()),
        ("initialize-string-id", r#"{"jsonrpc":"2.0","id":"a&b","method":"initialize","params":{"capabilities":{"sampling":{}}}}"#.into()),
        ("initialize-no-params", r#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#.into()),
        ("initialize-notification", r#"{"jsonrpc":"2.0","method":"initialize","params":{"capabilities":{}}}"#.into()),
        ("initialized", r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.into()),
        ("initialized-as-request", r#"{"jsonrpc":"2.0","id":9,"method":"notifications/initialized"}"#.into()),
        ("subscribe", r#"{"jsonrpc":"2.0","id":6,"method":"resources/subscribe","params":{"uri":"file:///a"}}"#.into()),
        ("unsubscribe-shared", format!(r#"{{"jsonrpc":"2.0","id":7,"method":"resources/unsubscribe","params":{{"uri":"{SHARED_URI}"}}}}"#)),
        ("unsubscribe-shared-escaped", r#"{"jsonrpc":"2.0","id":"u","method":"resources/unsubscribe","params":{"uri":"file:\/\/\/shared"}}"#.into()),
        ("unsubscribe-other", r#"{"jsonrpc":"2.0","id":8,"method":"resources/unsubscribe","params":{"uri":"file:///other"}}"#.into()),
        ("crlf-whitespace", "{\r\n  \"jsonrpc\": \"2.0\",\r\n  \"id\": 1,\r\n  \"method\": \"tools/list\"\r\n}\r\n".into()),
        ("tabs", "{\"jsonrpc\":\"2.0\",\t\"id\":2,\t\"method\":\"tools/list\"}".into()),
        ("deep-params", format!(r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{}1{}}}"#, "[".repeat(100), "]".repeat(100))),
        ("huge-exponent", r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"n":1e400}}"#.into()),
        ("related-task-call", r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"io.modelcontextprotocol/related-task":{"taskId":"task-A"}}}}"#.into()),
        ("related-task-escaped", r#"{"jsonrpc":"2.0","id":2,"method":"ping","params":{"_meta":{"io.modelcontextprotocol\/related-t\u0061sk":{"taskId":7}}}}"#.into()),
        ("related-task-list", r#"{"jsonrpc":"2.0","id":3,"method":"tasks/list","params":{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"task-A"}}}}"#.into()),
        ("related-task-initialize", r#"{"jsonrpc":"2.0","id":4,"method":"initialize","params":{"capabilities":{},"_meta":{"io.modelcontextprotocol/related-task":{}}}}"#.into()),
        ("related-task-unsubscribe", r#"{"jsonrpc":"2.0","id":5,"method":"resources/unsubscribe","params":{"uri":"file:///shared","_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t"}}}}"#.into()),
        ("related-task-set-level", r#"{"jsonrpc":"2.0","id":6,"method":"logging/setLevel","params":{"level":"debug","_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t"}}}}"#.into()),
        ("related-task-cancelled", r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"task-A"}}}}"#.into()),
        ("related-task-initialized", r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"task-A"}}}}"#.into()),
    ]
}

fn backend_seeds() -> Vec<(&'static str, String)> {
    let (a, b, c, d) = (
        fixture_sid(1),
        fixture_sid(2),
        fixture_sid(3),
        fixture_sid(4),
    );
    let escaped_a: String = format!("{a}|n:1")
        .encode_utf16()
        .map(|u| format!("\\u{u:04x}"))
        .collect();
    vec![
        ("response-a-int", format!(r#"{{"jsonrpc":"2.0","id":"{a}|n:1","result":{{"content":[]}}}}"#)),
        ("response-a-string-bars", format!(r#"{{"jsonrpc":"2.0","id":"{a}|s:x|y","result":{{}}}}"#)),
        ("response-a-big", format!(r#"{{"jsonrpc":"2.0","id":"{a}|n:9007199254740993","result":{{}}}}"#)),
        ("response-a-escaped", format!(r#"{{"jsonrpc":"2.0","id":"{escaped_a}","result":{{}}}}"#)),
        ("response-a-error", format!(r#"{{"jsonrpc":"2.0","id":"{a}|n:1","error":{{"code":-32000,"message":"no"}}}}"#)),
        ("response-a-extra-members", format!(r#"{{"extra":[1,{{"x":null}}],"id":"{a}|n:1","jsonrpc":"2.0","result":{{}}}}"#)),
        ("response-b-collides", format!(r#"{{"jsonrpc":"2.0","id":"{b}|n:1","result":{{}}}}"#)),
        ("response-b-string", format!(r#"{{"jsonrpc":"2.0","id":"{b}|s:init-b","result":{{}}}}"#)),
        ("response-closed-d", format!(r#"{{"jsonrpc":"2.0","id":"{d}|n:5","result":{{}}}}"#)),
        ("response-unknown-sid", r#"{"jsonrpc":"2.0","id":"00000000-0000-4000-8000-000000000000|n:1","result":{}}"#.into()),
        ("response-bad-kind", format!(r#"{{"jsonrpc":"2.0","id":"{a}|x:1","result":{{}}}}"#)),
        ("response-bad-digits", format!(r#"{{"jsonrpc":"2.0","id":"{a}|n:1.5","result":{{}}}}"#)),
        ("response-int-id", r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.into()),
        ("response-null-id", r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse"}}"#.into()),
        ("initialize-answer", format!(r#"{{"jsonrpc":"2.0","id":"{c}|n:0","result":{{"protocolVersion":"2024-11-05","capabilities":{{}},"serverInfo":{{"name":"s","version":"1"}}}}}}"#)),
        ("initialize-error", format!(r#"{{"jsonrpc":"2.0","id":"{c}|n:0","error":{{"code":-32602,"message":"bad"}}}}"#)),
        ("initialize-answer-extra", format!(r#"{{"id":"{c}|n:0","result":{{}},"extra":1}}"#)),
        ("proxy-ping-answer", r#"{"jsonrpc":"2.0","id":"switchboard|ping:1","result":{}}"#.into()),
        ("proxy-ping-unknown", r#"{"jsonrpc":"2.0","id":"switchboard|ping:99","result":{}}"#.into()),
        ("proxy-unsubscribe-answer", r#"{"jsonrpc":"2.0","id":"switchboard|unsubscribe:1","result":{}}"#.into()),
        ("tools-list-changed", r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#.into()),
        ("resources-list-changed-params", r#"{"jsonrpc":"2.0","method":"notifications/resources/list_changed","params":{"_meta":{"inject":"<script>"}}}"#.into()),
        ("prompts-list-changed-escaped", r#"{"jsonrpc":"2.0","method":"notifications\/prompts\/list_changed"}"#.into()),
        ("progress-a", format!(r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"{a}|n:7","progress":1,"total":2}}}}"#)),
        ("progress-b-string", format!(r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"{b}|s:p","progress":1}}}}"#)),
        ("progress-closed-d", format!(r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"{d}|n:5","progress":1}}}}"#)),
        ("progress-unrouted", r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":7,"progress":1}}"#.into()),
        ("updated-a", r#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///a"}}"#.into()),
        ("updated-b", r#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///b","title":"x"}}"#.into()),
        ("updated-closed-d", r#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///d"}}"#.into()),
        ("updated-a-meta", r#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t"}},"uri":"file:\/\/\/a"}}"#.into()),
        ("log-message", r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"secret"}}"#.into()),
        ("ping-request", r#"{"jsonrpc":"2.0","id":42,"method":"ping"}"#.into()),
        ("ping-request-object-id", "{\"jsonrpc\":\"2.0\",\"id\":{\"a\":\r\n[1]},\"method\":\"ping\"}".into()),
        ("sampling-request", r#"{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":{"messages":[]}}"#.into()),
        ("roots-request", r#"{"jsonrpc":"2.0","id":-0,"method":"roots/list"}"#.into()),
        ("elicitation-request", r#"{"jsonrpc":"2.0","id":1e400,"method":"elicitation/create"}"#.into()),
        ("batch", format!(r#"[{{"jsonrpc":"2.0","id":"{a}|n:1","result":{{}}}}]"#)),
        ("duplicate-id", format!(r#"{{"jsonrpc":"2.0","id":"{a}|n:1","id":"{b}|n:1","result":{{}}}}"#)),
        ("not-json", "{\"jsonrpc\":".into()),
        ("crlf", format!("{{\"jsonrpc\":\"2.0\",\"id\":\"{a}|n:1\",\"result\":{{}}}}\r")),
    ]
}

/// The bytes of the scenario files' POST bodies (`/messages` and `/mcp`) and backend
/// lines, expanded by the scenario language's own parser and labels (so `<A>` is usually
/// `fixture_sid(1)`).
struct ScenarioLines {
    posts: Vec<(String, Vec<u8>)>,
    backend: Vec<(String, Vec<u8>)>,
}

fn scenario_lines() -> ScenarioLines {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut out = ScenarioLines {
        posts: Vec::new(),
        backend: Vec::new(),
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return out;
    };
    let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    for path in files {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("x")
            .to_owned();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut labels = Labels::default();
        for line in scenario::parse(&text) {
            let name = format!("scenario-{stem}-{}", line.number);
            match line.command {
                Some(Command::Open { label, .. }) => {
                    labels.sid(&label);
                }
                Some(Command::Post { label, body, .. }) => {
                    labels.sid(&label);
                    let bytes = match body {
                        PostBody::Text(text) => labels.expand(&text).into_bytes(),
                        PostBody::Raw(text) => scenario::unescape(&labels.expand(&text)),
                        PostBody::TooLarge => continue,
                    };
                    out.posts.push((name, bytes));
                }
                Some(Command::PostSid { body, .. }) => {
                    out.posts.push((name, labels.expand(&body).into_bytes()));
                }
                Some(Command::Mcp(command)) => {
                    if let Some(label) = &command.label {
                        labels.sid(label);
                    }
                    // Streamable POST bodies are message bodies like any other.
                    if let Some(body) = command.body.filter(|b| !b.starts_with('\0')) {
                        if command.method == "POST" {
                            out.posts.push((name, labels.expand(&body).into_bytes()));
                        }
                    }
                }
                Some(Command::Backend { line, raw }) => {
                    let text = labels.expand(&line);
                    let bytes = if raw {
                        scenario::unescape(&text)
                    } else {
                        text.into_bytes()
                    };
                    out.backend.push((name, bytes));
                }
                _ => {}
            }
        }
    }
    out
}

/// Up to `max` lines, spread evenly over the scenario files' order, at most 2 KiB each.
fn pick_scenarios(lines: &[(String, Vec<u8>)], max: usize) -> Vec<(String, Vec<u8>)> {
    let small: Vec<&(String, Vec<u8>)> = lines.iter().filter(|(_, b)| b.len() <= 2048).collect();
    let step = small.len().div_ceil(max.max(1)).max(1);
    small.into_iter().step_by(step).cloned().collect()
}

/// `session_ops` inputs are `arbitrary` byte strings, which have no inverse. A small
/// coverage-guided search with a fixed seed stands in: random inputs, then mutations
/// (appended bytes, concatenations) of those kept, keeping any input that adds a step
/// label or a pair of consecutive labels. The seeds are then the fewest inputs covering
/// what was found, shortest first: opening, posting, answers, progress, subscriptions,
/// spoofing and restarts.
fn session_seeds(max: usize) -> Vec<(String, Vec<u8>)> {
    let mut rng = fastrand::Rng::with_seed(0x0005_e551_0115);
    let features = |data: &[u8]| -> std::collections::BTreeSet<String> {
        let labels = model::check_ops(&model::decode_ops(data));
        let pairs = labels.windows(2).map(|w| format!("{} -> {}", w[0], w[1]));
        labels.iter().cloned().chain(pairs).collect()
    };
    let mut covered = std::collections::BTreeSet::new();
    let mut pool: Vec<(Vec<u8>, std::collections::BTreeSet<String>)> = Vec::new();
    for round in 0..30_000 {
        let data: Vec<u8> = if round < 3_000 || pool.is_empty() {
            let len = rng.usize(4..120);
            (0..len).map(|_| rng.u8(..)).collect()
        } else {
            let mut data = pool[rng.usize(..pool.len())].0.clone();
            if rng.bool() {
                let extra = rng.usize(1..40);
                data.extend((0..extra).map(|_| rng.u8(..)));
            } else {
                data.extend_from_slice(&pool[rng.usize(..pool.len())].0);
            }
            if data.len() > 600 {
                continue;
            }
            data
        };
        let found = features(&data);
        if found.iter().any(|f| !covered.contains(f)) {
            covered.extend(found.iter().cloned());
            pool.push((data, found));
        }
    }
    // Greedy cover: repeatedly take the input adding the most uncovered features.
    let mut seeds = Vec::new();
    let mut left = covered.clone();
    while seeds.len() < max && !left.is_empty() {
        let best = pool
            .iter()
            .enumerate()
            .max_by_key(|(_, (data, f))| {
                (f.intersection(&left).count(), std::cmp::Reverse(data.len()))
            })
            .map(|(i, _)| i)
            .expect("the pool covers every feature");
        let (data, f) = pool.swap_remove(best);
        left.retain(|x| !f.contains(x));
        seeds.push(data);
    }
    let labels: std::collections::BTreeSet<&str> = covered
        .iter()
        .filter(|f| !f.contains(" -> "))
        .map(String::as_str)
        .collect();
    println!(
        "session_ops: {} features found, {} uncovered by the seeds; step labels:",
        covered.len(),
        left.len()
    );
    for label in labels {
        println!("  {label}");
    }
    seeds
        .into_iter()
        .enumerate()
        .map(|(i, data)| (format!("search-{i:02}"), data))
        .collect()
}

/// `session_ops` inputs that reach SPEC section 15's task operations deeply: tasks created
/// for sessions of both transports and a modern request's principal, asked for by their
/// owners and others (forwarded, refused), listed with pages of everybody's tasks and
/// cursors sent back (their own, another's), status notifications, a ttl running out, an
/// owner's oldest task forgotten, a session's end and a backend exit. Random bytes seldom
/// get that far, so they are written with `arbitrary`'s own encoding ([`Enc`]) of chosen
/// operations, as `tasks-*` (kept by `generate_seed_corpus`), each checked to reach the
/// labels it was written for.
/// `cargo test -p switchboard-core --test fuzz_corpus -- --ignored generate_task_corpus`.
#[test]
#[ignore = "writes fuzz/corpus/session_ops/tasks-*; run by hand to regenerate them"]
fn generate_task_corpus() {
    let dir = corpus_dir("session_ops");
    for (n, (wanted, data)) in task_inputs().into_iter().enumerate() {
        let labels = model::check_ops(&model::decode_ops(&data));
        for label in wanted {
            assert!(
                labels.iter().any(|l| l.starts_with(label)),
                "tasks-{n:02} misses {label}: {labels:#?}"
            );
        }
        std::fs::write(dir.join(format!("tasks-{n:02}")), &data).expect("write");
        println!("tasks-{n:02}: {labels:?}");
    }
}

/// `arbitrary` 1's encoding, written: a `Vec` taken from the rest is (1, element)*; an
/// enum's variant is a little-endian u32 scaled over the variants; integers are
/// little-endian; a bool is a byte's low bit; an `Option` a bool then the value.
#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn op(&mut self, variant: u32) -> &mut Self {
        self.0.push(1);
        self.variant(variant, OP_VARIANTS)
    }
    fn variant(&mut self, i: u32, count: u32) -> &mut Self {
        let v = ((2 * u64::from(i) + 1) << 32) / (2 * u64::from(count));
        self.0.extend_from_slice(&(v as u32).to_le_bytes());
        self
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A task operation (`Op::Task`, then `TaskOp`'s variant).
    fn task(&mut self, variant: u32) -> &mut Self {
        self.op(OP_TASK).variant(variant, 5)
    }
    /// A `TaskCaller`: a slot (0) or a modern principal (1), accepting JSON.
    fn caller(&mut self, kind: u32, n: u8) -> &mut Self {
        self.variant(kind, 3).u8(n).variant(1, 3)
    }
    /// A request with a small id, no uri, request id or token.
    fn call(&mut self, id: i8, method: u32) -> &mut Self {
        self.variant(0, 3)
            .variant(0, 10)
            .u8(id as u8)
            .variant(method, 10);
        self.u8(0).u8(0).u8(0)
    }
}

/// `Op`'s variants, and the ones the task inputs use.
const OP_VARIANTS: u32 = 20;
const OP_OPEN: u32 = 0;
const OP_CLOSE: u32 = 1;
const OP_POST: u32 = 2;
const OP_EXIT: u32 = 6;
const OP_MCP_INIT: u32 = 9;
const OP_MCP_POST: u32 = 10;
const OP_MCP_GET: u32 = 11;
const OP_WAIT: u32 = 14;
const OP_MODERN: u32 = 15;
const OP_TASK: u32 = 19;
/// `TaskOp`'s variants.
const CREATE: u32 = 0;
const ASK: u32 = 1;
const LIST: u32 = 2;
const PAGE: u32 = 3;
const STATUS: u32 = 4;
/// `TaskPick`'s variants (of 5), `CursorPick`'s (of 4), `TaskCaller`'s (of 3).
const OWN: u32 = 0;
const FOREIGN: u32 = 1;
const FORGOTTEN: u32 = 2;
const MINE: u32 = 1;
const OTHERS: u32 = 2;
const SLOT: u32 = 0;
const MODERN: u32 = 1;

/// The task inputs, each with the labels it must reach.
fn task_inputs() -> Vec<(Vec<&'static str>, Vec<u8>)> {
    let mut inputs = Vec::new();
    // Two legacy sessions: the owner's ask forwarded, the other's refused; a page of both
    // sessions' tasks shows each only its own; the cursor minted for one sent back; a
    // status to the owner; the owner leaves and its task is forgotten.
    let mut e = Enc::default();
    e.op(OP_OPEN).u8(0).u8(0);
    e.op(OP_POST).u8(0).u8(0).call(1, 0);
    e.task(CREATE).u16(0).u8(0).u8(0);
    e.task(ASK).caller(SLOT, 0).u8(0).variant(OWN, 5).u8(0);
    e.op(OP_OPEN).u8(1).u8(1);
    e.op(OP_POST).u8(1).u8(0).call(2, 0);
    // Routed ids so far: the first post's, the own ask's, this post's.
    e.task(CREATE).u16(2).u8(1).u8(0);
    e.task(ASK).caller(SLOT, 1).u8(1).variant(FOREIGN, 5).u8(0);
    e.task(LIST).caller(SLOT, 1).u8(0);
    e.task(PAGE)
        .u16(1)
        .u8(0)
        .u8(1)
        .u8(2)
        .u8(3)
        .u8(4)
        .u8(4)
        .u8(0);
    e.task(LIST).caller(SLOT, 1).u8(1).variant(MINE, 4).u8(0);
    e.task(STATUS).u8(0);
    e.op(OP_CLOSE).u8(0);
    e.task(ASK)
        .caller(SLOT, 1)
        .u8(2)
        .variant(FORGOTTEN, 5)
        .u8(0);
    inputs.push((
        vec![
            "task-create:session:delivered",
            "task-ask:own:legacy:forwarded",
            "task-ask:foreign:legacy:refused",
            "task-list:none:legacy:forwarded",
            "task-page:shown-some",
            "task-list:mine:legacy:forwarded",
            "task-status:delivered",
            "task-ask:forgotten:legacy:refused",
        ],
        e.0,
    ));
    // A Streamable session and a modern request's principal: each its own tasks; the
    // status on the GET stream; the principal's page; another's cursor refused; a ttl
    // runs out; a backend exit forgets everything.
    let mut e = Enc::default();
    e.op(OP_MCP_INIT)
        .u8(2)
        .u8(0)
        .variant(0, 10)
        .u8(0)
        .variant(1, 3)
        .u8(1);
    e.op(OP_MCP_POST).u8(2).u8(0).variant(1, 3).call(1, 0);
    e.task(CREATE).u16(0).u8(3).u8(0);
    e.op(OP_MCP_GET).u8(2).u8(0);
    e.task(STATUS).u8(0);
    e.op(OP_MODERN)
        .u8(1)
        .variant(0, 10)
        .u8(3)
        .variant(1, 3)
        .u8(0);
    e.task(CREATE).u16(1).u8(4).u8(0);
    e.task(ASK).caller(MODERN, 1).u8(0).variant(OWN, 5).u8(0);
    e.task(ASK)
        .caller(MODERN, 2)
        .u8(0)
        .variant(FOREIGN, 5)
        .u8(0);
    e.task(ASK).caller(SLOT, 2).u8(1).variant(FOREIGN, 5).u8(0);
    e.task(LIST).caller(MODERN, 1).u8(0);
    e.task(PAGE)
        .u16(1)
        .u8(0)
        .u8(1)
        .u8(2)
        .u8(3)
        .u8(4)
        .u8(4)
        .u8(0);
    e.task(LIST).caller(SLOT, 2).u8(1).variant(OTHERS, 4).u8(0);
    e.op(OP_WAIT).u8(16);
    e.task(ASK).caller(SLOT, 2).u8(0).variant(OWN, 5).u8(0);
    e.op(OP_EXIT);
    e.task(STATUS).u8(1);
    inputs.push((
        vec![
            "task-create:session:delivered",
            "task-status:delivered",
            "task-create:principal:delivered",
            "task-ask:own:modern:forwarded",
            "task-ask:foreign:modern:refused",
            "task-ask:foreign:mcp:refused",
            "task-list:none:modern:forwarded",
            "task-page:shown-some",
            "task-list:others:mcp:refused",
            "task-ask:own:mcp:refused",
        ],
        e.0,
    ));
    // One owner past --max-tasks-per-owner (its oldest forgotten), an id over 256 bytes
    // (nobody's), pages that cannot be filtered or are errors, a status naming a number.
    let mut e = Enc::default();
    e.op(OP_OPEN).u8(0).u8(0);
    for id in 1..=4 {
        e.op(OP_POST).u8(0).u8(0).call(id, 0);
    }
    for pick in 0..4 {
        e.task(CREATE).u16(pick).u8(1).u8(0);
    }
    e.task(CREATE).u16(0).u8(0).u8(1);
    e.task(ASK).caller(SLOT, 0).u8(0).variant(OWN, 5).u8(0);
    e.task(ASK)
        .caller(SLOT, 0)
        .u8(1)
        .variant(FORGOTTEN, 5)
        .u8(0);
    e.task(LIST).caller(SLOT, 0).u8(0);
    e.task(PAGE)
        .u16(1)
        .u8(0)
        .u8(1)
        .u8(2)
        .u8(3)
        .u8(4)
        .u8(3)
        .u8(6);
    e.task(LIST).caller(SLOT, 0).u8(0);
    e.task(PAGE)
        .u16(1)
        .u8(0)
        .u8(1)
        .u8(2)
        .u8(3)
        .u8(4)
        .u8(3)
        .u8(7);
    e.task(STATUS).u8(255);
    inputs.push((
        vec![
            "task-create:session:delivered:long",
            "task-ask:own:legacy:forwarded",
            "task-ask:forgotten:legacy:refused",
            "task-page:error",
            "task-status:nobody",
        ],
        e.0,
    ));
    inputs
}
