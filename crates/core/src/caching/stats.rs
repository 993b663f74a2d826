//! PyTorch's DeviceStats: the counters, how they move, and their flat key names.

use super::policy::PoolKind;

/// One statistic: current value, peak since the last peak reset, and totals added and removed since
/// the last accumulated reset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    #[inline]
    pub fn increase(&mut self, amount: u64) {
        self.current += amount as i64;
        // Written only when it moves: in a steady state it does not, and every store in the device
        // lock's critical section is one more the next lock acquisition waits to drain.
        if self.current > self.peak {
            self.peak = self.current;
        }
        // The running totals pass i64::MAX only after 8 EiB have gone through (a backend reporting
        // exabytes): they wrap then, which costs nothing here and never panics, where saturating
        // would cost a check on every update of the hot path.
        self.allocated = self.allocated.wrapping_add(amount as i64);
    }

    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        self.current -= amount as i64;
        debug_assert!(self.current >= 0, "statistic went negative");
        self.freed = self.freed.wrapping_add(amount as i64);
    }

    /// reset_accumulated_memory_stats: the running totals start again from 0.
    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }

    /// reset_peak_memory_stats: the peak becomes the current value.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// Which pool a statistic slot describes: index 0 aggregates the other two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatType {
    All = 0,
    SmallPool = 1,
    LargePool = 2,
}

/// Names of the pool slots, in index order.
pub const STAT_TYPE_NAMES: [&str; 3] = ["all", "small_pool", "large_pool"];

/// A statistic kept for all / small pool / large pool.
pub type StatArray = [Stat; 3];

/// Defines DeviceStats from the one table of its statistics (below), and with it the lists of their
/// names (POOLED_FAMILIES, SINGLE_FAMILIES, SCALARS), so that the struct and the names cannot differ.
macro_rules! device_stats_table {
    (
        $(#[$meta:meta])*
        pub struct DeviceStats {
            pooled { $( $(#[$pooled_meta:meta])* $pooled:ident, )* }
            single { $( $(#[$single_meta:meta])* $single:ident, )* }
            scalars { $( $(#[$scalar_meta:meta])* $scalar:ident, )* }
        }
    ) => {
        $(#[$meta])*
        pub struct DeviceStats {
            $( $(#[$pooled_meta])* pub $pooled: StatArray, )*
            $( $(#[$single_meta])* pub $single: Stat, )*
            $( $(#[$scalar_meta])* pub $scalar: i64, )*
        }

        /// The families kept for each pool slot (all, small pool, large pool), in field order.
        pub const POOLED_FAMILIES: &[&str] = &[$(stringify!($pooled)),*];
        /// The families kept as one Stat, in field order (after the pooled ones).
        pub const SINGLE_FAMILIES: &[&str] = &[$(stringify!($single)),*];
        /// The plain counters and settings, one i64 each, in field order (after the single families).
        pub const SCALARS: &[&str] = &[$(stringify!($scalar)),*];

        impl DeviceStats {
            fn pooled(&self, family: &str) -> Option<&StatArray> {
                match family {
                    $( stringify!($pooled) => Some(&self.$pooled), )*
                    _ => None,
                }
            }

            fn single(&self, family: &str) -> Option<&Stat> {
                match family {
                    $( stringify!($single) => Some(&self.$single), )*
                    _ => None,
                }
            }

            fn scalar(&self, name: &str) -> Option<i64> {
                match name {
                    $( stringify!($scalar) => Some(self.$scalar), )*
                    _ => None,
                }
            }

            /// Every statistic with its flat key, in field order (pooled families slot by slot, then
            /// the single families, then the scalars; each Stat as current, peak, allocated, freed):
            /// the order of the values in memory of a C struct laid out like this one.
            pub fn entries_mut(&mut self) -> Vec<(String, &mut i64)> {
                let mut out: Vec<(String, &mut i64)> = Vec::with_capacity(FLAT_KEY_COUNT);
                $(
                    for (pool, stat) in STAT_TYPE_NAMES.iter().zip(self.$pooled.iter_mut()) {
                        for (field, value) in stat.fields_mut() {
                            out.push((format!("{}.{pool}.{field}", stringify!($pooled)), value));
                        }
                    }
                )*
                $(
                    for (field, value) in self.$single.fields_mut() {
                        out.push((format!("{}.{field}", stringify!($single)), value));
                    }
                )*
                $( out.push((stringify!($scalar).to_string(), &mut self.$scalar)); )*
                out
            }
        }
    };
}

device_stats_table! {
    /// Every statistic PyTorch's caching allocator keeps for one device. This table is the one list
    /// of the statistics: the C struct AccallocDeviceStats, the Python package's ctypes mirror (read
    /// from the header), and the lists of the tests and of scripts/pytorch_model.py are checked
    /// against it (tests/stats_table.rs).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct DeviceStats {
        pooled {
            allocation,
            segment,
            active,
            inactive_split,
            allocated_bytes,
            reserved_bytes,
            active_bytes,
            inactive_split_bytes,
            requested_bytes,
        }
        single {
            oversize_allocations,
            oversize_segments,
        }
        scalars {
            num_alloc_retries,
            num_ooms,
            num_sync_all_streams,
            num_device_alloc,
            num_device_free,
            /// The configured max_split_size in bytes; -1 when unset (PyTorch stores SIZE_MAX in an
            /// int64).
            max_split_size,
        }
    }
}

/// One statistic of the allocator's books, kept per pool: the "all" slot is the sum of the small- and
/// large-pool slots, so a change writes one slot instead of two, and `freed` is derived from the
/// others instead of counted. Every figure it reports equals what PyTorch's pair of updates
/// (all, then the pool) would give: the all slot's current, allocated and freed are sums by
/// construction, and its peak is followed at every increase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PooledStat {
    /// Small pool, large pool.
    current: [i64; 2],
    /// Added since the last accumulated reset (wrapping past 8 EiB, as Stat's totals do).
    allocated: [i64; 2],
    /// `current` at the last accumulated reset: freed = allocated - (current - base).
    base: [i64; 2],
    /// All, small pool, large pool.
    peak: [i64; 3],
}

impl PooledStat {
    #[inline(always)]
    pub fn increase(&mut self, pool: PoolKind, amount: u64) {
        let slot = pool as usize;
        let current = self.current[slot] + amount as i64;
        self.current[slot] = current;
        self.allocated[slot] = self.allocated[slot].wrapping_add(amount as i64);
        // Peaks are stored only when they move (see Stat::increase).
        if current > self.peak[slot + 1] {
            self.peak[slot + 1] = current;
        }
        let all = self.current[0] + self.current[1];
        if all > self.peak[0] {
            self.peak[0] = all;
        }
    }

    #[inline(always)]
    pub fn decrease(&mut self, pool: PoolKind, amount: u64) {
        let slot = pool as usize;
        self.current[slot] -= amount as i64;
        debug_assert!(self.current[slot] >= 0, "statistic went negative");
    }

    /// Move by a signed amount (an increase when positive).
    #[inline(always)]
    pub fn add(&mut self, pool: PoolKind, amount: i64) {
        if amount > 0 {
            self.increase(pool, amount as u64);
        } else if amount < 0 {
            self.decrease(pool, amount.unsigned_abs());
        }
    }

    /// The current value of one pool's slot.
    #[inline]
    pub fn current(&self, pool: PoolKind) -> i64 {
        self.current[pool as usize]
    }

    /// The all slot's current value.
    #[inline]
    pub fn current_all(&self) -> i64 {
        self.current[0] + self.current[1]
    }

    /// The all slot's peak.
    #[inline]
    pub fn peak_all(&self) -> i64 {
        self.peak[0]
    }

    /// The three slots (all, small pool, large pool) as PyTorch reports them.
    pub fn slots(&self) -> StatArray {
        let pool = |slot: usize| {
            let current = self.current[slot];
            Stat {
                current,
                peak: self.peak[slot + 1],
                allocated: self.allocated[slot],
                freed: self.allocated[slot]
                    .wrapping_sub(current)
                    .wrapping_add(self.base[slot]),
            }
        };
        let (small, large) = (pool(0), pool(1));
        let all = Stat {
            current: small.current + large.current,
            peak: self.peak[0],
            allocated: small.allocated.wrapping_add(large.allocated),
            freed: small.freed.wrapping_add(large.freed),
        };
        [all, small, large]
    }

    pub(crate) fn reset_accumulated(&mut self) {
        self.allocated = [0; 2];
        self.base = self.current;
    }

    pub(crate) fn reset_peak(&mut self) {
        self.peak = [self.current_all(), self.current[0], self.current[1]];
    }
}

/// The statistics as the allocator keeps them while it runs (pooled families as PooledStat);
/// `to_device_stats` gives PyTorch's DeviceStats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveStats {
    pub allocation: PooledStat,
    pub segment: PooledStat,
    pub active: PooledStat,
    pub inactive_split: PooledStat,
    pub allocated_bytes: PooledStat,
    pub reserved_bytes: PooledStat,
    pub active_bytes: PooledStat,
    pub inactive_split_bytes: PooledStat,
    pub requested_bytes: PooledStat,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub num_sync_all_streams: i64,
    pub num_device_alloc: i64,
    pub num_device_free: i64,
}

impl LiveStats {
    /// PyTorch's DeviceStats, with the configured max_split_size (-1 when unset).
    pub fn to_device_stats(&self, max_split_size: i64) -> DeviceStats {
        DeviceStats {
            allocation: self.allocation.slots(),
            segment: self.segment.slots(),
            active: self.active.slots(),
            inactive_split: self.inactive_split.slots(),
            allocated_bytes: self.allocated_bytes.slots(),
            reserved_bytes: self.reserved_bytes.slots(),
            active_bytes: self.active_bytes.slots(),
            inactive_split_bytes: self.inactive_split_bytes.slots(),
            requested_bytes: self.requested_bytes.slots(),
            oversize_allocations: self.oversize_allocations,
            oversize_segments: self.oversize_segments,
            num_alloc_retries: self.num_alloc_retries,
            num_ooms: self.num_ooms,
            num_sync_all_streams: self.num_sync_all_streams,
            num_device_alloc: self.num_device_alloc,
            num_device_free: self.num_device_free,
            max_split_size,
        }
    }

    /// reset_accumulated_memory_stats: zero `allocated` and `freed` everywhere and the five counters.
    pub fn reset_accumulated(&mut self) {
        for family in self.pooled_mut() {
            family.reset_accumulated();
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// reset_peak_memory_stats: every peak becomes the current value.
    pub fn reset_peak(&mut self) {
        for family in self.pooled_mut() {
            family.reset_peak();
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    fn pooled_mut(&mut self) -> [&mut PooledStat; POOLED_FAMILIES.len()] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }
}

/// The fields of a Stat, in field order.
pub const STAT_FIELDS: [&str; 4] = ["current", "peak", "allocated", "freed"];

/// How many flat keys memory_stats() has (PyTorch's 122).
pub const FLAT_KEY_COUNT: usize = POOLED_FAMILIES.len() * STAT_TYPE_NAMES.len() * STAT_FIELDS.len()
    + SINGLE_FAMILIES.len() * STAT_FIELDS.len()
    + SCALARS.len();

impl Stat {
    /// The four fields with their names, in field order (STAT_FIELDS).
    pub fn fields(&self) -> [(&'static str, i64); 4] {
        let [current, peak, allocated, freed] = STAT_FIELDS;
        [
            (current, self.current),
            (peak, self.peak),
            (allocated, self.allocated),
            (freed, self.freed),
        ]
    }

    /// The four fields with their names, in field order (STAT_FIELDS), to write.
    pub fn fields_mut(&mut self) -> [(&'static str, &mut i64); 4] {
        let [current, peak, allocated, freed] = STAT_FIELDS;
        [
            (current, &mut self.current),
            (peak, &mut self.peak),
            (allocated, &mut self.allocated),
            (freed, &mut self.freed),
        ]
    }
}

impl DeviceStats {
    /// Look up one flat key of memory_stats(), e.g. "allocated_bytes.all.current".
    pub fn get(&self, key: &str) -> Option<i64> {
        let mut parts = key.split('.');
        let (first, second, third) = (parts.next()?, parts.next(), parts.next());
        if parts.next().is_some() {
            return None;
        }
        match (second, third) {
            (None, None) => self.scalar(first),
            (Some(field), None) => field_of(self.single(first)?, field),
            (Some(pool), Some(field)) => {
                let slot = STAT_TYPE_NAMES.iter().position(|&n| n == pool)?;
                field_of(&self.pooled(first)?[slot], field)
            }
            (None, Some(_)) => None,
        }
    }

    /// Every statistic with its flat key, in field order (see entries_mut).
    pub fn entries(&self) -> Vec<(String, i64)> {
        let mut copy = *self;
        copy.entries_mut()
            .into_iter()
            .map(|(key, value)| (key, *value))
            .collect()
    }

    /// Every flat key with its value, sorted by key, as PyTorch's memory_stats() returns them.
    pub fn flat(&self) -> Vec<(String, i64)> {
        let mut out = self.entries();
        out.sort();
        out
    }

    /// All flat keys as one JSON object, keys sorted.
    pub fn to_json(&self) -> String {
        let mut json = String::with_capacity(FLAT_KEY_COUNT * 48);
        json.push('{');
        for (i, (key, value)) in self.flat().iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push_str(&format!("\"{key}\":{value}"));
        }
        json.push('}');
        json
    }
}

fn field_of(stat: &Stat, field: &str) -> Option<i64> {
    stat.fields()
        .into_iter()
        .find(|&(name, _)| name == field)
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PyTorch's update of a statistic: `f` on the "all" slot and on the pool's slot.
    #[inline]
    fn for_pool(array: &mut StatArray, pool: StatType, f: impl Fn(&mut Stat)) {
        f(&mut array[StatType::All as usize]);
        f(&mut array[pool as usize]);
    }

    #[test]
    fn stat_moves_as_pytorch_stat() {
        let mut stat = Stat::default();
        stat.increase(10);
        stat.increase(5);
        stat.decrease(12);
        assert_eq!(
            stat,
            Stat {
                current: 3,
                peak: 15,
                allocated: 15,
                freed: 12
            }
        );
        stat.reset_peak();
        assert_eq!(stat.peak, 3);
        stat.reset_accumulated();
        assert_eq!(
            stat,
            Stat {
                current: 3,
                peak: 3,
                allocated: 0,
                freed: 0
            }
        );
    }

    #[test]
    fn pooled_stat_reports_what_pytorchs_two_updates_give() {
        // PyTorch updates the all slot and the pool's slot alike; PooledStat keeps only the pools
        // and derives the rest. The same moves must give the same twelve figures at every step.
        let mut pooled = PooledStat::default();
        let mut pair: StatArray = Default::default();
        let moves: [(PoolKind, i64); 9] = [
            (PoolKind::Small, 512),
            (PoolKind::Large, 20 << 20),
            (PoolKind::Small, -512),
            (PoolKind::Small, 4096),
            (PoolKind::Large, -(20 << 20)),
            (PoolKind::Large, 2 << 20),
            (PoolKind::Small, 1024),
            (PoolKind::Small, -5120),
            (PoolKind::Large, -(2 << 20)),
        ];
        for (step, &(pool, amount)) in moves.iter().enumerate() {
            pooled.add(pool, amount);
            let slot = match pool {
                PoolKind::Small => StatType::SmallPool,
                PoolKind::Large => StatType::LargePool,
            };
            for_pool(&mut pair, slot, |s| {
                if amount > 0 {
                    s.increase(amount as u64)
                } else {
                    s.decrease(amount.unsigned_abs())
                }
            });
            assert_eq!(pooled.slots(), pair, "after move {step}");
            if step == 3 {
                pooled.reset_accumulated();
                pair.iter_mut().for_each(Stat::reset_accumulated);
                assert_eq!(pooled.slots(), pair, "after the accumulated reset");
            }
            if step == 5 {
                pooled.reset_peak();
                pair.iter_mut().for_each(Stat::reset_peak);
                assert_eq!(pooled.slots(), pair, "after the peak reset");
            }
        }
        // Worked by hand: the all slot peaked at 512 + 20 MiB (step 1); after the peak reset at
        // step 5 (current 4096 + 2 MiB) the small pool rose to 5120.
        let [all, small, large] = pooled.slots();
        assert_eq!((all.current, small.current, large.current), (0, 0, 0));
        assert_eq!(all.peak, 4096 + (2 << 20) + 1024);
        assert_eq!(small.peak, 5120);
        assert_eq!(small.allocated, 1024);
        assert_eq!(small.freed, 5120);
    }

    /// Every statistic a different value (its place in field order, plus one).
    fn numbered() -> DeviceStats {
        let mut stats = DeviceStats::default();
        for (i, (_, value)) in stats.entries_mut().into_iter().enumerate() {
            *value = i as i64 + 1;
        }
        stats
    }

    #[test]
    fn the_table_reaches_every_field_once() {
        let stats = numbered();
        let entries = stats.entries();
        assert_eq!(entries.len(), 122, "PyTorch's memory_stats() has 122 keys");
        assert_eq!(FLAT_KEY_COUNT, 122);
        // Each field written once: every value 1..=122 is there, so none was written twice.
        let values: Vec<i64> = entries.iter().map(|&(_, v)| v).collect();
        assert_eq!(values, (1..=122).collect::<Vec<_>>());
        assert_eq!(stats.allocation[0].current, 1);
        assert_eq!(stats.allocation[2].freed, 12);
        assert_eq!(stats.oversize_allocations.current, 109);
        assert_eq!(stats.max_split_size, 122);
        for (key, value) in &entries {
            assert_eq!(stats.get(key), Some(*value), "{key}");
        }
        let [first, .., last] = &entries[..] else {
            unreachable!()
        };
        assert_eq!(first.0, "allocation.all.current");
        assert_eq!(last.0, "max_split_size");
    }

    #[test]
    fn flat_keys_are_pytorchs_122_sorted() {
        let stats = DeviceStats {
            max_split_size: -1,
            ..Default::default()
        };
        let flat = stats.flat();
        assert_eq!(flat.len(), FLAT_KEY_COUNT);
        assert!(flat.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(flat[0].0, "active.all.allocated");
        assert_eq!(flat.last().unwrap().0, "segment.small_pool.peak");
        assert!(flat
            .iter()
            .any(|(k, _)| k == "requested_bytes.large_pool.freed"));
        assert!(flat.iter().any(|(k, _)| k == "oversize_segments.peak"));
        for (key, value) in &flat {
            assert_eq!(stats.get(key), Some(*value), "{key}");
        }
        assert_eq!(stats.get("max_split_size"), Some(-1));
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let stats = DeviceStats::default();
        for key in [
            "",
            "allocated",
            "allocated_bytes.all",
            "allocated_bytes.all.current.x",
            "allocated_bytes.medium_pool.current",
            "allocated_bytes.all.now",
            "oversize_allocations.all.current",
            "num_ooms.current",
        ] {
            assert_eq!(stats.get(key), None, "{key}");
        }
    }

    #[test]
    fn json_lists_every_key_once() {
        let mut stats = DeviceStats::default();
        stats.allocated_bytes[0].increase(1024);
        let json = stats.to_json();
        assert!(json.starts_with("{\"active.all.allocated\":0,"));
        assert!(json.contains("\"allocated_bytes.all.current\":1024,"));
        assert_eq!(json.matches(':').count(), FLAT_KEY_COUNT);
    }
}
