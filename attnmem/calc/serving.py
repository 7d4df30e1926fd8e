"""Serving capacity: KV blocks, concurrent sequences and the longest context, as vLLM counts.

The accounting follows vLLM's V1 engine:

1. Budget (vllm/v1/worker/gpu_worker.py, Worker.determine_available_memory): the engine may use
   `total GPU memory x gpu_memory_utilization`; from it go the weights, the activation peak
   of the profiling forward pass over `max_num_batched_tokens` tokens, and the non-torch
   allocations (NCCL, cuBLAS workspaces ...). Since vLLM v0.21.0 the CUDA-graph memory is
   profiled too and taken from the same budget (log line "CUDA graph memory profiling is enabled
   (default since v0.21.0)", VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS); before, graphs were
   captured afterwards in the (1 - utilization) headroom: `cuda_graphs_in_budget=False`.
   What is left is the KV-cache pool.
2. Blocks (vllm/v1/core/kv_cache_utils.py, get_num_blocks): one block holds `block_size`
   tokens of every attention layer; its page per layer is block_size x the cached elements per
   token x e (FullAttentionSpec: 2·H_kv·d; MLAAttentionSpec: kv_lora_rank + qk_rope_head_dim),
   so num_blocks = pool // page // L_attention.
3. Concurrency (get_max_concurrency_for_kv_cache_config): num_blocks / blocks one request of
   s tokens needs, ceil(s / block_size). A sliding-window layer needs at most
   ceil(min(window - 1 + max_num_batched_tokens, s) / block_size) + 1 blocks
   (vllm/v1/kv_cache_interface.py, SlidingWindowSpec.max_memory_usage_bytes); a hybrid's
   state layers hold one constant state per request (MambaSpec). We count bytes per request
   over all layers and divide the pool by it: for a uniform model this is vLLM's figure.
4. Longest context of one request (estimate_max_model_len): the largest s whose per-request
   bytes fit in the pool, exact integer search.
5. Hybrid KV groups (kv_cache_utils.py, _get_kv_cache_groups_uniform_page_size, for models
   with both sliding-window and full-attention layers of one page size: Gemma 2/3, gpt-oss):
   layers are grouped by spec; the group size is the smallest type's layer count, or the
   largest's when that is below 1.5 x the smallest; each type takes ceil(n / group size)
   groups, the last padded. One block then holds group-size layers (get_num_blocks with
   num_layers = group size), and a request takes its blocks per group: Gemma-3-27B's 52 sliding
   layers take 6 groups of 10 (60 layer slots, 8 of them padding) beside 1 group of 10 full
   layers. `kv_cache_groups` gives the grouping; page_bytes and sequence_bytes use it.

Defaults of the overheads are figures vLLM logs on one GPU: "non_torch_memory takes 0.33GiB"
(vllm-project/vllm issue 14452) and "Estimated CUDA graph memory: 0.36 GiB total" (vLLM 0.27
log quoted in gpustack/runner PR 251). Measure yours in the engine's start-up log.

When the activation peak is not given, `activation_peak_estimate` estimates what the profiling
run allocates (terms in its docstring): an estimate, marked as such.

Prefill vs decode attention: prefill of s tokens is attnmem.calc.attention_peak_bytes (causal, s_q = s);
decode of one new token (s_q = 1) against s cached keys is `decode_attention_bytes`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from numbers import Real

from attnmem.calc.fit import largest_fitting
from attnmem.calc.gpus import torch_total_bytes
from attnmem.calc.kv import kv_elements_per_token, state_bytes
from attnmem.calc.models import ModelConfig, check_model
from attnmem.calc.params import CHECKPOINT
from attnmem.calc.peak import attention_peak_bytes, check_impl
from attnmem.calc.units import (
    GIB,
    MAX_BATCH,
    MAX_SEQ_LEN,
    ceil_bytes,
    check_int,
    dtype_bytes,
    dtype_name,
)
from attnmem.calc.weights import weight_bytes

#: vLLM's default tokens per KV block (CacheConfig.block_size on CUDA).
DEFAULT_BLOCK_SIZE = 16
#: vLLM's default fraction of GPU memory the engine may use (CacheConfig).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
#: vLLM V1's default max_num_batched_tokens for the OpenAI server on large GPUs (arg_utils.py).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
#: vLLM's default max_num_seqs (requests scheduled at once) on large GPUs.
DEFAULT_MAX_NUM_SEQS = 256
_MIB = 2**20
#: Start-up log figures, see the module docstring, rounded up to whole MiB: the Serving page
#: takes both overheads in MiB and the command line in bytes, so a default that is not a whole
#: number of MiB gave the two different numbers (0.33 GiB = 337.92 MiB: the page used 337 MiB,
#: `attnmem serve` 354,334,802 bytes; issue 32). One default, the same on both.
DEFAULT_NON_TORCH_BYTES = math.ceil(Fraction(33, 100) * GIB / _MIB) * _MIB  # 338 MiB
DEFAULT_CUDA_GRAPH_BYTES = math.ceil(Fraction(36, 100) * GIB / _MIB) * _MIB  # 369 MiB
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class ServingCapacity:
    """What fits in a vLLM-style KV pool on one GPU (bytes unless named otherwise)."""

    gpu_bytes: int
    budget_bytes: int  # gpu_bytes x gpu_memory_utilization
    weights_bytes: int
    activation_bytes: int  # profiling-run peak (given, or activation_peak_estimate)
    activation_estimated: bool
    non_torch_bytes: int
    cuda_graph_bytes: int
    cuda_graphs_in_budget: bool
    kv_pool_bytes: int  # what is left for KV blocks (0 if nothing is)
    block_size: int
    page_bytes: int  # one block of all attention layers
    num_blocks: int
    seq_len: int
    bytes_per_sequence: int  # KV blocks of one request of seq_len tokens + its constant state
    blocks_per_sequence: int  # KV blocks one request of seq_len needs (full-attention layers)
    max_concurrency: int  # whole requests of seq_len that fit the pool (before max_num_seqs)
    max_num_seqs: int
    max_context: int  # longest context one request can have (0: not even one token)
    headroom_bytes: int  # gpu - budget - (graphs when outside the budget); < 0: will not start

    @property
    def concurrent_sequences(self) -> int:
        """Requests of seq_len running at once: the KV limit, capped by max_num_seqs."""
        return min(self.max_concurrency, self.max_num_seqs)


def _fraction(name: str, value: object, lo: Fraction, hi: Fraction, open_lo: bool) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, Real) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"{name} must be a number, got {value!r:.60}")
    f = Fraction(value)
    if f > hi or f < lo or (open_lo and f == lo):
        low = f"above {float(lo):g}" if open_lo else f"at least {float(lo):g}"
        raise ValueError(f"{name} must be {low} and at most {float(hi):g}, got {value!r}")
    return f


def _bytes_arg(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 10**15:
        raise ValueError(f"{name} must be a whole number of bytes from 0 to 10^15, got "
                         f"{value!r:.60}")
    return value


def _dtype(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a dtype name such as 'bf16' or 'fp8_e4m3', got "
                         f"{value!r:.60}")
    try:
        return dtype_name(value)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None


@dataclass(frozen=True)
class KVCacheGroups:
    """vLLM's KV cache groups of one model (module docstring, point 5)."""

    group_size: int  # layers per group = layers one block spans
    full_groups: int  # groups of full-attention layers
    sliding_groups: int  # groups of sliding-window layers
    padding_layers: int  # empty layer slots added to fill the last group of each type

    @property
    def groups(self) -> int:
        return self.full_groups + self.sliding_groups


def kv_cache_groups(model: ModelConfig) -> KVCacheGroups:
    """How vLLM groups the attention layers (vllm/v1/core/kv_cache_utils.py,
    _get_kv_cache_groups_uniform_page_size): one group of all layers when every layer has the
    same spec (all full, or all one window); with sliding and full layers, group size g = the
    smaller count, or the larger when larger < 1.5 x smaller, and ceil(n / g) groups per type.
    Hybrids with state layers keep one group of their attention layers here (their Mamba page
    padding is not modelled)."""
    check_model(model)
    layers = model.kv_layers
    windowed = min(model.sliding_window_layers, layers) if model.sliding_window else 0
    return group_layers(layers - windowed, windowed, model.state_mixer is not None)


def group_layers(full: int, windowed: int, state_layers: bool = False) -> KVCacheGroups:
    """kv_cache_groups from the layer counts alone: `full` full-attention and `windowed`
    sliding-window layers of one page size (state_layers: the model also has state layers,
    whose attention layers stay one group here)."""
    layers = full + windowed
    if windowed == 0 or full == 0 or state_layers:
        return KVCacheGroups(layers, 1 if full else 0, 1 if windowed else 0, 0)
    lo, hi = min(full, windowed), max(full, windowed)
    g = hi if hi < Fraction(3, 2) * lo else lo
    nf, ns = -(-full // g), -(-windowed // g)
    return KVCacheGroups(g, nf, ns, (nf + ns) * g - layers)


def page_bytes(model: ModelConfig, block_size: int, kv_dtype: str) -> int:
    """Bytes of one KV block: block_size x cached elements per token x e per layer (vLLM
    FullAttentionSpec / MLAAttentionSpec.page_size_bytes) times the layers one block spans,
    all L_attn layers for a uniform model, the group size for one with sliding and full layers
    (kv_cache_groups; vLLM get_kv_cache_config_from_groups)."""
    check_model(model)
    bs = check_int("block_size", block_size, 1, 4096)
    e = dtype_bytes(_dtype("kv_dtype", kv_dtype))
    return ceil_bytes(kv_cache_groups(model).group_size * bs * kv_elements_per_token(model) * e)


def sequence_bytes(model: ModelConfig, seq_len: int, block_size: int, kv_dtype: str,
                   state_dtype: str = "bf16",
                   max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS) -> int:
    """KV blocks one request of seq_len tokens occupies, in bytes, plus a hybrid's constant
    state: full-attention layers ceil(s / block_size) blocks each, sliding-window layers
    ceil(min(window - 1 + max_num_batched_tokens, s) / block_size) + 1 (vLLM SlidingWindowSpec),
    counted per KV cache group of group_size layer slots, padding included (kv_cache_groups),
    state layers one state (vLLM MambaSpec), see the module docstring."""
    check_model(model)
    s = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
    bs = check_int("block_size", block_size, 1, 4096)
    t = check_int("max_num_batched_tokens", max_num_batched_tokens, 1, MAX_SEQ_LEN)
    e = dtype_bytes(_dtype("kv_dtype", kv_dtype))
    layer_page = bs * kv_elements_per_token(model) * e  # one block of one layer
    groups = kv_cache_groups(model)
    full_blocks = -(-s // bs)
    total = groups.full_groups * groups.group_size * full_blocks * layer_page
    if groups.sliding_groups:
        tokens = min(model.sliding_window - 1 + t, s)
        total += groups.sliding_groups * groups.group_size * (-(-tokens // bs) + 1) * layer_page
    return ceil_bytes(total) + state_bytes(model, 1, _dtype("state_dtype", state_dtype))


#: The moments of vLLM's profiling forward (`activation_moments`), largest first when equal.
PROFILE_MOMENTS: tuple[str, ...] = ("MLP of a layer", "MoE of a layer", "attention of a layer",
                                    "sampler")


def activation_moments(model: ModelConfig, max_num_batched_tokens: int,
                       act_dtype: str = "bf16",
                       max_num_seqs: int = DEFAULT_MAX_NUM_SEQS) -> dict[str, int]:
    """Bytes beyond the weights at each moment of vLLM's profiling run, counted as
    attnmem.calc.inference_step counts generate(): the tensors alive at a named moment, here from
    vLLM's own modules. What the run does (vllm/v1/worker/gpu_model_runner.py profile_run):
    one forward over T = max_num_batched_tokens dummy tokens (_dummy_run), then the sampler
    over min(max_num_seqs, T) rows (_dummy_sampler_run); the worker takes the torch peak of
    that as the activation memory (gpu_worker.py determine_available_memory). The attention
    backend returns its preallocated output without computing when there is no metadata
    (vllm/v1/attention/backends/flash_attn.py, "Profiling run."), so no score or log-sum-exp
    buffer appears. Per layer, with the residual and the normed hidden states alive (vLLM's
    fused add-RMSNorm works in place: 2·T·h·a):
    - attention: the fused qkv_proj output T·(H + 2·H_kv)·d·a (rotary in place on its q, k
      views), the attention output T·H·d·a the layer allocates, o_proj's output T·h·a while
      qkv is still a live local;
    - gated MLP: MergedColumnParallelLinear's gate_up output 2·T·I·a and SiluAndMul's output
      T·I·a (non-gated: up T·I·a and its activation T·I·a);
    - MoE: fused_moe's intermediate caches T·k·(2·I_e + I_e + h)·a (fused_moe.py
      intermediate_cache1..3);
    - the sampler: the logits of each row in a and their fp32 copy, rows·V·(a + 4).
    """
    check_model(model)
    t = check_int("max_num_batched_tokens", max_num_batched_tokens, 1, MAX_SEQ_LEN)
    rows = min(check_int("max_num_seqs", max_num_seqs, 1, MAX_BATCH), t)
    a = dtype_bytes(_dtype("act_dtype", act_dtype))
    h, d = model.hidden_size, model.head_dim
    stream = 2 * t * h * a
    dense_width = (model.dense_intermediate_size if model.num_experts > 1
                   else model.intermediate_size)
    moments = {"MLP of a layer": stream + (3 if model.gated_mlp else 2) * t * dense_width * a}
    if model.num_experts > 1:
        k = model.experts_per_token
        moments["MoE of a layer"] = stream + t * k * (3 * model.intermediate_size + h) * a
    qkv = t * (model.num_heads + 2 * model.num_kv_heads) * d * a
    moments["attention of a layer"] = stream + qkv + t * model.num_heads * d * a + t * h * a
    moments["sampler"] = stream + rows * model.vocab_size * (4 + a)
    return {k: ceil_bytes(v) for k, v in moments.items()}


def activation_peak_estimate(model: ModelConfig, max_num_batched_tokens: int,
                             act_dtype: str = "bf16",
                             max_num_seqs: int = DEFAULT_MAX_NUM_SEQS) -> int:
    """The torch peak of vLLM's profiling run beyond the weights: the largest of
    `activation_moments` (its docstring has every term and source). Counted from vLLM's
    modules, not measured here (no vLLM on our GPU host): pass the figure of your engine's
    log when you have it."""
    return max(activation_moments(model, max_num_batched_tokens, act_dtype,
                                  max_num_seqs).values())


def decode_attention_bytes(impl: str, batch: int, heads: int, seq_len: int, head_dim: int,
                           dtype: str, kv_heads: int | None = None) -> int:
    """Extra peak of one decode step's attention: s_q = 1 new query row per sequence against
    seq_len cached keys. Derived from attnmem.calc.peak's forward terms with the query length set to 1
    (scores are B·H·1·s, Vaswani et al. eq. 1; no causal mask is needed for the last row);
    not measured:
    - naive: scores and softmax (2 x B·H·s·e) + output B·H·d·e; with GQA the K/V expanded to
      H heads (2 x B·H·s·d·e), as attnmem.calc.peak counts for prefill; naive_inplace: one score tensor;
    - sdpa_math: fp32 scores and softmax + the boolean safe-softmax test (9 bytes per score),
      fp32 copies of q and the output (2 x B·H·d·4) and of k, v (2 x B·H_kv·s·d·4; with GQA
      also expanded to H heads);
    - fused kernels (sdpa_efficient, sdpa_flash, sdpa_cudnn, triton): output + one fp32
      log-sum-exp per (batch, head) row (FlashAttention-2, Dao arXiv 2307.08691, Alg. 1).
    """
    check_impl(impl)
    b = check_int("batch", batch, 1, MAX_BATCH)
    h = check_int("heads", heads, 1, 1_000_000)
    s = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
    d = check_int("head_dim", head_dim, 1, 1_000_000)
    h_kv = h if kv_heads is None else check_int("kv_heads", kv_heads, 1, h)
    if h % h_kv:
        raise ValueError(f"heads ({h}) must be a multiple of kv_heads ({h_kv})")
    e = dtype_bytes(_dtype("dtype", dtype))
    out = ceil_bytes(b * h * d * e)
    gqa = h_kv != h
    if impl in ("naive", "naive_inplace"):
        tensors = 1 if impl == "naive_inplace" else 2
        expanded = ceil_bytes(2 * b * h * s * d * e) if gqa else 0
        return out + expanded + ceil_bytes(tensors * b * h * s * e)
    if impl == "sdpa_math":
        kv32 = 2 * b * h_kv * s * d * 4 + (2 * b * h * s * d * 4 if gqa else 0)
        return out + b * h * s * 9 + 2 * b * h * d * 4 + kv32
    return out + b * h * 4


def serving_capacity(
    model: ModelConfig,
    gpu_bytes: int | str,
    seq_len: int,
    *,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    act_dtype: str = "bf16",
    state_dtype: str = "bf16",
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    cuda_graph_bytes: int = DEFAULT_CUDA_GRAPH_BYTES,
    non_torch_bytes: int = DEFAULT_NON_TORCH_BYTES,
    activation_bytes: int | None = None,
    cuda_graphs_in_budget: bool = True,
) -> ServingCapacity:
    """KV blocks, concurrent requests of seq_len and the longest context on one GPU (module
    docstring: vLLM's gpu_worker.py and kv_cache_utils.py). ValueError names a bad input.

    gpu_bytes is the device total in bytes, or a GPU name of attnmem.calc.GPUS: then the total the
    driver reports to torch (attnmem.calc.gpus.torch_total_bytes, what vLLM multiplies by
    gpu_memory_utilization), the spec-sheet figure only where no torch figure is sourced.
    weight_dtype "checkpoint" prices the weights as the checkpoint stores them (attnmem/calc/quant.py).
    """
    check_model(model)
    p = pool_settings(gpu_bytes, seq_len, gpu_memory_utilization, block_size,
                      max_num_batched_tokens, max_num_seqs, cuda_graph_bytes, non_torch_bytes,
                      cuda_graphs_in_budget)
    bs, t = p.block_size, p.batched_tokens
    kvd, sd = _dtype("kv_dtype", kv_dtype), _dtype("state_dtype", state_dtype)
    if isinstance(weight_dtype, str) and weight_dtype.strip().lower() == CHECKPOINT:
        weights = weight_bytes(model, CHECKPOINT)  # as stored (attnmem/calc/quant.py)
    else:
        weights = weight_bytes(model, _dtype("weight_dtype", weight_dtype))
    estimated = activation_bytes is None
    act = (activation_peak_estimate(model, t, _dtype("act_dtype", act_dtype), p.max_num_seqs)
           if estimated else _bytes_arg("activation_bytes", activation_bytes))
    return pool_capacity(p, weights, act, estimated, page_bytes(model, bs, kvd),
                         lambda n: sequence_bytes(model, n, bs, kvd, sd, t))


@dataclass(frozen=True)
class PoolSettings:
    """The engine settings serving_capacity takes, checked (pool_settings)."""

    gpu: int
    util: Fraction
    block_size: int
    seq_len: int
    batched_tokens: int
    max_num_seqs: int
    graphs: int
    non_torch: int
    graphs_in_budget: bool


def pool_settings(gpu_bytes: int | str, seq_len: int,
                  gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                  block_size: int = DEFAULT_BLOCK_SIZE,
                  max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                  max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                  cuda_graph_bytes: int = DEFAULT_CUDA_GRAPH_BYTES,
                  non_torch_bytes: int = DEFAULT_NON_TORCH_BYTES,
                  cuda_graphs_in_budget: bool = True) -> PoolSettings:
    """serving_capacity's engine settings checked; ValueError names a bad one. A GPU name is
    the total the driver reports to torch (attnmem.calc.gpus.torch_total_bytes)."""
    if isinstance(gpu_bytes, str):  # a GPU name: the total the driver reports to torch
        gpu_bytes = torch_total_bytes(gpu_bytes)
    gpu = _bytes_arg("gpu_bytes", gpu_bytes)
    if gpu == 0:
        raise ValueError("gpu_bytes must be above 0, got 0")
    util = _fraction("gpu_memory_utilization", gpu_memory_utilization, Fraction(0), Fraction(1),
                     open_lo=True)
    if not isinstance(cuda_graphs_in_budget, bool):
        raise ValueError(f"cuda_graphs_in_budget must be true or false, got "
                         f"{cuda_graphs_in_budget!r:.40}")
    return PoolSettings(
        gpu, util, check_int("block_size", block_size, 1, 4096),
        check_int("seq_len", seq_len, 1, MAX_SEQ_LEN),
        check_int("max_num_batched_tokens", max_num_batched_tokens, 1, MAX_SEQ_LEN),
        check_int("max_num_seqs", max_num_seqs, 1, MAX_BATCH),
        _bytes_arg("cuda_graph_bytes", cuda_graph_bytes),
        _bytes_arg("non_torch_bytes", non_torch_bytes), cuda_graphs_in_budget)


def pool_capacity(p: PoolSettings, weights: int, act: int, estimated: bool, page: int,
                  per_request: Callable[[int], int]) -> ServingCapacity:
    """ServingCapacity (module docstring, points 1-4): the pool is gpu x utilization less
    weights, activations, non-torch and (in the budget) CUDA graphs; blocks = pool // page;
    `per_request(n)` is the bytes one request of n tokens occupies, non-decreasing in n
    (sequence_bytes, or a traced model's attnmem.calc.serving_layout.layout_sequence_bytes)."""
    budget = math.floor(p.gpu * p.util)
    used = weights + act + p.non_torch + (p.graphs if p.graphs_in_budget else 0)
    pool = max(budget - used, 0)
    per_seq = per_request(p.seq_len)
    headroom = p.gpu - budget - (0 if p.graphs_in_budget else p.graphs)
    return ServingCapacity(
        gpu_bytes=p.gpu, budget_bytes=budget, weights_bytes=weights, activation_bytes=act,
        activation_estimated=estimated, non_torch_bytes=p.non_torch, cuda_graph_bytes=p.graphs,
        cuda_graphs_in_budget=p.graphs_in_budget, kv_pool_bytes=pool,
        block_size=p.block_size, page_bytes=page, num_blocks=pool // page, seq_len=p.seq_len,
        bytes_per_sequence=per_seq, blocks_per_sequence=-(-p.seq_len // p.block_size),
        max_concurrency=pool // per_seq, max_num_seqs=p.max_num_seqs,
        max_context=largest_fitting(per_request, pool), headroom_bytes=headroom)


def prefill_decode_attention(model: ModelConfig, impl: str, seq_len: int, batch: int = 1,
                             dtype: str = "bf16") -> tuple[int, int]:
    """(prefill, decode) extra attention peak of one layer for a batch of requests of seq_len:
    prefill = attnmem.calc.attention_peak_bytes (causal, s_q = s), decode = decode_attention_bytes
    (s_q = 1 against s cached keys)."""
    check_model(model)
    prefill = attention_peak_bytes(impl, batch, model.num_heads, seq_len, model.head_dim, dtype,
                                   causal=True, backward=False, kv_heads=model.num_kv_heads)
    decode = decode_attention_bytes(impl, batch, model.num_heads, seq_len, model.head_dim,
                                    dtype, kv_heads=model.num_kv_heads)
    return prefill, decode
