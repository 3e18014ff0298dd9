//! The hybrid limiter in a fleet of 4 processes, charted: starts its own `redis-server`, runs
//! `tests/hybrid_fleet.rs`'s harness twice (10 s each; the second with Redis killed for 3 s
//! in the middle), prints a Markdown table of what the fleet admitted against one exact
//! limiter, and draws the admitted requests per second into `docs/hybrid_fleet.png`.
//!
//! ```text
//! cargo run --release --features redis --example hybrid_fleet
//! ```

#[path = "../tests/fleet/mod.rs"]
mod fleet;
#[path = "../tests/redis_server/mod.rs"]
mod redis_server;

use fleet::*;
use plotters::prelude::*;
use redis_server::Server;
use std::time::Duration;

const FONT: &[u8] = include_bytes!("simulate/DejaVuSans.ttf");
const SANS: &str = "sans-serif";

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res {
    if let Ok(spec) = std::env::var(WORKER_ENV) {
        let spec: serde_json::Value = serde_json::from_str(&spec)?;
        println!("FLEET-RESULT {}", worker(&spec));
        return Ok(());
    }
    let runs = [
        ("no outage", None),
        (
            "Redis killed from 3.5 s to 6.5 s",
            Some((Duration::from_millis(3500), Duration::from_secs(3))),
        ),
    ];
    let mut done = Vec::new();
    for (title, outage) in runs {
        let server = Server::start().ok_or("redis-server is not installed")?;
        let port = server.port;
        let run = run(
            &[],
            port,
            server,
            |p| Server::start_on(Some(p)).expect("restart redis-server"),
            Duration::from_secs(10),
            outage,
        );
        table(title, &run);
        done.push((title, run));
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/hybrid_fleet.png");
    chart(&path, &done)?;
    println!("\nwrote {}", path.display());
    Ok(())
}

/// The fleet against one exact limiter fed the same requests, per algorithm and key.
fn table(title: &str, run: &Run) {
    println!(
        "\n{title}: {WORKERS} processes, {} s, limit {LIMIT}/s, flood {FLOOD}x, paced {PACED}x, sync every {} ms, fallback share {SHARE}\n",
        run.duration.as_secs(),
        INTERVAL.as_millis()
    );
    println!("| algorithm | flood: fleet | exact | fleet/exact | paced: fleet | exact | fleet/exact | calls per key per interval | degraded decisions |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for a in &run.algos {
        let (ff, fx) = (admitted(&a.flood), exact(a.name, &a.flood));
        let (pf, px) = (admitted(&a.paced), exact(a.name, &a.paced));
        println!(
            "| {} | {ff} | {fx} | {:.3} | {pf} | {px} | {:.3} | {:.2} | {} |",
            a.name,
            ff as f64 / fx as f64,
            pf as f64 / px as f64,
            calls_per_key_interval(a),
            total(a, "degraded"),
        );
    }
    println!(
        "\nfixed window: most in one window {} (limit {LIMIT} + bound {}); sliding window: largest estimate {:.1}",
        max_per_window(&run.algos[1].flood),
        window_bound(),
        max_sliding_estimate(&run.algos[2].flood),
    );
}

/// Admitted in each whole second of Unix time within the run (the fixed window's windows),
/// at the second's middle, in seconds from the run's start.
fn series(run: &Run, t: &Trace) -> Vec<(f64, f64)> {
    let sec = 1_000_000_000u64;
    let end = run.start + run.duration.as_nanos() as u64;
    let first = run.start.div_ceil(sec);
    let mut counts = vec![0u64; (end / sec).saturating_sub(first) as usize];
    for &(at, ok) in t {
        if let Some(c) = (at / sec)
            .checked_sub(first)
            .and_then(|i| counts.get_mut(i as usize))
        {
            *c += ok as u64;
        }
    }
    let x = |i: usize| ((first + i as u64) * sec - run.start) as f64 / 1e9 + 0.5;
    counts
        .into_iter()
        .enumerate()
        .map(|(i, c)| (x(i), c as f64))
        .collect()
}

fn chart(path: &std::path::Path, runs: &[(&str, Run)]) -> Res {
    plotters::style::register_font(SANS, FontStyle::Normal, FONT)
        .map_err(|_| "the bundled font is not a valid TrueType font")?;
    let root = BitMapBackend::new(path, (1600, 1000)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!("HybridLimiter, {WORKERS} processes, one Redis: admitted per second across the fleet (limit {LIMIT}/s)"),
        (SANS, 26),
    )?;
    let panels = root.split_evenly((runs.len(), 2));
    let colors = [
        RGBColor(0, 114, 178),
        RGBColor(230, 159, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(86, 180, 233),
    ];
    let cells = runs
        .iter()
        .flat_map(|(title, run)| [(title, run, true), (title, run, false)]);
    for ((title, run, flood), panel) in cells.zip(panels.iter()) {
        let secs = run.duration.as_secs_f64();
        let what = if flood {
            format!("{title}; flooded key ({FLOOD}x the limit)")
        } else {
            format!("{title}; paced key ({PACED}x the limit)")
        };
        let top = 2.0 * LIMIT;
        let mut c = ChartBuilder::on(panel)
            .caption(what, (SANS, 19))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..secs, 0.0..top)?;
        c.configure_mesh()
            .x_desc("time (s)")
            .y_desc("admitted per second")
            .label_style((SANS, 14))
            .axis_desc_style((SANS, 15))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        if let Some((from, to)) = run.outage {
            let s = |t: u64| t.saturating_sub(run.start) as f64 / 1e9;
            c.draw_series(std::iter::once(Rectangle::new(
                [(s(from), 0.0), (s(to), top)],
                RGBColor(200, 200, 200).mix(0.4).filled(),
            )))?
            .label("Redis down")
            .legend(|(x, y)| {
                Rectangle::new(
                    [(x, y - 6), (x + 24, y + 6)],
                    RGBColor(200, 200, 200).filled(),
                )
            });
        }
        c.draw_series(LineSeries::new(
            vec![(0.0, LIMIT), (secs, LIMIT)],
            BLACK.stroke_width(1),
        ))?
        .label(format!("limit, {LIMIT}/s"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], BLACK.stroke_width(2)));
        for (a, color) in run.algos.iter().zip(colors) {
            let t = if flood { &a.flood } else { &a.paced };
            let (total, exact) = (admitted(t), exact(a.name, t));
            c.draw_series(LineSeries::new(series(run, t), color.stroke_width(2)))?
                .label(format!("{}: {total} (exact: {exact})", a.name))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
                });
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((SANS, 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
