#!/usr/bin/env python3
"""Generate the allocation traces used by accalloc's examples, tests and benchmarks.

Each trace is a JSON-lines file, one event per line, keys in this order, compact separators:

    {"op":"alloc","id":7,"size":4096,"stream":0}
    {"op":"free","id":7}
    {"op":"empty_cache"}

Ids are never reused within a trace; every allocation is freed before the trace ends.

Run `python3 examples/traces/gen_traces.py` to regenerate every trace next to this script.
Python 3.11, standard library only; fixed seeds, so the output is byte-identical on every run.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

TRACE_DIR = Path(__file__).resolve().parent

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Element sizes in bytes.
BF16 = 2
FP32 = 4
INT64 = 8

# Sizes at which PyTorch's caching allocator changes behaviour (see docs/REFERENCE.md).
SMALL_REQUEST_LIMIT = 1 * MiB  # <= this goes to the small pool
LARGE_ROUNDING_LIMIT = 10 * MiB  # >= this gets a segment of its own size (rounded to 2 MiB)


class TraceWriter:
    """Collects trace events in memory and keeps the running live-byte count."""

    def __init__(self, name: str):
        self.name = name
        self.lines: list[str] = []
        self.live_sizes: dict[int, int] = {}  # id -> requested size
        self.next_id = 0
        self.live_bytes = 0
        self.peak_live_bytes = 0

    def alloc(self, size: int, stream: int = 0) -> int:
        if size <= 0:
            raise ValueError(f"{self.name}: allocation size must be positive, got {size}")
        alloc_id = self.next_id
        self.next_id += 1
        self.live_sizes[alloc_id] = size
        self.live_bytes += size
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        self.lines.append(f'{{"op":"alloc","id":{alloc_id},"size":{size},"stream":{stream}}}')
        return alloc_id

    def free(self, *alloc_ids: int) -> None:
        for alloc_id in alloc_ids:
            self.live_bytes -= self.live_sizes.pop(alloc_id)
            self.lines.append(f'{{"op":"free","id":{alloc_id}}}')

    def empty_cache(self) -> None:
        self.lines.append('{"op":"empty_cache"}')

    def save(self, file_name: str) -> Path:
        if self.live_sizes:
            raise RuntimeError(f"{self.name}: {len(self.live_sizes)} allocations still live")
        path = TRACE_DIR / file_name
        with open(path, "w", encoding="ascii", newline="\n") as out:
            out.write("\n".join(self.lines))
            out.write("\n")
        return path


# ---------------------------------------------------------------------------------------------
# 1. transformer_train.jsonl: mixed-precision training of a GPT-like decoder
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GptConfig:
    layers: int = 12
    hidden: int = 512
    heads: int = 8
    vocab: int = 32000
    max_positions: int = 1024
    batch: int = 8
    # example lengths: min + exponential(mean_extra), capped; each batch is padded to its longest
    min_example_len: int = 32
    mean_extra_len: int = 120
    max_example_len: int = 384
    pad_multiple: int = 8  # dynamic padding rounds the batch length up to a multiple of this
    train_steps: int = 20
    eval_every: int = 10  # a no-grad evaluation pass (followed by empty_cache) every this many steps
    data_stream: int = 1  # input batches are copied on a side stream


@dataclass
class Param:
    name: str
    numel: int
    decay: bool  # matrices and embeddings get weight decay; biases and layernorm params do not
    tensor: int = -1  # fp32 master weight
    grad: int | None = None  # fp32 grad, set_to_none style: freed after the optimizer step
    exp_avg: int | None = None  # Adam states, created lazily by the first optimizer step
    exp_avg_sq: int | None = None


class GptTrainingTrace:
    """Models PyTorch AMP (bf16 autocast) training of a GPT-2 style model with AdamW.

    fp32 parameters, grads and Adam states; matmuls run in bf16 on per-forward weight casts;
    layernorm and the loss run in fp32; attention is a fused scale+mask+softmax over explicit
    batch*heads*seq*seq scores (Megatron style). Freed tensors follow autograd's rules: a saved
    tensor dies when its backward node has run, a gradient when its consumer has run.
    """

    def __init__(self, config: GptConfig, seed: int):
        self.cfg = config
        self.rng = random.Random(seed)
        self.trace = TraceWriter("transformer_train")
        self.training = True
        self.saved: dict[str, int] = {}  # tensors kept for backward, keyed by "<scope>.<name>"
        self.params: dict[str, Param] = {}

    # -- helpers -------------------------------------------------------------------------------

    def keep(self, key: str, tensor: int) -> None:
        """Called at a tensor's last forward use: autograd keeps it for backward, no_grad frees it."""
        if self.training:
            self.saved[key] = tensor
        else:
            self.trace.free(tensor)

    def release(self, *keys: str) -> None:
        """Backward node has run: its saved tensors die."""
        self.trace.free(*(self.saved.pop(key) for key in keys))

    def accumulate_grad(self, param: Param, new_grad: int) -> None:
        """AccumulateGrad: the first grad is stolen, later ones are added in place and freed."""
        if param.grad is None:
            param.grad = new_grad
        else:
            self.trace.free(new_grad)

    def param_grad_from_bf16(self, param: Param) -> None:
        """A grad computed in bf16 against a weight cast, then cast back to the fp32 parameter."""
        grad_bf16 = self.trace.alloc(param.numel * BF16)
        grad_fp32 = self.trace.alloc(param.numel * FP32)
        self.trace.free(grad_bf16)
        self.accumulate_grad(param, grad_fp32)

    def cast_weights(self, scope: str, linear: str) -> tuple[int, int]:
        """Autocast casts a linear's fp32 weight and bias to bf16 before the matmul."""
        weight = self.params[f"{scope}.{linear}.weight"]
        bias = self.params[f"{scope}.{linear}.bias"]
        return self.trace.alloc(weight.numel * BF16), self.trace.alloc(bias.numel * BF16)

    def finish_linear(self, scope: str, linear: str, casts: tuple[int, int]) -> None:
        """After the matmul: the weight cast is saved for backward; the bias cast stays in the
        autocast cache until autocast exits (grad mode) or dies at once (no_grad: not cached)."""
        weight_cast, bias_cast = casts
        self.keep(f"{scope}.{linear}.weight_bf16", weight_cast)
        if self.training:
            self.saved[f"{scope}.{linear}.bias_cast"] = bias_cast
        else:
            self.trace.free(bias_cast)

    def layer_norm_forward(self, scope: str, tokens: int, x_in: int) -> int:
        """fp32 layernorm, output cast to bf16 for the next matmul; returns the bf16 output."""
        t, hidden = self.trace, self.cfg.hidden
        out_fp32 = t.alloc(tokens * hidden * FP32)
        mean = t.alloc(tokens * FP32)  # per-row statistics
        rstd = t.alloc(tokens * FP32)
        out_bf16 = t.alloc(tokens * hidden * BF16)
        t.free(out_fp32)
        if self.training:  # under no_grad the caller frees the input after the residual add
            self.saved[f"{scope}.input"] = x_in
        self.keep(f"{scope}.mean", mean)
        self.keep(f"{scope}.rstd", rstd)
        return out_bf16

    def layer_norm_backward(self, scope: str, tokens: int, d_out_bf16: int) -> int:
        """Backward of cast + layernorm; returns the fp32 grad of the layernorm input."""
        t, hidden = self.trace, self.cfg.hidden
        d_out = t.alloc(tokens * hidden * FP32)
        t.free(d_out_bf16)
        d_in = t.alloc(tokens * hidden * FP32)
        for which in ("weight", "bias"):
            self.accumulate_grad(self.params[f"{scope}.{which}"], t.alloc(self.cfg.hidden * FP32))
        t.free(d_out)
        self.release(f"{scope}.mean", f"{scope}.rstd", f"{scope}.input")
        return d_in

    def linear_backward(self, scope: str, linear: str, d_out: int, input_key: str, in_features: int,
                        tokens: int) -> int:
        """Backward of a bf16 linear: grads of input, weight and bias; returns the input grad."""
        t = self.trace
        d_in = t.alloc(tokens * in_features * BF16)
        self.param_grad_from_bf16(self.params[f"{scope}.{linear}.weight"])
        self.param_grad_from_bf16(self.params[f"{scope}.{linear}.bias"])
        t.free(d_out)
        self.release(input_key, f"{scope}.{linear}.weight_bf16")
        return d_in

    # -- model ---------------------------------------------------------------------------------

    def create_parameters(self) -> None:
        """model.to(device): one fp32 allocation per parameter, in model.parameters() order."""
        cfg, h = self.cfg, self.cfg.hidden
        shapes = [("wte.weight", cfg.vocab * h, True), ("wpe.weight", cfg.max_positions * h, True)]
        for layer in range(cfg.layers):
            p = f"h{layer}"
            shapes += [
                (f"{p}.ln1.weight", h, False), (f"{p}.ln1.bias", h, False),
                (f"{p}.qkv.weight", 3 * h * h, True), (f"{p}.qkv.bias", 3 * h, False),
                (f"{p}.proj.weight", h * h, True), (f"{p}.proj.bias", h, False),
                (f"{p}.ln2.weight", h, False), (f"{p}.ln2.bias", h, False),
                (f"{p}.fc.weight", 4 * h * h, True), (f"{p}.fc.bias", 4 * h, False),
                (f"{p}.fc2.weight", 4 * h * h, True), (f"{p}.fc2.bias", h, False),
            ]
        shapes += [("ln_f.weight", h, False), ("ln_f.bias", h, False)]
        for name, numel, decay in shapes:
            param = Param(name, numel, decay)
            param.tensor = self.trace.alloc(numel * FP32)
            self.params[name] = param

    def embed_forward(self, seq: int, input_ids: int) -> int:
        t, h, tokens = self.trace, self.cfg.hidden, self.cfg.batch * seq
        tok_emb = t.alloc(tokens * h * FP32)
        pos_ids = t.alloc(seq * INT64)
        pos_emb = t.alloc(seq * h * FP32)
        x0 = t.alloc(tokens * h * FP32)
        t.free(tok_emb, pos_emb)
        self.keep("embed.pos_ids", pos_ids)
        if self.training:  # the token ids are held by the training loop until the step ends
            self.saved["embed.input_ids"] = input_ids
        return x0

    def block_forward(self, layer: int, seq: int, x_in: int) -> int:
        """One pre-LN transformer block; returns the new fp32 residual stream."""
        cfg, t = self.cfg, self.trace
        p, h, tokens = f"h{layer}", cfg.hidden, cfg.batch * seq
        score_bytes = cfg.batch * cfg.heads * seq * seq * BF16

        # attention
        ln1 = self.layer_norm_forward(f"{p}.ln1", tokens, x_in)
        qkv_casts = self.cast_weights(p, "qkv")
        qkv = t.alloc(tokens * 3 * h * BF16)
        self.finish_linear(p, "qkv", qkv_casts)
        self.keep(f"{p}.ln1_bf16", ln1)
        q, k, v = (t.alloc(tokens * h * BF16) for _ in range(3))  # head-major copies for bmm
        t.free(qkv)
        scores = t.alloc(score_bytes)
        probs = t.alloc(score_bytes)  # fused scale + causal mask + softmax
        t.free(scores)
        self.keep(f"{p}.q", q)
        self.keep(f"{p}.k", k)
        context = t.alloc(tokens * h * BF16)
        self.keep(f"{p}.probs", probs)
        self.keep(f"{p}.v", v)
        context_merged = t.alloc(tokens * h * BF16)  # transpose(1, 2).contiguous()
        t.free(context)
        proj_casts = self.cast_weights(p, "proj")
        attn_out = t.alloc(tokens * h * BF16)
        self.finish_linear(p, "proj", proj_casts)
        self.keep(f"{p}.context_merged", context_merged)
        x_mid = t.alloc(tokens * h * FP32)  # residual add, promoted to fp32
        t.free(attn_out)
        if not self.training:
            t.free(x_in)

        # MLP
        ln2 = self.layer_norm_forward(f"{p}.ln2", tokens, x_mid)
        fc_casts = self.cast_weights(p, "fc")
        fc_out = t.alloc(tokens * 4 * h * BF16)
        self.finish_linear(p, "fc", fc_casts)
        self.keep(f"{p}.ln2_bf16", ln2)
        gelu_out = t.alloc(tokens * 4 * h * BF16)
        self.keep(f"{p}.fc_out", fc_out)
        fc2_casts = self.cast_weights(p, "fc2")
        mlp_out = t.alloc(tokens * h * BF16)
        self.finish_linear(p, "fc2", fc2_casts)
        self.keep(f"{p}.gelu_out", gelu_out)
        x_out = t.alloc(tokens * h * FP32)
        t.free(mlp_out)
        if not self.training:
            t.free(x_mid)
        return x_out

    def head_forward(self, seq: int, x_final: int, targets: int) -> int:
        """Final layernorm, tied lm_head and fp32 cross-entropy; returns the loss scalar."""
        cfg, t = self.cfg, self.trace
        tokens = cfg.batch * seq
        ln_f = self.layer_norm_forward("ln_f", tokens, x_final)
        wte_bf16 = t.alloc(cfg.vocab * cfg.hidden * BF16)  # tied lm_head weight cast
        logits = t.alloc(tokens * cfg.vocab * BF16)
        self.keep("head.ln_f_bf16", ln_f)
        self.keep("head.wte_bf16", wte_bf16)
        if not self.training:
            t.free(x_final)
        logits_fp32 = t.alloc(tokens * cfg.vocab * FP32)  # autocast runs cross_entropy in fp32
        t.free(logits)
        log_probs = t.alloc(tokens * cfg.vocab * FP32)
        t.free(logits_fp32)
        loss = t.alloc(FP32)
        total_weight = t.alloc(FP32)
        self.keep("head.log_probs", log_probs)
        self.keep("head.total_weight", total_weight)
        if self.training:
            self.saved["head.targets"] = targets
            for key in [k for k in self.saved if ".bias_cast" in k]:  # autocast cache cleared
                self.release(key)
        return loss

    def backward(self, seq: int, loss: int) -> None:
        cfg, t = self.cfg, self.trace
        h, tokens = cfg.hidden, cfg.batch * seq
        score_bytes = cfg.batch * cfg.heads * seq * seq * BF16

        # loss and lm_head
        d_loss = t.alloc(FP32)  # loss.backward() seeds with ones_like(loss)
        d_log_probs = t.alloc(tokens * cfg.vocab * FP32)
        t.free(d_loss)
        self.release("head.total_weight")
        d_logits_fp32 = t.alloc(tokens * cfg.vocab * FP32)
        t.free(d_log_probs)
        self.release("head.log_probs")
        d_logits = t.alloc(tokens * cfg.vocab * BF16)
        t.free(d_logits_fp32)
        d_ln_f = t.alloc(tokens * h * BF16)
        self.param_grad_from_bf16(self.params["wte.weight"])
        t.free(d_logits)
        self.release("head.ln_f_bf16", "head.wte_bf16")
        dx = self.layer_norm_backward("ln_f", tokens, d_ln_f)

        # transformer blocks, last to first
        for layer in reversed(range(cfg.layers)):
            p = f"h{layer}"
            # MLP
            d_mlp_out = t.alloc(tokens * h * BF16)
            d_gelu = self.linear_backward(p, "fc2", d_mlp_out, f"{p}.gelu_out", 4 * h, tokens)
            d_fc_out = t.alloc(tokens * 4 * h * BF16)
            t.free(d_gelu)
            self.release(f"{p}.fc_out")
            d_ln2 = self.linear_backward(p, "fc", d_fc_out, f"{p}.ln2_bf16", h, tokens)
            d_x_ln2 = self.layer_norm_backward(f"{p}.ln2", tokens, d_ln2)
            d_x_mid = t.alloc(tokens * h * FP32)  # sum of residual and layernorm branches
            t.free(d_x_ln2, dx)

            # attention
            d_attn_out = t.alloc(tokens * h * BF16)
            d_context_merged = self.linear_backward(p, "proj", d_attn_out, f"{p}.context_merged", h,
                                                    tokens)
            d_context = t.alloc(tokens * h * BF16)
            t.free(d_context_merged)
            d_probs = t.alloc(score_bytes)
            d_v = t.alloc(tokens * h * BF16)
            t.free(d_context)
            self.release(f"{p}.probs", f"{p}.v")
            row_dot = t.alloc(cfg.batch * cfg.heads * seq * FP32)  # softmax backward row sums
            d_scores = t.alloc(score_bytes)
            t.free(row_dot, d_probs)
            d_q = t.alloc(tokens * h * BF16)
            d_k = t.alloc(tokens * h * BF16)
            t.free(d_scores)
            self.release(f"{p}.q", f"{p}.k")
            d_qkv = t.alloc(tokens * 3 * h * BF16)
            t.free(d_q, d_k, d_v)
            d_ln1 = self.linear_backward(p, "qkv", d_qkv, f"{p}.ln1_bf16", h, tokens)
            d_x_ln1 = self.layer_norm_backward(f"{p}.ln1", tokens, d_ln1)
            d_x_in = t.alloc(tokens * h * FP32)
            t.free(d_x_ln1, d_x_mid)
            dx = d_x_in

        # embeddings: position grad (sum over batch, then dense embedding backward), token grad
        d_pos = t.alloc(seq * h * FP32)
        wpe_grad = t.alloc(cfg.max_positions * h * FP32)
        t.free(d_pos)
        self.release("embed.pos_ids")
        self.accumulate_grad(self.params["wpe.weight"], wpe_grad)
        sorted_ids = t.alloc(tokens * INT64)  # embedding_dense_backward sorts the indices
        sort_order = t.alloc(tokens * INT64)
        wte_grad = t.alloc(cfg.vocab * h * FP32)
        t.free(sorted_ids, sort_order, dx)
        self.accumulate_grad(self.params["wte.weight"], wte_grad)
        del self.saved["embed.input_ids"], self.saved["head.targets"]  # owned by the loop
        if self.saved:
            raise RuntimeError(f"saved tensors never released: {sorted(self.saved)}")

    def clip_grad_norm(self) -> int:
        """torch.nn.utils.clip_grad_norm_ (foreach); returns the total-norm scalar."""
        t = self.trace
        norms = [t.alloc(FP32) for _ in self.params]  # _foreach_norm: one scalar per grad
        stacked = t.alloc(len(norms) * FP32)
        total_norm = t.alloc(FP32)
        norm_plus_eps = t.alloc(FP32)
        clip_coef = t.alloc(FP32)
        t.free(norm_plus_eps)
        clip_coef_clamped = t.alloc(FP32)
        # _foreach_mul_(grads, clip_coef_clamped) is in place; locals die on return
        t.free(*reversed(norms))
        t.free(stacked, clip_coef, clip_coef_clamped)
        return total_norm

    def adamw_step(self) -> None:
        """torch.optim.AdamW(foreach=True), two param groups (decay / no decay)."""
        t = self.trace
        for decay in (True, False):
            group = [param for param in self.params.values() if param.decay == decay]
            for param in group:  # _init_group: states created on the first step
                if param.exp_avg is None:
                    param.exp_avg = t.alloc(param.numel * FP32)
                    param.exp_avg_sq = t.alloc(param.numel * FP32)
            # lerp_/mul_/addcmul_/addcdiv_ are in place; only _foreach_sqrt allocates
            exp_avg_sq_sqrt = [t.alloc(param.numel * FP32) for param in group]
            t.free(*reversed(exp_avg_sq_sqrt))

    def zero_grad(self) -> None:
        for param in self.params.values():
            self.trace.free(param.grad)
            param.grad = None

    # -- loop ----------------------------------------------------------------------------------

    def draw_padded_seq_len(self) -> int:
        """Dynamic padding: the batch is padded to its longest example, rounded up."""
        cfg = self.cfg
        example_lens = [min(cfg.max_example_len,
                            cfg.min_example_len + int(self.rng.expovariate(1 / cfg.mean_extra_len)))
                        for _ in range(cfg.batch)]
        longest = max(example_lens)
        return min(-(-longest // cfg.pad_multiple) * cfg.pad_multiple, cfg.max_example_len)

    def run_forward(self, seq: int, input_ids: int, targets: int) -> int:
        x = self.embed_forward(seq, input_ids)
        for layer in range(self.cfg.layers):
            x = self.block_forward(layer, seq, x)
        return self.head_forward(seq, x, targets)

    def load_batch(self, seq: int) -> tuple[int, int]:
        tokens = self.cfg.batch * seq
        input_ids = self.trace.alloc(tokens * INT64, stream=self.cfg.data_stream)
        targets = self.trace.alloc(tokens * INT64, stream=self.cfg.data_stream)
        return input_ids, targets

    def train_step(self) -> None:
        seq = self.draw_padded_seq_len()
        input_ids, targets = self.load_batch(seq)
        self.training = True
        loss = self.run_forward(seq, input_ids, targets)
        self.backward(seq, loss)
        total_norm = self.clip_grad_norm()
        self.adamw_step()
        self.zero_grad()
        self.trace.free(loss, total_norm, input_ids, targets)  # after loss.item() logging

    def eval_pass(self) -> None:
        seq = self.draw_padded_seq_len()
        input_ids, targets = self.load_batch(seq)
        self.training = False
        loss = self.run_forward(seq, input_ids, targets)
        self.trace.free(loss, input_ids, targets)
        self.trace.empty_cache()  # torch.cuda.empty_cache() after evaluation

    def generate(self) -> TraceWriter:
        self.create_parameters()
        for step in range(1, self.cfg.train_steps + 1):
            self.train_step()
            if step % self.cfg.eval_every == 0:
                self.eval_pass()
        for param in self.params.values():  # del model, optimizer
            self.trace.free(param.exp_avg, param.exp_avg_sq, param.tensor)
        self.trace.empty_cache()
        return self.trace


# ---------------------------------------------------------------------------------------------
# 2. varying_sizes.jsonl: dynamic-batching inference server
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncoderServerConfig:
    layers: int = 4
    hidden: int = 1024
    heads: int = 16
    vocab: int = 30522
    max_positions: int = 512
    max_batch: int = 32
    start_load: float = 0.1  # traffic ramps up: the batch-size bound grows from this fraction to 1
    min_request_len: int = 5
    mean_extra_request_len: int = 90  # request lengths: min + exponential(mean), capped
    max_tokens_per_batch: int = 16384
    iterations: int = 130
    max_output_lifetime: int = 4  # outputs wait 1..this many iterations for their host copy


class EncoderServerTrace:
    """A BERT-like encoder (bf16, eager attention) behind a dynamic-batching server.

    Every iteration takes a batch of random size padded to its longest request (any length,
    not a round number), so the activation sizes, the batch*heads*seq*seq attention scores
    above all, change every iteration; traffic ramps up over the run, so new maxima keep
    arriving. Each batch's outputs stay on the device for a few more iterations while they are
    copied back to the host, pinning whatever segments they sit in.
    """

    def __init__(self, config: EncoderServerConfig, seed: int):
        self.cfg = config
        self.rng = random.Random(seed)
        self.trace = TraceWriter("varying_sizes")
        self.weights: list[int] = []
        self.pending_outputs: list[tuple[int, list[int]]] = []  # (iteration to free at, ids)

    def load_weights(self) -> None:
        cfg, h, t = self.cfg, self.cfg.hidden, self.trace
        numels = [cfg.vocab * h, cfg.max_positions * h, 2 * h, h, h]  # embeddings + layernorm
        for _ in range(cfg.layers):
            for out_features, in_features in ((h, h), (h, h), (h, h), (h, h)):  # q, k, v, out
                numels += [out_features * in_features, out_features]
            numels += [h, h]  # attention layernorm
            numels += [4 * h * h, 4 * h, 4 * h * h, h, h, h]  # MLP up, down, layernorm
        numels += [h * h, h]  # pooler
        self.weights = [t.alloc(numel * BF16) for numel in numels]
        self.weights.append(t.alloc(cfg.max_positions * INT64))  # position_ids buffer

    def draw_batch(self, iteration: int) -> tuple[int, int]:
        """Returns (batch size, padded sequence length) under the current load and token budget."""
        cfg = self.cfg
        load = cfg.start_load + (1 - cfg.start_load) * iteration / cfg.iterations
        batch = self.rng.randint(1, max(1, round(cfg.max_batch * load)))
        lengths = [min(cfg.max_positions,
                       cfg.min_request_len + int(self.rng.expovariate(1 / cfg.mean_extra_request_len)))
                   for _ in range(batch)]
        seq = max(lengths)
        batch = max(1, min(batch, cfg.max_tokens_per_batch // seq))
        return batch, seq

    def layer_norm(self, tokens: int, residual_sum: int) -> int:
        t = self.trace
        out = t.alloc(tokens * self.cfg.hidden * BF16)
        mean, rstd = t.alloc(tokens * FP32), t.alloc(tokens * FP32)
        t.free(mean, rstd, residual_sum)
        return out

    def encoder_layer(self, batch: int, seq: int, x: int) -> int:
        cfg, t = self.cfg, self.trace
        tokens, h = batch * seq, cfg.hidden
        act = tokens * h * BF16
        score_bytes = batch * cfg.heads * seq * seq * BF16

        q_lin, k_lin, v_lin = t.alloc(act), t.alloc(act), t.alloc(act)
        q_heads, k_heads = t.alloc(act), t.alloc(act)  # reshape copies for bmm
        scores = t.alloc(score_bytes)
        t.free(q_heads, k_heads)
        scaled = t.alloc(score_bytes)
        t.free(scores)
        masked = t.alloc(score_bytes)
        t.free(scaled)
        probs = t.alloc(score_bytes)
        t.free(masked)
        v_heads = t.alloc(act)
        context = t.alloc(act)
        t.free(probs, v_heads)
        context_merged = t.alloc(act)  # permute(0, 2, 1, 3).contiguous()
        t.free(context, q_lin, k_lin, v_lin)
        attn_dense = t.alloc(act)
        t.free(context_merged)
        attn_sum = t.alloc(act)
        t.free(attn_dense)
        attn_out = self.layer_norm(tokens, attn_sum)
        t.free(x)

        up = t.alloc(tokens * 4 * h * BF16)
        gelu = t.alloc(tokens * 4 * h * BF16)
        t.free(up)
        down = t.alloc(act)
        t.free(gelu)
        mlp_sum = t.alloc(act)
        t.free(down)
        out = self.layer_norm(tokens, mlp_sum)
        t.free(attn_out)
        return out

    def serve_batch(self, batch: int, seq: int) -> list[int]:
        """Runs one forward pass; returns the ids of the outputs handed back to the host."""
        cfg, t = self.cfg, self.trace
        tokens, h = batch * seq, cfg.hidden
        input_ids, token_types, attention_mask = (t.alloc(tokens * INT64) for _ in range(3))

        # extended attention mask: (1 - mask[:, None, None, :].to(bf16)) * finfo.min
        mask_bf16 = t.alloc(tokens * BF16)
        inverted = t.alloc(tokens * BF16)
        t.free(mask_bf16)
        extended_mask = t.alloc(tokens * BF16)
        t.free(inverted)

        word_emb, type_emb = t.alloc(tokens * h * BF16), t.alloc(tokens * h * BF16)
        summed = t.alloc(tokens * h * BF16)
        t.free(word_emb, type_emb)
        pos_emb = t.alloc(seq * h * BF16)
        with_pos = t.alloc(tokens * h * BF16)
        t.free(summed, pos_emb)
        x = self.layer_norm(tokens, with_pos)

        for _ in range(cfg.layers):
            x = self.encoder_layer(batch, seq, x)

        cls = t.alloc(batch * h * BF16)  # hidden[:, 0] gathered for the pooler
        pooled_dense = t.alloc(batch * h * BF16)
        t.free(cls)
        pooled = t.alloc(batch * h * BF16)
        t.free(pooled_dense, input_ids, token_types, attention_mask, extended_mask)
        return [x, pooled]

    def release_finished_outputs(self, iteration: int) -> None:
        still_pending = []
        for free_at, ids in self.pending_outputs:
            if free_at <= iteration:
                self.trace.free(*ids)
            else:
                still_pending.append((free_at, ids))
        self.pending_outputs = still_pending

    def generate(self) -> TraceWriter:
        self.load_weights()
        for iteration in range(self.cfg.iterations):
            self.release_finished_outputs(iteration)
            batch, seq = self.draw_batch(iteration)
            outputs = self.serve_batch(batch, seq)
            lifetime = self.rng.randint(1, self.cfg.max_output_lifetime)
            self.pending_outputs.append((iteration + lifetime, outputs))
        self.release_finished_outputs(self.cfg.iterations + self.cfg.max_output_lifetime)
        self.trace.free(*self.weights)
        self.trace.empty_cache()
        return self.trace


# ---------------------------------------------------------------------------------------------
# 3. random_rmm.jsonl: RMM's random_allocations benchmark
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RandomRmmConfig:
    operations: int = 20000  # alloc + free events before the final cleanup
    alloc_probability: float = 0.73
    max_size: int = 64 * MiB  # sizes uniform in 1..max_size bytes
    max_live_bytes: int = 3 * GiB // 2  # an allocation that would pass this becomes a free


def generate_random_rmm(config: RandomRmmConfig, seed: int) -> TraceWriter:
    """Like RMM's random_allocations: allocate with probability p, else free a random live one."""
    rng = random.Random(seed)
    trace = TraceWriter("random_rmm")
    live: list[int] = []
    for _ in range(config.operations):
        size = rng.randint(1, config.max_size)
        want_alloc = not live or rng.random() < config.alloc_probability
        if want_alloc and trace.live_bytes + size <= config.max_live_bytes:
            live.append(trace.alloc(size))
        else:
            victim = rng.randrange(len(live))
            live[victim], live[-1] = live[-1], live[victim]
            trace.free(live.pop())
    rng.shuffle(live)  # the benchmark's cleanup order is arbitrary
    trace.free(*live)
    return trace


# ---------------------------------------------------------------------------------------------
# Self-check and driver
# ---------------------------------------------------------------------------------------------


@dataclass
class TraceSummary:
    lines: int
    allocs: int
    frees: int
    empty_caches: int
    peak_live_bytes: int
    small_allocs: int  # <= 1 MiB: small pool
    medium_allocs: int  # 1 MiB .. 10 MiB: 20 MiB large segments
    huge_allocs: int  # >= 10 MiB: a segment of their own size
    largest_alloc: int


def verify_trace(path: Path) -> TraceSummary:
    """Re-reads a written trace and checks format and balance; raises ValueError on a problem."""
    live: dict[int, int] = {}  # id -> size
    live_bytes = 0
    summary = TraceSummary(0, 0, 0, 0, 0, 0, 0, 0, 0)
    with open(path, encoding="ascii") as trace_file:
        for line_no, line in enumerate(trace_file, 1):
            where = f"{path.name}:{line_no}"
            if not line.endswith("\n"):
                raise ValueError(f"{where}: missing newline")
            event = json.loads(line)
            if json.dumps(event, separators=(",", ":")) != line[:-1]:
                raise ValueError(f"{where}: not in compact canonical form")
            summary.lines += 1
            op = event.get("op")
            if op == "alloc":
                if list(event) != ["op", "id", "size", "stream"]:
                    raise ValueError(f"{where}: bad alloc keys {list(event)}")
                alloc_id, size, stream = event["id"], event["size"], event["stream"]
                if not all(type(v) is int for v in (alloc_id, size, stream)):
                    raise ValueError(f"{where}: id, size and stream must be integers")
                if alloc_id < 0 or size <= 0 or not 0 <= stream < 8:
                    raise ValueError(f"{where}: id, size or stream out of range")
                if alloc_id in live:
                    raise ValueError(f"{where}: id {alloc_id} allocated again while live")
                live[alloc_id] = size
                live_bytes += size
                summary.peak_live_bytes = max(summary.peak_live_bytes, live_bytes)
                summary.allocs += 1
                summary.largest_alloc = max(summary.largest_alloc, size)
                if size <= SMALL_REQUEST_LIMIT:
                    summary.small_allocs += 1
                elif size < LARGE_ROUNDING_LIMIT:
                    summary.medium_allocs += 1
                else:
                    summary.huge_allocs += 1
            elif op == "free":
                if list(event) != ["op", "id"] or type(event["id"]) is not int:
                    raise ValueError(f"{where}: bad free event")
                if event["id"] not in live:
                    raise ValueError(f"{where}: free of id {event['id']} which is not live")
                live_bytes -= live.pop(event["id"])
                summary.frees += 1
            elif op == "empty_cache":
                if list(event) != ["op"]:
                    raise ValueError(f"{where}: bad empty_cache event")
                summary.empty_caches += 1
            else:
                raise ValueError(f"{where}: unknown op {op!r}")
    if live:
        raise ValueError(f"{path.name}: {len(live)} allocations never freed")
    return summary


def format_bytes(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def main() -> None:
    traces = [
        ("transformer_train.jsonl", GptTrainingTrace(GptConfig(), seed=1).generate),
        ("varying_sizes.jsonl", EncoderServerTrace(EncoderServerConfig(), seed=2).generate),
        ("random_rmm.jsonl", lambda: generate_random_rmm(RandomRmmConfig(), seed=3)),
    ]
    print(f"{'trace':<26}{'lines':>8}{'file size':>12}{'peak live bytes':>26}"
          f"{'<=1MiB':>8}{'1-10MiB':>9}{'>=10MiB':>9}")
    for file_name, generate in traces:
        writer = generate()
        path = writer.save(file_name)
        summary = verify_trace(path)
        if summary.peak_live_bytes != writer.peak_live_bytes:
            raise ValueError(f"{file_name}: peak mismatch between writer and verifier")
        print(f"{file_name:<26}{summary.lines:>8}{format_bytes(path.stat().st_size):>12}"
              f"{summary.peak_live_bytes:>15} ({format_bytes(summary.peak_live_bytes)})"
              f"{summary.small_allocs:>8}{summary.medium_allocs:>9}{summary.huge_allocs:>9}")


if __name__ == "__main__":
    main()
