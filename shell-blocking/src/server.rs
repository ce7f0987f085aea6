//! HTTP: tiny_http accepts and parses (a thread per connection), a pool of handler
//! threads that grows when all are busy checks who is asking and from where, reads bodies
//! within the limit, and hands everything else to the owner loop. Every answer is built
//! by the core.

use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use switchboard_core::config::Config;
use switchboard_core::http::{self, Endpoint, Gate, RequestHead};
use switchboard_core::{Principal, Rejection, SessionId};
use tiny_http::{Header, Request, Response};
use tracing::{debug, warn};

use crate::backend::Permits;
use crate::session;
use crate::supervisor::{reply, Input, PongTx};

/// How long a POST waits for room in the backend's stdin queue before 503.
const BACKEND_BUSY_WAIT: Duration = Duration::from_secs(2);
/// Handler threads never exceed this; requests beyond wait in the queue.
const MAX_HANDLERS: usize = 512;
const HANDLER_STACK: usize = 256 * 1024;

/// What every handler shares.
pub struct Server {
    pub config: Arc<Config>,
    pub gate: Gate,
    pub inputs: Sender<Input>,
    pub closed: Sender<SessionId>,
    pub permits: Permits,
    /// Requests being handled now, so exit can let their answers out first.
    pub busy: AtomicUsize,
}

impl Server {
    /// Takes requests from tiny_http until it is unblocked, handing each to an idle
    /// handler thread, starting one more when none is idle, so a slow client never holds
    /// up the others.
    pub fn serve(self: Arc<Self>, http: Arc<tiny_http::Server>) {
        let (queue, requests) = crossbeam_channel::unbounded::<Request>();
        let idle = Arc::new(AtomicUsize::new(0));
        let mut handlers = 0;
        while let Ok(request) = http.recv() {
            if idle.load(Ordering::Acquire) == 0 && handlers < MAX_HANDLERS {
                handlers += 1;
                self.clone().spawn_handler(requests.clone(), idle.clone());
            }
            if queue.send(request).is_err() {
                return;
            }
        }
    }

    /// Waits (at most `within`) for requests under way to be answered.
    pub fn drain(&self, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        while self.busy.load(Ordering::Acquire) > 0 && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn spawn_handler(self: Arc<Self>, requests: Receiver<Request>, idle: Arc<AtomicUsize>) {
        let spawned = thread::Builder::new()
            .name("http".into())
            .stack_size(HANDLER_STACK)
            .spawn(move || loop {
                idle.fetch_add(1, Ordering::AcqRel);
                let Ok(request) = requests.recv() else { return };
                idle.fetch_sub(1, Ordering::AcqRel);
                self.busy.fetch_add(1, Ordering::AcqRel);
                self.handle(request);
                self.busy.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            warn!("cannot start a handler thread: {e}");
        }
    }

    fn handle(&self, mut request: Request) {
        let headers = request.headers();
        let header = |name: &'static str| {
            headers
                .iter()
                .find(|h| h.field.equiv(name))
                .map(|h| h.value.as_str())
        };
        let url = request.url();
        let (path, query) = url.split_once('?').unwrap_or((url, ""));
        let head = RequestHead {
            method: request.method().as_str(),
            path,
            authorization: header("Authorization").map(str::as_bytes),
            origin: header("Origin"),
            host: header("Host"),
        };
        let admitted = self.gate.admit(&head, unix_now());
        let session = http::session_param(Some(query)).to_owned();
        let result = match admitted {
            Err(rejection) => {
                // Counting is best effort: never wait on the loop for it.
                let _ = self.inputs.try_send(Input::Refused(rejection));
                Err(rejection)
            }
            Ok((Endpoint::Health, _)) => {
                let (status, body) = self.health();
                respond(request, json(status, body));
                return;
            }
            Ok((Endpoint::Metrics, _)) => self.metrics().map(|text| {
                Response::from_data(text)
                    .with_header(header_line("Content-Type", "text/plain; version=0.0.4"))
            }),
            Ok((Endpoint::Stream, principal)) => match self.open_stream(principal) {
                Ok((session, stream)) => {
                    let url = self.config.endpoint_url(&session);
                    session::serve(
                        request,
                        session,
                        url,
                        stream,
                        self.config.keepalive,
                        self.closed.clone(),
                    );
                    return;
                }
                Err(rejection) => Err(rejection),
            },
            Ok((Endpoint::Messages, principal)) => {
                let body = read_limited(&mut request, self.config.max_body);
                self.post(session, principal, body).map(|()| {
                    Response::from_data(http::ACCEPTED_BODY)
                        .with_status_code(202)
                        .with_header(header_line("Content-Type", "text/plain"))
                })
            }
        };
        match result {
            Ok(response) => respond(request, response),
            Err(rejection) => {
                debug!(reason = rejection.as_str(), "refused");
                respond(request, refusal(rejection));
            }
        }
    }

    fn open_stream(
        &self,
        principal: Principal,
    ) -> Result<(SessionId, session::SessionStream), Rejection> {
        let mut random = [0u8; 16];
        getrandom::fill(&mut random).expect("the OS random source works");
        let session = SessionId::from_random(random);
        let (queue, stream) = session::channel(self.config.session_buffer);
        let (tx, answer) = crossbeam_channel::bounded(1);
        self.ask(Input::Open {
            session,
            principal,
            queue,
            reply: reply(tx),
        })?;
        answer.recv().map_err(|_| Rejection::BackendDown)??;
        Ok((session, stream))
    }

    fn post(
        &self,
        session: String,
        principal: Principal,
        body: Option<Vec<u8>>,
    ) -> Result<(), Rejection> {
        let permit = self.permits.reserve(BACKEND_BUSY_WAIT);
        let (tx, answer) = crossbeam_channel::bounded(1);
        self.ask(Input::Post {
            session,
            principal,
            body,
            permit,
            reply: reply(tx),
        })?;
        answer
            .recv()
            .map_err(|_| Rejection::BackendDown)?
            .map(|_| ())
    }

    fn ask(&self, input: Input) -> Result<(), Rejection> {
        self.inputs.send(input).map_err(|_| Rejection::BackendDown)
    }

    fn health(&self) -> (u16, Vec<u8>) {
        let (pong_tx, pong) = crossbeam_channel::bounded(1);
        let (tx, answer) = crossbeam_channel::bounded(1);
        let input = Input::Health {
            waiter: PongTx(pong_tx),
            reply: reply(tx),
        };
        let report = match self.ask(input) {
            Ok(()) => answer.recv().ok(),
            Err(_) => None,
        };
        let Some((mut health, pinging)) = report else {
            let r = Rejection::BackendDown.response();
            return (r.status, r.body);
        };
        if pinging && pong.recv_timeout(self.config.ping_timeout).is_ok() {
            health.answered = true;
            health.since_last_pong = Some(Duration::ZERO);
        }
        health.response()
    }

    fn metrics(&self) -> Result<String, Rejection> {
        let (tx, answer) = crossbeam_channel::bounded(1);
        self.ask(Input::Metrics { reply: reply(tx) })?;
        answer.recv().map_err(|_| Rejection::BackendDown)
    }
}

/// The body, or `None` when it is larger than `limit` (by header, or counted as it
/// arrives for chunked bodies): no more than `limit` bytes are ever held.
fn read_limited(request: &mut Request, limit: usize) -> Option<Vec<u8>> {
    if request.body_length().is_some_and(|n| n > limit) {
        return None;
    }
    let mut body = Vec::new();
    let read = request
        .as_reader()
        .take(limit as u64 + 1)
        .read_to_end(&mut body);
    if read.is_err() {
        // A broken body is judged by what arrived, like a malformed one.
        return Some(body);
    }
    (body.len() <= limit).then_some(body)
}

type Reply = Response<std::io::Cursor<Vec<u8>>>;

fn header_line(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("valid header")
}

fn json(status: u16, body: Vec<u8>) -> Reply {
    Response::from_data(body)
        .with_status_code(status)
        .with_header(header_line("Content-Type", "application/json"))
}

/// A core refusal, copied onto the wire.
fn refusal(rejection: Rejection) -> Reply {
    let r = rejection.response();
    let mut response = Response::from_data(r.body).with_status_code(r.status);
    for (name, value) in r.headers {
        response.add_header(header_line(name, &value));
    }
    if rejection == Rejection::BodyTooLarge {
        // The rest of the body was not read: the connection cannot be reused.
        response.add_header(header_line("Connection", "close"));
    }
    response
}

fn respond(request: Request, response: Reply) {
    if let Err(e) = request.respond(response) {
        debug!("response not delivered: {e}");
    }
}

/// Seconds since the Unix epoch, for token expiry.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
