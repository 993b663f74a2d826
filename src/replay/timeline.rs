//! The memory timeline of a replay as an SVG picture: reserved and allocated bytes over the trace,
//! each stacked by pool (large pool below, small pool above).

use super::session::TimelinePoint;
use std::fmt::Write;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 46.0;
const BOTTOM: f64 = 50.0;
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
    let (mut svg, plot_h, x, y) = frame(title, peak, points.len());
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
    axes(&mut svg, plot_h, &format!("{} operations", points.len()));
    for (i, layer) in layers.iter().enumerate() {
        let lx = LEFT + i as f64 * 200.0;
        let ly = HEIGHT - 14.0;
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

/// Two or more replays of one trace in one picture: each run's reserved memory as a line (the first
/// also shaded) and its allocated memory as a dashed line, in the run's colour.
pub fn comparison_svg(runs: &[(&str, &[TimelinePoint])], title: &str) -> String {
    const COLOURS: [&str; 4] = ["#3182bd", "#e6550d", "#31a354", "#756bb1"];
    let columns: Vec<Vec<(usize, TimelinePoint)>> =
        runs.iter().map(|(_, points)| downsample(points)).collect();
    let peak = columns
        .iter()
        .flatten()
        .map(|(_, p)| p.reserved[0] + p.reserved[1])
        .max()
        .unwrap_or(0);
    let operations = runs.iter().map(|(_, p)| p.len()).max().unwrap_or(0);
    let (mut svg, plot_h, x, y) = frame(title, peak, operations);
    for (run, points) in columns.iter().enumerate() {
        let colour = COLOURS[run % COLOURS.len()];
        let line = |value: fn(&TimelinePoint) -> i64| -> String {
            points
                .iter()
                .map(|(op, p)| format!("{:.1},{:.1}", x(*op), y(value(p))))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let reserved = line(|p| p.reserved[0] + p.reserved[1]);
        if run == 0 {
            let _ = writeln!(
                svg,
                r#"<polygon fill="{colour}" fill-opacity="0.15" stroke="none" points="{reserved} {:.1},{:.1} {:.1},{:.1}"/>"#,
                x(points.last().map_or(0, |(op, _)| *op)),
                y(0),
                x(0),
                y(0)
            );
        }
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{reserved}"/>"#
        );
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1" stroke-dasharray="4 3" points="{}"/>"#,
            line(|p| p.allocated[0] + p.allocated[1])
        );
    }
    axes(
        &mut svg,
        plot_h,
        &format!("{operations} operations; solid: reserved, dashed: allocated"),
    );
    for (run, (label, _)) in runs.iter().enumerate() {
        let lx = LEFT + run as f64 * 420.0;
        let ly = HEIGHT - 14.0;
        let label = if label.is_empty() {
            "(defaults)"
        } else {
            label
        };
        let _ = writeln!(
            svg,
            r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
            ly - 10.0,
            COLOURS[run % COLOURS.len()],
            lx + 16.0,
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

/// The start of a timeline picture for `operations` operations and `peak` bytes: the document with
/// its title and the grid of round ticks; with the plot's height and the x (operation) and y (bytes)
/// scales.
fn frame(
    title: &str,
    peak: i64,
    operations: usize,
) -> (String, f64, impl Fn(usize) -> f64, impl Fn(i64) -> f64) {
    let (step, ticks) = round_ticks(peak);
    let top_value = (step * ticks) as f64;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let last = operations.saturating_sub(1).max(1) as f64;
    let x = move |op: usize| LEFT + op as f64 / last * plot_w;
    let y = move |bytes: i64| TOP + plot_h - bytes as f64 / top_value * plot_h;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="20" font-size="15" font-weight="bold">{}</text>
"#,
        escape(title)
    );
    grid(&mut svg, step, ticks, &y);
    (svg, plot_h, x, y)
}

/// The two axes and the x axis's labels: 0 at the origin, `x_label` at the right end.
fn axes(svg: &mut String, plot_h: f64, x_label: &str) {
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="#333"/>"##,
        TOP + plot_h,
        WIDTH - RIGHT,
        TOP + plot_h,
        TOP + plot_h
    );
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{:.1}">0</text><text x="{:.1}" y="{:.1}" text-anchor="end">{x_label}</text>"#,
        TOP + plot_h + 16.0,
        WIDTH - RIGHT,
        TOP + plot_h + 16.0,
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
    }
}
