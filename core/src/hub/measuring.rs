//! The histograms' part (SPEC section 14, "Metrics"): every request's and session's
//! duration is counted for `/metrics`, whether spans are made or not, and with spans made
//! also goes out as an [`Output::Measured`] for the OTLP exporter.

use std::collections::VecDeque;
use std::time::Instant;

use super::exchanges::Started;
use crate::message::Checked;
use crate::metrics::{method_label, version_label, Attributes, Durations, Histogram};
use crate::output::Output;
use crate::routed_id::SessionId;
use crate::trace::EndingRead;

/// The histograms and where their measurements go; `exported`: spans (and measurements)
/// are made.
pub(super) struct Measuring<'a> {
    pub(super) durations: &'a mut Durations,
    pub(super) outputs: &'a mut VecDeque<Output>,
    pub(super) exported: bool,
}

impl Measuring<'_> {
    /// A request ended as `read` says: its `mcp.server.operation.duration`, and the
    /// `mcp.client.operation.duration` of its hop to the backend, if it made one.
    pub(super) fn operation(&mut self, now: Instant, started: &Started, read: &EndingRead) {
        let Some(_) = started.op.method else {
            return;
        };
        let attributes = self
            .durations
            .operation_attributes(&started.op, read.1.clone());
        if let Some(hop) = started.op.hop {
            let mut attributes = attributes.clone();
            let transport = attributes
                .iter_mut()
                .find(|(k, _)| *k == "network.transport");
            if let Some(transport) = transport {
                // The backend is a child process on stdio.
                transport.1 = "pipe".into();
            }
            let seconds = now.saturating_duration_since(hop).as_secs_f64();
            self.record(Histogram::ClientOperation, seconds, attributes);
        }
        let seconds = now.saturating_duration_since(started.at).as_secs_f64();
        self.record(Histogram::ServerOperation, seconds, attributes);
    }

    /// The backend answered `started`: a list's names bound the tool and prompt labels.
    pub(super) fn answered_by_backend(&mut self, started: &Started, message: &[u8]) {
        let method = started.op.method.unwrap_or_default();
        self.durations.learn(method, message);
    }

    /// Session `id` opened.
    pub(super) fn opened(&mut self, now: Instant, id: SessionId) {
        self.durations.opened.insert(id, now);
    }

    /// Session `id` closed: its `mcp.server.session.duration`, with the fault it was ended
    /// for, if any.
    pub(super) fn closed(&mut self, now: Instant, id: SessionId, fault: Option<&'static str>) {
        let Some(opened) = self.durations.opened.remove(&id) else {
            return;
        };
        let mut attributes = vec![("network.transport", "tcp".into())];
        if let Some(fault) = fault {
            attributes.push(("error.type", fault.into()));
        }
        let seconds = now.saturating_duration_since(opened).as_secs_f64();
        self.record(Histogram::ServerSession, seconds, attributes);
    }

    fn record(&mut self, histogram: Histogram, seconds: f64, attributes: Attributes) {
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
pub(super) fn described(started: &mut Started, msg: &Checked) {
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
