//! A tiny HTTP/1.1 client over `std::net::TcpStream`, enough to poke every corner of the
//! proxy's HTTP surface: arbitrary methods, paths, headers and framings (Content-Length,
//! chunked, raw bytes, bodies streamed from a pattern), raw status and headers kept, every
//! read bounded by a deadline. Loopback only.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A complete response, status line and headers kept as received.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    /// Header names as sent by the server; compare them case-insensitively.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics with the body in the message when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "response body is not JSON ({e}): status {} body {:?}",
                self.status,
                self.text()
            )
        })
    }
}

pub(crate) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A request body and its framing.
#[derive(Debug, Clone)]
pub enum Body {
    /// No body and no framing header.
    None,
    /// Sent with `Content-Length`.
    Bytes(Vec<u8>),
    /// Sent with `Transfer-Encoding: chunked`, one chunk per element (empty ones skipped).
    Chunked(Vec<Vec<u8>>),
    /// `chunk` repeated until `total` bytes were sent, without holding them in memory:
    /// with `Content-Length: total`, or chunked (one HTTP chunk per repetition).
    Repeat {
        chunk: Vec<u8>,
        total: u64,
        chunked: bool,
    },
    /// Written verbatim after the headers; no framing header is added (give your own).
    Raw(Vec<u8>),
}

impl Body {
    pub fn json(text: &str) -> Body {
        Body::Bytes(text.as_bytes().to_vec())
    }

    fn framing_header(&self) -> Option<String> {
        match self {
            Body::None | Body::Raw(_) => None,
            Body::Bytes(b) => Some(format!("Content-Length: {}\r\n", b.len())),
            Body::Chunked(_) => Some("Transfer-Encoding: chunked\r\n".to_owned()),
            Body::Repeat { total, chunked, .. } => Some(if *chunked {
                "Transfer-Encoding: chunked\r\n".to_owned()
            } else {
                format!("Content-Length: {total}\r\n")
            }),
        }
    }

    fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        match self {
            Body::None => Ok(()),
            Body::Bytes(b) | Body::Raw(b) => out.write_all(b),
            Body::Chunked(chunks) => {
                for c in chunks.iter().filter(|c| !c.is_empty()) {
                    write!(out, "{:x}\r\n", c.len())?;
                    out.write_all(c)?;
                    out.write_all(b"\r\n")?;
                }
                out.write_all(b"0\r\n\r\n")
            }
            Body::Repeat {
                chunk,
                total,
                chunked,
            } => {
                let mut left = *total;
                while left > 0 {
                    let n = (chunk.len() as u64).min(left) as usize;
                    if *chunked {
                        write!(out, "{n:x}\r\n")?;
                        out.write_all(&chunk[..n])?;
                        out.write_all(b"\r\n")?;
                    } else {
                        out.write_all(&chunk[..n])?;
                    }
                    left -= n as u64;
                }
                if *chunked {
                    out.write_all(b"0\r\n\r\n")?;
                }
                Ok(())
            }
        }
    }

    /// Small enough to write before reading without risking a deadlock.
    fn is_small(&self) -> bool {
        match self {
            Body::None => true,
            Body::Bytes(b) | Body::Raw(b) => b.len() <= 32 * 1024,
            Body::Chunked(c) => c.iter().map(Vec::len).sum::<usize>() <= 32 * 1024,
            Body::Repeat { .. } => false,
        }
    }
}

/// The request head; adds `Host: <addr>` unless `headers` has a Host, and the body's framing.
fn head(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &Body,
    close: bool,
) -> Vec<u8> {
    let mut h = format!("{method} {target} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        h.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(f) = body.framing_header() {
        h.push_str(&f);
    }
    if close
        && !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("connection"))
    {
        h.push_str("Connection: close\r\n");
    }
    h.push_str("\r\n");
    h.into_bytes()
}

/// Connects to a loopback address only.
pub(crate) fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    assert!(
        addr.ip().is_loopback(),
        "the suites talk to loopback only, not {addr}"
    );
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_nodelay(true)?;
    // A server that stops reading must not hang a test forever.
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

/// One request on a fresh connection (`Connection: close`), answered within `timeout`.
///
/// The body is written from a second thread while this one reads, so a server that answers
/// early (413) and closes is seen answering, not as a broken pipe.
pub fn request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: Body,
    timeout: Duration,
) -> io::Result<Response> {
    let deadline = Instant::now() + timeout;
    let stream = connect(addr, timeout)?;
    let head = head(addr, method, target, headers, &body, true);
    let head_only = method.eq_ignore_ascii_case("HEAD");
    if body.is_small() {
        let mut w = &stream;
        let mut all = head;
        body.write_to(&mut all)?;
        // A server may refuse before reading everything; the answer still counts.
        let write_result = w.write_all(&all);
        let mut wire = Wire::new(stream);
        return match read_response(&mut wire, head_only, deadline) {
            Ok(r) => Ok(r),
            Err(e) => Err(write_result.err().unwrap_or(e)),
        };
    }
    let mut writer_stream = stream.try_clone()?;
    let writer = std::thread::spawn(move || -> io::Result<u64> {
        let mut counting = Counting {
            inner: &mut writer_stream,
            written: 0,
        };
        counting.write_all(&head)?;
        body.write_to(&mut counting)?;
        counting.flush()?;
        Ok(counting.written)
    });
    let mut wire = Wire::new(stream.try_clone()?);
    let result = read_response(&mut wire, head_only, deadline);
    // Unblocks the writer if the server answered before taking the whole body.
    let _ = stream.shutdown(Shutdown::Both);
    let written = writer.join().expect("writer thread panicked");
    match (result, written) {
        (Ok(r), _) => Ok(r),
        (Err(e), Err(w)) => Err(io::Error::new(
            e.kind(),
            format!("{e} (while writing the body: {w})"),
        )),
        (Err(e), Ok(_)) => Err(e),
    }
}

struct Counting<'a, W: Write> {
    inner: &'a mut W,
    written: u64,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A keep-alive connection for many small requests in a row (load loops).
pub struct Conn {
    addr: SocketAddr,
    wire: Option<Wire>,
    timeout: Duration,
}

impl Conn {
    pub fn new(addr: SocketAddr, timeout: Duration) -> Conn {
        Conn {
            addr,
            wire: None,
            timeout,
        }
    }

    /// Sends one request with a `Content-Length` body and reads its response. A connection
    /// the server closed while idle is reopened once.
    pub fn request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Response> {
        let b = Body::Bytes(body.to_vec());
        let mut bytes = head(self.addr, method, target, headers, &b, false);
        bytes.extend_from_slice(body);
        for attempt in 0..2 {
            let reused = self.wire.is_some();
            if self.wire.is_none() {
                self.wire = Some(Wire::new(connect(self.addr, self.timeout)?));
            }
            let wire = self.wire.as_mut().expect("just set");
            wire.consumed = 0;
            let deadline = Instant::now() + self.timeout;
            let sent = (&wire.stream).write_all(&bytes);
            let result = match sent {
                Ok(()) => read_response(wire, false, deadline),
                Err(e) => Err(e),
            };
            match result {
                Ok(r) => {
                    let close = r
                        .header("connection")
                        .is_some_and(|v| v.eq_ignore_ascii_case("close"));
                    if close {
                        self.wire = None;
                    }
                    return Ok(r);
                }
                Err(e) => {
                    let nothing_read = self.wire.as_ref().is_some_and(|w| w.consumed == 0);
                    self.wire = None;
                    if !(reused && attempt == 0 && nothing_read) {
                        return Err(e);
                    }
                }
            }
        }
        unreachable!("the loop returns on its second attempt")
    }
}

/// A socket with a read buffer; every read bounded by a deadline.
pub(crate) struct Wire {
    pub(crate) stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
    /// Bytes handed out since the last request began (to tell a stale keep-alive socket).
    consumed: usize,
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("timed out {what}"))
}

impl Wire {
    pub(crate) fn new(stream: TcpStream) -> Wire {
        Wire {
            stream,
            buf: Vec::with_capacity(16 * 1024),
            start: 0,
            consumed: 0,
        }
    }

    pub(crate) fn available(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    pub(crate) fn consume(&mut self, n: usize) {
        self.start += n;
        self.consumed += n;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
    }

    /// Reads more bytes; `Ok(0)` at end of stream, `TimedOut` at the deadline.
    pub(crate) fn fill(&mut self, deadline: Instant) -> io::Result<usize> {
        let now = Instant::now();
        if now >= deadline {
            return Err(timed_out("waiting for data"));
        }
        self.stream
            .set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))))?;
        if self.start > 0 && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let old = self.buf.len();
        self.buf.resize(old + 16 * 1024, 0);
        let r = self.stream.read(&mut self.buf[old..]);
        match r {
            Ok(n) => {
                self.buf.truncate(old + n);
                Ok(n)
            }
            Err(e) => {
                self.buf.truncate(old);
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) {
                    Err(timed_out("waiting for data"))
                } else {
                    Err(e)
                }
            }
        }
    }

    /// One line without its CRLF (or LF).
    pub(crate) fn read_line(&mut self, deadline: Instant) -> io::Result<Vec<u8>> {
        loop {
            if let Some(i) = self.available().iter().position(|&b| b == b'\n') {
                let mut line = self.available()[..i].to_vec();
                self.consume(i + 1);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
            if self.available().len() > 1 << 20 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "line over 1 MiB",
                ));
            }
            if self.fill(deadline)? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed mid-line",
                ));
            }
        }
    }

    fn read_exact_vec(&mut self, n: usize, deadline: Instant) -> io::Result<Vec<u8>> {
        while self.available().len() < n {
            if self.fill(deadline)? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed mid-body",
                ));
            }
        }
        let out = self.available()[..n].to_vec();
        self.consume(n);
        Ok(out)
    }

    fn read_to_end_vec(&mut self, deadline: Instant) -> io::Result<Vec<u8>> {
        loop {
            match self.fill(deadline) {
                Ok(0) => break,
                Ok(_) => {}
                // A reset after the whole answer arrived still ends the body.
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
                Err(e) => return Err(e),
            }
        }
        let out = self.available().to_vec();
        let n = out.len();
        self.consume(n);
        Ok(out)
    }
}

/// Status, reason phrase and headers.
pub(crate) type Head = (u16, String, Vec<(String, String)>);

/// Status line and headers, skipping interim 1xx responses.
pub(crate) fn read_head(wire: &mut Wire, deadline: Instant) -> io::Result<Head> {
    loop {
        let line = wire.read_line(deadline)?;
        let line = String::from_utf8_lossy(&line).into_owned();
        let mut parts = line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        if !version.starts_with("HTTP/1.") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not an HTTP/1 status line: {line:?}"),
            ));
        }
        let status: u16 = parts.next().unwrap_or_default().parse().map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidData, format!("bad status: {line:?}"))
        })?;
        let reason = parts.next().unwrap_or_default().to_owned();
        let mut headers = Vec::new();
        loop {
            let h = wire.read_line(deadline)?;
            if h.is_empty() {
                break;
            }
            let h = String::from_utf8_lossy(&h).into_owned();
            let (k, v) = h.split_once(':').ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, format!("bad header: {h:?}"))
            })?;
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        if (100..200).contains(&status) {
            continue;
        }
        return Ok((status, reason, headers));
    }
}

pub(crate) fn is_chunked(headers: &[(String, String)]) -> bool {
    header(headers, "transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
}

fn read_response(wire: &mut Wire, head_only: bool, deadline: Instant) -> io::Result<Response> {
    let (status, reason, headers) = read_head(wire, deadline)?;
    let body = read_body(wire, status, &headers, head_only, deadline)?;
    Ok(Response {
        status,
        reason,
        headers,
        body,
    })
}

/// The body of a response whose head was read, by its framing.
pub(crate) fn read_body(
    wire: &mut Wire,
    status: u16,
    headers: &[(String, String)],
    head_only: bool,
    deadline: Instant,
) -> io::Result<Vec<u8>> {
    Ok(if head_only || status == 204 || status == 304 {
        Vec::new()
    } else if is_chunked(headers) {
        let mut body = Vec::new();
        loop {
            let size_line = wire.read_line(deadline)?;
            let size_text = String::from_utf8_lossy(&size_line);
            let size_text = size_text.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size_text, 16).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad chunk size {size_text:?}"),
                )
            })?;
            if size == 0 {
                while !wire.read_line(deadline)?.is_empty() {}
                break;
            }
            body.extend(wire.read_exact_vec(size, deadline)?);
            wire.read_line(deadline)?;
        }
        body
    } else if let Some(len) = header(headers, "content-length") {
        let len: usize = len.parse().map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidData, format!("bad length {len:?}"))
        })?;
        wire.read_exact_vec(len, deadline)?
    } else {
        wire.read_to_end_vec(deadline)?
    })
}
