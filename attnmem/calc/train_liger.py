"""Liger's kernels in a training step (`liger=True`), as liger-kernel's
apply_liger_kernel_to_llama patches a Llama-family model with its defaults (rope=True,
cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True, swiglu=True;
src/liger_kernel/transformers/monkey_patch.py) and as TRL/transformers' use_liger_kernel=True
applies it. Read from linkedin/Liger-Kernel at ead96b6 (2026-08-21). Notation:
attnmem/calc/train_common.py.

- RMSNorm (ops/rms_norm.py, LigerRMSNormFunction): `ctx.save_for_backward(X, W, RSTD)`: the
  bf16 input itself (2Th) and one fp32 rstd per row (casting_mode "llama": 4T), in place of
  transformers' fp32 copy (4Th) and bf16 normalized input (2Th); the backward writes dX into
  dY (in_place=True).
- SwiGLU (ops/swiglu.py, LigerSiLUMulFunction): `ctx.save_for_backward(a, b)`: gate(x) and
  up(x) (2TI each), not act(gate(x)); the backward writes da, db into a, b.
- RoPE (ops/rope.py, rope_forward): rotates the projections' q and k in place (transposed back
  to their physical layout, `.contiguous()` a no-op) and saves cos and sin: the saved bytes are
  transformers' (the rotated q and k kept by attention), so nothing changes in the count.
- Fused linear cross-entropy (ops/fused_linear_cross_entropy.py,
  fused_linear_cross_entropy_forward; model/llama.py lce_forward with skip_logits in training):
  the logits are never built whole. The T rows are cut in chunks of
  `chunk_size = next_power_of_2(cdiv(T, cdiv(V, h)))` (`flce_chunk`); per chunk the bf16
  logits (chunk×V) are made, the cross-entropy kernel writes their gradient in place, and the
  gradients are accumulated in the forward: grad_input = zeros_like(input) (T×h, bf16),
  grad_weight = zeros_like(weight) (when lm_head is trained; accum_dtype None: the weight's
  dtype), loss_1d (fp32, T), and per chunk `grad_logits_chunk @ weight` (chunk×h) and
  `torch.mm(grad_logits_chunk.t(), input_chunk).float()` (V×h bf16 then its fp32 copy) added
  into grad_weight. `ctx.save_for_backward(grad_input, grad_weight, grad_bias)`: what the
  step keeps of the loss until the backward, where they are returned as they are (grad_output
  is 1.0) and grad_weight becomes lm_head's .grad. So no log-softmax (4TV), no logits'
  gradients (2·4TV) and no lm_head input are kept.
Refused (not counted): amp_bf16 (amp_custom_fwd casts), kbit_prepare's fp32 stream, tied
embeddings (the forward's grad_weight meets the embedding's in one .grad), Gemma, qk-norm,
GPT-2, Phi-3, MoE, gpt-oss, tensor parallelism.
"""

from __future__ import annotations

from attnmem.calc.models import ModelConfig
from attnmem.calc.train_common import _Dims
from attnmem.calc.train_dense import _GEMMA
from attnmem.calc.units import check_bool

#: Model types whose Liger patch is counted (apply_liger_kernel_to_llama / _mistral / _qwen2).
LIGER_MODEL_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2")
#: The step's moment that replaces the loss's and lm_head's backward under Liger.
LIGER_PHASE = "loss (Liger fused linear cross-entropy)"


def check_liger(model: ModelConfig, liger: object, precision: str, kbit: bool, tp: int) -> bool:
    check_bool("liger", liger)
    if not liger:
        return False
    if model.model_type not in LIGER_MODEL_TYPES or model.qk_norm or model.model_type in _GEMMA \
            or model.num_experts > 1:
        raise ValueError(f"liger=True on {model.name!r} ({model.model_type}): Liger's kernels "
                         "are counted for " + ", ".join(LIGER_MODEL_TYPES)
                         + " (dense, RMSNorm, SwiGLU, no qk-norm)")
    if model.tie_embeddings:
        raise ValueError(f"liger=True on {model.name!r}: tied embeddings (the fused loss's "
                         "lm_head gradient meets the embedding's) are not counted")
    if precision != "bf16":
        raise ValueError(f"liger=True with precision {precision!r}: only 'bf16' is counted")
    if kbit:
        raise ValueError("liger=True with kbit_prepare=True: Liger's kernels on the fp32 "
                         "stream of a kbit-prepared model are not counted")
    if tp != 1:
        raise ValueError(f"liger=True with tp={tp}: not counted (tp=1 only)")
    return True


def flce_chunk(t: int, vocab: int, h: int) -> int:
    """Rows per chunk of the fused linear cross-entropy: next_power_of_2(cdiv(T, cdiv(V, h)))."""
    inc = -(-vocab // h)
    rows = -(-t // inc)
    return 1 << (rows - 1).bit_length()


def liger_layer_terms(terms: list[tuple[str, str, int]], dm: _Dims,
                      ) -> list[tuple[str, str, int]]:
    """A layer's (or the final norm's) saved tensors with Liger's RMSNorm and SwiGLU in place of
    transformers' (module docstring)."""
    t, h, i = dm.t, dm.h, dm.inter
    out: list[tuple[str, str, int]] = []
    mlp = any(lab.startswith(("gate(x)", "act(gate(x)), kept", "up(x)")) for _, lab, _ in terms)
    for part, lab, x in terms:
        if lab.endswith("fp32 copy of the input (pow)"):
            where = lab.split(":")[0]
            out.append((part, f"{where}: its input X (bf16), kept by LigerRMSNorm", 2 * t * h))
            continue
        if lab.endswith("normalized input (weight ×)"):
            continue
        if lab.startswith(("gate(x)", "act(gate(x)), kept", "up(x)")):
            continue
        out.append((part, lab, x))
    if mlp:
        out += [("MLP", "gate(x), kept by LigerSiLUMulFunction", 2 * t * i),
                ("MLP", "up(x), kept by LigerSiLUMulFunction", 2 * t * i)]
    return out


def liger_model_terms(terms: list[tuple[str, str, int]], dm: _Dims, g_lm: int,
                      ) -> list[tuple[str, str, int]]:
    """The model-level terms with LigerRMSNorm as the final norm and the fused loss: lm_head's
    input, the log-softmax and (Gemma) tanh go; the loss saves grad_input (T×h bf16) and, when
    lm_head is trained, its weight gradient (g_lm bytes) made in the forward."""
    out = [x for x in liger_layer_terms(terms, dm)
           if not x[1].startswith(("lm_head input", "log-softmax", "tanh of the soft-capped"))]
    out.append(("logits and loss", "fused loss: lm_head input gradient (T×h bf16), made in the "
                "forward and saved", 2 * dm.t * dm.h))
    if g_lm:
        out.append(("logits and loss", "fused loss: lm_head weight gradient, made in the forward "
                    "and saved (becomes its .grad)", g_lm))
    return out


def flce_forward_extra(dm: _Dims, g_lm: int) -> int:
    """The fused loss's transient bytes at its largest moment, beyond what it saves and its
    input: loss_1d (fp32 T), target_mask (bool T), one chunk's bf16 logits (chunk×V) and
    `grad_logits_chunk @ weight` (chunk×h); when lm_head is trained, torch.mm's V×h bf16
    product and its fp32 copy (`.float()`) before they are added into grad_weight."""
    c = min(flce_chunk(dm.t, dm.vocab, dm.h), dm.t)
    extra = 4 * dm.t + dm.t + 2 * c * dm.vocab + 2 * c * dm.h
    if g_lm:
        extra += (2 + 4) * dm.vocab * dm.h
    return extra
