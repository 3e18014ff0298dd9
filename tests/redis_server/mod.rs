//! What the Redis test files share (`mod redis_server;` in each): a `redis-server` of the
//! test's own on a loopback port (or the server `HOTLIMIT_REDIS_SERVER` names: `.ci/run`
//! runs the suites again against `valkey-server`), the rule for a missing binary, and the
//! tolerance of the float algorithms' comparisons. Not a test target itself (a subdirectory
//! of `tests/`).
#![allow(dead_code)] // each test file uses its own part of it

use hotlimit::Decision;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The server binary the tests start: `redis-server`, or the one `HOTLIMIT_REDIS_SERVER`
/// names (a path or a name on the PATH: `.ci/run` sets it to Valkey's `valkey-server`, which
/// speaks the same protocol and runs the same Lua).
pub fn server_bin() -> String {
    std::env::var("HOTLIMIT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

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

/// Spawns `redis-server` (configured by `args`) on `port` and waits until that very process
/// answers there (its `INFO` names its pid); `None` if it exited first. A port from
/// [`free_port`] is released before the server binds it, and another test's listener on port
/// 0 can be handed it in between: the server then exits on "address in use" while a connect to
/// the port still succeeds (CI once saw a test reach a neighbour's HTTP server, then nothing).
fn spawn_on(port: u16, args: impl FnOnce(&mut Command)) -> Option<Child> {
    let mut cmd = Command::new(server_bin());
    args(&mut cmd);
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn redis-server");
    let ours = format!("process_id:{}\r\n", child.id());
    let answers = || -> redis::RedisResult<bool> {
        let wait = Duration::from_millis(500);
        let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
            .get_connection_with_timeout(wait)?;
        con.set_read_timeout(Some(wait))?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut con)?;
        Ok(info.contains(&ours))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if child.try_wait().expect("redis-server status").is_some() {
            return None;
        }
        if answers().unwrap_or(false) {
            return Some(child);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("redis-server did not start on port {port}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`spawn_on`] a port from [`free_port`] (`args` configures the server for it), taking
/// another while the one handed over turns out taken.
fn spawn_on_free_port(args: impl Fn(&mut Command, u16)) -> (Child, u16) {
    (0..20)
        .find_map(|_| {
            let port = free_port();
            spawn_on(port, |cmd| args(cmd, port)).map(|child| (child, port))
        })
        .expect("no free port kept for redis-server")
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
        if !installed(&[&server_bin()], "Redis backend") {
            return None;
        }
        let args = |cmd: &mut Command, port: u16| {
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"]);
        };
        let (child, port) = match port {
            None => spawn_on_free_port(args),
            // A restart needs its own port back: wait for whoever holds it to let go.
            Some(port) => {
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    if let Some(child) = spawn_on(port, |cmd| args(cmd, port)) {
                        break (child, port);
                    }
                    assert!(Instant::now() < deadline, "port {port} stays taken");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        Some(Server { child, port })
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

/// A 3-node Redis Cluster of the test's own on 127.0.0.1 (free ports, a temp dir of its own, no
/// persistence), killed on drop.
pub struct Cluster {
    nodes: Vec<(Option<Child>, u16)>,
    dir: PathBuf,
}

impl Cluster {
    /// Starts three primaries and joins them into a cluster; `None` (with a message) if
    /// `redis-server` or `redis-cli` is not installed.
    pub fn start() -> Option<Cluster> {
        Self::start_with(0)
    }

    /// Three primaries with `replicas` replicas each.
    pub fn start_with(replicas: usize) -> Option<Cluster> {
        if !installed(&[&server_bin(), "redis-cli"], "Redis Cluster") {
            return None;
        }
        static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hotlimit-cluster-{}-{}",
            std::process::id(),
            RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cluster = Cluster {
            nodes: Vec::new(),
            dir,
        };
        for _ in 0..3 * (1 + replicas) {
            // A node listens on its port and on port + 10000 (the bus): if either is taken
            // before it binds, it exits, and the node goes to another pair.
            let dir = &cluster.dir;
            let (child, port) = spawn_on_free_port(|cmd, port| {
                cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                    // The live nodes keep serving their slots while one is down.
                    .args(["--cluster-require-full-coverage", "no"])
                    .arg("--cluster-config-file")
                    .arg(dir.join(format!("nodes-{port}.conf")))
                    .args(["--save", "", "--appendonly", "no", "--dir"])
                    .arg(dir)
                    // A replica's full sync goes through an RDB file: one name per node, or
                    // the replicas of different primaries load each other's (they share the
                    // dir).
                    .arg("--dbfilename")
                    .arg(format!("dump-{port}.rdb"));
            });
            cluster.nodes.push((Some(child), port));
        }
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(cluster.nodes.iter().map(|(_, p)| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for i in 0..cluster.nodes.len() {
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut cluster.raw(i))
                    .unwrap();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster not ok: {info}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Every replica through its first full sync: `cluster_state:ok` does not wait for it,
        // and a primary's `WAIT` counts only replicas whose link is up.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let synced = (0..cluster.nodes.len())
                .filter(|&i| {
                    redis::cmd("INFO")
                        .arg("replication")
                        .query::<String>(&mut cluster.raw(i))
                        .unwrap()
                        .contains("master_link_status:up")
                })
                .count();
            if synced == 3 * replicas {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{synced} of {} replicas in sync",
                3 * replicas
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(cluster)
    }

    pub fn url(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}/", self.nodes[i].1)
    }

    /// A plain (non-cluster) connection to node `i`.
    pub fn raw(&self, i: usize) -> redis::Connection {
        redis::Client::open(self.url(i))
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// The node that serves `redis_key`'s slot.
    pub fn node_of(&self, redis_key: &str) -> usize {
        let live = self.nodes.iter().position(|n| n.0.is_some()).unwrap();
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(redis_key)
            .query(&mut self.raw(live))
            .unwrap();
        let slots: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut self.raw(live))
            .unwrap();
        let redis::Value::Array(ranges) = slots else {
            panic!("CLUSTER SLOTS: {slots:?}")
        };
        for r in ranges {
            let redis::Value::Array(r) = r else { panic!() };
            let (lo, hi) = match (&r[0], &r[1]) {
                (redis::Value::Int(lo), redis::Value::Int(hi)) => (*lo, *hi),
                x => panic!("{x:?}"),
            };
            if (lo..=hi).contains(&slot) {
                let redis::Value::Array(primary) = &r[2] else {
                    panic!()
                };
                let port = match &primary[1] {
                    redis::Value::Int(p) => *p as u16,
                    x => panic!("{x:?}"),
                };
                return self.nodes.iter().position(|n| n.1 == port).unwrap();
            }
        }
        panic!("slot {slot} not served")
    }

    pub fn dbsize(&self, i: usize) -> i64 {
        redis::cmd("DBSIZE").query(&mut self.raw(i)).unwrap()
    }

    pub fn script_flush_all(&self) {
        for i in 0..self.nodes.len() {
            redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query::<()>(&mut self.raw(i))
                .unwrap();
        }
    }

    /// SIGKILL node `i` and reap it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
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
    let (a, b) = (
        m.retry_after().as_nanos() as u64,
        r.retry_after().as_nanos() as u64,
    );
    assert!(
        a.abs_diff(b) <= 1 + a / 1_000_000_000_000,
        "request {i}: retry_after {a} vs {b}"
    );
}

/// Runs `test`, an ignored test of this test binary, as a child process with `env`; waits
/// until it prints `HELD` (it took what it holds, see [`hold_until_killed`]), then kills it
/// (SIGKILL: no drop, no last write) and reaps it.
pub fn killed_once_held(test: &str, env: &[(&str, String)]) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--ignored", "--nocapture"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.unwrap().contains("HELD")),
        "the child {test} took nothing"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The child's side of [`killed_once_held`]: says it holds `held`, and waits to be killed,
/// never giving it back.
pub fn hold_until_killed<T>(held: T) -> ! {
    println!("HELD");
    std::mem::forget(held);
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}
