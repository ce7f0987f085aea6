//! The one owner: a single thread holds the shared [`Owner`] (the core's `Hub` and what the
//! loop keeps beside it), waits for the next input, timer or shutdown, and drains. This
//! shell's part is the waiting and what only threads can do: reply channels, stream queues,
//! the backend's threads. No send ever waits, and no lock is taken but the listening
//! servers' list, once, to stop accepting.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use switchboard_core::config::Config;
use switchboard_core::hub::Settings;
use switchboard_core::Front;
use switchboard_core::Signal;
use switchboard_core::{BackendId, FetchId, StreamId};
use switchboard_shell::{Owner, Perform, Process, Shared, StreamQueue};

use crate::backend::{self, Backend};
use crate::session::{self, Queue, StreamBody};

/// How long the loop sleeps when the hub has no timer set.
const IDLE_WAKE: Duration = Duration::from_secs(24 * 3600);

/// What the loop answers a request with.
pub enum Reply {
    /// A complete response.
    Full(switchboard_core::http::Response),
    /// A stream: its head, and the body the loop feeds.
    Stream(switchboard_core::http::Response, StreamBody),
}

/// Everything the loop reacts to, from handlers and the backend's threads; a connection
/// waits on a channel of one, so a send never waits.
pub type Input = switchboard_shell::Input<Sender<Reply>>;

/// The loop and what it waits on.
pub struct Supervisor {
    owner: Owner<Threads>,
    inputs: Receiver<Input>,
    closed: Receiver<StreamId>,
    shutdown: Receiver<()>,
}

impl Supervisor {
    /// The loop, and what the other threads need to reach it: its inputs, the channel on
    /// which streams report their end, and the shutdown request. `config` is what the
    /// proxy started with (the backend's command, environment and line limit); `front`
    /// is what request handlers read, replaced on reload.
    pub fn new(
        config: Arc<Config>,
        settings: Settings,
        front: Arc<Shared<Front>>,
        command: Vec<String>,
        stop_accepting: Box<dyn FnOnce() + Send>,
    ) -> (Self, Sender<Input>, Sender<StreamId>, Sender<()>) {
        let (inputs_tx, inputs) = crossbeam_channel::bounded(1024);
        let (closed_tx, closed) = crossbeam_channel::unbounded();
        let (shutdown_tx, shutdown) = crossbeam_channel::bounded(1);
        let threads = Threads {
            config,
            inputs: inputs_tx.clone(),
            stop_accepting: Some(stop_accepting),
        };
        let supervisor = Supervisor {
            owner: Owner::new(settings, front, command, threads),
            inputs,
            closed,
            shutdown,
        };
        (supervisor, inputs_tx, closed_tx, shutdown_tx)
    }

    /// The shared part of the loop, to be given the key store and the audit log.
    pub fn owner(&mut self) -> &mut Owner<Threads> {
        &mut self.owner
    }

    /// Runs until the hub says exit; returns the status and how long answers under way
    /// may still take.
    pub fn run(mut self) -> (i32, Duration) {
        let mut now = Instant::now();
        loop {
            if let Some(exit) = self.owner.drain(now, self.inputs.try_iter()) {
                return exit;
            }
            // No deadline: wake once a day to look again (nothing is due then either).
            let timeout = self
                .owner
                .poll_timeout()
                .map_or(IDLE_WAKE, |at| at.saturating_duration_since(now));
            select! {
                recv(self.shutdown) -> _ => {
                    now = Instant::now();
                    self.owner.handle_shutdown(now);
                }
                recv(self.closed) -> stream => {
                    now = Instant::now();
                    if let Ok(stream) = stream {
                        self.owner.handle_stream_closed(now, stream);
                    }
                }
                recv(self.inputs) -> input => {
                    now = Instant::now();
                    if let Ok(input) = input {
                        self.owner.handle_input(now, input);
                    }
                }
                default(timeout) => {
                    now = Instant::now();
                    self.owner.handle_timeout(now);
                }
            }
        }
    }
}

/// What the owner asks of this shell's threads.
pub struct Threads {
    config: Arc<Config>,
    inputs: Sender<Input>,
    stop_accepting: Option<Box<dyn FnOnce() + Send>>,
}

impl Perform for Threads {
    type Reply = Sender<Reply>;
    type Queue = Queue;
    type Process = Backend;

    fn respond(&mut self, reply: Self::Reply, response: switchboard_core::http::Response) {
        let _ = reply.send(Reply::Full(response));
    }

    fn open_stream(
        &mut self,
        stream: StreamId,
        head: switchboard_core::http::Response,
        budget: usize,
        reply: Option<Self::Reply>,
    ) -> Option<Queue> {
        let (queue, body) = session::channel(stream, budget);
        match reply {
            // The connection is gone: so is the stream.
            Some(reply) => reply.send(Reply::Stream(head, body)).ok().map(|()| queue),
            None => Some(queue),
        }
    }

    fn spawn_backend(&mut self, command: &[String], id: BackendId) -> std::io::Result<Backend> {
        let (env, max_line) = (&self.config.env, self.config.max_line);
        backend::spawn(command, env, max_line, id, self.inputs.clone())
    }

    fn fetch(&mut self, fetch: FetchId, url: String) -> Result<(), String> {
        let inputs = self.inputs.clone();
        // Off the loop: a slow identity provider never stalls routing.
        thread::Builder::new()
            .name("fetch".into())
            .spawn(move || {
                let result = switchboard_shell::fetch::fetch(&url);
                let _ = inputs.send(Input::Fetched { fetch, result });
            })
            .map(drop)
            .map_err(|e| format!("cannot start a fetch thread: {e}"))
    }

    fn stop_accepting(&mut self) {
        if let Some(stop) = self.stop_accepting.take() {
            stop();
        }
    }

    fn churned(&mut self) {
        crate::memory::churned();
    }
}

impl StreamQueue for Queue {
    fn push(&self, frame: switchboard_core::Frame) -> Result<(), switchboard_core::StreamEnd> {
        Queue::push(self, frame)
    }
}

impl Process for Backend {
    fn id(&self) -> BackendId {
        self.id
    }

    fn pid(&self) -> u32 {
        self.pid
    }

    fn write(&self, line: Vec<u8>) {
        if let Some(stdin) = &self.stdin {
            let _ = stdin.send(line);
        }
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    fn signal(&self, signal: Signal) {
        let _ = self.signals.send(signal);
    }
}
