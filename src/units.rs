//! Byte sizes as people write them ("512MiB") and as PyTorch prints them ("2.00 GiB").

const KIB: u64 = 1024;

/// Format a byte count the way PyTorch's `format_size` does: "N bytes" up to 1024, then KiB, MiB or GiB
/// with two decimals (each unit used up to and including its own size).
pub fn format_size(size: u64) -> String {
    if size <= KIB {
        format!("{size} bytes")
    } else if size <= KIB * KIB {
        format!("{:.2} KiB", size as f64 / 1024.0)
    } else if size <= KIB * KIB * KIB {
        format!("{:.2} MiB", size as f64 / 1048576.0)
    } else {
        format!("{:.2} GiB", size as f64 / 1073741824.0)
    }
}

/// Parse "4096", "512MiB", "8GiB", "1.5GiB" or "64 KiB" into bytes. Units are binary (B, KiB, MiB, GiB,
/// TiB, case-insensitive; K/M/G/T and KB/MB/GB/TB are read as the same binary units).
pub fn parse_byte_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => KIB * KIB,
        "g" | "gb" | "gib" => KIB * KIB * KIB,
        "t" | "tb" | "tib" => KIB * KIB * KIB * KIB,
        _ => return None,
    };
    if number.is_empty() {
        return None;
    }
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier);
    }
    let value: f64 = number.parse().ok()?;
    let bytes = value * multiplier as f64;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_pytorch() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1025), "1.00 KiB");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(1 << 20), "1024.00 KiB");
        assert_eq!(format_size(20 << 20), "20.00 MiB");
        assert_eq!(format_size(1 << 30), "1024.00 MiB");
        assert_eq!(format_size(2 << 30), "2.00 GiB");
    }

    #[test]
    fn parses_sizes_with_units() {
        assert_eq!(parse_byte_size("4096"), Some(4096));
        assert_eq!(parse_byte_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_byte_size("8GiB"), Some(8 << 30));
        assert_eq!(parse_byte_size("8 gib"), Some(8 << 30));
        assert_eq!(parse_byte_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_byte_size("2T"), Some(2 << 40));
        assert_eq!(parse_byte_size("abc"), None);
        assert_eq!(parse_byte_size("12 parsecs"), None);
        assert_eq!(parse_byte_size(""), None);
        assert_eq!(parse_byte_size("-1"), None);
        assert_eq!(parse_byte_size("99999999999999999999"), None);
    }
}
