//! The command line as a user meets it, on both binaries: `--version`, `--help`, typed
//! refusals of absurd values (exit status 2, the flag named), `--host`/`--port` beside
//! `--listen`, a backend command that cannot start, and the Host check falling back to the
//! request target's authority.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use switchboard_tests::{suite, Proxy, Target, WAIT};

const BACKEND: &str = env!("CARGO_BIN_EXE_test-backend");

/// Runs the binary with `args` to completion (it must exit on its own within `WAIT`).
fn run_to_exit(target: Target, args: &[&str]) -> Output {
    let mut child = Command::new(target.binary())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the binary");
    let deadline = Instant::now() + WAIT;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{args:?} did not exit within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn version_and_help(target: Target) {
    let out = run_to_exit(target, &["--version"]);
    assert!(out.status.success(), "--version: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        format!("{} {}", target.bin_name(), env!("CARGO_PKG_VERSION")),
        "--version prints the binary's name and version"
    );
    let out = run_to_exit(target, &["--help"]);
    assert!(out.status.success(), "--help: {out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--host",
        "--port",
        "--listen",
        "--keepalive",
        "--ping-interval",
        "--max-sessions",
        "--backend-window",
        "--config",
    ] {
        assert!(
            help.contains(flag),
            "--help does not explain {flag}:\n{help}"
        );
    }
    // One help text for both binaries, written once in the core.
    assert!(
        help.contains("Most live sessions, both transports together"),
        "--max-sessions has a binary's own help text:\n{help}"
    );
}

fn absurd_values_are_refused_naming_the_flag(target: Target) {
    for (args, flag) in [
        (&["--ping-interval", "0"][..], "--ping-interval"),
        (&["--keepalive", "0"][..], "--keepalive"),
        (&["--ping-timeout", "0ms"][..], "--ping-timeout"),
        (&["--grace", "0s"][..], "--grace"),
        (&["--keepalive", "3000h"][..], "--keepalive"),
        (&["--max-body", "0"][..], "--max-body"),
        (&["--session-buffer", "10"][..], "--session-buffer"),
        (&["--max-sessions", "0"][..], "--max-sessions"),
        (&["--port", "70000"][..], "--port"),
        (&["--listen", "127.0.0.1:1", "--port", "2"][..], "--listen"),
        (&["--ping-interval", "1.5s"][..], "--ping-interval"),
        (&["--instance", "Eu"][..], "--instance"),
        (&["--instance", ""][..], "--instance"),
        (&["--instance", "a.b"][..], "--instance"),
        (&["--instance", &"a".repeat(33)][..], "--instance"),
        (&["--tool-scope", "get_time=time:read"][..], "--tool-scope"),
        (&["--tool-scope", "get_time"][..], "--tool-scope"),
        // Keys beside several issuers must say whose tokens they verify (issue 30.1).
        (
            &[
                "--oauth-issuer",
                "https://a.example",
                "--oauth-issuer",
                "https://b.example",
                "--jwt-jwks",
                "keys.json",
            ][..],
            "--jwt-issuer",
        ),
        (
            &["--tool-rate-limit", "get_time=3/fortnight"][..],
            "--tool-rate-limit",
        ),
    ] {
        let out = run_to_exit(target, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?} must be refused with status 2; stderr:\n{stderr}"
        );
        assert!(
            stderr.contains(flag),
            "the refusal of {args:?} does not name {flag}:\n{stderr}"
        );
    }
}

/// A policy file that fails validation stops the proxy before it listens, with a message
/// naming the file and what is wrong (SPEC section 10).
fn bad_policy_files_stop_the_proxy(target: Target) {
    let dir = switchboard_tests::TempDir::new("cli-policy");
    let file = |name: &str, text: &str| {
        let path = dir.file(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    };
    let cases = [
        (
            dir.file("missing.json").display().to_string(),
            "cannot read",
        ),
        (file("syntax.json", "{\"version\": "), "not a valid JSON"),
        (
            file("type.yaml", "version: '1.0'\ntype: opa\n"),
            "unknown type",
        ),
        (
            file(
                "policy.yaml",
                "version: '1.0'\ntype: cedarv1\ncedar:\n  policies: ['permit(principal,']\n",
            ),
            "policy 0",
        ),
        (
            file(
                "entities.json",
                r#"{"version":"1.0","type":"cedarv1","cedar":{"policies":["permit(principal,action,resource);"],"entities_json":"[{"}}"#,
            ),
            "entities_json",
        ),
    ];
    for (path, why) in cases {
        let out = run_to_exit(target, &["--port", "0", "--authz-config", &path]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{path}: {stderr}");
        assert!(stderr.contains("--authz-config"), "{path}: {stderr}");
        assert!(stderr.contains(&path), "{path}: {stderr}");
        assert!(stderr.contains(why), "{path} ({why}): {stderr}");
    }
}

/// A config file that fails at start stops the proxy (exit status 2) with a message naming
/// the file and what is wrong: missing, not TOML, an unknown key, a bad value, a tokens file
/// (relative to the config file) that does not parse.
fn a_bad_config_file_is_refused_naming_it(target: Target) {
    let dir = switchboard_tests::TempDir::new("cli-config");
    std::fs::write(dir.file("tokens.txt"), "alice short\n").expect("write tokens");
    for (text, says) in [
        (None, "cannot read it"),
        (Some("port = \n"), "not TOML (line 1)"),
        (
            Some("no-such-flag = 1\n"),
            "key `no-such-flag`: unknown key",
        ),
        (Some("rate-limit = \"lots\"\n"), "key `rate-limit`"),
        (Some("max-sessions = true\n"), "key `max-sessions`"),
    ] {
        let file = dir.file("switchboard.toml");
        let _ = std::fs::remove_file(&file);
        if let Some(text) = text {
            std::fs::write(&file, text).expect("write the config file");
        }
        let path = file.display().to_string();
        let out = run_to_exit(target, &["--config", &path]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text:?}: {stderr}");
        assert!(stderr.contains(&format!("--config {path}: ")), "{stderr}");
        assert!(stderr.contains(says), "{text:?}: {stderr}");
    }
    let file = dir.file("switchboard.toml");
    std::fs::write(&file, "auth-tokens = \"tokens.txt\"\n").expect("write the config file");
    let out = run_to_exit(target, &["--config", &file.display().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    let tokens = dir.file("tokens.txt").display().to_string();
    assert!(stderr.contains(&tokens), "{stderr}");
}

fn host_and_port_flags(target: Target) {
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut child = Command::new(target.binary())
        .args([
            "--host",
            "localhost",
            "--port",
            &port.to_string(),
            "--",
            BACKEND,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the binary");
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + WAIT;
    let healthy = loop {
        match switchboard_tests::http::request(
            addr,
            "GET",
            "/health",
            &[],
            switchboard_tests::Body::None,
            WAIT,
        ) {
            Ok(r) if r.status == 200 => break true,
            _ if Instant::now() > deadline => break false,
            _ => std::thread::sleep(Duration::from_millis(25)),
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        healthy,
        "--host localhost --port {port} did not serve /health"
    );
}

fn backend_that_cannot_start_exits_1(target: Target) {
    let out = run_to_exit(
        target,
        &["--listen", "127.0.0.1:0", "--", "/nonexistent/mcp-server"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.contains("cannot start backend") && stderr.contains("/nonexistent/mcp-server"),
        "the log does not say which command failed:\n{stderr}"
    );
}

/// A request in absolute form without a Host header is checked against its target's
/// authority, on both binaries.
fn host_check_falls_back_to_the_target_authority(target: Target) {
    let p = Proxy::builder(target).backend([BACKEND]).start();
    let status = |authority: &str| {
        let mut s = TcpStream::connect(p.addr).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        write!(
            s,
            "GET http://{authority}/metrics HTTP/1.1\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let mut head = [0u8; 12];
        s.read_exact(&mut head).expect("a status line");
        String::from_utf8_lossy(&head[9..12]).into_owned()
    };
    // /metrics is not Host-checked; /sse is.
    let sse_status = |authority: &str| {
        let mut s = TcpStream::connect(p.addr).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        write!(
            s,
            "GET http://{authority}/sse HTTP/1.1\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let mut head = [0u8; 12];
        s.read_exact(&mut head).expect("a status line");
        String::from_utf8_lossy(&head[9..12]).into_owned()
    };
    assert_eq!(status(&p.addr.to_string()), "200");
    assert_eq!(
        sse_status(&p.addr.to_string()),
        "200",
        "a loopback authority passes"
    );
    assert_eq!(
        sse_status("evil.example"),
        "403",
        "a foreign authority is refused"
    );
}

/// Issue 30.9: plain http is allowed for key sets only to a loopback host, read from the
/// URL's real host: user information before it (`127.0.0.1@host`) or a name that merely
/// starts with `127.` stops the proxy at start, naming the flag and why.
fn key_set_urls_that_only_look_loopback_are_refused(target: Target) {
    for (flag, url, why) in [
        (
            "--jwt-jwks-url",
            "http://127.0.0.1@keys.example/jwks",
            "user information",
        ),
        (
            "--oauth-issuer",
            "http://127.0.0.1:9@idp.example",
            "user information",
        ),
        ("--jwt-jwks-url", "http://127.keys.example/jwks", "loopback"),
        ("--oauth-issuer", "http://localhost.idp.example", "loopback"),
    ] {
        let out = run_to_exit(target, &["--port", "0", flag, url]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {url}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(url) && stderr.contains(why),
            "{flag} {url} ({why}): {stderr}"
        );
    }
}

/// Issue 30.11: a policy beside tokens of several issuers is told once at start that Cedar
/// sees `Client::"<sub>"` whatever the issuer, and how to tell issuers apart.
fn a_policy_beside_several_issuers_warns_once(target: Target) {
    let dir = switchboard_tests::TempDir::new("cli-issuers");
    let policy = dir.file("policy.yaml");
    std::fs::write(
        &policy,
        "version: '1.0'\ntype: cedarv1\ncedar:\n  policies: ['permit(principal,action,resource);']\n",
    )
    .expect("write");
    let policy = policy.display().to_string();
    // Issuers on loopback ports nobody answers: the proxy starts without keys.
    let p = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--authz-config", &policy])
        .args(["--oauth-issuer", "http://127.0.0.1:9/a"])
        .args(["--oauth-issuer", "http://127.0.0.1:9/b"])
        .no_health_wait()
        .start();
    assert!(p.wait_log("listening on", WAIT), "{}", p.log());
    assert!(p.wait_log("claim_iss", WAIT), "{}", p.log());
    let log = p.log();
    let line = log
        .lines()
        .find(|l| l.contains("claim_iss"))
        .unwrap_or_default();
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("Client::\"<sub>\""), "{line}");
    assert!(
        line.contains("http://127.0.0.1:9/a, http://127.0.0.1:9/b"),
        "{line}"
    );
    let lines = log.lines().filter(|l| l.contains("claim_iss")).count();
    assert_eq!(lines, 1, "{log}");
    // One issuer: nothing to tell.
    let one = Proxy::builder(target)
        .backend([BACKEND])
        .args(["--authz-config", &policy])
        .args(["--oauth-issuer", "http://127.0.0.1:9/a"])
        .no_health_wait()
        .start();
    assert!(one.wait_log("listening on", WAIT), "{}", one.log());
    assert!(!one.log().contains("claim_iss"), "{}", one.log());
}

suite!(
    key_set_urls_that_only_look_loopback_are_refused,
    a_policy_beside_several_issuers_warns_once,
    version_and_help,
    absurd_values_are_refused_naming_the_flag,
    bad_policy_files_stop_the_proxy,
    a_bad_config_file_is_refused_naming_it,
    host_and_port_flags,
    backend_that_cannot_start_exits_1,
    host_check_falls_back_to_the_target_authority,
);
