//! The official Python MCP SDK, as the end-to-end suites run it: the venv `tests/run.sh`
//! makes (`SWITCHBOARD_PYTHON`), `mcp-server-time` beside it, and the scripts under
//! `tests/python/`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{workspace_root, Proxy};

/// The Python to run the SDK with, or `None` (after saying why) when the test must skip.
pub fn python() -> Option<PathBuf> {
    let why = match std::env::var_os("SWITCHBOARD_PYTHON") {
        None => "SWITCHBOARD_PYTHON is not set (run tests/run.sh)".to_owned(),
        Some(p) => {
            let p = PathBuf::from(p);
            let probe = Command::new(&p)
                .args(["-c", "import mcp.client.sse, mcp.client.streamable_http"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output();
            match probe {
                Ok(o) if o.status.success() => return Some(p),
                Ok(o) => format!(
                    "{} cannot import the mcp package: {}",
                    p.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                Err(e) => format!("cannot run SWITCHBOARD_PYTHON={}: {e}", p.display()),
            }
        }
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("Python SDK interop cannot run in CI: {why}");
    }
    // Straight to the stream, past the test harness's capture, so a skip is never silent.
    let msg = format!("\n**********\nSKIPPED: Python SDK interop test: {why}\n**********\n");
    let _ = std::io::stderr().write_all(msg.as_bytes());
    None
}

/// `mcp-server-time` installed beside the Python (a venv's `bin/`).
pub fn mcp_server_time(python: &Path) -> PathBuf {
    let exe = python
        .parent()
        .map(|d| d.join("mcp-server-time"))
        .filter(|p| p.is_file());
    match exe {
        Some(p) => p,
        None => panic!(
            "mcp-server-time is not installed beside {} (pip install mcp-server-time)",
            python.display()
        ),
    }
}

/// Runs `tests/python/SCRIPT ARGS...` against `proxy` (waiting at most 150 s) and returns
/// the one JSON line it prints; fails with its stderr when it fails.
pub fn run_script(python: &Path, proxy: &Proxy, script: &str, args: &[String]) -> Value {
    const LIMIT: Duration = Duration::from_secs(150);
    let path = workspace_root().join("tests/python").join(script);
    let out_path = proxy.dir().file(&format!("{script}-stdout.txt"));
    let err_path = proxy.dir().file(&format!("{script}-stderr.txt"));
    let mut child = Command::new(python)
        .arg(&path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the SDK client") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{script} did not finish within {LIMIT:?}:\n{}\n--- proxy log ---\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default(),
                proxy.log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(
        status.success(),
        "{script} failed ({status}):\n{stderr}\n--- stdout ---\n{stdout}\n--- proxy log ---\n{}",
        proxy.log()
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{script} output is not JSON ({e}): {stdout:?}\n{stderr}"))
}
