//! Several instances behind a real nginx running the committed recipe
//! (`tests/nginx/switchboard.conf` and `switchboard-locations.conf`, included verbatim by a
//! generated top-level config that supplies only the ports), as `tests/tests/nginx.rs` and
//! `tests/tests/resume.rs` run them (SPEC section 8).
//!
//! nginx runs as an ordinary process (`nginx -p PREFIX -c CONF -g 'daemon off;'`) on
//! loopback ports with every path inside its prefix. Without nginx, [`Cluster::start`] skips
//! loudly (`None`), except under `CI=true`, where it fails (`tests/run.sh` installs it).

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::mcp::{self, Answer, McpSession};
use crate::{workspace_root, Body, Proxy, Target, TempDir, WAIT};

/// The public name clients use; the instances allow it (`--allow-host`) and put it in
/// their endpoint URLs (`--public-url`), and nginx must pass it through.
pub const PUBLIC_HOST: &str = "mcp.example.test";
pub const ALLOWED_ORIGIN: &str = "https://app.example.test";
pub const NAMES: [&str; 3] = ["a", "b", "c"];

// ---------------------------------------------------------------------------------------
// nginx as a plain process
// ---------------------------------------------------------------------------------------

/// `$SWITCHBOARD_NGINX`, else `nginx` on `PATH` or in the sbin directories Debian uses.
pub fn nginx_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SWITCHBOARD_NGINX") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join("nginx"))
        .find(|p| p.is_file())
}

/// The binary, or `None` after a loud skip message; under `CI=true` a missing nginx fails.
pub fn nginx_or_skip(test: &str) -> Option<PathBuf> {
    let found = nginx_binary();
    if found.is_none() {
        let msg = "nginx is not installed: `tests/run.sh` installs it (apt-get install nginx), or set SWITCHBOARD_NGINX";
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{msg}");
        }
        // Past the harness's capture (which takes `eprintln!`), in one write.
        let text = format!("\n**********\nSKIPPED: {test}: {msg}\n**********\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr(), text.as_bytes());
    }
    found
}

/// A running nginx in its own prefix directory; dropping it stops it.
pub struct Nginx {
    child: Child,
    /// Where clients connect.
    pub addr: SocketAddr,
    dir: TempDir,
}

impl Nginx {
    /// Starts nginx in front of `instances` (name, address) with the committed recipe.
    pub fn start(binary: &PathBuf, instances: &[(&str, SocketAddr)]) -> Nginx {
        let recipe = workspace_root().join("tests/nginx");
        let dir = TempDir::new("nginx");
        let prefix = dir.path().to_path_buf();
        let mut last = String::new();
        for _attempt in 0..5 {
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let conf = top_level_config(&prefix, &recipe, addr, instances);
            let conf_path = prefix.join("nginx.conf");
            fs::write(&conf_path, conf).expect("write nginx.conf");
            let log = fs::File::create(prefix.join("stderr.log")).expect("nginx stderr log");
            let mut child = Command::new(binary)
                .arg("-p")
                .arg(&prefix)
                .arg("-c")
                .arg(&conf_path)
                .arg("-e")
                .arg(prefix.join("error.log"))
                .args(["-g", "daemon off;"])
                .stdin(Stdio::null())
                .stdout(Stdio::from(log.try_clone().expect("dup log")))
                .stderr(Stdio::from(log))
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
            let deadline = Instant::now() + WAIT;
            loop {
                if let Some(status) = child.try_wait().ok().flatten() {
                    last = format!(
                        "nginx exited: {status}\n{}\n{}",
                        fs::read_to_string(prefix.join("stderr.log")).unwrap_or_default(),
                        fs::read_to_string(prefix.join("error.log")).unwrap_or_default()
                    );
                    break;
                }
                let health = crate::http::request(addr, "GET", "/health", &[], Body::None, WAIT);
                if matches!(&health, Ok(r) if r.status == 200) {
                    return Nginx { child, addr, dir };
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    last = format!("nginx did not answer /health with 200: {health:?}");
                    break;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            if !last.contains("in use") {
                break;
            }
        }
        panic!("nginx did not start: {last}");
    }

    pub fn error_log(&self) -> String {
        fs::read_to_string(self.dir.file("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own unreaped
        // child. SIGTERM is nginx's fast shutdown.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(3);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.error_log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!(
                "--- nginx error.log (last {}) ---\n{}\n---",
                tail.len(),
                tail.join("\n")
            );
        }
    }
}

/// The deployment-specific part, as `tests/nginx/README.md` shows it: the upstreams (every
/// instance, and each by its name) and the server's address. Everything else is the recipe,
/// included.
fn top_level_config(
    prefix: &std::path::Path,
    recipe: &std::path::Path,
    listen: SocketAddr,
    instances: &[(&str, SocketAddr)],
) -> String {
    let p = prefix.display();
    let all: String = instances
        .iter()
        .map(|(_, addr)| format!("        server {addr};\n"))
        .collect();
    let each: String = instances
        .iter()
        .map(|(name, addr)| {
            format!("    upstream switchboard_{name} {{\n        server {addr};\n        keepalive 16;\n    }}\n")
        })
        .collect();
    format!(
        r#"worker_processes 1;
pid {p}/nginx.pid;
error_log {p}/error.log info;
events {{
    worker_connections 1024;
}}
http {{
    access_log {p}/access.log;
    client_body_temp_path {p}/client_body_temp;
    proxy_temp_path {p}/proxy_temp;
    fastcgi_temp_path {p}/fastcgi_temp;
    uwsgi_temp_path {p}/uwsgi_temp;
    scgi_temp_path {p}/scgi_temp;

    include {recipe}/switchboard.conf;

    upstream switchboard {{
{all}        keepalive 16;
    }}
{each}
    server {{
        listen {listen};
        include {recipe}/switchboard-locations.conf;
    }}
}}
"#,
        recipe = recipe.display(),
    )
}

// ---------------------------------------------------------------------------------------
// The cluster: three instances and nginx
// ---------------------------------------------------------------------------------------

pub struct Cluster {
    /// `a`, `b`, `c`, in that order.
    pub instances: Vec<Proxy>,
    pub nginx: Nginx,
}

impl Cluster {
    /// Three instances of `target` running `backend` (each recording what its backend
    /// receives, [`Proxy::recorded`]) that accept `tokens`, and nginx in front of them;
    /// `None` when nginx is missing (after a skip message).
    pub fn start(
        target: Target,
        test: &str,
        backend: &str,
        tokens: &[(&str, &str)],
    ) -> Option<Cluster> {
        let binary = nginx_or_skip(test)?;
        let instances: Vec<Proxy> = NAMES
            .iter()
            .map(|name| {
                Proxy::builder(target)
                    .args(["--instance", name])
                    .args(["--allow-host", PUBLIC_HOST])
                    .args(["--public-url", &format!("http://{PUBLIC_HOST}")])
                    .args(["--allow-origin", ALLOWED_ORIGIN])
                    .tokens(tokens)
                    .backend([backend])
                    .record()
                    .start()
            })
            .collect();
        let upstreams: Vec<(&str, SocketAddr)> = NAMES
            .iter()
            .zip(&instances)
            .map(|(name, p)| (*name, p.addr))
            .collect();
        let nginx = Nginx::start(&binary, &upstreams);
        Some(Cluster { instances, nginx })
    }

    pub fn instance(&self, name: &str) -> &Proxy {
        let i = NAMES.iter().position(|n| *n == name).expect("a, b or c");
        &self.instances[i]
    }
}

/// The instance a session id names (`a`, `b` or `c`).
pub fn instance_of(sid: &str) -> &str {
    let (name, uuid) = sid
        .split_once('.')
        .unwrap_or_else(|| panic!("session id {sid:?} names no instance"));
    assert_eq!(uuid.len(), 36, "{sid:?}: the uuid part");
    assert!(
        NAMES.contains(&name),
        "{sid:?} names an instance that does not run"
    );
    name
}

/// A Streamable session started at `addr` with the public Host header; `None` when the
/// initialize is answered `status` instead (a refusal, e.g. 503 while no instance is up).
pub fn try_start_mcp(addr: SocketAddr, token: &str) -> Result<McpSession, u16> {
    let auth = format!("Bearer {token}");
    let headers = [("Authorization", auth.as_str()), ("Host", PUBLIC_HOST)];
    let answer = mcp::post(addr, "/mcp", &headers, &mcp::initialize_body(1));
    if answer.status() != 200 {
        return Err(answer.status());
    }
    let sid = match &answer {
        Answer::Whole(r) => r.header("mcp-session-id").map(str::to_owned),
        Answer::Stream(e) => e.head.header("mcp-session-id").map(str::to_owned),
    }
    .expect("the initialize answer carries Mcp-Session-Id");
    let (_, response) = answer.response();
    let session = McpSession {
        addr,
        sid,
        token: Some(token.to_owned()),
        path: "/mcp".to_owned(),
        initialize_result: response["result"].clone(),
    };
    assert!(
        session.initialize_result.is_object(),
        "initialize: {response}"
    );
    let r = session.post_with(
        &[("Host", PUBLIC_HOST)],
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(r.status(), 202);
    Ok(session)
}

pub fn start_mcp(addr: SocketAddr, token: &str) -> McpSession {
    try_start_mcp(addr, token).unwrap_or_else(|status| panic!("initialize on /mcp: {status}"))
}
