"""Real models on the host accelerator: GPT-2, BERT, T5 and Llama from `transformers` (random weights
from a config), and a CNN with batch norm, train with the CPU's losses; Llama generates the CPU's tokens
with its KV cache; and when a model is gone its memory is too.
"""
import gc
import sys
from pathlib import Path

import pytest
import torch

from conftest import DEVICE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import model_zoo  # noqa: E402

STEPS = 3


def losses(name, device, **options):
    step = model_zoo.trainer(name, device, **options)
    return [step().item() for _ in range(STEPS)], step.model


def noise_only(model):
    """The biases of convolutions a batch norm follows, and that norm's running mean, which adds them
    in. The norm takes the mean away, so the biases' true gradient is zero and what they get is
    rounding noise, which AdamW turns into steps of about the learning rate in its sign's direction:
    they follow the order of the additions that made the noise (a thread count), not the computation,
    and no check of the computation can use them. (A pin-memory DataLoader sets PyTorch's thread count
    to 1 for threads it starts later, the device's autograd thread among them: these moved apart.)
    The running variance, and everything after the norm, do not depend on them."""
    layers = list(model.modules())
    names = {module: name for name, module in model.named_modules()}
    keys = set()
    for module in layers[:-1]:
        following = layers[layers.index(module) + 1]
        if isinstance(module, torch.nn.Conv2d) and module.bias is not None and \
                isinstance(following, torch.nn.BatchNorm2d):
            keys |= {f"{names[module]}.bias", f"{names[following]}.running_mean"}
    return keys


def assert_same_weights(device_model, cpu_model):
    """Weights after training (and the CNN's batch-norm running statistics) equal to float32 rounding."""
    skipped = noise_only(cpu_model)
    assert skipped == set() or skipped == {"features.0.bias", "features.1.running_mean", "features.4.bias",
                                           "features.5.running_mean"}, skipped
    for (key, cpu_value), device_value in zip(cpu_model.state_dict().items(), device_model.state_dict().values()):
        if key not in skipped:
            torch.testing.assert_close(device_value.cpu(), cpu_value, rtol=1e-3, atol=1e-4, msg=key)


@pytest.mark.parametrize("name", sorted(model_zoo.MODELS))
def test_a_model_trains_on_the_device_with_the_cpus_losses(fresh_device, name):
    start = torch.accelerator.memory_allocated(0)
    expected, cpu_model = losses(name, "cpu")
    got, device_model = losses(name, DEVICE)
    assert all(p.device.type == DEVICE for p in device_model.parameters())
    # The first step is the same computation; later ones follow the device's AdamW (PyTorch takes the
    # foreach implementation on an accelerator), equal to float32 rounding.
    assert got[0] == pytest.approx(expected[0], rel=1e-5)
    assert got == pytest.approx(expected, rel=1e-4)
    assert got[-1] < got[0], "the model did not learn"
    assert_same_weights(device_model, cpu_model)
    assert torch.accelerator.memory_allocated(0) > start
    del device_model, cpu_model
    gc.collect()
    assert torch.accelerator.memory_allocated(0) == start


def test_a_model_trains_under_planned_placement_with_the_same_losses(fresh_device):
    # accalloc's planned placement learns the training step and serves each tensor at a planned
    # offset: what is computed is unchanged (the losses equal those of the same device without it,
    # bit for bit), and past the first steps reserved memory is the floor in pages.
    import accalloc

    steps = 8
    plain = model_zoo.trainer("gpt2", DEVICE)
    expected = [plain().item() for _ in range(steps)]
    del plain
    gc.collect()
    torch.accelerator.empty_cache()
    assert accalloc.planner_stats(0) is None
    accalloc.set_allocator_settings("planned_placement:True")
    try:
        assert "planned_placement:True" in accalloc.get_allocator_settings()
        step = model_zoo.trainer("gpt2", DEVICE)
        got = []
        for i in range(steps):
            if i == steps - 2:
                torch.accelerator.reset_peak_memory_stats(0)
                before = accalloc.planner_stats(0)
            got.append(step().item())
        assert got == expected
        # The planner says so: a plan in force, and the last steps' requests given their addresses.
        after = accalloc.planner_stats(0)
        assert after["in_force"] and after["plans"] >= 1, after
        assert after["advised"] > before["advised"] and after["dropped"] == before["dropped"], (before, after)
        # Most of them took the block their tensor of the step before was freed in, parked there.
        served = after["advised"] - after["conflicts"] - (before["advised"] - before["conflicts"])
        assert 0 < after["from_parked"] - before["from_parked"] <= served, (before, after)
        # The latest plan spans at least its floor (the most its step's blocks and the long-lived blocks
        # around them hold at once), which is more than nothing.
        assert 0 < after["plan_floor"] <= after["plan_height"], after
        # And the snapshot shows where the plan lies: the segments of device 0 it spans say which part.
        planned = [s for s in accalloc.memory_snapshot(DEVICE)["segments"]
                   if s["device"] == 0 and "planned_range" in s]
        assert planned, accalloc.memory_snapshot(DEVICE)["segments"]
        for segment in planned:
            start, end = segment["planned_range"]
            assert segment["address"] <= start < end <= segment["address"] + segment["total_size"], segment
        allocated = torch.accelerator.max_memory_allocated(0)
        reserved = torch.accelerator.max_memory_reserved(0)
        # Within a page of the most allocated rounded up to 2 MiB pages (118.1 MiB in 120 here; the
        # trim line, the best policy without a plan, holds 124).
        page = 2 << 20
        assert reserved <= -(-allocated // page) * page + page, (allocated, reserved)
        del step
        gc.collect()
        assert torch.accelerator.memory_allocated(0) == 0
    finally:
        accalloc.set_allocator_settings("planned_placement:False,expandable_segments:False")
        torch.accelerator.empty_cache()
    assert accalloc.planner_stats(0) is None


def test_one_plan_serves_the_bucketed_shapes_of_a_training_loop(fresh_device):
    # A data loader that groups sequences by length gives a few shapes in no fixed order (batch x
    # tokens 8x64, 4x128 and 2x256 here, the order of examples/traces/real/gpt2_train_buckets.jsonl).
    # Planned placement keeps a step of another shape to the plan's positions and plans the most each
    # position was asked for: once every shape has come, one layout serves them all with no call to the
    # device, and the losses are those of the same device without it, bit for bit.
    import accalloc

    shapes = [(8, 64), (4, 128), (8, 64), (8, 64), (2, 256), (4, 128),
              (8, 64), (2, 256), (4, 128), (4, 128), (8, 64), (2, 256)]
    last = 4  # the last four steps: all three shapes

    def train():
        model = model_zoo.build("gpt2", DEVICE)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses, calls, planner = [], [], []
        for seed, (batch_size, sequence) in enumerate(shapes):
            if seed == len(shapes) - last:
                torch.accelerator.reset_peak_memory_stats(0)
            inputs = model_zoo.batch("gpt2", DEVICE, batch_size, sequence, seed=seed)
            loss = model_zoo.loss_of("gpt2", model, inputs)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            del inputs, loss
            stats = torch.accelerator.memory_stats(0)
            calls.append(stats["num_device_alloc"] + stats["num_device_free"])
            planner.append(accalloc.planner_stats(0))
        peaks = (torch.accelerator.max_memory_allocated(0), torch.accelerator.max_memory_reserved(0))
        del model, optimizer
        gc.collect()
        return losses, calls, planner, peaks

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the recorded trace's kernels
    try:
        expected, _, _, _ = train()
        torch.accelerator.empty_cache()
        accalloc.set_allocator_settings("planned_placement:True")
        try:
            got, calls, planner, (allocated, reserved) = train()
            assert torch.accelerator.memory_allocated(0) == 0
        finally:
            accalloc.set_allocator_settings("planned_placement:False,expandable_segments:False")
            torch.accelerator.empty_cache()
    finally:
        torch.set_num_threads(threads)
    assert got == expected
    # The last four steps, of all three shapes: no device call, and a plan in force throughout, not
    # replaced or dropped.
    before, after = planner[-last - 1], planner[-1]
    assert calls[-1] == calls[-last - 1], calls
    assert all(p["in_force"] for p in planner[-last - 1:]), planner[-last - 1:]
    assert (after["plans"], after["dropped"]) == (before["plans"], before["dropped"]), (before, after)
    # Every shape's step was given as many planned addresses as the others (its every request: a
    # step of 2x256 asks for as many tensors as one of 8x64), and none of them was taken.
    given = [planner[i]["advised"] - planner[i - 1]["advised"] for i in range(len(shapes) - last, len(shapes))]
    assert given[0] > 0 and given == [given[0]] * last, given
    assert after["conflicts"] == before["conflicts"], (before, after)
    # Within a page of the most allocated rounded up to 2 MiB pages (118.1 MiB in 122 here; the
    # trim line holds 124).
    page = 2 << 20
    assert reserved <= -(-allocated // page) * page + page, (allocated, reserved)


def test_a_model_with_dropout_trains_on_the_device(fresh_device):
    # The masks are the device's own (PyTorch's fused dropout on an accelerator), so the losses are not
    # the CPU's; the model still learns and frees its memory.
    got, model = losses("gpt2", DEVICE, dropout=0.1)
    assert all(loss == loss for loss in got) and got[-1] < got[0]
    del model
    gc.collect()
    assert torch.accelerator.memory_allocated(0) == 0


def test_llama_generates_the_cpus_tokens_with_its_kv_cache(fresh_device):
    prompt = model_zoo.batch("llama", "cpu", batch_size=2, sequence=12)[0]
    tokens = {}
    for device in ("cpu", DEVICE):
        model = model_zoo.build("llama", device).eval()
        with torch.no_grad():
            out = model.generate(prompt.to(device), max_new_tokens=16, do_sample=False, pad_token_id=0,
                                 use_cache=True)
        assert out.device.type == torch.device(device).type
        tokens[device] = out.cpu()
        del model, out
    assert tokens[DEVICE].shape == (2, 12 + 16)
    assert torch.equal(tokens[DEVICE], tokens["cpu"])
    gc.collect()
    assert torch.accelerator.memory_allocated(0) == 0


def test_a_models_peak_is_seen_by_torch_accelerator(fresh_device):
    step = model_zoo.trainer("bert", DEVICE)
    step()
    weights = sum(p.numel() * p.element_size() for p in step.model.parameters())
    # Weights, gradients and AdamW's two moments are live between steps; the peak holds activations too.
    assert torch.accelerator.memory_allocated(0) >= 4 * weights
    assert torch.accelerator.max_memory_allocated(0) > torch.accelerator.memory_allocated(0)
    assert torch.accelerator.memory_reserved(0) >= torch.accelerator.max_memory_allocated(0)
    del step
    gc.collect()
    assert torch.accelerator.memory_allocated(0) == 0
