//! What the Redis test files share (`mod redis_server;` in each): a `redis-server` of the
//! test's own on a loopback port, the rule for a missing binary, and the tolerance of the
//! float algorithms' comparisons. Not a test target itself (a subdirectory of `tests/`).
#![allow(dead_code)] // each test file uses its own part of it

use hotlimit::Decision;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether every binary in `bins` is on the PATH. Without one the test prints why and passes,
/// unless `HOTLIMIT_REQUIRE_REDIS=1` (set by `.ci/run`), which makes that a failure.
pub fn installed(bins: &[&str], what: &str) -> bool {
    for bin in bins {
        if Command::new(bin)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_err()
        {
            let msg = format!(
                "{bin} not found on PATH: skipping the {what} test \
                 (install it: apt-get install redis-server)"
            );
            assert!(
                std::env::var("HOTLIMIT_REQUIRE_REDIS").as_deref() != Ok("1"),
                "{msg}, but HOTLIMIT_REQUIRE_REDIS=1"
            );
            eprintln!("SKIPPED: {msg}");
            return false;
        }
    }
    true
}

/// A free loopback port: Redis has no `--port 0`, so take one from the OS, release it, hand
/// it over. Never the same port twice in one test process: tests run in parallel, and a
/// server one test killed must not come back as another test's server on the same port (a
/// failover test once reconnected to a neighbour's fresh node and found its state gone).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // A cluster node also listens on port + 10000 (its bus): keep clear of those too.
        let clash = |p: u16| {
            given
                .iter()
                .any(|&g| g == p || g.checked_add(10_000) == Some(p))
        };
        if port <= 55_535 && !clash(port) && !clash(port + 10_000) {
            given.push(port);
            return port;
        }
    }
}

/// A `redis-server` of its own on 127.0.0.1 (no persistence), killed on drop.
pub struct Server {
    child: Child,
    pub port: u16,
}

impl Server {
    /// Starts `redis-server` on a free port; `None` (with a message) if it is not installed.
    pub fn start() -> Option<Server> {
        Self::start_on(None)
    }

    /// Starts `redis-server` on `port`, or on a free one.
    pub fn start_on(port: Option<u16>) -> Option<Server> {
        if !installed(&["redis-server"], "Redis backend") {
            return None;
        }
        let port = port.unwrap_or_else(free_port);
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let server = Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(server)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A plain connection of the test's own.
    pub fn raw(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// `-STOP` freezes the server (connections stay open, nothing is answered); `-CONT`.
    pub fn signal(&self, sig: &str) {
        // The shell's builtin `kill`: present even where procps is not.
        let ok = Command::new("sh")
            .args(["-c", &format!("kill {sig} {}", self.child.id())])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Continued first, so a test that failed while it was frozen leaves nothing stopped.
        let _ = Command::new("sh")
            .args(["-c", &format!("kill -CONT {}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// EARRRL's and exponential's decisions: allow/deny exactly; rates and `retry_after` to
/// within the last bits (Lua has no `log1p`/`expm1`, so states can differ by an ulp or so).
pub fn close(i: usize, m: &Decision, r: &Decision) {
    assert_eq!(
        m.is_allowed(),
        r.is_allowed(),
        "request {i}: {m:?} vs {r:?}"
    );
    let (a, b) = (m.rate().unwrap(), r.rate().unwrap());
    assert!(
        (a - b).abs() <= 1e-12 * a.abs().max(1e-300),
        "request {i}: rate {a} vs {b}"
    );
    let (a, b) = (m.retry_after_nanos(), r.retry_after_nanos());
    assert!(
        a.abs_diff(b) <= 1 + a / 1_000_000_000_000,
        "request {i}: retry_after {a} vs {b}"
    );
}
