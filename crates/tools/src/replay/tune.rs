//! `accalloc tune`: replay one trace under many settings, on all cores, and rank them.
//!
//! Each candidate replays on its own simulated device (SimulatedBackend: rising fake addresses, no
//! memory touched), so the figures are the same on every run and every machine. A candidate fits
//! when it has no OOM on a device of the given capacity; those that do not fit rank last. Then the
//! lowest peak reserved memory wins; fewer device calls, fewer retries, then fewer keys break ties.

use super::session::{replay, ReplayReport};
use super::trace::{devices_used, TraceOp};
use crate::backend::simulated::SimulatedBackend;
use crate::caching::settings::parse_settings;
use crate::caching::CachingConfig;
use crate::error::Result;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

/// Capacity of the simulated device when none is given: 1 TiB, more than any accelerator has (an
/// expandable segment reserves 1 1/8 of it and keeps a flag per page, so not more).
pub const UNLIMITED_CAPACITY: usize = 1 << 40;

/// Expandable segments: off, PyTorch's, with accalloc's trimming, or with accalloc's planned
/// placement (which implies them, and keeps the trim line while no plan is in force).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expandable {
    Off,
    On,
    Trimmed,
    Planned,
}

/// One point of the search.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub expandable: Expandable,
    pub max_split_size_mb: Option<usize>,
    /// How much larger a cached block a request >= max_split_size may take (None: 20 MiB).
    pub max_non_split_rounding_mb: Option<usize>,
    /// roundup_power2_divisions for every size (0: off).
    pub roundup_divisions: usize,
    /// garbage_collection_threshold with the memory fraction it needs: (threshold, fraction).
    pub garbage_collection: Option<(f64, f64)>,
    /// expandable_trim_slack, with Trimmed (None: the default line).
    pub trim_slack: Option<f64>,
}

impl Candidate {
    /// PyTorch's defaults.
    pub const DEFAULT: Candidate = Candidate {
        expandable: Expandable::Off,
        max_split_size_mb: None,
        max_non_split_rounding_mb: None,
        roundup_divisions: 0,
        garbage_collection: None,
        trim_slack: None,
    };

    fn keys(&self, pytorch: bool) -> String {
        let mut parts = Vec::new();
        if self.expandable == Expandable::Planned && !pytorch {
            parts.push("planned_placement:True".to_string());
        } else if self.expandable != Expandable::Off {
            parts.push("expandable_segments:True".to_string());
        }
        if self.expandable == Expandable::Trimmed && !pytorch {
            parts.push("expandable_trim:True".to_string());
            if let Some(slack) = self.trim_slack {
                parts.push(format!("expandable_trim_slack:{slack}"));
            }
        }
        if let Some(mb) = self.max_split_size_mb {
            parts.push(format!("max_split_size_mb:{mb}"));
        }
        if let Some(mb) = self.max_non_split_rounding_mb {
            parts.push(format!("max_non_split_rounding_mb:{mb}"));
        }
        if self.roundup_divisions > 1 {
            parts.push(format!(
                "roundup_power2_divisions:{}",
                self.roundup_divisions
            ));
        }
        if let Some((threshold, fraction)) = self.garbage_collection {
            parts.push(format!("garbage_collection_threshold:{threshold}"));
            if !pytorch {
                parts.push(format!("per_process_memory_fraction:{fraction}"));
            }
        }
        parts.join(",")
    }

    /// The settings as ACCALLOC_CONF takes them.
    pub fn accalloc_conf(&self) -> String {
        self.keys(false)
    }

    /// The settings with PyTorch's keys only (PYTORCH_ALLOC_CONF); the memory fraction is set in
    /// PyTorch with torch.cuda.set_per_process_memory_fraction.
    pub fn pytorch_conf(&self) -> String {
        self.keys(true)
    }

    /// Whether PyTorch can run these settings (expandable_trim and planned_placement are
    /// accalloc's own).
    pub fn pytorch_can_express(&self) -> bool {
        matches!(self.expandable, Expandable::Off | Expandable::On)
    }

    pub fn config(&self) -> Result<CachingConfig> {
        parse_settings(&self.accalloc_conf(), &CachingConfig::default())
    }
}

/// The trim lines the default search tries beside the default one (expandable_trim_slack).
pub const SEARCHED_TRIM_SLACKS: [Option<f64>; 3] = [Some(0.02), None, Some(0.1)];

/// The lines of a frontier (`accalloc tune --frontier`): from trimming to the byte to twice the
/// default's slack.
pub const FRONTIER_TRIM_SLACKS: [f64; 11] = [
    0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.1, 0.15, 0.2,
];

/// The default search: expandable segments (off, on, trimmed at three lines) x max_split_size_mb
/// (unset, 20 to 1024) with max_non_split_rounding_mb (20, 64, 256) x roundup_power2_divisions
/// (off, 2, 4, 8, 16), and planned placement with the rest at its defaults; with a capacity, also
/// garbage collection at thresholds 0.6 and 0.8 under memory fractions 0.8 and 0.95. 551
/// candidates, 2,755 with a capacity.
pub fn default_candidates(with_capacity: bool) -> Vec<Candidate> {
    let mut collection = vec![None];
    if with_capacity {
        for fraction in [0.8, 0.95] {
            for threshold in [0.6, 0.8] {
                collection.push(Some((threshold, fraction)));
            }
        }
    }
    let mut splits = vec![(None, None)];
    for mb in [20, 32, 64, 128, 256, 512, 1024] {
        for rounding in [None, Some(64), Some(256)] {
            splits.push((Some(mb), rounding));
        }
    }
    let mut candidates = Vec::new();
    for garbage_collection in collection {
        let expandables = [
            (Expandable::Off, None),
            (Expandable::On, None),
            (Expandable::Trimmed, SEARCHED_TRIM_SLACKS[0]),
            (Expandable::Trimmed, SEARCHED_TRIM_SLACKS[1]),
            (Expandable::Trimmed, SEARCHED_TRIM_SLACKS[2]),
        ];
        for (expandable, trim_slack) in expandables {
            for &(max_split_size_mb, max_non_split_rounding_mb) in &splits {
                for roundup_divisions in [0, 2, 4, 8, 16] {
                    candidates.push(Candidate {
                        expandable,
                        max_split_size_mb,
                        max_non_split_rounding_mb,
                        roundup_divisions,
                        garbage_collection,
                        trim_slack,
                    });
                }
            }
        }
        // Planned placement places blocks itself: the split and rounding keys matter little to
        // it, so it is tried once (its replays cost more, each plan being made).
        candidates.push(Candidate {
            expandable: Expandable::Planned,
            garbage_collection,
            ..Candidate::DEFAULT
        });
    }
    candidates
}

/// One candidate's figures.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub candidate: Candidate,
    pub peak_allocated: i64,
    pub peak_reserved: i64,
    pub ooms: usize,
    pub alloc_retries: i64,
    pub device_allocs: i64,
    pub device_frees: i64,
    pub ns_per_op: f64,
    /// No OOM on a device of the capacity searched.
    pub fits: bool,
}

impl Outcome {
    fn new(candidate: Candidate, report: &ReplayReport) -> Outcome {
        Outcome {
            candidate,
            peak_allocated: report.peak_allocated(),
            peak_reserved: report.peak_reserved(),
            ooms: report.ooms,
            alloc_retries: report.alloc_retries(),
            device_allocs: report.device_allocs(),
            device_frees: report.device_frees(),
            ns_per_op: report.ns_per_op(),
            fits: report.ooms == 0,
        }
    }

    /// Peak allocated / peak reserved: 1.0 is no memory held back.
    pub fn utilization(&self) -> f64 {
        self.peak_allocated as f64 / self.peak_reserved.max(1) as f64
    }

    /// Maps and unmaps (or segment allocations and frees): what the settings cost the device.
    pub fn device_calls(&self) -> i64 {
        self.device_allocs + self.device_frees
    }

    /// Every figure of the outcome but the time (which varies from run to run): two settings with
    /// the same figures did the same for the trace.
    fn figures(&self) -> (bool, i64, i64, usize, i64, i64, i64) {
        (
            self.fits,
            self.peak_allocated,
            self.peak_reserved,
            self.ooms,
            self.alloc_retries,
            self.device_allocs,
            self.device_frees,
        )
    }

    /// Fits first, then lower peak reserved, fewer device calls, fewer retries, and among equals
    /// the settings with fewer keys (a key that changes nothing is left out).
    fn rank_key(&self) -> (bool, i64, i64, i64, usize) {
        let keys = self.candidate.accalloc_conf().matches(':').count();
        (
            !self.fits,
            self.peak_reserved,
            self.device_allocs + self.device_frees,
            self.alloc_retries,
            keys,
        )
    }
}

/// Replay `ops` under each candidate on `threads` threads, devices of `capacity` bytes; `progress`
/// is called on this thread with (done, total) after each. Returns the outcomes ranked, best first
/// (ties keep the candidates' order).
pub fn tune(
    ops: &[TraceOp],
    candidates: &[Candidate],
    capacity: usize,
    threads: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<Outcome>> {
    let devices = devices_used(ops);
    let configs = candidates
        .iter()
        .map(Candidate::config)
        .collect::<Result<Vec<_>>>()?;
    let next = AtomicUsize::new(0);
    let (sender, receiver) = mpsc::channel();
    let mut results: Vec<Option<Result<Outcome>>> = vec![None; candidates.len()];
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, candidates.len().max(1)) {
            let sender = sender.clone();
            let (next, configs) = (&next, &configs);
            scope.spawn(move || loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= candidates.len() {
                    break;
                }
                let backend = Arc::new(SimulatedBackend::new(devices, capacity));
                let outcome = replay(ops, backend, &configs[index])
                    .map(|report| Outcome::new(candidates[index], &report));
                if sender.send((index, outcome)).is_err() {
                    break;
                }
            });
        }
        drop(sender);
        for (done, (index, outcome)) in receiver.iter().enumerate() {
            results[index] = Some(outcome);
            progress(done + 1, candidates.len());
        }
    });
    let mut outcomes = results
        .into_iter()
        .map(|r| r.expect("every candidate ran"))
        .collect::<Result<Vec<_>>>()?;
    outcomes.sort_by_key(Outcome::rank_key);
    Ok(outcomes)
}

/// The ranked outcomes with those of identical figures (all but the time) folded together: for each
/// distinct outcome, in rank order, the index in `ranked` of its first setting (the simplest: among
/// equal figures the ranking puts fewer keys first) and how many settings it stands for.
pub fn fold_equivalent(ranked: &[Outcome]) -> Vec<(usize, usize)> {
    let mut rows: Vec<(usize, usize)> = Vec::new();
    let mut row_of: std::collections::HashMap<_, usize> = std::collections::HashMap::new();
    for (index, outcome) in ranked.iter().enumerate() {
        match row_of.get(&outcome.figures()) {
            Some(&row) => rows[row].1 += 1,
            None => {
                row_of.insert(outcome.figures(), rows.len());
                rows.push((index, 1));
            }
        }
    }
    rows
}

/// The candidates of a trim frontier: PyTorch's defaults, plain expandable segments, and
/// expandable_trim at each of `slacks`.
pub fn frontier_candidates(slacks: &[f64]) -> Vec<Candidate> {
    let mut candidates = vec![
        Candidate::DEFAULT,
        Candidate {
            expandable: Expandable::On,
            ..Candidate::DEFAULT
        },
    ];
    candidates.extend(slacks.iter().map(|&slack| Candidate {
        expandable: Expandable::Trimmed,
        trim_slack: Some(slack),
        ..Candidate::DEFAULT
    }));
    candidates.push(Candidate {
        expandable: Expandable::Planned,
        ..Candidate::DEFAULT
    });
    candidates
}

/// Which outcomes are on the frontier of utilization against device calls: no other reaches as
/// high a utilization with as few calls, one of the two strictly better.
pub fn on_frontier(outcomes: &[Outcome]) -> Vec<bool> {
    outcomes
        .iter()
        .map(|o| {
            o.fits
                && !outcomes.iter().any(|other| {
                    other.fits
                        && other.utilization() >= o.utilization()
                        && other.device_calls() <= o.device_calls()
                        && (other.utilization() > o.utilization()
                            || other.device_calls() < o.device_calls())
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_strings_keep_pytorch_keys_apart() {
        let candidate = Candidate {
            expandable: Expandable::Trimmed,
            max_split_size_mb: Some(64),
            max_non_split_rounding_mb: Some(256),
            roundup_divisions: 4,
            garbage_collection: Some((0.8, 0.95)),
            trim_slack: Some(0.02),
        };
        assert_eq!(
            candidate.accalloc_conf(),
            "expandable_segments:True,expandable_trim:True,expandable_trim_slack:0.02,max_split_size_mb:64,\
             max_non_split_rounding_mb:256,roundup_power2_divisions:4,garbage_collection_threshold:0.8,per_process_memory_fraction:0.95"
        );
        assert_eq!(
            candidate.pytorch_conf(),
            "expandable_segments:True,max_split_size_mb:64,max_non_split_rounding_mb:256,\
             roundup_power2_divisions:4,garbage_collection_threshold:0.8"
        );
        assert!(!candidate.pytorch_can_express());
        assert_eq!(Candidate::DEFAULT.accalloc_conf(), "");
        for candidate in default_candidates(true) {
            candidate.config().unwrap();
        }
        assert_eq!(default_candidates(false).len(), 551);
        assert_eq!(default_candidates(true).len(), 2755);
    }

    #[test]
    fn ranks_what_fits_by_peak_reserved() {
        // Two 30 MiB blocks freed, then one 50 MiB block: by default the 50 MiB block needs a new
        // segment (the cached 30 MiB ones are not merged), so 110 MiB are reserved; on a 100 MiB
        // device the default has to release the cache and retry.
        let mut ops = Vec::new();
        for id in 0..2 {
            ops.push(TraceOp::Alloc {
                id,
                size: 30 << 20,
                stream: 0,
                device: 0,
            });
        }
        ops.push(TraceOp::Free { id: 0 });
        ops.push(TraceOp::Free { id: 1 });
        ops.push(TraceOp::Alloc {
            id: 2,
            size: 50 << 20,
            stream: 0,
            device: 0,
        });
        let candidates = [
            Candidate::DEFAULT,
            Candidate {
                expandable: Expandable::On,
                ..Candidate::DEFAULT
            },
        ];
        let mut calls = 0;
        let ranked = tune(&ops, &candidates, UNLIMITED_CAPACITY, 2, |done, total| {
            calls += 1;
            assert!(done <= total && total == 2);
        })
        .unwrap();
        assert_eq!(calls, 2);
        assert_eq!(ranked[0].candidate.expandable, Expandable::On);
        assert_eq!(
            ranked[0].peak_reserved,
            60 << 20,
            "one segment grown to 60 MiB"
        );
        assert_eq!(ranked[1].peak_reserved, 110 << 20);
        assert!(ranked.iter().all(|o| o.fits));
        let tight = tune(&ops, &candidates[..1], 100 << 20, 1, |_, _| {}).unwrap();
        assert_eq!((tight[0].ooms, tight[0].alloc_retries), (0, 1));
        let too_small = tune(&ops, &candidates[..1], 40 << 20, 1, |_, _| {}).unwrap();
        assert!(!too_small[0].fits);
    }

    #[test]
    fn settings_that_change_nothing_fold_into_the_simplest() {
        // One 1000-byte block: no key of the search changes a thing but expandable segments (a
        // 2 MiB page instead of a 2 MiB small segment: the same peak, other calls) and trimming.
        let ops = vec![
            TraceOp::Alloc {
                id: 0,
                size: 1000,
                stream: 0,
                device: 0,
            },
            TraceOp::Free { id: 0 },
        ];
        let candidates = default_candidates(false);
        let ranked = tune(&ops, &candidates, UNLIMITED_CAPACITY, 2, |_, _| {}).unwrap();
        let rows = fold_equivalent(&ranked);
        assert!(rows.len() < 10, "{} distinct outcomes", rows.len());
        assert_eq!(rows.iter().map(|(_, n)| n).sum::<usize>(), candidates.len());
        assert_eq!(rows[0].0, 0, "the best comes first");
        for (index, count) in &rows {
            let first = &ranked[*index];
            let same: Vec<&Outcome> = ranked
                .iter()
                .filter(|o| o.figures() == first.figures())
                .collect();
            assert_eq!(same.len(), *count);
            let keys = |o: &Outcome| o.candidate.accalloc_conf().matches(':').count();
            assert!(
                same.iter().all(|o| keys(o) >= keys(first)),
                "the simplest shown"
            );
        }
        // The defaults stand for every setting that only rounds or splits differently.
        let defaults = rows
            .iter()
            .find(|(i, _)| ranked[*i].candidate == Candidate::DEFAULT)
            .unwrap();
        assert!(defaults.1 >= 100, "{}", defaults.1);
    }

    #[test]
    fn the_frontier_keeps_the_settings_no_other_beats_on_both_counts() {
        // 41 MiB live, 31 MiB freed, 51 MiB asked for and freed, 61 MiB asked for: the peak is
        // 102 MiB allocated.
        let mut ops = Vec::new();
        let alloc = |id, mb: usize| TraceOp::Alloc {
            id,
            size: mb << 20,
            stream: 0,
            device: 0,
        };
        ops.extend([alloc(0, 41), alloc(1, 31)]);
        ops.push(TraceOp::Free { id: 1 });
        ops.push(alloc(2, 51));
        ops.push(TraceOp::Free { id: 2 });
        ops.push(alloc(3, 61));
        let candidates = frontier_candidates(&[0.0, 0.5]);
        let mut outcomes = tune(&ops, &candidates, UNLIMITED_CAPACITY, 2, |_, _| {}).unwrap();
        outcomes.sort_by_key(|o| candidates.iter().position(|c| *c == o.candidate));
        let frontier = on_frontier(&outcomes);
        // Plain expandable segments map 20 MiB pages: 120 MiB. Trim to the byte maps 2 MiB pages
        // up to the peak, 102 MiB: the best utilization, so on the frontier whatever it costs.
        assert_eq!(outcomes[1].peak_reserved, 120 << 20);
        assert_eq!(outcomes[2].peak_reserved, 102 << 20);
        assert!(frontier[2]);
        // The frontier is exactly the outcomes that nothing dominates.
        for (i, o) in outcomes.iter().enumerate() {
            let dominated = outcomes.iter().any(|p| {
                p.utilization() >= o.utilization()
                    && p.device_calls() <= o.device_calls()
                    && (p.utilization() > o.utilization() || p.device_calls() < o.device_calls())
            });
            assert_eq!(frontier[i], !dominated, "{:?}", o.candidate);
        }
    }
}
