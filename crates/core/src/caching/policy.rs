//! PyTorch's default caching policy: how requests are rounded, which pool serves them, how big a new
//! segment is, and when a found block is split.

use super::config::CachingConfig;

/// Every block is a multiple of this; requests below it round up to it.
pub const MIN_BLOCK_SIZE: usize = 512;
/// Requests up to this size are served from the small pool.
pub const SMALL_SIZE: usize = 1 << 20;
/// Segment size for small requests.
pub const SMALL_BUFFER: usize = 2 << 20;
/// Segment size for large requests below MIN_LARGE_ALLOC.
pub const LARGE_BUFFER: usize = 20 << 20;
/// Requests from this size on get a segment of their own size, rounded to ROUND_LARGE.
pub const MIN_LARGE_ALLOC: usize = 10 << 20;
/// Rounding of segments for requests of MIN_LARGE_ALLOC and more.
pub const ROUND_LARGE: usize = 2 << 20;

/// The two pools of cached blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    Small,
    Large,
}

impl PoolKind {
    /// The pool a rounded request size belongs to.
    #[inline]
    pub fn for_size(rounded: usize) -> PoolKind {
        if rounded <= SMALL_SIZE {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }
}

/// Round a request up to a block size (512 B multiples, or power-of-two divisions when configured).
/// None when the result would not fit in a usize.
#[inline]
pub fn round_size(size: usize, config: &CachingConfig) -> Option<usize> {
    if size < MIN_BLOCK_SIZE {
        return Some(MIN_BLOCK_SIZE);
    }
    let divisions = config.roundup_power2_divisions_for(size);
    if divisions > 1 && size > MIN_BLOCK_SIZE.saturating_mul(divisions) {
        return round_to_power2_division(size, divisions);
    }
    size.checked_next_multiple_of(MIN_BLOCK_SIZE)
}

/// Round up to the next of `divisions` equal steps between the powers of two around `size`.
fn round_to_power2_division(size: usize, divisions: usize) -> Option<usize> {
    if size.is_power_of_two() {
        return Some(size);
    }
    let floor = 1usize << (usize::BITS - 1 - size.leading_zeros());
    // divisions is a power of two, so this divides the interval [floor, 2 floor) evenly.
    let step = floor >> divisions.trailing_zeros();
    if step == 0 {
        return floor.checked_mul(2);
    }
    size.checked_next_multiple_of(step)
}

/// The size of the segment to ask the device for when no cached block fits a rounded request.
#[inline]
pub fn allocation_size(rounded: usize) -> Option<usize> {
    if rounded <= SMALL_SIZE {
        Some(SMALL_BUFFER)
    } else if rounded < MIN_LARGE_ALLOC {
        Some(LARGE_BUFFER)
    } else {
        rounded.checked_next_multiple_of(ROUND_LARGE)
    }
}

/// Whether a found block of `block_size` is cut to `rounded`, leaving the rest cached.
#[inline]
pub fn should_split(
    pool: PoolKind,
    block_size: usize,
    rounded: usize,
    config: &CachingConfig,
) -> bool {
    let remaining = block_size - rounded;
    if pool == PoolKind::Small || config.expandable_segments {
        remaining >= MIN_BLOCK_SIZE
    } else {
        rounded < config.max_split_size && remaining > SMALL_SIZE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_512_multiples() {
        let config = CachingConfig::default();
        assert_eq!(round_size(1, &config), Some(512));
        assert_eq!(round_size(512, &config), Some(512));
        assert_eq!(round_size(513, &config), Some(1024));
        assert_eq!(round_size(1000, &config), Some(1024));
        assert_eq!(round_size((1 << 20) + 1, &config), Some((1 << 20) + 512));
        assert_eq!(round_size(usize::MAX, &config), None);
    }

    #[test]
    fn segment_sizes_follow_the_three_bands() {
        assert_eq!(allocation_size(512), Some(2 << 20));
        assert_eq!(allocation_size(1 << 20), Some(2 << 20));
        assert_eq!(allocation_size((1 << 20) + 512), Some(20 << 20));
        assert_eq!(allocation_size((10 << 20) - 512), Some(20 << 20));
        assert_eq!(allocation_size(10 << 20), Some(10 << 20));
        assert_eq!(allocation_size((10 << 20) + 512), Some(12 << 20));
        assert_eq!(allocation_size(usize::MAX - 511), None);
    }

    #[test]
    fn power2_divisions_round_within_an_interval() {
        let config = CachingConfig {
            roundup_power2_divisions: [4; 16],
            ..CachingConfig::default()
        };
        // 1 MiB + 1 in [1 MiB, 2 MiB) with 4 divisions rounds to 1.25 MiB.
        assert_eq!(round_size((1 << 20) + 1, &config), Some(5 << 18));
        assert_eq!(
            round_size(1 << 20, &config),
            Some(1 << 20),
            "a power of two stays"
        );
        // At or below 512 x 4 the usual rounding applies.
        assert_eq!(round_size(2000, &config), Some(2048));
        assert_eq!(round_size(1500, &config), Some(1536));
    }

    #[test]
    fn split_rules_differ_by_pool() {
        let config = CachingConfig::default();
        assert!(should_split(
            PoolKind::Small,
            2 << 20,
            (2 << 20) - 512,
            &config
        ));
        assert!(!should_split(PoolKind::Small, 1024, 1024, &config));
        assert!(should_split(
            PoolKind::Large,
            20 << 20,
            (19 << 20) - 512,
            &config
        ));
        assert!(
            !should_split(PoolKind::Large, 20 << 20, 19 << 20, &config),
            "remainder must exceed 1 MiB"
        );
        let limited = CachingConfig {
            max_split_size: 20 << 20,
            ..CachingConfig::default()
        };
        assert!(
            !should_split(PoolKind::Large, 64 << 20, 20 << 20, &limited),
            "oversize never splits"
        );
    }
}
