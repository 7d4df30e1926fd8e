"""What a dense decoder keeps for its backward in a training step, layer by layer and at model
level, and the extra peak of a layer's backward (the MLP's or the attention call's).

Every activation term is a count of the tensors that autograd saves, read from the modules of
`transformers` 5 (models/llama/modeling_llama.py and the files built from it:
modeling_mistral.py, modeling_qwen2.py, modeling_qwen3.py, modeling_gemma2.py,
modeling_gemma3.py; loss_utils.py ForCausalLMLoss) and from the backward formulas of PyTorch
(attnmem/kernels/dev/autograd/derivatives.yaml: which inputs or outputs each op saves). Notation:
attnmem/calc/train_common.py.

Per layer (bf16 parameters; `_layer_terms` lists every tensor with its label; GPT-2's
LayerNorm, gelu_new and dropout masks: `_gpt2_layer_terms`):
- RMSNorm (Llama: `x.to(float32)`, `x.pow(2)`, `x * rsqrt(var + eps)`, `weight * x.to(bf16)`):
  pow saves the fp32 copy (4Th), mul saves rsqrt (4T), the last mul saves the bf16 normalized
  input (2Th). Gemma's `output * (1 + weight.float())` saves the fp32 normalized input instead
  (4Th) and the fp32 (1 + w) (4h).
- q/k/v and gate/up projections save their input, the norm's output (2Th, once per norm);
  o_proj saves the attention output (2Tq), down_proj the gated product (2TI).
- Rotary (apply_rotary_pos_emb: `q * cos + rotate_half(q) * sin`) saves only cos and sin
  (computed once per forward, shared by all layers); the rotated q and k (2Tq, 2Tk) are the
  attention's saved inputs. With qk-norm (Qwen3, Gemma 3) q_norm/k_norm save an fp32 copy of q
  and k, a rsqrt per head and their normalized input.
- SiLU/GELU-gated MLP (`down(act(gate(x)) * up(x))`): act saves gate(x), the product saves
  act(gate(x)) and up(x), down saves the product: 4 tensors of 2TI.
- Attention per implementation: eager (transformers' eager_attention_forward) saves the fp32
  softmax output (4N, softmax(dtype=float32)), the bf16 probabilities (2N, kept by P·V), and
  key/value repeated to H heads (repeat_kv) in place of the originals; Gemma 2 adds tanh of the
  soft-capped scores (2N). Fused kernels (SDPA flash/efficient/cuDNN, ours, FA4) save the output
  and an fp32 log-sum-exp per row (Dao et al. 2022, arXiv 2205.14135, sec. 3.1); SDPA's
  memory-efficient backend repeats k, v to H heads (no enable_gqa path). The backward's extra
  peak of one call is attnmem.calc.attention_peak_bytes (measured exact on an H200).
- Residual adds save nothing. Under checkpointing (torch.utils.checkpoint, use_reentrant=False
  as transformers 5 sets it in PreTrainedModel._activation_checkpointing_enable) a layer keeps
  only its input hidden state (2Th) and recomputes the rest in its backward (Chen et al. 2016,
  arXiv 1604.06174).

These are Korthikanti et al. 2022 (arXiv 2205.05198, sec. 4.1) counts redone for what these
modules really allocate: their 34·s·b·h + 5·a·s²·b per layer assumes a LayerNorm, a GELU MLP
of 4h and dropout masks; an RMSNorm that upcasts, a gated MLP of I, no dropout and an fp32
softmax give the terms above.

Model level: the embedding output is not saved (its backward needs the ids only); the final norm
as above; lm_head saves its input; the logits (2TV, bf16) are held by the model output; the loss
upcasts them (`logits.float()`, 4TV, loss_utils.ForCausalLMLoss) and cross_entropy =
log_softmax (saves its 4TV output) + nll_loss. Gemma 2's final soft-capping saves tanh (2TV).

amp_bf16 (fp32 parameters under torch.autocast(bfloat16)): the residual stream is fp32, so each
RMSNorm saves its fp32 input itself and its fp32 normalized output; every linear casts its input
to a bf16 copy of its own (autocast caches only leaf weights), so q, k, v save three copies
(Phi-3's fused qkv_proj one: `_input_casts`);
rotary runs on fp32 cos/sin and makes fp32 q, k that SDPA casts back; autocast caches one bf16
copy of every linear weight for the forward, which the matrix products keep until their backward
(torch/csrc/autograd/autocast_mode.cpp, cached_cast).
"""

from __future__ import annotations

from fractions import Fraction

from attnmem.calc.models import ModelConfig
from attnmem.calc.peak import attention_peak_terms, varlen_peak_breakdown
from attnmem.calc.train_common import _Dims, _is_gpt2
from attnmem.calc.train_gpt_oss import (
    _gpt_oss_attention_backward_extra,
    _gpt_oss_layer_terms,
    _gpt_oss_moe_backward_extra,
    _gpt_oss_norm_terms,
)
from attnmem.calc.train_moe import (
    _check_moe_model,
    _moe_backward_extra,
    _moe_block_grads,
    _moe_terms,
)
from attnmem.calc.units import ceil_bytes

#: The model types whose layers this model has read (dense decoders with RMSNorm).
_GEMMA = {"gemma", "gemma2", "gemma3", "gemma3_text"}


def _check_supported(model: ModelConfig) -> None:
    if model.num_experts > 1 and not model.is_mla and model.state_mixer is None:
        _check_moe_model(model)
        return
    if model.is_mla or model.state_mixer is not None or model.num_experts > 1:
        raise ValueError(
            f"training_step models dense decoders (Llama, Mistral, Qwen2/3, Gemma 2/3 and their "
            f"relatives); {model.name!r} has "
            + ("latent (MLA) attention" if model.is_mla else
               "non-attention mixer layers" if model.state_mixer is not None else
               f"{model.num_experts} experts per layer")
            + ", which it does not count yet")
    if (not model.gated_mlp or model.norm_bias or model.learned_positions) and not _is_gpt2(model):
        raise ValueError(
            f"training_step models RMSNorm decoders with a gated MLP and GPT-2; {model.name!r} "
            f"(model_type {model.model_type!r}) has LayerNorm, a non-gated MLP or learned "
            "positions in another layout (GPT-NeoX, Phi-2), not counted yet")


#: GPT2Config's dropout probabilities (attn_pdrop, resid_pdrop, embd_pdrop), 0.1 each in the
#: released configs: in training every dropout keeps a bool mask of its input's shape.
GPT2_DROPOUT = 0.1


def _gpt2_layer_terms(model: ModelConfig, dm: _Dims, impl: str, amp: bool,
                      ) -> list[tuple[str, str, int]]:
    """One GPT-2 block (modeling_gpt2.py GPT2Block, GPT2Attention, GPT2MLP):
    - ln_1, ln_2 (native_layer_norm) keep their input and an fp32 mean and rstd per row;
    - c_attn (Conv1D = addmm) keeps its input; q, k, v are views of its fused output: a fused
      kernel keeps the whole output through them; eager attention's matmuls copy them
      (matmul reshapes the (B, H, s, d) views into batches);
    - eager: softmax (in the input dtype, no upcast) keeps its output, attention dropout keeps
      a bool mask and the dropped probabilities (kept by P·V); c_proj keeps its contiguous
      input;
    - both residual dropouts keep a bool mask of T·h;
    - gelu_new (NewGELUActivation, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))) written in
      torch ops keeps x (pow), tanh's output, 0.5·x and 1 + tanh; c_proj keeps the result.
    amp_bf16: the residual stream and LayerNorms are fp32 (layer_norm is on autocast's fp32
    list) and each Conv1D keeps a bf16 cast of its input; softmax runs in fp32 (on the list:
    its fp32 output is kept, P is cast back); pow is on the list too, so gelu_new keeps an
    fp32 x, fp32 tanh and 1 + tanh, the bf16 0.5·x and c_proj's bf16 cast of the fp32 result.
    """
    t, h, i, n = dm.t, dm.h, dm.inter, dm.n
    x_e = 4 if amp else 2  # the residual stream
    cast = " (bf16 cast)" if amp else ""
    terms: list[tuple[str, str, int]] = [
        ("residuals", "ln_1: its input (the residual stream), kept by layer_norm", x_e * t * h),
        ("norms", "ln_1: mean and rstd (fp32)", 8 * t),
        ("projections", "ln_1 output, kept by c_attn" + cast, 2 * t * h)]
    if impl == "eager":
        terms += [("attention", "q, k, v copies made by the matmuls", 3 * 2 * t * h),
                  ("attention", "softmax output (N" + (", fp32)" if amp else ")"),
                   (4 if amp else 2) * n),
                  ("attention", "attention-dropout mask (bool N)", n),
                  ("attention", "dropped probabilities (N), kept by P·V", 2 * n),
                  ("projections", "c_proj input (attention output made contiguous)", 2 * t * h)]
    else:
        terms.append(("attention", "c_attn output (q|k|v), kept through the views", 6 * t * h))
        terms += _attention_core(impl, dm, model, amp)
        if impl in ("naive", "naive_inplace", "sdpa_math", "triton"):
            terms.append(("projections", "c_proj input (attention output made contiguous)",
                          2 * t * h))
    terms += [("residuals", "attention residual dropout mask (bool)", t * h),
              ("residuals", "ln_2: its input (the residual stream), kept by layer_norm",
               x_e * t * h),
              ("norms", "ln_2: mean and rstd (fp32)", 8 * t),
              ("projections", "ln_2 output, kept by c_fc" + cast, 2 * t * h)]
    if amp:
        terms += [("MLP", "c_fc output cast to fp32 by pow, kept", 4 * t * i),
                  ("MLP", "tanh output (fp32)", 4 * t * i),
                  ("MLP", "0.5·x (bf16), kept by the product", 2 * t * i),
                  ("MLP", "1 + tanh (fp32), kept by the product", 4 * t * i),
                  ("MLP", "gelu output cast to bf16 by c_proj", 2 * t * i)]
    else:
        terms += [("MLP", "c_fc output, kept by pow", 2 * t * i),
                  ("MLP", "tanh output, kept by tanh", 2 * t * i),
                  ("MLP", "0.5·x, kept by the product", 2 * t * i),
                  ("MLP", "1 + tanh, kept by the product", 2 * t * i),
                  ("MLP", "gelu output, c_proj input", 2 * t * i)]
    terms.append(("residuals", "MLP residual dropout mask (bool)", t * h))
    return terms


def _norm_terms(where: str, width: int, rows: int, fp32_stream: bool, gemma: bool,
                ) -> list[tuple[str, str, int]]:
    """What one RMSNorm over `rows` vectors of `width` saves (module docstring)."""
    part = "norms"
    out = []
    if fp32_stream:  # amp: x is fp32 already, .to(float32)/.float() is x itself: pow keeps it
        out.append(("residuals", f"{where}: its fp32 input, kept by pow", 4 * rows * width))
    else:
        out.append((part, f"{where}: fp32 copy of the input (pow)", 4 * rows * width))
    out.append((part, f"{where}: rsqrt of the mean square (fp32)", 4 * rows))
    if gemma:
        out.append((part, f"{where}: fp32 normalized input (× (1 + w))", 4 * rows * width))
        out.append((part, f"{where}: 1 + w (fp32)", 4 * width))
    else:
        e = 4 if fp32_stream else 2
        out.append((part, f"{where}: normalized input (weight ×)", e * rows * width))
    return out


def _attention_core(impl: str, dm: _Dims, model: ModelConfig, amp: bool,
                    ) -> list[tuple[str, str, int]]:
    """The attention call's saved tensors beyond its rotated q, k and v."""
    p = "attention"
    if impl == "eager":
        terms = []
        if model.model_type == "gemma2":  # attn_logit_softcapping: tanh keeps its output
            terms.append((p, "tanh of the soft-capped scores (bf16, N)", 2 * dm.n))
        terms += [(p, "softmax output (fp32, N), kept by softmax", 4 * dm.n),
                  (p, "probabilities P (bf16, N), kept by P·V", 2 * dm.n)]
        return terms
    if impl in ("naive", "naive_inplace"):
        return [(p, "softmax probabilities P (input dtype, N)", 2 * dm.n),
                (p, "causal mask (bool s×s)", dm.s * dm.s)]
    if impl == "sdpa_math":
        return [(p, "fp32 softmax probabilities (N) of the math backend", 4 * dm.n),
                (p, "fp32 copies of q, k, v", 4 * dm.t * (dm.q + 2 * dm.q))]
    lse_rows = dm.b * dm.heads * dm.s
    if impl == "sdpa_efficient":  # log-sum-exp rows padded to 32 (mem-eff kernel)
        lse_rows = dm.b * dm.heads * (-(-dm.s // 32) * 32)
    return [(p, "attention output (bf16), kept by the kernel and o_proj", 2 * dm.t * dm.q),
            (p, "log-sum-exp (fp32, one per row)", 4 * lse_rows)]


def _expands_kv(impl: str, dm: _Dims) -> bool:
    """Whether k and v are repeated to H heads before the call (and those copies saved)."""
    if dm.kv_heads == dm.heads:
        return False
    # transformers' eager attention always repeats (repeat_kv); SDPA gets enable_gqa=True when
    # there is no mask (sdpa_attention.use_gqa_in_sdpa), but the memory-efficient and math
    # backends of torch 2.11 expand k, v themselves; our kernel, FA2/cuDNN and FA4 take GQA.
    return impl in ("eager", "naive", "naive_inplace", "sdpa_efficient", "sdpa_math")


def _input_casts(model: ModelConfig) -> tuple[int, int]:
    """How many linear modules read the attention's and the MLP's norm output: under autocast
    each makes (and saves) a bf16 cast of its own. q_proj, k_proj, v_proj and gate_proj,
    up_proj in the Llama family (3, 2); Phi-3 fuses them into qkv_proj and gate_up_proj
    (transformers modeling_phi3.py, Phi3Attention and Phi3MLP): (1, 1). Measured on the H200:
    Phi-3 mini (2 layers) under amp at 8,192 tokens peaked 301 MB below the (3, 2) count, three
    bf16 (s, h) tensors per layer (data/training_steps_h200.csv)."""
    return (1, 1) if model.model_type == "phi3" else (3, 2)


def _layer_terms(model: ModelConfig, dm: _Dims, impl: str, amp: bool, cache: bool,
                 masked: bool = False, norm_topk: bool = False) -> list[tuple[str, str, int]]:
    """Every tensor one decoder layer keeps for its backward (no checkpointing). masked: an
    SDPA layer whose sliding window is shorter than s, so transformers passes a mask (module
    _sliding_masked, attnmem/calc/train_packed.py)."""
    if _is_gpt2(model):
        return _gpt2_layer_terms(model, dm, impl, amp)
    if model.model_type == "gpt_oss":
        return _gpt_oss_layer_terms(model, dm)
    gemma = model.model_type in _GEMMA
    t, h = dm.t, dm.h
    terms = _norm_terms("input norm", h, t, amp, gemma)
    qkv_casts, mlp_casts = _input_casts(model)
    if amp:
        terms.append(("projections", f"q, k, v inputs: {qkv_casts} bf16 cast(s) of the norm output",
                      qkv_casts * 2 * t * h))
    else:
        terms.append(("projections", "q, k, v input (the norm output)", 2 * t * h))
    if model.qk_norm:
        for name, width in (("q", dm.q), ("k", dm.k)):
            terms += _norm_terms(f"{name}_norm", dm.d, t * width // dm.d, False, gemma)
    qk_e = 4 if amp else 2  # amp: q·cos with fp32 cos makes fp32 q, k
    expand = _expands_kv(impl, dm) or (masked and dm.kv_heads != dm.heads)
    if amp:  # SDPA / matmul under autocast cast the fp32 rotated q, k to bf16 copies
        terms.append(("attention", "q (bf16 cast of the rotated fp32 q)", 2 * t * dm.q))
        terms.append(("attention", "k (bf16 cast)" + (" repeated to H heads" if expand else ""),
                      2 * t * (dm.q if expand else dm.k)))
    else:
        terms.append(("rotary", "q after rotary (saved by attention)", 2 * t * dm.q))
        terms.append(("rotary", "k after rotary" + (" repeated to H heads" if expand else ""),
                      2 * t * (dm.q if expand else dm.k)))
    terms.append(("attention", "v" + (" repeated to H heads" if expand else ""),
                  2 * t * (dm.q if expand else dm.k)))
    if model.model_type == "phi3" and not expand and impl != "eager":
        # Phi-3's fused qkv_proj: v is a slice (a view) of its output, so a kernel that keeps
        # v keeps the whole q|k|v storage (modeling_phi3.py Phi3Attention); eager's P·V
        # matmul copies v instead. (Phi-3 is approximate: NOTES.md.)
        terms.append(("projections", "rest of the fused qkv_proj output, kept through v's view",
                      2 * t * (dm.q + dm.k)))
    if cache:  # use_cache: the DynamicCache keeps the rotated k and v of every layer
        if expand or amp:
            terms.append(("attention", "k in the KV cache (use_cache)", qk_e * t * dm.k))
        if expand:
            terms.append(("attention", "v in the KV cache (use_cache)", 2 * t * dm.k))
    terms += _attention_core(impl, dm, model, amp)
    if masked:  # SDPA turns the bool mask into an additive bias of the query dtype and keeps it
        cols = -(-dm.s // 16) * 16 if impl == "sdpa_efficient" else dm.s  # mem-eff pads to 16
        what = "packed-sequence" if dm.lengths else "sliding-window"
        terms.append(("attention", f"{what} mask as an additive bias (B×1×s×s, bf16), "
                      "kept by the kernel", 2 * dm.b * dm.s * cols))
    if impl in ("eager", "naive", "naive_inplace", "sdpa_math", "triton"):
        # eager's P·V output is (B, H, s, d); so is our kernel's (new_empty): transpose(1, 2)
        # .contiguous() copies it. SDPA's fused kernels write (B, s, H, d) already.
        terms.append(("projections", "o_proj input (attention output made contiguous)",
                      2 * t * dm.q))
    norms = ("post-attention norm", "post-MLP norm") if gemma and model.norms_per_layer >= 4 \
        else ()
    for where in norms[:1]:  # Gemma 2/3 norm the attention output before the residual add
        terms += _norm_terms(where, h, t, False, gemma)
    mlp_norm = "pre-MLP norm" if norms else "post-attention norm"
    terms += _norm_terms(mlp_norm, h, t, amp, gemma)
    if amp:
        terms.append(("projections", f"gate, up inputs: {mlp_casts} bf16 cast(s) of the norm output",
                      mlp_casts * 2 * t * h))
    else:
        terms.append(("projections", "gate, up input (the norm output)", 2 * t * h))
    i = dm.inter
    if model.num_experts > 1:
        return terms + _moe_terms(model, dm, norm_topk)
    terms += [("MLP", "gate(x), kept by the activation", 2 * t * i),
              ("MLP", "act(gate(x)), kept by the product", 2 * t * i),
              ("MLP", "up(x), kept by the product", 2 * t * i),
              ("MLP", "act(gate(x))·up(x), down_proj input", 2 * t * i)]
    for where in norms[1:]:
        terms += _norm_terms(where, h, t, False, gemma)
    return terms


def _model_terms(model: ModelConfig, dm: _Dims, amp: bool, impl: str,
                 ) -> list[tuple[str, str, int]]:
    """Tensors alive at the end of the forward outside the layers (module docstring)."""
    gemma = model.model_type in _GEMMA
    t, v = dm.t, dm.vocab
    terms = [("embeddings", "embedding output: not kept (its backward needs the ids only; "
              "Gemma's × sqrt(h) keeps a 0-d scale)", 0)]
    if model.model_type == "gpt_oss":
        terms += _gpt_oss_norm_terms("final norm", t, dm.h)
    elif _is_gpt2(model):
        terms += [("embeddings", "embedding dropout mask (bool)", t * dm.h),
                  ("norms", "final norm (ln_f): its input, kept by layer_norm",
                   (4 if amp else 2) * t * dm.h),
                  ("norms", "final norm (ln_f): mean and rstd (fp32)", 8 * t)]
    else:
        terms += _norm_terms("final norm", dm.h, t, amp, gemma)
    terms.append(("logits and loss", "lm_head input" + (" (bf16 cast)" if amp else ""),
                  2 * t * dm.h))
    cs = 4 if amp else 2  # cos, sin of shape (1, s, d) in the hidden states' dtype
    if model.model_type == "gpt_oss":  # GptOssRotaryEmbedding: emb = freqs, (1, s, d/2)
        terms.append(("rotary", "cos and sin of d/2 columns (shared by all layers)",
                      2 * cs * dm.s * (dm.d // 2)))
    elif not _is_gpt2(model):  # GPT-2: learned positions, no rotary
        terms.append(("rotary", "cos and sin (shared by all layers)", 2 * cs * dm.s * dm.d))
    if model.model_type == "gemma2":  # final_logit_softcapping: tanh keeps its output
        terms.append(("logits and loss", "tanh of the soft-capped logits (bf16)", 2 * t * v))
    terms.append(("logits and loss", "log-softmax output (fp32), kept by cross_entropy",
                  4 * t * v))
    terms.append(("logits and loss", "shifted labels (int64) and the loss", _labels_bytes(dm)))
    return terms


def _labels_bytes(dm: _Dims) -> int:
    """What the loss keeps of the labels, and the loss: loss_utils.ForCausalLMLoss pads the
    labels to (B, s + 1) and takes `labels[..., 1:].contiguous()`, a copy of B·s int64 for
    B > 1 but for B = 1 a view that keeps the padded (s + 1) tensor; nll_loss's fp32 loss and
    total weight (8 bytes)."""
    return 8 * dm.b * (dm.s + (dm.b == 1)) + 8


def _core_saved(layer: list[tuple[str, str, int]]) -> int:
    """Bytes of a layer's terms saved after its attention call (MLP side), which do not exist
    yet while the call runs."""
    after = False
    total = 0
    for _part, label, x in layer:
        if label.startswith(("post-attention norm", "pre-MLP norm", "gate, up",
                             "attention residual dropout", "ln_2")):
            after = True
        if after or label.startswith(("o_proj input",)):
            total += x
    return total


def _attention_forward_extra(impl: str, dm: _Dims) -> int:
    """Transient bytes of one attention call's forward beyond what it saves, at its largest
    moment (eager: P (2N) not made yet, masked scores (2N) and their fp32 copy (4N) alive)."""
    if impl == "eager":
        return -2 * dm.n + 2 * dm.n + 4 * dm.n
    if impl in ("naive", "naive_inplace"):
        return 2 * dm.n + dm.s * dm.s
    if impl == "sdpa_math":
        return 5 * dm.n
    return 0


def _layer_backward_extra(layer: list[tuple[str, str, int]], impl: str, dm: _Dims,
                          model: ModelConfig, g_per_param: Fraction, tp: int,
                          g_expert: Fraction | None = None) -> int:
    """Largest excess over (the layer's saved tensors + the incoming gradient) during its
    backward: the MLP's product backward or the attention call's backward. g_expert: gradient
    bytes per routed-expert parameter (default g_per_param; differs under expert
    parallelism)."""
    g_x = g_per_param if g_expert is None else g_expert
    t, h, i = dm.t, dm.h, dm.inter
    g_mat = ceil_bytes(g_per_param * h * model.intermediate_size / tp)
    # MLP: d(prod), d(act), d(up) alive, prod freed, down's weight gradient made.
    mlp = 3 * 2 * t * i - 2 * t * i + g_mat
    g_mlp = 3 * g_mat
    if model.num_experts > 1:  # the MoE block instead (tp = 1)
        moe_extra = (_gpt_oss_moe_backward_extra if model.model_type == "gpt_oss"
                     else _moe_backward_extra)
        mlp = moe_extra(model, dm, g_x, g_per_param)
        g_mlp = sum(_moe_block_grads(model, g_x, g_per_param))
    # Attention: the MLP side is freed and its gradients (3 matrices + o_proj) exist; the
    # gradient of the attention output (2Tq) reaches the call.
    freed = _core_saved(layer)
    g_attn_side = g_mlp + ceil_bytes(g_per_param * h * model.num_heads * model.head_dim / tp)
    core = _gpt_oss_attention_backward_extra(dm) if model.model_type == "gpt_oss" else \
        _attention_backward_extra(impl, dm)
    attn = -freed + g_attn_side + core
    return max(mlp, attn)


def _attention_backward_extra(impl: str, dm: _Dims) -> int:
    """The attention call's backward beyond the tensors it saved (its peak, attnmem.calc.peak, less
    the output and log-sum-exp already counted as saved). Eager, at softmax's backward: the
    fp32 output (saved), the fp32 gradient of P, CUDA's `tmp = grad * output` (fp32,
    aten/src/ATen/native/cuda/SoftMax.cu softmax_backward_cuda_out) and the fp32 result; P
    freed; dV made (H heads of repeated values)."""
    if impl == "eager":
        return -2 * dm.n + 3 * 4 * dm.n + 2 * dm.t * dm.q
    terms = _peak_terms(impl, dm)
    saved = ("output (saved", "log-sum-exp", "k, v expanded", "probabilities P kept")
    return sum(x for label, x in terms if not label.startswith(saved))


def _peak_terms(impl: str, dm: _Dims) -> list[tuple[str, int]]:
    if dm.lengths and impl == "triton":  # the packed call (attnmem.calc.peak.varlen_peak_bytes)
        return [(t.label, t.counted_bytes) for t in varlen_peak_breakdown(
            dm.heads, list(dm.lengths), dm.d, "bf16", backward=True, kv_heads=dm.kv_heads,
            window=dm.window)]
    return attention_peak_terms(impl, dm.b, dm.heads, dm.s, dm.d, "bf16", causal=True,
                                backward=True, kv_heads=dm.kv_heads)
