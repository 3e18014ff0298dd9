//! The hybrid limiter in a fleet of 4 processes, tabulated and charted: starts its own
//! `redis-server`, runs `tests/hybrid_fleet.rs`'s harness over every shape of traffic (two hot
//! keys, the same with one process sending 90%, the same with Redis killed for 3 s, then
//! 10,000 and 2,000 sparse keys, one algorithm at a time), prints a Markdown table per shape of
//! what the fleet admitted against one exact limiter fed the same requests, and draws the hot
//! keys' admitted requests per second into `docs/hybrid_fleet.png`.
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
use std::time::Duration;

const FONT: &[u8] = include_bytes!("simulate/DejaVuSans.ttf");
const SANS: &str = "sans-serif";
const SECS: Duration = Duration::from_secs(10);

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// A run of `shape` for `algos` against a server of its own, with an outage if asked.
fn fleet_run(
    shape: Shape,
    algos: &[&'static str],
    outage: Option<(Duration, Duration)>,
) -> Res<Run> {
    Ok(on_a_server(&[], shape, algos, SECS, outage).ok_or("redis-server is not installed")?)
}

fn main() -> Res {
    if std::env::var(WORKER_ENV).is_ok() {
        worker_main();
        return Ok(());
    }
    let hot = Shape::Hot { skew: None };
    let mut charted = Vec::new();
    for (title, shape, outage) in [
        ("two hot keys", hot, None),
        (
            "two hot keys, one process sending 90%",
            Shape::Hot { skew: Some(0.9) },
            None,
        ),
        (
            "two hot keys, Redis killed from 3.5 s to 6.5 s",
            hot,
            Some((Duration::from_millis(3500), Duration::from_secs(3))),
        ),
    ] {
        let run = fleet_run(shape, &ALGOS, outage)?;
        table(title, &run, &[FLOOD, PACED]);
        if shape == hot {
            charted.push((title, run));
        }
    }
    for (keys, rate) in [(10_000, 2.0), (2_000, 10.0)] {
        let shape = Shape::Sparse { keys, rate };
        let mut algos = Vec::new();
        for name in ALGOS {
            algos.extend(fleet_run(shape, &[name], None)?.algos);
        }
        let run = Run {
            shape,
            start: 0,
            duration: SECS,
            outage: None,
            algos,
        };
        table(&format!("{keys} keys at {rate}/s each"), &run, &[]);
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/hybrid_fleet.png");
    chart(&path, &charted)?;
    println!("\nwrote {}", path.display());
    Ok(())
}

/// The fleet against one exact limiter fed the same requests: per hot key, or over all keys.
fn table(title: &str, run: &Run, keys: &[u32]) {
    let shape = run.shape;
    println!(
        "\n{title}: {WORKERS} processes, {} s, limit {}/s (GCRA burst {}), sync every {} ms, fallback share {}\n",
        run.duration.as_secs(),
        shape.limit(),
        shape.burst(),
        INTERVAL.as_millis(),
        shape.share(),
    );
    println!("| algorithm | key | fleet | exact | fleet/exact | wrongly denied | wrongly allowed | most in a 1 s window | lag (max) | calls per key per interval | degraded |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for a in &run.algos {
        let per_key: Vec<(String, Comparison, String)> = if keys.is_empty() {
            vec![("all".into(), compare(a, shape, |_| true), "".into())]
        } else {
            let by = by_key(&a.trace);
            keys.iter()
                .map(|&k| {
                    let name = if k == FLOOD { "flood" } else { "paced" };
                    let most = match a.name {
                        "fixed" => max_per_window(&by[&k]).to_string(),
                        "sliding" => format!("{:.1}", max_sliding_estimate(&by[&k])),
                        _ => String::new(),
                    };
                    (name.into(), compare(a, shape, |x| x == k), most)
                })
                .collect()
        };
        for (key, c, most) in per_key {
            println!(
                "| {} | {key} | {} | {} | {:.3} | {:.2}% | {:.2}% | {most} | {:.0} ms | {:.3} | {} |",
                a.name,
                c.fleet,
                c.exact,
                c.ratio(),
                100.0 * c.wrongly_denied_share(),
                100.0 * c.wrongly_allowed_share(),
                lag(a).as_secs_f64() * 1e3,
                calls_per_key_interval(run, a),
                total(a, "degraded"),
            );
        }
    }
}

/// Admitted of `key` in each whole second of Unix time within the run (the fixed window's
/// windows), at the second's middle, in seconds from the run's start.
fn series(run: &Run, t: &Trace, key: u32) -> Vec<(f64, f64)> {
    let sec = 1_000_000_000u64;
    let end = run.start + run.duration.as_nanos() as u64;
    let first = run.start.div_ceil(sec);
    let mut counts = vec![0u64; (end / sec).saturating_sub(first) as usize];
    for &(at, k, ok) in t {
        if k != key {
            continue;
        }
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
        &format!("HybridLimiter, {WORKERS} processes, one Redis: admitted per second across the fleet (limit {}/s)", Shape::Hot { skew: None }.limit()),
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
        let limit = run.shape.limit();
        let what = if flood {
            format!("{title}; flooded key (10x the limit)")
        } else {
            format!("{title}; paced key (1.2x the limit)")
        };
        let top = 2.0 * limit;
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
            vec![(0.0, limit), (secs, limit)],
            BLACK.stroke_width(1),
        ))?
        .label(format!("limit, {limit}/s"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], BLACK.stroke_width(2)));
        for (a, color) in run.algos.iter().zip(colors) {
            let key = if flood { FLOOD } else { PACED };
            let c_key = compare(a, run.shape, |k| k == key);
            let (total, exact) = (c_key.fleet, c_key.exact);
            c.draw_series(LineSeries::new(
                series(run, &a.trace, key),
                color.stroke_width(2),
            ))?
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
