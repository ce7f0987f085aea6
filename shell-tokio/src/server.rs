//! HTTP: accept connections, check who is asking and from where, read bodies within the
//! limit, and hand everything else to the owner loop. Every answer is built by the core.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use switchboard_core::config::Config;
use switchboard_core::http::{self, Endpoint, Gate, RequestHead};
use switchboard_core::{Principal, Rejection, SessionId};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use crate::session;
use crate::supervisor::{reply, Input, PongTx, StdinSlot};

/// How long a POST waits for room in the backend's stdin queue before 503.
const BACKEND_BUSY_WAIT: Duration = Duration::from_secs(2);

type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// What every request handler shares.
pub struct Server {
    pub config: Arc<Config>,
    pub gate: Gate,
    pub inputs: mpsc::Sender<Input>,
    pub closed: mpsc::UnboundedSender<SessionId>,
    pub stdin: StdinSlot,
}

impl Server {
    /// Accepts connections until `stop` fires.
    /// Accepts connections until `stop` fires, then lets answers already under way reach
    /// their clients (for at most `drain`) before returning.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        stop: oneshot::Receiver<()>,
        drain: Duration,
    ) {
        let graceful = GracefulShutdown::new();
        tokio::pin!(stop);
        loop {
            let (stream, peer) = tokio::select! {
                _ = &mut stop => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = stream.set_nodelay(true);
            let server = self.clone();
            let service = hyper::service::service_fn(move |req| {
                let server = server.clone();
                async move { Ok::<_, Infallible>(server.handle(req, peer).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(TokioIo::new(stream), service);
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    debug!(%peer, "connection ended: {e}");
                }
            });
        }
        drop(listener);
        if tokio::time::timeout(drain, graceful.shutdown())
            .await
            .is_err()
        {
            debug!("connections still open after the drain period");
        }
    }

    async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<ResponseBody> {
        let text = |name| {
            req.headers()
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
        };
        let head = RequestHead {
            method: req.method().as_str(),
            path: req.uri().path(),
            authorization: req
                .headers()
                .get(header::AUTHORIZATION)
                .map(HeaderValue::as_bytes),
            origin: text(header::ORIGIN),
            host: text(header::HOST).or(req.uri().authority().map(|a| a.as_str())),
        };
        let result = match self.gate.admit(&head, unix_now()) {
            Err(rejection) => {
                // Counting is best effort: never wait on the loop for it.
                let _ = self.inputs.try_send(Input::Refused(rejection));
                Err(rejection)
            }
            Ok((Endpoint::Health, _)) => Ok(self.health().await),
            Ok((Endpoint::Metrics, _)) => self.metrics().await,
            Ok((Endpoint::Stream, principal)) => self.open_stream(principal).await,
            Ok((Endpoint::Messages, principal)) => self.post(req, principal).await,
        };
        result.unwrap_or_else(|rejection| {
            debug!(%peer, reason = rejection.as_str(), "refused");
            refusal(rejection)
        })
    }

    async fn open_stream(&self, principal: Principal) -> Result<Response<ResponseBody>, Rejection> {
        let mut random = [0u8; 16];
        getrandom::fill(&mut random).expect("the OS random source works");
        let session = SessionId::from_random(random);
        let url = self.config.endpoint_url(&session);
        let (queue, stream) = session::channel(
            session,
            &url,
            self.config.session_buffer,
            self.config.keepalive,
            self.closed.clone(),
        );
        let (tx, answer) = oneshot::channel();
        self.ask(Input::Open {
            session,
            principal,
            queue,
            reply: reply(tx),
        })
        .await?;
        answer.await.map_err(|_| Rejection::BackendDown)??;
        let mut response = Response::new(UnsyncBoxBody::new(stream));
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        Ok(response)
    }

    async fn post(
        &self,
        req: Request<Incoming>,
        principal: Principal,
    ) -> Result<Response<ResponseBody>, Rejection> {
        let session = http::session_param(req.uri().query()).to_owned();
        let body = read_limited(req.into_body(), self.config.max_body).await;
        let permit = self.reserve_stdin().await;
        let (tx, answer) = oneshot::channel();
        self.ask(Input::Post {
            session,
            principal,
            body,
            permit,
            reply: reply(tx),
        })
        .await?;
        answer.await.map_err(|_| Rejection::BackendDown)??;
        Ok(accepted())
    }

    /// Room for one line in the current backend's stdin queue, waiting briefly.
    async fn reserve_stdin(&self) -> Option<crate::supervisor::StdinPermit> {
        let stdin = self.stdin.borrow().clone()?;
        tokio::time::timeout(BACKEND_BUSY_WAIT, stdin.reserve_owned())
            .await
            .ok()?
            .ok()
    }

    async fn ask(&self, input: Input) -> Result<(), Rejection> {
        self.inputs
            .send(input)
            .await
            .map_err(|_| Rejection::BackendDown)
    }

    async fn health(&self) -> Response<ResponseBody> {
        let (pong_tx, pong) = oneshot::channel();
        let (tx, answer) = oneshot::channel();
        let input = Input::Health {
            waiter: PongTx(pong_tx),
            reply: reply(tx),
        };
        let report = match self.ask(input).await {
            Ok(()) => answer.await.ok(),
            Err(_) => None,
        };
        let Some((mut health, pinging)) = report else {
            return refusal(Rejection::BackendDown);
        };
        if pinging {
            if let Ok(Ok(())) = tokio::time::timeout(self.config.ping_timeout, pong).await {
                health.answered = true;
                health.since_last_pong = Some(Duration::ZERO);
            }
        }
        let (status, body) = health.response();
        json_response(status, body)
    }

    async fn metrics(&self) -> Result<Response<ResponseBody>, Rejection> {
        let (tx, answer) = oneshot::channel();
        self.ask(Input::Metrics { reply: reply(tx) }).await?;
        let text = answer.await.map_err(|_| Rejection::BackendDown)?;
        let mut response = Response::new(full(text.into_bytes()));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        Ok(response)
    }
}

/// The body, or `None` when it is larger than `limit` (by header, or counted as it
/// arrives for chunked bodies): no more than `limit` bytes are ever held.
async fn read_limited(mut body: Incoming, limit: usize) -> Option<Vec<u8>> {
    use hyper::body::Body as _;
    if body.size_hint().lower() > limit as u64 {
        return None;
    }
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            // A broken body is treated like a malformed one: what arrived is judged.
            break;
        };
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return None;
            }
            buf.extend_from_slice(&data);
        }
    }
    Some(buf)
}

fn full(body: impl Into<Bytes>) -> ResponseBody {
    UnsyncBoxBody::new(Full::new(body.into()))
}

fn accepted() -> Response<ResponseBody> {
    let mut response = Response::new(full(http::ACCEPTED_BODY));
    *response.status_mut() = StatusCode::ACCEPTED;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

fn json_response(status: u16, body: Vec<u8>) -> Response<ResponseBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = StatusCode::from_u16(status).expect("valid status");
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A core refusal, copied onto the wire.
fn refusal(rejection: Rejection) -> Response<ResponseBody> {
    let r = rejection.response();
    let mut response = Response::new(full(r.body));
    *response.status_mut() = StatusCode::from_u16(r.status).expect("valid status");
    for (name, value) in r.headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
    if rejection == Rejection::BodyTooLarge {
        // The rest of the body was not read: the connection cannot be reused.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Seconds since the Unix epoch, for token expiry.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
