"""gpt-oss's decoder layer in a training step, in bf16 (transformers 5.17
models/gpt_oss/modeling_gpt_oss.py, the grouped_mm experts of integrations/moe.py): its
RMSNorm, its eager attention with sinks and its MoE block with biased experts and a clamped
SwiGLU. The parts it shares with the other MoE blocks (the gradients of the experts, the
sentinel mask, expert parallelism) are attnmem/calc/train_moe.py's. Notation:
attnmem/calc/train_common.py.

gpt-oss in bf16 (`_gpt_oss_layer_terms`, `_gpt_oss_moe_backward_extra`): the released
checkpoints store the experts in MXFP4; training needs them dequantized to bf16, which is what
from_config builds, so weights, gradients and AdamW state are bf16 here. GptOssRMSNorm keeps
an fp32 normalized input (its `weight * x` is promoted to fp32); eager attention only
(GPT_OSS_ATTENTIONS: 5.17 refuses SDPA for gpt-oss) with the sink column in the saved bf16
probabilities (B·H·s·(s+1)) and max's int64 indices; the router's softmax over the top-k
(bf16, T·k); the experts' biases (the sorted expert ids kept by the bias gathers) and the
clamped SwiGLU's four S·I tensors; alternating sliding/full layers change only the additive
masks (one per type, alive through the forward, kept by the checkpoints). Checked: CPU replays
of a tiny gpt-oss (2 layers, one sliding), forward within 8 bytes per layer, peak within 3%
(the CPU makes no softmax `tmp`, counted on CUDA as for Llama's eager attention: not measured
for this bf16 softmax over s + 1 columns).
"""

from __future__ import annotations

from fractions import Fraction

from attnmem.calc.models import ModelConfig
from attnmem.calc.train_common import _Dims
from attnmem.calc.train_moe import (
    SENTINEL_LABEL,
    _ep_combine_backward,
    _ep_dispatch_backward,
    _ep_terms,
    _moe_block_grads,
    _Walk,
)

#: Attention implementations a gpt-oss training step accepts. transformers 5.17's
#: GptOssPreTrainedModel sets _supports_sdpa = False (an explicit "sdpa" raises, the default
#: falls back to eager: modeling_utils.get_correct_attn_implementation), and its flash entries
#: are hub kernels with sinks (_compatible_flash_implementations: vllm-flash-attn3, FA4) or
#: flex_attention, none of whose saved tensors is counted here: eager only.
GPT_OSS_ATTENTIONS: tuple[str, ...] = ("eager",)


def _check_gpt_oss_args(attention: str, cache: bool) -> None:
    if attention not in GPT_OSS_ATTENTIONS:
        raise ValueError(
            f"attention {attention!r} with gpt-oss: only {', '.join(GPT_OSS_ATTENTIONS)} is "
            "modelled. transformers 5.17 refuses 'sdpa' for gpt-oss (_supports_sdpa = False: "
            "SDPA has no sink logits); its flash paths are hub kernels with sinks "
            "(vllm-flash-attn3, flash_attention_4) and flex_attention, not counted here")
    if cache:
        raise ValueError("use_cache=True with gpt-oss is not modelled (the DynamicCache's "
                         "sliding-window layers keep only the window; the training step "
                         "passes use_cache=False)")


def _gpt_oss_norm_terms(where: str, rows: int, width: int) -> list[tuple[str, str, int]]:
    """GptOssRMSNorm: `x.to(float32)`, `x.pow(2).mean`, `x * rsqrt(var + eps)`, then
    `(self.weight * x).to(input_dtype)`: unlike Llama's `weight * x.to(bf16)`, the bf16 weight
    times the fp32 normalized input is fp32 (type promotion), so that mul keeps the fp32
    normalized input (4 bytes per element) for the weight's gradient; pow keeps the fp32
    copy, the rsqrt product keeps the fp32 rsqrt."""
    return [("norms", f"{where}: fp32 copy of the input (pow)", 4 * rows * width),
            ("norms", f"{where}: rsqrt of the mean square (fp32)", 4 * rows),
            ("norms", f"{where}: fp32 normalized input (weight ×, promoted to fp32)",
             4 * rows * width)]


def _gpt_oss_attention_sizes(dm: _Dims) -> tuple[int, int]:
    """(N, N'): score elements B·H·s² and, with the sink column, B·H·s·(s + 1)."""
    return dm.n, dm.b * dm.heads * dm.s * (dm.s + 1)


def _gpt_oss_layer_terms(model: ModelConfig, dm: _Dims) -> list[tuple[str, str, int]]:
    """One GptOssDecoderLayer under eager attention (modeling_gpt_oss.py
    eager_attention_forward), bf16:
    - input and post-attention norms: _gpt_oss_norm_terms;
    - q, k, v linears (with bias: addmm keeps the input, the norm output, 2·T·h);
    - rotary (`_apply_rotary_emb`: chunk, `first * cos - second * sin`, cat): the muls keep
      cos and sin only (model level); the cat makes the rotated q and k;
    - `matmul(q, repeat_kv(k)ᵀ)` keeps q and the repeated k (H heads; repeat_kv copies when
      H_kv < H); `* scaling` and `+ mask` keep nothing; `cat([scores, sinks])` keeps sizes;
      `combined - combined.max(-1, keepdim).values`: max keeps its int64 indices (B·H·s);
      `softmax(dtype=bf16)` keeps its bf16 output over s + 1 columns; `probs[..., :-1]` is a
      view and dropout(p=0) returns it, so P·V keeps the same storage and the repeated v;
    - o_proj keeps the attention output made contiguous (2·T·q);
    - the MoE block: _gpt_oss_moe_terms."""
    t, h = dm.t, dm.h
    _, n_sink = _gpt_oss_attention_sizes(dm)
    kv = dm.q if dm.kv_heads != dm.heads else dm.k
    rep = " repeated to H heads (repeat_kv)" if dm.kv_heads != dm.heads else ""
    terms = _gpt_oss_norm_terms("input norm", t, h)
    terms += [
        ("projections", "q, k, v input (the norm output)", 2 * t * h),
        ("rotary", "q after rotary (saved by q·kᵀ)", 2 * t * dm.q),
        ("rotary", "k after rotary" + rep + ", saved by q·kᵀ", 2 * t * kv),
        ("attention", "v" + rep + ", saved by P·V", 2 * t * kv),
        ("attention", "row-max indices of the scores with the sink column (int64, B·H·s), "
         "kept by max", 8 * dm.b * dm.heads * dm.s),
        ("attention", "probabilities with the sink column (bf16, B·H·s·(s+1)), kept by softmax "
         "and P·V", 2 * n_sink),
        ("projections", "o_proj input (attention output made contiguous)", 2 * t * dm.q)]
    terms += _gpt_oss_norm_terms("post-attention norm", t, h)
    terms.append(("projections", "gate, up input (the norm output), kept by the router's "
                  "linear", 2 * t * h))
    return terms + _gpt_oss_moe_terms(model, dm)


def _gpt_oss_moe_terms(model: ModelConfig, dm: _Dims) -> list[tuple[str, str, int]]:
    """What GptOssMLP keeps for its backward, bf16, S = T·k pairs:
    - GptOssTopKRouter: `F.linear(x, W, b)` keeps x (the caller's term); topk over the bf16
      logits keeps its int64 indices (T·k); `softmax(top_values, dtype=bf16)` keeps its output
      (T·k), the routing weights;
    - grouped_mm_experts_forward (has_bias, is_transposed, interleaved gate_up): the token
      gather keeps `perm // k` (int64, S), the weights' gather `perm` (S), the two bias
      gathers `gate_up_proj_bias[expert_ids_g]` and `down_proj_bias[expert_ids_g]` keep the
      sorted expert ids (int64, S; the biased gathers themselves are added in place and die);
      the sentinel mask (bool, S); the offsets (int32, E); the gate_up grouped_mm keeps the
      gathered states (S·h); the masked gate_up output (S·2I) is kept through its strided
      gate/up views by the two clamps;
    - GptOssExperts._apply_gate: `gate.clamp(max=limit)` and `up.clamp(±limit)` keep the
      views; `gate * alpha` keeps nothing; sigmoid keeps its output; `gate * sigmoid` keeps
      the clamped gate and the sigmoid; `(up + 1) * glu` keeps up + 1 and glu: 4 × S·I; the
      down grouped_mm keeps the gated product (S·I);
    - the routing-weight product keeps the masked expert outputs (S·h) and the sorted weights
      (bf16, S); the un-permuting gather keeps inv_perm (int64, S)."""
    t, h, i = dm.t, dm.h, dm.inter
    ne, k = model.num_experts, model.experts_per_token
    s = t * k
    p = "MoE"
    return [
        (p, "top-k expert indices (int64, T×k), kept by topk", 8 * t * k),
        (p, "routing weights: softmax of the top-k logits (bf16, T×k), kept by softmax",
         2 * t * k),
        (p, "pair-to-token index perm // k (int64, S), kept by the gather", 8 * s),
        (p, "sort permutation (int64, S), kept by the routing weights' gather", 8 * s),
        (p, "sorted expert ids (int64, S), kept by the two bias gathers", 8 * s),
        (p, SENTINEL_LABEL, s),
        (p, "tokens-per-expert offsets (int32, E), kept by grouped_mm", 4 * ne),
        (p, "gathered hidden states (S×h), kept by the gate_up grouped_mm", 2 * s * h),
        (p, "gate_up output + bias, masked (S×2I), kept by the clamps through its views",
         2 * s * 2 * i),
        (p, "clamped gate, sigmoid(alpha·gate), glu, up + 1 (4 × S×I)", 4 * 2 * s * i),
        (p, "(up + 1)·glu (S×I), kept by the down grouped_mm", 2 * s * i),
        (p, "expert outputs + bias, masked (S×h), kept by the routing-weight product",
         2 * s * h),
        (p, "routing weights sorted by expert (bf16, S)", 2 * s),
        (p, "inverse permutation (int64, S), kept by the un-permuting gather", 8 * s),
        *_ep_terms(model, dm)]


def _gpt_oss_moe_backward_extra(model: ModelConfig, dm: _Dims, g_per_param: Fraction,
                                g_rest: Fraction | None = None) -> int:
    """Largest excess over (the block's saved tensors + the incoming T·h gradient) during
    GptOssMLP's backward, op by op in autograd's order (the later-made node first among those
    ready): the un-permuting gather (zeros S·h + index_put); the routing-weight product (the
    outputs' gradient S·h, the weights' through an S·h product summed to S); the sentinel
    masked_fill's copy (S·h); the down grouped_mm (S·I and every expert's down gradient);
    `(up + 1)·glu` (two S·I); up's clamp (S·I); `gate·sigmoid` (two S·I); sigmoid (S·I);
    `·alpha` (S·I, summed in place into the clamped gate's gradient); gate's clamp (S·I); the
    strided views' backward (slice_backward: zeros S·2I + copy, one per view, summed in
    place); the masked_fill's copy (S·2I); the gate_up grouped_mm (S·h and every expert's
    gate_up gradient); the in-place masked_fill_'s copy (S·h); the token gather (zeros T·h);
    the router (topk's zeros T·E, bf16, and the linear's input gradient T·h)."""
    t, h, i = dm.t, dm.h, dm.inter
    ne, k = model.num_experts, model.experts_per_token
    s = t * k
    g_up, g_down, _ = _moe_block_grads(model, g_per_param, g_rest)
    a2a = dm.ep > 1
    walk = _Walk()
    alloc, free = walk.alloc, walk.free

    si = 2 * s * i  # one S×I bf16 tensor
    alloc(2 * s * h)  # index backward: zeros + index_put
    free(8 * s)  # inv_perm
    alloc(2 * s * h)  # d(expert outputs) = g · w
    alloc(2 * s * h)  # g · outputs, summed to the weights' gradient
    alloc(2 * s)
    free(2 * s * h)
    free(2 * s * h + 2 * s * h + 2 * s)  # the gather's gradient, expert outputs, weights
    if a2a:
        _ep_combine_backward(alloc, free, s, h)
    alloc(2 * s * h)  # sentinel masked_fill backward: a copy
    free(2 * s * h)
    alloc(si)  # down grouped_mm: input gradient
    alloc(g_down)
    free(2 * s * h + si)  # d(outputs), the gated product
    alloc(2 * si)  # (up + 1)·glu: d(up + 1), d(glu)
    free(si + 2 * si)  # d(gated), up + 1, glu
    alloc(si)  # up's clamp backward
    free(si)  # d(up + 1)
    alloc(2 * si)  # gate·sigmoid: d(gate), d(sigmoid)
    free(si + si)  # d(glu), the clamped gate
    alloc(si)  # sigmoid backward
    free(2 * si)  # d(sigmoid), the sigmoid output
    alloc(si)  # ·alpha backward
    free(si)  # d(·alpha) input
    free(si)  # summed in place into the clamped gate's gradient
    alloc(si)  # gate's clamp backward
    free(si + 2 * s * 2 * i)  # d(clamped gate); the gate_up output, its last saver done
    alloc(2 * s * 2 * i)  # up view: slice_backward zeros + copy
    free(si)
    alloc(2 * s * 2 * i)  # gate view
    free(si)
    free(2 * s * 2 * i)  # summed in place
    alloc(2 * s * 2 * i)  # sentinel masked_fill backward: a copy
    free(2 * s * 2 * i)
    alloc(2 * s * h)  # gate_up grouped_mm: input gradient
    alloc(g_up)
    free(2 * s * 2 * i + 2 * s * h)  # its gradient, the gathered states
    alloc(2 * s * h)  # in-place masked_fill_ backward: a copy
    free(2 * s * h)
    if a2a:
        _ep_dispatch_backward(alloc, free, s, h)
    alloc(2 * t * h)  # the token gather's zeros
    free(2 * s * h + 8 * s)
    alloc(2 * t * ne)  # topk backward: zeros (bf16 logits)
    alloc(2 * t * h)  # the router linear's input gradient
    return walk.peak


def _gpt_oss_attention_backward_extra(dm: _Dims) -> int:
    """Eager attention with sinks, backward beyond its saved tensors, at softmax's backward:
    the gradient of the probabilities widened back to s + 1 columns (slice_backward: zeros +
    copy, N'), softmax's bf16 result (N'), CUDA's `tmp = grad * output` (N', the grad dtype:
    aten/src/ATen/native/cuda/SoftMax.cu softmax_backward_cuda_out) and dV (repeated, 2·T·q),
    waiting for repeat_kv's backward. The later max backward (zeros N' + scatter) runs after
    the probabilities are freed and is smaller."""
    _, n_sink = _gpt_oss_attention_sizes(dm)
    return 3 * 2 * n_sink + 2 * dm.t * dm.q


def _gpt_oss_attention_forward_extra(dm: _Dims) -> int:
    """The forward's largest moment beyond the saved tensors: at the subtraction of the row
    maxima, the masked scores (N, still bound to `attn_weights` until dropout rebinds it), the
    concatenated logits (N') and their shifted copy (N') are alive, the probabilities (saved,
    N') not yet; at softmax the shifted copy and the probabilities: 2·N + 2·N' either way."""
    n, n_sink = _gpt_oss_attention_sizes(dm)
    return 2 * n + 2 * n_sink
