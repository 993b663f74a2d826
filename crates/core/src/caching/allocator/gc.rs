//! Garbage collection of cached segments by age (garbage_collection_threshold).

use super::*;

impl CachingAllocator {
    /// Garbage collection runs only with a memory fraction and a threshold set, as in PyTorch.
    #[inline]
    pub(super) fn garbage_collection_on(&self) -> bool {
        self.allowed_maximum.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    /// Free cached whole segments of the large pool, oldest (by lookups since cached) first, until
    /// reserved memory is back under threshold x allowed or nothing more can go. Unlike the OOM path it
    /// does not synchronize streams.
    pub(super) fn garbage_collect_cached_blocks(&mut self) -> Result<()> {
        let allowed = self.allowed_maximum.unwrap_or(usize::MAX);
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as usize;
        if self.reserved_total <= threshold {
            return Ok(());
        }
        let target = self.reserved_total - threshold;
        let lookups = self.large.lookups;
        let blocks = &self.blocks;
        let mut candidates: Vec<(BlockId, u64)> = self
            .large
            .ordered()
            .values()
            .filter(|&&id| !blocks[id].is_split() && blocks[id].expandable.is_none())
            .map(|&id| (id, lookups - blocks[id].gc_count_base))
            .collect();
        let mut total_age: u64 = candidates.iter().map(|&(_, age)| age).sum();
        let mut reclaimed = 0;
        while reclaimed < target && !candidates.is_empty() {
            // Free every block at least as old as the average; do not stop at the target, so that
            // collection does not run again at once.
            let average_age = total_age as f64 / candidates.len() as f64;
            let (old, young): (Vec<_>, Vec<_>) = candidates
                .into_iter()
                .partition(|&(_, age)| age as f64 >= average_age);
            if old.is_empty() {
                break;
            }
            for (id, age) in old {
                reclaimed += self.blocks[id].size;
                total_age -= age;
                self.release_block(id)?;
            }
            candidates = young;
        }
        Ok(())
    }
}
