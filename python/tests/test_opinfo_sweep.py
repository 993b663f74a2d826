"""PyTorch's whole operator database (OpInfo) on the host accelerator: every operator with a float32
CPU kernel, every sample input, its results, its in-place writes and its gradients equal the CPU's.

The sweep runs in worker processes (opinfo_sweep.py), two at once, each over half of the operators,
so that an operator that kills its process is reported by name and the sweep goes on after it. The
one thing the device may do that the CPU does not is refuse a result of a compressed sparse layout (CSR and
the like: sparse COO results are the device's), with a clear error.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opinfo_sweep import op_name, sweep_operators

WORKER = Path(__file__).with_name("opinfo_sweep.py")
ALL_SAMPLES = 1 << 30
# The device holds strided and sparse COO tensors: an operator whose CPU kernel makes a tensor of another
# layout raises.
SPARSE_REFUSAL = "holds strided and sparse COO tensors only"


def sweep(first, last, samples=ALL_SAMPLES, **env):
    """Run operators first..last-1 in worker processes; {name: (outcome, detail)}, crashes included."""
    outcomes = {}
    start = first
    while start < last:
        done = subprocess.run([sys.executable, str(WORKER), str(start), str(last), str(samples)],
                              capture_output=True, text=True, timeout=1800, env={**os.environ, **env})
        current = None
        for line in done.stdout.splitlines():
            record = json.loads(line)
            if record.get("begin"):
                current = record["op"]
                start += 1
            else:
                outcomes[record["op"]] = (record["outcome"], record["detail"])
                current = None
        if done.returncode != 0:
            if current is None:
                pytest.fail(f"a sweep worker failed outside any operator:\n{done.stderr[-4000:]}")
            outcomes[current] = ("crashed", f"exit status {done.returncode}: {done.stderr[-2000:]}")
    return outcomes


def sweep_in_two(first, last):
    """The range in two halves, side by side (this machine's two cores)."""
    from concurrent.futures import ThreadPoolExecutor

    middle = (first + last) // 2
    with ThreadPoolExecutor(2) as pool:
        halves = [pool.submit(sweep, first, middle), pool.submit(sweep, middle, last)]
        outcomes = {}
        for half in halves:
            outcomes.update(half.result())
    return outcomes


def test_every_operator_gives_the_cpus_results_on_the_device():
    operators = sweep_operators()
    assert len(operators) > 600, "the OpInfo database shrank: is this torch 2.15?"
    outcomes = sweep_in_two(0, len(operators))
    assert set(outcomes) == {op_name(op) for op in operators}
    failures = {name: result for name, result in outcomes.items()
                if result[0] != "agree" and not (result[0] == "device raised" and SPARSE_REFUSAL in result[1])}
    refused = sorted(name for name, result in outcomes.items() if result[0] == "device raised")
    print(f"{len(outcomes)} operators: {len(outcomes) - len(refused)} agree, sparse refused: {refused}")
    assert not failures, "\n".join(f"{name}: {outcome}: {detail}" for name, (outcome, detail) in failures.items())
    # Sparse is the only exception, and it stays small.
    assert len(refused) <= 5, refused


def test_a_crashing_operator_is_reported_and_the_sweep_goes_on():
    names = [op_name(op) for op in sweep_operators()[:3]]
    outcomes = sweep(0, 3, samples=1, ACCALLOC_SWEEP_CRASH_ON=names[1])
    assert outcomes[names[1]][0] == "crashed"
    assert outcomes[names[0]][0] == "agree" and outcomes[names[2]][0] == "agree", outcomes
