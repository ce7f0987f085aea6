//! A fast stdio MCP server for benchmarks: newline-delimited JSON-RPC on stdin/stdout.
//!
//! Usage: `echo-backend [--delay-ms N [--reorder]]`
//!
//! - `initialize`, `ping`: answered at once (see `bench-common/echo.rs` for every answer).
//! - `tools/call`: answered with the raw id spliced back verbatim (never through f64) and
//!   the arguments echoed raw as `structuredContent`.
//! - `--delay-ms N`: every `tools/call` answer waits N ms; with `--reorder` a random delay
//!   in `0..=N` ms, so answers come out of order. One timer thread and a heap, not a
//!   thread per request.
//!
//! Reads and writes the raw pipes through 64 KiB buffers (not the line-buffered `Stdout`)
//! and flushes when no more input is buffered, so bursts become single writes. Exits 0
//! when stdin closes (after the delayed answers still pending were written).

#[path = "bench-common/echo.rs"]
mod echo;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const BUFFER: usize = 64 * 1024;

struct Options {
    delay: Option<Duration>,
    reorder: bool,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        delay: None,
        reorder: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--delay-ms" => {
                let ms: u64 = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--delay-ms needs a number of milliseconds")?;
                options.delay = Some(Duration::from_millis(ms));
            }
            "--reorder" => options.reorder = true,
            "-h" | "--help" => {
                return Err("usage: echo-backend [--delay-ms N [--reorder]]".to_owned())
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if options.reorder && options.delay.is_none() {
        return Err("--reorder needs --delay-ms".to_owned());
    }
    Ok(options)
}

type Out = Arc<Mutex<BufWriter<File>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Answers waiting for their time, earliest first; `seq` keeps equal times in order.
#[derive(Default)]
struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    lines: std::collections::HashMap<u64, Vec<u8>>,
    seq: u64,
    closed: bool,
}

struct Delayed {
    timers: Mutex<Timers>,
    wake: Condvar,
}

impl Delayed {
    fn push(&self, due: Instant, line: Vec<u8>) {
        let mut t = lock(&self.timers);
        t.seq += 1;
        let seq = t.seq;
        let earliest = match t.heap.peek() {
            Some(Reverse((at, _))) => due < *at,
            None => true,
        };
        t.heap.push(Reverse((due, seq)));
        t.lines.insert(seq, line);
        drop(t);
        if earliest {
            self.wake.notify_one();
        }
    }

    fn close(&self) {
        lock(&self.timers).closed = true;
        self.wake.notify_one();
    }

    /// The timer thread: writes each answer when it is due; returns once closed and empty.
    fn run(&self, out: &Out) {
        let mut t = lock(&self.timers);
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            while let Some(Reverse((at, seq))) = t.heap.peek().copied() {
                if at > now {
                    break;
                }
                t.heap.pop();
                if let Some(line) = t.lines.remove(&seq) {
                    due.push(line);
                }
            }
            if !due.is_empty() {
                drop(t);
                let mut w = lock(out);
                for line in &due {
                    let _ = w.write_all(line);
                }
                let _ = w.flush();
                drop(w);
                t = lock(&self.timers);
                continue;
            }
            match t.heap.peek().copied() {
                Some(Reverse((at, _))) => {
                    let wait = at.saturating_duration_since(now);
                    t = self
                        .wake
                        .wait_timeout(t, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                None if t.closed => return,
                None => t = self.wake.wait(t).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }
}

/// xorshift64*: reply delays only, no need for a real generator.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Rng((nanos ^ (u64::from(std::process::id()) << 32)) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("echo-backend: {e}");
            return ExitCode::from(64);
        }
    };
    match serve(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("echo-backend: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(options: &Options) -> io::Result<()> {
    // Duplicates of fd 0 and 1, unbuffered by std: our own buffers decide when to write.
    let stdin = File::from(io::stdin().as_fd().try_clone_to_owned()?);
    let stdout = File::from(io::stdout().as_fd().try_clone_to_owned()?);
    let mut input = BufReader::with_capacity(BUFFER, stdin);
    let out: Out = Arc::new(Mutex::new(BufWriter::with_capacity(BUFFER, stdout)));
    let delayed = options.delay.map(|_| {
        Arc::new(Delayed {
            timers: Mutex::new(Timers::default()),
            wake: Condvar::new(),
        })
    });
    let timer = match &delayed {
        Some(d) => {
            let (d, out) = (d.clone(), out.clone());
            Some(
                thread::Builder::new()
                    .name("timers".into())
                    .spawn(move || d.run(&out))?,
            )
        }
        None => None,
    };
    let mut rng = Rng::seeded();
    let mut line = Vec::with_capacity(4096);
    let mut answer = Vec::with_capacity(4096);
    let mut pending = false;
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if !text.is_empty() {
            answer.clear();
            let kind = echo::answer(text, &mut answer);
            if kind == echo::Kind::Invalid {
                eprintln!("echo-backend: ignoring a line that is not JSON-RPC");
            }
            if !answer.is_empty() {
                answer.push(b'\n');
                match (&delayed, kind, options.delay) {
                    (Some(d), echo::Kind::Call, Some(delay)) => {
                        let wait = if options.reorder {
                            Duration::from_micros(rng.below(delay.as_micros() as u64 + 1))
                        } else {
                            delay
                        };
                        d.push(Instant::now() + wait, answer.clone());
                    }
                    _ => {
                        lock(&out).write_all(&answer)?;
                        pending = true;
                    }
                }
            }
        }
        // Flush once no complete line is buffered: a burst in, one write out.
        if pending && !input.buffer().contains(&b'\n') {
            lock(&out).flush()?;
            pending = false;
        }
    }
    lock(&out).flush()?;
    if let (Some(d), Some(t)) = (delayed, timer) {
        d.close();
        let _ = t.join();
    }
    Ok(())
}
