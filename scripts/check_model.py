#!/usr/bin/env python3
"""Differential test: accalloc's simulated replay against scripts/pytorch_model.py.

For each trace (the command-line arguments, default examples/traces/*.jsonl and the real models'
traces in examples/traces/real/, these also with expandable segments), for the sample traces
again under allocator settings (max_split_size_mb, max_non_split_rounding_mb,
roundup_power2_divisions, garbage_collection_threshold with per_process_memory_fraction,
expandable_segments alone and combined with the others, at a big capacity and at tight ones), and
for a set of small crafted traces written to a temporary directory (private pools' among them:
CRAFTED_POOLS), it runs

    target/release/accalloc replay TRACE --json --simulate [--config SETTINGS]
    python3 scripts/pytorch_model.py TRACE [--config SETTINGS]

with the same ACCALLOC_HOST_CAPACITY (and ACCALLOC_CONF removed from both environments), and compares
all 122 keys of accalloc's "stats" object with the model's output. Each crafted case and settings
run also states a few values it is meant to exercise (say num_alloc_retries = 1, or the model's own
counters on stderr such as model.gc_runs); those are checked against the model, so a case cannot
silently stop covering its path. Prints "ok <case>" or the differing keys with both values, then
"N passed, M failed"; exits non-zero on any failure.

Known differences (KNOWN_DIFFERENCES): cases where the model follows PyTorch and accalloc does not,
reported with the note that explains them. They print "known difference <case>" with the differing
keys and count as passed while they still differ exactly on the keys listed; they fail if the
model's expectations fail or if other keys start to differ, and print a note (still passing) if
accalloc comes to agree.

Usage: python3 scripts/check_model.py [TRACE ...]     (builds target/release/accalloc if missing)
  With TRACE arguments, only those traces run (default settings), no settings runs or crafted cases.
Python 3.11, standard library only.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import trace_format
from trace_format import TraceOp

ROOT = Path(__file__).resolve().parent.parent
ACCALLOC = ROOT / "target" / "release" / "accalloc"
MODEL = ROOT / "scripts" / "pytorch_model.py"

KiB = 1024
MiB = 1024 * KiB

# Capacity for the sample traces: large enough that nothing runs out of memory.
BIG_CAPACITY = "80GiB"


# ---- crafted traces ---------------------------------------------------------------------------

# Short names, as the crafted traces below are long lists of them.
A = trace_format.alloc
F = trace_format.free
E = trace_format.empty_cache


# name -> (capacity, ops, expected values in the model's output)
CRAFTED: dict[str, tuple[str, list[TraceOp], dict[str, int]]] = {
    # Small pool: rounding to 512 (1 B, 511 B, 513 B), splits of a 2 MiB segment down to a 512 B
    # remainder, 1 MiB exactly is still small, a second segment once the first is full, and an
    # exact fit of an already split block (no split: inactive_split -1).
    "small_requests": ("1GiB", [
        A(1, 1), A(2, 511), A(3, 513), A(4, 1 * MiB), A(5, 1 * MiB - 2048 - 1024),
        A(6, 300), A(8, 1 * MiB), F(2), F(4), A(7, 1 * MiB), F(1), F(3), F(5), F(6), F(7), F(8),
    ], {"segment.small_pool.current": 2, "num_device_alloc": 2, "inactive_split.small_pool.peak": 4}),
    # Large pool, 1 MiB + 1 up to 10 MiB: 20 MiB segments; split only when > 1 MiB remains,
    # otherwise the caller gets the whole block (9.5 MiB takes a 10 MiB - 512 block); 10 MiB - 1
    # rounds to 10 MiB and so gets a 10 MiB segment of its own.
    "large_requests": ("1GiB", [
        A(1, 1 * MiB + 1), A(2, 9 * MiB), A(3, 10 * MiB - 1), A(4, 9 * MiB + 512 * KiB),
        A(5, 5 * MiB), F(1), A(6, 1 * MiB + 1), F(2), F(3), F(4), F(5), F(6),
    ], {"segment.large_pool.peak": 3, "reserved_bytes.large_pool.current": 50 * MiB,
        "allocated_bytes.large_pool.peak": 35 * MiB}),
    # Requests >= 10 MiB: a segment of their size rounded up to 2 MiB; reuse of such a segment by
    # a smaller request (split when > 1 MiB remains), and a whole-block fit (no split).
    "huge_requests": ("1GiB", [
        A(1, 10 * MiB), A(2, 11 * MiB + 1), A(3, 37 * MiB + 5), F(2), A(4, 9 * MiB),
        F(3), A(5, 37 * MiB + 900 * KiB), F(1), A(6, 9 * MiB + 512 * KiB), F(4), F(5), F(6),
    ], {"reserved_bytes.large_pool.peak": (10 + 12 + 38) * MiB, "num_device_alloc": 3}),
    # The 11 MiB remainder of a 20 MiB segment: a 10.5 MiB request takes it whole (0.5 MiB left,
    # not split: inactive_split -1); freeing merges the segment whole again.
    "whole_block_fit": ("1GiB", [
        A(1, 9 * MiB), A(2, 10 * MiB + 512 * KiB), F(2), F(1),
    ], {"allocated_bytes.large_pool.peak": 20 * MiB, "inactive_split.large_pool.freed": 2}),
    # Free merges both neighbours and the segment becomes whole again.
    "merge_both_whole": ("1GiB", [
        A(1, 2 * MiB), A(2, 2 * MiB), A(3, 2 * MiB), F(1), F(3), F(2),
    ], {"inactive_split.large_pool.current": 0, "inactive_split.large_pool.peak": 2}),
    # Free merges both neighbours but the block is still only part of its segment (net -1 / +size).
    "merge_both_still_split": ("1GiB", [
        A(1, 2 * MiB), A(2, 2 * MiB), A(3, 2 * MiB), A(4, 14 * MiB - 512 * KiB),
        F(1), F(3), F(2), A(5, 6 * MiB), F(5), F(4),
        A(10, 4096), A(11, 4096), A(12, 4096), A(13, 4096), F(10), F(12), F(11), F(13),
    ], {"inactive_split.large_pool.peak": 2, "inactive_split.small_pool.peak": 3,
        "inactive_split.large_pool.allocated": 4}),
    # empty_cache releases whole cached segments only; split ones stay; num_sync_all_streams counts.
    "empty_cache": ("1GiB", [
        A(1, 4096), A(2, 4096), A(3, 5 * MiB), A(4, 5 * MiB), A(5, 12 * MiB), A(6, 1000),
        F(1), F(3), F(5), F(6), E(), F(2), F(4), E(), E(), A(7, 4096), F(7),
    ], {"num_sync_all_streams": 3, "num_device_free": 3, "segment.all.current": 1}),
    # Two streams: a block is reused only on its own stream (lookups that land on another stream
    # miss), in both pools; stream ids need not be small or consecutive.
    "two_streams": ("1GiB", [
        A(1, 4096, 0), F(1), A(2, 4096, 7), A(3, 3 * MiB, 7), F(3), A(4, 3 * MiB, 0),
        A(5, 3 * MiB, 7), A(6, 2 * MiB, 0), F(2), F(4), F(5), F(6), A(7, 4096, 0), A(8, 4096, 7),
        F(7), F(8), E(),
    ], {"num_device_alloc": 4, "segment.all.current": 0}),
    # Equal-size free blocks in two segments: the lower address wins, which decides whether the
    # second segment becomes whole and is released by empty_cache.
    "address_tiebreak": ("1GiB", [
        A(1, 9 * MiB), A(2, 9 * MiB), A(3, 9 * MiB), A(4, 9 * MiB), F(1), F(3), A(5, 9 * MiB),
        F(4), E(), F(2), F(5),
    ], {"num_device_free": 1, "segment.large_pool.current": 1}),
    # Device full; the release-and-retry path frees a cached whole segment (of another stream and
    # of the small pool too) and the retry succeeds.
    "oom_retry_succeeds": ("40MiB", [
        A(1, 5 * MiB, 1), A(2, 12 * MiB), A(3, 4096, 1), A(4, 4096), F(1), F(3),
        A(5, 15 * MiB), F(2), F(4), F(5),
    ], {"num_alloc_retries": 1, "num_sync_all_streams": 1, "num_ooms": 0, "num_device_free": 2}),
    # The retry fails too: num_ooms +1 (the cached whole segments were released all the same, split
    # ones were not); the failed id's free is skipped; a small-pool OOM as well.
    "oom_fails": ("40MiB", [
        A(1, 30 * MiB), A(2, 4096), A(3, 4096), A(4, 4096, 3), F(2), F(4), A(5, 15 * MiB),
        F(5), A(6, 2 * MiB), A(7, 1 * MiB), A(8, 1 * MiB), A(9, 1 * MiB), A(10, 1 * MiB),
        F(9), F(1), F(3), F(6), F(7), F(8), F(10), A(11, 15 * MiB), F(11),
    ], {"num_ooms": 2, "num_alloc_retries": 2, "num_sync_all_streams": 2}),
    # A request whose segment could never fit the device (42 MiB > 40 MiB, or a 20 MiB segment on a
    # 16 MiB device) fails at once and counts only in num_ooms (accalloc's documented deviation); a
    # segment of exactly the capacity still goes through release-and-retry and succeeds.
    "larger_than_device": ("40MiB", [
        A(1, 4096), A(2, 41 * MiB), A(3, 2 * MiB), F(2), F(3), F(1), A(4, 40 * MiB), F(4),
    ], {"num_ooms": 1, "num_alloc_retries": 1, "num_device_alloc": 3, "num_device_free": 2}),
    "larger_than_device_medium": ("16MiB", [
        A(1, 4096), A(2, 2 * MiB), F(2), F(1), A(3, 16 * MiB), F(3),
    ], {"num_ooms": 1, "num_alloc_retries": 1, "num_device_alloc": 2}),
    # The rule applies only on a miss: a 2 MiB request (whose own segment would be 20 MiB > 15 MiB)
    # still takes and splits the cached 12 MiB block, as in PyTorch.
    "larger_than_device_cached_fit": ("15MiB", [
        A(1, 11 * MiB), F(1), A(2, 2 * MiB), F(2),
    ], {"num_ooms": 0, "allocation.all.allocated": 2, "num_device_alloc": 1}),
    # A 0-byte request never reaches DeviceCachingAllocator::malloc (allocate/raw_alloc return
    # null for it): nothing moves.
    "zero_size": ("1GiB", [
        A(1, 0), A(2, 0, 5), A(3, 4096), F(1), F(2), F(3),
    ], {"allocation.all.allocated": 1, "requested_bytes.all.allocated": 4096}),
}


class AtLeast:
    """An expected value that only has to be reached (for counters of the long sample traces)."""

    def __init__(self, n: int):
        self.n = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int) and other >= self.n

    def __repr__(self) -> str:
        return f">= {self.n}"


def cycle(stream: int, size: int, first_id: int, n: int) -> list[TraceOp]:
    """n allocate-and-free pairs: n lookups in the request's pool (the garbage-collection clock)."""
    ops: list[TraceOp] = []
    for i in range(first_id, first_id + n):
        ops += [A(i, size, stream), F(i)]
    return ops


M40 = "max_split_size_mb:40"
M20 = "max_split_size_mb:20"
GC = "garbage_collection_threshold:0.5,per_process_memory_fraction:0.5"
ES = "expandable_segments:True"

# name -> (capacity, allocator settings, ops, expected values in the model's output)
CRAFTED_SETTINGS: dict[str, tuple[str, str, list[TraceOp], dict[str, object]]] = {
    # max_split_size 40 MiB. A request below it never takes a cached block >= 40 MiB (30 MiB gets a
    # segment of its own); requests >= 40 MiB take one less than 20 MiB larger, whole (45 MiB gets
    # the 50 MiB block: allocated_bytes counts 50 MiB). 39 MiB gets a 40 MiB segment (oversize) with
    # only 1 MiB left, so no split: an oversize allocation. 38 MiB + 1 gets another 40 MiB segment
    # and splits it (request < M, remainder > 1 MiB). empty_cache releases the oversize segments
    # too.
    "mss_oversize_rules": ("1GiB", M40, [
        A(1, 50 * MiB), F(1), A(2, 30 * MiB), A(3, 50 * MiB), F(3), A(4, 45 * MiB), F(4), F(2),
        A(5, 39 * MiB), A(6, 38 * MiB + 1), F(5), F(6), E(),
    ], {"max_split_size": 40 * MiB, "oversize_allocations.allocated": 4,
        "oversize_segments.allocated": 3, "oversize_segments.freed": 3, "num_device_alloc": 4,
        "allocated_bytes.large_pool.allocated": (50 + 50 + 50 + 30 + 40) * MiB + 38 * MiB + 512,
        "inactive_split.large_pool.allocated": 1}),
    # max_non_split_rounding 20 MiB (default): a cached 100 MiB block is too large for 80 MiB
    # (100 >= 80 + 20: a new segment) but not for 80 MiB + 1 (rounded 80 MiB + 512).
    "mss_non_split_rounding_default": ("1GiB", M40, [
        A(1, 100 * MiB), F(1), A(2, 80 * MiB), A(3, 80 * MiB + 1), F(2), F(3),
    ], {"num_device_alloc": 2, "allocated_bytes.large_pool.peak": 180 * MiB,
        "oversize_allocations.peak": 2}),
    # max_split_size 20 MiB with max_non_split_rounding 40 MiB: 100 MiB is too large for 60 MiB
    # (boundary) but serves 61 MiB. Every 20 MiB segment is oversize: a 5 MiB request still splits
    # its new one, but the merged, whole 20 MiB block is not handed to a 5 MiB request again; a
    # 20 MiB request takes it.
    "mss_20_non_split_rounding_40": ("1GiB", M20 + ",max_non_split_rounding_mb:40", [
        A(1, 100 * MiB), F(1), A(2, 60 * MiB), A(3, 61 * MiB), A(4, 5 * MiB), A(5, 3 * MiB), F(4),
        F(5), A(6, 5 * MiB), A(7, 20 * MiB), F(2), F(3), F(6), F(7),
    ], {"num_device_alloc": 4, "oversize_segments.peak": 4, "oversize_allocations.allocated": 4,
        "inactive_split.large_pool.allocated": 3}),
    # Release step 3, one block: the device is full; a 30 MiB miss releases the smallest cached
    # oversize block >= max(30, 40) MiB (the 46 MiB one, not the 50 MiB one) and asks again: no
    # synchronisation, not a retry.
    "mss_release_one": ("100MiB", M40, [
        A(1, 50 * MiB), A(2, 45 * MiB), F(1), F(2), A(3, 30 * MiB), F(3),
    ], {"num_device_free": 1, "num_alloc_retries": 0, "num_sync_all_streams": 0,
        "segment.large_pool.current": 2, "model.release_available_ok": 1}),
    # Release step 3, several blocks: no single cached block >= 50 MiB, so the largest go first
    # (28 then 26 MiB, 54 >= 50) and the 22 and 24 MiB ones stay.
    "mss_release_largest_first": ("110MiB", M20, [
        A(1, 22 * MiB), A(2, 24 * MiB), A(3, 26 * MiB), A(4, 28 * MiB), F(1), F(2), F(3), F(4),
        A(5, 50 * MiB), F(5),
    ], {"num_device_free": 2, "num_alloc_retries": 0, "segment.large_pool.current": 3,
        "reserved_bytes.large_pool.current": (22 + 24 + 50) * MiB}),
    # Release step 3 falls short: walking down it releases the 50 and 46 MiB segments and stops at
    # the 30 MiB one (< max_split_size); 96 < 100 MiB, so it returns false (what it released stays
    # released) and the full release-and-retry follows, which frees the 30 MiB one.
    "mss_release_short_by_size": ("130MiB", M40, [
        A(1, 30 * MiB), A(2, 45 * MiB), A(3, 50 * MiB), F(1), F(2), F(3), A(4, 100 * MiB), F(4),
    ], {"num_device_free": 3, "num_alloc_retries": 1, "num_sync_all_streams": 1,
        "model.release_available_short": 1}),
    # Release step 3 falls short at another stream's block: stream 1's 24 and 22 MiB go, stream 0's
    # 30 MiB block stops the walk (46 < 60), and the retry path releases it.
    "mss_release_short_by_stream": ("130MiB", M20, [
        A(1, 22 * MiB, 1), A(2, 24 * MiB, 1), A(3, 30 * MiB, 0), F(1), F(2), F(3),
        A(4, 60 * MiB, 1), F(4),
    ], {"num_device_free": 3, "num_alloc_retries": 1, "num_sync_all_streams": 1,
        "model.release_available_short": 1}),
    # Release step 3 with no block of the request's stream below the key: the search lands on the
    # first block of the pool (stream 1's), so nothing is released there; the retry path frees it.
    "mss_release_other_stream_only": ("100MiB", M40, [
        A(1, 50 * MiB, 1), F(1), A(2, 60 * MiB, 0), F(2),
    ], {"num_device_free": 1, "num_alloc_retries": 1, "model.release_available_short": 1}),
    # Out of memory with max_split_size set: step 3 finds only a non-oversize 10 MiB block (false),
    # the retry frees it and still fails; a small-pool miss on a full device fails the same way.
    "mss_oom": ("60MiB", M40, [
        A(1, 45 * MiB), A(2, 10 * MiB), F(2), A(3, 16 * MiB), A(4, 14 * MiB), A(5, 4096), F(3),
        F(4), F(5), F(1),
    ], {"num_ooms": 2, "num_alloc_retries": 2, "num_device_free": 1,
        "model.release_available_short": 2}),
    # roundup_power2_divisions:4 everywhere: 1000 B (<= 512 x 4) and 3000 B keep 512 rounding;
    # 9000 B -> 10240, 700 KiB -> 768 KiB, 1 MiB + 1 -> 1.25 MiB (large pool), 5 MiB + 1 -> 6 MiB,
    # 8 MiB stays (a power of two), 13 MiB -> 14 MiB, 17 MiB -> 20 MiB.
    "rp2_single_value": ("1GiB", "roundup_power2_divisions:4", [
        A(1, 1000), A(2, 3000), A(3, 9000), A(4, 700 * KiB), A(5, 1 * MiB + 1), A(6, 5 * MiB + 1),
        A(7, 8 * MiB), A(8, 13 * MiB), A(9, 17 * MiB), *[F(i) for i in range(1, 10)],
    ], {"allocated_bytes.small_pool.allocated": 1024 + 3072 + 10240 + 768 * KiB,
        "allocated_bytes.large_pool.allocated": 1280 * KiB + (6 + 8 + 14 + 20) * MiB,
        "requested_bytes.all.allocated": 1000 + 3000 + 9000 + 700 * KiB + 1 * MiB + 1 + 5 * MiB + 1
        + 8 * MiB + 13 * MiB + 17 * MiB}),
    # The list form [1:4,64:8,>:2]: bucket 0 (below 2 MiB) 4 divisions, buckets 1-5 none, bucket 6
    # (64-128 MiB) 8, buckets 7-15 2. 3000 B -> 3072, 1.5 MiB + 1 -> 1.75 MiB, 3 MiB + 1 and 40 MiB
    # + 1 -> 512 rounding, 70 MiB -> 72 MiB, 130 MiB -> 192 MiB, 300 MiB -> 384 MiB.
    "rp2_list": ("2GiB", "roundup_power2_divisions:[1:4,64:8,>:2]", [
        A(1, 3000), A(2, 3 * MiB // 2 + 1), A(3, 3 * MiB + 1), A(4, 40 * MiB + 1), A(5, 70 * MiB),
        A(6, 130 * MiB), A(7, 300 * MiB), *[F(i) for i in range(1, 8)],
    ], {"allocated_bytes.all.allocated": 3072 + 1792 * KiB + 3 * MiB + 512 + 40 * MiB + 512
        + (72 + 192 + 384) * MiB}),
    # The first entry also sets the buckets below it ([4:2,>:8]: buckets 0-2 get 2, 3-15 get 8):
    # 700 KiB -> 768 KiB, 1.5 MiB + 1 -> 2 MiB, 3 MiB + 1 -> 4 MiB, 5 MiB + 1 -> 6 MiB, and
    # 9 MiB + 1 -> 10 MiB, which crosses kMinLargeAlloc: a 10 MiB segment of its own.
    "rp2_list_first_entry_fills_below": ("1GiB", "roundup_power2_divisions:[4:2,>:8]", [
        A(1, 700 * KiB), A(2, 3 * MiB // 2 + 1), A(3, 3 * MiB + 1), A(4, 5 * MiB + 1),
        A(5, 9 * MiB + 1), *[F(i) for i in range(1, 6)],
    ], {"allocated_bytes.all.allocated": 768 * KiB + (2 + 4 + 6 + 10) * MiB,
        "num_device_alloc": 3, "reserved_bytes.large_pool.peak": 30 * MiB}),
    # One division means no power-of-two rounding (round_size needs divisions > 1): [2:1,>:2] gives
    # buckets 0-1 one division, so 1.5 MiB + 1 and 3 MiB + 1 keep 512 rounding; 5 MiB + 1 -> 6 MiB.
    "rp2_one_division_is_off": ("1GiB", "roundup_power2_divisions:[2:1,>:2]", [
        A(1, 3 * MiB // 2 + 1), A(2, 3 * MiB + 1), A(3, 5 * MiB + 1), F(1), F(2), F(3),
    ], {"allocated_bytes.all.allocated": 3 * MiB // 2 + 512 + 3 * MiB + 512 + 6 * MiB}),
    # ">" first: PyTorch's last_index starts at 0, so ">:4" alone fills buckets 1-15 and leaves
    # bucket 0 (below 2 MiB) at 0: 1.5 MiB + 1 keeps 512 rounding, 3 MiB + 1 -> 3.5 MiB.
    "rp2_list_only_greater": ("1GiB", "roundup_power2_divisions:[>:4]", [
        A(1, 3 * MiB // 2 + 1), A(2, 3 * MiB + 1), F(1), F(2),
    ], {"allocated_bytes.all.allocated": 3 * MiB // 2 + 512 + 7 * MiB // 2}),
    # per_process_memory_fraction 0.5 of 200 MiB: a segment past 100 MiB reserved fails without
    # asking the device (which has room): the retry path frees the cached small segment and fails
    # again (num_ooms). Exactly 100 MiB is allowed. A 150 MiB request (over the allowed bytes,
    # within the device) goes through the whole path too; a 250 MiB one (over the device) fails at
    # once, counted as an OOM without a retry.
    "fraction_caps_reserved": ("200MiB", "per_process_memory_fraction:0.5", [
        A(1, 4096), F(1), A(2, 60 * MiB), A(3, 50 * MiB), A(4, 38 * MiB), A(5, 4096), A(6, 4096),
        A(7, 3 * MiB // 2), A(8, 150 * MiB), A(9, 250 * MiB), F(2), F(3), F(4), F(5), F(6), F(7),
        F(8), F(9),
    ], {"num_ooms": 4, "num_alloc_retries": 3, "num_sync_all_streams": 3, "num_device_free": 1,
        "reserved_bytes.all.peak": 100 * MiB, "model.failed_allocs": 4}),
    # A fraction of 0: no segment is ever allowed.
    "fraction_zero": ("1GiB", "per_process_memory_fraction:0", [
        A(1, 4096), A(2, 5 * MiB), F(1), F(2),
    ], {"num_ooms": 2, "num_alloc_retries": 2, "num_device_alloc": 0}),
    # Garbage collection, fraction 0.5 of 200 MiB (100 MiB allowed), threshold 0.5 (50 MiB): the
    # 24 MiB miss finds 46 MiB reserved (no collection); the 26 MiB miss finds 70 MiB: it frees the
    # cached whole large segments at least as old as the average (20 MiB block: 2 large-pool
    # lookups, 22 MiB block: 1; average 1.5), which is enough. Small-pool lookups (stream 1's hits)
    # do not age large blocks; the cached whole small segment, aged 3 small-pool lookups, is never
    # collected; nothing synchronises.
    "gc_collects_old_segments": ("200MiB", GC, [
        A(1, 20 * MiB), A(2, 22 * MiB), F(1), A(10, 4096), A(20, 4096, 1), A(3, 24 * MiB), F(2),
        A(11, 4096), F(10), F(11), *cycle(1, 4096, 400, 3), A(4, 26 * MiB), F(3), F(4), F(20),
    ], {"num_device_free": 1, "num_sync_all_streams": 0, "segment.small_pool.current": 2,
        "segment.large_pool.current": 3, "model.gc_runs": 1}),
    # Garbage collection in two passes (400 MiB, 200 MiB allowed, collect above 100 MiB): stream 1's
    # 2 MiB requests reuse one cached segment and serve as the clock. At the 70 MiB miss, 120 MiB
    # are reserved (target 20 MiB) and the whole cached segments are a 10 MiB one aged 9, 30 MiB
    # aged 3, 60 MiB aged 1 and stream 1's 20 MiB aged 1: the first pass (average 3.5) frees the 10
    # MiB one only, the second (average 5/3) the 30 MiB one, and that is enough.
    "gc_second_pass": ("400MiB", GC, [
        A(1, 2 * MiB, 1), F(1), A(2, 10 * MiB), A(3, 30 * MiB), A(4, 60 * MiB), F(2),
        *cycle(1, 2 * MiB, 100, 6), F(3), *cycle(1, 2 * MiB, 200, 2), F(4), A(5, 70 * MiB), F(5),
    ], {"num_device_free": 2, "num_sync_all_streams": 0, "model.gc_runs": 1,
        "reserved_bytes.large_pool.current": (60 + 20 + 70) * MiB}),
    # A tie, and ages per pool (400 MiB, 200 MiB allowed, collect above 100 MiB). At the 70 MiB miss
    # 118 MiB are reserved (target 18 MiB) and the whole cached large segments are aged 3, 2 and 1
    # large-pool lookups (average 2): one pass frees the 3 and the 2 (>= the average), not the 1,
    # although 20 MiB would have been enough. The small-pool lookups in between (hits in a small
    # segment made early) do not age them; counted, they would leave the 2 below the average.
    "gc_age_equal_to_average": ("400MiB", GC, [
        A(300, 4096), A(1, 2 * MiB, 1), A(2, 20 * MiB), A(3, 22 * MiB), A(4, 24 * MiB),
        A(5, 30 * MiB), F(2), *cycle(0, 4096, 301, 2), *cycle(1, 2 * MiB, 100, 1), F(3),
        *cycle(1, 2 * MiB, 200, 1), F(4), A(6, 70 * MiB), F(1), F(5), F(6), F(300),
    ], {"num_device_free": 2, "model.gc_runs": 1, "segment.large_pool.current": 4,
        "segment.small_pool.current": 1}),
    # accalloc's documented deviation comes first: a 300 MiB request on a 200 MiB device fails at
    # once, before garbage collection would run (60 MiB reserved > 50), so the cached 30 MiB segment
    # is still there for the next 20 MiB request (a hit, split), and only num_ooms moved.
    "gc_not_before_larger_than_device": ("200MiB", GC, [
        A(1, 30 * MiB), A(2, 30 * MiB), F(1), A(3, 300 * MiB), A(4, 20 * MiB), F(2), F(3), F(4),
    ], {"num_device_free": 0, "num_device_alloc": 2, "num_ooms": 1, "model.failed_allocs": 1,
        "inactive_split.large_pool.allocated": 1}),
    # per_process_memory_fraction:1.0 is "no fraction" in current PyTorch: setMemoryFraction sets
    # allowed_memory_maximum (a std::optional) only when fraction < 1.0, and malloc collects only
    # when it has a value. So the 40 MiB miss (60 MiB of 100 MiB reserved) collects nothing. (Older
    # PyTorch set a fraction for any value; accalloc follows the current behaviour.)
    "gc_with_fraction_one": ("100MiB", "garbage_collection_threshold:0.5,"
                             "per_process_memory_fraction:1.0", [
        A(1, 30 * MiB), A(2, 30 * MiB), F(1), A(3, 40 * MiB), F(2), F(3),
    ], {"num_device_free": 0, "model.gc_runs": 0}),
    # garbage_collection_threshold without a memory fraction does nothing: the 40 MiB miss with
    # 60 MiB of a 100 MiB device reserved keeps the cached 30 MiB segment.
    "gc_needs_a_fraction": ("100MiB", "garbage_collection_threshold:0.5", [
        A(1, 30 * MiB), A(2, 30 * MiB), F(1), A(3, 40 * MiB), F(2), F(3),
    ], {"num_device_free": 0, "reserved_bytes.all.peak": 100 * MiB, "model.gc_runs": 0}),
    # Everything together on a tight device: oversize blocks, rounding, fraction and collection
    # (three collections, a release step 3 that falls short and an out-of-memory error).
    # (Spaces in the settings string are dropped, as PyTorch's tokenizer drops them.)
    "all_settings_together": ("300MiB", "max_split_size_mb:24, "
                              "roundup_power2_divisions:[2:2, >:4], "
                              "garbage_collection_threshold:0.4, "
                              "per_process_memory_fraction:0.6", [
        A(1, 25 * MiB), A(2, 3 * MiB), A(3, 30 * MiB, 1), F(1), A(4, 13 * MiB), F(3),
        A(5, 27 * MiB),
        A(6, 45 * MiB, 1), F(2), A(7, 33 * MiB), F(4), A(8, 70 * MiB), F(5), A(9, 26 * MiB),
        F(6), F(7), A(10, 100 * MiB), F(8), F(9), F(10),
    ], {"model.gc_runs": 3, "num_ooms": 1, "model.release_available_short": 1,
        "oversize_segments.allocated": 5, "oversize_allocations.allocated": 7}),
}

# Expandable segments (same shape as CRAFTED_SETTINGS). One reserved range per (stream, pool) of
# ceil((C + C/8) / page) pages, 20 MiB pages in the large pool and 2 MiB pages in the small one
# (1 GiB device: 58 large pages, 1160 MiB); a miss maps the pages covering the rounded request at
# the lowest address where free and unmapped space adds up; mapping counts num_device_alloc and
# reserved_bytes but no segment, and no block of an expandable segment counts in inactive_split.
# Layouts below are in MiB from the start of the range: A = allocated, F = free (mapped, cached),
# U = unmapped.
CRAFTED_EXPANDABLE: dict[str, tuple[str, str, list[TraceOp], dict[str, object]]] = {
    # Growth in place: 5 MiB maps one page [A 0-5][F 5-20][U]; 30 MiB takes the free 15 MiB plus
    # the unmapped block after it, mapping one more page (15 MiB needed), and splits the merged
    # 35 MiB block (30 + 5). Freeing both merges [F 0-40] (never with the unmapped rest); 40 MiB
    # takes it whole, mapping nothing.
    "es_grow_in_place": ("1GiB", ES, [
        A(1, 5 * MiB), A(2, 30 * MiB), F(1), F(2), A(3, 40 * MiB), F(3),
    ], {"num_device_alloc": 2, "segment.all.allocated": 0, "inactive_split.all.allocated": 0,
        "reserved_bytes.large_pool.current": 40 * MiB,
        "allocated_bytes.large_pool.allocated": 75 * MiB, "model.maps": 2,
        "model.reservations": 1}),
    # An unmapped hole: three 20 MiB pages, the middle one freed and unmapped by empty_cache
    # ([A 0-20][U 20-40][A 40-60][U 60-]). 30 MiB: the hole (its previous block is allocated) holds
    # 20 < 30 before the next allocated block, so the tail takes it (two pages, 60-100, 30 + 10).
    # Then 40-60 is freed (it does not merge with the unmapped hole) and 35 MiB finds the chain
    # unmapped hole -> free (20 + 20 >= 35): mapping the hole's page merges it with 40-60, and the
    # 40 MiB block splits 35 + 5; nothing new is mapped at the end. At the end empty_cache unmaps
    # the five pages and the range, wholly unmapped, is given back.
    "es_unmapped_hole_refilled": ("1GiB", ES, [
        A(1, 20 * MiB), A(2, 20 * MiB), A(3, 20 * MiB), F(2), E(), A(4, 30 * MiB), F(3),
        A(5, 35 * MiB), F(1), F(4), F(5), E(),
    ], {"num_device_alloc": 5, "num_device_free": 2, "reserved_bytes.large_pool.peak": 100 * MiB,
        "reserved_bytes.large_pool.current": 0, "model.unmaps": 2,
        "model.reservations_released": 1}),
    # empty_cache unmaps only whole free pages: [A 0-10][F 10-45][A 45-55][F 55-60][U 60-] loses
    # page 20-40 only; 10-20 and 40-45 stay mapped and cached, as does 55-60. 25 MiB then starts at
    # the free 10-20 before the hole (10 + 20 + 5 >= 25), maps the hole's page (15 MiB needed),
    # which merges 10-45, and splits it 25 + 10. The last empty_cache unmaps all three pages.
    "es_empty_cache_partial": ("1GiB", ES, [
        A(1, 10 * MiB), A(2, 35 * MiB), A(3, 10 * MiB), F(2), E(), A(4, 25 * MiB), F(1), F(3),
        F(4), E(),
    ], {"num_device_alloc": 3, "num_device_free": 2, "model.unmaps": 2,
        "reserved_bytes.large_pool.allocated": 80 * MiB,
        "reserved_bytes.large_pool.freed": 80 * MiB, "reserved_bytes.large_pool.peak": 60 * MiB}),
    # 2 MiB pages in the small pool, 20 MiB pages in the large one, in ranges of their own: 4096 B
    # maps one small page; 1 MiB splits its free rest; the next 1 MiB takes the free 1 MiB - 4096
    # before the unmapped rest and maps one more small page (4096 B needed); 3 MiB maps a 20 MiB
    # page. Splits of small blocks do not count in inactive_split either. empty_cache unmaps both
    # ranges whole (two unmap calls) and gives them back.
    "es_small_and_large_pages": ("1GiB", ES, [
        A(1, 4096), A(2, 1 * MiB), A(3, 1 * MiB), A(4, 3 * MiB), F(1), F(2), F(3), F(4), E(),
    ], {"reserved_bytes.small_pool.peak": 4 * MiB, "reserved_bytes.large_pool.peak": 20 * MiB,
        "num_device_alloc": 3, "num_device_free": 2, "inactive_split.all.allocated": 0,
        "model.reservations": 2, "model.reservations_released": 2}),
    # Two streams get ranges of their own: stream 7's 5 MiB does not use stream 0's free 15 MiB;
    # stream 0's second 5 MiB does; stream 7's 16 MiB grows its range by one page; stream 7's small
    # request reserves a third range. empty_cache gives all three back.
    "es_two_streams": ("1GiB", ES, [
        A(1, 5 * MiB, 0), A(2, 5 * MiB, 7), A(3, 5 * MiB, 0), A(4, 16 * MiB, 7), A(5, 4096, 7),
        F(1), F(2), F(3), F(4), F(5), E(),
    ], {"model.reservations": 3, "model.reservations_released": 3, "num_device_alloc": 4,
        "num_device_free": 3, "reserved_bytes.large_pool.peak": 60 * MiB,
        "reserved_bytes.small_pool.peak": 2 * MiB}),
    # Best fit by expandable size: [A 0-12][F 12-20 freed][A 20-35][F 35-40][U 40-]. 4 MiB finds
    # the 5 MiB block first, but it is followed by the unmapped rest (5 + 1120 MiB), so it moves on
    # to the 8 MiB block (8 < 1125) and splits that. 25 MiB then takes 35-40 and maps one page (60
    # MiB reserved); taking the 5 MiB block for 4 MiB would have left 1 MiB there and needed two
    # pages (80 MiB).
    "es_best_fit_expandable_size": ("1GiB", ES, [
        A(1, 12 * MiB), A(2, 8 * MiB), A(3, 15 * MiB), F(2), A(4, 4 * MiB), A(5, 25 * MiB),
        F(1), F(3), F(4), F(5),
    ], {"reserved_bytes.large_pool.peak": 60 * MiB, "num_device_alloc": 3,
        "allocated_bytes.large_pool.peak": 56 * MiB}),
    # Out of memory, and the retry's unmapping makes room (60 MiB device, large ranges of 4 pages):
    # stream 1 holds a cached 2 MiB small page and a cached 20 MiB large page; stream 0's 45 MiB
    # needs three pages (22 + 60 > 60): the release unmaps both cached pages (two unmap calls),
    # giving both stream 1 ranges back, and the retry maps the three pages in stream 0's range.
    "es_oom_retry_unmaps": ("60MiB", ES, [
        A(0, 4096, 1), F(0), A(1, 20 * MiB, 1), F(1), A(2, 45 * MiB, 0), F(2),
    ], {"num_alloc_retries": 1, "num_ooms": 0, "num_sync_all_streams": 1, "num_device_free": 2,
        "num_device_alloc": 3, "model.map_failures": 1, "model.reservations": 3,
        "model.reservations_released": 2, "reserved_bytes.all.current": 60 * MiB}),
    # A mapping failure (50 MiB device): [A 0-30][F 30-40][U 40-60]; 15 MiB takes the free 10 MiB and
    # needs one more page (40 + 20 > 50): it fails, changing nothing; the release finds no whole free
    # page to unmap; the retry fails the same way: out of memory. Once 0-30 is freed, 15 MiB is a
    # hit in the merged 40 MiB block.
    "es_map_fails": ("50MiB", ES, [
        A(1, 30 * MiB), A(2, 15 * MiB), F(2), F(1), A(3, 15 * MiB), F(3),
    ], {"num_ooms": 1, "num_alloc_retries": 1, "num_device_alloc": 1, "num_device_free": 0,
        "reserved_bytes.all.peak": 40 * MiB, "model.map_failures": 2,
        "allocation.all.allocated": 2}),
    # A chain whose second mapping fails (70 MiB device, range of 4 pages, 80 MiB): [A 0-20][U hole
    # 20-40][F 40-60][U 60-80]; 50 MiB maps the hole (60 MiB held; it merges 20-60) and then fails
    # on the last page (80 > 70), keeping the page it mapped; the release unmaps 20-60 again, and the
    # retry (three pages from 20) fails: out of memory. empty_cache then gives the range back.
    "es_chain_map_fails_midway": ("70MiB", ES, [
        A(1, 20 * MiB), A(2, 20 * MiB), A(3, 20 * MiB), F(2), E(), F(3), A(4, 50 * MiB), F(4),
        F(1), E(),
    ], {"num_device_alloc": 4, "num_device_free": 3, "num_sync_all_streams": 3,
        "num_alloc_retries": 1, "num_ooms": 1, "reserved_bytes.large_pool.peak": 60 * MiB,
        "reserved_bytes.large_pool.allocated": 80 * MiB, "model.map_failures": 2,
        "model.reservations_released": 1}),
    # With max_split_size 40 MiB: 30 MiB misses the cached 60 MiB block (oversize for it), but
    # find_expandable_block starts from that block (it is followed by the unmapped rest) and it is
    # big enough: it is handed over without mapping anything and split (expandable segments split
    # whenever 512 B remain), 30 + 30. 45 MiB then grows it by one page; no oversize segments.
    "es_mss_oversize_block_at_the_end": ("1GiB", ES + "," + M40, [
        A(1, 50 * MiB), F(1), A(2, 30 * MiB), A(3, 45 * MiB), A(4, 4 * MiB), F(2), F(3), F(4),
        E(),
    ], {"num_device_alloc": 2, "oversize_allocations.allocated": 2,
        "oversize_segments.allocated": 0,
        "allocated_bytes.large_pool.allocated": (50 + 30 + 45 + 4) * MiB,
        "reserved_bytes.large_pool.peak": 80 * MiB, "num_device_free": 1}),
    # With max_split_size 40 MiB, out of memory (100 MiB device, ranges of 6 pages): 60 MiB fits in
    # no chain of the first range and reserves a second one, whose three pages do not fit (100 MiB
    # held). release_available_cached_blocks passes over the cached 50 MiB block (expandable) and
    # returns false; the release unmaps its two whole pages; the retry fails again.
    "es_mss_oom": ("100MiB", ES + "," + M40, [
        A(1, 50 * MiB), A(2, 45 * MiB), F(1), A(3, 60 * MiB),
    ], {"num_ooms": 1, "num_alloc_retries": 1, "num_device_free": 1,
        "reserved_bytes.all.current": 60 * MiB, "model.release_available_short": 1,
        "model.release_available_ok": 0, "model.reservations": 2, "model.map_failures": 2}),
    # release_available_cached_blocks never releases an expandable block (80 MiB device, ranges of
    # 5 pages): [F 0-50][A 50-60][U 60-100]; 30 MiB misses the oversize 50 MiB block and needs two
    # new pages (100 > 80). The first key >= 40 MiB is that 50 MiB block, but it is expandable: the
    # search goes down the walk, which starts below the first block: false, nothing released. The
    # release unmaps its pages 0-40; the retry maps them again (the hole, 30 MiB needed, is all
    # mapped and merges with 40-50) and splits 30 + 20.
    "es_mss_release_passes_over": ("80MiB", ES + "," + M40, [
        A(1, 50 * MiB), A(2, 10 * MiB), F(1), A(3, 30 * MiB), F(2), F(3),
    ], {"num_device_free": 1, "num_alloc_retries": 1, "num_ooms": 0, "num_device_alloc": 2,
        "reserved_bytes.all.peak": 60 * MiB, "model.release_available_short": 1,
        "model.release_available_ok": 0}),
    # The range holds 1 1/8 of the device (100 MiB device: 6 pages, 120 MiB), so mapped pages can
    # reach past the device's size in addresses: [A 0-20][U hole 20-40][A 40-90][F 90-100][U
    # 100-120] after empty_cache, 80 MiB held. 25 MiB: the hole holds 20 before an allocated block;
    # the free 10 MiB and the sixth page hold 30: one page is mapped (100 MiB held), no out of
    # memory (a range of only 5 pages would need a new range and two pages).
    "es_range_beyond_capacity": ("100MiB", ES, [
        A(1, 20 * MiB), A(2, 20 * MiB), A(3, 50 * MiB), F(2), E(), A(4, 25 * MiB), F(1), F(3),
        F(4),
    ], {"num_ooms": 0, "num_alloc_retries": 0, "num_device_alloc": 4, "num_device_free": 1,
        "reserved_bytes.all.peak": 100 * MiB, "model.reservations": 1}),
    # The memory fraction (100 MiB of 200 MiB) is checked against the allocation size, not the
    # pages: at 82 MiB held, 12 MiB passes (94 <= 100) and maps a 20 MiB page (102 MiB reserved);
    # the next 12 MiB fails the check (114 > 100), with nothing to unmap: out of memory.
    "es_fraction_checks_alloc_size": ("200MiB", "per_process_memory_fraction:0.5," + ES, [
        A(1, 50 * MiB), A(2, 30 * MiB), A(3, 4096), A(4, 12 * MiB), A(5, 12 * MiB),
        F(1), F(2), F(3), F(4),
    ], {"reserved_bytes.all.peak": 102 * MiB, "num_ooms": 1, "num_alloc_retries": 1,
        "num_device_alloc": 4, "model.map_failures": 0, "model.failed_allocs": 1}),
    # Garbage collection never frees expandable blocks (fraction 0.5 of 200 MiB, collect above
    # 50 MiB): at 24 MiB and at 30 MiB it finds nothing to free; the 30 MiB miss fails the fraction
    # (80 + 30 > 100), the release unmaps the free page 0-20, and the retry maps one page.
    "es_gc_never_collects": ("200MiB", GC + "," + ES, [
        A(1, 20 * MiB), A(2, 22 * MiB), F(1), A(3, 24 * MiB), A(4, 30 * MiB), F(2), F(3), F(4),
    ], {"model.gc_runs": 0, "num_alloc_retries": 1, "num_ooms": 0, "num_device_free": 1,
        "reserved_bytes.all.current": 80 * MiB}),
}

# Private pools: short names for their calls, and three pool ids.
def PC(pool: tuple[int, int], use_on_oom: bool = False, no_split: bool = False) -> TraceOp:
    return trace_format.pool_op("pool_create", pool, use_on_oom=use_on_oom, no_split=no_split)


def PB(pool: tuple[int, int], stream: int | None = None) -> TraceOp:
    """pool_begin: the thread's pool (every later allocation of a replay), or a stream's."""
    return trace_format.pool_op("pool_begin", pool, stream=stream)


def PE(pool: tuple[int, int]) -> TraceOp:
    return trace_format.pool_op("pool_end", pool)


def PR(pool: tuple[int, int]) -> TraceOp:
    return trace_format.pool_op("pool_release", pool)


def PX(pool: tuple[int, int], live: bool = False) -> TraceOp:
    """pool_empty: PyTorch's emptyCache(pool), or with live accalloc's empty of a live pool."""
    return trace_format.pool_op("pool_empty", pool, live=live)


P1, P2, P3 = (0, 1), (0, 2), (0, 3)

# name -> (capacity, allocator settings ("" for none), ops, expected values in the model's output)
CRAFTED_POOLS: dict[str, tuple[str, str, list[TraceOp], dict[str, object]]] = {
    # Isolation both ways: P1's first request gets a segment of its own although the default pools
    # cache a free one (S0); default requests split S0 and never touch P1's free segment S1; P1's
    # second request splits S1. empty_cache releases S0 only: P1 is live (three uses).
    "pool_isolation": ("1GiB", "", [
        A(1, 4096), F(1), PC(P1), PB(P1), A(2, 4096), PE(P1), A(3, 4096), F(2), A(4, 8192),
        PB(P1), A(5, 8192), PE(P1), F(3), F(4), F(5), E(),
    ], {"num_device_alloc": 2, "num_device_free": 1, "segment.all.current": 1,
        "model.pool_mallocs": 2, "model.pool_segment_allocs": 1, "model.pools_left": 1}),
    # Routing, newest capture first: P1 by thread (every request), P2 by stream 5 on top of it.
    # Stream 0 -> P1 (segment 1); stream 5 -> P2 (2). P2 ended: stream 5 -> P1 (3, P1's segment is
    # stream 0's). P2 again: stream 5 reuses segment 2. P3 by thread on top: streams 5 and 0 both go
    # to P3 (4, 5). All ended: default (6). Oldest-first routing would make 3 segments, not 6.
    "pool_routes_nested": ("1GiB", "", [
        PB(P1), PB(P2, 5), A(1, 4096, 0), A(2, 4096, 5), PE(P2), A(3, 4096, 5), PB(P2, 5),
        A(4, 4096, 5), PB(P3), A(5, 4096, 5), A(6, 4096, 0), PE(P3), PE(P2), PE(P1),
        A(7, 4096, 5), *[F(i) for i in range(1, 8)], E(),
    ], {"num_device_alloc": 6, "model.pool_segment_allocs": 5, "model.pool_mallocs": 6,
        "num_device_free": 1, "segment.all.current": 5}),
    # Use counts: create 1, begin 2, release 1 (live: empty_cache keeps its free small segment),
    # release 0 (freeable: empty_cache releases the small segment but keeps the split large one and
    # the pool). The 3 MiB block freed after its pool was released goes back to the pool and merges
    # whole; a default 3 MiB request does not take it (a segment of its own); the last empty_cache
    # releases both and erases the pool.
    "pool_release_then_free": ("1GiB", "", [
        PC(P1), PB(P1), A(1, 3 * MiB), A(2, 4096), PE(P1), PR(P1), F(2), E(), PR(P1), E(), F(1),
        A(3, 3 * MiB), F(3), E(),
    ], {"num_device_alloc": 3, "num_device_free": 3, "num_sync_all_streams": 3,
        "model.pools_erased": 1, "model.pools_left": 0, "segment.all.current": 0,
        "inactive_split.large_pool.allocated": 2}),
    # PyTorch's emptyCache(pool) does nothing to a live pool or to an unknown one.
    "pool_empty_live_pool_noop": ("1GiB", "", [
        PC(P1), PB(P1), A(1, 4096), A(2, 3 * MiB), PE(P1), F(1), F(2), PX(P1), PX((7, 0)),
    ], {"num_device_free": 0, "num_sync_all_streams": 0, "model.pools_left": 1,
        "segment.all.current": 2}),
    # accalloc's empty of a live pool: the whole free small segment goes (the large one is split);
    # then the large one; the pool stays (two uses); released twice it is erased by the next empty
    # although there is nothing left to release. Each call synchronizes as empty_cache does.
    "pool_empty_live_true": ("1GiB", "", [
        PC(P1), PB(P1), A(1, 4096), A(2, 3 * MiB), A(3, 4096), PE(P1), F(1), F(3), PX(P1, True),
        F(2), PX(P1, True), PR(P1), PR(P1), PX(P1, True),
    ], {"num_device_free": 2, "num_sync_all_streams": 3, "model.pools_erased": 1,
        "model.pools_left": 0, "segment.all.current": 0}),
    # no_split: 1000 B gets a whole 2 MiB segment, and so does the next one (a second segment);
    # 3 MiB a whole 20 MiB one; 500 B reuses the first 2 MiB block whole. A later create without
    # the flag leaves it set (6: a third whole 2 MiB segment). A default request still splits.
    "pool_no_split": ("1GiB", "", [
        PC(P1, no_split=True), PB(P1), A(1, 1000), A(2, 1000), A(3, 3 * MiB), F(1), A(4, 500),
        PE(P1), PC(P1), PB(P1), A(6, 1000), PE(P1), A(5, 1000), F(2), F(3), F(4), F(5), F(6),
    ], {"allocated_bytes.all.allocated": 28 * MiB + 1024,
        "allocated_bytes.all.peak": 26 * MiB + 1024,
        "requested_bytes.all.allocated": 3 * MiB + 4500, "inactive_split.all.allocated": 1,
        "num_device_alloc": 5, "model.no_split_whole": 5}),
    # use_on_oom (40 MiB device): P1 holds a 20 MiB segment, 5 MiB used. Default 12 MiB, then
    # 10 MiB: no room (42 > 40), and right after that first failure P1's free 15 MiB block serves it
    # (split, 5 MiB left; no retry, no synchronisation), going back to P1 when freed. The same
    # request on stream 1 finds no block of its stream in P1: the release of every cached block
    # frees nothing (the default pools cache nothing, P1 is live) and the retry fails: out of
    # memory. On stream 0 again it is served by P1. A request routed to P2 (a thread's pool, no
    # capture: it takes the last resort, a retry) never borrows from P1: out of memory. Tried after
    # the last resort, the two hits would count two retries more.
    "pool_use_on_oom": ("40MiB", "", [
        PC(P1, use_on_oom=True), PB(P1), A(1, 5 * MiB), PE(P1), A(2, 12 * MiB), A(3, 10 * MiB),
        F(3), A(4, 10 * MiB, 1), A(5, 10 * MiB), F(5), PB(P2), A(6, 10 * MiB), PE(P2), F(2), F(1),
        E(),
    ], {"model.use_on_oom_hits": 2, "num_ooms": 2, "num_alloc_retries": 2,
        "num_sync_all_streams": 3, "num_device_alloc": 2, "num_device_free": 1,
        "segment.all.current": 1, "model.last_resort_skipped": 0}),
    # use_on_oom comes before release_available_cached_blocks and the last resort (max_split_size
    # 20 MiB, 100 MiB device): P1 caches a free whole 30 MiB segment, the default pools a 50 MiB
    # one (too large for 25 MiB: 50 >= 25 + 20). 25 MiB needs a 26 MiB segment (106 > 100); P1's
    # 30 MiB block serves it whole (25 >= max_split_size: no split). Tried later, the 50 MiB segment
    # would have been released (release_available_cached_blocks) for a new 26 MiB one. empty_cache
    # releases the 50 MiB segment (P1 is live).
    "pool_use_on_oom_first": ("100MiB", M20, [
        PC(P1, use_on_oom=True), PB(P1), A(1, 30 * MiB), PE(P1), F(1), A(2, 50 * MiB), F(2),
        A(3, 25 * MiB), F(3), E(),
    ], {"model.use_on_oom_hits": 1, "model.release_available_ok": 0,
        "model.release_available_short": 0, "num_alloc_retries": 0, "num_sync_all_streams": 1,
        "num_device_alloc": 2, "num_device_free": 1, "num_ooms": 0,
        "allocated_bytes.large_pool.allocated": (30 + 50 + 30) * MiB,
        "oversize_allocations.allocated": 3, "segment.all.current": 1}),
    # The same without the flag (set, then overwritten by a second create): both 10 MiB requests
    # run out of memory.
    "pool_use_on_oom_without_flag": ("40MiB", "", [
        PC(P1, use_on_oom=True), PC(P1), PB(P1), A(1, 5 * MiB), PE(P1), A(2, 12 * MiB),
        A(3, 10 * MiB), F(3), A(4, 10 * MiB), F(2), F(1), E(),
    ], {"model.use_on_oom_hits": 0, "num_ooms": 2, "num_alloc_retries": 2,
        "model.failed_allocs": 2, "num_sync_all_streams": 3}),
    # max_split_size 40 MiB (150 MiB device): the default pools cache an oversize 42 MiB segment;
    # P1 caches 50 and 46 MiB ones. P1's 30 MiB misses (oversize blocks), its new segment does not
    # fit (168 MiB), and release_available_cached_blocks releases from P1's own pool: its 46 MiB
    # block (not the default 42). The default pools' 30 MiB request then releases their 42 MiB.
    "pool_mss_release_available": ("150MiB", M40, [
        A(0, 42 * MiB), F(0), PC(P1), PB(P1), A(1, 50 * MiB), A(2, 45 * MiB), F(1), F(2),
        A(3, 30 * MiB), PE(P1), A(4, 30 * MiB), F(3), F(4),
    ], {"model.release_available_ok": 2, "num_device_free": 2, "num_alloc_retries": 0,
        "num_sync_all_streams": 0, "num_device_alloc": 5, "oversize_segments.allocated": 3,
        "segment.all.current": 3, "reserved_bytes.all.peak": 138 * MiB}),
    # During a capture (a pool begun for a stream) the last resort is skipped (40 MiB device, a free
    # 12 MiB default segment cached): 30 MiB on stream 5, routed to P1, fails without releasing it;
    # so does a default-pool request on stream 0. P1 is then ended and released (freeable, empty).
    # A pool begun for a thread (use_mem_pool's) is no capture: 30 MiB routed to P2 takes the last
    # resort (the default segment released, P1 erased) and its retry succeeds. Released, P2 goes
    # with the last empty_cache.
    "pool_skips_last_resort": ("40MiB", "", [
        A(1, 12 * MiB), F(1), PB(P1, 5), A(2, 30 * MiB, 5), A(3, 30 * MiB, 0), PE(P1), PR(P1),
        PB(P2), A(4, 30 * MiB), F(4), PE(P2), PR(P2), E(),
    ], {"num_ooms": 2, "num_alloc_retries": 1, "num_sync_all_streams": 2,
        "model.last_resort_skipped": 2, "num_device_free": 2, "num_device_alloc": 2,
        "model.failed_allocs": 2, "model.pool_mallocs": 2, "model.pool_segment_allocs": 1,
        "model.pools_erased": 2, "model.pools_left": 0}),
    # PyTorch's emptyCache(pool) of a freeable pool (P1 released to a use count of 0, a default
    # segment cached): it synchronizes first (num_sync_all_streams +1, the pool's blocks waiting on
    # events returned), releases P1's two segments and erases it, and leaves the default pools
    # alone.
    "pool_empty_freeable_syncs": ("1GiB", "", [
        PC(P1), PB(P1), A(1, 4096), A(2, 3 * MiB), PE(P1), F(1), F(2), PR(P1), PR(P1), A(3, 4096),
        F(3), PX(P1),
    ], {"num_device_free": 2, "model.pools_erased": 1, "segment.all.current": 1,
        "num_sync_all_streams": 1}),
    # empty_cache while P1 captures stream 5, with a cached default segment and a freeable P2
    # holding a free segment: P2's segment goes (P2 erased), but during a capture nothing
    # synchronizes and the default pools keep theirs.
    "empty_cache_during_capture": ("1GiB", "", [
        A(1, 4096), F(1), PB(P2), A(2, 4096), PE(P2), F(2), PR(P2), PB(P1, 5), E(), PE(P1),
    ], {"model.default_release_skipped": 1, "model.pools_erased": 1, "num_device_free": 1,
        "num_sync_all_streams": 0, "segment.all.current": 1}),
    # The same with P1 begun for a thread (use_mem_pool's, no capture): empty_cache synchronizes
    # and releases the default segment too.
    "empty_cache_during_thread_route": ("1GiB", "", [
        A(1, 4096), F(1), PB(P2), A(2, 4096), PE(P2), F(2), PR(P2), PB(P1), E(), PE(P1),
    ], {"model.default_release_skipped": 0, "model.pools_erased": 1, "num_device_free": 2,
        "num_sync_all_streams": 1, "segment.all.current": 0}),
    # With expandable segments on, a pool grows a reserved range of its own, as the default pools
    # do: P1's 3 MiB maps one 20 MiB page, and its 16.5 MiB fits in the rest (split by the
    # expandable rule: >= 512 B left); the default 3 MiB maps a page of another range. No segment
    # counts. The first empty_cache unmaps the default page only (P1 is live); released, P1's page
    # goes at the next one, its range with it, and the pool is erased.
    "pool_es_own_ranges": ("1GiB", ES, [
        PB(P1), A(1, 3 * MiB), A(2, 16 * MiB + 512 * KiB), PE(P1), A(3, 3 * MiB), F(1), F(2),
        F(3), E(), PR(P1), E(),
    ], {"segment.all.peak": 0, "model.maps": 2, "model.unmaps": 2, "model.reservations": 2,
        "model.reservations_released": 2, "model.pool_segment_allocs": 0,
        "model.pools_erased": 1, "model.pools_left": 0, "reserved_bytes.all.peak": 40 * MiB,
        "num_device_alloc": 2, "num_device_free": 2,
        "allocated_bytes.large_pool.allocated": 3 * MiB + 16 * MiB + 512 * KiB + 3 * MiB}),
}

# Cases where the model follows PyTorch and accalloc does not: name -> (capacity, settings, ops,
# expected values in the model's output, the keys expected to differ, the explanation). None at
# present.
KNOWN_DIFFERENCES: dict[str, tuple[str, str, list[TraceOp], dict[str, object], set[str], str]] = {}

# The sample traces again under settings: (trace file, capacity, settings, expected values).
GC_TRACE = "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5"
TRACE_RUNS: list[tuple[str, str, str, dict[str, object]]] = [
    *[(t, BIG_CAPACITY, M40,
       {"max_split_size": 40 * MiB, "oversize_segments.allocated": AtLeast(1)})
      for t in ("transformer_train.jsonl", "varying_sizes.jsonl", "random_rmm.jsonl")],
    # (The rounding shows in allocated_bytes: 91,050,464,256 / 132,983,952,896 / 282,436,756,480
    # bytes handed out in all under the default policy.)
    *[(t, BIG_CAPACITY, "roundup_power2_divisions:[1:4,64:8,>:2]",
       {"allocated_bytes.all.allocated": n})
      for t, n in (("transformer_train.jsonl", 95_397_504_000),
                   ("varying_sizes.jsonl", 136_241_656_832),
                   ("random_rmm.jsonl", 282_455_023_616))],
    *[(t, BIG_CAPACITY, M20 + ",max_non_split_rounding_mb:40",
       {"oversize_allocations.allocated": AtLeast(1)})
      for t in ("transformer_train.jsonl", "varying_sizes.jsonl", "random_rmm.jsonl")],
    # Capacities at which garbage collection fires (allowed = half, collection above 60% of that).
    ("transformer_train.jsonl", "6GiB", GC_TRACE, {"model.gc_runs": AtLeast(1), "num_ooms": 0}),
    ("varying_sizes.jsonl", "3GiB", GC_TRACE, {"model.gc_runs": AtLeast(1), "num_ooms": 0}),
    ("random_rmm.jsonl", "5GiB", GC_TRACE, {"model.gc_runs": AtLeast(1), "num_ooms": 0}),
    # Tight devices: release step 3 in real traces, succeeding and falling short.
    ("transformer_train.jsonl", "3GiB", M40, {"model.release_available_ok": AtLeast(1),
                                              "model.release_available_short": AtLeast(1)}),
    ("random_rmm.jsonl", "2GiB", "max_split_size_mb:64",
     {"model.release_available_short": AtLeast(1), "num_ooms": AtLeast(1)}),
    # Expandable segments: pages only, no segment and no inactive split block, ever.
    *[(t, BIG_CAPACITY, ES,
       {"segment.all.peak": 0, "inactive_split.all.peak": 0, "model.reservations": AtLeast(2),
        "num_alloc_retries": 0})
      for t in ("transformer_train.jsonl", "varying_sizes.jsonl", "random_rmm.jsonl")],
    # Tight devices: mappings fail, the release unmaps free pages, retries succeed or end in out
    # of memory.
    *[(t, cap, ES,
       {"num_alloc_retries": AtLeast(1), "num_ooms": n, "model.map_failures": AtLeast(1),
        "model.unmaps": AtLeast(1)})
      for t, cap, n in (("transformer_train.jsonl", "2800MiB", AtLeast(1)),
                        ("varying_sizes.jsonl", "700MiB", AtLeast(1)),
                        ("random_rmm.jsonl", "1900MiB", 0))],
    # With max_split_size: oversize allocations but never an oversize segment; on a tight device
    # release_available_cached_blocks never releases an expandable block.
    *[(t, BIG_CAPACITY, ES + "," + M40,
       {"oversize_allocations.allocated": AtLeast(1), "oversize_segments.allocated": 0})
      for t in ("transformer_train.jsonl", "varying_sizes.jsonl", "random_rmm.jsonl")],
    ("transformer_train.jsonl", "3GiB", ES + "," + M40,
     {"model.release_available_short": AtLeast(1), "model.release_available_ok": 0,
      "num_ooms": 0}),
    ("random_rmm.jsonl", "1800MiB", ES + ",max_split_size_mb:64",
     {"model.release_available_short": AtLeast(1), "model.release_available_ok": 0,
      "num_ooms": AtLeast(1)}),
    # Garbage collection frees no expandable block (without expandable segments, 14 collections
    # in this run).
    ("transformer_train.jsonl", "6GiB", GC_TRACE + "," + ES,
     {"model.gc_runs": 0, "num_ooms": 0, "num_device_free": AtLeast(1)}),
    # Every block handed out is split down to the rounded size (a remainder is 0 or >= 512), so
    # allocated_bytes is the sum of the rounded sizes: 135,741,835,264 with these divisions
    # (132,488,590,848 without).
    ("varying_sizes.jsonl", BIG_CAPACITY, ES + ",roundup_power2_divisions:[1:4,64:8,>:2]",
     {"allocated_bytes.all.allocated": 135_741_835_264}),
]


# ---- running both sides -----------------------------------------------------------------------

def run(cmd: list[str], capacity: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ACCALLOC_HOST_CAPACITY=capacity)
    env.pop("ACCALLOC_CONF", None)  # the settings travel as --config only
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def run_both(trace: Path, capacity: str, settings: str | None) -> tuple[dict, dict, dict]:
    """accalloc's stats, the model's 122 keys, and the model's own counters (from its stderr)."""
    config = ["--config", settings] if settings else []
    got = json.loads(run([str(ACCALLOC), "replay", str(trace), "--json", "--simulate", *config],
                         capacity).stdout)["stats"]
    proc = run([sys.executable, str(MODEL), str(trace), *config], capacity)
    want = json.loads(proc.stdout)
    extra = json.loads(proc.stderr.strip().splitlines()[-1])
    return got, want, extra


def check(name: str, trace: Path, capacity: str, expect: dict[str, object] | None = None,
          settings: str | None = None,
          known: tuple[set[str], str] | None = None) -> bool:
    case = f"{name} (ACCALLOC_HOST_CAPACITY={capacity}"
    case += f", --config {settings})" if settings else ")"
    try:
        got, want, extra = run_both(trace, capacity, settings)
    except (RuntimeError, KeyError, IndexError, json.JSONDecodeError) as e:
        print(f"FAIL {case}: {e}")
        return False
    problems = []
    if len(want) != 122:
        problems.append(f"  model printed {len(want)} keys, not 122")
    # accalloc's keys are its table of statistics (crates/core/src/caching/stats.rs): the model's
    # must be the same names.
    for side, keys in (("the model", set(want) - set(got)), ("accalloc", set(got) - set(want))):
        if keys:
            problems.append(f"  only {side} has the keys {sorted(keys)}")
    differing = [key for key in sorted(set(got) | set(want)) if got.get(key) != want.get(key)]
    diff_lines = [f"  {key}: accalloc={got.get(key)} model={want.get(key)}" for key in differing]
    for key, value in (expect or {}).items():
        have = extra.get(key) if key.startswith("model.") else want.get(key)
        if not value == have:
            problems.append(f"  case no longer covers its path: model {key}={have}, "
                            f"expected {value!r}")
    if known is not None:
        keys, note = known
        if problems or (differing and set(differing) != keys):
            print(f"FAIL {case} (a known difference that changed shape: {note})")
            print("\n".join(problems + diff_lines))
            return False
        if differing:
            print(f"known difference {case}: {note}")
            print("\n".join(diff_lines))
        else:
            print(f"ok {case}: NOTE accalloc now agrees; the known difference ({note}) is gone")
        return True
    if problems or differing:
        print(f"FAIL {case}")
        print("\n".join(diff_lines + problems))
        return False
    print(f"ok {case}")
    return True


def main(argv: list[str]) -> int:
    if not ACCALLOC.exists():
        subprocess.run(["cargo", "build", "--release"], cwd=ROOT, check=True)
    traces = [Path(t) for t in argv[1:]] or sorted(Path(p) for p in glob.glob(str(ROOT / "examples/traces/*.jsonl")))
    results = []
    for trace in traces:
        results.append(check(trace.name, trace.resolve(), BIG_CAPACITY))
    transformer = ROOT / "examples" / "traces" / "transformer_train.jsonl"
    if transformer.exists() and not argv[1:]:
        # A tighter device: the OOM release-and-retry path runs (and succeeds) in a real trace.
        results.append(check(transformer.name, transformer, "3GiB", {"num_alloc_retries": 1}))
    if not argv[1:]:
        # Real models' traces (python/benchmarks/record_traces.py), as recorded and with PyTorch's
        # expandable segments.
        for trace in sorted((ROOT / "examples" / "traces" / "real").glob("*.jsonl")):
            for settings in (None, ES):
                results.append(check(f"real/{trace.name}", trace, BIG_CAPACITY, None, settings))
        for name, capacity, settings, expect in TRACE_RUNS:
            trace = ROOT / "examples" / "traces" / name
            if trace.exists():
                results.append(check(name, trace, capacity, expect, settings))
    if argv[1:]:
        passed = sum(results)
        print(f"{passed} passed, {len(results) - passed} failed")
        return 0 if passed == len(results) else 1
    with tempfile.TemporaryDirectory(prefix="accalloc-model-") as tmp:
        for name, (capacity, ops, expect) in CRAFTED.items():
            path = Path(tmp) / f"{name}.jsonl"
            trace_format.write_trace(path, ops)
            results.append(check(name, path, capacity, expect))
        for name, (capacity, settings, ops, expect) in (*CRAFTED_SETTINGS.items(),
                                                        *CRAFTED_EXPANDABLE.items(),
                                                        *CRAFTED_POOLS.items()):
            path = Path(tmp) / f"{name}.jsonl"
            trace_format.write_trace(path, ops)
            results.append(check(name, path, capacity, expect, settings))
        for name, (capacity, settings, ops, expect, keys, note) in KNOWN_DIFFERENCES.items():
            path = Path(tmp) / f"{name}.jsonl"
            trace_format.write_trace(path, ops)
            results.append(check(name, path, capacity, expect, settings, known=(keys, note)))
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
