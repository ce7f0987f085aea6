//! The spans' reader of what happened (SPEC section 14): a request's SERVER span is decided
//! when it arrives (its message admitted by the shell), its CLIENT child starts when its
//! line is queued for the backend, and both end with its outcome, the moment its audit
//! event is written. Only sampled requests carry a span; with tracing off nothing here runs.

use std::collections::VecDeque;
use std::time::Instant;

use super::exchanges::Started;
use super::in_flight::{Caller, InFlight};
use crate::message::Checked;
use crate::output::Output;
use crate::routed_id::SessionId;
use crate::router::{Forward, Router};
use crate::settings::Tracing;
use crate::trace::{Ending, Value};

/// The observation context of request `msg` of session `number`, if it is in flight and is
/// no `initialize` (the proxy's own message to the backend carries no client's context).
fn started_of<'a>(
    in_flight: &'a mut InFlight,
    caller: Caller,
    msg: &Checked,
) -> Option<&'a mut Started> {
    let id = msg.id.as_ref().filter(|_| msg.method != "initialize")?;
    let entry = in_flight.get_mut(caller, &id.key)?;
    entry.audit.as_deref_mut()
}

/// The router's decision for `msg` of `caller`, routed under `sid`; with spans made, a
/// sampled request's line carries its CLIENT span's context in `params._meta`, and that
/// span starts as the line is queued for the backend (as does its hop's duration, always).
pub(super) fn forward(
    (router, in_flight, tracing): (&mut Router, &mut InFlight, Option<Tracing>),
    (sid, caller, now): (SessionId, Caller, Instant),
    msg: &Checked,
    filtered: bool,
) -> Forward {
    let Some(started) = started_of(in_flight, caller, msg) else {
        return router.forward(sid, msg, filtered);
    };
    let span = started.trace.as_deref_mut().filter(|_| tracing.is_some());
    let carried = span.as_ref().and_then(|span| span.carried(msg));
    let forward = router.forward(sid, carried.as_ref().unwrap_or(msg), filtered);
    if matches!(forward, Forward::Line(_)) {
        if let Some(span) = span {
            span.hop(now);
        }
        started.op.hop = Some(now);
    }
    forward
}

/// A request ended: its spans, if it has any (`session`: the session it belongs to).
pub(super) fn end(
    outputs: &mut VecDeque<Output>,
    now: Instant,
    started: &mut Started,
    ending: Ending<'_>,
    session: Option<SessionId>,
) {
    let Some(span) = started.trace.take() else {
        return;
    };
    let session = session.or(started.session);
    let common = [
        ("network.transport", Some("tcp".to_owned())),
        ("network.protocol.name", Some("http".to_owned())),
        ("network.protocol.version", Some("1.1".to_owned())),
        ("client.address", started.source.ip.map(|ip| ip.to_string())),
        ("user.id", Some(started.principal.to_string())),
        ("mcp.session.id", session.map(|s| s.as_str().to_owned())),
    ];
    let port = (started.source.port).map(|port| ("client.port", Value::Int(port.into())));
    let common = (common.into_iter())
        .filter_map(|(k, v)| Some((k, Value::Str(v?))))
        .chain(port);
    let (server, client) = span.finish((started.at, now), ending, common);
    if let Some(client) = client {
        outputs.push_back(Output::Span(Box::new(client)));
    }
    outputs.push_back(Output::Span(Box::new(server)));
}
