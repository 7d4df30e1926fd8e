"""Memory of inference as transformers' `generate()` runs it: the prompt's prefill, then decode.

What is predicted is what the inference measurement records (`python -m attnmem.measure
--infer`, attnmem/measure/infer/procedure.py): a `transformers` *ForCausalLM built from a config
in bf16, one warm-up generate(), then `generate(input_ids, attention_mask, max_new_tokens=N,
min_new_tokens=N, do_sample=False)` with `max_memory_allocated()` over it. Peaks are absolute:
weights, cuBLAS's workspace, the inputs, the KV cache and the transients of the moment.

Method (the one attnmem.calc.training_step uses): the tensors alive at each named moment, counted from
what transformers 5's modules allocate (modeling_llama.py and the files built from it,
modeling_gemma3.py, modeling_qwen3_moe.py, modeling_deepseek_v2.py; cache_utils.py;
masking_utils.py; integrations/sdpa_attention.py, integrations/moe.py; generation/utils.py).
No-grad code frees a tensor when its last Python reference goes, so a moment holds the
inputs and outputs of the op that runs plus the locals of every frame still open. Notation: T
tokens of the forward (B·c; c = the prompt, or one chunk of it), h hidden size, q = H·d, I the
MLP width, V the vocabulary, e the activation's bytes (2 in bf16).

Alive through a whole forward (`LlamaModel.forward` and its relatives):
- `inputs_embeds` (T·h·e): the model keeps this local while its loop rebinds `hidden_states`;
  the current layer's input (another T·h·e from layer 1 on: the caller's frame holds it while
  the layer runs);
- rotary cos and sin (B, c, d) in e (Gemma 3: a global and a local pair; DeepSeek: complex64
  freqs_cis, (B, c, rope/2) × 8 bytes), position ids, the attention mask of generate (int64);
- eager attention's additive masks (B × 1 × c × keys, in e; one per layer type in use);
  SDPA's boolean mask (1 byte per element) where transformers cannot leave it to is_causal
  (masking_utils._ignore_causal_mask_sdpa: a sliding window shorter than the keys, a chunk
  after the first, a static cache's decode);
- the KV cache (attnmem.calc.kv's bytes per token and layer, in kv_dtype).

Inside a layer (the largest moment of each part, with everything above):
- RMSNorm (`x.to(float32)`, `pow(2)`, `x * rsqrt`, `weight * x.to(e)`): its input, the fp32
  copy and the fp32 product: + 8·T·h bytes beyond the input (Gemma's `(1 + w)` form the same);
- attention side: the norm output (T·h·e), q after rotary (T·q·e), the cache after its update
  (DynamicLayer.update: `torch.cat` makes a new tensor even for the first chunk, so the
  rotated k, v die at the rebinding); the call's own transient: fused kernels from
  attnmem.calc.peak.attention_peak_bytes (forward, causal) where queries and keys align, else their
  output and log-sum-exp; GQA repeated to H heads (repeat_kv) when SDPA gets a mask or the
  backend has no enable_gqa path; eager: the scores (e), softmax(dtype=float32)'s fp32 copy of
  its input and its fp32 output (CUDA's half-to-float path is taken for fp16 only), with k, v
  repeated to H heads;
- the cache update itself: q, the rotated k and v, the new cache tensors and the old ones
  still referenced (a chunk after the first);
- gated MLP `down(act(gate(x)) * up(x))`: act(gate(x)), up(x) and their product, 3·T·I·e
  (Phi-3's fused gate_up: the 2·T·I output stays while act and the product are made, 4·T·I·e);
  the residual (T·h·e) and the norm output;
- eager only, from the attention to the layer's end (residual add, post-attention norm, the
  MLP or MoE, prefill and decode): the attention weights, B·H·c·keys·e.
  eager_attention_forward returns them (softmax(dtype=float32) `.to(query.dtype)`, dropout
  p = 0 returns its input) and the decoder layer keeps them in a local until it returns
  (modeling_llama.py LlamaDecoderLayer.forward: `hidden_states, _ = self.self_attn(...)`; the
  files built from it and modeling_deepseek_v2.py likewise, modeling_phi3.py as
  `self_attn_weights`). SDPA, ours and FA4 return None. (Training counts them already: they
  are the P that P·V saves, attnmem.calc.train_dense.)
- MoE as transformers 5 runs it on a GPU (integrations/moe.py grouped_mm_experts_forward, the
  prefill's default): S = T·k token-expert pairs; the sorted hidden states (S·h), then the
  larger of two moments: inside the gate, the gate_up projection (S·2I) with act(gate) and
  the product (S·I each); after the down projection, its masked copy, its weighted copy and
  its un-permuted copy (3·S·h more) with the int64 sort, permutation and inverse (4·S·8). The
  gate's moment is the larger where 4·I > 3·h (Mixtral; measured on the H200, 2026-12-02,
  after the down projection's alone had left Mixtral's prefill 1.5-17% under); the router's
  logits (T·E·e; DeepSeek's fp32), which the block keeps in `_` through the experts
  (modeling_mixtral.py MixtralSparseMoeBlock.forward: `_, top_k_weights, top_k_index =
  self.gate(hidden_states)`; Qwen2/3-MoE and DeepSeek alike), its fp32 softmax dying in the
  gate. Decode switches to batched_mm (generation/utils.py
  _optimize_model_for_decode), which gathers each pair's expert matrices: S·3·I·h·e. Shared
  experts run as a dense MLP of their width: after the routed ones in DeepSeek, before them in
  Qwen2-MoE (whose output then waits through the routed experts). Qwen2-MoE also builds a
  sliding-window mask that no layer reads (no has_sliding_layers guard; window 0), counted.
- MLA (DeepSeek-V2/V3, modeling_deepseek_v2.py): the cache holds the normalized latent and
  the rotary key (attnmem.calc.kv); each forward expands them with kv_b_proj into per-head keys and
  values (T'·H·(nope + v)·e) and a new key tensor (T'·H·(nope + rope)·e), T' = B·keys; the query
  is concatenated into a new (T·H·(nope + rope)) tensor beside the projection and the rotated
  part.
- Final norm, then lm_head on the last position only (generate passes logits_to_keep=1) and
  generate's fp32 copy of those logits.

Decode step t (1 ≤ t < N): the cache at s + t tokens in every layer but the one updating, which
holds its old and new tensors at once (`torch.cat`); sliding-window layers keep their window
(DynamicSlidingWindowLayer keeps the last W − 1 tokens as a view of the concatenation, so
during the prefill they hold the whole prompt, and the first decode step frees it). A static
cache (StaticCache, `cache_implementation="static"`) is allocated whole, zeros of
prompt + N tokens (a sliding layer: min(W, prompt + N)), at each layer's first update, and
written in place; its decode passes a mask, so SDPA repeats k, v for GQA.

Chunked prefill (`prefill_chunk_size=C`, generation/utils.py _prefill): the prompt is fed C
tokens at a time through the same cache; the activations scale with C, the cache with the
tokens so far, and every chunk after the first attends with a mask (C × keys).

What is not modelled is refused with the reason: hybrids (Mamba/linear-attention layers), the
non-gated LayerNorm families (GPT-2, GPT-NeoX, Phi-2), Gemma 2's soft-capping under fused
kernels, sdpa_math and the bench's naive implementations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnmem.calc.backends import NoKernel, inference_refusal, no_fit_without_kernel
from attnmem.calc.fit import largest_fitting
from attnmem.calc.kv import kv_elements_per_token
from attnmem.calc.models import ModelConfig, check_model
from attnmem.calc.peak import IMPL_LABELS, attention_peak_bytes
from attnmem.calc.units import (
    MAX_BATCH,
    MAX_SEQ_LEN,
    ceil_bytes,
    check_int,
    dtype_bytes,
    dtype_name,
)
from attnmem.calc.weights import weight_bytes

#: Attention implementations generate() runs here: transformers' eager attention, SDPA with one
#: backend forced, ours through AttentionInterface, FlashAttention-4.
#: "sdpa" is attn_implementation="sdpa" with torch choosing the backend per call: the flash
#: backend when there is no mask and q, k, v share one head dim, else the memory-efficient one
#: (torch/nn/attention: flash comes first in the priority order and refuses masks).
INFER_ATTENTIONS: tuple[str, ...] = ("sdpa", "eager", "sdpa_flash", "sdpa_efficient",
                                     "sdpa_cudnn", "triton", "fa4")
INFER_ATTENTION_LABELS: dict[str, str] = {
    "sdpa": "SDPA (torch's choice)", "eager": "transformers eager",
    **{k: IMPL_LABELS.get(k, k) for k in INFER_ATTENTIONS[2:]}, "fa4": "FlashAttention-4"}
CACHES: tuple[str, ...] = ("dynamic", "static")
#: The cuBLAS workspace of the one (handle, stream) generate() uses: 32 MiB on Hopper
#: (aten/src/ATen/cuda/CublasHandlePool.cpp getChosenWorkspaceSize), made by the first matmul.
CUBLAS_WORKSPACE_BYTES = 32 * 2**20
#: Model types whose modules this model has read (RMSNorm decoders, their MoE and MLA kin).
INFER_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
    "gemma2", "gemma3", "gemma3_text", "phi3", "deepseek_v2", "deepseek_v3", ""})
PARTS: tuple[str, ...] = ("KV cache", "hidden states", "norm", "attention", "MLP", "MoE",
                          "masks and rotary", "logits", "inputs")
PHASES: tuple[str, ...] = (
    "prefill: attention of the last layer",
    "prefill: cache update of the last layer",
    "prefill: MLP of the last layer",
    "prefill: final norm",
    "decode: cache update of the last layer",
    "decode: attention of the last layer",
    "decode: logits of the step",
)
_GEMMA = {"gemma", "gemma2", "gemma3", "gemma3_text"}
#: MoE routers whose top-k weights stay fp32 (modeling_deepseek_v2.py / _v3.py: the gate's
#: softmax or sigmoid is fp32 and its weights are not cast back), so the experts' weighted
#: outputs are promoted to fp32; Qwen-MoE and Mixtral cast them to the hidden dtype.
_FP32_ROUTING = {"deepseek_v2", "deepseek_v3"}
#: MoE blocks that run the shared expert before the routed ones (modeling_qwen2_moe.py
#: Qwen2MoeSparseMoeBlock.forward); DeepSeek's run it after (DeepseekV2Moe.forward).
_SHARED_FIRST = {"qwen2_moe"}
#: Backends that take k, v with H_kv heads (no repeat): flash, cuDNN, ours, FA4 (enable_gqa or
#: native GQA). torch's memory-efficient backend expands them itself (attnmem.calc.attention_steps._efficient).
_NATIVE_GQA = ("sdpa_flash", "sdpa_cudnn", "triton", "fa4")


@dataclass(frozen=True)
class InferenceMemory:
    """Bytes of one generate() call (module docstring for every term)."""

    weights_bytes: int
    kv_cache_bytes: int  # the cache at its largest (prompt + N − 1 tokens; static: its size)
    kv_by_kind: dict[str, int]  # full, sliding, MLA latent -> bytes at the end of generate
    fixed_bytes: int  # cuBLAS workspace and generate's int64 inputs
    prefill_peak_bytes: int
    decode_peak_bytes: int  # 0 when N = 1 (no decode step)
    peak_bytes: int
    peak_phase: str
    phases: dict[str, int] = field(default_factory=dict)
    peak_terms: tuple[tuple[str, str, int], ...] = ()  # (part, tensor, bytes) at the peak
    parts: dict[str, int] = field(default_factory=dict)  # peak_terms summed by part
    attention: str = ""
    cache: str = "dynamic"
    prefill_chunk: int | None = None

    @property
    def transient_bytes(self) -> int:
        """What the peak holds beyond weights, fixed buffers and the cache."""
        return self.peak_bytes - self.weights_bytes - self.fixed_bytes - self.parts.get(
            "KV cache", 0)


@dataclass(frozen=True)
class _StepDims:
    """The model's sizes one generate() step reads, not one attention call's shape
    (attnmem.calc.attention_call.AttentionCall): batch, hidden size, query and key/value heads, head dim, and
    the bytes per element of the activations and of the cache."""

    b: int
    h: int
    heads: int
    kv_heads: int
    d: int
    e: int  # activation bytes
    kv_e: object  # cache bytes per element (Fraction)


def _check(model: ModelConfig, attention: object, cache: object) -> None:
    if attention not in INFER_ATTENTIONS:
        raise ValueError(f"unknown attention {attention!r:.40} for inference; accepted: "
                         f"{', '.join(INFER_ATTENTIONS)} (sdpa_math and the bench's naive "
                         "implementations are not modelled for generate())")
    if cache not in CACHES:
        raise ValueError(f"unknown cache {cache!r:.40}; accepted: {', '.join(CACHES)}")
    if model.state_mixer is not None:
        raise ValueError(f"inference_step does not model hybrids yet: {model.name!r} has "
                         f"{model.state_layers} state-space / linear-attention layers")
    if model.model_type not in INFER_MODEL_TYPES or (
            not model.gated_mlp or model.norm_bias or model.learned_positions):
        raise ValueError(
            f"inference_step models RMSNorm decoders with a gated MLP (Llama, Mistral, "
            f"Mixtral, Qwen2/3 and their MoE, Gemma 1-3, Phi-3, DeepSeek-V2/V3); "
            f"{model.name!r} (model_type {model.model_type!r}) is not counted yet")
    if model.model_type == "gemma2" and attention != "eager":
        raise ValueError("Gemma 2 soft-caps its attention logits, which only transformers' "
                         f"eager attention computes; {attention!r} cannot run it")


def _act_dtype(weight_dtype: str) -> str:
    """transformers computes in the parameters' dtype; quantized weights run in bf16."""
    return weight_dtype if weight_dtype in ("fp32", "fp16", "bf16") else "bf16"


def _kv_per_token_layer(model: ModelConfig, kv_e: object) -> object:
    return kv_elements_per_token(model) * kv_e


def _layers(model: ModelConfig) -> tuple[int, int]:
    """(full, sliding) attention layers."""
    sliding = min(model.sliding_window_layers, model.kv_layers) if model.sliding_window else 0
    return model.kv_layers - sliding, sliding


def inference_step(
    model: ModelConfig,
    batch: int,
    prompt_len: int,
    new_tokens: int = 1,
    *,
    attention: str = "sdpa_flash",
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    cache: str = "dynamic",
    prefill_chunk: int | None = None,
    act_dtype: str | None = None,
) -> InferenceMemory:
    """Peak memory of `generate()` over a prompt of prompt_len tokens, batch sequences, making
    new_tokens tokens (module docstring: every moment, term and source).

    attention: INFER_ATTENTIONS; weight_dtype / kv_dtype: dtype names (attnmem.calc.units); cache:
    "dynamic" (DynamicCache) or "static" (StaticCache); prefill_chunk: feed the prompt C
    tokens at a time (None: all at once); act_dtype: the activations' dtype (None: the
    weights', bf16 for quantized weights, as transformers runs them). Raises ValueError naming
    a bad value.
    """
    check_model(model)
    b = check_int("batch", batch, 1, MAX_BATCH)
    s = check_int("prompt_len", prompt_len, 1, MAX_SEQ_LEN)
    n = check_int("new_tokens", new_tokens, 1, MAX_SEQ_LEN)
    _check(model, attention, cache)
    if act_dtype is not None and not (isinstance(act_dtype, str) and act_dtype):
        raise ValueError(f"act_dtype must be None or a dtype name such as 'bf16', got "
                         f"{act_dtype!r:.60}")
    checkpoint = weight_dtype == "checkpoint"  # as the checkpoint stores them (attnmem.calc.quant)
    for name, value in (("weight_dtype", "bf16" if checkpoint else weight_dtype),
                        ("kv_dtype", kv_dtype), ("act_dtype", act_dtype or "bf16")):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a dtype name such as 'bf16', got {value!r:.60}")
        try:
            dtype_name(value)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
    if prefill_chunk is not None:
        prefill_chunk = check_int("prefill_chunk", prefill_chunk, 1, MAX_SEQ_LEN)
    why = inference_refusal(model, attention, s, n, cache == "static", prefill_chunk)
    if why:
        raise NoKernel(f"{attention!r} cannot run this generate(): {why}")
    act = dtype_name(act_dtype) if act_dtype else _act_dtype(
        "int4" if checkpoint else dtype_name(weight_dtype))
    if act not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"act_dtype must be one of fp32, fp16, bf16 (what transformers "
                         f"computes in), got {act_dtype!r}")
    sh = _StepDims(b, model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim,
                int(dtype_bytes(act)), dtype_bytes(dtype_name(kv_dtype)))
    weights = weight_bytes(model, weight_dtype)
    static = cache == "static"
    total = s + n - 1  # a static cache's slots: the last new token is never fed back
    fixed = CUBLAS_WORKSPACE_BYTES

    phases: dict[str, list[tuple[str, str, int]]] = {}
    chunk = min(prefill_chunk or s, s)
    # The chunks that can peak: the last one (most keys) and the last full-size one before it.
    last = s - chunk * ((s - 1) // chunk)
    candidates = {(s - last, last)}
    if last != chunk and s > chunk:
        candidates.add((s - last - chunk, chunk))
    best: dict[str, tuple[int, list]] = {}
    for past, c in sorted(candidates):
        for name, terms in _prefill_moments(model, sh, attention, past, c, total, static):
            tot = sum(x for _, _, x in terms)
            if name not in best or tot > best[name][0]:
                best[name] = (tot, terms)
    for name, (_, terms) in best.items():
        phases[name] = terms
    if n > 1:
        for name, terms in _decode_moments(model, sh, attention, s, n, total, static):
            phases[name] = terms
    base = [("weights", "weights", weights), ("inputs", "cuBLAS workspace", fixed)]
    sums = {k: weights + fixed + sum(x for _, _, x in v) for k, v in phases.items()}
    peak_phase = max(sums, key=sums.__getitem__)
    prefill_peak = max(v for k, v in sums.items() if k.startswith("prefill"))
    decode_peak = max((v for k, v in sums.items() if k.startswith("decode")), default=0)
    terms = tuple(base + phases[peak_phase])
    parts: dict[str, int] = {}
    for p, _, x in terms:
        parts[p] = parts.get(p, 0) + x
    kv_end = _cache_state(model, sh, s + n - 1, total, static, decoding=n > 1)
    return InferenceMemory(
        weights_bytes=weights, kv_cache_bytes=sum(kv_end.values()), kv_by_kind=kv_end,
        fixed_bytes=fixed, prefill_peak_bytes=prefill_peak, decode_peak_bytes=decode_peak,
        peak_bytes=sums[peak_phase], peak_phase=peak_phase, phases=sums, peak_terms=terms,
        parts=parts, attention=attention, cache=cache, prefill_chunk=prefill_chunk)


def _cache_state(model: ModelConfig, sh: _StepDims, tokens: int, total: int, static: bool,
                 decoding: bool) -> dict[str, int]:
    """Cache bytes by kind holding `tokens` tokens per sequence: full layers hold them all,
    sliding ones their window once a decode step has trimmed them (static: the window)."""
    full, sliding = _layers(model)
    per = _kv_per_token_layer(model, sh.kv_e) * sh.b
    kind = "MLA latent" if model.is_mla else "full attention"
    out = {kind: ceil_bytes(full * (total if static else tokens) * per)}
    if sliding:
        w = model.sliding_window
        held = min(w, total) if static else (min(w, tokens) if decoding else tokens)
        out["sliding window"] = ceil_bytes(sliding * held * per)
    return out


def _mask_layers(model: ModelConfig, attention: str, c: int, keys: int, static: bool,
                 ) -> tuple[int, int]:
    """(full, sliding) layers that get a materialized mask in a forward of c queries against
    `keys` keys (masking_utils._ignore_causal_mask_sdpa; eager always gets one)."""
    full, sliding = _layers(model)
    if attention == "eager":
        return full, sliding
    if attention in ("triton", "fa4"):
        return 0, 0  # no mask tensor: causal and the window are kernel arguments
    aligned = c == keys  # the first forward over a prompt (a static cache's is sliced to it)
    full_masked = full if not aligned and c > 1 else 0
    w = model.sliding_window or 0
    # masking_utils._ignore_causal_mask_sdpa: a window not longer than the keys needs a mask
    slide_masked = sliding if sliding and (keys >= w or not aligned) and c > 1 else 0
    return full_masked, slide_masked


def _rope_terms(model: ModelConfig, sh: _StepDims, c: int) -> int:
    if model.is_mla:
        return sh.b * c * (model.qk_rope_head_dim // 2) * 8  # complex64 freqs_cis
    pairs = 2 if model.model_type in ("gemma3", "gemma3_text") else 1  # global + local
    return pairs * 2 * sh.b * c * sh.d * sh.e


def _forward_base(model: ModelConfig, sh: _StepDims, attention: str, c: int, keys: int,
                  static: bool, sliding_keys: int | None = None) -> list[tuple[str, str, int]]:
    """What one forward of c tokens per sequence holds throughout (module docstring);
    sliding_keys: the keys a sliding layer attends to when they differ (a static cache)."""
    t = sh.b * c
    terms = [("inputs", "input ids, attention mask, position ids (int64)",
              8 * (2 * sh.b * keys + sh.b * c + c)),
             ("masks and rotary", "rotary cos/sin", _rope_terms(model, sh, c))]
    full_m, slide_m = _mask_layers(model, attention, c, keys, static)
    per = sh.e if attention == "eager" else 1  # eager: additive mask; SDPA: bool
    what = "additive" if attention == "eager" else "boolean"
    for kind, on, k in (("full", full_m, keys), ("sliding", slide_m, sliding_keys or keys)):
        if on:
            terms.append(("masks and rotary", f"{what} {kind}-attention mask B×1×{c}×{k}",
                          per * sh.b * c * k))
    if (model.model_type == "qwen2_moe" and not _layers(model)[1] and c > 1 and not static
            and attention not in ("triton", "fa4")):
        # modeling_qwen2_moe.py builds the sliding-window mask for every forward, with no
        # has_sliding_layers guard (Qwen2's own model has one), and its config sets the window
        # to 0 without use_sliding_window: never skippable, so it is materialized and held in
        # the mask mapping though no layer reads it. A static cache's generate() passes the
        # masks it built from the layer types instead (none sliding).
        terms.append(("masks and rotary", f"{what} sliding-attention mask B×1×{c}×{keys} "
                      "(built though no layer slides)", per * sh.b * c * keys))
    terms.append(("hidden states", "inputs_embeds (kept by the model's forward)", t * sh.h * sh.e))
    return terms


def _layer_cache(model: ModelConfig, sh: _StepDims, tokens: int) -> int:
    return ceil_bytes(_kv_per_token_layer(model, sh.kv_e) * sh.b * tokens)


def _prefill_cache(model: ModelConfig, sh: _StepDims, past: int, c: int, total: int,
                   static: bool) -> int:
    """The cache of every layer after the current one's update (the largest layer last):
    dynamic full layers hold past + c; sliding ones hold the concatenation of their kept
    window and the chunk; static layers hold their whole allocation."""
    full, sliding = _layers(model)
    if static:
        w = model.sliding_window or total
        return full * _layer_cache(model, sh, total) + sliding * _layer_cache(model, sh, min(w, total))
    w = model.sliding_window or 0
    kept = past if not sliding else min(past, max(w - 1, 0))
    return (full * _layer_cache(model, sh, past + c)
            + sliding * _layer_cache(model, sh, kept + c))


def _backend(model: ModelConfig, attention: str, masked: bool) -> str:
    """The implementation that runs: "sdpa" resolved as torch resolves it (INFER_ATTENTIONS)."""
    if attention != "sdpa":
        return attention
    return "sdpa_efficient" if masked or model.is_mla else "sdpa_flash"


def _attention_call(model: ModelConfig, sh: _StepDims, attention: str, c: int, keys: int,
                    masked: bool) -> list[tuple[str, str, int]]:
    """The attention call of one layer: its inputs' extra copies and its own transient."""
    attention = _backend(model, attention, masked)
    b, heads, e = sh.b, sh.heads, sh.e
    gqa = sh.kv_heads != heads
    if model.is_mla:
        d_qk = model.qk_rope_head_dim + (model.head_dim - model.qk_rope_head_dim)
        d_v = model.v_head_dim
    else:
        d_qk = d_v = sh.d
    terms: list[tuple[str, str, int]] = []
    repeat = gqa and not model.is_mla and (attention == "eager" or masked
                                           or attention not in _NATIVE_GQA)
    if repeat:
        terms.append(("attention", "k, v repeated to H heads (repeat_kv)",
                      b * heads * keys * (d_qk + d_v) * e))
    n = b * heads * c * keys
    if attention == "eager":
        # Gemma 2's soft-capping (divide, tanh, multiply) makes each new score tensor as the
        # previous one dies, two at a time, under the three of the softmax below: no term
        # (measured on the H200, 2026-12-02: a term for it over-counted by one score tensor).
        terms.append(("attention", "scores Q·Kᵀ·scale + mask (e)", n * e))
        if e != 4:  # fp32 scores need no converted copy
            terms.append(("attention", "softmax(dtype=float32): fp32 copy of the scores", 4 * n))
        terms.append(("attention", "softmax output (fp32)", 4 * n))
        return terms
    if masked and attention in ("sdpa_efficient", "sdpa_cudnn"):
        cols = -(-keys // 16) * 16 if attention == "sdpa_efficient" else keys
        terms.append(("attention", "the boolean mask as an additive bias (e)", b * c * cols * e))
    if c == keys and not model.is_mla and not masked:
        extra = attention_peak_bytes(attention, b, heads, c, sh.d, _dtype_of(e), causal=True,
                                     backward=False, kv_heads=sh.kv_heads)
        if repeat:  # attnmem.calc.peak counts the efficient backend's own expansion
            extra -= b * heads * keys * 2 * sh.d * e
        terms.append(("attention", f"{INFER_ATTENTION_LABELS[attention]} call "
                      "(attnmem.calc.peak, forward)", max(extra, 0)))
        return terms
    terms.append(("attention", "attention output", b * heads * c * d_v * e))
    if attention in ("sdpa_flash", "triton", "fa4"):
        terms.append(("attention", "log-sum-exp (fp32)", b * heads * c * 4))
    return terms


def _dtype_of(e: int) -> str:
    return {2: "bf16", 4: "fp32"}[e]  # fp16 and bf16 allocate alike


def _mlp_moment(model: ModelConfig, sh: _StepDims, t: int, moe: bool, decode: bool,
                ) -> list[tuple[str, str, int]]:
    e, h = sh.e, sh.h
    if not moe:
        width = model.dense_intermediate_size if model.num_experts > 1 else model.intermediate_size
        k = 4 if model.model_type == "phi3" else 3
        return [("MLP", f"act(gate(x)), up(x), their product ({k}·T·I)"
                 if k == 3 else "fused gate_up output, act(gate), product (4·T·I)",
                 k * t * width * e)]
    k, i = model.experts_per_token, model.intermediate_size
    pairs = t * k
    # The gate returns (logits, top-k weights, indices) and the block keeps all three: the
    # logits in `_` (modeling_mixtral.py MixtralSparseMoeBlock.forward `_, top_k_weights,
    # top_k_index = self.gate(hidden_states)`; Qwen2/3-MoE and DeepSeek-V2/V3 alike) until it
    # returns. DeepSeek's are fp32 (F.linear of fp32 copies); the fp32 softmax dies in the gate.
    route_e = 4 if model.model_type in _FP32_ROUTING else e  # the top-k weights' and logits'
    router = [("MoE", "top-k routing weights (fp32) and expert indices (int64)",
               t * k * (4 + 8)),
              ("MoE", "router logits, held by the block's `_`", t * model.num_experts * route_e)]
    if decode:
        routed = [("MoE", "batched_mm: each pair's expert matrices gathered (S·3·I·h)",
                   pairs * 3 * i * h * e),
                  ("MoE", "pairs' hidden states and projections", pairs * (h + 2 * i) * e)]
    elif model.model_type in _FP32_ROUTING:
        routed = [("MoE", "grouped_mm: sorted hidden states and the masked projection (e)",
                   2 * pairs * h * e),
                  ("MoE", "the weighted and un-permuted copies, fp32 (promoted by the fp32 "
                   "routing weights)", 2 * pairs * h * 4)]
    else:
        routed = [("MoE", "grouped_mm: sorted hidden states and three S·h copies "
                   "(masked, weighted, un-permuted)", 4 * pairs * h * e)]
    if not decode:
        routed += [
                   ("MoE", "sort, permutation, inverse and arange (int64), sentinel mask, "
                    "histc's int32 copy of the sorted ids", 4 * pairs * 8 + pairs + 4 * pairs)]
        # The earlier moment, inside the experts' gate: the gate_up projection (S·2I) alive
        # while act(gate) and the product (S·I each) are made (transformers 5.17 also masks
        # the projection into a second S·2I copy first: the same bytes), beside the sorted
        # hidden states. It is the larger where 4·I > 3·h (Mixtral: I = 3.5·h).
        gate = [("MoE", "grouped_mm: sorted hidden states, the gate_up projection, act(gate) "
                 "and the product (S·h + 4·S·I)", pairs * (h + 4 * i) * e),
                ("MoE", "sorted expert ids and permutation (int64), histc's int32 copy, "
                 "sentinel mask, sorted routing weights",
                 2 * pairs * 8 + 4 * pairs + pairs + pairs * route_e)]
        if sum(x for *_, x in gate) > sum(x for *_, x in routed):
            routed = gate
    best = router + routed
    shared = model.shared_expert_intermediate_size
    if shared and model.model_type in _SHARED_FIRST:
        # The shared expert runs first: its output waits through the routed experts.
        best = best + [("MoE", "shared expert's output", t * h * e)]
        alt = [("MLP", "shared expert: act, up, product", 3 * t * shared * e)]
        if sum(x for *_, x in alt) > sum(x for *_, x in best):
            best = alt
    elif shared:  # after the routed experts: the router's outputs are still the block's locals
        alt = router + [("MoE", "routed experts' output", t * h * e),
                        ("MLP", "shared expert: act, up, product", 3 * t * shared * e)]
        if sum(x for *_, x in alt) > sum(x for *_, x in best):
            best = alt
    return best


def _held_attention_weights(sh: _StepDims, attention: str, c: int, keys: int,
                            ) -> list[tuple[str, str, int]]:
    """Eager attention's probabilities, alive from the attention to the layer's end.

    eager_attention_forward returns them (B, H, c, keys) after softmax(dtype=float32)
    `.to(query.dtype)` and dropout (p = 0 returns its input), the attention returns them beside
    o_proj's output, and the decoder layer keeps them in `_` until it returns
    (modeling_llama.py LlamaDecoderLayer.forward: `hidden_states, _ = self.self_attn(...)`; the
    files built from it and modeling_deepseek_v2.py likewise, Phi-3 as `self_attn_weights`):
    through the residual add, the post-attention norm and the whole MLP or MoE block. SDPA,
    ours and FA4 return None."""
    if attention != "eager":
        return []
    return [("attention", "eager's attention weights (B·H·c·keys, e), held by the layer's `_`",
             sh.b * sh.heads * c * keys * sh.e)]


def _attention_side(model: ModelConfig, sh: _StepDims, attention: str, t: int, c: int,
                    keys: int, masked: bool) -> list[tuple[str, str, int]]:
    """q and its relatives alive during the call (the cache is counted separately)."""
    e = sh.e
    if model.is_mla:
        nope = model.head_dim - model.qk_rope_head_dim
        rope = model.qk_rope_head_dim
        kv_t = sh.b * keys
        return [("attention", "q projection, its rotated part and the concatenated query",
                 t * sh.heads * (2 * (nope + rope) + rope) * e),
                ("attention", "kv_a output and its normalized latent",
                 t * (2 * model.kv_lora_rank + rope) * e),
                ("attention", "kv_b expansion of the cached latent (keys × H × (nope + v))",
                 kv_t * sh.heads * (nope + model.v_head_dim) * e),
                ("attention", "per-head keys (keys × H × (nope + rope))",
                 kv_t * sh.heads * (nope + rope) * e)]
    terms = [("attention", "q after rotary", t * sh.heads * sh.d * e)]
    if model.model_type == "phi3":  # q, k, v are views of qkv_proj's output, a live local
        terms.append(("attention", "fused qkv_proj output (kept by its local)",
                      t * (sh.heads + 2 * sh.kv_heads) * sh.d * e))
    return terms


def _prefill_moments(model: ModelConfig, sh: _StepDims, attention: str, past: int, c: int,
                     total: int, static: bool):
    # A static cache hands the attention all its slots; SDPA's unmasked causal path slices them
    # to the prompt (sdpa_attention.py), eager attends over them all behind its mask.
    keys = total if static and attention == "eager" else c + past
    # A dynamic sliding layer attends to its kept window and the chunk (cache_utils.py
    # DynamicSlidingWindowLayer: update returns the concatenation of the last w - 1 tokens and
    # the chunk; get_mask_sizes sizes its mask so), not to the whole past.
    w = model.sliding_window or 0
    slide_keys = c + past if static or not w else min(past, max(w - 1, 0)) + c
    t = sh.b * c
    base = _forward_base(model, sh, attention, c, keys, static, sliding_keys=slide_keys)
    hidden_in = [("hidden states", "the layer's input (held by the model's loop)",
                  t * sh.h * sh.e)] if model.num_layers > 1 else []
    cache_all = _prefill_cache(model, sh, past, c, total, static)
    cache = [("KV cache", "KV cache, every layer up to the last", cache_all)]
    normed = [("norm", "the norm's output", t * sh.h * sh.e)]
    full_m, slide_m = _mask_layers(model, attention, c, c + past, static)
    out = []
    # Attention: the larger of a full and a sliding layer (evaluated as the last layer).
    full, sliding = _layers(model)
    att_best: list = []
    held_keys = 0  # the most keys a layer attends to: eager's weights it holds after
    for kind, masked in (("full", full_m > 0), ("sliding", slide_m > 0)):
        if (kind == "full" and not full) or (kind == "sliding" and not sliding):
            continue
        k_keys = slide_keys if kind == "sliding" else keys
        terms = []
        if kind == "sliding" and static:
            # StaticSlidingWindowLayer.update returns the cached tokens and the chunk
            # concatenated (a new k and v of past + c tokens) beside its window-sized slots.
            k_keys = c + past
            terms.append(("KV cache", "the sliding layer's concatenated k and v (past + chunk)",
                          _layer_cache(model, sh, c + past)))
        held_keys = max(held_keys, k_keys)
        terms += (_attention_side(model, sh, attention, t, c, k_keys, masked)
                  + _attention_call(model, sh, attention, c, k_keys, masked))
        if sum(x for *_, x in terms) > sum(x for *_, x in att_best):
            att_best = terms
    out.append((PHASES[0], base + hidden_in + cache + normed + att_best))
    # Cache update: q, the rotated k and v, the new tensors (counted in the cache) and, for a
    # chunk after the first, the old value tensor not yet released.
    kv_w = kv_elements_per_token(model)
    upd = [("attention", "q after rotary", t * sh.heads * sh.d * sh.e),
           ("attention", "rotated k and v before the cache copy", t * kv_w * sh.e)]
    if past and not static:
        upd.append(("KV cache", "the old value tensor during the concatenation",
                    _layer_cache(model, sh, past) // 2))
    out.append((PHASES[1], base + hidden_in + cache + normed + upd))
    # MLP of the last layer: the residual, the norm output and the MLP's own moment.
    moe = model.num_experts > 1 and (model.mlp_layers or model.num_layers) > model.dense_mlp_layers
    mlp = _mlp_moment(model, sh, t, moe=moe, decode=False)
    resid = [("hidden states", "the residual after attention", t * sh.h * sh.e)]
    resid += _held_attention_weights(sh, attention, c, held_keys)
    out.append((PHASES[2], base + hidden_in + cache + resid + normed + mlp))
    if model.num_experts > 1 and model.dense_mlp_layers:  # DeepSeek's dense first layers
        dense = _mlp_moment(model, sh, t, moe=False, decode=False)
        first = [("KV cache", "KV cache of the first layers",
                  model.dense_mlp_layers * _layer_cache(model, sh, past + c))]
        alt = base + hidden_in + first + resid + normed + dense
        if sum(x for *_, x in alt) > sum(x for *_, x in out[-1][1]):
            out[-1] = (PHASES[2], alt)
    # Final norm: the last layer's output, the norm's fp32 copy and product.
    out.append((PHASES[3], base + cache + [
        ("hidden states", "the last layer's output", t * sh.h * sh.e),
        ("norm", "final RMSNorm: fp32 copy and fp32 product", 8 * t * sh.h)]))
    return out


def _decode_moments(model: ModelConfig, sh: _StepDims, attention: str, s: int, n: int,
                    total: int, static: bool):
    """The last decode step (the most cached tokens): one token per sequence."""
    tokens = s + n - 1
    kv = _cache_state(model, sh, tokens - 1, total, static, decoding=True)
    t = sh.b
    bv = sh.b * model.vocab_size
    # generate()'s loop (generation/utils.py _sample) keeps the previous step's fp32 copy of
    # the logits and the processed scores (a logits processor clones them: min_new_tokens'
    # does, as the measurement uses) in its locals until the new ones replace them.
    prev = [("logits", "previous step's fp32 logits copy and processed scores", 8 * bv)]
    base = [("inputs", "generated ids, attention mask (int64)", 8 * 2 * sh.b * (tokens + 1)),
            ("hidden states", "hidden states of the step", 3 * t * sh.h * sh.e)] + prev
    full, sliding = _layers(model)
    layer_new = _layer_cache(model, sh, total if static else tokens)
    cache = [("KV cache", "KV cache of every layer", sum(kv.values()))]
    upd = []
    if not static:
        # The last layer's concatenation: its new key (or value) tensor beside the old ones.
        grow = layer_new - _layer_cache(model, sh, tokens - 1)
        upd = [("KV cache", "the last layer's new cache tensors beside the old ones",
                layer_new // 2 + grow)]
    out = [(PHASES[4], base + cache + upd)]
    # The step's logits: the bf16 last-position logits, the new fp32 copy and scores beside the
    # previous ones; every layer's cache at its new length.
    full_cache = [("KV cache", "KV cache of every layer after the step",
                   sum(_cache_state(model, sh, tokens, total, static, decoding=True).values()))]
    out.append((PHASES[6], base + full_cache + [
        ("logits", "the step's logits (e), fp32 copy and processed scores", bv * (sh.e + 8))]))
    masked = static  # a static cache's decode passes a mask
    keys = total if static else tokens
    att = (_attention_side(model, sh, attention, t, 1, keys, masked)
           + _attention_call(model, sh, attention, 1, keys, masked))
    if sliding and not full:
        w = model.sliding_window
        keys = min(w, keys)
        att = (_attention_side(model, sh, attention, t, 1, keys, masked)
               + _attention_call(model, sh, attention, 1, keys, masked))
    if model.num_experts > 1:
        att_or_moe = (_held_attention_weights(sh, attention, 1, keys)
                      + _mlp_moment(model, sh, t, moe=True, decode=True))
        if sum(x for *_, x in att_or_moe) > sum(x for *_, x in att):
            att = att_or_moe
    out.append((PHASES[5], base + cache + att))
    return out


def max_inference_seq_len(model: ModelConfig, gpu_bytes: int, batch: int = 1,
                          new_tokens: int = 1, **kwargs) -> int:
    """Longest prompt whose generate() peak fits gpu_bytes (0 if none): exact integer search
    (attnmem.calc.fit.largest_fitting; the peak is non-decreasing in the prompt length)."""
    inference_step(model, batch, 1, new_tokens, **kwargs)  # validates
    return largest_fitting(no_fit_without_kernel(
        lambda s: inference_step(model, batch, s, new_tokens, **kwargs).peak_bytes), gpu_bytes)
