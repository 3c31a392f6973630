//! `--plot`: an SVG with two panels, bus bandwidth (GB/s) and time (µs) against size, on a
//! log2 size axis, one colour per op (solid: out-of-place, dashed: in-place). Written by hand:
//! a few dozen elements need no plotting crate.

use std::fmt::Write;

use super::table::OpResult;

const WIDTH: f64 = 1100.0;
const HEIGHT: f64 = 500.0;
/// Plot area of a panel: left edge of the first, top, width, height.
const LEFT: f64 = 80.0;
const TOP: f64 = 60.0;
const PLOT_W: f64 = 420.0;
const PLOT_H: f64 = 320.0;
/// From one panel's left edge to the next one's.
const PANEL_STEP: f64 = 530.0;
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// An axis: the data range it shows and whether it is logarithmic (base `log`).
struct Axis {
    lo: f64,
    hi: f64,
    log: Option<f64>,
}

impl Axis {
    fn pos(&self, v: f64) -> f64 {
        let t = |x: f64| match self.log {
            Some(b) => x.max(f64::MIN_POSITIVE).log(b),
            None => x,
        };
        let span = t(self.hi) - t(self.lo);
        if span <= 0.0 {
            0.5
        } else {
            (t(v) - t(self.lo)) / span
        }
    }
}

/// `s` with XML's special characters escaped.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A size label: `8`, `1K`, `64M`.
fn size_label(bytes: f64) -> String {
    super::show_size(bytes.round() as u64)
}

/// A tick step of 1, 2 or 5 times a power of ten giving at most about `n` ticks over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    let raw = (span / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

fn number_label(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1e6 || v.abs() < 1e-2 {
        format!("{v:.0e}")
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// One series: an op's points in one placement.
struct Series<'a> {
    colour: &'a str,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

/// Draws one panel: frame, ticks, labels and the series.
fn panel(
    o: &mut String,
    index: usize,
    title: &str,
    y_label: &str,
    x: &Axis,
    y: &Axis,
    series: &[Series<'_>],
) {
    let left = LEFT + index as f64 * PANEL_STEP;
    let px = |v: f64| left + x.pos(v) * PLOT_W;
    let py = |v: f64| TOP + PLOT_H - y.pos(v) * PLOT_H;
    let _ = writeln!(o, r#"<g class="panel">"#);
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        left + PLOT_W / 2.0,
        TOP - 20.0,
        escape(title)
    );
    // x ticks: powers of two, thinned to at most about nine labels.
    let (k_lo, k_hi) = (x.lo.log2().floor() as i64, x.hi.log2().ceil() as i64);
    let span = (k_hi - k_lo).max(1);
    let every = [1, 2, 5, 10, 20]
        .into_iter()
        .find(|e| span / e <= 9)
        .unwrap_or(span);
    for k in k_lo..=k_hi {
        let v = 2f64.powi(k as i32);
        if v < x.lo * 0.999 || v > x.hi * 1.001 || k.rem_euclid(every) != 0 {
            continue;
        }
        let xx = px(v);
        let _ = writeln!(
            o,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#ddd"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}</text>"##,
            TOP,
            TOP + PLOT_H + 5.0,
            TOP + PLOT_H + 19.0,
            size_label(v)
        );
    }
    // y ticks: decades on a log axis, 1-2-5 steps on a linear one.
    let ticks: Vec<f64> = match y.log {
        Some(_) => {
            let (lo, hi) = (y.lo.log10().floor() as i32, y.hi.log10().ceil() as i32);
            (lo..=hi).map(|e| 10f64.powi(e)).collect()
        }
        None => {
            let step = nice_step(y.hi - y.lo, 6.0);
            let n = ((y.hi - y.lo) / step).round() as i64;
            (0..=n).map(|i| y.lo + i as f64 * step).collect()
        }
    };
    for v in ticks {
        if v < y.lo * 0.999 - 1e-12 || v > y.hi * 1.001 + 1e-12 {
            continue;
        }
        let yy = py(v);
        let _ = writeln!(
            o,
            r##"<line x1="{left:.1}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">{}</text>"##,
            left + PLOT_W,
            left - 6.0,
            yy + 4.0,
            number_label(v)
        );
    }
    let _ = writeln!(
        o,
        r##"<rect x="{left:.1}" y="{TOP:.1}" width="{PLOT_W:.1}" height="{PLOT_H:.1}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13">size (bytes, log2 scale)</text>"#,
        left + PLOT_W / 2.0,
        TOP + PLOT_H + 40.0
    );
    let (lx, ly) = (left - 55.0, TOP + PLOT_H / 2.0);
    let _ = writeln!(
        o,
        r#"<text x="{lx:.1}" y="{ly:.1}" text-anchor="middle" font-size="13" transform="rotate(-90 {lx:.1} {ly:.1})">{}</text>"#,
        escape(y_label)
    );
    for s in series {
        if s.points.is_empty() {
            continue;
        }
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|&(a, b)| format!("{:.1},{:.1}", px(a), py(b)))
            .collect();
        let dash = if s.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            o,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            pts.join(" "),
            s.colour
        );
        if !s.dashed {
            for &(a, b) in &s.points {
                let _ = writeln!(
                    o,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                    px(a),
                    py(b),
                    s.colour
                );
            }
        }
    }
    let _ = writeln!(o, "</g>");
}

/// The SVG document for `results`, titled `title`.
pub fn svg(title: &str, results: &[OpResult]) -> String {
    // Points of positive size only: a log axis has no 0.
    let all = || {
        results.iter().flat_map(|r| {
            r.rows
                .iter()
                .filter(|row| row.size > 0)
                .flat_map(move |row| {
                    [&row.out_of_place, &row.in_place]
                        .map(|g| (row.size as f64, g.time_us, row.bandwidth(g, r.bus_factor).1))
                })
                // A placement the adaptor does not support has no point.
                .filter(|(_, t, _)| t.is_finite())
        })
    };
    let (mut x_lo, mut x_hi) = all().fold((f64::INFINITY, 0f64), |(lo, hi), (s, _, _)| {
        (lo.min(s), hi.max(s))
    });
    if !x_lo.is_finite() {
        (x_lo, x_hi) = (1.0, 1024.0);
    }
    if x_hi <= x_lo {
        (x_lo, x_hi) = (x_lo / 2.0, x_hi * 2.0);
    }
    let bus_max = all().map(|p| p.2).fold(0f64, f64::max);
    let bus_hi = if bus_max > 0.0 {
        let step = nice_step(bus_max, 6.0);
        (bus_max / step).ceil() * step
    } else {
        1.0
    };
    let (t_lo, t_hi) = all()
        .map(|p| p.1)
        .filter(|t| *t > 0.0)
        .fold((f64::INFINITY, 0f64), |(lo, hi), t| (lo.min(t), hi.max(t)));
    let (t_lo, t_hi) = if t_lo.is_finite() {
        (
            10f64.powf(t_lo.log10().floor()),
            10f64.powf(t_hi.log10().ceil().max(t_lo.log10().floor() + 1.0)),
        )
    } else {
        (1.0, 10.0)
    };
    let x = Axis {
        lo: x_lo,
        hi: x_hi,
        log: Some(2.0),
    };
    let bus = Axis {
        lo: 0.0,
        hi: bus_hi,
        log: None,
    };
    let time = Axis {
        lo: t_lo,
        hi: t_hi,
        log: Some(10.0),
    };

    let series = |time_panel: bool| -> Vec<Series<'static>> {
        let mut out = Vec::new();
        for (i, r) in results.iter().enumerate() {
            for dashed in [false, true] {
                let points = r
                    .rows
                    .iter()
                    .filter(|row| row.size > 0)
                    .filter(|row| {
                        if dashed {
                            row.in_place.ran()
                        } else {
                            row.out_of_place.ran()
                        }
                    })
                    .map(|row| {
                        let g = if dashed {
                            &row.in_place
                        } else {
                            &row.out_of_place
                        };
                        let v = if time_panel {
                            g.time_us
                        } else {
                            row.bandwidth(g, r.bus_factor).1
                        };
                        (row.size as f64, v)
                    })
                    .collect();
                out.push(Series {
                    colour: COLOURS[i % COLOURS.len()],
                    dashed,
                    points,
                });
            }
        }
        out
    };

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif">"#
    );
    let _ = writeln!(o, "<title>{}</title>", escape(title));
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="24" text-anchor="middle" font-size="16">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    panel(
        &mut o,
        0,
        "Bus bandwidth",
        "busbw (GB/s)",
        &x,
        &bus,
        &series(false),
    );
    panel(
        &mut o,
        1,
        "Time per operation",
        "time (µs, log10 scale)",
        &x,
        &time,
        &series(true),
    );
    // Legend: one entry per op, then the line styles.
    let mut lx = LEFT;
    let ly = HEIGHT - 30.0;
    for (i, r) in results.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let _ = writeln!(
            o,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{c}" stroke-width="3"/><text x="{:.1}" y="{:.1}" font-size="13">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            r.op.name()
        );
        lx += 40.0 + 8.0 * r.op.name().len() as f64;
    }
    let _ = writeln!(
        o,
        r##"<text x="{:.1}" y="{:.1}" font-size="12" fill="#555">solid: out-of-place, dashed: in-place</text>"##,
        lx + 10.0,
        ly + 4.0
    );
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::super::ops::Op;
    use super::super::table::{Group, Row};
    use super::*;

    #[test]
    fn the_svg_has_both_panels_and_every_op() {
        let rows = |t: f64| {
            [8usize, 1024, 1 << 20]
                .iter()
                .map(|&size| Row {
                    size,
                    count: size / 4,
                    out_of_place: Group {
                        time_us: t * size as f64,
                        wrong: Some(0),
                        direct: None,
                    },
                    in_place: Group {
                        time_us: 2.0 * t * size as f64,
                        wrong: Some(0),
                        direct: None,
                    },
                })
                .collect::<Vec<_>>()
        };
        let results = [
            OpResult {
                op: Op::AllReduce,
                bus_factor: 1.5,
                rows: rows(0.01),
            },
            OpResult {
                op: Op::AllGather,
                bus_factor: 0.75,
                rows: rows(0.02),
            },
        ];
        let s = svg("ferrocx bench <4 ranks>", &results);
        assert!(s.starts_with("<svg"), "{s}");
        assert!(s.trim_end().ends_with("</svg>"));
        for needle in [
            "all_reduce",
            "all_gather",
            "busbw (GB/s)",
            "time (µs",
            "1M",
            "&lt;4 ranks&gt;",
        ] {
            assert!(s.contains(needle), "{needle}");
        }
        assert_eq!(s.matches("<polyline").count(), 8);
        // Nothing is drawn outside the canvas.
        assert!(!s.contains("NaN") && !s.contains("inf"), "{s}");
    }

    #[test]
    fn ticks_are_round_numbers() {
        assert_eq!(nice_step(10.0, 6.0), 2.0);
        assert!((nice_step(0.3, 6.0) - 0.05).abs() < 1e-12);
        assert_eq!(number_label(0.25), "0.25");
        assert_eq!(number_label(20.0), "20");
        assert_eq!(number_label(1e6), "1e6");
    }
}
