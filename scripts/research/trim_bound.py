#!/usr/bin/env python3
"""An idealised, optimistic model of a trimming allocator over virtual memory (issue 14).

It estimates, on a trace, how many device calls (maps + unmaps) a trimming allocator needs to keep
peak reserved memory within peak allocated / u, and what utilization it can reach within a budget
of calls. Its mechanics are deliberately more generous than any real device's:

  - pages are one byte: any range can be mapped or unmapped exactly, with no rounding;
  - one address space of unlimited size, one pool, one stream;
  - the line is known in advance: reserved may reach peak allocated (of the whole trace) / u from
    the first request on (an online allocator only knows the peak so far);
  - a request that fits a free mapped hole takes the smallest such hole: no call;
  - otherwise the request goes where the fewest new bytes must be mapped: any window of address
    space not holding live blocks, however many free holes and unmapped gaps it spans; all of those
    gaps are mapped in ONE call;
  - when that would take reserved memory past the line, the excess is unmapped from free holes
    elsewhere in ONE call, however many holes it touches (smallest holes first, or largest first
    with --unmap largest; the better of the two is what docs/PERFORMANCE.md reports);
  - nothing is unmapped while under the line.

Options: --unmap largest (largest holes first); --fit first|worst (the lowest or the largest hole
that fits instead of the smallest); --online (the line follows the peak so far, as
accalloc's does); --ahead-mib N (a map also maps up to N MiB of unmapped space right after the
request while under the line, in the same call, as accalloc maps up to 20 MiB ahead); --budget N.

Its choices (best fit, fewest new bytes, smallest holes unmapped first) are good heuristics, not
proven optimal, so its figures are estimates, not bounds: on varying_sizes accalloc's
expandable_trim does better than it (docs/PERFORMANCE.md).

Sizes are rounded as the allocator rounds them (512 bytes). Usage:

    python3 scripts/research/trim_bound.py examples/traces/random_rmm.jsonl [--unmap largest] [--online]

prints, for utilization targets from 0.80 to 0.99, the peak reserved and the calls (maps, unmaps);
at 0.95, how many requests fit no free hole and what was free then; and the best utilization
within 150 calls (lines 0.700 to 0.990 tried). Standard library only.
"""

import argparse
import bisect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for trace_format
import trace_format  # noqa: E402

UNMAPPED, FREE, LIVE = 0, 1, 2
INFINITE = 1 << 62


def round_size(size):
    return 512 if size < 512 else (size + 511) // 512 * 512


def read_trace(path):
    """(op, id, rounded size) of the trace's allocs and frees."""
    return [(op.op, op.id, round_size(op.size) if op.op == "alloc" else 0)
            for op in trace_format.iter_trace(path) if op.op in ("alloc", "free")]


def peak_allocated(events):
    live, current, peak = {}, 0, 0
    for op, ident, size in events:
        if op == "alloc":
            live[ident] = size
            current += size
            peak = max(peak, current)
        else:
            current -= live.pop(ident)
    return peak


class Space:
    """The address space as consecutive segments [start, length, kind]; the last one is unmapped
    and unbounded. Adjacent segments of the same kind (other than live) are merged."""

    def __init__(self):
        self.starts = [0]
        self.segs = [[0, INFINITE, UNMAPPED]]
        self.reserved = 0

    def _merge_around(self, i):
        # Merge segment i with equal-kind non-live neighbours.
        for j in (i + 1, i):
            if 0 < j < len(self.segs):
                a, b = self.segs[j - 1], self.segs[j]
                if a[2] == b[2] and a[2] != LIVE:
                    a[1] += b[1]
                    del self.segs[j]
                    del self.starts[j]

    def _split(self, start, length, kind):
        """Make [start, start + length) (inside one segment) a segment of `kind`; returns its index."""
        i = bisect.bisect_right(self.starts, start) - 1
        s0, l0, k0 = self.segs[i]
        assert s0 <= start and start + length <= s0 + l0
        pieces = []
        if start > s0:
            pieces.append([s0, start - s0, k0])
        pieces.append([start, length, kind])
        if start + length < s0 + l0:
            pieces.append([start + length, s0 + l0 - start - length, k0])
        self.segs[i : i + 1] = pieces
        self.starts[i : i + 1] = [p[0] for p in pieces]
        return i + (1 if start > s0 else 0)

    def set_kind(self, start, length, kind):
        """Give [start, start + length) the kind `kind`, across segments."""
        end = start + length
        while start < end:
            i = bisect.bisect_right(self.starts, start) - 1
            s0, l0, _ = self.segs[i]
            piece = min(end, s0 + l0) - start
            j = self._split(start, piece, kind)
            self._merge_around(j)
            start += piece

    def fitting_free(self, size, fit):
        """The free hole a request of `size` bytes takes: the smallest (best), the lowest (first) or
        the largest (worst) that holds it; None when none does."""
        chosen = None
        for s, length, k in self.segs:
            if k == FREE and length >= size:
                if fit == "first":
                    return (s, length)
                if chosen is None or (length < chosen[1] if fit == "best" else length > chosen[1]):
                    chosen = (s, length)
        return chosen

    def cheapest_window(self, size):
        """(new bytes to map, start) of the window of `size` bytes with no live block in it that
        needs the fewest new bytes; ties to the lowest address."""
        best = None
        i, n = 0, len(self.segs)
        while i < n:
            if self.segs[i][2] == LIVE:
                i += 1
                continue
            j = i
            while j < n and self.segs[j][2] != LIVE:
                j += 1
            run = self.segs[i:j]
            lo, hi = run[0][0], run[-1][0] + run[-1][1]
            if hi - lo >= size:
                # Unmapped bytes before each boundary, to count a window's new bytes.
                bounds, unmapped_before = [lo], [0]
                for s, length, k in run:
                    bounds.append(s + length)
                    unmapped_before.append(unmapped_before[-1] + (length if k == UNMAPPED else 0))

                def unmapped_upto(x):
                    m = bisect.bisect_right(bounds, x) - 1
                    if m >= len(run):
                        return unmapped_before[-1]
                    s, _, k = run[m]
                    return unmapped_before[m] + ((x - s) if k == UNMAPPED else 0)

                for b in bounds:
                    for x in (b, b - size):
                        if lo <= x and x + size <= hi:
                            cost = unmapped_upto(x + size) - unmapped_upto(x)
                            if best is None or cost < best[0]:
                                best = (cost, x)
            i = j
        return best

    def unmapped_after(self, end):
        """The unmapped bytes that start at address `end`."""
        i = bisect.bisect_right(self.starts, end) - 1
        s0, l0, k0 = self.segs[i]
        return s0 + l0 - end if k0 == UNMAPPED else 0

    def unmap(self, excess, keep_lo, keep_hi, order):
        """Unmap `excess` bytes of free holes outside [keep_lo, keep_hi)."""
        holes = []
        for s, length, k in self.segs:
            if k != FREE:
                continue
            # The parts of the hole outside the window.
            for lo, hi in ((s, min(s + length, keep_lo)), (max(s, keep_hi), s + length)):
                if lo < hi:
                    holes.append((hi - lo, lo))
        holes.sort(reverse=(order == "largest"))
        for length, s in holes:
            if excess == 0:
                break
            take = min(length, excess)
            # Unmap the end of the hole; the rest stays mapped.
            self.set_kind(s + length - take, take, UNMAPPED)
            self.reserved -= take
            excess -= take
        assert excess == 0, "the line is never below allocated memory"


# Each request that fit no free hole in the last simulation: (size, free bytes, holes, largest).
misses = []


def simulate(events, u, peak, order, ahead, online, fit="best"):
    """Peak reserved, maps and unmaps with the line at peak / u (online: the peak so far / u)."""
    line = int(peak / u)
    current = seen_peak = 0
    space = Space()
    where = {}
    maps = unmaps = 0
    peak_reserved = 0
    misses.clear()
    for op, ident, size in events:
        if op == "free":
            start, length = where.pop(ident)
            current -= length
            space.set_kind(start, length, FREE)
            continue
        if online:
            # The line an online allocator can know: the peak so far, this request included.
            current += size
            seen_peak = max(seen_peak, current)
            line = int(seen_peak / u)
        hole = space.fitting_free(size, fit)
        if hole is not None:
            start = hole[0]
        else:
            holes = [length for _, length, k in space.segs if k == FREE]
            misses.append((size, sum(holes), len(holes), max(holes, default=0)))
            new, start = space.cheapest_window(size)
            excess = space.reserved + new - line
            if excess > 0:
                space.unmap(excess, start, start + size, order)
                unmaps += 1
            maps += 1
            space.reserved += new
            # Map ahead, in the same call, into unmapped space right after the window while under
            # the line, so that the next requests find it mapped.
            extra = min(ahead, line - space.reserved, space.unmapped_after(start + size))
            if extra > 0:
                space.set_kind(start + size, extra, FREE)
                space.reserved += extra
        space.set_kind(start, size, LIVE)
        where[ident] = (start, size)
        peak_reserved = max(peak_reserved, space.reserved)
    return peak_reserved, maps, unmaps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--unmap", choices=["smallest", "largest"], default="smallest")
    parser.add_argument("--budget", type=int, default=150)
    parser.add_argument("--fit", choices=["best", "first", "worst"], default="best")
    parser.add_argument("--online", action="store_true", help="the line follows the peak so far")
    parser.add_argument("--ahead-mib", type=int, default=0, help="map up to this much ahead")
    args = parser.parse_args()
    args.ahead = args.ahead_mib << 20
    events = read_trace(args.trace)
    peak = peak_allocated(events)
    print(f"{args.trace}: peak allocated {peak / 2**20:.0f} MiB, unmap {args.unmap} holes first, "
          f"map ahead up to {args.ahead_mib} MiB"
          + (", line from the peak so far" if args.online else ", line from the final peak"))
    print("| target utilization | peak reserved | utilization | calls (maps + unmaps) |")
    print("|---:|---:|---:|---:|")
    for u in (0.80, 0.85, 0.90, 0.92, 0.95, 0.97, 0.99):
        reserved, maps, unmaps = simulate(events, u, peak, args.unmap, args.ahead, args.online, args.fit)
        print(f"| {u:.2f} | {reserved / 2**20:.0f} MiB | {peak / reserved:.3f} | {maps + unmaps} ({maps} + {unmaps}) |")
    simulate(events, 0.95, peak, args.unmap, args.ahead, args.online, args.fit)
    mallocs = sum(1 for op, _, _ in events if op == "alloc")
    n = len(misses)

    def mean(i):
        return sum(m[i] for m in misses) / n / 2**20

    print(f"at 0.95: {n} of {mallocs} requests ({n / mallocs:.0%}) fit no free hole; at those, "
          f"{mean(1):.0f} MiB were free in {sum(m[2] for m in misses) / n:.1f} holes, the largest "
          f"{mean(3):.0f} MiB, for a request of {mean(0):.0f} MiB")
    # The best utilization within the budget: calls do not fall strictly as the line rises, so
    # every line from 0.700 to 0.990 in steps of 0.005 is tried.
    best = None
    for step in range(59):
        u = 0.70 + step * 0.005
        reserved, maps, unmaps = simulate(events, u, peak, args.unmap, args.ahead, args.online, args.fit)
        if maps + unmaps <= args.budget and (best is None or reserved < best[0]):
            best = (reserved, maps, unmaps)
    if best is None:
        print(f"no line from 0.70 to 0.99 stays within {args.budget} calls")
    else:
        reserved, maps, unmaps = best
        print(f"within {args.budget} calls: utilization {peak / reserved:.3f} "
              f"({reserved / 2**20:.0f} MiB reserved), {maps + unmaps} calls ({maps} + {unmaps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
