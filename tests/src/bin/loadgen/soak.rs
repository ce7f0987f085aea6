//! `loadgen --soak ROUNDS`: session churn against a running proxy, for memory that must stay
//! flat (`tests/soak.sh`). Each round opens `-s` sessions at once, half legacy (`/sse`),
//! half Streamable (`/mcp`), each making `-c` calls with `-k` in flight against the echo
//! backend, every answer checked as in a load run. Of every ten sessions of a transport one
//! vanishes mid-calls (its sockets dropped with calls in flight; a Streamable one is never
//! deleted, and ends by the proxy's `--session-idle`), one cancels a call the backend never
//! answers (`notifications/cancelled`: a Streamable POST then gets -32800), one has such a
//! call time out (Streamable: the proxy's `--request-timeout` answers -32001; legacy, which
//! has no proxy timeout: the client gives up after [`LEGACY_PATIENCE`]); the others close
//! as a well-behaved client does (the stream dropped; `DELETE /mcp`).
//!
//! After each round (and `--drain-ms`), the first `--pid`'s RSS, threads and open
//! descriptors (`/proc/PID/status`, `/proc/PID/fd`) and `/health`'s live sessions are one
//! JSON line on standard output. Before the first round the same figures idle, and after
//! the last, once they are back at that level or `--idle-wait` has passed, the idle-after
//! figures. Rounds stop at `ROUNDS` or when `--budget` seconds have passed; each round is
//! bounded by `--timeout`. `loadgen --soak-report FILE [--svg OUT]` renders such lines as
//! a Markdown table per target (its `--tag target=...`) and an SVG plot of RSS against
//! sessions served.

use super::*;

/// How long a legacy client waits for the answer to its never-answered call before it
/// gives up and closes (the proxy has no timeout for `/sse` requests).
const LEGACY_PATIENCE: Duration = Duration::from_millis(200);
/// How long a vanishing session makes calls before its sockets are dropped.
const VANISH_AFTER: Duration = Duration::from_millis(15);
/// How long a Streamable client lets its never-answered call be under way before it
/// cancels it.
const CANCEL_AFTER: Duration = Duration::from_millis(20);

/// How a session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Closes as a well-behaved client does.
    Close,
    /// Drops its sockets with calls in flight, without closing.
    Vanish,
    /// Cancels a call the backend never answers, then closes.
    Cancel,
    /// Lets such a call time out, then closes.
    Timeout,
}

/// Session `i` of a round: the transport and how it ends.
fn plan(i: usize) -> (Transport, Fate) {
    let transport = if i.is_multiple_of(2) {
        Transport::Sse
    } else {
        Transport::Mcp
    };
    let fate = match (i / 2) % 10 {
        0 => Fate::Vanish,
        1 => Fate::Cancel,
        2 => Fate::Timeout,
        _ => Fate::Close,
    };
    (transport, fate)
}

fn hang_body(id: u64) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"hang","arguments":{{}}}}}}"#)
        .into_bytes()
}

fn cancel_body(id: u64) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id},"reason":"soak"}}}}"#)
        .into_bytes()
}

/// The figures sampled after each round.
#[derive(Debug, Clone, Copy)]
struct Sample {
    rss_kb: u64,
    threads: u64,
    fds: u64,
}

fn sample(pid: u32) -> Option<Sample> {
    Some(Sample {
        rss_kb: status_kb(pid, "VmRSS")?,
        threads: status_kb(pid, "Threads")?,
        fds: std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64,
    })
}

fn line(o: &Options, kind: &str, fields: Value) -> String {
    let mut v = fields;
    let m = v.as_object_mut().expect("an object");
    m.insert("kind".into(), json!(kind));
    for (k, val) in &o.tags {
        m.insert(k.clone(), json!(val));
    }
    v.to_string()
}

fn emit(text: String) {
    println!("{text}");
    let _ = io::stdout().flush();
}

/// Runs the soak; the exit status (as a load run's: 1 violations, 2 errors).
pub async fn run(o: &Options) -> u8 {
    let rounds = o.soak.unwrap_or(0);
    let pid = o.pids[0];
    let target = match HttpTarget::parse(o.url.as_deref().unwrap_or_default()) {
        Ok(t) => Arc::new(t),
        Err(e) => {
            eprintln!("loadgen: {e}");
            return 64;
        }
    };
    let run = Arc::new(Run {
        nonce: nonce(),
        calls: o.calls,
        problems: Problems::default(),
        stop: AtomicBool::new(false),
        hang: true,
        modern: false,
    });
    let Some(idle) = sample(pid) else {
        eprintln!("loadgen: no process {pid}");
        return 2;
    };
    emit(line(
        o,
        "soak-idle-before",
        json!({"rss_kb": idle.rss_kb, "threads": idle.threads, "fds": idle.fds}),
    ));
    let began = Instant::now();
    let mut served = 0usize;
    let mut total_calls = 0usize;
    for round in 1..=rounds {
        if began.elapsed() >= o.budget {
            eprintln!("soak: time budget reached after {} rounds", round - 1);
            break;
        }
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + o.timeout;
        let mut sessions = JoinSet::new();
        for i in 0..o.sessions {
            let (target, run) = (target.clone(), run.clone());
            let inflight = o.inflight.min(o.calls as usize).max(1);
            sessions.spawn(session(
                target,
                run,
                served + i,
                plan(i),
                inflight,
                deadline,
            ));
        }
        let mut calls = 0;
        while let Some(done) = sessions.join_next().await {
            match done {
                Ok(Ok(n)) => calls += n,
                Ok(Err(e)) => run.problems.error(e),
                Err(e) => run.problems.error(format!("session task: {e}")),
            }
        }
        served += o.sessions;
        total_calls += calls;
        let round_s = started.elapsed().as_secs_f64();
        tokio::time::sleep(o.drain).await;
        let live = timeout_at(deadline, health_sessions(&target))
            .await
            .ok()
            .flatten();
        let Some(s) = sample(pid) else {
            eprintln!("loadgen: process {pid} is gone after round {round}");
            return 2;
        };
        let p = &run.problems;
        emit(line(
            o,
            "soak",
            json!({
                "round": round,
                "sessions_served": served,
                "rss_kb": s.rss_kb,
                "threads": s.threads,
                "fds": s.fds,
                "live_sessions": live,
                "calls": calls,
                "round_s": (round_s * 1000.0).round() / 1000.0,
                "errors": p.errors.load(Ordering::Relaxed),
                "violations": p.violations.load(Ordering::Relaxed),
            }),
        ));
        if round == 1 || round % 50 == 0 || round == rounds {
            eprintln!(
                "soak: round {round}/{rounds}, {served} sessions served in {:.0} s: RSS {} KiB, {} threads, {} descriptors, {live:?} live",
                began.elapsed().as_secs_f64(),
                s.rss_kb,
                s.threads,
                s.fds
            );
        }
    }
    let load_s = began.elapsed().as_secs_f64();
    // The load is over: wait for threads and descriptors to come back to the idle level
    // (and for sessions that vanished to end by the proxy's idle timeout).
    let waited = Instant::now();
    // Only /proc is looked at meanwhile: a request would be load (and wake threads).
    let mut after;
    let mut live;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        after = sample(pid);
        let settled = after.is_some_and(|a| a.threads <= idle.threads && a.fds <= idle.fds);
        if !settled && waited.elapsed() < o.idle_wait {
            continue;
        }
        // Sampled before asking: the answer's own thread and descriptors are not counted.
        live = health_sessions(&target).await;
        if live == Some(0) || waited.elapsed() >= o.idle_wait {
            break;
        }
    }
    let p = &run.problems;
    emit(line(
        o,
        "soak-idle-after",
        json!({
            "sessions_served": served,
            "calls": total_calls,
            "load_s": (load_s * 10.0).round() / 10.0,
            "waited_s": (waited.elapsed().as_secs_f64() * 10.0).round() / 10.0,
            "rss_kb": after.map(|a| a.rss_kb),
            "threads": after.map(|a| a.threads),
            "fds": after.map(|a| a.fds),
            "live_sessions": live,
            "idle_threads": idle.threads,
            "idle_fds": idle.fds,
            "errors": p.errors.load(Ordering::Relaxed),
            "violations": p.violations.load(Ordering::Relaxed),
            "examples": *lock(&p.examples),
        }),
    ));
    let examples = lock(&p.examples).clone();
    for e in examples {
        eprintln!("  {e}");
    }
    if p.violations.load(Ordering::Relaxed) > 0 {
        1
    } else if p.errors.load(Ordering::Relaxed) > 0 {
        2
    } else {
        0
    }
}

/// One session's life (see the module docs); how many of its calls were answered.
async fn session(
    target: Arc<HttpTarget>,
    run: Arc<Run>,
    index: usize,
    (transport, fate): (Transport, Fate),
    inflight: usize,
    deadline: tokio::time::Instant,
) -> Result<usize, String> {
    let state = Arc::new(SessionState::new(index, run.calls + 1));
    // A session with a never-answered call makes it on a connection of its own.
    let extra = usize::from(matches!(fate, Fate::Cancel | Fate::Timeout));
    let opening = async {
        match transport {
            Transport::Sse => {
                open_http_session(target.clone(), run.clone(), state.clone(), inflight + extra)
                    .await
            }
            Transport::Mcp => {
                open_mcp_session(target.clone(), run.clone(), state.clone(), inflight + extra).await
            }
        }
    };
    let opened = match timeout_at(deadline, opening).await {
        Ok(opened) => opened?,
        Err(_) => return Err(format!("session {index}: not opened in time")),
    };
    let Opened {
        stream,
        mut conns,
        closer,
        ..
    } = opened;
    let reader = stream.map(|s| tokio::spawn(read_stream(s, run.clone(), state.clone())));
    let hang_conn = if extra > 0 { conns.pop() } else { None };
    let mut workers = Vec::with_capacity(conns.len());
    for conn in conns {
        let sender = match transport {
            Transport::Sse => Sender::Http(conn),
            Transport::Mcp => Sender::Mcp(conn),
        };
        workers.push(tokio::spawn(worker(
            run.clone(),
            state.clone(),
            sender,
            deadline,
        )));
    }
    let hang_id = run.calls + 1;
    let mut closer = closer;
    let hung = match (fate, hang_conn) {
        (Fate::Vanish, _) => {
            tokio::time::sleep(VANISH_AFTER).await;
            for w in &workers {
                w.abort();
            }
            if let Some(r) = &reader {
                r.abort();
            }
            // Everything is dropped unclosed: the proxy finds out on its own.
            return Ok(0);
        }
        (Fate::Cancel | Fate::Timeout, Some(conn)) => {
            let outcome = match transport {
                Transport::Sse => legacy_hang(conn, &state, hang_id, fate).await,
                Transport::Mcp => {
                    mcp_hang(conn, closer.as_mut(), &run, &state, hang_id, fate).await
                }
            };
            outcome.map_err(|e| format!("session {index} ({fate:?}): {e}"))
        }
        _ => Ok(()),
    };
    let mut calls = 0;
    for w in workers {
        if let Ok(latencies) = w.await {
            calls += latencies.len();
        }
    }
    if let Some(r) = reader {
        r.abort();
    }
    if let Some(conn) = closer {
        let mut conn = conn;
        let step_end = (tokio::time::Instant::now() + SETUP_STEP).min(deadline);
        match timeout_at(step_end, conn.delete_session()).await {
            Ok(Ok(204)) => {}
            Ok(Ok(status)) => {
                return Err(format!("session {index}: DELETE /mcp answered {status}"))
            }
            Ok(Err(e)) => return Err(format!("session {index}: DELETE /mcp failed: {e}")),
            Err(_) => return Err(format!("session {index}: DELETE /mcp: no answer in time")),
        }
    }
    hung.map(|()| calls)
}

/// A legacy session's never-answered call: cancelled at once (nothing must come back), or
/// given up on after [`LEGACY_PATIENCE`].
async fn legacy_hang(
    mut conn: PostConn,
    state: &SessionState,
    id: u64,
    fate: Fate,
) -> Result<(), String> {
    let answer = state.expect(id);
    let status = step(|| "POST hang".to_owned(), conn.post(&hang_body(id))).await?;
    if status != 202 {
        return Err(format!("POST hang answered {status}"));
    }
    if fate == Fate::Cancel {
        let status = step(
            || "POST notifications/cancelled".to_owned(),
            conn.post(&cancel_body(id)),
        )
        .await?;
        if status != 202 {
            return Err(format!("POST notifications/cancelled answered {status}"));
        }
    } else {
        // No answer is due: the client gives up (an answer, an error, would be fine too).
        let _ = tokio::time::timeout(LEGACY_PATIENCE, answer).await;
    }
    // Anything that still comes for it is a violation (answered after it was given up).
    state.forget(id);
    Ok(())
}

/// A Streamable session's never-answered call: its POST must be answered with an error,
/// -32800 once cancelled (on `closer`, the session's spare connection), -32001 once the
/// proxy's `--request-timeout` has passed.
async fn mcp_hang(
    mut conn: PostConn,
    closer: Option<&mut PostConn>,
    run: &Run,
    state: &SessionState,
    id: u64,
    fate: Fate,
) -> Result<(), String> {
    let mut answer = state.expect(id);
    let body = hang_body(id);
    let hang = step(|| "POST hang".to_owned(), conn.exchange(&body));
    let cancel = async {
        if fate != Fate::Cancel {
            return Ok(());
        }
        let closer = closer.ok_or("no connection to cancel on")?;
        tokio::time::sleep(CANCEL_AFTER).await;
        let (head, body) = step(
            || "POST notifications/cancelled".to_owned(),
            closer.exchange(&cancel_body(id)),
        )
        .await?;
        match head.status {
            202 => Ok(()),
            s => Err(format!(
                "POST notifications/cancelled answered {s}: {}",
                preview(&body)
            )),
        }
    };
    let (hung, cancelled) = tokio::join!(hang, cancel);
    cancelled?;
    let (head, body) = hung?;
    if head.status != 200 {
        return Err(format!(
            "POST hang answered {}: {}",
            head.status,
            preview(&body)
        ));
    }
    let now = Instant::now();
    for message in answer_messages(&head, &body, &run.problems)? {
        run.on_message(state, &message, now);
    }
    let want = if fate == Fate::Cancel {
        "-32800"
    } else {
        "-32001"
    };
    if answer.try_recv().is_err() || find(&body, want.as_bytes()).is_none() {
        return Err(format!(
            "POST hang: not answered with a {want} error: {}",
            preview(&body)
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The report

/// One target's soak, from its lines.
#[derive(Default)]
struct Soak {
    target: String,
    idle: Option<Value>,
    rounds: Vec<Value>,
    after: Option<Value>,
}

fn u(v: &Value, key: &str) -> Option<u64> {
    v[key].as_u64()
}

fn mib(kb: Option<u64>) -> String {
    kb.map_or("-".to_owned(), |k| format!("{:.1}", k as f64 / 1024.0))
}

fn count(n: Option<u64>) -> String {
    n.map_or("-".to_owned(), |n| n.to_string())
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The sessions-served figure from which growth is judged (the issue's 2,500), or the
/// first round's when the soak was shorter.
const GROWTH_FROM: u64 = 2_500;

/// Prints a Markdown section for each target in `path` (lines of `--soak`), and writes the
/// SVG plot to `svg`.
pub fn report(path: &str, svg: Option<&str>) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut soaks: Vec<Soak> = Vec::new();
    for l in text.lines().filter(|l| l.starts_with('{')) {
        let v: Value = serde_json::from_str(l).map_err(|e| format!("{e}: {l}"))?;
        let target = v["target"].as_str().unwrap_or("?").to_owned();
        let i = match soaks.iter().position(|s| s.target == target) {
            Some(i) => i,
            None => {
                soaks.push(Soak {
                    target,
                    ..Soak::default()
                });
                soaks.len() - 1
            }
        };
        let soak = &mut soaks[i];
        match v["kind"].as_str() {
            Some("soak-idle-before") => soak.idle = Some(v),
            Some("soak") => soak.rounds.push(v),
            Some("soak-idle-after") => soak.after = Some(v),
            _ => {}
        }
    }
    for soak in &soaks {
        print_soak(soak);
    }
    if let Some(svg) = svg {
        std::fs::write(svg, plot(&soaks)).map_err(|e| format!("{svg}: {e}"))?;
    }
    Ok(())
}

fn print_soak(soak: &Soak) {
    let Some(last) = soak.rounds.last() else {
        return;
    };
    let total = u(last, "sessions_served").unwrap_or(0);
    let per_round = soak.rounds.first().and_then(|r| u(r, "sessions_served"));
    println!("### {}", soak.target);
    println!();
    if let Some(a) = &soak.after {
        println!(
            "{} rounds of {} sessions, {} sessions and {} calls in {} s; {} errors, {} isolation violations.",
            soak.rounds.len(),
            count(per_round),
            thousands(total),
            thousands(u(a, "calls").unwrap_or(0)),
            a["load_s"],
            count(u(a, "errors")),
            count(u(a, "violations")),
        );
        println!();
    }
    println!("| sessions served | RSS MiB | threads | descriptors | live sessions |");
    println!("|---:|---:|---:|---:|---:|");
    if let Some(i) = &soak.idle {
        println!(
            "| 0 (idle before) | {} | {} | {} | 0 |",
            mib(u(i, "rss_kb")),
            count(u(i, "threads")),
            count(u(i, "fds"))
        );
    }
    // About ten rows: the first round, then every tenth of the run (every 2,500 sessions
    // for 25,000), then the last.
    let step = (total / 10).max(1);
    let mut next = 0;
    for (n, r) in soak.rounds.iter().enumerate() {
        let served = u(r, "sessions_served").unwrap_or(0);
        let is_last = n + 1 == soak.rounds.len();
        if n == 0 || served >= next || is_last {
            println!(
                "| {} | {} | {} | {} | {} |",
                thousands(served),
                mib(u(r, "rss_kb")),
                count(u(r, "threads")),
                count(u(r, "fds")),
                count(u(r, "live_sessions"))
            );
            next = (served / step + 1) * step;
        }
    }
    if let Some(a) = &soak.after {
        println!(
            "| idle after ({} s) | {} | {} | {} | {} |",
            a["waited_s"],
            mib(u(a, "rss_kb")),
            count(u(a, "threads")),
            count(u(a, "fds")),
            count(u(a, "live_sessions"))
        );
    }
    println!();
    let from = soak
        .rounds
        .iter()
        .find(|r| u(r, "sessions_served").unwrap_or(0) >= GROWTH_FROM)
        .unwrap_or(&soak.rounds[0]);
    let (from_n, from_kb) = (
        u(from, "sessions_served").unwrap_or(0),
        u(from, "rss_kb").unwrap_or(0),
    );
    let last_kb = u(last, "rss_kb").unwrap_or(0);
    let peak = soak
        .rounds
        .iter()
        .filter(|r| u(r, "sessions_served").unwrap_or(0) >= from_n)
        .filter_map(|r| u(r, "rss_kb"))
        .max()
        .unwrap_or(last_kb);
    let growth = last_kb as i64 - from_kb as i64;
    print!(
        "RSS from {} to {} sessions served: {:+} KiB ({:+.2} MiB; highest {} MiB after {}).",
        thousands(from_n),
        thousands(total),
        growth,
        growth as f64 / 1024.0,
        mib(Some(peak)),
        thousands(from_n)
    );
    if let (Some(i), Some(a)) = (&soak.idle, &soak.after) {
        let back = u(a, "threads") <= u(i, "threads") && u(a, "fds") <= u(i, "fds");
        print!(
            " Idle before: {} threads, {} descriptors; after the load: {} threads, {} descriptors ({}).",
            count(u(i, "threads")),
            count(u(i, "fds")),
            count(u(a, "threads")),
            count(u(a, "fds")),
            if back { "back to idle" } else { "NOT back to idle" }
        );
    }
    println!();
    println!();
}

/// RSS against sessions served, one line per target.
fn plot(soaks: &[Soak]) -> String {
    const W: f64 = 640.0;
    const H: f64 = 320.0;
    const LEFT: f64 = 56.0;
    const RIGHT: f64 = 16.0;
    const TOP: f64 = 24.0;
    const BOTTOM: f64 = 40.0;
    const COLOURS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let points: Vec<Vec<(f64, f64)>> = soaks
        .iter()
        .map(|s| {
            s.rounds
                .iter()
                .filter_map(|r| {
                    Some((
                        u(r, "sessions_served")? as f64,
                        u(r, "rss_kb")? as f64 / 1024.0,
                    ))
                })
                .collect()
        })
        .collect();
    let all = points.iter().flatten();
    let x_max = all.clone().map(|p| p.0).fold(1.0, f64::max);
    let y_max = all.map(|p| p.1).fold(1.0, f64::max);
    let y_step = nice_step(y_max / 5.0);
    let y_top = (y_max / y_step).ceil() * y_step;
    let x_step = nice_step(x_max / 5.0);
    let x_top = (x_max / x_step).ceil() * x_step;
    let sx = |x: f64| LEFT + x / x_top * (W - LEFT - RIGHT);
    let sy = |y: f64| H - BOTTOM - y / y_top * (H - TOP - BOTTOM);
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">
<rect width="{W}" height="{H}" fill="white"/>
<text x="{}" y="14" text-anchor="middle" font-size="12">RSS (MiB) against sessions served, soak of the echo backend</text>
"#,
        W / 2.0
    );
    let mut y = 0.0;
    while y <= y_top + 1e-9 {
        out.push_str(&format!(
            "<line x1=\"{LEFT}\" x2=\"{0}\" y1=\"{1:.1}\" y2=\"{1:.1}\" stroke=\"#ddd\"/><text x=\"{2}\" y=\"{3:.1}\" text-anchor=\"end\">{4}</text>\n",
            W - RIGHT,
            sy(y),
            LEFT - 4.0,
            sy(y) + 4.0,
            trim_number(y)
        ));
        y += y_step;
    }
    let mut x = 0.0;
    while x <= x_top + 1e-9 {
        out.push_str(&format!(
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{TOP}\" y2=\"{1}\" stroke=\"#eee\"/><text x=\"{0:.1}\" y=\"{2}\" text-anchor=\"middle\">{3}</text>\n",
            sx(x),
            H - BOTTOM,
            H - BOTTOM + 14.0,
            thousands(x as u64)
        ));
        x += x_step;
    }
    out.push_str(&format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">sessions served</text>\n",
        (LEFT + W - RIGHT) / 2.0,
        H - 6.0
    ));
    for (n, (soak, pts)) in soaks.iter().zip(&points).enumerate() {
        let colour = COLOURS[n % COLOURS.len()];
        let path: Vec<String> = pts
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            path.join(" ")
        ));
        let ly = TOP + 14.0 + 14.0 * n as f64;
        out.push_str(&format!(
            "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1}\" y2=\"{2:.1}\" stroke=\"{colour}\" stroke-width=\"2\"/><text x=\"{3}\" y=\"{4:.1}\">{5}</text>\n",
            LEFT + 10.0,
            LEFT + 30.0,
            ly,
            LEFT + 34.0,
            ly + 4.0,
            soak.target
        ));
    }
    out.push_str("</svg>\n");
    out
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let raw = raw.max(1e-9);
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * power)
}

fn trim_number(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_mix_transports_and_fates() {
        let plans: Vec<_> = (0..20).map(plan).collect();
        let count = |t, f| plans.iter().filter(|p| **p == (t, f)).count();
        for t in [Transport::Sse, Transport::Mcp] {
            assert_eq!(count(t, Fate::Vanish), 1);
            assert_eq!(count(t, Fate::Cancel), 1);
            assert_eq!(count(t, Fate::Timeout), 1);
            assert_eq!(count(t, Fate::Close), 7);
        }
    }

    #[test]
    fn axis_steps_and_numbers() {
        assert_eq!(nice_step(3.2), 5.0);
        assert_eq!(nice_step(4_800.0), 5_000.0);
        assert_eq!(nice_step(0.15), 0.2);
        assert_eq!(thousands(25_000), "25,000");
        assert_eq!(thousands(999), "999");
        assert_eq!(trim_number(2.0), "2");
    }
}
