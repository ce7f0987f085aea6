//! The one owner: a single task holds the shared [`Owner`] (the core's `Hub` and what the
//! loop keeps beside it), waits for the next input, timer or shutdown, and drains. This
//! shell's part is the waiting and what only tokio can do: reply channels, stream bodies,
//! the backend's tasks. No lock is held anywhere; no send ever waits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchboard_core::config::Config;
use switchboard_core::hub::Settings;
use switchboard_core::Front;
use switchboard_core::Signal;
use switchboard_core::{BackendId, FetchId, StreamId};
use switchboard_shell::{Owner, Perform, Process, Shared, StreamQueue};
use tokio::sync::{mpsc, oneshot};

use crate::backend::{self, Backend};
use crate::session::{self, Queue, StreamBody};

/// How a request handler is answered.
pub enum Reply {
    /// A complete response.
    Full(switchboard_core::http::Response),
    /// A stream: its head, and the body the loop feeds.
    Stream(switchboard_core::http::Response, StreamBody),
}

/// Everything the loop reacts to, from handlers and the backend's tasks.
pub type Input = switchboard_shell::Input<oneshot::Sender<Reply>>;

/// The loop and what it waits on.
pub struct Supervisor {
    owner: Owner<Tokio>,
    inputs: mpsc::Receiver<Input>,
    closed: mpsc::UnboundedReceiver<StreamId>,
}

impl Supervisor {
    /// The loop, and the sender request handlers reach it by. `config` is what the
    /// proxy started with (the backend's command, environment and line limit); `front`
    /// is what request handlers read, replaced on reload.
    pub fn new(
        config: Arc<Config>,
        settings: Settings,
        front: Arc<Shared<Front>>,
        command: Vec<String>,
        stop_accepting: oneshot::Sender<()>,
    ) -> (Self, mpsc::Sender<Input>) {
        let (inputs_tx, inputs) = mpsc::channel(1024);
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let tokio = Tokio {
            config,
            inputs: inputs_tx.clone(),
            closed: closed_tx,
            stop_accepting: Some(stop_accepting),
        };
        let owner = Owner::new(settings, front, command, tokio);
        let supervisor = Supervisor {
            owner,
            inputs,
            closed,
        };
        (supervisor, inputs_tx)
    }

    /// The shared part of the loop, to be given the key store and the audit log.
    pub fn owner(&mut self) -> &mut Owner<Tokio> {
        &mut self.owner
    }

    /// Runs until the hub says exit; returns the status and how long answers under way
    /// may still take.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> (i32, Duration) {
        tokio::pin!(shutdown);
        let mut signalled = false;
        // One timer, moved only when the hub's next deadline moves: registering a new one
        // per input would cost a timer-wheel insert and removal for every message.
        let timer = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(timer);
        let mut armed_for: Option<Instant> = None;
        let mut now = Instant::now();
        loop {
            let queued = std::iter::from_fn(|| self.inputs.try_recv().ok());
            if let Some(exit) = self.owner.drain(now, queued) {
                return exit;
            }
            let deadline = self.owner.poll_timeout();
            if deadline != armed_for {
                if let Some(at) = deadline {
                    timer.as_mut().reset(tokio::time::Instant::from_std(at));
                }
                armed_for = deadline;
            }
            tokio::select! {
                biased;
                () = &mut shutdown, if !signalled => {
                    signalled = true;
                    now = Instant::now();
                    self.owner.handle_shutdown(now);
                }
                Some(stream) = self.closed.recv() => {
                    now = Instant::now();
                    self.owner.handle_stream_closed(now, stream);
                }
                Some(input) = self.inputs.recv() => {
                    now = Instant::now();
                    self.owner.handle_input(now, input);
                }
                () = &mut timer, if armed_for.is_some() => {
                    armed_for = None;
                    now = Instant::now();
                    self.owner.handle_timeout(now);
                }
            }
        }
    }
}

/// What the owner asks of tokio.
pub struct Tokio {
    config: Arc<Config>,
    inputs: mpsc::Sender<Input>,
    closed: mpsc::UnboundedSender<StreamId>,
    stop_accepting: Option<oneshot::Sender<()>>,
}

impl Perform for Tokio {
    type Reply = oneshot::Sender<Reply>;
    type Queue = Queue;
    type Process = Backend;

    fn respond(&mut self, reply: Self::Reply, response: switchboard_core::http::Response) {
        // The client may have given up; nothing to do then.
        let _ = reply.send(Reply::Full(response));
    }

    fn open_stream(
        &mut self,
        stream: StreamId,
        head: switchboard_core::http::Response,
        budget: usize,
        reply: Option<Self::Reply>,
    ) -> Option<Queue> {
        let (queue, body) = session::channel(stream, budget, self.closed.clone());
        if let Some(reply) = reply {
            // A client that gave up drops the body, which reports the stream closed.
            let _ = reply.send(Reply::Stream(head, body));
        }
        Some(queue)
    }

    fn spawn_backend(&mut self, command: &[String], id: BackendId) -> std::io::Result<Backend> {
        let (env, max_line) = (&self.config.env, self.config.max_line);
        backend::spawn(command, env, max_line, id, self.inputs.clone())
    }

    fn fetch(&mut self, fetch: FetchId, url: String) -> Result<(), String> {
        let inputs = self.inputs.clone();
        // Off the loop: a slow identity provider never stalls routing.
        tokio::task::spawn_blocking(move || {
            let result = switchboard_shell::fetch::fetch(&url);
            let _ = inputs.blocking_send(Input::Fetched { fetch, result });
        });
        Ok(())
    }

    fn stop_accepting(&mut self) {
        if let Some(stop) = self.stop_accepting.take() {
            let _ = stop.send(());
        }
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
