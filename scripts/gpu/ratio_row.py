"""One row of gpu-check.sh's malloc/free timing table: the loop's own cost subtracted from each
allocator's ns per operation, and accalloc's time as a ratio of PyTorch's caching allocator's and of
cudaMallocAsync's (below 1: accalloc is faster). A timing that failed is passed as nan.

    python scripts/gpu/ratio_row.py TRACE LOOP_NS ACCALLOC_NS PYTORCH_NS CUDAMALLOCASYNC_NS
"""
import sys
from pathlib import Path

trace = sys.argv[1]
loop, acc, pt, asy = map(float, sys.argv[2:6])


def net(x):
    return max(x - loop, 1e-9)


print(f"| {Path(trace).name} | {loop:.0f} | {net(acc):.0f} | {net(pt):.0f} | {net(asy):.0f} | "
      f"{net(acc) / net(pt):.2f} | {net(acc) / net(asy):.2f} |")
