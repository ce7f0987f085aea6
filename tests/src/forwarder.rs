//! A loopback TCP forwarder to put between a client and a proxy, so that a test can cut the
//! client's connections mid-request the way a network does, without the client's help.
//!
//! It listens on `127.0.0.1:0` and forwards each accepted connection to its upstream, two
//! threads per connection. [`Forwarder::cut`] shuts down both sockets of every current
//! connection (the client sees its stream end, the proxy sees its client gone) while new
//! connections are still accepted. [`Forwarder::hold`] makes new connections wait: their
//! bytes are read and recorded but reach the upstream only once released, so a test can
//! let things happen while a reconnecting client is provably away. Every connection's
//! first bytes each way are recorded ([`Forwarder::connections`]), within fixed bounds.
//!
//! ```no_run
//! # fn demo(proxy_addr: std::net::SocketAddr) {
//! use switchboard_tests::Forwarder;
//! let fwd = Forwarder::start(proxy_addr);
//! // ... point a client at fwd.addr, then:
//! assert!(fwd.cut() > 0);
//! # }
//! ```

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Connections forwarded at once, at most; more are closed at once.
const MAX_LIVE: usize = 64;
/// Connections whose traffic is recorded, at most (the oldest are forgotten).
const MAX_RECORDED: usize = 256;
/// Bytes recorded per connection and direction, at most.
const RECORD_BYTES: usize = 16 * 1024;
/// How often a held connection checks whether it was released.
const HOLD_POLL: Duration = Duration::from_millis(10);

/// What one connection carried (its first [`RECORD_BYTES`] each way).
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    /// Client to upstream.
    pub sent: Vec<u8>,
    /// Upstream to client.
    pub received: Vec<u8>,
    /// It was accepted while the forwarder held new connections.
    pub held: bool,
}

impl Recorded {
    /// The client's bytes as text (lossy).
    pub fn sent_text(&self) -> String {
        String::from_utf8_lossy(&self.sent).into_owned()
    }

    /// The upstream's bytes as text (lossy).
    pub fn received_text(&self) -> String {
        String::from_utf8_lossy(&self.received).into_owned()
    }

    /// The value of header `name` in the first request the client sent, if any.
    pub fn request_header(&self, name: &str) -> Option<String> {
        let text = self.sent_text();
        let head = text.split("\r\n\r\n").next()?;
        head.lines().skip(1).find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }

    /// The first request's line (`GET /mcp HTTP/1.1`), if it arrived.
    pub fn request_line(&self) -> Option<String> {
        let text = self.sent_text();
        text.contains("\r\n")
            .then(|| text.lines().next().unwrap_or("").to_owned())
    }

    /// The status of the first answer, once its status line arrived.
    pub fn status(&self) -> Option<u16> {
        let text = self.received_text();
        let line = text
            .split("\r\n")
            .next()
            .filter(|_| text.contains("\r\n"))?;
        line.split(' ').nth(1)?.parse().ok()
    }
}

struct Link {
    client: TcpStream,
    upstream: Option<TcpStream>,
}

#[derive(Default)]
struct State {
    /// Live connections by number (a cut empties it).
    live: Vec<(usize, Link)>,
    /// Recorded traffic by connection number, oldest first.
    recorded: Vec<(usize, Recorded)>,
    next: usize,
}

struct Shared {
    upstream: SocketAddr,
    stop: AtomicBool,
    held: AtomicBool,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, n: usize, f: impl FnOnce(&mut Recorded)) {
        let mut state = self.lock();
        if let Some((_, r)) = state.recorded.iter_mut().find(|(m, _)| *m == n) {
            f(r);
        }
    }

    fn forget(&self, n: usize) {
        let mut state = self.lock();
        state.live.retain(|(m, _)| *m != n);
    }
}

/// A running forwarder; dropping it cuts every connection and stops accepting.
pub struct Forwarder {
    /// Where clients connect.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Forwarder {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> Forwarder {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind the forwarder's port");
        let addr = listener.local_addr().expect("the forwarder's address");
        let shared = Arc::new(Shared {
            upstream,
            stop: AtomicBool::new(false),
            held: AtomicBool::new(false),
            state: Mutex::new(State::default()),
        });
        let accept = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("forwarder-accept".into())
                .spawn(move || accept_loop(listener, shared))
                .expect("spawn the forwarder's accept thread")
        };
        Forwarder {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// Shuts down both sockets of every current connection; returns how many there were.
    /// New connections are accepted as before.
    pub fn cut(&self) -> usize {
        let live = std::mem::take(&mut self.shared.lock().live);
        for (_, link) in &live {
            let _ = link.client.shutdown(Shutdown::Both);
            if let Some(up) = &link.upstream {
                let _ = up.shutdown(Shutdown::Both);
            }
        }
        live.len()
    }

    /// While `on`, new connections are accepted and their bytes read and recorded, but
    /// nothing reaches the upstream; when turned off, they are forwarded (bytes read
    /// meanwhile first).
    pub fn hold(&self, on: bool) {
        self.shared.held.store(on, Ordering::SeqCst);
    }

    /// Every recorded connection, in the order they were accepted.
    pub fn connections(&self) -> Vec<Recorded> {
        let state = self.shared.lock();
        state.recorded.iter().map(|(_, r)| r.clone()).collect()
    }

    /// Waits until `pred` holds for the recorded connections, at most `timeout`; the
    /// connections then, or a panic naming `what`.
    pub fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&[Recorded]) -> bool,
    ) -> Vec<Recorded> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.connections();
            if pred(&seen) {
                return seen;
            }
            if Instant::now() > deadline {
                let summary: Vec<String> = seen
                    .iter()
                    .map(|r| {
                        format!(
                            "{:?} -> {:?} (held: {})",
                            r.request_line(),
                            r.status(),
                            r.held
                        )
                    })
                    .collect();
                panic!("forwarder: {what} did not happen within {timeout:?}; connections: {summary:#?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.hold(false);
        self.cut();
        // Wakes the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(client) = client else { continue };
        let _ = client.set_nodelay(true);
        let held = shared.held.load(Ordering::SeqCst);
        let n = {
            let mut state = shared.lock();
            if state.live.len() >= MAX_LIVE {
                continue; // dropped: closed at once
            }
            let Ok(clone) = client.try_clone() else {
                continue;
            };
            let n = state.next;
            state.next += 1;
            state.live.push((
                n,
                Link {
                    client: clone,
                    upstream: None,
                },
            ));
            if state.recorded.len() >= MAX_RECORDED {
                state.recorded.remove(0);
            }
            state.recorded.push((
                n,
                Recorded {
                    held,
                    ..Recorded::default()
                },
            ));
            n
        };
        let shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("forwarder-{n}"))
            .spawn(move || connection(n, client, shared));
        if spawned.is_err() {
            continue;
        }
    }
}

/// One connection: waits while held, connects upstream, then pumps both ways.
fn connection(n: usize, client: TcpStream, shared: Arc<Shared>) {
    let mut early = Vec::new();
    if shared.held.load(Ordering::SeqCst) {
        let _ = client.set_read_timeout(Some(HOLD_POLL));
        let mut buf = [0u8; 4096];
        while shared.held.load(Ordering::SeqCst) && !shared.stop.load(Ordering::SeqCst) {
            match (&client).read(&mut buf) {
                Ok(0) => {
                    shared.forget(n);
                    return;
                }
                Ok(k) => {
                    early.extend_from_slice(&buf[..k]);
                    shared.record(n, |r| append(&mut r.sent, &buf[..k]));
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => {
                    shared.forget(n);
                    return;
                }
            }
        }
        let _ = client.set_read_timeout(None);
    }
    let upstream = match TcpStream::connect_timeout(&shared.upstream, Duration::from_secs(10)) {
        Ok(s) => s,
        Err(_) => {
            let _ = client.shutdown(Shutdown::Both);
            shared.forget(n);
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    {
        let mut state = shared.lock();
        let Some((_, link)) = state.live.iter_mut().find(|(m, _)| *m == n) else {
            // Cut while connecting (or while held): the client is gone.
            drop(state);
            let _ = upstream.shutdown(Shutdown::Both);
            return;
        };
        match upstream.try_clone() {
            Ok(clone) => link.upstream = Some(clone),
            Err(_) => {
                drop(state);
                let _ = client.shutdown(Shutdown::Both);
                shared.forget(n);
                return;
            }
        }
    }
    if !early.is_empty() && (&upstream).write_all(&early).is_err() {
        let _ = client.shutdown(Shutdown::Both);
        let _ = upstream.shutdown(Shutdown::Both);
        shared.forget(n);
        return;
    }
    let (Ok(client2), Ok(upstream2)) = (client.try_clone(), upstream.try_clone()) else {
        let _ = client.shutdown(Shutdown::Both);
        let _ = upstream.shutdown(Shutdown::Both);
        shared.forget(n);
        return;
    };
    let back = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name(format!("forwarder-{n}-back"))
            .spawn(move || pump(upstream2, client2, &shared, n, false))
    };
    pump(client, upstream, &shared, n, true);
    if let Ok(back) = back {
        let _ = back.join();
    }
    shared.forget(n);
}

/// Copies `from` to `to`: an end of input is passed on as one (a half close); an error
/// either way shuts both down, so the other direction ends too.
fn pump(from: TcpStream, to: TcpStream, shared: &Shared, n: usize, client_side: bool) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match (&from).read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Err(_) => break,
            Ok(k) => {
                shared.record(n, |r| {
                    let into = if client_side {
                        &mut r.sent
                    } else {
                        &mut r.received
                    };
                    append(into, &buf[..k]);
                });
                if (&to).write_all(&buf[..k]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

fn append(into: &mut Vec<u8>, bytes: &[u8]) {
    let room = RECORD_BYTES.saturating_sub(into.len());
    into.extend_from_slice(&bytes[..bytes.len().min(room)]);
}
