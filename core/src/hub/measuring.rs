//! The histograms' reader of what happened (SPEC section 14, "Metrics"): every request's
//! and session's duration is counted for `/metrics`, whether spans are made or not, and
//! with spans made also goes out as an [`Output::Measured`] for the OTLP exporter.

use std::collections::VecDeque;
use std::time::Instant;

use super::auditing::Happened;
use super::exchanges::{Exchanges, Started};
use super::sessions::Sessions;
use crate::message::Checked;
use crate::metrics::{method_label, version_label, Durations, Histogram};
use crate::output::Output;
use crate::trace::Ending;

/// The parts the histograms read and write; `exported`: spans (and measurements) are made.
pub(super) struct Measuring<'a> {
    pub(super) durations: &'a mut Durations,
    pub(super) exchanges: &'a mut Exchanges,
    pub(super) sessions: &'a Sessions,
    pub(super) outputs: &'a mut VecDeque<Output>,
    pub(super) exported: bool,
}

impl Measuring<'_> {
    /// Counts what `happened`, if it ends a request or a session.
    pub(super) fn observe(&mut self, now: Instant, happened: &Happened<'_>) {
        match happened {
            Happened::Described(request, msg) => {
                if let Some(started) = self.exchanges.started_mut(*request) {
                    described(started, msg);
                }
            }
            Happened::Refused(started, response) => {
                let ending = Ending::Refused(response.status, &response.body);
                self.operation(now, started, ending);
            }
            Happened::Answered {
                started,
                message,
                outcome,
                ..
            } => {
                if outcome.is_none() {
                    let method = started.op.method.unwrap_or_default();
                    self.durations.learn(method, message);
                }
                self.operation(now, started, Ending::Answered(message));
            }
            Happened::Unanswered(_, started) => self.operation(now, started, Ending::Unanswered),
            Happened::Opened(number) => {
                if let Some(session) = self.sessions.get(*number) {
                    self.durations.opened.insert(session.id, now);
                }
            }
            Happened::Closed(number, fault) => {
                let session = self.sessions.get(*number);
                let opened = session.and_then(|s| self.durations.opened.remove(&s.id));
                if let Some(opened) = opened {
                    let mut attributes = vec![("network.transport", "tcp".to_owned())];
                    if let Some(fault) = fault {
                        attributes.push(("error.type", (*fault).to_owned()));
                    }
                    let seconds = now.saturating_duration_since(opened).as_secs_f64();
                    self.record(Histogram::ServerSession, seconds, attributes);
                }
            }
            Happened::TurnedAway(..) | Happened::Introduced(..) | Happened::Restarted => {}
        }
    }

    /// A request ended with `ending`: its `mcp.server.operation.duration`, and the
    /// `mcp.client.operation.duration` of its hop to the backend, if it made one.
    fn operation(&mut self, now: Instant, started: &Started, ending: Ending<'_>) {
        let Some(_) = started.op.method else {
            return;
        };
        let (_, error) = ending.attributes();
        let attributes = self.durations.operation_attributes(&started.op, error);
        if let Some(hop) = started.op.hop {
            let mut attributes = attributes.clone();
            let transport = attributes
                .iter_mut()
                .find(|(k, _)| *k == "network.transport");
            if let Some(transport) = transport {
                // The backend is a child process on stdio.
                transport.1 = "pipe".to_owned();
            }
            let seconds = now.saturating_duration_since(hop).as_secs_f64();
            self.record(Histogram::ClientOperation, seconds, attributes);
        }
        let seconds = now.saturating_duration_since(started.at).as_secs_f64();
        self.record(Histogram::ServerOperation, seconds, attributes);
    }

    fn record(
        &mut self,
        histogram: Histogram,
        seconds: f64,
        attributes: Vec<(&'static str, String)>,
    ) {
        let measured = self
            .durations
            .record(histogram, seconds, attributes, self.exported);
        if let Some(measured) = measured {
            self.outputs.push_back(Output::Measured(Box::new(measured)));
        }
    }
}

/// A request's message was read: its method, the tool or prompt it names, and (an
/// `initialize` with no version header) the version it asks for.
fn described(started: &mut Started, msg: &Checked) {
    let op = &mut started.op;
    op.method = Some(method_label(&msg.method));
    op.target = match msg.method.as_str() {
        "tools/call" => msg.tool.clone(),
        "prompts/get" => msg.name.clone(),
        _ => None,
    };
    if op.protocol.is_none() && msg.method == "initialize" {
        op.protocol = crate::trace::asked_version(msg)
            .as_deref()
            .map(version_label);
    }
}
