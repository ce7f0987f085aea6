//! The spans' reader of what happened (SPEC section 14): a request's SERVER span is decided
//! when it arrives (its message admitted by the shell), its CLIENT child starts when its
//! line is queued for the backend, and both end with its outcome, the moment its audit
//! event is written. Only sampled requests carry a span; with tracing off nothing here runs.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::time::Instant;

use super::exchanges::Started;
use super::in_flight::{Caller, InFlight};
use crate::message::Checked;
use crate::output::Output;
use crate::routed_id::{Mark, SessionId};
use crate::router::{Forward, Router};
use crate::trace::{Carried, EndingRead, Tracing, Value};

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
    mark: Mark,
) -> Forward {
    let Some(started) = started_of(in_flight, caller, msg) else {
        return router.forward(sid, msg, mark);
    };
    let span = started.trace.as_deref_mut().filter(|_| tracing.is_some());
    let carried = span.as_ref().and_then(|span| span.carried(msg));
    let forward = match &carried {
        Some(Carried::Edits(edits)) => router.forward_edited(sid, msg, mark, edits),
        Some(Carried::Rewritten(carried)) => router.forward(sid, carried, mark),
        None => router.forward(sid, msg, mark),
    };
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
    read: &EndingRead,
    session: Option<SessionId>,
) {
    let Some(span) = started.trace.take() else {
        return;
    };
    let session = session.or(started.session);
    let common: [(_, Option<Cow<'static, str>>); 6] = [
        ("network.transport", Some("tcp".into())),
        ("network.protocol.name", Some("http".into())),
        ("network.protocol.version", Some("1.1".into())),
        (
            "client.address",
            started.source.ip.map(|ip| ip.to_string().into()),
        ),
        ("user.id", Some(started.principal.to_string().into())),
        (
            "mcp.session.id",
            session.map(|s| s.as_str().to_owned().into()),
        ),
    ];
    let port = (started.source.port).map(|port| ("client.port", Value::Int(port.into())));
    let common = (common.into_iter())
        .filter_map(|(k, v)| Some((k, Value::Str(v?))))
        .chain(port);
    let (server, client) = span.finish((started.at, now), read, common);
    if let Some(client) = client {
        outputs.push_back(Output::Span(Box::new(client)));
    }
    outputs.push_back(Output::Span(Box::new(server)));
}
