"""FlexAttention (torch.nn.attention.flex_attention) on the host accelerator, as a model using it on a
GPU runs: eagerly, forward and backward (the CPU refuses the backward pass, CUDA does not); compiled,
for inference through Inductor's C++ kernel, bitwise the CPU's compiled results; compiled where a
gradient is needed, the calling function runs eagerly, or (fullgraph=True, a learnt tensor in
score_mod, return_lse) it is refused with words. A Hugging Face model with
attn_implementation="flex_attention" trains on the device as with PyTorch's SDPA."""
import math

import pytest
import torch
from torch._inductor.exc import InductorError
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from conftest import DEVICE, run_python

B, H, L, E = 2, 4, 256, 32


def causal(b, h, q_index, kv_index):
    return q_index >= kv_index


def relative(score, b, h, q_index, kv_index):
    return score + (q_index - kv_index) * 0.01


def inputs(dtype=torch.float32, kv_heads=H, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, E, generator=generator, dtype=dtype)
    k, v = (torch.randn(B, kv_heads, L, E, generator=generator, dtype=dtype) for _ in range(2))
    return q, k, v


def on_device(*tensors):
    return [t.to(DEVICE) for t in tensors]


@pytest.fixture
def fresh_dynamo():
    """Dynamo forgets earlier compilations (a function it fell back from stays eager until then)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_flex_attention_gives_the_cpus_results(fresh_device, dtype):
    q, k, v = inputs(dtype)
    mask = create_block_mask(causal, B, H, L, L, device="cpu")
    device_mask = create_block_mask(causal, B, H, L, L, device=DEVICE)
    assert device_mask.kv_num_blocks.device.type == DEVICE
    for kwargs, device_kwargs in (({}, {}), ({"score_mod": relative}, {"score_mod": relative}),
                                  ({"block_mask": mask, "score_mod": relative},
                                   {"block_mask": device_mask, "score_mod": relative})):
        got = flex_attention(*on_device(q, k, v), **device_kwargs)
        assert got.device.type == DEVICE and got.dtype == dtype
        assert torch.equal(got.cpu(), flex_attention(q, k, v, **kwargs))
    # Grouped-query attention: two key/value heads for four query heads.
    q, k, v = inputs(dtype, kv_heads=2)
    got = flex_attention(*on_device(q, k, v), enable_gqa=True)
    assert torch.equal(got.cpu(), flex_attention(q, k, v, enable_gqa=True))


def dense_reference(q, k, v):
    """Causal attention with the relative score, by its formula, in float64."""
    q, k, v = (t.double() for t in (q, k, v))
    positions = torch.arange(L)
    scores = q @ k.transpose(-2, -1) / math.sqrt(E) + (positions[:, None] - positions[None, :]) * 0.01
    scores = scores.masked_fill(positions[:, None] < positions[None, :], float("-inf"))
    return scores.softmax(-1) @ v


def test_flex_attention_trains_on_the_device_where_the_cpu_refuses(fresh_device):
    q, k, v = (t.requires_grad_() for t in inputs())
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(q, k, v)
    leaves = [t.detach().to(DEVICE).requires_grad_() for t in (q, k, v)]
    mask = create_block_mask(causal, B, H, L, L, device=DEVICE)
    out = flex_attention(*leaves, score_mod=relative, block_mask=mask)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weights.to(DEVICE)).sum().backward()
    reference = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = dense_reference(*reference)
    (expected * weights.double()).sum().backward()
    assert torch.allclose(out.detach().cpu().double(), expected, atol=1e-5)
    for leaf, ref in zip(leaves, reference):
        assert leaf.grad.device.type == DEVICE
        assert torch.allclose(leaf.grad.cpu().double(), ref.grad, atol=1e-4)


def test_compiled_flex_attention_gives_the_cpus_compiled_results(fresh_device, fresh_dynamo):
    q, k, v = inputs()
    compiled = torch.compile(flex_attention)
    mask = create_block_mask(causal, B, H, L, L, device="cpu")
    device_mask = create_block_mask(causal, B, H, L, L, device=DEVICE)
    expected = compiled(q, k, v, score_mod=relative, block_mask=mask)
    # With gradients enabled (nothing asks for one) and under no_grad: Inductor's C++ kernel, the
    # CPU's, which differs from the eager reference in the last bits.
    got = compiled(*on_device(q, k, v), score_mod=relative, block_mask=device_mask)
    assert got.device.type == DEVICE and torch.equal(got.cpu(), expected)
    with torch.no_grad():
        got = compiled(*on_device(q, k, v), score_mod=relative, block_mask=device_mask)
    assert torch.equal(got.cpu(), expected)
    assert not torch.equal(expected, flex_attention(q, k, v, score_mod=relative, block_mask=mask))


def test_a_compiled_function_needing_flex_attentions_gradient_runs_it_eagerly(fresh_device, fresh_dynamo):
    q, k, v = on_device(*inputs())

    def attend(q, k, v):
        return flex_attention(q, k, v, score_mod=relative).square().sum()

    leaf = q.clone().requires_grad_()
    torch.compile(attend)(leaf, k, v).backward()
    eager_leaf = q.clone().requires_grad_()
    attend(eager_leaf, k, v).backward()
    assert torch.equal(leaf.grad, eager_leaf.grad)

    torch._dynamo.reset()
    with pytest.raises(Exception, match="compiles inference only, as on the CPU") as refused:
        torch.compile(attend, fullgraph=True)(q.clone().requires_grad_(), k, v)
    assert not isinstance(refused.value, InductorError)


def test_compiled_flex_attention_asked_for_the_log_sum_exp_runs_it_eagerly(fresh_device, fresh_dynamo):
    """Inductor's host kernel gives the output alone: a compiled call asking for the log-sum-exp
    (as Hugging Face's does on every device but the CPU) runs eagerly, and with fullgraph=True is
    refused, while Dynamo traces (not as an Inductor error)."""
    q, k, v = on_device(*inputs())

    def attend(q, k, v):
        return flex_attention(q, k, v, score_mod=relative, return_lse=True)

    with torch.no_grad():
        out, lse = torch.compile(attend)(q, k, v)
        eager_out, eager_lse = attend(q, k, v)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse) and lse.shape == (B, H, L)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="compiles inference only, as on the CPU") as refused:
        torch.compile(attend, fullgraph=True)(q, k, v)
    assert not isinstance(refused.value, InductorError)


def test_a_learnt_tensor_in_score_mod_is_refused_compiled_and_trained_eagerly(fresh_device, fresh_dynamo):
    q, k, v = on_device(*inputs())
    bias = torch.zeros(L, device=DEVICE, requires_grad=True)

    def learnt(score, b, h, q_index, kv_index):
        return score + bias[kv_index]

    # Nothing Dynamo sees needs a gradient; Inductor finds the backward pass's read of the
    # log-sum-exp and refuses with the same words.
    with pytest.raises(InductorError, match="compiles inference only, as on the CPU"):
        torch.compile(flex_attention)(q, k, v, score_mod=learnt).sum().backward()
    flex_attention(q, k, v, score_mod=learnt).sum().backward()
    assert bias.grad is not None and bias.grad.device.type == DEVICE and bias.grad.abs().sum() > 0


def test_flex_attention_imported_before_or_after_the_device_is_registered():
    """Registering the device does not import FlexAttention (a fifth of a second); importing it
    before or after registration both serve the device."""
    for flex_first in (True, False):
        code, out = run_python(f"""
            import sys, torch
            if {flex_first}:
                from torch.nn.attention.flex_attention import flex_attention
            import accalloc.torch
            accalloc.torch.register_host_device()
            print("imported", "torch.nn.attention.flex_attention" in sys.modules)
            from torch.nn.attention.flex_attention import flex_attention
            q = torch.randn(1, 1, 16, 8)
            print("equal", torch.equal(flex_attention(q.to("accalloc"), q.to("accalloc"), q.to("accalloc")).cpu(),
                                       flex_attention(q, q, q)))
        """)
        assert code == 0, out
        assert f"imported {flex_first}" in out and "equal True" in out, out


HUGGING_FACE = """
    import torch
    import accalloc.torch
    accalloc.torch.register_host_device()
    from transformers import LlamaConfig, LlamaForCausalLM, logging
    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100, attn_implementation=IMPLEMENTATION)
    model = LlamaForCausalLM(config).to("accalloc")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 100, (2, 32), generator=torch.Generator().manual_seed(1)).to("accalloc")
    losses = []
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    print("losses", losses)
    # Inference as Hugging Face runs it: its flex_attention is compiled and asks for the log-sum-exp.
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        tokens = model.generate(ids[:, :8], max_new_tokens=8, do_sample=False)
    print("logits", logits.abs().sum().item())
    print("tokens", tokens.tolist())
"""


def test_a_hugging_face_model_trains_and_generates_with_flex_attention_as_with_sdpa():
    pytest.importorskip("transformers")
    runs = {}
    for implementation in ("flex_attention", "sdpa"):
        code, out = run_python(HUGGING_FACE.replace("IMPLEMENTATION", repr(implementation)))
        assert code == 0, out
        lines = dict(line.split(" ", 1) for line in out.splitlines()
                     if line.split(" ", 1)[0] in ("losses", "logits", "tokens"))
        runs[implementation] = {key: eval(value) for key, value in lines.items()}
    flex, sdpa = runs["flex_attention"], runs["sdpa"]
    assert len(flex["losses"]) == 3 and flex["losses"][0] > flex["losses"][2]
    # Two algorithms for the same attention: equal to float32 rounding, step after step, and the
    # same greedy tokens.
    assert flex["losses"] == pytest.approx(sdpa["losses"], rel=1e-5)
    assert flex["logits"] == pytest.approx(sdpa["logits"], rel=1e-5)
    assert flex["tokens"] == sdpa["tokens"] and len(flex["tokens"][0]) == 16
