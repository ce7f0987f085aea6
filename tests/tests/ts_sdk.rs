//! Interop with the official TypeScript SDK client (`Client` +
//! `StreamableHTTPClientTransport`, `tests/node/streamable-client.mjs`) on Streamable HTTP
//! `/mcp` of each binary, against the real `mcp-server-time` and against the built-in demo
//! backend. Two SDK clients run at once, each making several calls at once, while a legacy
//! client on `/sse` keeps calling with the same ids (and, on the demo, the same progress
//! token): every side must get exactly its own answers and nothing of the others'.
//!
//! Against `test-backend`, SDK clients keep their sessions and subscriptions while the
//! backend is killed and restarted (SPEC 12, `tests/node/restart-client.mjs`).
//!
//! Needs the pinned Node packages (`tests/run.sh` installs them into `tests/node`) and, for
//! `mcp-server-time`, `SWITCHBOARD_PYTHON`; without them the tests skip loudly, or fail
//! when `CI=true`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchboard_tests::{node, open_session, suite, Node, Proxy, Session, Target};

/// The ids the legacy client uses in every round: they cover every id the SDK clients use
/// (0 for initialize, 1 for tools/list, 2.. for the calls).
const LEGACY_IDS: std::ops::Range<u64> = 0..6;

/// Rounds of legacy calls made while the SDK clients run (one round takes milliseconds).
const MAX_ROUNDS: u64 = 300;

/// How long the legacy side keeps calling before it just waits for the SDK clients.
const ROUNDS_BUDGET: Duration = Duration::from_secs(60);

/// How long the SDK clients may take in all (the script gives up after 60 s itself).
const SDK_TIMEOUT: Duration = Duration::from_secs(90);

/// How long `restart-client.mjs` may take in all (it gives up after 150 s itself).
const RESTART_TIMEOUT: Duration = Duration::from_secs(180);

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");

/// One `tools/call`.
#[derive(Clone)]
struct Call {
    tool: &'static str,
    args: Value,
    /// The number of progress notifications the call reports when it asks for them.
    progress: Option<u64>,
}

impl Call {
    fn new(tool: &'static str, args: Value) -> Call {
        Call {
            tool,
            args,
            progress: None,
        }
    }
}

/// Whether `result` is the right answer to `tool` called with `args`.
type Check = fn(&str, &Value, &Value) -> Result<(), String>;

/// `mcp-server-time` beside `$SWITCHBOARD_PYTHON`, or `None` (after saying why) when the
/// test must skip; panics under `CI=true`.
fn mcp_server_time() -> Option<PathBuf> {
    let why = match std::env::var_os("SWITCHBOARD_PYTHON") {
        None => "SWITCHBOARD_PYTHON is not set (run tests/run.sh)".to_owned(),
        Some(python) => {
            let exe = PathBuf::from(&python).with_file_name("mcp-server-time");
            if exe.is_file() {
                return Some(exe);
            }
            format!("{} does not exist", exe.display())
        }
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("the TypeScript SDK test against mcp-server-time cannot run in CI: {why}");
    }
    let msg = format!(
        "\n**********\nSKIPPED: TypeScript SDK interop with mcp-server-time: {why}\n**********\n"
    );
    let _ = std::io::stderr().write_all(msg.as_bytes());
    None
}

fn time_check(tool: &str, args: &Value, result: &Value) -> Result<(), String> {
    if tool != "get_current_time" || result["isError"] == true {
        return Err(format!("{tool}: {result}"));
    }
    let text = result["content"][0]["text"]
        .as_str()
        .ok_or_else(|| format!("no text content: {result}"))?;
    let time: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e}): {text}"))?;
    if time["timezone"] != args["timezone"] || !time["datetime"].is_string() {
        return Err(format!("asked for {}, got {text}", args["timezone"]));
    }
    Ok(())
}

fn demo_check(tool: &str, args: &Value, result: &Value) -> Result<(), String> {
    let text = match tool {
        "echo" => args["text"].as_str().unwrap_or_default().to_owned(),
        "add" => (args["a"].as_i64().unwrap_or_default() + args["b"].as_i64().unwrap_or_default())
            .to_string(),
        "countdown" => format!("counted down from {}", args["n"]),
        _ => return Err(format!("no such demo tool {tool}")),
    };
    let want = json!({"content": [{"type": "text", "text": text}], "isError": false});
    if *result != want {
        return Err(format!("{tool} {args}: want {want}, got {result}"));
    }
    Ok(())
}

/// Sends `calls` under their ids at once on the legacy session, then reads exactly the
/// messages they cause (responses and progress, in any order between calls) and checks each
/// is one of them and right.
fn legacy_round(s: &mut Session, calls: &BTreeMap<u64, Call>, check: Check) {
    for (id, call) in calls {
        let mut params = json!({"name": call.tool, "arguments": call.args});
        if call.progress.is_some() {
            params["_meta"] = json!({"progressToken": id});
        }
        s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}));
    }
    let expected: u64 = calls.values().map(|c| 1 + c.progress.unwrap_or(0)).sum();
    let mut answered = BTreeSet::new();
    let mut progress: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for _ in 0..expected {
        let m = s.expect_message("the legacy calls' answers");
        if m["method"] == "notifications/progress" {
            let token = m["params"]["progressToken"].as_u64();
            let call = token.and_then(|t| calls.get(&t).map(|c| (t, c)));
            match call {
                Some((t, c)) if c.progress.is_some() && !answered.contains(&t) => progress
                    .entry(t)
                    .or_default()
                    .push(m["params"]["progress"].as_u64().unwrap_or(0)),
                _ => panic!("the legacy session got someone else's progress: {m}"),
            }
            continue;
        }
        let id = m["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("the legacy session got a message it did not ask for: {m}"));
        let call = calls.get(&id).unwrap_or_else(|| {
            panic!("the legacy session got an answer to no call of its own: {m}")
        });
        assert!(answered.insert(id), "two answers to legacy id {id}: {m}");
        if let Err(e) = check(call.tool, &call.args, &m["result"]) {
            panic!("the legacy session got someone else's answer under id {id}: {e}");
        }
    }
    for (id, call) in calls {
        if let Some(n) = call.progress {
            let want: Vec<u64> = (1..=n).collect();
            assert_eq!(progress.get(id), Some(&want), "legacy progress for id {id}");
        }
    }
}

/// Checks one SDK client's report: its SDK-level results in order, and on the wire every
/// request answered exactly once under its own id, with its own content, and nothing else
/// received but its own progress.
fn check_sdk_client(client: &Value, calls: &[Call], check: Check) {
    let name = &client["name"];
    assert_eq!(
        client["errors"],
        json!([]),
        "{name}: the SDK reported errors: {client}"
    );
    let results = client["results"].as_array().expect("results");
    assert_eq!(results.len(), calls.len(), "{name}: {client}");
    for (call, got) in calls.iter().zip(results) {
        if let Err(e) = check(call.tool, &call.args, &got["result"]) {
            panic!("SDK client {name} got a wrong answer: {e}");
        }
        let want: Vec<u64> = (1..=call.progress.unwrap_or(0)).collect();
        assert_eq!(
            got["progress"],
            json!(want),
            "{name}: progress of {}",
            call.args
        );
    }

    let sent = client["sent"].as_array().expect("sent");
    let requests: BTreeMap<u64, &Value> = sent
        .iter()
        .filter(|m| m.get("method").is_some())
        .filter_map(|m| Some((m.get("id")?.as_u64()?, m)))
        .collect();
    let with_id = sent.iter().filter(|m| m.get("id").is_some()).count();
    assert_eq!(
        requests.len(),
        with_id,
        "{name}: ids are not unique integers: {sent:?}"
    );
    assert_eq!(
        requests.len(),
        calls.len() + 2,
        "{name}: initialize, tools/list and the calls: {sent:?}"
    );
    for id in requests.keys() {
        assert!(
            LEGACY_IDS.contains(id),
            "{name} used id {id}, which the legacy client never does: the test proves less"
        );
    }
    let tokens: BTreeSet<u64> = requests
        .values()
        .filter_map(|m| m["params"]["_meta"]["progressToken"].as_u64())
        .collect();
    let mut answered = BTreeSet::new();
    for m in client["received"].as_array().expect("received") {
        if m["method"] == "notifications/progress" {
            let token = m["params"]["progressToken"].as_u64();
            assert!(
                token.is_some_and(|t| tokens.contains(&t) && !answered.contains(&t)),
                "{name} got progress that is not its own: {m}"
            );
            continue;
        }
        let id = m["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("{name} received something it did not ask for: {m}"));
        let request = requests
            .get(&id)
            .unwrap_or_else(|| panic!("{name} got an answer to no request of its own: {m}"));
        assert!(answered.insert(id), "{name}: two answers to id {id}: {m}");
        assert!(m.get("result").is_some(), "{name}: {request} failed: {m}");
        if request["method"] == "tools/call" {
            let p = &request["params"];
            let tool = p["name"].as_str().unwrap_or_default();
            if let Err(e) = check(tool, &p["arguments"], &m["result"]) {
                panic!("{name} got someone else's answer under id {id} on the wire: {e}");
            }
        }
    }
    assert_eq!(
        answered.len(),
        requests.len(),
        "{name}: unanswered requests: {client}"
    );
}

/// Runs the SDK clients (one per `sdk_calls` entry, all at once) on `/mcp` while the legacy
/// client calls `legacy_calls(round)` round after round on `/sse`, checks both sides, and
/// returns the clients' reports.
fn sdk_clients_beside_a_legacy_client(
    node: &Node,
    proxy: &Proxy,
    sdk_calls: &[(&str, Vec<Call>)],
    legacy_calls: impl Fn(u64) -> BTreeMap<u64, Call>,
    check: Check,
) -> Vec<Value> {
    let mut legacy = open_session(proxy, None);
    let legacy_init = legacy.initialize();

    let spec = json!({"clients": sdk_calls.iter().map(|(name, calls)| json!({
        "name": name,
        "calls": calls.iter().map(|c| json!({"tool": c.tool, "arguments": c.args, "progress": c.progress.is_some()})).collect::<Vec<_>>(),
    })).collect::<Vec<_>>()});
    let script = node.file("streamable-client.mjs");
    let url = format!("http://{}/mcp", proxy.addr);
    let mut run = node.spawn(
        "node",
        [script.display().to_string(), url, spec.to_string()],
        proxy.dir().path(),
        "ts-sdk",
    );

    let started = Instant::now();
    let mut rounds = 0;
    while rounds < MAX_ROUNDS && started.elapsed() < ROUNDS_BUDGET {
        let done = run.has_exited();
        legacy_round(&mut legacy, &legacy_calls(rounds), check);
        rounds += 1;
        if done {
            break;
        }
    }
    let out = run.wait(SDK_TIMEOUT);
    assert!(
        out.status.success(),
        "the TypeScript SDK clients failed ({}):\n{}",
        out.status,
        out.transcript()
    );
    // A barrier any backend answers: nothing more was on its way to the legacy session
    // (its answer must be the very next message).
    let _ = legacy.request(json!("barrier"), "tools/list", json!({}));
    eprintln!(
        "{:?}: {rounds} legacy rounds of {} calls while the SDK clients ran ({:?})",
        proxy.target,
        LEGACY_IDS.end,
        started.elapsed()
    );

    let report: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "the SDK clients' output is not JSON ({e}):\n{}",
            out.transcript()
        )
    });
    let clients = report["clients"].as_array().cloned().unwrap_or_default();
    assert_eq!(clients.len(), sdk_calls.len(), "{report}");
    let mut sids = BTreeSet::from([legacy.sid.clone()]);
    for (client, (_, calls)) in clients.iter().zip(sdk_calls) {
        check_sdk_client(client, calls, check);
        // Both transports are answered from the one cached initialize result.
        assert_eq!(
            client["protocolVersion"], legacy_init["protocolVersion"],
            "{}",
            client["name"]
        );
        let sid = client["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {client}"));
        assert!(
            sids.insert(sid.to_owned()),
            "a session id came twice: {sid}"
        );
    }
    // The SDK clients ended their sessions with DELETE; the legacy one is still live.
    let (status, health) = proxy.health();
    assert_eq!((status, &health["sessions"]), (200, &json!(1)), "{health}");
    clients
}

fn ts_sdk_to_mcp_server_time_beside_a_legacy_client(target: Target) {
    let Some(node) = node("TypeScript SDK interop") else {
        return;
    };
    let Some(server) = mcp_server_time() else {
        return;
    };
    let _turn = node::one_at_a_time();
    let p = Proxy::builder(target)
        .backend([server.display().to_string()])
        .start();
    let zones = |list: &[&str]| -> Vec<Call> {
        list.iter()
            .map(|z| Call::new("get_current_time", json!({"timezone": z})))
            .collect()
    };
    let sdk = [
        (
            "ts-a",
            zones(&["Asia/Tokyo", "Europe/Paris", "Africa/Cairo"]),
        ),
        (
            "ts-b",
            zones(&["America/Sao_Paulo", "Asia/Kolkata", "Europe/London"]),
        ),
    ];
    const LEGACY_ZONES: [&str; 6] = [
        "UTC",
        "America/New_York",
        "Australia/Sydney",
        "Europe/Berlin",
        "Asia/Singapore",
        "Pacific/Auckland",
    ];
    let legacy = |round: u64| -> BTreeMap<u64, Call> {
        LEGACY_IDS
            .map(|id| {
                let zone = LEGACY_ZONES[((round + id) % LEGACY_ZONES.len() as u64) as usize];
                (id, Call::new("get_current_time", json!({"timezone": zone})))
            })
            .collect()
    };
    let clients = sdk_clients_beside_a_legacy_client(&node, &p, &sdk, legacy, time_check);
    for c in &clients {
        assert_eq!(c["server"]["name"], "mcp-time", "{c}");
        let tools = c["tools"].as_array().expect("tools");
        assert!(tools.contains(&json!("get_current_time")), "{c}");
    }
}

fn ts_sdk_to_the_demo_backend_beside_a_legacy_client(target: Target) {
    let Some(node) = node("TypeScript SDK interop") else {
        return;
    };
    let _turn = node::one_at_a_time();
    // No command after `--`: the built-in demo server.
    let p = Proxy::builder(target).start();
    let countdown = |n: u64| Call {
        tool: "countdown",
        args: json!({"n": n}),
        progress: Some(n),
    };
    // The countdowns are the third call: id 4 and progress token 4, as the legacy one's.
    let sdk = [
        (
            "ts-a",
            vec![
                Call::new("echo", json!({"text": "ts-a first"})),
                Call::new("echo", json!({"text": "ts-a second"})),
                countdown(4),
            ],
        ),
        (
            "ts-b",
            vec![
                Call::new("add", json!({"a": 1000, "b": 1})),
                Call::new("echo", json!({"text": "ts-b second"})),
                countdown(5),
            ],
        ),
    ];
    let legacy = |round: u64| -> BTreeMap<u64, Call> {
        LEGACY_IDS
            .map(|id| {
                let call = match id {
                    4 => countdown(3),
                    5 => Call::new("add", json!({"a": round, "b": 7})),
                    _ => Call::new(
                        "echo",
                        json!({"text": format!("legacy round {round} id {id}")}),
                    ),
                };
                (id, call)
            })
            .collect()
    };
    let clients = sdk_clients_beside_a_legacy_client(&node, &p, &sdk, legacy, demo_check);
    for c in &clients {
        assert_eq!(c["server"]["name"], "switchboard-demo", "{c}");
        assert_eq!(c["tools"], json!(["echo", "add", "countdown"]), "{c}");
    }
}

/// SPEC 12 with the real TypeScript SDK client (`tests/node/restart-client.mjs`): two
/// Streamable clients, each subscribed to a uri of its own and with a call in flight, while
/// the backend is killed (SIGKILL to the pid `/health` reports). Each keeps its one session
/// (no second initialize or subscribe, one `Mcp-Session-Id` on every request), gets -32603
/// `backend restarted` for the call in flight, gets its answers from the new process, hears
/// the three `list_changed`, and its subscription, renewed by the proxy, still delivers
/// `resources/updated` (the new process knows only the subscriptions sent to it).
fn ts_sdk_session_survives_a_killed_backend(target: Target) {
    const CLIENTS: usize = 2;
    let Some(node) = node("TypeScript SDK interop") else {
        return;
    };
    let _turn = node::one_at_a_time();
    let p = Proxy::builder(target).backend([BACKEND]).record().start();
    let script = node.file("restart-client.mjs");
    let run = node.spawn(
        "node",
        [
            script.display().to_string(),
            format!("http://{}", p.addr),
            p.record_path().display().to_string(),
            "test://switchboard/doc".to_owned(),
            CLIENTS.to_string(),
        ],
        p.dir().path(),
        "ts-restart",
    );
    let out = run.wait(RESTART_TIMEOUT);
    assert!(
        out.status.success(),
        "the TypeScript SDK clients failed ({}):\n{}\n--- proxy log ---\n{}",
        out.status,
        out.transcript(),
        p.log()
    );
    let report: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "the SDK clients' output is not JSON ({e}):\n{}",
            out.transcript()
        )
    });
    let pids = report["pids"].as_array().expect("pids");
    assert!(
        pids.len() == 2 && pids[0] != pids[1],
        "a new backend process: {report}"
    );
    let clients = report["clients"].as_array().expect("clients");
    assert_eq!(clients.len(), CLIENTS, "{report}");
    let mut sids = BTreeSet::new();
    for c in clients {
        let name = c["name"].as_str().unwrap_or_else(|| panic!("{c}"));
        let uri = c["uri"].as_str().unwrap_or_else(|| panic!("{c}"));
        assert_eq!(
            c["errors"],
            json!([]),
            "{name}: the SDK reported errors: {c}"
        );
        let sid = c["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no session: {c}"));
        assert_eq!(
            c["sessionIds"],
            json!([sid]),
            "{name}: one session on every request: {c}"
        );
        assert!(
            sids.insert(sid.to_owned()),
            "a session id came twice: {sid}"
        );
        assert_eq!(
            c["sent"],
            json!([
                "initialize",
                "notifications/initialized",
                "tools/list",
                "resources/subscribe",
                "tools/call",
                "tools/call",
                "tools/call",
                "tools/call"
            ]),
            "{name}: no new initialize or subscribe: {c}"
        );
        assert_eq!(
            c["inFlight"]["code"],
            json!(-32603),
            "{name}: the call in flight: {c}"
        );
        let message = c["inFlight"]["message"].as_str().unwrap_or_default();
        assert!(
            message.ends_with("backend restarted"),
            "{name}: the call in flight: {c}"
        );
        assert_eq!(
            c["echo"],
            json!({"after": "restart", "client": name}),
            "{name}: a call after the restart: {c}"
        );
        assert_eq!(
            c["touched"],
            json!([{"uri": uri, "notified": true}, {"uri": uri, "notified": true}]),
            "{name}: both processes held the subscription: {c}"
        );
        let updated = format!("notifications/resources/updated {uri}");
        assert_eq!(c["before"], json!([updated]), "{name}: {c}");
        let after: BTreeSet<&str> = c["after"]
            .as_array()
            .expect("after")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(
            after,
            BTreeSet::from([
                "notifications/tools/list_changed",
                "notifications/resources/list_changed",
                "notifications/prompts/list_changed",
                updated.as_str(),
            ]),
            "{name}: after the restart: {c}"
        );
        assert_eq!(
            c["after"].as_array().map(Vec::len),
            Some(4),
            "{name}: each once: {c}"
        );
        let subscribes = p
            .recorded()
            .iter()
            .filter(|l| l.contains("\"resources/subscribe\"") && l.contains(&format!("\"{uri}\"")))
            .count();
        assert_eq!(subscribes, 2, "{uri}: subscribed on each backend process");
    }
    assert_eq!(
        p.recorded_initializes(),
        2,
        "one initialize per backend process"
    );
    let (_, health) = p.health();
    assert_eq!(health["backend"]["restarts"], json!(1), "{health}");
}

suite!(
    ts_sdk_session_survives_a_killed_backend,
    ts_sdk_to_mcp_server_time_beside_a_legacy_client,
    ts_sdk_to_the_demo_backend_beside_a_legacy_client,
);
