//! Simulates clients against hotlimit's algorithms on a manual clock and shows how each
//! algorithm treats them: a summary table on stdout, a CSV per run, and a chart (PNG and SVG).
//!
//! # Usage
//!
//! ```text
//! cargo run --release --example simulate -- <tracking|abuser|mixed|all> [--out DIR]
//! ```
//!
//! Files go to `DIR/<scenario>/` (default `DIR`: `target/simulate` in this crate): one
//! `<run>.csv` per algorithm run (`time_s,client,allowed,rate_per_s,retry_after_s`, one line
//! per request), for "tracking" also `<run>-estimates.csv` (the estimate read every 0.25 s),
//! and `<scenario>.png` and `<scenario>.svg`. The paths are printed at the end.
//!
//! # Scenarios
//!
//! * `tracking`: EARRRL with half-life 10 s and 1 s (limit 1000/s: nothing is denied).
//!   Clients at 10, 1 and 0.1 requests/s, periodic and Poisson, send from 50 s to 200 s; the
//!   chart plots each estimate against the true rate over 0–300 s. The table gives the time
//!   to reach 90% of the true rate and the mean relative error in steady state (125–200 s).
//! * `abuser`: limit 1 request/s. One client sends every 600 ms (1.67/s) until 150 s, then
//!   exactly every 1 s until 300 s. Fixed window (60 per 60 s), GCRA (1/s, burst 60), sliding
//!   window counter (60 per 60 s) and EARRRL (1/s, half-life 10 s, strict); the chart plots
//!   cumulative attempted vs allowed, and each algorithm's decisions over time. The table
//!   says when each lets the client through again once it complies.
//! * `mixed`: limit 1 request/s per client, 300 s, every algorithm. 40 polite clients send
//!   Poisson at 0.5/s, 10 polite ones load a page (20 requests at once) once a minute; 3
//!   abusers send Poisson at 5/s, 2 send 100 at once every 20 s. The tables and chart give
//!   each group's denial (polite) or admission (abusers) rate.
//!
//! The scenarios, runs and numbers come from `engine.rs` (no plotting there), which
//! `tests/simulate.rs` also runs and asserts on.

mod charts;
use charts::render;
mod engine;

use clap::{Parser, ValueEnum};
use engine::{abuser, mixed, secs, tracking, Run, Scenario, SECOND};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::error::Error;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Chart text is drawn with this font (DejaVu Sans, see `DejaVuSans-LICENSE.txt`): bundled,
/// so that drawing needs no system font library.
const FONT: &[u8] = include_bytes!("DejaVuSans.ttf");
/// The family name the charts ask for.
const SANS: &str = "sans-serif";

/// Okabe–Ito colours: distinguishable with the common colour-vision deficiencies.
const ORANGE: RGBColor = RGBColor(230, 159, 0);
const SKY: RGBColor = RGBColor(86, 180, 233);
const GREEN_: RGBColor = RGBColor(0, 158, 115);
const BLUE_: RGBColor = RGBColor(0, 114, 178);
const VERMILLION: RGBColor = RGBColor(213, 94, 0);
const PURPLE: RGBColor = RGBColor(204, 121, 167);
const GREY: RGBColor = RGBColor(120, 120, 120);

/// Any failure: a drawing or I/O error, with the path it concerns.
type Res<T = ()> = Result<T, Box<dyn Error>>;

/// The scenario(s) to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Which {
    /// EARRRL's estimated rate against the true rate, half-life 10 s and 1 s.
    Tracking,
    /// A client over the limit until 150 s, then compliant: when is it let back in?
    Abuser,
    /// Many polite clients and a few abusers: who gets denied?
    Mixed,
    /// Every scenario.
    All,
}

/// Simulates clients against hotlimit's algorithms and writes CSV files and charts.
#[derive(Debug, Parser)]
#[command(name = "simulate")]
struct Args {
    /// The scenario to run.
    #[arg(value_enum)]
    scenario: Which,
    /// Output directory; each scenario writes into DIR/<scenario>/.
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/target/simulate"))]
    out: PathBuf,
}

/// Exit status 1 (and a message on stderr) on any failure.
fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("simulate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the chosen scenarios, printing each one's summary and the files it wrote.
fn run(args: &Args) -> Res {
    plotters::style::register_font(SANS, FontStyle::Normal, FONT)
        .map_err(|_| "the bundled font is not a valid TrueType font")?;
    let which = match args.scenario {
        Which::All => vec![Which::Tracking, Which::Abuser, Which::Mixed],
        one => vec![one],
    };
    for (i, w) in which.into_iter().enumerate() {
        if i > 0 {
            println!();
        }
        let written = match w {
            Which::Tracking => run_tracking(&args.out)?,
            Which::Abuser => run_abuser(&args.out)?,
            Which::Mixed => run_mixed(&args.out)?,
            Which::All => unreachable!("expanded above"),
        };
        println!();
        for path in written {
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Scenarios: table, CSV files, charts.

/// "tracking": table, CSV files (decisions and estimates), chart.
fn run_tracking(out: &Path) -> Res<Vec<PathBuf>> {
    let report = tracking::report();
    let s = &report.scenario;
    println!(
        "tracking: EARRRL's estimate of each client's rate (limit {}/s: nothing denied)",
        tracking::MAX_RATE
    );
    println!(
        "clients send from {} s to {} s; the estimate is read every 0.25 s; steady state is {} s to {} s",
        tracking::START,
        tracking::STOP,
        tracking::STEADY_FROM,
        tracking::STOP
    );
    let mut table = Table::new(&[
        "run",
        "client",
        "attempted",
        "allowed",
        "denied",
        "90% after",
        "steady error",
        "steady range (/s)",
    ]);
    for (run, stats) in report.runs.iter().zip(&report.stats) {
        let totals = run.per_client(s.clients.len());
        for (st, t) in stats.iter().zip(&totals) {
            table.row(vec![
                run.name.clone(),
                s.clients[st.client as usize].name.clone(),
                t.attempted.to_string(),
                t.allowed.to_string(),
                t.denied().to_string(),
                st.rise.map_or("never".into(), |r| format!("{r:.2} s")),
                format!("{:.1}%", 100.0 * st.steady_error),
                format!("{:.3} – {:.3}", st.steady_range.0, st.steady_range.1),
            ]);
        }
    }
    table.print();
    let dir = prepare(out, s)?;
    let mut written = Vec::new();
    for run in &report.runs {
        written.push(write_records(&dir, s, run)?);
        written.push(write_estimates(&dir, s, run)?);
    }
    written.extend(render(&dir, "tracking", (1500, 900), &report)?);
    Ok(written)
}

/// "abuser": table, CSV files, chart.
fn run_abuser(out: &Path) -> Res<Vec<PathBuf>> {
    let report = abuser::report();
    let s = &report.scenario;
    println!(
        "abuser: limit 1 request/s; one client sends every {} ms until {} s, then every {} ms until {} s",
        abuser::ABUSE_PERIOD / 1_000_000,
        abuser::COMPLY_AT,
        abuser::COMPLY_PERIOD / 1_000_000,
        abuser::END
    );
    let mut table = Table::new(&[
        "run",
        "algorithm",
        "attempted",
        "allowed",
        "denied",
        "allowed < 150 s",
        "allowed ≥ 150 s",
        "allowed per 60 s window",
        "back at",
        "denied ≥ 150 s at",
        "steady from",
    ]);
    for (run, st) in report.runs.iter().zip(&report.stats) {
        let all = run.totals(|_| true);
        table.row(vec![
            run.name.clone(),
            run.label.clone(),
            all.attempted.to_string(),
            all.allowed.to_string(),
            all.denied().to_string(),
            format!("{}/{}", st.abuse.allowed, st.abuse.attempted),
            format!("{}/{}", st.comply.allowed, st.comply.attempted),
            st.per_window
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            time_or_never(st.first_allowed),
            spans(&st.denied_complying, abuser::COMPLY_PERIOD),
            time_or_never(st.steady_from),
        ]);
    }
    table.print();
    println!("back at: the first request allowed at or after 150 s; steady from: every request from then on is allowed");
    let dir = prepare(out, s)?;
    let mut written = Vec::new();
    for run in &report.runs {
        written.push(write_records(&dir, s, run)?);
    }
    written.extend(render(&dir, "abuser", (1200, 900), &report)?);
    Ok(written)
}

/// "mixed": tables (per group, then polite vs abusers), CSV files, chart.
fn run_mixed(out: &Path) -> Res<Vec<PathBuf>> {
    let report = mixed::report();
    let s = &report.scenario;
    println!(
        "mixed: limit 1 request/s per client, {} s; clients by group:",
        mixed::END
    );
    for g in mixed::GROUPS {
        println!("  {:>2} × {}", g.clients, g.label);
    }
    let mut table = Table::new(&[
        "run",
        "algorithm",
        "group",
        "attempted",
        "allowed",
        "denied",
        "denied %",
        "clients denied",
    ]);
    for (run, st) in report.runs.iter().zip(&report.stats) {
        for (g, (t, denied)) in mixed::GROUPS
            .iter()
            .zip(st.groups.iter().zip(st.clients_denied))
        {
            table.row(vec![
                run.name.clone(),
                run.label.clone(),
                g.label.into(),
                t.attempted.to_string(),
                t.allowed.to_string(),
                t.denied().to_string(),
                format!("{:.2}%", 100.0 * t.denied_share()),
                format!("{denied}/{}", g.clients),
            ]);
        }
    }
    table.print();
    println!("clients denied: the group's clients denied at least once; per-client decisions are in the CSV files");
    println!();
    let mut summary = Table::new(&["run", "polite denied", "abusers allowed"]);
    for (run, st) in report.runs.iter().zip(&report.stats) {
        summary.row(vec![
            run.name.clone(),
            format!("{:.2}%", 100.0 * st.polite().denied_share()),
            format!("{:.2}%", 100.0 * st.abusers().allowed_share()),
        ]);
    }
    summary.print();
    let dir = prepare(out, s)?;
    let mut written = Vec::new();
    for run in &report.runs {
        written.push(write_records(&dir, s, run)?);
    }
    written.extend(render(&dir, "mixed", (1400, 700), &report)?);
    Ok(written)
}

/// A time in seconds, or "never".
fn time_or_never(t: Option<u64>) -> String {
    t.map_or("never".into(), |t| format!("{} s", exact_secs(t)))
}

/// Times as runs of consecutive requests `step` apart: "160–179 s, 181 s"; "-" if none.
fn spans(times: &[u64], step: u64) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < times.len() {
        let mut j = i;
        while j + 1 < times.len() && times[j + 1] - times[j] == step {
            j += 1;
        }
        out.push(if i == j {
            format!("{} s", exact_secs(times[i]))
        } else {
            format!("{}–{} s", exact_secs(times[i]), exact_secs(times[j]))
        });
        i = j + 1;
    }
    if out.is_empty() {
        "-".into()
    } else {
        out.join(", ")
    }
}

/// `ns` as an exact decimal number of seconds ("149.4", "50.000000001").
fn exact_secs(ns: u64) -> String {
    let mut s = format!("{}.{:09}", ns / SECOND, ns % SECOND);
    while s.ends_with('0') {
        s.pop();
    }
    if s.ends_with('.') {
        s.pop();
    }
    s
}

/// A plain text table: columns padded to their widest cell.
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    fn new(header: &[&str]) -> Self {
        Self {
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
        }
    }

    /// Adds a row (one cell per column).
    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Prints it to stdout.
    fn print(&self) {
        let cols = self.rows[0].len();
        let width: Vec<usize> = (0..cols)
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in &self.rows {
            let mut line = String::new();
            for (cell, w) in row.iter().zip(&width) {
                let _ = write!(line, "{cell:<w$}  ");
            }
            println!("{}", line.trim_end());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CSV files.

/// Creates `out/<scenario>/`.
fn prepare(out: &Path, s: &Scenario) -> Res<PathBuf> {
    let dir = out.join(s.name);
    fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// Writes `text` to `path`, naming the path in an error.
fn write_file(path: PathBuf, text: &str) -> Res<PathBuf> {
    fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// `<run>.csv`: one line per request.
fn write_records(dir: &Path, s: &Scenario, run: &Run) -> Res<PathBuf> {
    let mut text = String::from("time_s,client,allowed,rate_per_s,retry_after_s\n");
    for r in &run.records {
        let _ = writeln!(
            text,
            "{},{},{},{},{}",
            exact_secs(r.t),
            s.clients[r.client as usize].name,
            r.allowed,
            r.rate.map_or(String::new(), |x| x.to_string()),
            exact_secs(r.retry_after)
        );
    }
    write_file(dir.join(format!("{}.csv", run.name)), &text)
}

/// `<run>-estimates.csv`: the measured rate of each client on the sampling grid.
fn write_estimates(dir: &Path, s: &Scenario, run: &Run) -> Res<PathBuf> {
    let mut text = String::from("time_s,client,true_rate_per_s,estimate_per_s\n");
    for x in &run.samples {
        let c = &s.clients[x.client as usize];
        let _ = writeln!(
            text,
            "{},{},{},{}",
            exact_secs(x.t),
            c.name,
            c.true_rate(x.t),
            x.rate
        );
    }
    write_file(dir.join(format!("{}-estimates.csv", run.name)), &text)
}
