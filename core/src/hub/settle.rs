//! The one exit of a request owed an answer, of either transport or era: whatever ends it
//! (its answer, the proxy's error, a cancel, its client, stream or session gone), its
//! answer goes where its record says and its outcome is observed once, here, the same way
//! for every kind (SPEC section 11).

use std::collections::VecDeque;
use std::time::Instant;

use super::auditing::Happened;
use super::exchanges::{Answer, Exchanges};
use super::in_flight::{Caller, Entry, Settlement, Waiting};
use super::sessions::{Gone, Kind, SessionNumber, Sessions};
use super::streams::Streams;
use super::Hub;
use crate::http::Response;
use crate::output::{Frame, Output, RequestId};
use crate::{sse, streamable};

impl Hub {
    /// Ends request `entry` of `caller` (`None`: one never forwarded, which has no answer
    /// to carry: its exchange was answered, or its client left): the `initialize` that
    /// opens a Streamable session opens it or not, the outcome is observed, then the answer
    /// travels (to a legacy stream, a Streamable stream or JSON body, a 2026-07-28 stream
    /// or JSON body).
    pub(super) fn settle(
        &mut self,
        now: Instant,
        (caller, mut entry): (Option<Caller>, Entry),
        settlement: Settlement,
    ) {
        let number = caller.and_then(Caller::session);
        let failed_open = match number {
            Some(number) => self.settle_opening(now, (number, &mut entry), &settlement),
            None => None,
        };
        // A legacy answer goes out first: routed by its id, it never waited for the record.
        let parts = (&self.sessions, &mut self.streams, &mut self.outputs);
        legacy_carried(parts, now, (number, entry.exchange), &settlement);
        if let Some(started) = entry.audit.take() {
            let happened = match &settlement {
                Settlement::Answered {
                    message, outcome, ..
                } => Happened::answered(number, started, message, *outcome),
                _ => Happened::Unanswered(number, started),
            };
            self.observe(now, happened);
        }
        let (number, exchange) = match (caller, entry.exchange) {
            (Some(Caller::Modern(key)), _) => {
                let waiting = self.modern.remove(&key);
                let parts = (&mut self.streams, &mut self.exchanges, &mut self.outputs);
                let carried = waiting.and_then(|w| modern_carried(parts, now, &w, settlement));
                if let Some((exchange, answer)) = carried {
                    self.respond(now, exchange, answer);
                }
                return;
            }
            (Some(Caller::Session(number)), Some(exchange)) => (number, exchange),
            (Some(Caller::Session(_)), None) | (None, _) => return,
        };
        let sid = self.sessions.get(number).map(|s| s.id);
        let json = |message: Vec<u8>| match (failed_open, sid) {
            (Some(true), _) => streamable::sse_answer(&message),
            (Some(false), _) | (None, None) => streamable::json_answer(message),
            (None, Some(sid)) => streamable::with_session(streamable::json_answer(message), sid),
        };
        match (settlement, entry.stream.filter(|_| failed_open.is_none())) {
            (Settlement::Answered { message, .. }, Some(key)) => {
                self.send_event(now, number, key, &message);
                self.finish_stream(now, number, key);
            }
            (Settlement::Answered { message, .. }, None) => {
                self.respond(now, exchange, Answer::Served(json(message)))
            }
            (Settlement::Cancelled, Some(key)) => self.stream_gone(now, number, key, Gone::Dropped),
            (Settlement::Cancelled, None) => {
                let text = "Request cancelled";
                let message = streamable::error_message(&entry.raw_id, -32800, text);
                self.respond(now, exchange, Answer::Served(json(message)));
            }
            (Settlement::Gone, _) => {}
        }
    }
}

/// How a 2026-07-28 request's end travels: the last event of its stream, which ends, or a
/// JSON body (returned, for the exchange); nothing but its stream's end or its exchange's
/// close when it is not answered.
fn modern_carried(
    (streams, exchanges, outputs): (&mut Streams, &mut Exchanges, &mut VecDeque<Output>),
    now: Instant,
    waiting: &Waiting,
    settlement: Settlement,
) -> Option<(RequestId, Answer)> {
    match (settlement, waiting.stream) {
        (Settlement::Answered { message, .. }, Some(stream)) => {
            let frame = Frame::Owned(sse::message_event(&message));
            streams.send(now, (stream, frame), outputs);
            streams.end(stream, outputs);
        }
        (
            Settlement::Answered {
                message, status, ..
            },
            None,
        ) => {
            let answer = Answer::Served(Response::json(status, message));
            return Some((waiting.exchange, answer));
        }
        (_, Some(stream)) => streams.end(stream, outputs),
        (_, None) => {
            let _ = exchanges.close(waiting.exchange);
        }
    }
    None
}

/// A legacy request's answer travels on its session's stream (routed by its id, it needs
/// no record: the record is what observes it).
fn legacy_carried(
    (sessions, streams, outputs): (&Sessions, &mut Streams, &mut VecDeque<Output>),
    now: Instant,
    (number, exchange): (Option<SessionNumber>, Option<RequestId>),
    settlement: &Settlement,
) {
    let (Some(number), None, Settlement::Answered { message, .. }) = (number, exchange, settlement)
    else {
        return;
    };
    if let Some(Kind::Legacy { stream }) = sessions.get(number).map(|s| &s.kind) {
        let frame = Frame::Owned(sse::message_event(message));
        streams.send(now, (*stream, frame), outputs);
    }
}
