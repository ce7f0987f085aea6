//! HTTP: tiny_http accepts and parses (a thread per connection); a pool of handler threads
//! that grows when all are busy lets the core's gate say who is asking and what for, reads
//! the body within the limit, hands the request to the owner loop and copies its answer
//! onto the wire. Every status, header and body comes from the core.

use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use switchboard_core::http::{self, Gate, RequestHead};
use switchboard_core::hub::Payload;
use switchboard_core::{Rejection, StreamId};
use tiny_http::{Header, Request};
use tracing::{debug, warn};

use crate::session;
use crate::supervisor::{Input, Reply};

/// Handler threads never exceed this; requests beyond wait in the queue.
const MAX_HANDLERS: usize = 512;
const HANDLER_STACK: usize = 256 * 1024;

/// What every handler shares.
pub struct Server {
    pub gate: Gate,
    pub max_body: usize,
    pub inputs: Sender<Input>,
    pub closed: Sender<StreamId>,
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
        let head = RequestHead {
            method: request.method().as_str(),
            target: request.url(),
            authority: None,
            authorization: header("Authorization").map(str::as_bytes),
            origin: header("Origin"),
            host: header("Host"),
            content_type: header("Content-Type"),
            accept: header("Accept"),
            mcp_session_id: header("Mcp-Session-Id"),
            mcp_protocol_version: header("MCP-Protocol-Version"),
        };
        let admitted = match self.gate.admit(&head, unix_now()) {
            Ok(admitted) => admitted,
            Err(refused) => {
                debug!(reason = refused.rejection.as_str(), "refused");
                // Counting is best effort: never wait on the loop for it.
                let _ = self.inputs.try_send(Input::Refused(refused.rejection));
                return respond(request, refused.response);
            }
        };
        let body = read_limited(&mut request, self.max_body);
        let (reply, answer) = crossbeam_channel::bounded(1);
        let input = Input::Request {
            request: admitted.into_request(body, entropy),
            reply,
        };
        if self.inputs.send(input).is_err() {
            return respond(request, Rejection::BackendDown.response());
        }
        match answer.recv() {
            Ok(Reply::Full(response)) => respond(request, response),
            Ok(Reply::Stream(head, body)) => {
                session::serve(request, head, body, self.closed.clone())
            }
            // The loop ended without answering: the proxy is exiting.
            Err(_) => respond(request, Rejection::BackendDown.response()),
        }
    }
}

/// The body, or [`Payload::TooLarge`] past `limit` (by header, or counted as it arrives
/// for chunked bodies): no more than `limit` bytes are ever held.
fn read_limited(request: &mut Request, limit: usize) -> Payload {
    if request.body_length().is_some_and(|n| n > limit) {
        return Payload::TooLarge;
    }
    let mut body = Vec::new();
    let read = request
        .as_reader()
        .take(limit as u64 + 1)
        .read_to_end(&mut body);
    if read.is_ok() && body.len() > limit {
        return Payload::TooLarge;
    }
    // A broken body is judged by what arrived, like a malformed one.
    Payload::Bytes(body)
}

/// 16 bytes from the OS for the id of a session the request may create.
fn entropy() -> [u8; 16] {
    let mut random = [0u8; 16];
    getrandom::fill(&mut random).expect("the OS random source works");
    random
}

/// A core response, copied onto the wire.
fn respond(request: Request, response: http::Response) {
    let mut out = tiny_http::Response::from_data(response.body.into_owned())
        .with_status_code(response.status);
    for (name, value) in &response.headers {
        if let Ok(header) = Header::from_bytes(name.as_bytes(), value.as_bytes()) {
            out.add_header(header);
        }
    }
    if let Err(e) = request.respond(out) {
        debug!("response not delivered: {e}");
    }
}

/// Seconds since the Unix epoch, for token expiry.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
