//! The settings of the caching policy. Defaults reproduce PyTorch's allocator exactly.

/// Number of size intervals for roundup_power2_divisions (1 MiB .. 64 GiB, one per power of two).
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;

/// expandable_trim_slack's default (see docs/PERFORMANCE.md: the frontier of the real traces).
pub const DEFAULT_TRIM_SLACK: f64 = 0.05;

/// Policy settings of one caching allocator.
#[derive(Clone, Debug, PartialEq)]
pub struct CachingConfig {
    /// Blocks of this size or more are never split ("oversize"); usize::MAX means unset.
    pub max_split_size: usize,
    /// A request >= max_split_size may take a cached block at most this much larger.
    pub max_non_split_rounding: usize,
    /// Divisions per power-of-two interval; 0 or 1 keeps 512-byte rounding.
    pub roundup_power2_divisions: [usize; ROUNDUP_POWER2_INTERVALS],
    /// Fraction of the allowed memory above which cached blocks are garbage-collected (0 = off).
    pub garbage_collection_threshold: f64,
    /// Grow segments in place over reserved address ranges.
    pub expandable_segments: bool,
    /// accalloc's own refinement of expandable segments: 2 MiB pages in both pools; a segment grows
    /// where the fewest new pages are needed, and free pages are unmapped only when a growth would
    /// take reserved memory past the line (the most ever allocated plus expandable_trim_slack of
    /// it), so that peak reserved memory stays close to peak allocated memory.
    pub expandable_trim: bool,
    /// The trim line, as a fraction of the most ever allocated that reserved memory may exceed it
    /// by (expandable_trim): lower holds reserved memory closer to the peak for more device calls.
    pub expandable_trim_slack: f64,
    /// The least the trim line lets reserved memory exceed the most ever allocated by, in bytes
    /// (0 by default: a fixed floor makes a small job reserve more than plain expandable segments).
    pub expandable_trim_floor: usize,
    /// accalloc's own planned placement (issue 33): the allocator learns the step of a training
    /// loop (the requests that repeat, in order) and serves each request of the next steps at an
    /// offset planned for the whole step, in the large pool's expandable segment, so that reserved
    /// memory approaches the most ever allocated. Implies expandable segments with 2 MiB pages;
    /// requests off the plan are served by the rest of the policy.
    pub planned_placement: bool,
    /// Drop the device lock around slow backend allocations.
    pub release_lock_on_malloc: bool,
    /// A memory fraction applied to every device when the settings are applied (None: unchanged).
    pub per_process_memory_fraction: Option<f64>,
    /// Pinned host memory (crate::pinned): requests above this many bytes are not rounded up to a
    /// power of two (usize::MAX: every request is; pinned_max_round_threshold_mb).
    pub pinned_max_round_threshold: usize,
    /// Pinned blocks above this many bytes go back to the backend when freed instead of being
    /// cached, and their requests are not rounded (usize::MAX: all are cached;
    /// pinned_max_cached_size_mb).
    pub pinned_max_cached_size: usize,
    /// PyTorch processes pinned blocks' events on a thread of their own with this; accalloc
    /// processes them at every pinned allocation and empty either way, so it is accepted for
    /// PYTORCH_ALLOC_CONF's sake and reported back, and changes no figure.
    pub pinned_use_background_threads: bool,
}

impl Default for CachingConfig {
    fn default() -> Self {
        CachingConfig {
            max_split_size: usize::MAX,
            max_non_split_rounding: 20 << 20,
            roundup_power2_divisions: [0; ROUNDUP_POWER2_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            expandable_trim: false,
            expandable_trim_slack: DEFAULT_TRIM_SLACK,
            expandable_trim_floor: 0,
            planned_placement: false,
            release_lock_on_malloc: false,
            per_process_memory_fraction: None,
            pinned_max_round_threshold: usize::MAX,
            pinned_max_cached_size: usize::MAX,
            pinned_use_background_threads: false,
        }
    }
}

impl CachingConfig {
    /// The configured divisions for the interval holding `size` (bucket = floor(log2 size) - 20,
    /// clamped to 0..15).
    #[inline]
    pub fn roundup_power2_divisions_for(&self, size: usize) -> usize {
        let log2 = (usize::BITS - 1 - size.leading_zeros()) as usize;
        let bucket = log2.saturating_sub(20).min(ROUNDUP_POWER2_INTERVALS - 1);
        self.roundup_power2_divisions[bucket]
    }

    /// The settings as a configuration string that parses back to them (keys at their defaults are
    /// left out, so the default configuration is "").
    pub fn to_settings_string(&self) -> String {
        let defaults = CachingConfig::default();
        let mut parts = Vec::new();
        if self.max_split_size != defaults.max_split_size {
            parts.push(format!("max_split_size_mb:{}", self.max_split_size >> 20));
        }
        if self.max_non_split_rounding != defaults.max_non_split_rounding {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding >> 20
            ));
        }
        if self.roundup_power2_divisions != defaults.roundup_power2_divisions {
            let buckets: Vec<String> = self
                .roundup_power2_divisions
                .iter()
                .enumerate()
                .map(|(bucket, divisions)| format!("{}:{divisions}", 1usize << bucket))
                .collect();
            parts.push(format!("roundup_power2_divisions:[{}]", buckets.join(",")));
        }
        if self.garbage_collection_threshold != defaults.garbage_collection_threshold {
            parts.push(format!(
                "garbage_collection_threshold:{}",
                self.garbage_collection_threshold
            ));
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".into());
        }
        if self.expandable_trim {
            parts.push("expandable_trim:True".into());
        }
        if self.expandable_trim_slack != defaults.expandable_trim_slack {
            parts.push(format!(
                "expandable_trim_slack:{}",
                self.expandable_trim_slack
            ));
        }
        if self.expandable_trim_floor != defaults.expandable_trim_floor {
            parts.push(format!(
                "expandable_trim_floor_mb:{}",
                self.expandable_trim_floor >> 20
            ));
        }
        if self.planned_placement {
            parts.push("planned_placement:True".into());
        }
        if self.release_lock_on_malloc {
            parts.push("release_lock_on_malloc:True".into());
        }
        if let Some(fraction) = self.per_process_memory_fraction {
            parts.push(format!("per_process_memory_fraction:{fraction}"));
        }
        if self.pinned_max_round_threshold != defaults.pinned_max_round_threshold {
            parts.push(format!(
                "pinned_max_round_threshold_mb:{}",
                self.pinned_max_round_threshold >> 20
            ));
        }
        if self.pinned_max_cached_size != defaults.pinned_max_cached_size {
            parts.push(format!(
                "pinned_max_cached_size_mb:{}",
                self.pinned_max_cached_size >> 20
            ));
        }
        if self.pinned_use_background_threads {
            parts.push("pinned_use_background_threads:True".into());
        }
        parts.join(",")
    }

    /// max_split_size as memory_stats reports it: -1 when unset.
    pub fn max_split_size_stat(&self) -> i64 {
        if self.max_split_size == usize::MAX {
            -1
        } else {
            self.max_split_size as i64
        }
    }
}
