//! Open SSE streams: which session each serves and in what role, and their keep-alives.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::deadlines::Deadlines;
use super::in_flight::RequestKey;
use super::resume::StreamKey;
use super::sessions::SessionNumber;
use crate::output::{Frame, Output, StreamId};
use crate::sse;

/// What a stream carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    /// A legacy session's `/sse` stream.
    Legacy,
    /// A Streamable session's stream (its GET stream or a request's) of this number.
    Mcp(StreamKey),
    /// The answer stream of the 2026-07-28 request routed under this key.
    Modern(RequestKey),
}

#[derive(Debug)]
pub(crate) struct Stream {
    /// The session it belongs to (`None`: a 2026-07-28 request's, which has none).
    pub(crate) session: Option<SessionNumber>,
    pub(crate) role: Role,
    /// When a frame was last queued on it, for keep-alives.
    last_frame: Instant,
}

/// The streams part.
#[derive(Debug)]
pub(crate) struct Streams {
    open: BTreeMap<StreamId, Stream>,
    /// Keep-alive checks; one whose stream saw a frame since moves on lazily.
    keepalives: Deadlines<StreamId>,
    keepalive: Duration,
}

impl Streams {
    pub(crate) fn new(keepalive: Duration) -> Self {
        Streams {
            open: BTreeMap::new(),
            keepalives: Deadlines::default(),
            keepalive,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }

    /// A reload's `--keepalive`, for each stream's next keep-alive check.
    pub(crate) fn set_keepalive(&mut self, keepalive: Duration) {
        self.keepalive = keepalive;
    }

    pub(crate) fn timers(&self) -> usize {
        self.keepalives.len()
    }

    pub(crate) fn get(&self, stream: StreamId) -> Option<&Stream> {
        self.open.get(&stream)
    }

    /// A stream opened now for `session`.
    pub(crate) fn open(
        &mut self,
        now: Instant,
        stream: StreamId,
        session: SessionNumber,
        role: Role,
    ) {
        let state = Stream {
            session: Some(session),
            role,
            last_frame: now,
        };
        self.open.insert(stream, state);
        self.keepalives.set(stream, now + self.keepalive);
    }

    /// The answer stream of the 2026-07-28 request routed under `key`, opened now.
    pub(crate) fn open_modern(&mut self, now: Instant, stream: StreamId, key: RequestKey) {
        let state = Stream {
            session: None,
            role: Role::Modern(key),
            last_frame: now,
        };
        self.open.insert(stream, state);
        self.keepalives.set(stream, now + self.keepalive);
    }

    /// Forgets `stream`, its keep-alive with it.
    pub(crate) fn remove(&mut self, stream: StreamId) -> Option<Stream> {
        self.keepalives.remove(&stream);
        self.open.remove(&stream)
    }

    /// Forgets every stream.
    pub(crate) fn clear(&mut self) {
        self.open.clear();
        self.keepalives.clear();
    }

    /// Queues `frame` on `stream` if it is still open.
    pub(crate) fn send(
        &mut self,
        now: Instant,
        (stream, frame): (StreamId, Frame),
        out: &mut impl Extend<Output>,
    ) {
        if let Some(state) = self.open.get_mut(&stream) {
            state.last_frame = now;
            out.extend([Output::ToStream { stream, frame }]);
        }
    }

    /// Ends `stream` if it is still open.
    pub(crate) fn end(&mut self, stream: StreamId, out: &mut impl Extend<Output>) {
        if self.remove(stream).is_some() {
            out.extend([Output::EndStream { stream }]);
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.keepalives.next()
    }

    /// A keep-alive comment for every stream idle for `--keepalive` at `now`.
    pub(crate) fn handle_timeout(&mut self, now: Instant, out: &mut impl Extend<Output>) {
        while let Some((_, stream)) = self.keepalives.pop_due(now) {
            let Some(state) = self.open.get_mut(&stream) else {
                continue;
            };
            let idle_until = state.last_frame + self.keepalive;
            if idle_until > now {
                self.keepalives.set(stream, idle_until);
                continue;
            }
            state.last_frame = now;
            self.keepalives.set(stream, now + self.keepalive);
            out.extend([Output::ToStream {
                stream,
                frame: Frame::Static(sse::KEEPALIVE),
            }]);
        }
    }
}
