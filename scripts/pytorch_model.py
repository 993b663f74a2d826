#!/usr/bin/env python3
"""An independent reference model of PyTorch's CUDA caching allocator, for differential testing.

It follows DeviceCachingAllocator in c10/cuda/CUDACachingAllocator.cpp (no record_stream, so no
pending events) on a single simulated device of capacity C bytes, under the default policy or under
the allocator settings that change it (max_split_size_mb, max_non_split_rounding_mb,
roundup_power2_divisions, garbage_collection_threshold, per_process_memory_fraction,
expandable_segments), and prints the 122 flat keys of torch.cuda.memory_stats() as one sorted JSON
object.

Usage: python3 scripts/pytorch_model.py TRACE.jsonl [--config SETTINGS]
  TRACE: JSON lines {"op":"alloc","id":7,"size":4096,"stream":0}, {"op":"free","id":7},
         {"op":"empty_cache"} and the private pools' pool_create, pool_begin, pool_end,
         pool_release, pool_empty (scripts/trace_format.py). "stream" defaults to 0; a "device"
         other than 0 is an error, and so is a pool call the rules refuse.
  SETTINGS: PYTORCH_ALLOC_CONF syntax, e.g. "max_split_size_mb:40,roundup_power2_divisions:[4:2]".
         Without --config, the ACCALLOC_CONF environment variable, if set. Keys:
         max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions,
         garbage_collection_threshold, per_process_memory_fraction, expandable_segments, and (no
         effect on the numbers) release_lock_on_cudamalloc / release_lock_on_malloc, backend:native.
  ACCALLOC_HOST_CAPACITY: device capacity in bytes, or with a binary unit (512MiB, 3GiB); default: the
         machine's physical memory.

The simulated device hands out addresses as accalloc's simulated device does (so that ties between
free blocks of equal size break the same way): the first segment at 0x7f0000000000, each later one
at the previous address + (its size rounded up to 2 MiB) + 2 MiB, never reused. A raw allocation
fails when the bytes held + its size > C.

Expandable segments (expandable_segments:True) follow the same file: alloc_block maps pages of a
reserved range through try_allocate_expandable_block / find_expandable_block / map_block instead of
asking for a segment, release_blocks unmaps the whole free pages of free blocks (unmap_block), and the
other functions take their expandable branches (get_free_block's expandable size, should_split,
try_merge_blocks never merging a mapped with an unmapped block, no inactive_split counting,
release_available_cached_blocks and garbage collection skipping expandable blocks). The simulated
device reserves address ranges as accalloc's does: from 0x7f0000000000 + 2^39, each the next at
+ (its size rounded up to 2 MiB) + 2 MiB, never reused; a range is ceil((C + C/8) / page) pages of
2 MiB (small pool) or 20 MiB (large pool) and costs nothing; mapping n pages fails (out of memory, no
side effect) when the bytes held (ordinary segments and mapped pages) + n pages > C. The explicit
skips of expandable blocks in release_available_cached_blocks and garbage_collect_cached_blocks are
current PyTorch's; older versions had none there (garbage collection skipped them all the same, an
expandable block always being split; release_available_cached_blocks would have hit release_block's
assertion).

Which PyTorch: the settings follow current PyTorch (AcceleratorAllocatorConfig in
c10/core/AllocatorConfig.cpp, CUDAAllocatorConfig, CUDACachingAllocator.cpp, 2025-2026). Two
details changed over PyTorch's history; the model follows the current code. In
roundup_power2_divisions' list form, ">:D" fills the buckets after the last one named (std::fill
from last_index + 1; an earlier parser started at last_index, overwriting the last named bucket).
A memory fraction of exactly 1.0 means "no fraction": in the versions that have the
per_process_memory_fraction key (added by PR 161035, 2025), the constructor calls
setMemoryFraction(per_process_memory_fraction()) and a fraction of 1.0 leaves
allowed_memory_maximum std::nullopt, so garbage collection stays off; in older versions
setMemoryFraction set set_fraction = true for any fraction, 1.0 included.

Private pools (PrivatePool: MemPool's and CUDA graphs' pools) follow the same file as torch 2.15
has it (the use_on_oom timing and the capture rules checked by disassembling malloc and
release_cached_blocks in its libc10_cuda.so), which accalloc follows: create_or_incref_pool,
beginAllocateToPool (captures_underway routes the allocations its filter accepts; a replay has one
thread, so a thread's pool takes every allocation, a stream's those on its stream; the newest entry
that accepts wins, as get_pool has scanned captures_underway since PR 168382), endAllocateToPool,
releasePool, emptyCache(id) (a freeable pool: synchronize, release, erase if empty); malloc's
use_on_oom pools (try_mempool_fallback, right after the first failed allocation of a default-pool
request, before release_available_cached_blocks and the last resort: a hit counts no retry);
the capture rules, which hold only while a CUDA graph is being captured (is_capture_context: a pool
begun for a stream; a pool begun for a thread, use_mem_pool's, routes but is no capture): malloc
processes no events and skips the last-resort release of every cached block, and
release_cached_blocks neither synchronizes nor releases the default pools (the freeable pools, use
count 0, are released and erased once they hold no segment all the same); should_split's no_split
pools; with expandable segments on, a private pool (none has an allocator of its own here) maps
pages of reserved ranges of its own, as the default pools do. accalloc's own rules are modelled where
PyTorch has none: a pool still begun, or still holding a reserved range, is never erased (PyTorch
asserts, or erases a pool whose mapped pages are in use), and pool_empty with live true empties a
live pool.

One documented deviation of accalloc is modelled on purpose: a request whose segment allocation
size exceeds C fails at once without touching the cache; it counts in num_ooms and in no other
statistic (PyTorch would run garbage collection, the release paths and the retry first, counting
num_alloc_retries too). The
comparison is with C, the device's total, not with the memory fraction's allowed bytes.

Python 3.11, standard library only.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import sys

from trace_format import TraceOp, format_op, iter_trace

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Constants of CUDACachingAllocator.cpp.
K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: every size rounds up to a multiple of this
K_SMALL_SIZE = 1 * MiB  # kSmallSize: largest "small" request
K_SMALL_BUFFER = 2 * MiB  # kSmallBuffer: segment size for small requests
K_LARGE_BUFFER = 20 * MiB  # kLargeBuffer: segment size for requests between 1 and 10 MiB
K_MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: from here a request gets its own rounded segment
K_ROUND_LARGE = 2 * MiB  # kRoundLarge: rounding of those segments

# AllocatorConfig: roundup_power2_divisions has one entry per power-of-two interval from 1 MiB
# (kRoundUpPowerOfTwoStart) to 64 GiB (kRoundUpPowerOfTwoEnd).
K_ROUNDUP_INTERVALS = 16
K_ROUNDUP_START_LOG2 = 20

# accalloc's simulated device.
SIM_BASE_ADDRESS = 0x7F0000000000
SIM_ADDRESS_ALIGN = 2 * MiB
SIM_ADDRESS_GAP = 2 * MiB
SIM_RESERVE_BASE = SIM_BASE_ADDRESS + (1 << 39)  # where expandable ranges are reserved

# The statistics' names (tests/stats_table.rs checks them, and the scalars memory_stats() writes,
# against accalloc's table of statistics, DeviceStats in crates/core/src/caching/stats.rs).
POOLS = ("all", "small_pool", "large_pool")
FIELDS = ("current", "peak", "allocated", "freed")
# StatType arrays (allocation, segment, active, inactive_split, *_bytes) and plain Stats.
ARRAY_FAMILIES = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
SINGLE_FAMILIES = ("oversize_allocations", "oversize_segments")


class OutOfMemory(Exception):
    """The OutOfMemoryError thrown by malloc; `tried` is the "Tried to allocate" figure."""

    def __init__(self, tried: int):
        super().__init__(f"out of memory. Tried to allocate {tried} bytes")
        self.tried = tried


# ---- allocator settings ------------------------------------------------------------------------

class Settings:
    """The settings of AcceleratorAllocatorConfig / CUDAAllocatorConfig that change the policy.

    max_split_size None is PyTorch's SIZE_MAX (unset); memory_fraction None is
    allowed_memory_maximum = std::nullopt (no fraction, which a fraction of exactly 1.0 also gives).
    """

    def __init__(self) -> None:
        self.max_split_size: int | None = None
        self.max_non_split_rounding = K_LARGE_BUFFER  # max_non_split_rounding_size_: kLargeBuffer
        self.roundup_power2_divisions = [0] * K_ROUNDUP_INTERVALS
        self.garbage_collection_threshold = 0.0
        self.memory_fraction: float | None = None
        self.expandable_segments = False  # CUDAAllocatorConfig::expandable_segments()

    def divisions_for(self, size: int) -> int:
        # AcceleratorAllocatorConfig::roundup_power2_divisions(size): bucket floor(log2(size)) - 20,
        # clamped to 0..15.
        index = max(0, size.bit_length() - 1 - K_ROUNDUP_START_LOG2)
        return self.roundup_power2_divisions[min(index, K_ROUNDUP_INTERVALS - 1)]


def _lex(text: str) -> list[str]:
    # ConfigTokenizer: ',', ':', '[' and ']' are tokens of their own; spaces are dropped.
    tokens: list[str] = []
    buf = ""
    for ch in text:
        if ch in ",:[]":
            if buf:
                tokens.append(buf)
                buf = ""
            tokens.append(ch)
        elif ch != " ":
            buf += ch
    if buf:
        tokens.append(buf)
    return tokens


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def parse_settings(text: str) -> Settings:
    """AcceleratorAllocatorConfig::parseArgs, plus CUDAAllocatorConfig's memory fraction key."""
    st = Settings()
    tokens = _lex(text)
    pos = 0

    def take(expect: str | None = None) -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"allocator settings {text!r}: unexpected end")
        tok = tokens[pos]
        pos += 1
        if expect is not None and tok != expect:
            raise ValueError(f"allocator settings {text!r}: expected {expect!r}, got {tok!r}")
        return tok

    def integer(key: str, tok: str) -> int:
        if not tok.isdigit():
            raise ValueError(f"allocator settings: {key} needs an integer, got {tok!r}")
        return int(tok)

    def number(key: str, tok: str) -> float:
        try:
            return float(tok)
        except ValueError:
            raise ValueError(f"allocator settings: {key} needs a number, got {tok!r}") from None

    def boolean(key: str, tok: str) -> bool:
        if tok not in ("True", "False"):
            raise ValueError(f"allocator settings: {key} needs True or False, got {tok!r}")
        return tok == "True"

    while pos < len(tokens):
        key = take()
        take(":")
        if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
            mb = integer(key, take())
            if mb < K_LARGE_BUFFER // MiB:  # min_allowed_split_size_mb = kLargeBuffer / kMB
                raise ValueError(f"allocator settings: {key} too small, must be >= 20")
            if key == "max_split_size_mb":
                st.max_split_size = mb * MiB
            else:
                st.max_non_split_rounding = mb * MiB
        elif key == "garbage_collection_threshold":
            t = number(key, take())
            if not 0.0 < t < 1.0:
                raise ValueError("allocator settings: garbage_collection_threshold must be in "
                                 "(0, 1)")
            st.garbage_collection_threshold = t
        elif key == "per_process_memory_fraction":
            f = number(key, take())
            if not 0.0 <= f <= 1.0:
                raise ValueError("allocator settings: per_process_memory_fraction must be in "
                                 "[0, 1]")
            # The constructor calls setMemoryFraction(per_process_memory_fraction()): a fraction < 1
            # sets allowed_memory_maximum, 1.0 leaves it std::nullopt.
            st.memory_fraction = f if f < 1.0 else None
        elif key == "roundup_power2_divisions":
            divs = [0] * K_ROUNDUP_INTERVALS
            tok = take()
            if tok == "[":
                first_value = True
                last_index = 0
                while True:
                    bound = take()
                    if bound == "]":
                        break
                    take(":")
                    d = integer(key, take())
                    if d != 0 and not _is_pow2(d):
                        raise ValueError("allocator settings: divisions must be a power of 2 or 0")
                    if bound == ">":
                        # Every bucket after the last one named (last_index + 1 in current PyTorch).
                        for i in range(last_index + 1, K_ROUNDUP_INTERVALS):
                            divs[i] = d
                    else:
                        b = integer(key, bound)
                        if not _is_pow2(b):
                            raise ValueError("allocator settings: intervals must be powers of 2")
                        index = min(b.bit_length() - 1, K_ROUNDUP_INTERVALS - 1)
                        if first_value:  # the first entry also sets every bucket below it
                            for i in range(index):
                                divs[i] = d
                            first_value = False
                        divs[index] = d
                        last_index = index
                    nxt = take()
                    if nxt == "]":
                        break
                    if nxt != ",":
                        raise ValueError(f"allocator settings {text!r}: expected ',' or ']'")
            else:
                d = integer(key, tok)
                if not _is_pow2(d):
                    raise ValueError("allocator settings: divisions must be a power of 2")
                divs = [d] * K_ROUNDUP_INTERVALS
            st.roundup_power2_divisions = divs
        elif key == "expandable_segments":
            st.expandable_segments = boolean(key, take())
        elif key in ("release_lock_on_cudamalloc", "release_lock_on_malloc"):
            boolean(key, take())  # when the lock is held changes no number
        elif key == "backend":
            if take() != "native":
                raise ValueError("only backend:native is modelled")
        else:
            raise ValueError(f"allocator settings: unknown or unmodelled key {key!r}")
        if pos < len(tokens):
            take(",")
    return st


class Block:
    """struct Block: a piece of a segment, linked to its neighbours in that segment."""

    __slots__ = ("stream", "size", "addr", "small", "owner", "prev", "next", "allocated",
                 "requested_size", "gc_count_base", "mapped", "es")

    def __init__(self, stream: int, size: int, addr: int, small: bool,
                 owner: PrivatePool | None = None):
        self.stream = stream
        self.size = size
        self.addr = addr
        self.small = small  # which pool (small_blocks / large_blocks) the block belongs to
        # Block::pool->owner_PrivatePool: the private pool whose BlockPool that is (None: the
        # default pools). A block stays its pool's for life: a free returns it there.
        self.owner = owner
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.requested_size = 0
        self.gc_count_base = 0  # the pool's get_free_blocks_call_count when last inserted
        self.mapped = True  # backed by pages; False only for the unmapped rest of an expandable range
        self.es: ExpandableSegment | None = None  # Block::expandable_segment_

    def splice(self, before: Block | None, after: Block | None) -> None:  # Block::splice
        if before is not None:
            assert before.next is after
            before.next = self
        self.prev = before
        if after is not None:
            assert after.prev is before
            after.prev = self
        self.next = after

    def is_split(self) -> bool:  # Block::is_split
        return self.prev is not None or self.next is not None

    def key(self) -> tuple[int, int, int]:  # BlockComparatorSize: (stream, size, ptr)
        return (self.stream, self.size, self.addr)


class PrivatePool:
    """struct PrivatePool: a pool of its own (a MemPool's, or a CUDA graph's) with its own small and
    large BlockPools, kept in graph_pools by its id (a pair; (0, 0) is the default pools)."""

    def __init__(self, pool_id: tuple[int, int]):
        self.id = pool_id
        # create_or_incref_pool: a new pool starts with one use (its creator's); releasePool
        # uncounts one; at 0 the pool is freeable (graph_pools_freeable).
        self.use_count = 1
        self.segments = 0  # cudaMalloc_count: its segments held from the device
        # Its expandable segments' reserved ranges (accalloc erases a pool only once it holds none)
        # and its BlockPools' unmapped sets.
        self.reservations = 0
        self.unmapped_keys: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        # Its BlockPools (sorted (stream, size, addr) keys) and their get_free_blocks_call_count.
        self.keys: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self.free_block_calls = {True: 0, False: 0}
        # MemPool(use_on_oom, no_split): PyTorch keeps them by id in use_on_oom_pools (setUseOnOOM
        # inserts or erases: the last call wins) and no_split_pools (setNoSplit only inserts).
        self.use_on_oom = False
        self.no_split = False


class ExpandableSegment:
    """struct ExpandableSegment: a reserved address range of max_handles pages of segment_size bytes,
    of which some are mapped (the handles that are set)."""

    def __init__(self, base: int, stream: int, segment_size: int, max_handles: int):
        self.base = base
        self.stream = stream
        self.segment_size = segment_size
        self.max_handles = max_handles

    def size(self) -> int:  # ExpandableSegment::size
        return self.max_handles * self.segment_size

    def segment_left(self, p: int) -> int:  # the page holding address p
        return (p - self.base) // self.segment_size

    def segment_right(self, p: int) -> int:  # the first page boundary at or after p
        return -(-(p - self.base) // self.segment_size)


class PyTorchModel:
    """DeviceCachingAllocator for one device, with its settings, plus a simulated device."""

    def __init__(self, capacity: int, settings: Settings | None = None):
        self.capacity = capacity
        self.settings = settings or Settings()
        st = self.settings
        # max_split_size as a number to compare with (SIZE_MAX when unset).
        self.max_split = st.max_split_size if st.max_split_size is not None else 1 << 64
        # setMemoryFraction: allowed_memory_maximum = static_cast<size_t>(fraction * total).
        self.allowed: int | None = None
        if st.memory_fraction is not None:
            self.allowed = int(st.memory_fraction * float(capacity))
        # Garbage collection (and its age counting) runs only with a fraction and a threshold.
        self.gc_enabled = self.allowed is not None and st.garbage_collection_threshold > 0.0
        # DeviceStats: Stat = [current, peak, allocated, freed]; arrays indexed by pool name.
        self.stats = {f: {p: [0, 0, 0, 0] for p in POOLS} for f in ARRAY_FAMILIES}
        self.single = {f: [0, 0, 0, 0] for f in SINGLE_FAMILIES}
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        # BlockPool::blocks, one sorted list of (stream, size, addr) per pool, and addr -> Block;
        # BlockPool::get_free_blocks_call_count per pool.
        self.pool_keys = {True: [], False: []}
        self.pool_blocks: dict[int, Block] = {}
        self.free_block_calls = {True: 0, False: 0}
        # The simulated device.
        self.held = 0  # total_allocated_memory: bytes of all live segments and mapped pages
        self.next_address = SIM_BASE_ADDRESS
        self.next_reservation = SIM_RESERVE_BASE
        # Expandable segments: CUDAAllocatorConfig::expandable_segments(); BlockPool::unmapped, one
        # sorted list of (stream, addr) per pool (BlockComparatorAddress), and addr -> Block.
        self.expandable = st.expandable_segments
        self.unmapped_keys = {True: [], False: []}
        self.unmapped_blocks: dict[int, Block] = {}
        # Private pools: graph_pools by id, and captures_underway: (id, route) oldest first, the
        # route a stream (a capture's filter) or None (a thread's filter: in a replay, everything).
        self.private_pools: dict[tuple[int, int], PrivatePool] = {}
        self.captures: list[tuple[tuple[int, int], int | None]] = []
        # Replay bookkeeping.
        self.live: dict[int, Block | None] = {}  # trace id -> block (None: a size-0 request)
        self.failed_ids: set[int] = set()
        self.failed_allocs = 0  # requests that ended in an out-of-memory error
        # Not statistics, for check_model.py's expectations: garbage collections that released
        # something, and release_available_cached_blocks calls that released enough / too little.
        self.gc_runs = 0
        self.release_available_ok = 0
        self.release_available_short = 0
        # Expandable segments: ranges reserved and released, map_block calls that mapped / failed,
        # unmap_block calls that unmapped something.
        self.reservations = 0
        self.reservations_released = 0
        self.maps = 0
        self.map_failures = 0
        self.unmaps = 0
        # Private pools: requests routed to one, segments made for them, pools erased, requests
        # served by a use_on_oom pool, last-resort releases skipped because of a capture, empty_cache
        # calls that left the default pools alone because of a capture, hand-outs kept whole by
        # no_split that would have been split.
        self.pool_mallocs = 0
        self.pool_segment_allocs = 0
        self.pools_erased = 0
        self.use_on_oom_hits = 0
        self.last_resort_skipped = 0
        self.default_release_skipped = 0
        self.no_split_whole = 0

    # ---- Stat::increase / Stat::decrease, for_each_selected_stat_type -------------------------

    @staticmethod
    def _increase(stat: list[int], n: int) -> None:
        # Stat::increase: current += n; peak = max(peak, current); allocated += n
        stat[0] += n
        stat[1] = max(stat[1], stat[0])
        stat[2] += n

    @staticmethod
    def _decrease(stat: list[int], n: int) -> None:
        # Stat::decrease: current -= n; freed += n
        stat[0] -= n
        stat[3] += n

    def increase(self, family: str, small: bool, n: int) -> None:
        # get_stat_types_for_pool: AGGREGATE plus SMALL_POOL or LARGE_POOL
        for p in ("all", "small_pool" if small else "large_pool"):
            self._increase(self.stats[family][p], n)

    def decrease(self, family: str, small: bool, n: int) -> None:
        for p in ("all", "small_pool" if small else "large_pool"):
            self._decrease(self.stats[family][p], n)

    # ---- sizes ----------------------------------------------------------------------------------

    def round_size(self, size: int) -> int:
        # round_size: < kMinBlockSize -> kMinBlockSize; else, when the size's interval has
        # divisions > 1 and size > kMinBlockSize * divisions, roundup_power2_next_division; else up
        # to a multiple of kMinBlockSize.
        if size < K_MIN_BLOCK_SIZE:
            return K_MIN_BLOCK_SIZE
        divisions = self.settings.divisions_for(size)
        if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
            return self.roundup_power2_next_division(size, divisions)
        return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)

    @staticmethod
    def roundup_power2_next_division(size: int, divisions: int) -> int:
        # A power of two stays; otherwise up to the next multiple of
        # PowerOf2Floor(size) >> floor(log2(divisions)) (the next power of two if that is 0).
        if _is_pow2(size):
            return size
        power2_floor = 1 << (size.bit_length() - 1)
        step = power2_floor >> (divisions.bit_length() - 1)
        if step == 0:
            return power2_floor << 1
        floor = size & ~(step - 1)
        return size if floor == size else floor + step

    @staticmethod
    def get_allocation_size(size: int) -> int:
        # get_allocation_size: 2 MiB for small, 20 MiB below 10 MiB, else rounded up to 2 MiB.
        if size <= K_SMALL_SIZE:
            return K_SMALL_BUFFER
        if size < K_MIN_LARGE_ALLOC:
            return K_LARGE_BUFFER
        return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)

    # ---- pools ----------------------------------------------------------------------------------

    def keys_of(self, owner: PrivatePool | None, small: bool) -> list[tuple[int, int, int]]:
        # The BlockPool a block or a request uses: the default pools' or a private pool's own.
        return self.pool_keys[small] if owner is None else owner.keys[small]

    def calls_of(self, owner: PrivatePool | None) -> dict[bool, int]:
        # Each BlockPool has its own get_free_blocks_call_count.
        return self.free_block_calls if owner is None else owner.free_block_calls

    def pool_insert(self, block: Block) -> None:  # BlockPool::insert_into_blocks
        # insert_into_blocks also stamps gc_count_base = get_free_blocks_call_count.
        block.gc_count_base = self.calls_of(block.owner)[block.small]
        bisect.insort(self.keys_of(block.owner, block.small), block.key())
        self.pool_blocks[block.addr] = block

    def pool_erase(self, block: Block) -> None:  # pool.blocks.erase(block)
        keys = self.keys_of(block.owner, block.small)
        i = bisect.bisect_left(keys, block.key())
        assert keys[i] == block.key()
        del keys[i]
        del self.pool_blocks[block.addr]

    def unmapped_of(self, owner: PrivatePool | None, small: bool) -> list[tuple[int, int]]:
        # The unmapped set of the default pools' or a private pool's BlockPool.
        return self.unmapped_keys[small] if owner is None else owner.unmapped_keys[small]

    def unmapped_insert(self, block: Block) -> None:  # pool.unmapped.insert(block)
        bisect.insort(self.unmapped_of(block.owner, block.small), (block.stream, block.addr))
        self.unmapped_blocks[block.addr] = block

    def unmapped_erase(self, block: Block) -> None:  # pool.unmapped.erase(block)
        keys = self.unmapped_of(block.owner, block.small)
        i = bisect.bisect_left(keys, (block.stream, block.addr))
        assert keys[i] == (block.stream, block.addr)
        del keys[i]
        del self.unmapped_blocks[block.addr]

    def gc_count(self, block: Block) -> int:  # Block::gc_count: lookups of its pool since cached
        return self.calls_of(block.owner)[block.small] - block.gc_count_base

    # ---- the simulated device (cudaMalloc / cudaFree) -------------------------------------------

    def device_malloc(self, size: int) -> int | None:
        if self.held + size > self.capacity:
            return None  # cudaErrorMemoryAllocation
        addr = self.next_address
        rounded = SIM_ADDRESS_ALIGN * ((size + SIM_ADDRESS_ALIGN - 1) // SIM_ADDRESS_ALIGN)
        self.next_address += rounded + SIM_ADDRESS_GAP
        self.held += size
        return addr

    def device_free(self, size: int) -> None:
        self.held -= size

    # ---- DeviceCachingAllocator::malloc and its helpers -----------------------------------------

    def malloc(self, orig_size: int, stream: int) -> Block:
        # process_events(): nothing to do without record_stream (and skipped while a capture is
        # underway).
        size = self.round_size(orig_size)
        small = size <= K_SMALL_SIZE  # get_pool: small_blocks when size <= kSmallSize
        # get_pool: the BlockPools of the newest pool begun whose filter accepts the request, else
        # the default pools. Everything below (best fit, new segments, release_available) uses them.
        owner = self.route(stream)
        if owner is not None:
            self.pool_mallocs += 1
        alloc_size = self.get_allocation_size(size)

        block = self.get_free_block(size, stream, small, owner)
        # (trigger_free_memory_callbacks: none registered.) accalloc's deviation: on a miss, a
        # segment no device of this capacity could ever hold fails at once, without releasing cached
        # memory; it counts in num_ooms and changes no other statistic. (With expandable segments
        # too: the same alloc_size is compared, although only the rounded size's pages would be
        # mapped.)
        if block is None and alloc_size > self.capacity:
            self.num_ooms += 1
            raise OutOfMemory(alloc_size)
        if block is None:
            # garbage_collect_cached_blocks when a fraction is set and the threshold > 0.
            if self.gc_enabled:
                self.garbage_collect_cached_blocks()
            block = self.alloc_block(size, alloc_size, stream, small, False, owner)
            if block is None and owner is None:
                # try_mempool_fallback, right after the first failed allocation: a default-pool
                # request may take a free block of a use_on_oom pool (by id here; PyTorch's set is
                # unordered). No new segment, no synchronisation, not a retry.
                block = self.use_on_oom_block(size, stream, small)
            # release_available_cached_blocks (false when max_split_size is unset), then ask again:
            # not counted as a retry.
            if block is None and self.release_available_cached_blocks(size, stream, small, owner):
                block = self.alloc_block(size, alloc_size, stream, small, False, owner)
            if block is None:
                # C10_LIKELY(!is_capture_context) && release_cached_blocks && retry: while a
                # capture is underway (a pool begun for a stream; a thread's pool, use_mem_pool's,
                # is none) the last resort is not taken, and nothing counts as a retry.
                if self.capturing():
                    self.last_resort_skipped += 1
                else:
                    self.release_cached_blocks()  # always returns true
                    block = self.alloc_block(size, alloc_size, stream, small, True, owner)
        if block is None:
            # malloc: stats.num_ooms += 1, then OutOfMemoryError naming alloc_size.
            self.num_ooms += 1
            raise OutOfMemory(alloc_size)
        split_remainder = self.should_split(block, size)
        return self.alloc_found_block(block, size, orig_size, split_remainder)

    def capturing(self) -> bool:
        # is_capture_context (torch 2.15): a CUDA graph capture is underway, i.e. a pool begun for
        # a stream. A pool begun for a thread (use_mem_pool) routes allocations but is no capture:
        # events are processed, the last resort is taken and empty_cache releases the default pools
        # as without it (pytorch#159674's fix).
        return any(route is not None for _, route in self.captures)

    def route(self, stream: int) -> PrivatePool | None:
        # get_pool: captures_underway newest first (LIFO since PR 168382; before it, oldest first,
        # which sent nested use_mem_pool allocations to the outer pool: pytorch#161193). A thread's
        # filter accepts every request of a replay (one thread); a stream's, those on its stream.
        for pool_id, route in reversed(self.captures):
            if route is None or route == stream:
                return self.private_pools[pool_id]
        return None

    def use_on_oom_block(self, size: int, stream: int, small: bool) -> Block | None:
        # try_mempool_fallback (torch 2.15: right after the first failed allocation, before
        # release_available_cached_blocks and the last resort): for each use_on_oom pool,
        # get_free_block in its BlockPool of the request's size class (the normal best fit, stream
        # and max_split_size rules included; never a new segment). The use count ends where it
        # was. The block stays that pool's.
        for pool_id in sorted(self.private_pools):
            pool = self.private_pools[pool_id]
            if pool.use_on_oom:
                block = self.get_free_block(size, stream, small, pool)
                if block is not None:
                    self.use_on_oom_hits += 1
                    return block
        return None

    def get_free_block(self, size: int, stream: int, small: bool,
                       owner: PrivatePool | None = None) -> Block | None:
        # get_free_block: with garbage collection enabled, count the lookup (block ages); then
        # lower_bound of (stream, size, nullptr); a miss if the stream differs.
        if self.gc_enabled:
            self.calls_of(owner)[small] += 1
        keys = self.keys_of(owner, small)
        i = bisect.bisect_left(keys, (stream, size, 0))
        if i == len(keys) or keys[i][0] != stream:
            return None
        if self.pool_blocks[keys[i][2]].es is not None:
            # Expandable segments on (they are never turned off here): for best fit a free block
            # followed by an unmapped one counts as its size plus that unmapped size; while the found
            # block is expandable, move on to the next block of this stream if that one's
            # expandable size is smaller.
            assert self.expandable

            def expandable_size(b: Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

            j = i + 1
            while (self.pool_blocks[keys[i][2]].es is not None and j < len(keys)
                   and keys[j][0] == stream
                   and expandable_size(self.pool_blocks[keys[j][2]])
                   < expandable_size(self.pool_blocks[keys[i][2]])):
                i = j
                j += 1
        found_size = keys[i][1]
        # Do not return an oversized block for a request below max_split_size ...
        if size < self.max_split and found_size >= self.max_split:
            return None
        # ... and round a request >= max_split_size up by less than max_non_split_rounding only.
        if size >= self.max_split and found_size >= size + self.settings.max_non_split_rounding:
            return None
        block = self.pool_blocks[keys[i][2]]
        self.pool_erase(block)
        return block

    def garbage_collect_cached_blocks(self) -> None:
        # garbage_collect_cached_blocks: nothing until total_allocated_memory passes
        # threshold x allowed; then free whole cached large-pool segments whose age is at least the
        # average age, pass after pass, until the excess is reclaimed or a pass frees nothing.
        # No synchronisation (num_sync_all_streams does not move).
        gc_threshold = int(self.settings.garbage_collection_threshold * float(self.allowed))
        if self.held <= gc_threshold:
            return
        target_size = self.held - gc_threshold
        gc_reclaimed = 0
        total_age = 0
        freeable = 0
        for key in self.pool_keys[False]:
            b = self.pool_blocks[key[2]]
            if not b.is_split():
                total_age += self.gc_count(b)
                freeable += 1
        if freeable == 0:
            return
        block_freed = True
        freed_any = False
        while gc_reclaimed < target_size and block_freed and freeable > 0:
            age_threshold = total_age / freeable  # a double in PyTorch, correctly rounded here too
            block_freed = False
            for key in list(self.pool_keys[False]):  # in (stream, size, address) order
                b = self.pool_blocks[key[2]]
                if not b.is_split() and b.es is None and self.gc_count(b) >= age_threshold:
                    block_freed = freed_any = True
                    gc_reclaimed += b.size
                    total_age -= self.gc_count(b)
                    freeable -= 1
                    self.release_block(b)
        if freed_any:
            self.gc_runs += 1

    def alloc_block(self, size: int, alloc_size: int, stream: int, small: bool,
                    is_retry: bool, owner: PrivatePool | None = None) -> Block | None:
        # alloc_block: num_alloc_retries counts the retry attempt whether or not it succeeds.
        if is_retry:
            self.num_alloc_retries += 1
        # With a memory fraction: fail without asking the device past the allowed bytes.
        if self.allowed is not None and self.held + alloc_size > self.allowed:
            return None
        if self.expandable:
            # try_allocate_expandable_block with p.size(), the rounded request (not alloc_size), in
            # the request's own pool: a private pool with no allocator of its own grows expandable
            # segments of its own, as the default pools do.
            return self.try_allocate_expandable_block(stream, small, size, owner)
        addr = self.device_malloc(alloc_size)
        if addr is None:
            return None
        # Success: total_allocated_memory += size; segment +1, reserved_bytes +size;
        # oversize_segments +1 when size >= max_split_size; num_device_alloc +1; a private pool's
        # cudaMalloc_count +1. The statistics are the device's: a pool's segment counts as any.
        self.increase("segment", small, 1)
        self.increase("reserved_bytes", small, alloc_size)
        if alloc_size >= self.max_split:
            self._increase(self.single["oversize_segments"], 1)
        self.num_device_alloc += 1
        if owner is not None:
            owner.segments += 1
            self.pool_segment_allocs += 1
        return Block(stream, alloc_size, addr, small, owner)

    def release_available_cached_blocks(self, size: int, stream: int, small: bool,
                                        owner: PrivatePool | None = None) -> bool:
        # release_available_cached_blocks: only with max_split_size set. In this pool, the first
        # key >= (stream, max(size, M), nullptr): if it is of this stream, release that one block;
        # otherwise walk down from the key before it, releasing blocks of this stream that are
        # >= M, largest first, until max(size, M) bytes are released; false if they fall short.
        # Blocks of expandable segments are never released here: one found first sends the search
        # down the walk, and the walk passes over them without counting them (so with expandable
        # segments on, where every block is expandable, this releases nothing and returns false).
        if self.settings.max_split_size is None:
            return False
        m = self.max_split
        key_size = max(size, m)
        keys = self.keys_of(owner, small)  # p.pool: the request's own pool, private or default
        i = bisect.bisect_left(keys, (stream, key_size, 0))
        if i < len(keys) and keys[i][0] == stream and self.pool_blocks[keys[i][2]].es is None:
            self.release_block(self.pool_blocks[keys[i][2]])
            self.release_available_ok += 1
            return True
        if i == 0:
            self.release_available_short += 1
            return False
        total_released = 0
        i -= 1
        while total_released < key_size and keys[i][1] >= m and keys[i][0] == stream:
            cur = self.pool_blocks[keys[i][2]]
            is_first = i == 0
            if not is_first:
                i -= 1  # the keys below cur keep their index when cur is erased
            if cur.es is None:
                total_released += cur.size
                self.release_block(cur)
            if is_first:
                break
        if total_released < key_size:
            self.release_available_short += 1
            return False
        self.release_available_ok += 1
        return True

    def release_cached_blocks(self) -> bool:
        # release_cached_blocks(context, {0, 0}): while no capture is underway (a pool begun for a
        # thread is none), synchronize_and_free_events (num_sync_all_streams +1; no events to free
        # here), then release_blocks(large_blocks) and release_blocks(small_blocks); during a
        # capture neither (synchronizing is illegal then). Then every freeable private pool (use
        # count 0): its free whole segments go, and the pool is erased once it holds none.
        if self.capturing():
            self.default_release_skipped += 1
        else:
            self.synchronize_and_free_events()
            self.release_blocks(small=False)
            self.release_blocks(small=True)
        for pool_id in sorted(self.private_pools):
            pool = self.private_pools[pool_id]
            if pool.use_count == 0:
                self.release_pool_blocks(pool)
        return True

    def release_pool_blocks(self, pool: PrivatePool) -> None:
        # release_blocks(small_blocks) and release_blocks(large_blocks) of a private pool; erase it
        # when it is freeable and holds no segment (graph_pools.erase), unless it is still begun
        # (accalloc keeps it until it ends, as allocations still go there; PyTorch asserts later).
        self.release_blocks(small=True, owner=pool)
        self.release_blocks(small=False, owner=pool)
        begun = any(pool_id == pool.id for pool_id, _ in self.captures)
        if pool.use_count == 0 and pool.segments == 0 and pool.reservations == 0 and not begun:
            del self.private_pools[pool.id]
            self.pools_erased += 1

    def synchronize_and_free_events(self) -> None:
        self.num_sync_all_streams += 1

    def release_blocks(self, small: bool, owner: PrivatePool | None = None) -> None:
        # release_blocks: every cached block that is a whole segment (no prev, no next); then, for
        # every cached block of an expandable segment (gathered first, in pool order), unmap_block,
        # and release the reservation when the block has become the whole range, unmapped.
        to_unmap = []
        for key in list(self.keys_of(owner, small)):
            block = self.pool_blocks[key[2]]
            if block.es is not None:
                to_unmap.append(block)
            elif not block.is_split():
                self.release_block(block)
        for block in to_unmap:
            self.unmap_block(block)
            if block.prev is None and block.next is None:
                self.release_expandable_segment(block)

    def release_block(self, block: Block) -> None:
        # release_block: num_device_free +1, cudaFree, segment -1, reserved_bytes -size,
        # oversize_segments -1 when size >= max_split_size; erase from the pool.
        self.num_device_free += 1
        self.device_free(block.size)
        self.decrease("segment", block.small, 1)
        self.decrease("reserved_bytes", block.small, block.size)
        if block.size >= self.max_split:
            self._decrease(self.single["oversize_segments"], 1)
        if block.owner is not None:
            block.owner.segments -= 1  # cudaMalloc_count -1
        self.pool_erase(block)

    def should_split(self, block: Block, size: int) -> bool:
        # should_split: never in a no_split pool (the whole block goes, and every statistic counts
        # its whole size); else small pool, or any pool with expandable segments on, when
        # remaining >= kMinBlockSize; large pool when size < max_split_size and remaining > kSmallSize.
        remaining = block.size - size
        if block.small or self.expandable:
            split = remaining >= K_MIN_BLOCK_SIZE
        else:
            split = size < self.max_split and remaining > K_SMALL_SIZE
        if split and block.owner is not None and block.owner.no_split:
            self.no_split_whole += 1
            return False
        return split

    def alloc_found_block(self, block: Block, size: int, orig_size: int, split_remainder: bool) -> Block:
        small = block.small
        already_split = block.is_split()
        if split_remainder:
            # The caller's block is cut from the start; the remainder keeps the old Block object
            # (its address moves up by size) and goes back to the pool.
            remaining = block
            block = Block(remaining.stream, size, remaining.addr, small, remaining.owner)
            block.es = remaining.es
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.addr += size
            remaining.size -= size
            self.pool_insert(remaining)
            # (Blocks of expandable segments never count in inactive_split.)
            if already_split and block.es is None:
                # An already-split inactive block shrinks by size bytes.
                self.decrease("inactive_split_bytes", small, block.size)
            elif block.es is None:
                # A whole segment becomes split: a new inactive split block of remaining.size.
                self.increase("inactive_split_bytes", small, remaining.size)
                self.increase("inactive_split", small, 1)
        elif already_split and block.es is None:
            # An already-split inactive block becomes active as a whole.
            self.decrease("inactive_split_bytes", small, block.size)
            self.decrease("inactive_split", small, 1)

        block.allocated = True
        block.requested_size = orig_size
        self.increase("allocation", small, 1)
        self.increase("allocated_bytes", small, block.size)
        self.increase("active", small, 1)
        self.increase("active_bytes", small, block.size)
        self.increase("requested_bytes", small, orig_size)
        if block.size >= self.max_split:  # oversize_allocations +1 when size >= max_split_size
            self._increase(self.single["oversize_allocations"], 1)
        return block

    # ---- DeviceCachingAllocator::free and its helpers -------------------------------------------

    def free(self, block: Block) -> None:
        # free: allocation -1 and allocated_bytes -size at once, oversize_allocations -1 when
        # size >= max_split_size. No stream_uses, so straight to free_block.
        block.allocated = False
        self.decrease("allocation", block.small, 1)
        self.decrease("allocated_bytes", block.small, block.size)
        if block.size >= self.max_split:
            self._decrease(self.single["oversize_allocations"], 1)
        self.free_block(block)

    def free_block(self, block: Block) -> None:
        original_block_size = block.size
        requested_size = block.requested_size
        net_blocks = 0  # net_change_inactive_split_blocks
        net_bytes = 0  # net_change_inactive_split_size
        for candidate in (block.prev, block.next):
            subsumed = self.try_merge_blocks(block, candidate)
            if subsumed > 0:
                net_blocks -= 1
                net_bytes -= subsumed
        self.pool_insert(block)
        if block.is_split():
            net_blocks += 1
            net_bytes += block.size
        small = block.small
        # The inactive_split stats move by the NET change only (increase if > 0, decrease if < 0),
        # and never for a block of an expandable segment.
        if block.es is not None:
            net_blocks = net_bytes = 0
        if net_blocks > 0:
            self.increase("inactive_split", small, net_blocks)
        elif net_blocks < 0:
            self.decrease("inactive_split", small, -net_blocks)
        if net_bytes > 0:
            self.increase("inactive_split_bytes", small, net_bytes)
        elif net_bytes < 0:
            self.decrease("inactive_split_bytes", small, -net_bytes)
        self.decrease("active", small, 1)
        self.decrease("active_bytes", small, original_block_size)
        self.decrease("requested_bytes", small, requested_size)

    def try_merge_blocks(self, dst: Block, src: Block | None) -> int:
        # try_merge_blocks: merge a free neighbour (not allocated, no events, and mapped exactly
        # when dst is) into dst; src leaves pool.blocks or pool.unmapped.
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        assert dst.is_split() and src.is_split()
        if dst.prev is src:  # [src dst]
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:  # [dst src]
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        subsumed = src.size
        dst.size += subsumed
        if src.mapped:
            self.pool_erase(src)
        else:
            self.unmapped_erase(src)
        return subsumed

    # ---- expandable segments --------------------------------------------------------------------

    def reserve_range(self, size: int) -> int:
        # cuMemAddressReserve on accalloc's simulated device: rising, never reused.
        addr = self.next_reservation
        rounded = SIM_ADDRESS_ALIGN * ((size + SIM_ADDRESS_ALIGN - 1) // SIM_ADDRESS_ALIGN)
        self.next_reservation += rounded + SIM_ADDRESS_GAP
        return addr

    def find_expandable_block(self, stream: int, small: bool, size: int,
                              owner: PrivatePool | None) -> Block:
        # find_expandable_block: the lowest address, in any range of this stream and pool, from
        # which the chain of allocatable blocks (free mapped or unmapped) holds >= size bytes: walk
        # pool.unmapped from (stream, 0); for each unmapped block start from its previous block if
        # that one is allocatable. Otherwise reserve a new range (one unmapped block covering it).
        def allocatable(b: Block | None) -> bool:
            return b is not None and not b.allocated  # (no events without record_stream)

        def has_available_address_space(b: Block | None) -> bool:
            total = 0
            while total < size and allocatable(b):
                total += b.size
                b = b.next
            return total >= size

        keys = self.unmapped_of(owner, small)
        i = bisect.bisect_left(keys, (stream, 0))
        while i < len(keys) and keys[i][0] == stream:
            c = self.unmapped_blocks[keys[i][1]]
            if allocatable(c.prev):
                c = c.prev
            if has_available_address_space(c):
                return c
            i += 1
        segment_size = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        # Address space for 1 1/8 of the device's total memory, in whole pages.
        address_space_size = self.capacity + self.capacity // 8
        max_handles = -(-address_space_size // segment_size)
        es = ExpandableSegment(self.reserve_range(max_handles * segment_size), stream,
                               segment_size, max_handles)
        self.reservations += 1
        if owner is not None:
            owner.reservations += 1
        candidate = Block(stream, es.size(), es.base, small, owner)
        candidate.mapped = False
        candidate.es = es
        self.unmapped_insert(candidate)
        return candidate

    def map_block(self, to_map: Block, size: int) -> bool:
        # map_block: map the whole pages covering [ptr, ptr + size) of an unmapped block (which
        # starts on a page boundary); the unmapped rest becomes a block of its own after it; the
        # mapped block merges with free mapped neighbours and joins the pool. reserved_bytes
        # +mapped, num_device_alloc +1 (no segment count). False, changing nothing, when the device
        # has no room for the pages.
        es = to_map.es
        assert not to_map.mapped and 0 < size <= to_map.size
        begin = es.segment_left(to_map.addr)
        end = es.segment_right(to_map.addr + size)
        assert es.base + begin * es.segment_size == to_map.addr
        mapped_size = (end - begin) * es.segment_size
        if mapped_size == 0 or self.held + mapped_size > self.capacity:
            self.map_failures += 1
            return False
        self.unmapped_erase(to_map)
        to_map.mapped = True
        if mapped_size < to_map.size:
            remaining = Block(to_map.stream, to_map.size - mapped_size, to_map.addr + mapped_size,
                              to_map.small, to_map.owner)
            remaining.mapped = False
            remaining.es = es
            remaining.splice(to_map, to_map.next)
            self.unmapped_insert(remaining)
            to_map.size = mapped_size
        self.try_merge_blocks(to_map, to_map.prev)
        self.try_merge_blocks(to_map, to_map.next)
        self.pool_insert(to_map)
        self.held += mapped_size
        self.increase("reserved_bytes", to_map.small, mapped_size)
        self.num_device_alloc += 1
        self.maps += 1
        return True

    def try_allocate_expandable_block(self, stream: int, small: bool, size: int,
                                      owner: PrivatePool | None = None) -> Block | None:
        # try_allocate_expandable_block: map the candidate if it is unmapped (min(its size, size)
        # bytes), then, while it is smaller than size, map enough of the unmapped block after it
        # (which merges into it). A failed mapping returns nullptr and keeps what was mapped before.
        candidate = self.find_expandable_block(stream, small, size, owner)
        if not candidate.mapped and not self.map_block(candidate, min(candidate.size, size)):
            return None
        assert candidate.mapped
        while candidate.size < size:
            remaining = size - candidate.size
            new_candidate = candidate.next
            if not self.map_block(new_candidate, min(remaining, new_candidate.size)):
                return None
            candidate = new_candidate
        self.pool_erase(candidate)
        return candidate

    def unmap_block(self, block: Block) -> None:
        # unmap_block: unmap the whole pages inside a free mapped block of an expandable segment;
        # the pieces before and after stay mapped, free and cached; the unmapped part merges with
        # unmapped neighbours. reserved_bytes -unmapped, num_device_free +1. Nothing when no whole
        # page lies inside.
        es = block.es
        begin = es.segment_right(block.addr)
        end = es.segment_left(block.addr + block.size)
        if begin >= end:
            return
        self.pool_erase(block)
        unmapped_addr = es.base + begin * es.segment_size
        unmapped_size = (end - begin) * es.segment_size
        before_size = unmapped_addr - block.addr
        if before_size > 0:
            before_free = Block(block.stream, before_size, block.addr, block.small, block.owner)
            before_free.es = es
            before_free.splice(block.prev, block)
            self.pool_insert(before_free)
        after_size = block.size - (before_size + unmapped_size)
        if after_size > 0:
            after_free = Block(block.stream, after_size, unmapped_addr + unmapped_size, block.small,
                               block.owner)
            after_free.es = es
            after_free.splice(block, block.next)
            self.pool_insert(after_free)
        block.addr = unmapped_addr
        block.size = unmapped_size
        block.mapped = False
        self.try_merge_blocks(block, block.prev)
        self.try_merge_blocks(block, block.next)
        self.unmapped_insert(block)
        self.held -= unmapped_size
        self.decrease("reserved_bytes", block.small, unmapped_size)
        self.num_device_free += 1
        self.unmaps += 1

    def release_expandable_segment(self, block: Block) -> None:
        # release_expandable_segment: the range is wholly unmapped: give the reservation back.
        assert not block.mapped and block.size == block.es.size()
        self.unmapped_erase(block)
        self.reservations_released += 1
        if block.owner is not None:
            block.owner.reservations -= 1

    # ---- private pools --------------------------------------------------------------------------

    def create_or_incref_pool(self, pool_id: tuple[int, int]) -> PrivatePool:
        # create_or_incref_pool: a new pool with one use, or one use more of an existing one
        # (PyTorch asserts that an existing pool is still live; accalloc revives a freeable one).
        pool = self.private_pools.get(pool_id)
        if pool is None:
            pool = self.private_pools[pool_id] = PrivatePool(pool_id)
        else:
            pool.use_count += 1
        return pool

    def pool_create(self, pool_id: tuple[int, int], use_on_oom: bool, no_split: bool) -> None:
        # MemPool(allocator=None, use_on_oom, no_split): createOrIncrefPool, setUseOnOOM (the flag
        # is overwritten), and setNoSplit when asked (once set, it stays).
        pool = self.create_or_incref_pool(pool_id)
        pool.use_on_oom = use_on_oom
        pool.no_split = pool.no_split or no_split

    def pool_begin(self, pool_id: tuple[int, int], stream: int | None) -> None:
        # beginAllocateToPool: refused (TORCH_CHECK) if the pool is begun already; else
        # create_or_incref_pool and push (id, filter) on captures_underway.
        if any(begun == pool_id for begun, _ in self.captures):
            raise ValueError(f"beginAllocateToPool: already recording to pool {pool_id}")
        self.create_or_incref_pool(pool_id)
        self.captures.append((pool_id, stream))

    def pool_end(self, pool_id: tuple[int, int]) -> None:
        # endAllocateToPool: remove the pool's entry (refused if none); its use count is unchanged.
        for i, (begun, _) in enumerate(self.captures):
            if begun == pool_id:
                del self.captures[i]
                return
        raise ValueError(f"endAllocateToPool: not currently recording to pool {pool_id}")

    def pool_release(self, pool_id: tuple[int, int]) -> None:
        # releasePool: one use less; at 0 the pool is freeable (nothing is freed yet). An unknown
        # pool or a use count already 0 is refused (PyTorch asserts).
        pool = self.private_pools.get(pool_id)
        if pool is None or pool.use_count == 0:
            raise ValueError(f"releasePool: pool {pool_id} does not exist or has no use left")
        pool.use_count -= 1

    def pool_empty(self, pool_id: tuple[int, int], live: bool) -> None:
        pool = self.private_pools.get(pool_id)
        if not live:
            # PyTorch's emptyCache(id) -> release_cached_blocks(context, id): only a freeable pool
            # of that id: synchronize_and_free_events(context, pool) (num_sync_all_streams +1),
            # release its free whole segments, erase it if it holds none. A live or unknown pool:
            # nothing at all, and the default pools are never touched.
            if pool is None or pool.use_count > 0:
                return
        elif pool is None:
            raise ValueError(f"pool_empty: pool {pool_id} does not exist")
        # live: accalloc's own empty of a pool, live or not (pytorch#159674): synchronize as
        # empty_cache does, release the free whole segments, erase the pool if freeable and empty.
        self.synchronize_and_free_events()
        self.release_pool_blocks(pool)

    # ---- empty_cache ----------------------------------------------------------------------------

    def empty_cache(self) -> None:
        # emptyCache -> release_cached_blocks (outside a capture num_sync_all_streams +1 and the
        # default pools' whole segments released; the freeable pools' in any case).
        self.release_cached_blocks()

    # ---- trace replay ---------------------------------------------------------------------------

    def replay_op(self, op: TraceOp) -> None:
        if op.device != 0:
            raise ValueError(f"only device 0 is modelled: {format_op(op)}")
        if op.op == "alloc":
            if op.id in self.live or op.id in self.failed_ids:
                raise ValueError(f"id {op.id} reused")
            if op.size == 0:
                # CUDACachingAllocator::allocate / raw_alloc: a 0-byte request never reaches malloc.
                self.live[op.id] = None
                return
            try:
                self.live[op.id] = self.malloc(op.size, op.stream)
            except OutOfMemory:
                self.failed_allocs += 1
                self.failed_ids.add(op.id)
        elif op.op == "free":
            if op.id in self.failed_ids:
                return  # its allocation failed: nothing to free
            if op.id not in self.live:
                raise ValueError(f"free of unknown id {op.id}")
            block = self.live.pop(op.id)
            if block is not None:
                self.free(block)
        elif op.op == "empty_cache":
            self.empty_cache()
        elif op.op == "pool_create":
            self.pool_create(op.pool, op.use_on_oom, op.no_split)
        elif op.op == "pool_begin":
            self.pool_begin(op.pool, op.stream)
        elif op.op == "pool_end":
            self.pool_end(op.pool)
        elif op.op == "pool_release":
            self.pool_release(op.pool)
        elif op.op == "pool_empty":
            self.pool_empty(op.pool, op.live)
        else:
            raise ValueError(f"{op.op} is not modelled: {format_op(op)}")

    def memory_stats(self) -> dict[str, int]:
        # torch.cuda.memory_stats(): the nested dict of memoryStats flattened with "." and sorted.
        out: dict[str, int] = {}
        for family in ARRAY_FAMILIES:
            for pool in POOLS:
                for field, value in zip(FIELDS, self.stats[family][pool]):
                    out[f"{family}.{pool}.{field}"] = value
        for family in SINGLE_FAMILIES:
            for field, value in zip(FIELDS, self.single[family]):
                out[f"{family}.{field}"] = value
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_sync_all_streams"] = self.num_sync_all_streams
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        # stats.max_split_size = static_cast<int64_t>(max_split_size()): -1 for SIZE_MAX (unset).
        m = self.settings.max_split_size
        out["max_split_size"] = -1 if m is None else m
        return dict(sorted(out.items()))


_UNITS = {"": 1, "B": 1, "K": KiB, "KIB": KiB, "M": MiB, "MIB": MiB, "G": GiB, "GIB": GiB,
          "T": 1024 * GiB, "TIB": 1024 * GiB}


def parse_capacity(text: str) -> int:
    """Bytes, or a number with a binary unit: 4096, 512MiB, 3GiB, 1.5GiB."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"bad ACCALLOC_HOST_CAPACITY {text!r}")
    number, unit = m.group(1), _UNITS[m.group(2).upper()]
    return int(float(number) * unit) if "." in number else int(number) * unit


def capacity_from_env() -> int:
    text = os.environ.get("ACCALLOC_HOST_CAPACITY")
    if text:
        return parse_capacity(text)
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def run_trace(path: str, capacity: int, settings: Settings | None = None) -> PyTorchModel:
    model = PyTorchModel(capacity, settings)
    count = 0
    try:
        for count, op in enumerate(iter_trace(path), 1):
            model.replay_op(op)
    except ValueError as e:
        where = "" if str(e).startswith("trace line") else f"op {count}: "
        raise SystemExit(f"{path}: {where}{e}") from None
    return model


def main(argv: list[str]) -> int:
    args = argv[1:]
    config = os.environ.get("ACCALLOC_CONF")
    if len(args) == 3 and args[1] == "--config":
        config = args[2]
    elif len(args) != 1:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    try:
        capacity = capacity_from_env()
        settings = parse_settings(config) if config else Settings()
    except ValueError as e:
        raise SystemExit(str(e)) from None
    model = run_trace(args[0], capacity, settings)
    print(json.dumps(model.memory_stats(), sort_keys=True))
    # Not statistics: what happened, for check_model.py's expectations (on stderr).
    print(json.dumps({"model.gc_runs": model.gc_runs,
                      "model.release_available_ok": model.release_available_ok,
                      "model.release_available_short": model.release_available_short,
                      "model.failed_allocs": model.failed_allocs,
                      "model.reservations": model.reservations,
                      "model.reservations_released": model.reservations_released,
                      "model.maps": model.maps,
                      "model.map_failures": model.map_failures,
                      "model.unmaps": model.unmaps,
                      "model.pool_mallocs": model.pool_mallocs,
                      "model.pool_segment_allocs": model.pool_segment_allocs,
                      "model.pools_erased": model.pools_erased,
                      "model.pools_left": len(model.private_pools),
                      "model.use_on_oom_hits": model.use_on_oom_hits,
                      "model.last_resort_skipped": model.last_resort_skipped,
                      "model.default_release_skipped": model.default_release_skipped,
                      "model.no_split_whole": model.no_split_whole}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
