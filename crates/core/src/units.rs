//! Byte sizes as people write them ("512MiB") and as PyTorch prints them ("2.00 GiB").
//!
//! The one rule for sizes people write (ACCALLOC_HOST_CAPACITY, `accalloc tune --capacity`, ...): a
//! bare number is bytes; a unit is binary: B, KiB, MiB, GiB, TiB (any case), and K, M, G, T are the
//! same binary units. KB, MB, GB and TB are refused: a reader cannot tell whether they mean powers
//! of 1000 or of 1024, and 8GB taken as 8 GiB is half a gigabyte more than 8,000,000,000 bytes.

const KIB: u64 = 1024;

/// The forms a size may take, for messages.
pub const SIZE_FORMS: &str =
    "bytes (85899345920) or a number with a binary unit: B, KiB, MiB, GiB, TiB (K, M, G, T are the \
     same binary units)";

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

/// A size as written: how many bytes, and whether a unit was written (a bare number is bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize {
    pub bytes: u64,
    pub unit_given: bool,
}

/// Parse "4096", "512MiB", "8GiB", "1.5GiB", "2T" or "64 KiB" under the rule above; the error says
/// what is wrong with `text` and which forms are accepted.
pub fn parse_size(text: &str) -> Result<ByteSize, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let unit = unit.trim();
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => KIB * KIB,
        "g" | "gib" => KIB * KIB * KIB,
        "t" | "tib" => KIB * KIB * KIB * KIB,
        decimal @ ("kb" | "mb" | "gb" | "tb") => {
            let binary = format!("{}iB", decimal[..1].to_ascii_uppercase());
            return Err(format!(
                "'{trimmed}' is ambiguous: {unit} may mean a power of 1000 or of 1024; write \
                 {number}{binary} (binary) or the bytes in full"
            ));
        }
        _ => return Err(format!("'{trimmed}' is not a size: give {SIZE_FORMS}")),
    };
    let not_a_number = || format!("'{trimmed}' is not a size: give {SIZE_FORMS}");
    if number.is_empty() {
        return Err(not_a_number());
    }
    let bytes = if let Ok(whole) = number.parse::<u64>() {
        whole
            .checked_mul(multiplier)
            .ok_or_else(|| format!("'{trimmed}' is too large"))?
    } else {
        let value: f64 = number.parse().map_err(|_| not_a_number())?;
        let bytes = value * multiplier as f64;
        if !(bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64) {
            return Err(format!("'{trimmed}' is too large"));
        }
        bytes as u64
    };
    Ok(ByteSize {
        bytes,
        unit_given: !unit.is_empty(),
    })
}

/// Parse a size under the rule above (see `parse_size`); None for anything else, including the
/// ambiguous decimal units KB, MB, GB and TB.
pub fn parse_byte_size(text: &str) -> Option<u64> {
    parse_size(text).ok().map(|size| size.bytes)
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

    #[test]
    fn decimal_units_are_refused_as_ambiguous() {
        for text in ["8GB", "8gb", "512 MB", "64KB", "1TB", "1.5GB"] {
            assert_eq!(parse_byte_size(text), None, "{text}");
            let why = parse_size(text).unwrap_err();
            assert!(why.contains("ambiguous"), "{text}: {why}");
        }
        let why = parse_size("8GB").unwrap_err();
        assert!(why.contains("write 8GiB"), "{why}");
        assert!(parse_size("512 MB").unwrap_err().contains("write 512MiB"));
        // The single letters stay binary, as documented.
        assert_eq!(parse_byte_size("8G"), Some(8 << 30));
        assert_eq!(parse_byte_size("64k"), Some(64 << 10));
    }

    #[test]
    fn tells_whether_a_unit_was_written() {
        assert_eq!(
            parse_size("80"),
            Ok(ByteSize {
                bytes: 80,
                unit_given: false
            })
        );
        assert_eq!(
            parse_size("80B"),
            Ok(ByteSize {
                bytes: 80,
                unit_given: true
            })
        );
        assert!(parse_size("80GiB").unwrap().unit_given);
        let why = parse_size("lots").unwrap_err();
        assert!(why.contains("KiB, MiB, GiB, TiB"), "{why}");
    }
}
