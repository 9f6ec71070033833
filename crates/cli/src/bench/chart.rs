//! A small SVG chart of `baton bench herd` results: waiters on a log axis,
//! notifications per handover and handovers per second for each recipe.

use std::fmt::Write;

use super::herd_run::{Recipe, Run};

const W: f64 = 460.0;
const H: f64 = 320.0;
const MARGIN: f64 = 60.0;

fn color(recipe: Recipe) -> &'static str {
    match recipe {
        Recipe::Predecessor => "#1b7837",
        Recipe::WatchAll => "#c51b7d",
        Recipe::Poll => "#2166ac",
        Recipe::Rwlock => "#e08214",
        Recipe::Semaphore => "#542788",
    }
}

fn name(recipe: Recipe) -> &'static str {
    recipe.name()
}

/// Two panels side by side, both with log-scaled axes.
pub fn herd_svg(runs: &[Run]) -> String {
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="12">"#,
        2.0 * W,
        H + 40.0
    );
    svg.push_str(r#"<rect width="100%" height="100%" fill="white"/>"#);
    panel(
        &mut svg,
        runs,
        0.0,
        "watch notifications per handover",
        |r| r.notifications_per_handover,
    );
    let _ = write!(
        svg,
        r##"<text x="{}" y="40" text-anchor="middle" fill="#666">(zero, as for poll, is not drawn on a log axis)</text>"##,
        W / 2.0
    );
    panel(&mut svg, runs, W, "handovers per second", |r| {
        r.handovers_per_s
    });
    // Legend.
    let mut x = MARGIN;
    for recipe in [Recipe::Predecessor, Recipe::WatchAll, Recipe::Poll] {
        if runs.iter().any(|r| r.recipe == recipe) {
            let _ = write!(
                svg,
                r#"<rect x="{x}" y="{}" width="14" height="4" fill="{}"/><text x="{}" y="{}">{}</text>"#,
                H + 20.0,
                color(recipe),
                x + 20.0,
                H + 26.0,
                name(recipe)
            );
            x += 140.0;
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for v in values.filter(|v| *v > 0.0) {
        lo = lo.min(v.log10().floor());
        hi = hi.max(v.log10().ceil());
    }
    if lo > hi {
        (0.0, 1.0)
    } else if lo == hi {
        (lo, hi + 1.0)
    } else {
        (lo, hi)
    }
}

fn panel(svg: &mut String, runs: &[Run], left: f64, title: &str, value: impl Fn(&Run) -> f64) {
    let (x_lo, x_hi) = log_range(runs.iter().map(|r| r.waiters as f64));
    let (y_lo, y_hi) = log_range(runs.iter().map(&value));
    let plot_w = W - 2.0 * MARGIN;
    let plot_h = H - 2.0 * MARGIN;
    let x_of = |v: f64| left + MARGIN + (v.max(1e-9).log10() - x_lo) / (x_hi - x_lo) * plot_w;
    let y_of = |v: f64| MARGIN + plot_h - (v.max(1e-9).log10() - y_lo) / (y_hi - y_lo) * plot_h;
    let _ = write!(
        svg,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="14">{title}</text>"#,
        left + W / 2.0
    );
    let _ = write!(
        svg,
        r##"<rect x="{}" y="{MARGIN}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>"##,
        left + MARGIN
    );
    for e in x_lo as i32..=x_hi as i32 {
        let x = x_of(10f64.powi(e));
        let _ = write!(
            svg,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            MARGIN,
            MARGIN + plot_h,
            MARGIN + plot_h + 16.0,
            10u64.pow(e.max(0) as u32)
        );
    }
    for e in y_lo as i32..=y_hi as i32 {
        let y = y_of(10f64.powi(e));
        let label = if e >= 0 {
            format!("{}", 10u64.pow(e as u32))
        } else {
            format!("1e{e}")
        };
        let _ = write!(
            svg,
            r##"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{label}</text>"##,
            left + MARGIN,
            left + MARGIN + plot_w,
            left + MARGIN - 6.0,
            y + 4.0
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">waiters</text>"#,
        left + W / 2.0,
        H - 12.0
    );
    for recipe in [Recipe::Predecessor, Recipe::WatchAll, Recipe::Poll] {
        let mut points: Vec<(f64, f64)> = runs
            .iter()
            .filter(|r| r.recipe == recipe && value(r) > 0.0)
            .map(|r| (x_of(r.waiters as f64), y_of(value(r))))
            .collect();
        if points.is_empty() {
            continue;
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = write!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
            path.join(" "),
            color(recipe)
        );
        for (x, y) in points {
            let _ = write!(
                svg,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{}"/>"#,
                color(recipe)
            );
        }
    }
}
