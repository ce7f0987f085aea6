//! Counters and their Prometheus text.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::action::DropReason;
use crate::http::Rejection;

/// Everything the router counts. Labels are bounded: methods beyond the warn set are
/// counted as `other`.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    /// Sessions opened.
    pub sessions_opened: u64,
    /// Sessions closed, for any reason.
    pub sessions_closed: u64,
    /// Client messages accepted (202).
    pub client_messages: u64,
    /// Lines written to the backend on a client's behalf.
    pub rewrites: u64,
    /// The proxy's own lines to the backend.
    pub replies: u64,
    /// Lines read from the backend.
    pub backend_lines: u64,
    /// Messages delivered to one session.
    pub delivered: u64,
    /// Messages broadcast to every live session.
    pub broadcasts: u64,
    /// Drops and proxy answers by reason and method (bounded labels).
    pub drops: BTreeMap<(DropReason, String), u64>,
    /// Refused HTTP requests by reason.
    pub rejections: BTreeMap<&'static str, u64>,
}

impl Metrics {
    pub(crate) fn dropped(&mut self, reason: DropReason, method: String) {
        *self.drops.entry((reason, method)).or_default() += 1;
    }

    pub(crate) fn rejected(&mut self, rejection: &Rejection) {
        *self.rejections.entry(rejection.as_str()).or_default() += 1;
    }
}

/// Gauges the hub keeps beside the router's counters.
#[derive(Debug, Default, Clone, Copy)]
pub struct ShellGauges {
    /// Sessions live now.
    pub live_sessions: usize,
    /// Whether the backend process runs.
    pub backend_running: bool,
    /// Restarts so far.
    pub backend_restarts: u64,
    /// The `--instance` name, rendered as `switchboard_instance_info{instance="NAME"} 1`.
    pub instance: Option<crate::routed_id::Instance>,
}

/// Renders the Prometheus text exposition format.
pub fn render(m: &Metrics, g: ShellGauges) -> String {
    let mut out = String::with_capacity(2048);
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let one = |v: u64| vec![(String::new(), v)];
    metric(
        "switchboard_sessions",
        "gauge",
        "Live sessions.",
        &one(g.live_sessions as u64),
    );
    metric(
        "switchboard_sessions_opened_total",
        "counter",
        "Sessions opened.",
        &one(m.sessions_opened),
    );
    metric(
        "switchboard_sessions_closed_total",
        "counter",
        "Sessions closed.",
        &one(m.sessions_closed),
    );
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
    metric(
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
    metric(
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
    metric(
        "switchboard_rejections_total",
        "counter",
        "HTTP requests refused, by reason.",
        &rejections,
    );
    metric(
        "switchboard_backend_up",
        "gauge",
        "1 while the backend process runs.",
        &one(u64::from(g.backend_running)),
    );
    metric(
        "switchboard_backend_restarts_total",
        "counter",
        "Backend restarts.",
        &one(g.backend_restarts),
    );
    if let Some(instance) = g.instance {
        metric(
            "switchboard_instance_info",
            "gauge",
            "The --instance name this process mints session ids under.",
            &[(format!("{{instance=\"{instance}\"}}"), 1)],
        );
    }
    out
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
