"""One worker of the OpInfo sweep (test_opinfo_sweep.py starts it in a subprocess, so that an operator
that kills the process fails the test instead of ending the run).

    python opinfo_sweep.py FIRST LAST SAMPLES

runs operators FIRST..LAST-1 of sweep_operators() on the accalloc host device and on the CPU, the first
SAMPLES sample inputs of each, and prints one JSON line per operator: {"op": name, "begin": true} before
it starts and {"op": name, "outcome": ..., "detail": ...} when it ends.

The samples are made on the device, as PyTorch's test_compare_cpu makes them, and copied to the CPU
storage and all (a view's whole storage, its strides and offset: as_strided reads outside the view).
The operator runs on both with the same random seed (the device draws from the CPU's generator).
Outcomes: "agree" (equal results, equal inputs after the call (what the operator wrote in place), results
that view the input on the CPU view it on the device and a write through them reaches the input
alike, and, for operators with a derivative, equal gradients of the sum of the results); "device raised", "cpu
raised", "differ", "gradients differ", "wrong device". A sample on which both raise agrees.
"""
import json
import os
import sys

os.environ.setdefault("ACCALLOC_HOST_DEVICES", "2")
os.environ.setdefault("ACCALLOC_HOST_CAPACITY", "2GiB")
os.environ["ACCALLOC_DEVICE"] = "host"

import torch  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

import accalloc.torch  # noqa: E402

# Operators whose results are uninitialized memory: only their sizes, strides and dtypes are compared.
UNINITIALIZED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}


def sweep_operators():
    """Every OpInfo entry (variants included) with a float32 CPU kernel, in op_db's order."""
    return [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]


def op_name(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def to_cpu(t):
    """t on the CPU with its whole storage, strides and offset (and its conjugate/negative bits)."""
    if not isinstance(t, torch.Tensor) or t.device.type == "cpu":
        return t
    if t.layout != torch.strided:
        return t.cpu()
    if t.is_conj():
        return to_cpu(t.conj()).conj()
    if t.is_neg():
        return to_cpu(t._neg_view())._neg_view()
    storage = t.untyped_storage()
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, 0, (storage.nbytes() // t.element_size(),))
    copy = flat.detach().cpu().as_strided(t.size(), t.stride(), t.storage_offset())
    return copy.detach().requires_grad_(t.requires_grad) if t.requires_grad else copy


def on_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.cpu() if value.device.type != "cpu" else value
    if isinstance(value, (tuple, list)):
        return [on_cpu(v) for v in value]
    return value


def devices_of(value):
    if isinstance(value, torch.Tensor):
        return {value.device.type}
    if isinstance(value, (tuple, list)):
        return set().union(*(devices_of(v) for v in value)) if value else set()
    return set()


def compare(expected, got, uninitialized):
    if isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor):
        if uninitialized:
            assert (expected.shape, expected.dtype) == (got.shape, got.dtype), f"{expected.shape} vs {got.shape}"
            return
        if expected.layout != torch.strided:
            expected, got = expected.to_dense(), got.to_dense()
        torch.testing.assert_close(got, expected, equal_nan=True, check_device=False)
    elif isinstance(expected, (tuple, list)) and isinstance(got, (tuple, list)):
        assert len(expected) == len(got), f"{len(expected)} results on the CPU, {len(got)} on the device"
        for e, g in zip(expected, got):
            compare(e, g, uninitialized)
    elif isinstance(expected, float) and isinstance(got, float) and expected != expected:
        assert got != got, f"{got} against nan"
    else:
        assert expected == got, f"{got!r} against {expected!r}"


def run(op, sample):
    torch.manual_seed(0)
    return op(sample.input, *sample.args, **sample.kwargs)


def inputs_of(sample):
    return [sample.input, *sample.args, *sample.kwargs.values()]


class Outcome(Exception):
    """How a sweep of one operator ended, when it ended before agreeing on every sample."""

    def __init__(self, outcome, detail):
        super().__init__(outcome)
        self.outcome, self.detail = outcome, detail[:2000]


def both_ways(what, count, call, sample, cpu_sample):
    """call(cpu_sample) and call(sample): (expected, got), or None when both raise."""
    errors = {}
    results = {}
    for side, s in (("cpu", cpu_sample), ("device", sample)):
        try:
            results[side] = call(s)
        except Exception as e:  # noqa: BLE001 (what matters is whether both raise)
            errors[side] = e
    if len(errors) == 2:
        return None
    for side, e in errors.items():
        raise Outcome(f"{side} raised", f"{what}sample {count}: {type(e).__name__}: {e}")
    return results["cpu"], results["device"]


def samples_of(op, device, samples_per_op, requires_grad=False):
    """(number, sample, its CPU copy) for the first samples_per_op samples, made on the device."""
    what = "gradient " if requires_grad else ""
    torch.manual_seed(0)
    samples = iter(op.sample_inputs(device, torch.float32, requires_grad=requires_grad))
    for count in range(1, samples_per_op + 1):
        try:
            sample = next(samples)
        except StopIteration:
            return
        except Exception as e:  # noqa: BLE001 (making a sample runs operators on the device too)
            raise Outcome("device raised", f"making {what}sample {count}: {type(e).__name__}: {e}")
        yield count, sample, sample.transform(to_cpu)


def sweep_results(op, device, samples_per_op):
    uninitialized = op.name in UNINITIALIZED
    count = 0
    for count, sample, cpu_sample in samples_of(op, device, samples_per_op):
        pair = both_ways("", count, lambda s: run(op, s), sample, cpu_sample)
        if pair is None:
            continue
        expected, got = pair
        # A result comes on the device when the operator was given a device tensor and no device.
        if "cpu" in devices_of(got) and device in devices_of(inputs_of(sample)) and "device" not in sample.kwargs:
            raise Outcome("wrong device", f"sample {count}: a result on the CPU")
        try:
            compare(expected, on_cpu(got), uninitialized)
            compare(inputs_of(cpu_sample), on_cpu(inputs_of(sample)), uninitialized)
        except AssertionError as e:
            raise Outcome("differ", f"sample {count}: {e}")
        write_through_views(count, expected, got, cpu_sample, sample)
    return count


def views_of(results, sample):
    """The results that share storage with the sample's input (views, and results that alias it)."""
    results = results if isinstance(results, (tuple, list)) else [results]
    base = sample.input
    if not isinstance(base, torch.Tensor) or base.layout != torch.strided or base.numel() == 0:
        return []
    return [k for k, r in enumerate(results) if isinstance(r, torch.Tensor) and r.layout == torch.strided
            and r.numel() > 0 and r.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()]


def write_through_views(count, expected, got, cpu_sample, sample):
    """Where a result is a view of the input on the CPU, it is one on the device, and writing 1 into it
    changes the input there as it does on the CPU (or raises on both: overlapping views refuse)."""
    on_the_cpu = views_of(expected, cpu_sample)
    on_the_device = views_of(got, sample)
    if on_the_cpu != on_the_device:
        raise Outcome("differ", f"sample {count}: results {on_the_cpu} view the input on the CPU, "
                                f"{on_the_device} on the device")
    listed = lambda r: r if isinstance(r, (tuple, list)) else [r]  # noqa: E731
    for k in on_the_cpu:
        pair = both_ways("writing through a view, ", count, lambda rs: rs[k].fill_(1),
                         listed(got), listed(expected))
        if pair is None:
            continue
        try:
            compare(cpu_sample.input, on_cpu(sample.input), False)
        except AssertionError as e:
            raise Outcome("differ", f"sample {count}: a write through result {k} reached the input "
                                    f"differently: {e}")


def gradients(op, sample):
    """The gradients of the sum of op's floating-point results with respect to its inputs."""
    result = run(op, sample)
    results = result if isinstance(result, (tuple, list)) else [result]
    parts = [r if not r.is_complex() else torch.view_as_real(r)
             for r in results if isinstance(r, torch.Tensor) and r.requires_grad]
    leaves = [t for t in inputs_of(sample) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not parts or not leaves:
        return []
    loss = sum(p.sum() for p in parts)
    return list(torch.autograd.grad(loss, leaves, allow_unused=True))


def sweep_gradients(op, device, samples_per_op):
    for count, sample, cpu_sample in samples_of(op, device, samples_per_op, requires_grad=True):
        pair = both_ways("gradient, ", count, lambda s: gradients(op, s), sample, cpu_sample)
        if pair is None:
            continue
        try:
            compare(pair[0], on_cpu(pair[1]), False)
        except AssertionError as e:
            raise Outcome("gradients differ", f"sample {count}: {e}")


def sweep_one(op, device, samples_per_op):
    """(outcome, detail) of one operator: its results, then its gradients where it has them."""
    try:
        count = sweep_results(op, device, samples_per_op)
        if not count:
            return "no samples", ""
        if op.supports_autograd:
            sweep_gradients(op, device, samples_per_op)
    except Outcome as ended:
        return ended.outcome, ended.detail
    return "agree", f"{count} samples"


def main():
    first, last, samples_per_op = (int(a) for a in sys.argv[1:4])
    torch.set_num_threads(1)
    device = accalloc.torch.register_host_device()  # the device type's name, "accalloc"
    operators = sweep_operators()
    # The harness's own test: this operator kills the process, as a segmentation fault would.
    crash_on = os.environ.get("ACCALLOC_SWEEP_CRASH_ON")
    for op in operators[first:last]:
        name = op_name(op)
        print(json.dumps({"op": name, "begin": True}), flush=True)
        if name == crash_on:
            os.abort()
        outcome, detail = sweep_one(op, device, samples_per_op)
        print(json.dumps({"op": name, "outcome": outcome, "detail": detail}), flush=True)


if __name__ == "__main__":
    main()
