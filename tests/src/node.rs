//! The Node tools of the suites (the MCP conformance suite, the TypeScript SDK client), pinned
//! in `tests/node/package-lock.json` and installed by `tests/run.sh` with `npm ci`: where
//! they are, and running them as bounded child processes.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::workspace_root;

/// The packages every Node suite needs under `node_modules`.
const PACKAGES: [&str; 2] = [
    "@modelcontextprotocol/conformance",
    "@modelcontextprotocol/sdk",
];

/// The installed Node tools: `$SWITCHBOARD_NODE_DIR` (set by `tests/run.sh`), else
/// `tests/node`.
pub struct Node {
    /// The folder holding `package.json` and `node_modules`.
    pub dir: PathBuf,
}

/// The Node tools, or `None` (after saying why, past the test harness's capture) when
/// `what` must skip: no `node` on `PATH` or nothing installed. Under `CI=true` it panics
/// instead, so CI never passes without running them.
pub fn node(what: &str) -> Option<Node> {
    node_with(what, &[])
}

/// [`node`], also requiring each of `extra` (package names) under `node_modules`.
pub fn node_with(what: &str, extra: &[&str]) -> Option<Node> {
    let dir = std::env::var_os("SWITCHBOARD_NODE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("tests/node"));
    let why = match Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Err(e) => Some(format!("cannot run `node` ({e}); install Node 20 or later")),
        Ok(s) if !s.success() => Some(format!("`node --version` failed: {s}")),
        Ok(_) => PACKAGES
            .iter()
            .chain(extra)
            .find(|p| {
                !dir.join("node_modules")
                    .join(p)
                    .join("package.json")
                    .is_file()
            })
            .map(|p| {
                format!(
                    "{p} is not installed in {} (run tests/run.sh, or `npm ci` there)",
                    dir.display()
                )
            }),
    };
    let Some(why) = why else {
        return Some(Node { dir });
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{what} cannot run in CI: {why}");
    }
    let msg = format!("\n**********\nSKIPPED: {what}: {why}\n**********\n");
    let _ = std::io::stderr().write_all(msg.as_bytes());
    None
}

/// Held while a Node suite runs, so the two targets' runs of one test file take turns
/// instead of competing for the CPUs (the suites have read deadlines of their own).
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Node {
    /// Starts `program args` in the Node folder (so `npx` and `import` find the pinned
    /// packages), in a process group of its own, its stdout and stderr written to files in
    /// `scratch` named after `label`.
    pub fn spawn<I, S>(&self, program: &str, args: I, scratch: &Path, label: &str) -> NodeRun
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        use std::os::unix::process::CommandExt;
        let stdout_path = scratch.join(format!("{label}-stdout.txt"));
        let stderr_path = scratch.join(format!("{label}-stderr.txt"));
        let child = Command::new(program)
            .args(args)
            .current_dir(&self.dir)
            .env("NO_COLOR", "1")
            .env("FORCE_COLOR", "0")
            .stdin(Stdio::null())
            .stdout(File::create(&stdout_path).expect("stdout file"))
            .stderr(File::create(&stderr_path).expect("stderr file"))
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {program} in {}: {e}", self.dir.display()));
        NodeRun {
            child: Some(child),
            label: label.to_owned(),
            stdout_path,
            stderr_path,
        }
    }

    /// The path of a file in the Node folder (a script of ours).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// The reference server the task and tool suites run behind the proxy.
pub const EVERYTHING: &str = "@modelcontextprotocol/server-everything";

/// Appends every chunk the backend reads on stdin to `$SWITCHBOARD_STDIN_RECORD`. It wraps
/// `emit` rather than adding a `data` listener, so that stdin is not put in flowing mode
/// before the SDK's transport listens.
const STDIN_RECORDER: &str = r#"
const fs = require("fs");
const path = process.env.SWITCHBOARD_STDIN_RECORD;
const emit = process.stdin.emit;
process.stdin.emit = function (event, chunk, ...rest) {
  if (event === "data") fs.appendFileSync(path, chunk);
  return emit.call(this, event, chunk, ...rest);
};
"#;

/// server-everything over stdio with what it reads recorded: the backend's command, the
/// environment variable (name, value) the proxy must pass it, and the record's path. The
/// record and its preload script live in `dir`.
pub fn recorded_everything(
    node: &Node,
    dir: &Path,
) -> (Vec<String>, (&'static str, String), PathBuf) {
    let preload = dir.join("record.cjs");
    fs::write(&preload, STDIN_RECORDER).expect("write the recorder");
    let record = dir.join("backend-stdin.jsonl");
    let script = node
        .dir
        .join("node_modules")
        .join(EVERYTHING)
        .join("dist/index.js");
    let command = vec![
        "node".to_owned(),
        "--require".to_owned(),
        preload.display().to_string(),
        script.display().to_string(),
        "stdio".to_owned(),
    ];
    let env = ("SWITCHBOARD_STDIN_RECORD", record.display().to_string());
    (command, env, record)
}

/// A running Node process; killed with its whole group if dropped while running.
pub struct NodeRun {
    child: Option<Child>,
    label: String,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
}

/// How a Node process ended.
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// stdout and stderr, for a failure message.
    pub fn transcript(&self) -> String {
        format!(
            "--- stdout ---\n{}\n--- stderr ---\n{}",
            self.stdout, self.stderr
        )
    }
}

impl NodeRun {
    /// Whether the process has exited.
    pub fn has_exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().ok().flatten().is_some(),
            None => true,
        }
    }

    /// Waits for the exit; past `timeout` the process group is killed and the test fails
    /// with what it printed.
    pub fn wait(mut self, timeout: Duration) -> Finished {
        let mut child = self.child.take().expect("waited once");
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait for the Node process") {
                break s;
            }
            if Instant::now() >= deadline {
                kill_group(&mut child);
                panic!(
                    "{} did not finish within {timeout:?}:\n{}",
                    self.label,
                    self.read(None).transcript()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.read(Some(status))
    }

    fn read(&self, status: Option<ExitStatus>) -> Finished {
        use std::os::unix::process::ExitStatusExt;
        Finished {
            status: status.unwrap_or_else(|| ExitStatus::from_raw(9)),
            stdout: fs::read_to_string(&self.stdout_path).unwrap_or_default(),
            stderr: fs::read_to_string(&self.stderr_path).unwrap_or_default(),
        }
    }
}

impl Drop for NodeRun {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&mut child);
        }
    }
}

/// SIGKILL to the child's process group (it leads one: `process_group(0)`), then reap it.
fn kill_group(child: &mut Child) {
    if child.try_wait().ok().flatten().is_none() {
        // SAFETY: kill(2) has no memory-safety preconditions; the child is unreaped (we
        // hold it), so its pid, which is also its group id, names no other process.
        unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    }
    let _ = child.wait();
}
