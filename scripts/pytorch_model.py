#!/usr/bin/env python3
"""An independent reference model of PyTorch's CUDA caching allocator, for differential testing.

It follows DeviceCachingAllocator in c10/cuda/CUDACachingAllocator.cpp under the default policy
(no max_split_size, no memory fraction, no garbage collection, no expandable segments, no
record_stream, so no pending events) on a single simulated device of capacity C bytes, and prints
the 122 flat keys of torch.cuda.memory_stats() as one sorted JSON object.

Usage: python3 scripts/pytorch_model.py TRACE.jsonl
  TRACE: JSON lines {"op":"alloc","id":7,"size":4096,"stream":0}, {"op":"free","id":7},
         {"op":"empty_cache"}. "stream" defaults to 0; a "device" other than 0 is an error.
  ACC_HOST_CAPACITY: device capacity in bytes, or with a binary unit (512MiB, 3GiB); default: the
         machine's physical memory.

The simulated device hands out addresses as accalloc's simulated device does (so that ties between
free blocks of equal size break the same way): the first segment at 0x7f0000000000, each later one
at the previous address + (its size rounded up to 2 MiB) + 2 MiB, never reused. A raw allocation
fails when the bytes held + its size > C.

One documented deviation of accalloc is modelled on purpose: a request whose segment allocation
size exceeds C fails at once without touching the cache or any statistic (PyTorch would look in
the cache and run the release-and-retry path first, counting num_alloc_retries and num_ooms).

Python 3.11, standard library only.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import sys

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

# max_split_size is unset: PyTorch keeps SIZE_MAX, so no block is ever "oversize" and
# memory_stats() reports it as -1 (SIZE_MAX stored in an int64).
MAX_SPLIT_SIZE = None

# accalloc's simulated device.
SIM_BASE_ADDRESS = 0x7F0000000000
SIM_ADDRESS_ALIGN = 2 * MiB
SIM_ADDRESS_GAP = 2 * MiB

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


class Block:
    """struct Block: a piece of a segment, linked to its neighbours in that segment."""

    __slots__ = ("stream", "size", "addr", "small", "prev", "next", "allocated", "requested_size")

    def __init__(self, stream: int, size: int, addr: int, small: bool):
        self.stream = stream
        self.size = size
        self.addr = addr
        self.small = small  # which pool (small_blocks / large_blocks) the block belongs to
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.requested_size = 0

    def is_split(self) -> bool:  # Block::is_split
        return self.prev is not None or self.next is not None

    def key(self) -> tuple[int, int, int]:  # BlockComparatorSize: (stream, size, ptr)
        return (self.stream, self.size, self.addr)


class PyTorchModel:
    """DeviceCachingAllocator for one device, default configuration, plus a simulated device."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        # DeviceStats: Stat = [current, peak, allocated, freed]; arrays indexed by pool name.
        self.stats = {f: {p: [0, 0, 0, 0] for p in POOLS} for f in ARRAY_FAMILIES}
        self.single = {f: [0, 0, 0, 0] for f in SINGLE_FAMILIES}
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        # BlockPool::blocks, one sorted list of (stream, size, addr) per pool, and addr -> Block.
        self.pool_keys = {True: [], False: []}
        self.pool_blocks: dict[int, Block] = {}
        # The simulated device.
        self.held = 0  # total_allocated_memory: bytes of all live segments
        self.next_address = SIM_BASE_ADDRESS
        # Replay bookkeeping.
        self.live: dict[int, Block | None] = {}  # trace id -> block (None: a size-0 request)
        self.failed_ids: set[int] = set()
        self.failed_allocs = 0  # requests that ended in an out-of-memory error

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

    @staticmethod
    def round_size(size: int) -> int:
        # round_size: < kMinBlockSize -> kMinBlockSize, else up to a multiple of kMinBlockSize
        # (roundup_power2_divisions is unset by default).
        if size < K_MIN_BLOCK_SIZE:
            return K_MIN_BLOCK_SIZE
        return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)

    @staticmethod
    def get_allocation_size(size: int) -> int:
        # get_allocation_size: 2 MiB for small, 20 MiB below 10 MiB, else rounded up to 2 MiB.
        if size <= K_SMALL_SIZE:
            return K_SMALL_BUFFER
        if size < K_MIN_LARGE_ALLOC:
            return K_LARGE_BUFFER
        return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)

    # ---- pools ----------------------------------------------------------------------------------

    def pool_insert(self, block: Block) -> None:  # BlockPool::insert_into_blocks
        bisect.insort(self.pool_keys[block.small], block.key())
        self.pool_blocks[block.addr] = block

    def pool_erase(self, block: Block) -> None:  # pool.blocks.erase(block)
        keys = self.pool_keys[block.small]
        i = bisect.bisect_left(keys, block.key())
        assert keys[i] == block.key()
        del keys[i]
        del self.pool_blocks[block.addr]

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
        # process_events(): nothing to do without record_stream.
        size = self.round_size(orig_size)
        small = size <= K_SMALL_SIZE  # get_pool: small_blocks when size <= kSmallSize
        alloc_size = self.get_allocation_size(size)

        block = self.get_free_block(size, stream, small)
        # (trigger_free_memory_callbacks: none registered.)
        # accalloc's deviation: on a miss, a segment no device of this capacity could ever hold fails
        # at once, without releasing cached memory, and changes no statistic.
        if block is None and alloc_size > self.capacity:
            raise OutOfMemory(alloc_size)
        if block is None:
            # garbage_collect_cached_blocks: only with a memory fraction set. Skipped.
            block = self.alloc_block(alloc_size, stream, small, is_retry=False)
            # release_available_cached_blocks: returns false when max_split_size is unset.
            if block is None:
                self.release_cached_blocks()  # always returns true
                block = self.alloc_block(alloc_size, stream, small, is_retry=True)
        if block is None:
            # malloc: stats.num_ooms += 1, then OutOfMemoryError naming alloc_size.
            self.num_ooms += 1
            raise OutOfMemory(alloc_size)
        split_remainder = self.should_split(block, size)
        return self.alloc_found_block(block, size, orig_size, split_remainder)

    def get_free_block(self, size: int, stream: int, small: bool) -> Block | None:
        # get_free_block: lower_bound of (stream, size, nullptr); a miss if the stream differs.
        # (The max_split_size and max_non_split_rounding checks never trigger when unset.)
        keys = self.pool_keys[small]
        i = bisect.bisect_left(keys, (stream, size, 0))
        if i == len(keys) or keys[i][0] != stream:
            return None
        block = self.pool_blocks[keys[i][2]]
        self.pool_erase(block)
        return block

    def alloc_block(self, alloc_size: int, stream: int, small: bool, is_retry: bool) -> Block | None:
        # alloc_block: num_alloc_retries counts the retry attempt whether or not it succeeds.
        if is_retry:
            self.num_alloc_retries += 1
        addr = self.device_malloc(alloc_size)
        if addr is None:
            return None
        # Success: total_allocated_memory += size; segment +1, reserved_bytes +size;
        # oversize_segments +1 when size >= max_split_size (never, unset); num_device_alloc +1.
        self.increase("segment", small, 1)
        self.increase("reserved_bytes", small, alloc_size)
        self.num_device_alloc += 1
        return Block(stream, alloc_size, addr, small)

    def release_cached_blocks(self) -> bool:
        # release_cached_blocks: synchronize_and_free_events (num_sync_all_streams +1; no events
        # to free here), then release_blocks(large_blocks) and release_blocks(small_blocks).
        self.synchronize_and_free_events()
        self.release_blocks(small=False)
        self.release_blocks(small=True)
        return True

    def synchronize_and_free_events(self) -> None:
        self.num_sync_all_streams += 1

    def release_blocks(self, small: bool) -> None:
        # release_blocks: every cached block that is a whole segment (no prev, no next).
        for key in list(self.pool_keys[small]):
            block = self.pool_blocks[key[2]]
            if not block.is_split():
                self.release_block(block)

    def release_block(self, block: Block) -> None:
        # release_block: num_device_free +1, cudaFree, segment -1, reserved_bytes -size
        # (oversize_segments -1 when size >= max_split_size: never, unset); erase from the pool.
        self.num_device_free += 1
        self.device_free(block.size)
        self.decrease("segment", block.small, 1)
        self.decrease("reserved_bytes", block.small, block.size)
        self.pool_erase(block)

    @staticmethod
    def should_split(block: Block, size: int) -> bool:
        # should_split: small pool when remaining >= kMinBlockSize; large pool when
        # size < max_split_size (always, unset) and remaining > kSmallSize.
        remaining = block.size - size
        if block.small:
            return remaining >= K_MIN_BLOCK_SIZE
        return remaining > K_SMALL_SIZE

    def alloc_found_block(self, block: Block, size: int, orig_size: int, split_remainder: bool) -> Block:
        small = block.small
        already_split = block.is_split()
        if split_remainder:
            # The caller's block is cut from the start; the remainder keeps the old Block object
            # (its address moves up by size) and goes back to the pool.
            remaining = block
            block = Block(remaining.stream, size, remaining.addr, small)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.addr += size
            remaining.size -= size
            self.pool_insert(remaining)
            if already_split:
                # An already-split inactive block shrinks by size bytes.
                self.decrease("inactive_split_bytes", small, block.size)
            else:
                # A whole segment becomes split: a new inactive split block of remaining.size.
                self.increase("inactive_split_bytes", small, remaining.size)
                self.increase("inactive_split", small, 1)
        elif already_split:
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
        # oversize_allocations +1 when block.size >= max_split_size: never, unset.
        return block

    # ---- DeviceCachingAllocator::free and its helpers -------------------------------------------

    def free(self, block: Block) -> None:
        # free: allocation -1 and allocated_bytes -size at once (oversize_allocations -1 when
        # size >= max_split_size: never). No stream_uses, so straight to free_block.
        block.allocated = False
        self.decrease("allocation", block.small, 1)
        self.decrease("allocated_bytes", block.small, block.size)
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
        # The inactive_split stats move by the NET change only (increase if > 0, decrease if < 0).
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
        # try_merge_blocks: merge a free neighbour (not allocated, no events) into dst.
        if src is None or src.allocated:
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
        self.pool_erase(src)
        return subsumed

    # ---- empty_cache ----------------------------------------------------------------------------

    def empty_cache(self) -> None:
        # emptyCache -> release_cached_blocks (num_sync_all_streams +1, whole segments released).
        self.release_cached_blocks()

    # ---- trace replay ---------------------------------------------------------------------------

    def replay_op(self, op: dict) -> None:
        kind = op.get("op")
        if op.get("device", 0) != 0:
            raise ValueError(f"only device 0 is modelled: {op}")
        if kind == "alloc":
            ident, size, stream = op["id"], op["size"], op.get("stream", 0)
            if ident in self.live or ident in self.failed_ids:
                raise ValueError(f"id {ident} reused")
            if size == 0:
                # CUDACachingAllocator::allocate / raw_alloc: a 0-byte request never reaches malloc.
                self.live[ident] = None
                return
            try:
                self.live[ident] = self.malloc(size, stream)
            except OutOfMemory:
                self.failed_allocs += 1
                self.failed_ids.add(ident)
        elif kind == "free":
            ident = op["id"]
            if ident in self.failed_ids:
                return  # its allocation failed: nothing to free
            if ident not in self.live:
                raise ValueError(f"free of unknown id {ident}")
            block = self.live.pop(ident)
            if block is not None:
                self.free(block)
        elif kind == "empty_cache":
            self.empty_cache()
        else:
            raise ValueError(f"unknown op {op!r}")

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
        out["max_split_size"] = -1 if MAX_SPLIT_SIZE is None else MAX_SPLIT_SIZE
        return dict(sorted(out.items()))


_UNITS = {"": 1, "B": 1, "K": KiB, "KIB": KiB, "M": MiB, "MIB": MiB, "G": GiB, "GIB": GiB,
          "T": 1024 * GiB, "TIB": 1024 * GiB}


def parse_capacity(text: str) -> int:
    """Bytes, or a number with a binary unit: 4096, 512MiB, 3GiB, 1.5GiB."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"bad ACC_HOST_CAPACITY {text!r}")
    number, unit = m.group(1), _UNITS[m.group(2).upper()]
    return int(float(number) * unit) if "." in number else int(number) * unit


def capacity_from_env() -> int:
    text = os.environ.get("ACC_HOST_CAPACITY")
    if text:
        return parse_capacity(text)
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def run_trace(path: str, capacity: int) -> PyTorchModel:
    model = PyTorchModel(capacity)
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                model.replay_op(json.loads(line))
            except (ValueError, KeyError) as e:
                raise SystemExit(f"{path}:{lineno}: {e}") from None
    return model


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    try:
        capacity = capacity_from_env()
    except ValueError as e:
        raise SystemExit(str(e)) from None
    model = run_trace(argv[1], capacity)
    print(json.dumps(model.memory_stats(), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
