"""CUDA graphs and torch.cuda.MemPool with accalloc as PyTorch's CUDA allocator (use_for_cuda): a graph
captures a small model's forward into its own pool and replays it with the same outputs; a MemPool
takes a tensor into a segment of its own, keeps it through empty_cache while it lives and gives it
back once deleted.
Prints one line per check and exits non-zero on the first failure. Needs a GPU."""
import sys

import torch

import accalloc.torch


def main():
    accalloc.torch.use_for_cuda()
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    static_input = torch.randn(64, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up outside the capture, as PyTorch asks
            model(static_input)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_output = model(static_input)
    for _ in range(3):
        static_input.copy_(torch.randn(64, 256, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        expected = model(static_input)
        if not torch.allclose(static_output, expected, atol=1e-5):
            print("graph replay: outputs differ from eager")
            return 1
    print(f"graph replay: same outputs as eager; pool {graph.pool()}")

    pool = torch.cuda.MemPool()
    before = torch.cuda.memory_reserved()
    with torch.cuda.use_mem_pool(pool):
        held = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    grown = torch.cuda.memory_reserved() - before
    if grown < held.numel() or pool.use_count() != 1:
        print(f"MemPool: reserved grew by {grown} bytes, use count {pool.use_count()}")
        return 1
    torch.cuda.empty_cache()
    if torch.cuda.memory_reserved() - before < held.numel():
        print("MemPool: a live pool's segment was given back by empty_cache")
        return 1
    del held, pool
    torch.cuda.empty_cache()
    print(f"MemPool: its own {grown}-byte segment, kept while it lived; memory_reserved "
          f"{torch.cuda.memory_reserved()} after it went (was {before})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
