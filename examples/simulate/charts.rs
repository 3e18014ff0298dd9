//! The charts of each scenario (plotters).

use super::*;

// ---------------------------------------------------------------------------------------------
// Charts.

/// A chart that can be drawn on any plotters backend: the PNG and the SVG are one drawing.
pub(crate) trait Chart {
    /// Draws the chart on `root`.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Res
    where
        DB::ErrorType: 'static;
}

impl Chart for tracking::Report {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Res
    where
        DB::ErrorType: 'static,
    {
        tracking_chart(root, self)
    }
}

impl Chart for abuser::Report {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Res
    where
        DB::ErrorType: 'static,
    {
        abuser_chart(root, self)
    }
}

impl Chart for mixed::Report {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Res
    where
        DB::ErrorType: 'static,
    {
        mixed_chart(root, self)
    }
}

/// Draws `chart` as `<stem>.png` and `<stem>.svg` in `dir`.
pub(crate) fn render(
    dir: &Path,
    stem: &str,
    size: (u32, u32),
    chart: &impl Chart,
) -> Res<Vec<PathBuf>> {
    let png = dir.join(format!("{stem}.png"));
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        chart.draw(&root)?;
        root.present()
            .map_err(|e| format!("{}: {e}", png.display()))?;
    }
    let svg = dir.join(format!("{stem}.svg"));
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        chart.draw(&root)?;
        root.present()
            .map_err(|e| format!("{}: {e}", svg.display()))?;
    }
    Ok(vec![png, svg])
}

/// A legend entry's line sample.
fn swatch(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
}

/// A 2×3 grid: rows are the half-lives, columns the rates; each panel plots the true rate,
/// the periodic client's estimate and the Poisson client's.
fn tracking_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    report: &tracking::Report,
) -> Res
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let root = root.titled(
        "EARRRL: estimated rate vs true rate (clients send from 50 s to 200 s)",
        (SANS, 28),
    )?;
    let s = &report.scenario;
    let cols = tracking::RATES.len();
    let panels = root.split_evenly((report.runs.len(), cols));
    for (row, (run, stats)) in report.runs.iter().zip(&report.stats).enumerate() {
        for (col, &rate) in tracking::RATES.iter().enumerate() {
            // Periodic clients come first, then the Poisson clients at the same rates.
            let (periodic, poisson) = (col as u32, (col + cols) as u32);
            let series = |client: u32| -> Vec<(f64, f64)> {
                run.samples
                    .iter()
                    .filter(|x| x.client == client)
                    .map(|x| (secs(x.t), x.rate))
                    .collect()
            };
            let (a, b) = (series(periodic), series(poisson));
            // Room above the data for the legend; at least 2× the true rate.
            let top = a.iter().chain(&b).map(|p| p.1).fold(2.0 * rate, f64::max) * 1.15;
            let h = stats[0].half_life.as_secs();
            let mut chart = ChartBuilder::on(&panels[row * cols + col])
                .caption(
                    format!(
                        "half-life {h} s, clients at {rate} request{}/s",
                        if rate == 1.0 { "" } else { "s" }
                    ),
                    (SANS, 19),
                )
                .margin(12)
                .x_label_area_size(42)
                .y_label_area_size(58)
                .build_cartesian_2d(0.0..tracking::END, 0.0..top)?;
            chart
                .configure_mesh()
                .x_desc("time (s)")
                .y_desc("rate (requests/s)")
                .x_label_formatter(&|x| format!("{x:.0}"))
                .label_style((SANS, 13))
                .axis_desc_style((SANS, 14))
                .light_line_style(WHITE.mix(0.0))
                .draw()?;
            let truth = s.clients[periodic as usize].clone();
            let step = [0.0, tracking::START, tracking::STOP, tracking::END];
            let step_line: Vec<(f64, f64)> = step
                .windows(2)
                .flat_map(|w| {
                    let r = truth.true_rate(engine::SECOND * w[0] as u64);
                    [(w[0], r), (w[1], r)]
                })
                .collect();
            chart
                .draw_series(LineSeries::new(step_line, BLACK.stroke_width(2)))?
                .label("true rate")
                .legend(swatch(BLACK));
            for (client, points, color, kind) in [
                (periodic, a, BLUE_, "periodic"),
                (poisson, b, ORANGE, "Poisson"),
            ] {
                let st = &stats[client as usize];
                let rise = st.rise.map_or("never".into(), |r| format!("{r:.1} s"));
                // One pixel wide: plotters joins wider lines with miters, which spike at the
                // sawtooth's sharp corners.
                chart
                    .draw_series(LineSeries::new(points, color.stroke_width(1)))?
                    .label(format!(
                        "{kind}: 90% after {rise}, error {:.1}%",
                        100.0 * st.steady_error
                    ))
                    .legend(swatch(color));
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .label_font((SANS, 13))
                .background_style(WHITE.mix(0.85))
                .border_style(GREY)
                .draw()?;
        }
    }
    root.present()?;
    Ok(())
}

/// Colours of the abuser scenario's runs, in run order.
/// Not green or vermillion: those mark allowed and denied in the decision strips.
const RUN_COLORS: [RGBColor; 4] = [ORANGE, BLUE_, SKY, PURPLE];

/// Top: cumulative attempted vs allowed per algorithm. Bottom: each algorithm's decisions
/// over time, one strip per algorithm.
fn abuser_chart<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, report: &abuser::Report) -> Res
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let root = root.titled(
        "One client at 1.67 requests/s until 150 s, then exactly 1/s; limit 1 request/s",
        (SANS, 26),
    )?;
    let (top, bottom) = root.split_vertically(root.relative_to_height(0.64));
    let end = abuser::END;
    let comply = abuser::COMPLY_AT;
    let attempted: Vec<(f64, f64)> = cumulative(&report.runs[0], |_| true);
    let y_max = attempted.last().map_or(1.0, |p| p.1) * 1.08;

    let mut chart = ChartBuilder::on(&top)
        .caption("Cumulative requests", (SANS, 20))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..end, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("requests (cumulative)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style((SANS, 14))
        .axis_desc_style((SANS, 15))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    chart.draw_series(DashedLineSeries::new(
        [(comply, 0.0), (comply, y_max)],
        6,
        4,
        GREY.stroke_width(1),
    ))?;
    chart.draw_series([Text::new(
        "complies: 1/s from 150 s",
        (comply + 3.0, y_max * 0.98),
        (SANS, 14).into_font().color(&GREY),
    )])?;
    chart
        .draw_series(LineSeries::new(attempted, BLACK.stroke_width(2)))?
        .label("attempted")
        .legend(swatch(BLACK));
    for ((run, st), color) in report.runs.iter().zip(&report.stats).zip(RUN_COLORS) {
        chart
            .draw_series(LineSeries::new(
                cumulative(run, |r| r.allowed),
                color.stroke_width(2),
            ))?
            .label(format!(
                "{}: {} allowed, back at {}, steady from {}",
                run.label,
                st.abuse.allowed + st.comply.allowed,
                time_or_never(st.first_allowed),
                time_or_never(st.steady_from)
            ))
            .legend(swatch(color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((SANS, 14))
        .background_style(WHITE.mix(0.9))
        .border_style(GREY)
        .draw()?;

    let rows = report.runs.len() as u32;
    let labels: Vec<String> = report.runs.iter().map(|r| r.label.clone()).collect();
    let label_of = |v: &SegmentValue<u32>| match v {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => labels
            .get((rows - 1 - i) as usize)
            .cloned()
            .unwrap_or_default(),
        SegmentValue::Last => String::new(),
    };
    let mut strips = ChartBuilder::on(&bottom)
        .caption(
            "Decisions over time (green: allowed, red: denied; dashed: the client complies)",
            (SANS, 20),
        )
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(240)
        .build_cartesian_2d(0.0..end, (0..rows - 1).into_segmented())?;
    strips
        .configure_mesh()
        .x_desc("time (s)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&label_of)
        .label_style((SANS, 14))
        .axis_desc_style((SANS, 15))
        .disable_y_mesh()
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (i, run) in report.runs.iter().enumerate() {
        // The first run on top.
        let row = rows - 1 - i as u32;
        let times: Vec<f64> = run.records.iter().map(|r| secs(r.t)).collect();
        strips.draw_series(run.records.iter().enumerate().map(|(k, r)| {
            // Each decision holds until the next request.
            let until = times.get(k + 1).copied().unwrap_or(end);
            let color = if r.allowed { GREEN_ } else { VERMILLION };
            let mut strip = Rectangle::new(
                [
                    (times[k], SegmentValue::Exact(row)),
                    (until, segment_end(row, rows)),
                ],
                color.filled(),
            );
            // A white gap between the strips.
            strip.set_margin(4, 4, 0, 0);
            strip
        }))?;
    }
    strips.draw_series(DashedLineSeries::new(
        [
            (comply, SegmentValue::Exact(0)),
            (comply, SegmentValue::Last),
        ],
        6,
        4,
        BLACK.stroke_width(2),
    ))?;
    root.present()?;
    Ok(())
}

/// The upper edge of segment `row` of `rows` (the last one ends at the axis' end).
fn segment_end(row: u32, rows: u32) -> SegmentValue<u32> {
    if row + 1 < rows {
        SegmentValue::Exact(row + 1)
    } else {
        SegmentValue::Last
    }
}

/// Points `(t in s, count)` of the running count of records `keep` selects, as steps.
fn cumulative(run: &Run, keep: impl Fn(&engine::Record) -> bool) -> Vec<(f64, f64)> {
    let mut n = 0.0;
    let mut points = vec![(0.0, 0.0)];
    for r in run.records.iter().filter(|r| keep(r)) {
        let t = secs(r.t);
        points.push((t, n));
        n += 1.0;
        points.push((t, n));
    }
    points.push((abuser::END, n));
    points
}

/// Two bar charts side by side: the polite clients' denial rate and the abusers' admission
/// rate, two bars (one per group) per algorithm.
fn mixed_chart<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, report: &mixed::Report) -> Res
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let root = root.titled(
        "Polite clients and abusers, each limited to 1 request/s, 300 s",
        (SANS, 26),
    )?;
    let panels = root.split_evenly((1, 2));
    let rows = report.runs.len();
    let labels: Vec<String> = report.runs.iter().map(|r| r.label.clone()).collect();
    // The first algorithm on top; a label at the middle of each algorithm's row.
    let row_of = |i: usize| (rows - 1 - i) as f64;
    let label_of = |v: &SegmentValue<u32>| match v {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => labels
            .get(rows - 1 - *i as usize)
            .cloned()
            .unwrap_or_default(),
        SegmentValue::Last => String::new(),
    };
    for (panel, groups, title, x_desc, colors, share) in [
        (
            &panels[0],
            mixed::POLITE,
            "Polite clients: requests denied",
            "denied (% of the group's requests)",
            [VERMILLION, ORANGE],
            (|t: &engine::Totals| t.denied_share()) as fn(&engine::Totals) -> f64,
        ),
        (
            &panels[1],
            mixed::ABUSIVE,
            "Abusers: requests allowed",
            "allowed (% of the group's requests)",
            [BLUE_, SKY],
            |t: &engine::Totals| t.allowed_share(),
        ),
    ] {
        let (legend, plot) = panel.split_vertically(78);
        legend.draw_text(
            title,
            &(SANS, 20).into_text_style(&legend),
            (legend.dim_in_pixel().0 as i32 / 2 - 140, 8),
        )?;
        for (k, (&g, color)) in groups.iter().zip(colors).enumerate() {
            let (x, y) = (260, 38 + 20 * k as i32);
            legend.draw(&Rectangle::new([(x, y), (x + 26, y + 13)], color.filled()))?;
            legend.draw_text(
                &format!(
                    "{} ({} clients)",
                    mixed::GROUPS[g].label,
                    mixed::GROUPS[g].clients
                ),
                &(SANS, 15).into_text_style(&legend),
                (x + 34, y - 1),
            )?;
        }
        let values: Vec<[f64; 2]> = report
            .stats
            .iter()
            .map(|st| groups.map(|g| 100.0 * share(&st.groups[g])))
            .collect();
        // Room on the right for the value labels; a floor so an all-zero panel still has an
        // axis.
        let x_max = values.iter().flatten().copied().fold(1.0, f64::max) * 1.25;
        // The segmented axis (one segment per algorithm, for the labels) and a plain one over
        // the same area (for bars at fractions of a segment).
        let mut chart = ChartBuilder::on(&plot)
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(250)
            .build_cartesian_2d(0.0..x_max, (0..rows as u32 - 1).into_segmented())?
            .set_secondary_coord(0.0..x_max, 0.0..rows as f64);
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .x_label_formatter(&|x| format!("{x:.0$}", usize::from(x_max < 5.0)))
            .y_label_formatter(&label_of)
            .label_style((SANS, 14))
            .axis_desc_style((SANS, 15))
            .disable_y_mesh()
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        for (i, v) in values.iter().enumerate() {
            for (k, (&v, color)) in v.iter().zip(colors).enumerate() {
                // First group in the upper half of the row, second in the lower.
                let (lo, hi) = if k == 0 { (0.52, 0.88) } else { (0.12, 0.48) };
                let y = row_of(i);
                chart.draw_secondary_series([Rectangle::new(
                    [(0.0, y + lo), (v, y + hi)],
                    color.filled(),
                )])?;
                chart.draw_secondary_series([Text::new(
                    format!(" {v:.2}%"),
                    (v, y + (lo + hi) / 2.0),
                    TextStyle::from((SANS, 13)).pos(Pos::new(HPos::Left, VPos::Center)),
                )])?;
            }
        }
    }
    root.present()?;
    Ok(())
}
