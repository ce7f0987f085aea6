//! The message-level view of the hub that the `client_body` and `backend_line` properties
//! judge: a [`Routing`] harness drives a [`Hub`](switchboard_core::Hub) through the
//! [`Driver`] with legacy sessions only, and reads its outputs back as [`Action`]s (what a
//! message became: a backend line, a delivery, a broadcast, a drop). The core keeps its
//! router private; this vocabulary is the tests' own.

use std::collections::BTreeMap;
use std::sync::Arc;

use switchboard_core::http::Endpoint;
use switchboard_core::hub::{Payload, Settings};
use switchboard_core::{
    DropReason, Event, Frame, LogLevel, Output, Principal, SessionId, StreamId,
};

use crate::driver::{Driver, Seen};

/// What a message became, as the properties see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A client's message written to the backend (ids routed), newline included.
    Rewrite {
        /// The line.
        line: Vec<u8>,
    },
    /// The proxy's own line to the backend (an answer to a backend request, a ping,
    /// `notifications/initialized`, an unsubscribe), newline included.
    Reply {
        /// The line.
        line: Vec<u8>,
    },
    /// A message for exactly one session.
    Deliver {
        /// The session.
        session: SessionId,
        /// The message, original ids restored.
        message: Vec<u8>,
        /// What it is.
        what: Delivery,
    },
    /// The same bytes for every live session.
    Broadcast {
        /// `{"jsonrpc":"2.0","method":M}`.
        message: Arc<[u8]>,
    },
    /// A message dropped (or answered by the proxy), counted and logged.
    Drop {
        /// Why.
        reason: DropReason,
        /// Its method, if any.
        method: Option<String>,
        /// How loud.
        level: LogLevel,
    },
    /// A `/health` request was answered because the backend answered its ping.
    Pong,
}

/// What a delivered message is, when the harness can tell (legacy frames do not say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// Unknown from the outside: the message itself says.
    Update,
}

/// How a POST was handled, read from its HTTP answer and what followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// A line reached the backend.
    Forwarded,
    /// The proxy answers the client itself (now or once the handshake completes).
    Answered,
    /// Accepted and deliberately not forwarded.
    Absorbed,
}

/// A refused POST: its status and JSON-RPC error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The HTTP status.
    pub status: u16,
    /// The body.
    pub body: Vec<u8>,
}

/// The hub with legacy sessions, read back as [`Action`]s.
pub struct Routing {
    driver: Driver,
    streams: BTreeMap<StreamId, SessionId>,
    health: usize,
}

impl Routing {
    /// A hub allowing `max_sessions`, its backend running.
    pub fn new(max_sessions: usize) -> Routing {
        let settings = Settings {
            max_sessions,
            ..Settings::default()
        };
        let mut driver = Driver::new(settings);
        driver.take_records();
        Routing {
            driver,
            streams: BTreeMap::new(),
            health: 0,
        }
    }

    /// Opens a legacy session whose id is `SessionId::from_random([n; 16])`.
    pub fn open(&mut self, n: u8, principal: &Principal) -> SessionId {
        let request = self.driver.request(
            Endpoint::Stream,
            principal.clone(),
            "",
            Payload::Bytes(Vec::new()),
            [n; 16],
        );
        let stream = self.driver.stream_of(request).expect("the session opened");
        let sid = self
            .driver
            .hub()
            .inspect()
            .stream_session(stream)
            .expect("live");
        self.streams.insert(stream, sid);
        self.driver.take_records();
        sid
    }

    /// The session's client hangs up.
    pub fn close(&mut self, sid: SessionId) -> Vec<Action> {
        let stream = self
            .streams
            .iter()
            .find(|(_, s)| **s == sid)
            .map(|(st, _)| *st);
        if let Some(stream) = stream {
            self.driver.hang_up(stream);
        }
        self.actions(false)
    }

    /// Whether `sid` is live.
    pub fn is_live(&self, sid: &SessionId) -> bool {
        self.driver.hub().inspect().is_live(sid)
    }

    /// POSTs `body` to the session `session` names, as `principal`.
    pub fn post(
        &mut self,
        session: &str,
        principal: &Principal,
        body: &[u8],
    ) -> (Result<Accepted, Refused>, Vec<Action>) {
        let request = self.driver.request(
            Endpoint::Messages,
            principal.clone(),
            session,
            Payload::Bytes(body.to_vec()),
            [0; 16],
        );
        let actions = self.actions(true);
        let answer = match self.driver.answer(request) {
            Some(crate::driver::Answer::Response(r)) => r.clone(),
            other => panic!("a POST was answered {other:?}"),
        };
        if answer.status != 202 {
            let refused = Refused {
                status: answer.status,
                body: answer.body.to_vec(),
            };
            return (Err(refused), actions);
        }
        let accepted = if actions.iter().any(|a| matches!(a, Action::Rewrite { .. })) {
            Accepted::Forwarded
        } else if serde_json::from_slice::<serde_json::Value>(body)
            .is_ok_and(|v| v.get("id").is_some())
        {
            Accepted::Answered
        } else {
            Accepted::Absorbed
        };
        (Ok(accepted), actions)
    }

    /// The backend writes `line` on stdout.
    pub fn backend_line(&mut self, line: &[u8]) -> Vec<Action> {
        self.driver.backend_line(Some(line));
        self.actions(false)
    }

    /// A `/health` request: the proxy pings the backend.
    pub fn health_ping(&mut self) -> Vec<Action> {
        self.health += 1;
        self.driver.request(
            Endpoint::Health,
            Principal::anonymous(),
            "",
            Payload::Bytes(Vec::new()),
            [0; 16],
        );
        self.actions(false)
    }

    /// The outputs since the last call, as actions; lines to the backend count as a
    /// client's (`client`) or the proxy's own.
    fn actions(&mut self, client: bool) -> Vec<Action> {
        let mut actions = Vec::new();
        let mut last_shared: Option<Arc<[u8]>> = None;
        for record in self.driver.take_records() {
            let Seen::Output(output) = record.seen else {
                continue;
            };
            match output {
                Output::ToBackend { line, .. } if client && !is_proxy_line(&line) => {
                    actions.push(Action::Rewrite { line })
                }
                Output::ToBackend { line, .. } => actions.push(Action::Reply { line }),
                Output::ToStream {
                    frame: Frame::Shared(shared),
                    ..
                } if !last_shared
                    .as_ref()
                    .is_some_and(|s| Arc::ptr_eq(s, &shared)) =>
                {
                    let message = Arc::from(message_data(&shared));
                    actions.push(Action::Broadcast { message });
                    last_shared = Some(shared);
                }
                Output::ToStream {
                    frame: Frame::Shared(_),
                    ..
                } => {}
                Output::ToStream { stream, frame } => {
                    let bytes = frame.as_ref();
                    if bytes == switchboard_core::sse::KEEPALIVE
                        || bytes.starts_with(b"event: endpoint\n")
                    {
                        continue;
                    }
                    let session = self.streams[&stream];
                    actions.push(Action::Deliver {
                        session,
                        message: message_data(bytes).to_vec(),
                        what: Delivery::Update,
                    });
                }
                Output::Log(Event::Dropped {
                    reason,
                    method,
                    level,
                }) => actions.push(Action::Drop {
                    reason,
                    method,
                    level,
                }),
                Output::Respond { response, .. } if response.status == 200 && self.health > 0 => {
                    self.health -= 1;
                    actions.push(Action::Pong);
                }
                _ => {}
            }
        }
        actions
    }
}

/// A line of the proxy's own beside a client's (the handshake's end).
fn is_proxy_line(line: &[u8]) -> bool {
    line == b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n"
        || line.starts_with(b"{\"jsonrpc\":\"2.0\",\"id\":\"switchboard|ping:")
}

/// The data of an SSE `message` event.
pub(crate) fn message_data(frame: &[u8]) -> &[u8] {
    let frame = crate::driver::without_id(frame);
    let frame = frame
        .strip_prefix(b"event: message\ndata: ")
        .unwrap_or(frame);
    frame.strip_suffix(b"\n\n").unwrap_or(frame)
}
