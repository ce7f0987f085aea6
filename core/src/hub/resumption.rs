//! Streamable SSE streams as the hub writes them (SPEC section 12): each event numbered and
//! kept in its session's [`EventLog`](super::resume::EventLog), a dropped stream kept for
//! `--resume-window`, and a `GET` with `Last-Event-ID` that replays the rest of one stream
//! and then continues it. The sessions part keeps the streams' logs and windows and says
//! what follows; the hub writes and ends the shell's streams and lets requests go.

use std::sync::Arc;
use std::time::Instant;

use super::in_flight::Settlement;
use super::resume::{event_id, parse_event_id, Budget, Carries, StreamKey, Unreplayable};
use super::sessions::{Gone, SessionNumber};
use super::streams::Role;
use super::Hub;
use crate::http::{self, Rejection};
use crate::output::{Frame, RequestId, StreamId};
use crate::routed_id::SessionId;
use crate::{sse, streamable};

impl Hub {
    /// Answers `request` with a new stream of session `number` carrying `carries`, opened
    /// by a priming event (position 0, empty data) when `priming` (a 2025-11-25 client's
    /// request stream).
    pub(super) fn open_mcp_stream(
        &mut self,
        now: Instant,
        request: RequestId,
        (number, sid): (SessionNumber, SessionId),
        carries: Carries,
        priming: bool,
    ) -> StreamKey {
        let stream = StreamId(self.mint());
        let head = streamable::with_session(http::sse_head(), sid);
        let m = self.sessions.mcp_mut(number).expect("a live session");
        let key = m.log.open(carries, stream);
        self.start_stream(now, request, (stream, head), number, Role::Mcp(key));
        if priming {
            let frame = sse::priming(&event_id(key, 0));
            self.streams
                .send(now, (stream, Frame::Owned(frame)), &mut self.outputs);
        }
        key
    }

    /// `message` as the next event of stream `key`: kept for resumption, and written at
    /// once when its client is there.
    pub(super) fn send_event(
        &mut self,
        now: Instant,
        number: SessionNumber,
        key: StreamKey,
        message: &[u8],
    ) {
        let budget = Budget::of(&self.settings);
        let event: Arc<[u8]> = Arc::from(sse::message_event(message));
        let Some(id) = self
            .sessions
            .keep_event((number, key), event.clone(), budget)
        else {
            return;
        };
        let m = self.sessions.mcp(number).expect("kept above");
        if let Some(stream) = m.log.get(key).and_then(|log| log.attached) {
            self.streams.send(
                now,
                (stream, Frame::Owned(sse::with_id(&id, &event))),
                &mut self.outputs,
            );
        }
    }

    /// Stream `key`'s request was answered: the stream ends, its events stay for the
    /// resume window.
    pub(super) fn finish_stream(&mut self, now: Instant, number: SessionNumber, key: StreamKey) {
        let window = self.settings.resume_window;
        if let Some(stream) = self.sessions.finish_stream(now, (number, key), window) {
            self.streams.end(stream, &mut self.outputs);
        }
    }

    /// Stream `key` lost its reader (`gone` says how). Its connection dropped: with
    /// resumption its events are kept (and more are added) for the resume window; without,
    /// a request stops waiting (a disconnect is not a cancellation; the late answer is
    /// dropped) and a GET stream is gone. Its window passed, or its answer was lost: its
    /// events go, its request is awaited no longer, and resuming it is answered -32001.
    /// Dropped by the hub: it ends and is forgotten (its client did nothing).
    pub(super) fn stream_gone(
        &mut self,
        now: Instant,
        number: SessionNumber,
        key: StreamKey,
        gone: Gone,
    ) {
        let window = self.settings.resume_window;
        let Some(unattended) = self.sessions.unattend(now, (number, key), gone, window) else {
            return;
        };
        if let Some(id) = unattended.abandoned {
            if let Some(entry) = self.in_flight.abandon((number, key), &id) {
                self.settle(now, (Some(number.into()), entry), Settlement::Gone);
            }
        }
        if let Some(stream) = unattended.attached {
            self.streams.end(stream, &mut self.outputs);
        }
        if gone != Gone::Dropped {
            self.touch(number, now);
        }
    }

    /// `GET /mcp` with `Last-Event-ID`: the stream it names replays its later events, then
    /// continues; its request's progress and response arrive there, once. With nothing
    /// left to continue, the answer is a stream of no log (number 0) that ends at once,
    /// carrying -32001 under the request's own id when its events are gone.
    pub(super) fn resume(
        &mut self,
        now: Instant,
        request: RequestId,
        (number, sid): (SessionNumber, SessionId),
        last_event_id: &str,
    ) -> Result<(), Rejection> {
        let (key, position) = parse_event_id(last_event_id).ok_or(Rejection::UnknownEventId)?;
        let m = self.sessions.mcp(number).expect("a live session");
        let replayed = match m.log.replay(key, position) {
            Err(Unreplayable::Unknown) => return Err(Rejection::UnknownEventId),
            Err(Unreplayable::Lost(raw_id)) => {
                self.stream_gone(now, number, key, Gone::Lost);
                let raw_id = raw_id.unwrap_or_else(|| "null".to_owned());
                let text = "response lost: resume window exceeded";
                Err(Some(streamable::error_message(&raw_id, -32001, text)))
            }
            Err(Unreplayable::Answered) => Err(None),
            Ok(events) => Ok(events),
        };
        let stream = StreamId(self.mint());
        let head = streamable::with_session(http::sse_head(), sid);
        match replayed {
            Ok(events) => {
                self.start_stream(now, request, (stream, head), number, Role::Mcp(key));
                let again = self.sessions.reattach((number, key), stream);
                for old in [again.previous, again.replaced].into_iter().flatten() {
                    self.streams.end(old, &mut self.outputs);
                }
                for (id, event) in events {
                    self.streams.send(
                        now,
                        (stream, Frame::Owned(sse::with_id(&id, &event))),
                        &mut self.outputs,
                    );
                }
                if again.finished {
                    self.finish_stream(now, number, key);
                }
            }
            Err(message) => {
                self.start_stream(now, request, (stream, head), number, Role::Mcp(0));
                if let Some(message) = message {
                    self.streams.send(
                        now,
                        (stream, Frame::Owned(sse::message_event(&message))),
                        &mut self.outputs,
                    );
                }
                self.streams.end(stream, &mut self.outputs);
            }
        }
        self.touch(number, now);
        Ok(())
    }
}
