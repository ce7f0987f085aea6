//! Property (SPEC 16's list cache with SPEC 6's isolation): no caller is ever served
//! another caller's filtered view of a list. The backend declares `tools.listChanged`, so
//! the hub keeps its raw `tools/list` pages by cursor and answers later callers from them;
//! every copy must still be filtered for its own caller by the policy (`--authz-config`:
//! each principal may call only the tools starting with its own letter) and, in half the
//! sequences, by the operator's tool view (renames, a hidden tool).
//!
//! Seeded random interleavings of: legacy sessions opened (three principals) and hung up,
//! `tools/list` from them and from 2026-07-28 requests with no session (with and without a
//! cursor, ids colliding across callers), the backend answering any `tools/list` written
//! to it (the proxy's own `switchboard|list:<n>` fetch, its `switchboard|tools:<n>` read
//! for the view, or a caller's forwarded one) with a page listing every principal's tools
//! (or an error), and `notifications/tools/list_changed`. Checked after every step: every
//! list answer a caller receives lists only what its principal may see, and only a caller
//! that asked (under its own id) receives one.
//!
//! Deterministic: seeds `0..SEQUENCES`; rerun one with `LIST_SEED=<seed>`.

use std::collections::BTreeSet;

use serde_json::Value;
use switchboard_core::http::{Admitted, Endpoint, McpHeaders};
use switchboard_core::hub::{Payload, Settings};
use switchboard_core::{Policy, Principal, RequestId, SessionId, StreamId, ToolView};
use switchboard_testkit::driver::{without_id, Answer, Driver};

const SEQUENCES: u64 = 250;
const STEPS: usize = 60;
const PRINCIPALS: [&str; 3] = ["alice", "bob", "carol"];
/// The backend's tools: two of each principal's letter and one nobody may call.
const TOOLS: [&str; 7] = ["a1", "a2", "b1", "b2", "c1", "c2", "z9"];
/// The view's renames (backend name, shown name); `b2` is not shown.
const RENAMES: [(&str, &str); 2] = [("a2", "a2x"), ("c1", "c1x")];
const SHOWN: [&str; 6] = ["a1", "a2x", "b1", "c1x", "c2", "z9"];

fn policy() -> Policy {
    let mut lines: Vec<String> = vec![
        r#"permit(principal, action == Action::\"list_tools\", resource);"#.to_owned(),
        r#"permit(principal, action == Action::\"initialize\", resource);"#.to_owned(),
    ];
    for p in PRINCIPALS {
        for t in TOOLS.iter().filter(|t| t.starts_with(&p[..1])) {
            lines.push(format!(
                r#"permit(principal == Client::\"{p}\", action == Action::\"call_tool\", resource == Tool::\"{t}\");"#
            ));
        }
    }
    let text = format!(
        r#"{{"version":"1.0","type":"cedarv1","cedar":{{"policies":["{}"],"entities_json":"[]"}}}}"#,
        lines.join(r#"",""#)
    );
    Policy::parse(&text).unwrap_or_else(|e| panic!("policy: {e:?}\n{text}"))
}

fn view() -> ToolView {
    let overrides = RENAMES
        .iter()
        .map(|(b, s)| format!(r#""{b}":{{"name":"{s}"}}"#))
        .collect::<Vec<_>>()
        .join(",");
    let shown: Vec<String> = SHOWN.iter().map(|s| (*s).to_owned()).collect();
    ToolView::new(
        &shown,
        Some(&format!(r#"{{"toolsOverride":{{{overrides}}}}}"#)),
    )
    .expect("view")
    .expect("a view")
}

/// The names `principal` may be listed: the oracle, independent of the hub's code.
fn visible(principal: &str, with_view: bool) -> BTreeSet<String> {
    let letter = &principal[..1];
    TOOLS
        .iter()
        .filter(|t| t.starts_with(letter))
        .map(|t| {
            let shown = RENAMES.iter().find(|(b, _)| b == t).map_or(*t, |(_, s)| s);
            if with_view { shown } else { t }.to_owned()
        })
        .filter(|name| !with_view || SHOWN.contains(&name.as_str()))
        .collect()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct Legacy {
    principal: &'static str,
    stream: StreamId,
    sid: SessionId,
    /// Frames of its stream already checked.
    seen: usize,
    next_id: u64,
    /// `tools/list` ids asked and not answered.
    asked: BTreeSet<String>,
}

struct Modern {
    principal: &'static str,
    request: RequestId,
    id: String,
}

#[derive(Default)]
struct Counts {
    answers: usize,
    hits: usize,
    pages: usize,
}

struct Run {
    driver: Driver,
    with_view: bool,
    legacy: Vec<Legacy>,
    modern: Vec<Modern>,
    /// Backend input lines already read.
    read: usize,
    /// The ids of `tools/list` lines written to the backend and not answered yet.
    lists: Vec<Value>,
    entropy: u8,
    counts: Counts,
    log: Vec<String>,
}

impl Run {
    fn entropy(&mut self) -> [u8; 16] {
        self.entropy = self.entropy.checked_add(1).expect("under 256 callers");
        [self.entropy; 16]
    }

    fn open(&mut self, principal: &'static str) {
        let entropy = self.entropy();
        let request = self.driver.request(
            Endpoint::Stream,
            Principal::new(principal),
            "",
            Payload::Bytes(Vec::new()),
            entropy,
        );
        let stream = self.driver.stream_of(request).expect("a legacy stream");
        self.legacy.push(Legacy {
            principal,
            stream,
            sid: SessionId::mint(None, entropy),
            seen: 0,
            next_id: 1,
            asked: BTreeSet::new(),
        });
    }

    fn post(&mut self, at: usize, body: &str) {
        let s = &self.legacy[at];
        let admitted = Admitted::new(
            Endpoint::Messages,
            Principal::new(s.principal),
            s.sid.as_str(),
        );
        let body = Payload::Bytes(body.as_bytes().to_vec());
        self.driver.send(admitted.into_request(body, || [0xee; 16]));
    }

    fn params(cursor: bool, modern: bool) -> String {
        let mut fields = Vec::new();
        if cursor {
            fields.push(r#""cursor":"p2""#.to_owned());
        }
        if modern {
            fields.push(
                r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#
                    .to_owned(),
            );
        }
        format!("{{{}}}", fields.join(","))
    }

    fn legacy_list(&mut self, at: usize, cursor: bool) {
        let s = &mut self.legacy[at];
        let id = s.next_id.to_string();
        s.next_id += 1;
        s.asked.insert(id.clone());
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list","params":{}}}"#,
            Run::params(cursor, false)
        );
        self.post(at, &body);
    }

    fn modern_list(&mut self, principal: &'static str, id: u64, cursor: bool) {
        let entropy = self.entropy();
        let admitted = Admitted {
            mcp: McpHeaders {
                session: None,
                content_type: Some("application/json".into()),
                accept: Some("application/json".into()),
                protocol_version: Some("2026-07-28".into()),
                last_event_id: None,
                fields: vec![("mcp-method".to_owned(), "tools/list".to_owned())],
            },
            ..Admitted::new(Endpoint::McpPost, Principal::new(principal), "")
        };
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list","params":{}}}"#,
            Run::params(cursor, true)
        );
        let request = self
            .driver
            .send(admitted.into_request(Payload::Bytes(body.into_bytes()), || entropy));
        self.modern.push(Modern {
            principal,
            request,
            id: id.to_string(),
        });
    }

    /// Notes every `tools/list` the hub wrote to the backend since the last look.
    fn scan_backend(&mut self) {
        let input = self.driver.backend_input();
        for (_, line) in &input[self.read..] {
            let v: Value = serde_json::from_slice(line).expect("the hub writes JSON");
            if v["method"] == "tools/list" {
                self.lists.push(v["id"].clone());
            }
        }
        self.read = input.len();
    }

    /// The backend answers one `tools/list` written to it.
    fn answer_list(&mut self, rng: &mut Rng) {
        if self.lists.is_empty() {
            return;
        }
        let id = self.lists.remove(rng.below(self.lists.len()));
        let line = if rng.below(8) == 0 {
            serde_json::json!({"jsonrpc":"2.0","id":id,"error":{"code":-32603,"message":"busy"}})
        } else {
            // Every principal's tools, in a shuffled order, sometimes one more page.
            let mut tools: Vec<&str> = TOOLS.to_vec();
            for i in (1..tools.len()).rev() {
                tools.swap(i, rng.below(i + 1));
            }
            let tools: Vec<Value> = tools
                .iter()
                .map(|t| serde_json::json!({"name": t, "inputSchema": {"type": "object"}}))
                .collect();
            let mut result = serde_json::json!({ "tools": tools });
            let paged = id
                .as_str()
                .is_some_and(|s| !s.starts_with("switchboard|tools:"));
            if paged && rng.below(2) == 0 {
                result["nextCursor"] = "p2".into();
            }
            self.counts.pages += 1;
            serde_json::json!({"jsonrpc":"2.0","id":id,"result":result})
        };
        self.driver
            .backend_line(Some(serde_json::to_string(&line).unwrap().as_bytes()));
    }

    /// Checks one answer `v` to a caller of `principal` (a list answer: only what it may see).
    fn check_answer(&mut self, who: &str, principal: &str, v: &Value, backend_step: bool) {
        let Some(tools) = v["result"]["tools"].as_array() else {
            return;
        };
        self.counts.answers += 1;
        if !backend_step {
            self.counts.hits += 1;
        }
        let allowed = visible(principal, self.with_view);
        for t in tools {
            let name = t["name"].as_str().unwrap_or("<no name>");
            assert!(
                allowed.contains(name),
                "{who} ({principal}) was listed {name}, which only another principal may see \
                 (allowed: {allowed:?}); answer {v}\n{}",
                self.log.join("\n")
            );
        }
    }

    /// After every step: every list answer went to a caller that asked, filtered for it.
    fn check(&mut self, backend_step: bool) {
        for at in 0..self.legacy.len() {
            let Some(stream) = self.driver.stream(self.legacy[at].stream) else {
                continue;
            };
            let frames: Vec<Vec<u8>> = stream.frames[self.legacy[at].seen..].to_vec();
            self.legacy[at].seen = stream.frames.len();
            for frame in frames {
                let Some(data) = without_id(&frame)
                    .strip_prefix(b"event: message\ndata: ")
                    .and_then(|r| r.strip_suffix(b"\n\n"))
                else {
                    continue;
                };
                let v: Value = serde_json::from_slice(data).expect("a message is JSON");
                if v.get("method").is_some() {
                    continue;
                }
                let id = v["id"].to_string();
                let s = &mut self.legacy[at];
                let principal = s.principal;
                let is_list = s.asked.remove(&id);
                assert!(
                    is_list,
                    "session {at} ({principal}) received an answer it never asked for: {v}\n{}",
                    self.log.join("\n")
                );
                self.check_answer(&format!("session {at}"), principal, &v, backend_step);
            }
        }
        let mut waiting = Vec::new();
        for m in std::mem::take(&mut self.modern) {
            match self.driver.answer(m.request) {
                None => waiting.push(m),
                Some(Answer::Stream(_)) => panic!("a JSON-only modern request got a stream"),
                Some(Answer::Response(r)) => {
                    if r.status != 200 || r.body.is_empty() {
                        continue;
                    }
                    let v: Value = serde_json::from_slice(&r.body).expect("a JSON answer");
                    assert_eq!(
                        v["id"].to_string(),
                        m.id,
                        "a modern request of {} was answered under another id: {v}",
                        m.principal
                    );
                    self.check_answer("modern request", m.principal, &v, backend_step);
                }
            }
        }
        self.modern = waiting;
    }
}

fn run(seed: u64) -> Counts {
    let mut rng = Rng(seed);
    let with_view = seed % 2 == 1;
    let settings = Settings {
        policy: Some(std::sync::Arc::new(policy())),
        tool_view: with_view.then(|| std::sync::Arc::new(view())),
        ..Settings::default()
    };
    assert!(
        settings.list_cache.is_some(),
        "the list cache is on by default"
    );
    let mut run = Run {
        driver: Driver::new(settings),
        with_view,
        legacy: Vec::new(),
        modern: Vec::new(),
        read: 0,
        lists: Vec::new(),
        entropy: 0,
        counts: Counts::default(),
        log: vec![format!("seed {seed}, view {with_view}")],
    };
    run.driver.take_records();
    run.open(PRINCIPALS[rng.below(3)]);
    run.post(
        0,
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#,
    );
    run.driver.backend_line(Some(
        br#"{"jsonrpc":"2.0","id":"switchboard|initialize:1","result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{"listChanged":true}},"serverInfo":{"name":"demo","version":"1"}}}"#,
    ));
    run.legacy[0].seen = run
        .driver
        .stream(run.legacy[0].stream)
        .unwrap()
        .frames
        .len();
    run.scan_backend();
    for _ in 0..STEPS {
        let live: Vec<usize> = (0..run.legacy.len())
            .filter(|&i| {
                run.driver
                    .stream(run.legacy[i].stream)
                    .is_some_and(|s| s.is_open())
            })
            .collect();
        let op = rng.below(16);
        let backend_step = matches!(op, 8..=13);
        match op {
            0 if run.legacy.len() < 12 => {
                let p = PRINCIPALS[rng.below(3)];
                run.log.push(format!("open {p}"));
                run.open(p);
            }
            1..=4 if !live.is_empty() => {
                let at = live[rng.below(live.len())];
                let cursor = rng.below(3) == 0;
                run.log
                    .push(format!("session {at} tools/list cursor={cursor}"));
                run.legacy_list(at, cursor);
            }
            5..=7 => {
                let p = PRINCIPALS[rng.below(3)];
                let id = rng.below(4) as u64;
                let cursor = rng.below(3) == 0;
                run.log
                    .push(format!("modern {p} id {id} tools/list cursor={cursor}"));
                run.modern_list(p, id, cursor);
            }
            8..=12 => {
                run.log.push("backend answers a tools/list".to_owned());
                run.answer_list(&mut rng);
            }
            13 => {
                run.log.push("backend list_changed".to_owned());
                run.driver.backend_line(Some(
                    br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#,
                ));
            }
            14 if live.len() > 1 => {
                let at = live[rng.below(live.len())];
                run.log.push(format!("session {at} hangs up"));
                let stream = run.legacy[at].stream;
                run.driver.hang_up(stream);
            }
            _ => {}
        }
        run.driver.take_records();
        run.check(backend_step);
        run.scan_backend();
    }
    run.counts
}

#[test]
fn no_caller_is_served_another_callers_view() {
    let seeds: Vec<u64> = match std::env::var("LIST_SEED") {
        Ok(s) => vec![s.parse().expect("LIST_SEED is a number")],
        Err(_) => (0..SEQUENCES).collect(),
    };
    let mut total = Counts::default();
    for seed in &seeds {
        let c = run(*seed);
        total.answers += c.answers;
        total.hits += c.hits;
        total.pages += c.pages;
    }
    if seeds.len() > 1 {
        // The generator reached cache hits (answers with no backend step) often enough.
        assert!(total.hits > 1000, "only {} cache hits", total.hits);
        assert!(total.answers > 3000, "only {} list answers", total.answers);
    }
    eprintln!(
        "{} list answers checked, {} from the cache, {} backend pages",
        total.answers, total.hits, total.pages
    );
}
