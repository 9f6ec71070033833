//! A picture of a chaos run: one HTML page with an SVG timeline, a lane
//! per worker with its operations (green applied, grey failed, orange
//! unknown, red in a violation), the faults and leaders above them, and
//! the findings below.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write;

use baton_chaos::history::{History, Outcome};
use baton_chaos::{Finding, Verdict};

const WIDTH: f64 = 1600.0;
const LANE: f64 = 14.0;
const LEFT: f64 = 90.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The page for `history` and its `findings`.
pub fn html(history: &History, findings: &[Finding], title: &str) -> String {
    let end = history
        .ops
        .iter()
        .map(|op| op.completed_ns)
        .chain(history.faults.iter().map(|f| f.at_ns))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let x = |ns: u64| LEFT + (ns as f64 / end) * (WIDTH - LEFT - 10.0);
    let lanes: BTreeMap<u64, usize> = {
        let mut processes: Vec<u64> = history.ops.iter().map(|op| op.process).collect();
        processes.sort_unstable();
        processes.dedup();
        processes
            .into_iter()
            .enumerate()
            .map(|(i, p)| (p, i))
            .collect()
    };
    let bad: HashSet<u64> = findings
        .iter()
        .filter(|f| f.verdict == Verdict::Violation)
        .flat_map(|f| f.ops.iter().copied())
        .collect();
    let faults_height = 18.0 * 3.0;
    let top = faults_height + 20.0;
    let height = top + LANE * lanes.len() as f64 + 30.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="monospace" font-size="10">"#
    );
    // Seconds along the top.
    let seconds = (end / 1e9).ceil() as u64;
    let step = (seconds / 20).max(1);
    for s in (0..=seconds).step_by(step as usize) {
        let at = x(s * 1_000_000_000);
        let _ = write!(
            svg,
            r##"<line x1="{at:.1}" y1="10" x2="{at:.1}" y2="{height}" stroke="#eee"/><text x="{at:.1}" y="9">{s}s</text>"##
        );
    }
    // Faults and leaders: a tick and a label each, in three rows.
    for (i, fault) in history.faults.iter().enumerate() {
        let at = x(fault.at_ns);
        let row = 20.0 + 18.0 * (i % 3) as f64;
        let colour = if fault.what.contains("leads") {
            "#2a6"
        } else if fault.what.starts_with("heal")
            || fault.what.contains("resume member")
            || fault.what.contains("restart member")
        {
            "#68a"
        } else {
            "#c40"
        };
        let _ = write!(
            svg,
            r#"<line x1="{at:.1}" y1="{row}" x2="{at:.1}" y2="{height}" stroke="{colour}" stroke-opacity="0.25"/><circle cx="{at:.1}" cy="{row}" r="3" fill="{colour}"><title>{:.3} s: {}</title></circle>"#,
            fault.at_ns as f64 / 1e9,
            escape(&fault.what)
        );
    }
    for (process, lane) in &lanes {
        let y = top + LANE * *lane as f64;
        let _ = write!(
            svg,
            r#"<text x="2" y="{:.1}">worker {process}</text>"#,
            y + 10.0
        );
    }
    for op in &history.ops {
        let y = top + LANE * lanes[&op.process] as f64 + 2.0;
        let (x0, x1) = (x(op.invoked_ns), x(op.completed_ns));
        let colour = if bad.contains(&op.id) {
            "#d00"
        } else {
            match op.outcome {
                Outcome::Ok { .. } => "#3a3",
                Outcome::Fail { .. } => "#aaa",
                Outcome::Unknown { .. } => "#e90",
            }
        };
        let _ = write!(
            svg,
            r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{}" fill="{colour}"><title>op {} {} {:?} {:?}</title></rect>"#,
            (x1 - x0).max(1.0),
            LANE - 4.0,
            op.id,
            escape(&op.key),
            op.call,
            op.outcome
        );
    }
    svg.push_str("</svg>");
    let mut page = String::new();
    let _ = write!(
        page,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{}</title></head><body style=\"font-family:sans-serif\"><h1>{}</h1><p>{} operations, {} faults and events. Green: applied; grey: failed; orange: outcome unknown; red: part of a violation. Hover for details.</p>{svg}<h2>Findings</h2><ul>",
        escape(title),
        escape(title),
        history.ops.len(),
        history.faults.len()
    );
    if findings.is_empty() {
        page.push_str("<li>none: every promise held</li>");
    }
    for f in findings {
        let _ = write!(
            page,
            "<li><b>{:?}</b> {} {}: {} (operations {:?})</li>",
            f.verdict,
            escape(&f.checker),
            escape(&f.key),
            escape(&f.detail),
            f.ops
        );
    }
    page.push_str("</ul></body></html>\n");
    page
}
