//! The memory timeline of a replay as an SVG picture: reserved and allocated bytes over the trace,
//! each stacked by pool (large pool below, small pool above).

use super::session::TimelinePoint;
use std::fmt::Write;

const WIDTH: f64 = 960.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 46.0;
/// Height of the plot itself.
const PLOT_H: f64 = 324.0;
/// Below the plot: the x ticks' labels, the x axis's title, then the legend's rows.
const BOTTOM: f64 = 46.0;
const LEGEND_ROW: f64 = 20.0;
/// At most this many columns are drawn; each shows the operation with the most reserved memory in it.
const MAX_COLUMNS: usize = 800;

/// One stacked layer: its colour, legend label and value per point.
struct Layer {
    colour: &'static str,
    label: &'static str,
    value: fn(&TimelinePoint) -> [i64; 2],
}

/// Render `points` (one per operation) as an SVG document.
pub fn timeline_svg(points: &[TimelinePoint], title: &str) -> String {
    let columns = downsample(points);
    let peak = columns
        .iter()
        .map(|(_, p)| p.reserved[0] + p.reserved[1])
        .max()
        .unwrap_or(0);
    let (mut svg, x, y) = frame(title, peak, points.len(), 1);
    let layers = [
        Layer {
            colour: "#c6dbef",
            label: "reserved, large pool",
            value: |p| [0, p.reserved[1]],
        },
        Layer {
            colour: "#fdd0a2",
            label: "reserved, small pool",
            value: |p| [p.reserved[1], p.reserved[0]],
        },
        Layer {
            colour: "#3182bd",
            label: "allocated, large pool",
            value: |p| [0, p.allocated[1]],
        },
        Layer {
            colour: "#e6550d",
            label: "allocated, small pool",
            value: |p| [p.allocated[1], p.allocated[0]],
        },
    ];
    for layer in &layers {
        // An area from base to base + value along the columns, closed back along the base.
        let mut upper = String::new();
        let mut lower = Vec::new();
        for (op, point) in &columns {
            let [base, value] = (layer.value)(point);
            let _ = write!(upper, "{:.1},{:.1} ", x(*op), y(base + value));
            lower.push(format!("{:.1},{:.1}", x(*op), y(base)));
        }
        lower.reverse();
        let _ = writeln!(
            svg,
            r#"<polygon fill="{}" stroke="none" points="{}{}"/>"#,
            layer.colour,
            upper,
            lower.join(" ")
        );
    }
    // Axes, x label and legend.
    axes(&mut svg, points.len(), &x);
    for (i, layer) in layers.iter().enumerate() {
        let lx = LEFT + i as f64 * 200.0;
        let ly = legend_y(0);
        let _ = writeln!(
            svg,
            r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
            ly - 10.0,
            layer.colour,
            lx + 16.0,
            layer.label
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Horizontal grid lines with their labels at 0, step, 2 step, ... ticks x step.
fn grid(svg: &mut String, step: i64, ticks: i64, y: &dyn Fn(i64) -> f64) {
    for tick in 0..=ticks {
        let value = step * tick;
        let ty = y(value);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            WIDTH - RIGHT,
            LEFT - 6.0,
            ty + 4.0,
            tick_label(value)
        );
    }
}

/// A round step for the y axis, a power of two of bytes (so 256 MiB, 512 MiB, 1 GiB, ...), and how
/// many steps reach `peak`: 5 to 8 (1 for an empty picture).
fn round_ticks(peak: i64) -> (i64, i64) {
    let peak = peak.max(1) as u64;
    let mut step = 1u64;
    while peak.div_ceil(step) > 8 {
        step *= 2;
    }
    (step as i64, peak.div_ceil(step) as i64)
}

/// A tick value in the largest binary unit that shows it exactly with at most two decimals:
/// "768 MiB", "1.25 GiB", "2 GiB".
fn tick_label(value: i64) -> String {
    let units = [
        (1i64 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (size, name) in units {
        if value >= size && (value * 100) % size == 0 {
            let text = format!("{:.2}", value as f64 / size as f64);
            return format!(
                "{} {name}",
                text.trim_end_matches('0').trim_end_matches('.')
            );
        }
    }
    if value == 0 {
        "0".to_string()
    } else {
        format!("{value} B")
    }
}

/// How the runs of a comparison are told apart: colour, dash pattern and width, the first (the
/// defaults, when compare compares one setting with them) widest and the others narrower and
/// dashed on top of it, so that where two runs coincide both stay visible.
const RUN_STYLES: [(&str, &str, f64); 8] = [
    ("#3182bd", "", 4.5),
    ("#e6550d", "10 5", 2.25),
    ("#31a354", "3 3", 1.75),
    ("#756bb1", "14 4 3 4", 1.5),
    ("#636363", "6 2", 1.25),
    ("#d6616b", "2 6", 1.25),
    ("#8c6d31", "18 4", 1.25),
    ("#17becf", "8 3 2 3 2 3", 1.25),
];

fn run_style(run: usize) -> (&'static str, &'static str, f64) {
    RUN_STYLES[run % RUN_STYLES.len()]
}

fn dash_attribute(dash: &str) -> String {
    if dash.is_empty() {
        String::new()
    } else {
        format!(r#" stroke-dasharray="{dash}""#)
    }
}

/// Two or more replays of one trace in one picture: each run's reserved memory as a line in the
/// run's colour, dash pattern and width (the first also shaded), its allocated memory as a thinner,
/// faded line of the same style; a legend row for each run.
pub fn comparison_svg(runs: &[(&str, &[TimelinePoint])], title: &str) -> String {
    let columns: Vec<Vec<(usize, TimelinePoint)>> =
        runs.iter().map(|(_, points)| downsample(points)).collect();
    let peak = columns
        .iter()
        .flatten()
        .map(|(_, p)| p.reserved[0] + p.reserved[1])
        .max()
        .unwrap_or(0);
    let operations = runs.iter().map(|(_, p)| p.len()).max().unwrap_or(0);
    let (mut svg, x, y) = frame(title, peak, operations, runs.len() + 1);
    let line = |points: &[(usize, TimelinePoint)], value: fn(&TimelinePoint) -> i64| -> String {
        points
            .iter()
            .map(|(op, p)| format!("{:.1},{:.1}", x(*op), y(value(p))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let reserved = |p: &TimelinePoint| p.reserved[0] + p.reserved[1];
    let allocated = |p: &TimelinePoint| p.allocated[0] + p.allocated[1];
    if let Some(points) = columns.first() {
        let _ = writeln!(
            svg,
            r#"<polygon fill="{}" fill-opacity="0.12" stroke="none" points="{} {:.1},{:.1} {:.1},{:.1}"/>"#,
            run_style(0).0,
            line(points, reserved),
            x(points.last().map_or(0, |(op, _)| *op)),
            y(0),
            x(0),
            y(0)
        );
    }
    // Allocated (faded) below reserved; within each, the first run at the bottom.
    for (run, points) in columns.iter().enumerate() {
        let (colour, dash, width) = run_style(run);
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-opacity="0.45" stroke-width="{:.2}"{} points="{}"/>"#,
            (width * 0.6).max(1.0),
            dash_attribute(dash),
            line(points, allocated)
        );
    }
    for (run, points) in columns.iter().enumerate() {
        let (colour, dash, width) = run_style(run);
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="{width:.2}"{} points="{}"/>"#,
            dash_attribute(dash),
            line(points, reserved)
        );
    }
    axes(&mut svg, operations, &x);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{:.1}">each setting: reserved memory as the full line, allocated memory as the faded line of the same style</text>"#,
        legend_y(0)
    );
    for (run, (label, _)) in runs.iter().enumerate() {
        let (colour, dash, width) = run_style(run);
        let ly = legend_y(run + 1);
        let label = if label.is_empty() {
            "(defaults)"
        } else {
            label
        };
        let _ = writeln!(
            svg,
            r#"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="{width:.2}"{}/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
            ly - 4.0,
            LEFT + 44.0,
            ly - 4.0,
            dash_attribute(dash),
            LEFT + 52.0,
            escape(label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Keep at most MAX_COLUMNS points: in each stretch, the one with the most reserved memory (so peaks
/// stay visible), plus the last point.
fn downsample(points: &[TimelinePoint]) -> Vec<(usize, TimelinePoint)> {
    if points.is_empty() {
        return vec![(0, TimelinePoint::default())];
    }
    let stride = points.len().div_ceil(MAX_COLUMNS);
    let mut columns: Vec<(usize, TimelinePoint)> = points
        .chunks(stride)
        .enumerate()
        .map(|(chunk, run)| {
            let (offset, point) = run
                .iter()
                .enumerate()
                .max_by_key(|(_, p)| p.reserved[0] + p.reserved[1])
                .expect("chunks are never empty");
            (chunk * stride + offset, *point)
        })
        .collect();
    let last = points.len() - 1;
    if columns.last().map(|(op, _)| *op) != Some(last) {
        columns.push((last, points[last]));
    }
    columns
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The baseline of legend row `row` (from 0), below the plot, the x ticks and the x axis's title.
fn legend_y(row: usize) -> f64 {
    TOP + PLOT_H + BOTTOM + 14.0 + row as f64 * LEGEND_ROW
}

/// The start of a timeline picture for `operations` operations and `peak` bytes, with room for
/// `legend_rows` rows of legend: the document with its title and the grid of round ticks; with the
/// x (operation) and y (bytes) scales.
fn frame(
    title: &str,
    peak: i64,
    operations: usize,
    legend_rows: usize,
) -> (String, impl Fn(usize) -> f64, impl Fn(i64) -> f64) {
    let (step, ticks) = round_ticks(peak);
    let top_value = (step * ticks) as f64;
    let plot_w = WIDTH - LEFT - RIGHT;
    let last = operations.saturating_sub(1).max(1) as f64;
    let x = move |op: usize| LEFT + op as f64 / last * plot_w;
    let y = move |bytes: i64| TOP + PLOT_H - bytes as f64 / top_value * PLOT_H;
    let height = legend_y(legend_rows.max(1) - 1) + 12.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="20" font-size="15" font-weight="bold">{}</text>
"#,
        escape(title)
    );
    grid(&mut svg, step, ticks, &y);
    // The x ticks' grid lines, under what is drawn next.
    for tick in operation_ticks(operations.saturating_sub(1)) {
        let _ = writeln!(
            svg,
            r##"<line x1="{tx:.1}" y1="{TOP}" x2="{tx:.1}" y2="{:.1}" stroke="#eee"/>"##,
            TOP + PLOT_H,
            tx = x(tick)
        );
    }
    (svg, x, y)
}

/// A round step for the x axis (1, 2, 2.5 or 5 times a power of ten operations) giving 5 to 8
/// ticks from 0 to `last` (fewer only when there are fewer than 5 operations), and the ticks.
fn operation_ticks(last: usize) -> Vec<usize> {
    let mut magnitude = 1usize;
    let step = loop {
        // Each step at most twice the one before, so the first with under 8 intervals has 4 or more.
        let steps = if magnitude >= 10 {
            [1, 2, 0, 5].map(|m| m * magnitude)
        } else {
            [1, 2, 4, 5]
        };
        let steps = steps.map(|step| if step == 0 { magnitude / 10 * 25 } else { step });
        if let Some(&step) = steps.iter().find(|&&step| last / step < 8) {
            break step;
        }
        magnitude *= 10;
    };
    (0..=last / step).map(|tick| tick * step).collect()
}

/// An operation count with thousands separators: "12,500".
fn with_separators(value: usize) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// The two axes, the x axis's round ticks and its title.
fn axes(svg: &mut String, operations: usize, x: &dyn Fn(usize) -> f64) {
    let bottom = TOP + PLOT_H;
    for tick in operation_ticks(operations.saturating_sub(1)) {
        let tx = x(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{tx:.1}" y1="{bottom:.1}" x2="{tx:.1}" y2="{:.1}" stroke="#333"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            bottom + 4.0,
            bottom + 17.0,
            with_separators(tick)
        );
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{bottom:.1}" x2="{:.1}" y2="{bottom:.1}" stroke="#333"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom:.1}" stroke="#333"/>"##,
        WIDTH - RIGHT,
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">operation ({} in all)</text>"#,
        LEFT + (WIDTH - LEFT - RIGHT) / 2.0,
        bottom + 34.0,
        with_separators(operations)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_four_layers_and_keeps_the_peak() {
        let mut points: Vec<TimelinePoint> = (0..5000)
            .map(|i| TimelinePoint {
                allocated: [i, 2 * i],
                reserved: [2 * i, 4 * i],
            })
            .collect();
        points[1234].reserved = [1 << 30, 1 << 30];
        let svg = timeline_svg(&points, "a <trace>");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polygon").count(), 4);
        assert!(svg.contains("a &lt;trace&gt;"));
        assert!(svg.contains(">2 GiB<"), "the top tick is the 2 GiB peak");
        let columns = downsample(&points);
        assert!(columns.len() <= MAX_COLUMNS + 1);
        assert!(columns.iter().any(|(op, _)| *op == 1234));
        assert_eq!(columns.last().unwrap().0, 4999);
    }

    #[test]
    fn ticks_are_round() {
        let (mib, gib) = (1i64 << 20, 1i64 << 30);
        assert_eq!(round_ticks(2 * gib), (256 * mib, 8));
        assert_eq!(
            round_ticks(2_860_841_988),
            (512 * mib, 6),
            "2.66 GiB: up to 3 GiB"
        );
        assert_eq!(round_ticks(1000), (128, 8));
        assert_eq!(round_ticks(0), (1, 1));
        assert_eq!(tick_label(768 * mib), "768 MiB");
        assert_eq!(tick_label(1280 * mib), "1.25 GiB");
        assert_eq!(tick_label(3 * gib), "3 GiB");
        assert_eq!(tick_label(0), "0");
        assert_eq!(tick_label(384), "384 B");
    }

    #[test]
    fn two_runs_in_one_picture() {
        let a: Vec<TimelinePoint> = (0..10)
            .map(|i| TimelinePoint {
                allocated: [0, i],
                reserved: [0, 2 * i],
            })
            .collect();
        let b: Vec<TimelinePoint> = (0..10)
            .map(|i| TimelinePoint {
                allocated: [0, i],
                reserved: [0, i + 1],
            })
            .collect();
        let svg = comparison_svg(&[("", &a), ("expandable_segments:True", &b)], "t");
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("(defaults)") && svg.contains("expandable_segments:True"));
        assert!(svg.ends_with("</svg>\n"));
        // The runs differ in width and dash pattern, the first (the defaults) widest and solid,
        // underneath the second: where they coincide both show.
        let reserved: Vec<&str> = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && !l.contains("stroke-opacity"))
            .collect();
        assert_eq!(reserved.len(), 2);
        assert!(
            reserved[0].contains(r#"stroke-width="4.50""#) && !reserved[0].contains("dasharray")
        );
        assert!(
            reserved[1].contains(r#"stroke-width="2.25""#)
                && reserved[1].contains(r#"stroke-dasharray="10 5""#)
        );
        // A legend row with a line sample in each run's style.
        assert_eq!(
            svg.matches(r#"stroke-dasharray="10 5"/><text"#).count(),
            1,
            "{svg}"
        );
        // 10 operations: ticks 0, 2, 4, 6, 8.
        for tick in ["0", "2", "4", "6", "8"] {
            assert!(
                svg.contains(&format!(r#"text-anchor="middle">{tick}</text>"#)),
                "{tick}"
            );
        }
    }

    #[test]
    fn the_x_axis_has_five_to_eight_round_ticks() {
        for last in 4..200_000usize {
            let ticks = operation_ticks(last);
            assert!((5..=8).contains(&ticks.len()), "{last}: {ticks:?}");
            assert_eq!(ticks[0], 0);
            assert!(*ticks.last().unwrap() <= last);
            let step = ticks[1];
            let magnitude = 10usize.pow(step.ilog10());
            assert!(
                [1, 2, 4, 5].contains(&step) || [10, 20, 25, 50].contains(&(step * 10 / magnitude)),
                "{last}: step {step}"
            );
        }
        assert_eq!(operation_ticks(0), vec![0]);
        assert_eq!(
            operation_ticks(49_794),
            vec![0, 10_000, 20_000, 30_000, 40_000]
        );
        assert_eq!(with_separators(1_234_567), "1,234,567");
        assert_eq!(with_separators(500), "500");
        let svg = timeline_svg(&vec![TimelinePoint::default(); 3001], "t");
        assert!(svg.contains(">2,500</text>"), "{svg}");
        assert!(svg.contains(">operation (3,001 in all)</text>"), "{svg}");
    }
}
