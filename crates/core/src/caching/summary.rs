//! memory_summary(): PyTorch's 75-column table of the statistics, same rows, columns and number
//! formatting (sizes scaled to B/KiB/MiB/GiB/TiB/PiB, counts to K/M, sub-rows scaled like their row).

use super::stats::{DeviceStats, Stat, StatArray, StatType};

const WIDTH: usize = 75;

/// A size in 10 columns: scaled while the row's reference value is at least 768 units.
fn format_size(mut size: i64, mut reference: f64) -> String {
    let prefixes = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut prefix = prefixes[0];
    for next in &prefixes[1..] {
        if reference < 768.0 * 1024.0 {
            break;
        }
        prefix = next;
        size = size.div_euclid(1024);
        reference /= 1024.0;
    }
    format!("{size:6} {prefix}")
}

/// A count in 10 columns: scaled while the reference value is at least 750,000.
fn format_count(mut count: i64, mut reference: f64) -> String {
    let prefixes = [" ", "K", "M"];
    let mut prefix = prefixes[0];
    for next in &prefixes[1..] {
        if reference < 750.0 * 1000.0 {
            break;
        }
        prefix = next;
        count = count.div_euclid(1000);
        reference /= 1000.0;
    }
    format!("{count:7} {prefix} ")
}

type Formatter = fn(i64, f64) -> String;

fn row(name: &str, stat: &Stat, reference: &Stat, format: Formatter) -> String {
    format!(
        " {name:<21} | {} | {} | {} | {} ",
        format(stat.current, reference.current as f64),
        format(stat.peak, reference.peak as f64),
        format(stat.allocated, reference.allocated as f64),
        format(stat.freed, reference.freed as f64),
    )
}

fn pad(text: String) -> String {
    format!("{text:<WIDTH$}")
}

/// The summary table of one device. `name` heads it, e.g. "accalloc host". `paused` is the
/// device's paused memory (sleep and wake): its row, accalloc's own, shows only once something was
/// paused, so that the table is PyTorch's otherwise.
pub fn memory_summary(
    stats: &DeviceStats,
    paused: &Stat,
    device: usize,
    name: &str,
    abbreviated: bool,
) -> String {
    let pooled: [(&StatArray, &str, Formatter); 9] = [
        (&stats.allocated_bytes, "Allocated memory", format_size),
        (&stats.active_bytes, "Active memory", format_size),
        (&stats.requested_bytes, "Requested memory", format_size),
        (&stats.reserved_bytes, "Reserved memory", format_size),
        (
            &stats.inactive_split_bytes,
            "Non-releasable memory",
            format_size,
        ),
        (&stats.allocation, "Allocations", format_count),
        (&stats.active, "Active allocs", format_count),
        (&stats.segment, "Reserved segments", format_count),
        (&stats.inactive_split, "Non-releasable allocs", format_count),
    ];
    let mut lines = vec![
        "=".repeat(WIDTH),
        pad(format!(
            " {:16} {name} memory summary, device ID {device}",
            ""
        )),
        "-".repeat(WIDTH),
        pad(format!(
            "  {:9} OOMs: {:<12} | {:6} retries: {:<8}",
            "", stats.num_ooms, "", stats.num_alloc_retries
        )),
        "=".repeat(WIDTH),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];
    for (array, name, format) in pooled {
        lines.push("-".repeat(WIDTH));
        let all = &array[StatType::All as usize];
        lines.push(row(name, all, all, format));
        if !abbreviated {
            lines.push(row(
                "      from large pool",
                &array[StatType::LargePool as usize],
                all,
                format,
            ));
            lines.push(row(
                "      from small pool",
                &array[StatType::SmallPool as usize],
                all,
                format,
            ));
        }
    }
    for (stat, name) in [
        (&stats.oversize_allocations, "Oversize allocations"),
        (&stats.oversize_segments, "Oversize segments"),
    ] {
        lines.push("-".repeat(WIDTH));
        lines.push(row(name, stat, stat, format_count));
    }
    if paused.current > 0 || paused.allocated > 0 {
        lines.push("-".repeat(WIDTH));
        lines.push(row("Paused memory", paused, paused, format_size));
    }
    lines.push("=".repeat(WIDTH));
    format!("|{}|\n", lines.join("|\n|"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_scale_like_pytorchs() {
        assert_eq!(format_size(0, 0.0), "     0 B  ");
        assert_eq!(format_size(1024, 1024.0), "  1024 B  ");
        assert_eq!(format_size(786432, 786432.0), "   768 KiB");
        assert_eq!(format_size(2 << 20, 2.0 * 1048576.0), "  2048 KiB");
        // Sub-rows scale with their row's value, not their own.
        assert_eq!(format_size(1024, 3.0 * 1073741824.0), "     0 MiB");
        assert_eq!(format_size(3 << 30, 3.0 * 1073741824.0), "  3072 MiB");
        assert_eq!(format_count(749_999, 749_999.0), " 749999   ");
        assert_eq!(format_count(750_000, 750_000.0), "    750 K ");
    }

    #[test]
    fn table_has_pytorchs_shape() {
        let mut stats = DeviceStats::default();
        stats.allocated_bytes[0].increase(1024);
        stats.allocated_bytes[1].increase(1024);
        stats.allocation[0].increase(1);
        stats.num_ooms = 2;
        let none = Stat::default();
        let full = memory_summary(&stats, &none, 0, "accalloc host", false);
        let lines: Vec<&str> = full.lines().collect();
        assert!(
            lines.iter().all(|l| l.chars().count() == WIDTH + 2),
            "every line is |75 columns|"
        );
        assert_eq!(lines.len(), 6 + 9 * 4 + 2 * 2 + 1);
        assert_eq!(
            lines[1].trim_matches('|').trim(),
            "accalloc host memory summary, device ID 0"
        );
        assert!(lines[3].contains("OOMs: 2 ") && lines[3].contains("retries: 0 "));
        assert_eq!(
            lines[7],
            "| Allocated memory      |   1024 B   |   1024 B   |   1024 B   |      0 B   |"
        );
        assert_eq!(
            lines[9],
            "|       from small pool |   1024 B   |   1024 B   |   1024 B   |      0 B   |"
        );
        assert!(full.contains("| Oversize segments     |       0    |"));
        let short = memory_summary(&stats, &none, 3, "accalloc host", true);
        assert_eq!(short.lines().count(), 6 + 9 * 2 + 2 * 2 + 1);
        assert!(!short.contains("from large pool"));
        assert!(short.contains("device ID 3"));
        assert!(
            !full.contains("Paused"),
            "no row until something was paused"
        );
        // 40 MiB paused, 20 MiB of it resumed: accalloc's own row, in the table's shape.
        let mut paused = Stat::default();
        paused.increase(40 << 20);
        paused.decrease(20 << 20);
        let with = memory_summary(&stats, &paused, 0, "accalloc host", true);
        assert!(
            with.contains(
                "| Paused memory         |  20480 KiB |  40960 KiB |  40960 KiB |  20480 KiB |"
            ),
            "{with}"
        );
        assert_eq!(with.lines().count(), short.lines().count() + 2);
    }
}
