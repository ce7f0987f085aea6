//! Counters and their Prometheus text.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write};

use crate::http::Rejection;

/// How many distinct (reason, method) pairs are remembered for warn-once logging and used
/// as metrics labels; a backend inventing method names cannot grow memory past this.
pub(crate) const WARN_SET_CAP: usize = 64;

/// The tool or prompt names of the backend's last list kept as label values: bounded, as
/// labels must be, but far past any real server's list.
const OFFERED_CAP: usize = 4096;

/// Everything the hub counts. Labels are bounded: methods beyond the warn set are
/// counted as `other`.
#[derive(Debug, Default, Clone)]
pub(crate) struct Metrics {
    /// Sessions opened.
    pub(crate) sessions_opened: u64,
    /// Sessions closed, for any reason.
    pub(crate) sessions_closed: u64,
    /// Client messages accepted (202).
    pub(crate) client_messages: u64,
    /// Lines written to the backend on a client's behalf.
    pub(crate) rewrites: u64,
    /// The proxy's own lines to the backend.
    pub(crate) replies: u64,
    /// Lines read from the backend.
    pub(crate) backend_lines: u64,
    /// Messages delivered to one session.
    pub(crate) delivered: u64,
    /// Messages broadcast to every live session.
    pub(crate) broadcasts: u64,
    /// Requests the policy denied (answered -32003).
    pub(crate) policy_denied: u64,
    /// List entries the policy or the token's scopes hid from a list result.
    pub(crate) entries_hidden: u64,
    /// Audit events the shell's queue could not take.
    pub(crate) audit_dropped: u64,
    /// Spans the shell's export queue could not take.
    pub(crate) otel_dropped: u64,
    /// Drops and proxy answers by reason and method (bounded labels).
    pub(crate) drops: BTreeMap<(DropReason, String), u64>,
    /// Refused HTTP requests by reason.
    pub(crate) rejections: BTreeMap<&'static str, u64>,
    /// Configuration reloads that took effect.
    pub(crate) reloads: u64,
    /// Configuration reloads refused (the running configuration stayed).
    pub(crate) reload_failures: u64,
    /// The histograms of SPEC section 14.
    pub(crate) durations: Durations,
    /// The (reason, method) pairs logged at WARN once, at most [`WARN_SET_CAP`].
    warned: BTreeSet<(DropReason, String)>,
}

impl Metrics {
    /// Counts a message dropped (or answered by the proxy) and decides its log level: WARN
    /// the first time a (reason, method) is seen while the remembered set has room, DEBUG
    /// after. Methods past the set are counted as `other`.
    pub(crate) fn dropped(&mut self, reason: DropReason, method: Option<&str>) -> LogLevel {
        // A client's method name may be long: a label keeps its first 256 bytes.
        let method = method.unwrap_or_default();
        let cut = (0..=method.len().min(256))
            .rev()
            .find(|&at| method.is_char_boundary(at))
            .unwrap_or(0);
        let key = (reason, method[..cut].to_owned());
        let first = !self.warned.contains(&key) && self.warned.len() < WARN_SET_CAP;
        if first {
            self.warned.insert(key.clone());
        }
        let label = if self.warned.contains(&key) {
            key.1
        } else {
            "other".to_owned()
        };
        *self.drops.entry((reason, label)).or_default() += 1;
        match first {
            true if reason != DropReason::AnsweredPing => LogLevel::Warn,
            _ => LogLevel::Debug,
        }
    }

    pub(crate) fn rejected(&mut self, rejection: &Rejection) {
        *self.rejections.entry(rejection.as_str()).or_default() += 1;
    }
}

/// Gauges the hub keeps beside the router's counters.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ShellGauges {
    /// Sessions live now.
    pub(crate) live_sessions: usize,
    /// Whether the backend process runs.
    pub(crate) backend_running: bool,
    /// Restarts so far.
    pub(crate) backend_restarts: u64,
    /// The `--instance` name, rendered as `switchboard_instance_info{instance="NAME"} 1`.
    pub(crate) instance: Option<crate::routed_id::Instance>,
}

/// Renders the Prometheus text exposition format.
pub(crate) fn render(m: &Metrics, g: ShellGauges) -> String {
    let mut out = Text(String::with_capacity(2048));
    let one = |v: u64| vec![(String::new(), v)];
    out.metric(
        "switchboard_sessions",
        "gauge",
        "Live sessions.",
        &one(g.live_sessions as u64),
    );
    out.metric(
        "switchboard_sessions_opened_total",
        "counter",
        "Sessions opened.",
        &one(m.sessions_opened),
    );
    out.metric(
        "switchboard_sessions_closed_total",
        "counter",
        "Sessions closed.",
        &one(m.sessions_closed),
    );
    render_messages(&mut out, m);
    render_decisions(&mut out, m);
    render_durations(&mut out, &m.durations);
    out.metric(
        "switchboard_backend_up",
        "gauge",
        "1 while the backend process runs.",
        &one(u64::from(g.backend_running)),
    );
    out.metric(
        "switchboard_backend_restarts_total",
        "counter",
        "Backend restarts.",
        &one(g.backend_restarts),
    );
    if let Some(instance) = g.instance {
        out.metric(
            "switchboard_instance_info",
            "gauge",
            "The --instance name this process mints session ids under.",
            &[(format!("{{instance=\"{instance}\"}}"), 1)],
        );
    }
    out.0
}

/// Prometheus text under construction.
struct Text(String);

impl Text {
    fn metric(&mut self, name: &str, kind: &str, help: &str, samples: &[(String, u64)]) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(self.0, "{name}{labels} {value}");
        }
    }
}

/// What the policy, the audit log and reloads decided.
fn render_decisions(out: &mut Text, m: &Metrics) {
    let one = |v: u64| vec![(String::new(), v)];
    out.metric(
        "switchboard_policy_denied_total",
        "counter",
        "Requests denied by the authorization policy.",
        &one(m.policy_denied),
    );
    out.metric(
        "switchboard_audit_dropped_total",
        "counter",
        "Audit events dropped because the audit log could not keep up.",
        &one(m.audit_dropped),
    );
    out.metric(
        "switchboard_otel_dropped_total",
        "counter",
        "Spans dropped because the OTLP exporter could not keep up.",
        &one(m.otel_dropped),
    );
    out.metric(
        "switchboard_list_entries_hidden_total",
        "counter",
        "Tools, prompts and resources hidden from list results by the policy or scopes.",
        &one(m.entries_hidden),
    );
    out.metric(
        "switchboard_reloads_total",
        "counter",
        "Configuration reloads (SIGHUP) that took effect.",
        &one(m.reloads),
    );
    out.metric(
        "switchboard_reload_failures_total",
        "counter",
        "Configuration reloads refused; the running configuration stayed.",
        &one(m.reload_failures),
    );
}

/// Messages by direction, drops by reason and method, rejections by reason.
fn render_messages(out: &mut Text, m: &Metrics) {
    let messages = vec![
        (
            r#"{direction="client_to_proxy"}"#.to_owned(),
            m.client_messages,
        ),
        (r#"{direction="proxy_to_backend"}"#.to_owned(), m.rewrites),
        (
            r#"{direction="proxy_own_to_backend"}"#.to_owned(),
            m.replies,
        ),
        (
            r#"{direction="backend_to_proxy"}"#.to_owned(),
            m.backend_lines,
        ),
        (r#"{direction="proxy_to_session"}"#.to_owned(), m.delivered),
        (
            r#"{direction="proxy_to_all_sessions"}"#.to_owned(),
            m.broadcasts,
        ),
    ];
    out.metric(
        "switchboard_messages_total",
        "counter",
        "Messages by direction.",
        &messages,
    );
    let drops: Vec<_> = m
        .drops
        .iter()
        .map(|((reason, method), n)| {
            (
                format!("{{reason=\"{reason}\",method=\"{}\"}}", escape(method)),
                *n,
            )
        })
        .collect();
    out.metric(
        "switchboard_drops_total",
        "counter",
        "Backend messages dropped or answered by the proxy, by reason and method.",
        &drops,
    );
    let rejections: Vec<_> = m
        .rejections
        .iter()
        .map(|(reason, n)| (format!("{{reason=\"{reason}\"}}"), *n))
        .collect();
    out.metric(
        "switchboard_rejections_total",
        "counter",
        "HTTP requests refused, by reason.",
        &rejections,
    );
}

/// Why a backend line (or part of a client's message) went nowhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DropReason {
    /// Not JSON, not one object, or duplicate top-level keys.
    Malformed,
    /// A JSON array (batch) from the backend.
    Batch,
    /// Longer than the maximum line length.
    LineTooLong,
    /// A response whose id the proxy never minted.
    UnroutedResponse,
    /// A response or progress for a session that is no longer live.
    SessionGone,
    /// A `notifications/progress` whose token is not a routed id.
    UnroutedProgress,
    /// A `notifications/resources/updated` no live session subscribed to.
    NoSubscriber,
    /// A broadcast-kind notification while no session is live.
    NoLiveSession,
    /// A notification the proxy cannot attribute (`notifications/message`, ...).
    UnroutableNotification,
    /// The backend sent a request the shared proxy cannot attribute; answered -32601.
    AnsweredServerRequest,
    /// The backend pinged; the proxy answered.
    AnsweredPing,
    /// The backend's stdin queue was full, so a proxy line was not written (shell-side).
    BackendQueueFull,
    /// An answer for a Streamable session's request that is no longer awaited (answered,
    /// cancelled, timed out, or its client hung up).
    NotInFlight,
    /// A message for a Streamable session that has no stream open to carry it.
    NoStream,
    /// A request waiting for a restarting backend whose client hung up: never forwarded,
    /// never answered.
    ClientLeft,
    /// A task request naming a task (or a cursor) its caller does not own: answered -32602
    /// (SPEC section 15).
    ForeignTask,
    /// A client request whose method MCP does not define and no `--pass-method` names:
    /// answered -32601 by the proxy.
    UnknownMethod,
    /// A client notification the backend is not given (SPEC section 15).
    ClientNotification,
    /// A client's `logging/setLevel`: answered `{}` by the proxy (it would set every
    /// client's level).
    LogLevel,
    /// `notifications/tasks/status` for a task no live session owns.
    TaskUnattributed,
}

impl DropReason {
    /// Stable snake_case name, used as a metrics label and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::Batch => "batch",
            DropReason::LineTooLong => "line_too_long",
            DropReason::UnroutedResponse => "unrouted_response",
            DropReason::SessionGone => "session_gone",
            DropReason::UnroutedProgress => "unrouted_progress",
            DropReason::NoSubscriber => "no_subscriber",
            DropReason::NoLiveSession => "no_live_session",
            DropReason::UnroutableNotification => "unroutable_notification",
            DropReason::AnsweredServerRequest => "answered_server_request",
            DropReason::AnsweredPing => "answered_ping",
            DropReason::BackendQueueFull => "backend_queue_full",
            DropReason::NotInFlight => "not_in_flight",
            DropReason::NoStream => "no_stream",
            DropReason::ClientLeft => "client_left",
            DropReason::ForeignTask => "foreign_task",
            DropReason::UnknownMethod => "unknown_method",
            DropReason::ClientNotification => "client_notification",
            DropReason::LogLevel => "log_level",
            DropReason::TaskUnattributed => "task_unattributed",
        }
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The level the router chose for a drop: the first of each (reason, method) warns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// The first of its kind.
    Warn,
    /// Seen before.
    Debug,
}

fn escape(label: &str) -> String {
    let mut out = String::with_capacity(label.len());
    for c in label.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// SPEC section 14's histograms (the MCP semantic conventions'), in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Histogram {
    /// A request from its arrival to its outcome.
    ServerOperation,
    /// A session from its opening to its end.
    ServerSession,
    /// The hop to the backend, from the write to its answer or the request's end.
    ClientOperation,
}

impl Histogram {
    /// The instrument's name in the conventions.
    pub fn name(self) -> &'static str {
        match self {
            Histogram::ServerOperation => "mcp.server.operation.duration",
            Histogram::ServerSession => "mcp.server.session.duration",
            Histogram::ClientOperation => "mcp.client.operation.duration",
        }
    }
}

/// The conventions' explicit bucket boundaries, in seconds, for all three histograms.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// One value for an OTLP histogram ([`crate::Output::Measured`]): the instrument, the
/// series (its label set) and the duration. A series' attributes (the conventions' names;
/// bounded values, never a session or request id) travel with its first exported value
/// only, so that the exporter binds each series once instead of looking its labels up on
/// every request.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Which histogram.
    pub histogram: Histogram,
    /// Which series: numbered from 0 in the order first measured, never reused.
    pub series: usize,
    /// The duration in seconds.
    pub seconds: f64,
    /// The series' attribute names and values, on its first exported value only.
    pub attributes: Option<Vec<(&'static str, Label)>>,
}

/// The label for anything outside its bounded set.
const OTHER: &str = "_OTHER";

/// The bounded `mcp.method.name` of `method`: one MCP defines, else `_OTHER`.
pub(crate) fn method_label(method: &str) -> &'static str {
    crate::methods::named(method).unwrap_or(OTHER)
}

/// The bounded `mcp.protocol.version` of a version a client named.
pub(crate) fn version_label(version: &str) -> &'static str {
    let version = version.trim();
    (crate::http::PROTOCOL_VERSIONS.iter())
        .chain([&crate::http::MODERN_VERSION])
        .find(|v| **v == version)
        .copied()
        .unwrap_or(OTHER)
}

/// The bounded `error.type`: a JSON-RPC or MCP error code (-32768..=-32000), an HTTP status,
/// `tool_error`; anything else `_OTHER`.
pub(crate) fn error_label(error: String) -> Label {
    match error.parse::<i64>() {
        Ok(code) if (-32768..=-32000).contains(&code) || (100..600).contains(&code) => {
            Label::Owned(error)
        }
        Ok(_) => Label::Borrowed(OTHER),
        Err(_) if error == "tool_error" => Label::Borrowed("tool_error"),
        Err(_) => Label::Borrowed(OTHER),
    }
}

/// What a request's duration is labelled with, decided as it arrives and is read.
#[derive(Debug, Default, Clone)]
pub(crate) struct Operation {
    /// Its bounded method name, once its message is read.
    pub(crate) method: Option<&'static str>,
    /// The tool or prompt it names (bounded when measured).
    pub(crate) target: Option<String>,
    /// Its bounded protocol version, from its header or its `initialize`.
    pub(crate) protocol: Option<&'static str>,
    /// When its line was queued for the backend, if it was.
    pub(crate) hop: Option<std::time::Instant>,
}

/// A measurement's attribute names and (bounded) values.
pub(crate) type Attributes = Vec<(&'static str, Label)>;

/// A label's value: most are the conventions' own words, so borrowed; a tool's name or an
/// error code is owned.
pub type Label = std::borrow::Cow<'static, str>;

/// One histogram's counts: one per bucket of [`DURATION_BUCKETS`], then `+Inf`.
#[derive(Debug, Default, Clone)]
struct Buckets {
    counts: [u64; DURATION_BUCKETS.len() + 1],
    sum: f64,
}

/// One label set's counts, its [`Measurement::series`] number, and whether the exporter
/// was told its attributes.
#[derive(Debug, Clone)]
struct Series {
    number: usize,
    announced: bool,
    buckets: Buckets,
}

/// The three histograms (SPEC section 14) by their label sets, and what bounds their
/// labels: the tool and prompt names the backend offered in its last lists.
#[derive(Debug, Default, Clone)]
pub(crate) struct Durations {
    series: BTreeMap<(Histogram, Attributes), Series>,
    offered: BTreeMap<&'static str, BTreeSet<String>>,
    /// When each open session opened, by its number.
    pub(crate) opened: BTreeMap<crate::routed_id::SessionId, std::time::Instant>,
}

impl Durations {
    /// Counts `seconds` under `attributes`; returns the measurement for OTLP when
    /// `exported` (the off path clones nothing, and the exported one its series'
    /// attributes only the first time).
    pub(crate) fn record(
        &mut self,
        histogram: Histogram,
        seconds: f64,
        attributes: Attributes,
        exported: bool,
    ) -> Option<Measurement> {
        let number = self.series.len();
        let (series, announce) = match self.series.entry((histogram, attributes)) {
            Entry::Vacant(vacant) => {
                let announce = exported.then(|| vacant.key().1.clone());
                let series = Series {
                    number,
                    announced: exported,
                    buckets: Buckets::default(),
                };
                (vacant.insert(series), announce)
            }
            Entry::Occupied(occupied) => {
                let announce =
                    (exported && !occupied.get().announced).then(|| occupied.key().1.clone());
                (occupied.into_mut(), announce)
            }
        };
        series.announced |= exported;
        let bucket = DURATION_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(DURATION_BUCKETS.len());
        series.buckets.counts[bucket] += 1;
        series.buckets.sum += seconds;
        exported.then_some(Measurement {
            histogram,
            series: series.number,
            seconds,
            attributes: announce,
        })
    }

    /// A backend's `tools/list` or `prompts/list` result: its names bound the labels.
    pub(crate) fn learn(&mut self, method: &str, message: &[u8]) {
        let (member, label) = match method {
            "tools/list" => ("tools", "gen_ai.tool.name"),
            "prompts/list" => ("prompts", "gen_ai.prompt.name"),
            _ => return,
        };
        let value: serde_json::Value = serde_json::from_slice(message).unwrap_or_default();
        let Some(entries) = value["result"][member].as_array() else {
            return;
        };
        let names = entries.iter().filter_map(|e| e["name"].as_str());
        let names: BTreeSet<String> = names.take(OFFERED_CAP).map(str::to_owned).collect();
        self.offered.insert(label, names);
    }

    /// The attributes of a request's duration: `transport` its `network.transport`.
    pub(crate) fn operation_attributes(&self, op: &Operation, error: Option<String>) -> Attributes {
        let method = op.method.unwrap_or(OTHER);
        let mut attributes = Vec::with_capacity(5);
        attributes.push(("mcp.method.name", Label::Borrowed(method)));
        let label = match method {
            "tools/call" => Some("gen_ai.tool.name"),
            "prompts/get" => Some("gen_ai.prompt.name"),
            _ => None,
        };
        if let (Some(label), Some(target)) = (label, &op.target) {
            let offered = self.offered.get(label).is_some_and(|o| o.contains(target));
            let name = match offered {
                true => Label::Owned(target.clone()),
                false => Label::Borrowed(OTHER),
            };
            attributes.push((label, name));
        }
        if let Some(error) = error {
            attributes.push(("error.type", error_label(error)));
        }
        if let Some(version) = op.protocol {
            attributes.push(("mcp.protocol.version", Label::Borrowed(version)));
        }
        attributes.push(("network.transport", Label::Borrowed("tcp")));
        attributes
    }
}

/// The histograms as Prometheus text: `_bucket` (cumulative, `le`), `_sum`, `_count`.
fn render_durations(out: &mut Text, d: &Durations) {
    for histogram in [
        Histogram::ServerOperation,
        Histogram::ServerSession,
        Histogram::ClientOperation,
    ] {
        let name = format!("{}_seconds", histogram.name().replace('.', "_"));
        let _ = writeln!(
            out.0,
            "# HELP {name} The conventions' {}, in seconds.\n# TYPE {name} histogram",
            histogram.name()
        );
        let series = d.series.iter().filter(|((h, _), _)| *h == histogram);
        for ((_, attributes), Series { buckets, .. }) in series {
            let labels: Vec<String> = (attributes.iter())
                .map(|(k, v)| format!("{}=\"{}\"", k.replace('.', "_"), escape(v)))
                .collect();
            let labels = labels.join(",");
            let sep = if labels.is_empty() { "" } else { "," };
            let mut total = 0;
            let bounds = DURATION_BUCKETS.iter().map(f64::to_string);
            for (bound, count) in bounds.chain(["+Inf".to_owned()]).zip(buckets.counts) {
                total += count;
                let _ = writeln!(
                    out.0,
                    "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {total}"
                );
            }
            let _ = writeln!(out.0, "{name}_sum{{{labels}}} {}", buckets.sum);
            let _ = writeln!(out.0, "{name}_count{{{labels}}} {total}");
        }
    }
}

/// `switchboard_list_cache_total{method,outcome}` (SPEC section 16): list requests answered
/// from the cache, fetched for it, or joined to a fetch already out.
pub(crate) fn render_list_cache(out: &mut String, counts: &crate::lists::Counts) {
    let name = "switchboard_list_cache_total";
    let _ = writeln!(
        out,
        "# HELP {name} List requests answered from the list cache (hit), fetched for it (miss) or joined to a fetch already out (shared).\n# TYPE {name} counter"
    );
    for (method, counts) in counts {
        for (outcome, n) in ["hit", "miss", "shared"].iter().zip(counts) {
            let _ = writeln!(
                out,
                r#"{name}{{method="{method}",outcome="{outcome}"}} {n}"#
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_render_as_prometheus_histograms_with_bounded_labels() {
        let mut m = Metrics::default();
        let listed = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"echo"}]}}"#;
        m.durations.learn("tools/list", listed);
        let op = |target: &str| Operation {
            method: Some(method_label("tools/call")),
            target: Some(target.to_owned()),
            protocol: Some(version_label("2025-06-18")),
            hop: None,
        };
        let offered = m.durations.operation_attributes(&op("echo"), None);
        let d = &mut m.durations;
        assert_eq!(
            d.record(Histogram::ServerOperation, 0.03, offered, false),
            None
        );
        let invented = m
            .durations
            .operation_attributes(&op("x"), Some("-1".into()));
        let measured = m
            .durations
            .record(Histogram::ServerOperation, 400.0, invented, true);
        assert_eq!(measured.map(|m| m.seconds), Some(400.0));
        let text = render(&m, ShellGauges::default());
        let labels = r#"mcp_method_name="tools/call",gen_ai_tool_name="echo",mcp_protocol_version="2025-06-18",network_transport="tcp""#;
        let bucket = |le: &str| {
            format!("mcp_server_operation_duration_seconds_bucket{{{labels},le=\"{le}\"}}")
        };
        assert!(text.contains(&format!("{} 0\n", bucket("0.02"))), "{text}");
        assert!(text.contains(&format!("{} 1\n", bucket("0.05"))), "{text}");
        assert!(text.contains(&format!("{} 1\n", bucket("+Inf"))), "{text}");
        assert!(text.contains("# TYPE mcp_server_operation_duration_seconds histogram"));
        assert!(
            text.contains(r#"gen_ai_tool_name="_OTHER",error_type="_OTHER""#),
            "{text}"
        );
        assert_eq!(method_label("made/up"), "_OTHER");
        // The 2025-11-25 task methods are MCP's too (they read `_OTHER` before).
        assert_eq!(method_label("tasks/result"), "tasks/result");
        assert_eq!(version_label("1999-01-01"), "_OTHER");
    }

    #[test]
    fn an_exported_series_brings_its_attributes_once_and_keeps_its_number() {
        let mut d = Durations::default();
        let labels = |method: &str| vec![("mcp.method.name", Label::Owned(method.to_owned()))];
        let mut record =
            |method, exported| d.record(Histogram::ServerOperation, 0.01, labels(method), exported);
        // Counted before export began: announced with its first exported value.
        assert_eq!(record("ping", false), None);
        let first = record("ping", true).unwrap();
        assert_eq!(first.series, 0);
        assert_eq!(first.attributes, Some(labels("ping")));
        let again = record("ping", true).unwrap();
        assert_eq!((again.series, again.attributes), (0, None));
        let other = record("tools/list", true).unwrap();
        assert_eq!(other.series, 1);
        assert_eq!(other.attributes, Some(labels("tools/list")));
        let session = d.record(Histogram::ServerSession, 1.0, labels("ping"), true);
        assert_eq!(
            session.map(|m| (m.series, m.attributes.is_some())),
            Some((2, true))
        );
    }
}
