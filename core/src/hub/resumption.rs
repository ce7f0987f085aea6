//! Streamable SSE streams as the hub writes them (SPEC section 12): each event numbered and
//! kept in its session's [`EventLog`], a dropped stream kept for `--resume-window`, and a
//! `GET` with `Last-Event-ID` that replays the rest of one stream and then continues it.

use std::sync::Arc;
use std::time::Instant;

use super::auditing::Happened;
use super::resume::{event_id, parse_event_id, Budget, Carries, Replayed, StreamKey, Unreplayable};
use super::sessions::SessionNumber;
use super::streams::Role;
use super::Hub;
use crate::http::{self, Rejection};
use crate::output::{Frame, RequestId, StreamId};
use crate::routed_id::SessionId;
use crate::{sse, streamable};

impl Hub {
    /// Answers `request` with a new stream of session `number` carrying `carries`, opened
    /// by a priming event when `priming` (a 2025-11-25 client's request stream).
    pub(super) fn open_mcp_stream(
        &mut self,
        now: Instant,
        request: RequestId,
        (number, sid): (SessionNumber, SessionId),
        carries: Carries,
        priming: bool,
    ) -> StreamKey {
        let stream = StreamId(self.mint());
        let head = super::mcp::with_session(http::sse_head(), sid);
        let m = self.sessions.mcp_mut(number).expect("a live session");
        let key = m.log.open(carries, stream);
        self.start_stream(now, request, (stream, head), number, Role::Mcp(key));
        if priming {
            self.prime(now, number, key);
        }
        key
    }

    /// The priming event of stream `key` (position 0, empty data), for a 2025-11-25 client.
    fn prime(&mut self, now: Instant, number: SessionNumber, key: StreamKey) {
        let attached = self
            .sessions
            .mcp(number)
            .and_then(|m| m.log.get(key))
            .and_then(|log| log.attached);
        if let Some(stream) = attached {
            let frame = sse::priming(&event_id(key, 0));
            self.send(now, stream, Frame::Owned(frame));
        }
    }

    fn resume_budget(&self) -> Budget {
        let session = match self.settings.resume_window {
            Some(_) => self.settings.resume_buffer,
            None => 0,
        };
        Budget {
            session,
            global: self.settings.resume_global,
        }
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
        let budget = self.resume_budget();
        let event: Arc<[u8]> = Arc::from(sse::message_event(message));
        let Some(id) = self
            .sessions
            .keep_event((number, key), event.clone(), budget)
        else {
            return;
        };
        let m = self.sessions.mcp(number).expect("kept above");
        if let Some(stream) = m.log.get(key).and_then(|log| log.attached) {
            self.send(now, stream, Frame::Owned(sse::with_id(&id, &event)));
        }
    }

    /// Stream `key`'s request was answered: the stream ends, its events stay for the
    /// resume window (a client cut off right at the end may still ask for them).
    pub(super) fn finish_stream(&mut self, now: Instant, number: SessionNumber, key: StreamKey) {
        let Some(log) = self
            .sessions
            .mcp_mut(number)
            .and_then(|m| m.log.get_mut(key))
        else {
            return;
        };
        log.finished = true;
        if let Some(stream) = log.attached.take() {
            self.end_stream(stream);
            self.keep_for_window(now, number, key);
        }
        let oldest = self
            .sessions
            .mcp(number)
            .and_then(|m| m.log.finished_past_limit());
        if let Some(oldest) = oldest {
            self.forget_stream(number, oldest, false);
        }
    }

    /// Keeps stream `key` until the resume window from now passes (at once without
    /// resumption).
    fn keep_for_window(&mut self, now: Instant, number: SessionNumber, key: StreamKey) {
        match self.settings.resume_window {
            Some(window) => self.sessions.resume_timers.set((number, key), now + window),
            None => self.forget_stream(number, key, false),
        }
    }

    /// Ends and forgets stream `key` (replaced, cancelled): nobody will resume it.
    pub(super) fn drop_stream(&mut self, number: SessionNumber, key: StreamKey) {
        let attached = self
            .sessions
            .mcp(number)
            .and_then(|m| m.log.get(key))
            .and_then(|log| log.attached);
        self.forget_stream(number, key, false);
        if let Some(stream) = attached {
            self.end_stream(stream);
        }
    }

    /// Forgets stream `key` and its events; an expired request stream is remembered, so
    /// that resuming it is answered -32001.
    fn forget_stream(&mut self, number: SessionNumber, key: StreamKey, expired: bool) {
        self.sessions.resume_timers.remove(&(number, key));
        let Some(m) = self.sessions.mcp(number) else {
            return;
        };
        let carries = m.log.get(key).map(|log| log.carries.clone());
        let raw_id = match carries {
            Some(Carries::Request(_, raw_id)) if expired => Some(raw_id),
            _ => None,
        };
        self.sessions.forget_events((number, key), raw_id);
        let m = self.sessions.mcp_mut(number).expect("live above");
        if m.get_stream == Some(key) {
            m.get_stream = None;
        }
    }

    /// A Streamable stream's connection dropped. With resumption its events are kept (and
    /// more are added) for the resume window; without, a request stops waiting (a
    /// disconnect is not a cancellation; the late answer is dropped) and a GET stream is
    /// gone.
    pub(super) fn mcp_stream_closed(
        &mut self,
        now: Instant,
        number: SessionNumber,
        key: StreamKey,
    ) {
        let Some(log) = self
            .sessions
            .mcp_mut(number)
            .and_then(|m| m.log.get_mut(key))
        else {
            return;
        };
        log.attached = None;
        let carries = log.carries.clone();
        match (self.settings.resume_window, carries) {
            (Some(window), _) => self.sessions.resume_timers.set((number, key), now + window),
            (None, Carries::Request(id, _)) => {
                if let Some(started) = self.in_flight.abandon((number, key), &id) {
                    self.observe(now, Happened::Unanswered(Some(number), started));
                }
                self.forget_stream(number, key, false);
            }
            (None, Carries::Get) => self.forget_stream(number, key, false),
        }
        self.touch(number, now);
    }

    /// Stream `key`'s resume window passed with no client back: its events go, and its
    /// request (if still awaited) is no longer; resuming it later is answered -32001.
    pub(super) fn resume_expired(&mut self, now: Instant, number: SessionNumber, key: StreamKey) {
        let Some(log) = self.sessions.mcp(number).and_then(|m| m.log.get(key)) else {
            return;
        };
        if log.attached.is_some() {
            return;
        }
        if let Carries::Request(id, _) = log.carries.clone() {
            if let Some(started) = self.in_flight.abandon((number, key), &id) {
                self.observe(now, Happened::Unanswered(Some(number), started));
            }
        }
        self.forget_stream(number, key, true);
        self.touch(number, now);
    }

    /// `GET /mcp` with `Last-Event-ID`: the stream it names replays its later events, then
    /// continues; its request's progress and response arrive there, once.
    pub(super) fn resume(
        &mut self,
        now: Instant,
        request: RequestId,
        (number, sid): (SessionNumber, SessionId),
        last_event_id: &str,
    ) -> Result<(), Rejection> {
        let (key, position) = parse_event_id(last_event_id).ok_or(Rejection::UnknownEventId)?;
        let m = self.sessions.mcp(number).expect("a live session");
        match m.log.replay(key, position) {
            Err(Unreplayable::Unknown) => Err(Rejection::UnknownEventId),
            Err(Unreplayable::Answered) => {
                self.closing_stream(now, request, (number, sid), None);
                Ok(())
            }
            Err(Unreplayable::Lost(raw_id)) => {
                self.lost(now, request, (number, sid), key, raw_id);
                Ok(())
            }
            Ok(events) => {
                self.replay(now, request, (number, sid), key, events);
                Ok(())
            }
        }
    }

    fn replay(
        &mut self,
        now: Instant,
        request: RequestId,
        (number, sid): (SessionNumber, SessionId),
        key: StreamKey,
        events: Vec<Replayed>,
    ) {
        let stream = StreamId(self.mint());
        let head = super::mcp::with_session(http::sse_head(), sid);
        self.start_stream(now, request, (stream, head), number, Role::Mcp(key));
        self.sessions.resume_timers.remove(&(number, key));
        let m = self.sessions.mcp_mut(number).expect("a live session");
        let log = m.log.get_mut(key).expect("replayed");
        let previous = log.attached.replace(stream);
        let (finished, carries) = (log.finished, log.carries.clone());
        let replaced = match carries {
            Carries::Get => m.get_stream.replace(key).filter(|old| *old != key),
            Carries::Request(..) => None,
        };
        if let Some(previous) = previous {
            // A connection the hub still thought open: the newer one carries the stream.
            self.end_stream(previous);
        }
        if let Some(old) = replaced {
            self.drop_stream(number, old);
        }
        for (id, event) in events {
            self.send(now, stream, Frame::Owned(sse::with_id(&id, &event)));
        }
        if finished {
            self.finish_stream(now, number, key);
        }
        self.touch(number, now);
    }

    /// The events after the resumed id are gone: the stream's request (if any) is answered
    /// -32001 under its own id on a stream that then ends, and is awaited no longer.
    fn lost(
        &mut self,
        now: Instant,
        request: RequestId,
        (number, sid): (SessionNumber, SessionId),
        key: StreamKey,
        raw_id: Option<String>,
    ) {
        let live = self.sessions.mcp(number).and_then(|m| m.log.get(key));
        if let Some(log) = live.filter(|log| matches!(log.carries, Carries::Request(..))) {
            let (carries, attached) = (log.carries.clone(), log.attached);
            if let Carries::Request(id, _) = carries {
                if let Some(started) = self.in_flight.abandon((number, key), &id) {
                    self.observe(now, Happened::Unanswered(Some(number), started));
                }
            }
            // Remembered as expired, with where its answer was if it was written.
            self.forget_stream(number, key, true);
            if let Some(stream) = attached {
                self.end_stream(stream);
            }
        }
        let raw_id = raw_id.unwrap_or_else(|| "null".to_owned());
        let message =
            streamable::error_message(&raw_id, -32001, "response lost: resume window exceeded");
        self.closing_stream(now, request, (number, sid), Some(message));
        self.touch(number, now);
    }

    /// Answers `request` with a stream that carries `message` (if any) and ends: a
    /// resumption with nothing left to continue. It is no stream of the log (number 0).
    fn closing_stream(
        &mut self,
        now: Instant,
        request: RequestId,
        (number, sid): (SessionNumber, SessionId),
        message: Option<Vec<u8>>,
    ) {
        let stream = StreamId(self.mint());
        let head = super::mcp::with_session(http::sse_head(), sid);
        self.start_stream(now, request, (stream, head), number, Role::Mcp(0));
        if let Some(message) = message {
            self.send(now, stream, Frame::Owned(sse::message_event(&message)));
        }
        self.end_stream(stream);
        self.touch(number, now);
    }
}
