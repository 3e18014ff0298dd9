//! The JSON API from another language: `clients/python_client.py` (Python's standard library
//! only) runs its checks against a real `hotlimit-server` on loopback: check, check_n, peek,
//! take and settle (a refund and a debt), the errors, envoyproxy/ratelimit's `/json`.

mod common;

use std::process::Command;

use common::{installed, server, Scratch};

const RULES: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 5
  - key: model
    rate_limit:
      unit: day
      requests_per_unit: 10
      algorithm: gcra
"#;

// Pins G67.
#[test]
fn a_python_client_checks_takes_and_settles() {
    if !installed("python3", "HOTLIMIT_REQUIRE_PYTHON", "install python3") {
        return;
    }
    let dir = Scratch::new("json");
    let config = dir.write("api.yaml", RULES);
    let srv = server(&config, &[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/python_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("http://127.0.0.1:{}", srv.http))
        .output()
        .expect("run python3");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Python client failed:\n{text}");
    // Every check ran (the script stops at the first failure).
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok ")).count(),
        23,
        "{text}"
    );
}
