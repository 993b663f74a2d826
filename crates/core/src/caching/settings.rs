//! The allocator configuration string, in PYTORCH_ALLOC_CONF's syntax: `key:value,key:[a:b,c:d]`.
//!
//! As in PyTorch, each parse starts again from the defaults for max_split_size_mb,
//! roundup_power2_divisions and garbage_collection_threshold, while the other keys keep the value they
//! had unless named. Errors name the key, the value and what is allowed; on error nothing changes.

use super::config::{CachingConfig, ROUNDUP_POWER2_INTERVALS};
use crate::error::{bounded, quote, Error, Result};

/// Every key accalloc understands (release_lock_on_cudamalloc is PyTorch's name for
/// release_lock_on_malloc and is accepted too; the expandable_trim keys and planned_placement are
/// accalloc's own; the pinned_ keys are the pinned host allocator's).
pub const KNOWN_KEYS: [&str; 16] = [
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "expandable_segments",
    "expandable_trim",
    "expandable_trim_slack",
    "expandable_trim_floor_mb",
    "planned_placement",
    "release_lock_on_malloc",
    "release_lock_on_cudamalloc",
    "per_process_memory_fraction",
    "backend",
    "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb",
    "pinned_use_background_threads",
];

const MIB: usize = 1 << 20;
/// The smallest max_split_size_mb and max_non_split_rounding_mb: the large segment size, in MiB.
const MIN_SPLIT_MB: usize = 20;

/// Split a configuration string into tokens: `,` `:` `[` `]` stand alone, spaces are dropped.
fn tokenize(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        match c {
            ',' | ':' | '[' | ']' => {
                if !word.is_empty() {
                    tokens.push(std::mem::take(&mut word));
                }
                tokens.push(c.to_string());
            }
            c if c.is_whitespace() => {}
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    tokens
}

struct Parser<'a> {
    tokens: Vec<String>,
    at: usize,
    text: &'a str,
}

impl Parser<'_> {
    fn next(&mut self) -> Option<&str> {
        let token = self.tokens.get(self.at).map(String::as_str);
        self.at += 1;
        token
    }

    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.at).map(String::as_str)
    }

    fn malformed(&self, what: &str) -> Error {
        Error::config(format!(
            "malformed allocator settings {}: {what} (the form is key:value,key:value, with \
             roundup_power2_divisions also taking [MiB:divisions,...,>:divisions])",
            quote(self.text)
        ))
    }

    fn expect(&mut self, token: &str, after: &str) -> Result<()> {
        match self.next() {
            Some(t) if t == token => Ok(()),
            Some(t) => {
                let t = t.to_string();
                Err(self.malformed(&format!(
                    "expected '{token}' after {}, found {}",
                    quote(after),
                    quote(&t)
                )))
            }
            None => Err(self.malformed(&format!(
                "expected '{token}' after {}, found the end",
                quote(after)
            ))),
        }
    }

    /// The value token of `key` (after its ':').
    fn value(&mut self, key: &str) -> Result<String> {
        match self.next() {
            Some(v) if ![",", ":", "[", "]"].contains(&v) => Ok(v.to_string()),
            _ => Err(self.malformed(&format!("missing value for {key}"))),
        }
    }
}

fn invalid(key: &str, value: &str, allowed: &str) -> Error {
    Error::config(format!(
        "invalid allocator setting {}:{}: {allowed}",
        bounded(key),
        bounded(value)
    ))
}

fn parse_mb(key: &str, value: &str) -> Result<usize> {
    let allowed = format!("{key} must be a whole number of MiB >= {MIN_SPLIT_MB}");
    let mb: usize = value.parse().map_err(|_| invalid(key, value, &allowed))?;
    if mb < MIN_SPLIT_MB {
        return Err(invalid(key, value, &allowed));
    }
    // Large values saturate, as in PyTorch.
    Ok(mb.min(usize::MAX / MIB) * MIB)
}

/// A limit in whole MiB, 0 included; a value too large for the address space means no limit
/// (usize::MAX, the default, which the settings string then leaves out).
fn parse_limit_mb(key: &str, value: &str) -> Result<usize> {
    let bytes = parse_whole_mb(key, value)?;
    Ok(if bytes >= usize::MAX / MIB * MIB {
        usize::MAX
    } else {
        bytes
    })
}

/// A whole number of MiB, 0 included (large values saturate).
fn parse_whole_mb(key: &str, value: &str) -> Result<usize> {
    let allowed = format!("{key} must be a whole number of MiB");
    let mb: usize = value.parse().map_err(|_| invalid(key, value, &allowed))?;
    Ok(mb.min(usize::MAX / MIB) * MIB)
}

fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(invalid(key, value, &format!("{key} must be True or False"))),
    }
}

fn parse_fraction(key: &str, value: &str, open: bool) -> Result<f64> {
    let allowed = if open {
        format!("{key} must be a number in (0, 1), both ends excluded")
    } else {
        format!("{key} must be a number in [0, 1]")
    };
    let number: f64 = value.parse().map_err(|_| invalid(key, value, &allowed))?;
    let fits = if open {
        number > 0.0 && number < 1.0
    } else {
        (0.0..=1.0).contains(&number)
    };
    if fits {
        Ok(number)
    } else {
        Err(invalid(key, value, &allowed))
    }
}

/// The most divisions of one interval: steps of the widest interval the table names (from 32 GiB)
/// are then 512 bytes, the block granularity; more divisions could not make any step smaller.
pub const MAX_DIVISIONS: usize = 1 << 26;

fn parse_divisions(key: &str, value: &str, zero_allowed: bool) -> Result<usize> {
    let allowed = if zero_allowed {
        format!(
            "{key} divisions must be a power of two from 1 to {MAX_DIVISIONS}, or 0 to turn \
             rounding off"
        )
    } else {
        format!(
            "{key} must be a power of two from 1 to {MAX_DIVISIONS}, or a list such as \
             [64:8,256:4,>:1]"
        )
    };
    match value.parse::<usize>() {
        Ok(0) if zero_allowed => Ok(0),
        Ok(d) if d.is_power_of_two() && d <= MAX_DIVISIONS => Ok(d),
        _ => Err(invalid(key, value, &allowed)),
    }
}

/// roundup_power2_divisions after its ':': a single power of two, or the interval list.
fn parse_roundup(parser: &mut Parser, key: &str) -> Result<[usize; ROUNDUP_POWER2_INTERVALS]> {
    let mut buckets = [0usize; ROUNDUP_POWER2_INTERVALS];
    if parser.peek() != Some("[") {
        let value = parser.value(key)?;
        buckets.fill(parse_divisions(key, &value, false)?);
        return Ok(buckets);
    }
    parser.next();
    let mut first = true;
    let mut last_bucket = 0usize;
    loop {
        let boundary = match parser.next() {
            Some("]") => break,
            Some(t) if ![",", ":", "["].contains(&t) => t.to_string(),
            _ => return Err(parser.malformed("expected MiB:divisions or >:divisions inside [...]")),
        };
        parser.expect(":", &boundary)?;
        let divisions_text = parser.value(key)?;
        let divisions = parse_divisions(key, &divisions_text, true)?;
        if boundary == ">" {
            buckets[(last_bucket + 1).min(ROUNDUP_POWER2_INTERVALS)..].fill(divisions);
        } else {
            let mb = match boundary.parse::<usize>() {
                Ok(mb) if mb.is_power_of_two() => mb,
                _ => {
                    return Err(invalid(
                        key,
                        &format!("[{boundary}:{divisions_text}]"),
                        &format!("{key} interval starts must be powers of two (in MiB) or '>'"),
                    ))
                }
            };
            let bucket = (mb.trailing_zeros() as usize).min(ROUNDUP_POWER2_INTERVALS - 1);
            if first {
                buckets[..bucket].fill(divisions);
                first = false;
            }
            buckets[bucket] = divisions;
            last_bucket = bucket;
        }
        match parser.next() {
            Some(",") => {}
            Some("]") => break,
            _ => {
                return Err(
                    parser.malformed("expected ',' or ']' in the roundup_power2_divisions list")
                )
            }
        }
    }
    Ok(buckets)
}

/// Apply `text` on top of `current`, returning the new settings; `current` is untouched on error.
pub fn parse_settings(text: &str, current: &CachingConfig) -> Result<CachingConfig> {
    let defaults = CachingConfig::default();
    let mut config = CachingConfig {
        max_split_size: defaults.max_split_size,
        roundup_power2_divisions: defaults.roundup_power2_divisions,
        garbage_collection_threshold: defaults.garbage_collection_threshold,
        ..current.clone()
    };
    let mut parser = Parser {
        tokens: tokenize(text),
        at: 0,
        text,
    };
    while let Some(key) = parser.next().map(str::to_string) {
        if !KNOWN_KEYS.contains(&key.as_str()) {
            if [",", ":", "[", "]"].contains(&key.as_str()) {
                return Err(parser.malformed(&format!("expected a key, found {}", quote(&key))));
            }
            return Err(Error::config(format!(
                "unrecognized key {} in allocator settings; known keys: {}",
                quote(&key),
                KNOWN_KEYS.join(", ")
            )));
        }
        parser.expect(":", &key)?;
        match key.as_str() {
            "roundup_power2_divisions" => {
                config.roundup_power2_divisions = parse_roundup(&mut parser, &key)?
            }
            _ => {
                let value = parser.value(&key)?;
                match key.as_str() {
                    "max_split_size_mb" => config.max_split_size = parse_mb(&key, &value)?,
                    "max_non_split_rounding_mb" => {
                        config.max_non_split_rounding = parse_mb(&key, &value)?
                    }
                    "garbage_collection_threshold" => {
                        config.garbage_collection_threshold = parse_fraction(&key, &value, true)?
                    }
                    "expandable_segments" => config.expandable_segments = parse_bool(&key, &value)?,
                    "expandable_trim" => config.expandable_trim = parse_bool(&key, &value)?,
                    "expandable_trim_slack" => {
                        config.expandable_trim_slack = parse_fraction(&key, &value, false)?
                    }
                    "expandable_trim_floor_mb" => {
                        config.expandable_trim_floor = parse_whole_mb(&key, &value)?
                    }
                    "planned_placement" => config.planned_placement = parse_bool(&key, &value)?,
                    "release_lock_on_malloc" | "release_lock_on_cudamalloc" => {
                        config.release_lock_on_malloc = parse_bool(&key, &value)?
                    }
                    "per_process_memory_fraction" => {
                        config.per_process_memory_fraction =
                            Some(parse_fraction(&key, &value, false)?)
                    }
                    "pinned_max_round_threshold_mb" => {
                        config.pinned_max_round_threshold = parse_limit_mb(&key, &value)?
                    }
                    "pinned_max_cached_size_mb" => {
                        config.pinned_max_cached_size = parse_limit_mb(&key, &value)?
                    }
                    "pinned_use_background_threads" => {
                        config.pinned_use_background_threads = parse_bool(&key, &value)?
                    }
                    "backend" => {
                        if value != "native" {
                            return Err(invalid(
                                &key,
                                &value,
                                "backend must be native: accalloc's caching allocator is the only policy",
                            ));
                        }
                    }
                    _ => unreachable!("every known key is handled"),
                }
            }
        }
        match parser.next() {
            None => break,
            Some(",") => {}
            Some(other) => {
                let other = other.to_string();
                return Err(parser.malformed(&format!(
                    "expected ',' after the value of {key}, found {}",
                    quote(&other)
                )));
            }
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<CachingConfig> {
        parse_settings(text, &CachingConfig::default())
    }

    #[test]
    fn the_pinned_keys_set_their_fields_and_print_back() {
        let c = parse(
            "pinned_max_round_threshold_mb:2,pinned_max_cached_size_mb:0,\
             pinned_use_background_threads:True",
        )
        .unwrap();
        assert_eq!(c.pinned_max_round_threshold, 2 << 20);
        assert_eq!(c.pinned_max_cached_size, 0, "0: no pinned block is cached");
        assert!(c.pinned_use_background_threads);
        let text = c.to_settings_string();
        assert_eq!(
            text,
            "pinned_max_round_threshold_mb:2,pinned_max_cached_size_mb:0,pinned_use_background_threads:True"
        );
        assert_eq!(parse(&text).unwrap(), c);
        assert!(parse("pinned_max_cached_size_mb:-1").is_err());
        let unlimited = parse("pinned_max_cached_size_mb:99999999999999999").unwrap();
        assert_eq!(
            unlimited.pinned_max_cached_size,
            usize::MAX,
            "as large as memory: no limit"
        );
        assert_eq!(unlimited.to_settings_string(), "");
        assert!(parse("pinned_use_background_threads:yes").is_err());
    }

    #[test]
    fn every_key_sets_its_field() {
        let c = parse(
            "max_split_size_mb:64, max_non_split_rounding_mb:40,garbage_collection_threshold:0.6,\
             expandable_segments:True,release_lock_on_cudamalloc:True,per_process_memory_fraction:0.5,\
             backend:native,roundup_power2_divisions:4",
        )
        .unwrap();
        assert_eq!(c.max_split_size, 64 << 20);
        assert_eq!(c.max_non_split_rounding, 40 << 20);
        assert_eq!(c.garbage_collection_threshold, 0.6);
        assert!(c.expandable_segments && c.release_lock_on_malloc);
        assert_eq!(c.per_process_memory_fraction, Some(0.5));
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
        assert!(
            parse("release_lock_on_malloc:True")
                .unwrap()
                .release_lock_on_malloc
        );
        assert_eq!(parse("").unwrap(), CachingConfig::default());
    }

    #[test]
    fn the_trim_line_keys_set_the_slack_and_the_floor_and_print_back() {
        let c = parse(
            "expandable_segments:True,expandable_trim:True,expandable_trim_slack:0.1,\
             expandable_trim_floor_mb:8",
        )
        .unwrap();
        assert!(c.expandable_trim);
        assert_eq!(
            (c.expandable_trim_slack, c.expandable_trim_floor),
            (0.1, 8 << 20)
        );
        assert_eq!(parse(&c.to_settings_string()).unwrap(), c);
        let zero = parse("expandable_trim_slack:0,expandable_trim_floor_mb:0").unwrap();
        assert_eq!(
            (zero.expandable_trim_slack, zero.expandable_trim_floor),
            (0.0, 0)
        );
        let e = parse("expandable_trim_slack:1.5").unwrap_err();
        assert!(
            e.message
                .contains("expandable_trim_slack must be a number in [0, 1]"),
            "{}",
            e.message
        );
        let e = parse("expandable_trim_floor_mb:-1").unwrap_err();
        assert!(e.message.contains("a whole number of MiB"), "{}", e.message);
    }

    #[test]
    fn roundup_list_sets_intervals_like_pytorch() {
        let c = parse("roundup_power2_divisions:[64:8,256:4,>:1]").unwrap();
        let mut expected = [0usize; 16];
        expected[..=6].fill(8); // the first entry also sets every bucket below 64 MiB
        expected[7] = 0; // 128 MiB: between named entries
        expected[8] = 4; // 256 MiB
        expected[9..].fill(1);
        assert_eq!(c.roundup_power2_divisions, expected);
        let c = parse("roundup_power2_divisions:[1:2,2:0]").unwrap();
        assert_eq!(&c.roundup_power2_divisions[..3], &[2, 0, 0]);
    }

    #[test]
    fn some_keys_reset_on_every_parse_and_others_persist() {
        let first =
            parse("max_split_size_mb:100,expandable_segments:True,roundup_power2_divisions:2")
                .unwrap();
        let second = parse_settings("garbage_collection_threshold:0.5", &first).unwrap();
        assert_eq!(
            second.max_split_size,
            usize::MAX,
            "max_split_size_mb resets"
        );
        assert_eq!(second.roundup_power2_divisions, [0; 16], "roundup resets");
        assert!(second.expandable_segments, "expandable_segments persists");
        let third = parse_settings("max_split_size_mb:100", &second).unwrap();
        assert_eq!(
            third.garbage_collection_threshold, 0.0,
            "gc threshold resets"
        );
    }

    #[test]
    fn bad_strings_give_exact_messages() {
        let cases = [
            ("max_split_size_mb:10", "invalid allocator setting max_split_size_mb:10: max_split_size_mb must be a whole number of MiB >= 20"),
            ("max_split_size_mb:abc", "invalid allocator setting max_split_size_mb:abc: max_split_size_mb must be a whole number of MiB >= 20"),
            ("max_non_split_rounding_mb:-5", "invalid allocator setting max_non_split_rounding_mb:-5: max_non_split_rounding_mb must be a whole number of MiB >= 20"),
            ("garbage_collection_threshold:1.0", "invalid allocator setting garbage_collection_threshold:1.0: garbage_collection_threshold must be a number in (0, 1), both ends excluded"),
            ("garbage_collection_threshold:0", "invalid allocator setting garbage_collection_threshold:0: garbage_collection_threshold must be a number in (0, 1), both ends excluded"),
            ("expandable_segments:true", "invalid allocator setting expandable_segments:true: expandable_segments must be True or False"),
            ("release_lock_on_malloc:1", "invalid allocator setting release_lock_on_malloc:1: release_lock_on_malloc must be True or False"),
            ("per_process_memory_fraction:1.5", "invalid allocator setting per_process_memory_fraction:1.5: per_process_memory_fraction must be a number in [0, 1]"),
            ("roundup_power2_divisions:3", "invalid allocator setting roundup_power2_divisions:3: roundup_power2_divisions must be a power of two from 1 to 67108864, or a list such as [64:8,256:4,>:1]"),
            ("roundup_power2_divisions:[64:3]", "invalid allocator setting roundup_power2_divisions:3: roundup_power2_divisions divisions must be a power of two from 1 to 67108864, or 0 to turn rounding off"),
            ("roundup_power2_divisions:9223372036854775808", "invalid allocator setting roundup_power2_divisions:9223372036854775808: roundup_power2_divisions must be a power of two from 1 to 67108864, or a list such as [64:8,256:4,>:1]"),
            ("roundup_power2_divisions:[>:134217728]", "invalid allocator setting roundup_power2_divisions:134217728: roundup_power2_divisions divisions must be a power of two from 1 to 67108864, or 0 to turn rounding off"),
            ("roundup_power2_divisions:[100:4]", "invalid allocator setting roundup_power2_divisions:[100:4]: roundup_power2_divisions interval starts must be powers of two (in MiB) or '>'"),
            ("backend:cudaMallocAsync", "invalid allocator setting backend:cudaMallocAsync: backend must be native: accalloc's caching allocator is the only policy"),
            ("max_split_size:64", "unrecognized key 'max_split_size' in allocator settings; known keys: max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, garbage_collection_threshold, expandable_segments, expandable_trim, expandable_trim_slack, expandable_trim_floor_mb, planned_placement, release_lock_on_malloc, release_lock_on_cudamalloc, per_process_memory_fraction, backend, pinned_max_round_threshold_mb, pinned_max_cached_size_mb, pinned_use_background_threads"),
            ("max_split_size_mb", "malformed allocator settings 'max_split_size_mb': expected ':' after 'max_split_size_mb', found the end (the form is key:value,key:value, with roundup_power2_divisions also taking [MiB:divisions,...,>:divisions])"),
            ("max_split_size_mb:", "malformed allocator settings 'max_split_size_mb:': missing value for max_split_size_mb (the form is key:value,key:value, with roundup_power2_divisions also taking [MiB:divisions,...,>:divisions])"),
            ("expandable_segments:True;max_split_size_mb:64", "invalid allocator setting expandable_segments:True;max_split_size_mb: expandable_segments must be True or False"),
            ("expandable_segments:True:False", "malformed allocator settings 'expandable_segments:True:False': expected ',' after the value of expandable_segments, found ':' (the form is key:value,key:value, with roundup_power2_divisions also taking [MiB:divisions,...,>:divisions])"),
            (",max_split_size_mb:64", "malformed allocator settings ',max_split_size_mb:64': expected a key, found ',' (the form is key:value,key:value, with roundup_power2_divisions also taking [MiB:divisions,...,>:divisions])"),
            ("roundup_power2_divisions:[64:8", "malformed allocator settings 'roundup_power2_divisions:[64:8': expected ',' or ']' in the roundup_power2_divisions list (the form is key:value,key:value, with roundup_power2_divisions also taking [MiB:divisions,...,>:divisions])"),
        ];
        for (text, message) in cases {
            let err = parse(text).unwrap_err();
            assert_eq!(err.kind, crate::error::ErrorKind::Config, "{text}");
            assert_eq!(err.message, message, "for {text}");
        }
    }
}
