//! The floor: the same HTTP+SSE surface as Switchboard (`GET /sse` → `endpoint` event,
//! `POST /messages?session_id=` → 202 and the answer as a `message` event on that
//! session's stream), on the same stack (tokio with two workers, hyper 1 HTTP/1.1, one task
//! per connection, an unbounded queue per stream, queued frames coalesced), but every call
//! is answered in process by the echo server of `bench-common/echo.rs`. No routing, no
//! backend, no auth: what HTTP+SSE itself costs on this machine, which no proxy can beat.
//!
//! Streamable HTTP likewise (SPEC section 7, only what a JSON-answering server must do):
//! `POST /mcp` of `initialize` without `Mcp-Session-Id` creates a session and answers 200
//! `application/json` naming it; a POST naming a live session is answered in its own
//! response, a request 200 JSON, a notification 202 empty (415 without a JSON
//! `Content-Type`, 406 unless `Accept` admits JSON, 400 without the header, 404 for an
//! unknown session); `DELETE /mcp` ends the session (204). No event streams on `/mcp`.
//!
//! Usage: `floor [--listen ADDR] [--threads N] [--delay-ms N [--reorder]]`
//!
//! Prints `floor listening on http://ADDR` on stdout once bound (`--listen 127.0.0.1:0`,
//! the default, picks a free port). `--delay-ms`/`--reorder` delay each `tools/call`
//! answer as `echo-backend` does (tokio's timer wheel, no thread per request).
//! `GET /health` answers `{"status":"ok","sessions":N}`. SIGINT/SIGTERM end it.

#[path = "bench-common/echo.rs"]
mod echo;

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// As Switchboard: queued frames are sent as one chunk up to this size.
const COALESCE_LIMIT: usize = 64 * 1024;
const MAX_BODY: usize = 8 * 1024 * 1024;

struct Options {
    listen: SocketAddr,
    threads: usize,
    delay: Option<Duration>,
    reorder: bool,
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        threads: 2,
        delay: None,
        reorder: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--listen" => {
                o.listen = value("--listen")?
                    .parse()
                    .map_err(|e| format!("--listen: {e}"))?;
            }
            "--threads" => {
                o.threads = value("--threads")?
                    .parse()
                    .map_err(|e| format!("--threads: {e}"))?;
            }
            "--delay-ms" => {
                let ms: u64 = value("--delay-ms")?
                    .parse()
                    .map_err(|e| format!("--delay-ms: {e}"))?;
                o.delay = Some(Duration::from_millis(ms));
            }
            "--reorder" => o.reorder = true,
            "-h" | "--help" => {
                return Err(
                    "usage: floor [--listen ADDR] [--threads N] [--delay-ms N [--reorder]]"
                        .to_owned(),
                )
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if !o.listen.ip().is_loopback() {
        return Err(format!("--listen {}: loopback only", o.listen));
    }
    if o.reorder && o.delay.is_none() {
        return Err("--reorder needs --delay-ms".to_owned());
    }
    Ok(o)
}

struct Floor {
    sessions: Mutex<HashMap<String, mpsc::UnboundedSender<Bytes>>>,
    /// Live Streamable sessions.
    mcp_sessions: Mutex<HashSet<String>>,
    next_session: AtomicU64,
    salt: u32,
    delay: Option<Duration>,
    reorder: bool,
    rng: AtomicU64,
}

impl Floor {
    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, mpsc::UnboundedSender<Bytes>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mcp_sessions(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.mcp_sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new session id, shaped like a UUID so that headers and URLs are as long as
    /// Switchboard's.
    fn mint(&self) -> String {
        let n = self.next_session.fetch_add(1, Ordering::Relaxed);
        format!("{:08x}-0000-4000-8000-{n:012x}", self.salt)
    }

    /// A random-looking delay in `0..=max` (splitmix64 over a counter).
    fn jitter(&self, max: Duration) -> Duration {
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Duration::from_micros(z % (max.as_micros() as u64 + 1))
    }
}

fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("floor: {e}");
            return ExitCode::from(64);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.threads.max(1))
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("floor: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floor: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(options: Options) -> std::io::Result<()> {
    let listener = TcpListener::bind(options.listen).await?;
    let addr = listener.local_addr()?;
    println!("floor listening on http://{addr}");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let floor = Arc::new(Floor {
        sessions: Mutex::new(HashMap::new()),
        mcp_sessions: Mutex::new(HashSet::new()),
        next_session: AtomicU64::new(1),
        salt: nanos ^ std::process::id(),
        delay: options.delay,
        reorder: options.reorder,
        rng: AtomicU64::new(u64::from(nanos)),
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let (stream, _) = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = term.recv() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("floor: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let floor = floor.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let floor = floor.clone();
                async move { Ok::<_, Infallible>(handle(&floor, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(floor: &Arc<Floor>, req: Request<Incoming>) -> Response<ResponseBody> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/sse") => open(floor),
        (&Method::POST, "/messages") => post(floor, req).await,
        (&Method::POST, "/mcp") => mcp_post(floor, req).await,
        (&Method::DELETE, "/mcp") => match mcp_session_header(&req) {
            Some(sid) if floor.mcp_sessions().remove(sid) => {
                let mut r = plain(StatusCode::NO_CONTENT, "");
                r.headers_mut().remove(header::CONTENT_TYPE);
                r
            }
            Some(_) => plain(StatusCode::NOT_FOUND, "Session not found"),
            None => plain(StatusCode::BAD_REQUEST, "Bad Request"),
        },
        (&Method::GET, "/health") => {
            let n = floor.sessions().len() + floor.mcp_sessions().len();
            let mut r = plain(
                StatusCode::OK,
                format!(r#"{{"status":"ok","sessions":{n}}}"#),
            );
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        _ => plain(StatusCode::NOT_FOUND, "Not Found"),
    }
}

fn plain(status: StatusCode, body: impl Into<Bytes>) -> Response<ResponseBody> {
    let mut r = Response::new(UnsyncBoxBody::new(Full::new(body.into())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

fn open(floor: &Arc<Floor>) -> Response<ResponseBody> {
    let sid = floor.mint();
    let (tx, rx) = mpsc::unbounded_channel();
    floor.sessions().insert(sid.clone(), tx);
    let endpoint = format!("event: endpoint\ndata: /messages?session_id={sid}\n\n");
    let body = SseBody {
        first: Some(Bytes::from(endpoint)),
        rx,
        sid,
        floor: floor.clone(),
    };
    let mut r = Response::new(UnsyncBoxBody::new(body));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

async fn post(floor: &Arc<Floor>, req: Request<Incoming>) -> Response<ResponseBody> {
    let sid = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("session_id="))
        .unwrap_or("")
        .to_owned();
    let Some(tx) = floor.sessions().get(&sid).cloned() else {
        return plain(StatusCode::NOT_FOUND, "Session not found");
    };
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return plain(StatusCode::PAYLOAD_TOO_LARGE, "Payload Too Large"),
    };
    let mut frame = Vec::with_capacity(body.len() + 256);
    frame.extend_from_slice(b"event: message\ndata: ");
    let start = frame.len();
    let kind = echo::answer(&body, &mut frame);
    if kind == echo::Kind::Invalid {
        return plain(StatusCode::BAD_REQUEST, "Bad Request");
    }
    if frame.len() > start {
        frame.extend_from_slice(b"\n\n");
        let frame = Bytes::from(frame);
        match floor.delay {
            Some(delay) if kind == echo::Kind::Call => {
                let wait = if floor.reorder {
                    floor.jitter(delay)
                } else {
                    delay
                };
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    let _ = tx.send(frame);
                });
            }
            _ => {
                let _ = tx.send(frame);
            }
        }
    }
    plain(StatusCode::ACCEPTED, "Accepted")
}

fn mcp_session_header(req: &Request<Incoming>) -> Option<&str> {
    req.headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
}

/// `POST /mcp`: the answer in the response itself (a JSON body), or 202 for a
/// notification.
async fn mcp_post(floor: &Arc<Floor>, req: Request<Incoming>) -> Response<ResponseBody> {
    let text = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
    let json_body = text(header::CONTENT_TYPE).is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    });
    if !json_body {
        return plain(StatusCode::UNSUPPORTED_MEDIA_TYPE, "Unsupported Media Type");
    }
    let accepts_json = text(header::ACCEPT).is_some_and(|a| {
        a.split(',').any(|r| {
            let media = r.split(';').next().unwrap_or_default().trim();
            media.eq_ignore_ascii_case("application/json") || media == "*/*"
        })
    });
    if !accepts_json {
        return plain(StatusCode::NOT_ACCEPTABLE, "Not Acceptable");
    }
    let named = mcp_session_header(&req).map(str::to_owned);
    if let Some(sid) = &named {
        if !floor.mcp_sessions().contains(sid) {
            return plain(StatusCode::NOT_FOUND, "Session not found");
        }
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return plain(StatusCode::PAYLOAD_TOO_LARGE, "Payload Too Large"),
    };
    let sid = match named {
        Some(sid) => sid,
        None => {
            // Only an initialize starts a session.
            #[derive(serde::Deserialize)]
            struct Method<'a> {
                #[serde(borrow)]
                method: Option<std::borrow::Cow<'a, str>>,
            }
            let initialize = serde_json::from_slice::<Method>(&body)
                .is_ok_and(|m| m.method.as_deref() == Some("initialize"));
            if !initialize {
                return plain(StatusCode::BAD_REQUEST, "Bad Request: no Mcp-Session-Id");
            }
            let sid = floor.mint();
            floor.mcp_sessions().insert(sid.clone());
            sid
        }
    };
    let mut answer = Vec::with_capacity(body.len() + 256);
    let kind = echo::answer(&body, &mut answer);
    let mut r = match kind {
        echo::Kind::Invalid => return plain(StatusCode::BAD_REQUEST, "Bad Request"),
        echo::Kind::Silent => {
            let mut r = plain(StatusCode::ACCEPTED, "");
            r.headers_mut().remove(header::CONTENT_TYPE);
            r
        }
        echo::Kind::Call | echo::Kind::Request => {
            if let (Some(delay), echo::Kind::Call) = (floor.delay, kind) {
                let wait = if floor.reorder {
                    floor.jitter(delay)
                } else {
                    delay
                };
                tokio::time::sleep(wait).await;
            }
            let mut r = plain(StatusCode::OK, answer);
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
    };
    if let Ok(value) = HeaderValue::from_str(&sid) {
        r.headers_mut().insert("mcp-session-id", value);
    }
    r
}

/// The body of `GET /sse`: the endpoint event, then every queued frame.
struct SseBody {
    first: Option<Bytes>,
    rx: mpsc::UnboundedReceiver<Bytes>,
    sid: String,
    floor: Arc<Floor>,
}

impl http_body::Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(first))));
        }
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(frame)) => {
                let Ok(second) = this.rx.try_recv() else {
                    return Poll::Ready(Some(Ok(http_body::Frame::data(frame))));
                };
                let mut buf = BytesMut::with_capacity(COALESCE_LIMIT);
                buf.extend_from_slice(&frame);
                buf.extend_from_slice(&second);
                while buf.len() < COALESCE_LIMIT {
                    let Ok(more) = this.rx.try_recv() else { break };
                    buf.extend_from_slice(&more);
                }
                Poll::Ready(Some(Ok(http_body::Frame::data(buf.freeze()))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for SseBody {
    fn drop(&mut self) {
        self.floor.sessions().remove(&self.sid);
    }
}
