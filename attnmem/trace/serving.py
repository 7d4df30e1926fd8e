"""vLLM serving capacity for a model calc has no rules for: what can be counted from
transformers' own modules, and what is refused.

vLLM sizes its KV pool as attnmem.calc.serving describes (budget = GPU x utilization less the
weights, the profile run's activation peak, non-torch memory and CUDA graphs; blocks from what
is left). For a model type outside calc's rules each term comes from here, and each says where
it came from (`TracedServing.sources`):

- weights: the model built on the meta device (attnmem.trace.weights.trace_weights): every
  parameter once and every buffer, at the serving dtype (16- or 32-bit; a quantized
  checkpoint's stored bytes are calc.quant's, for the types calc has rules for);
- KV per token and a hybrid's state per request (`trace_kv_layout`): one short prefill of
  transformers' own modules on the meta device fills the DynamicCache that generate() would
  make; each cache layer then says what it holds: DynamicLayer K and V (b, H_kv, t, d) ->
  H_kv x (d_k + d_v) elements per token, as vLLM's FullAttentionSpec pages them;
  DynamicSlidingWindowLayer the same with its window (a "chunked_attention" layer type,
  Llama 4's, is counted as full attention: attnmem.calc.serving_layout says why);
  LinearAttentionLayer its conv and recurrent states (bytes of one request, as transformers
  holds them). The arithmetic is then attnmem.calc.serving_layout's;
- the activation peak (`trace_profile_run`): vLLM runs its own model code, so no transformers
  trace is vLLM's number. What is traced is the profile run's work done by transformers'
  modules: one forward over max_num_batched_tokens tokens without a cache, then, its last
  hidden states still held, the logits of min(max_num_seqs, tokens) rows and their fp32 copy
  (vLLM's _dummy_run and _dummy_sampler_run, gpu_model_runner.py), with SDPA's fused
  attention and the cuBLAS workspace (attnmem.trace.inference's rules). It is shown as an upper bound: vLLM's modules
  do the same work with fewer live tensors (fused add-RMSNorm and rotary in place, merged
  gate_up with SiluAndMul, and no attention computed in the profile run at all), so its
  profile peak is lower; tests/trace/test_serving_trace.py checks the bound against calc's
  count of vLLM's modules (attnmem.calc.serving.activation_moments) on ruled families. Where
  the trace cannot run (a mixer that loops over tokens on meta, the model's code failing),
  the activation term is refused with the reason and the capacity shown is an upper bound
  (the pool without it), unless the figure of vLLM's log is given.

Refused with the reason (never a number from another model's rules): multi-head latent
attention (transformers' cache holds the expanded K/V, vLLM the latent), cache layer classes
other than the above, attention layers of different sizes or windows, sliding windows beside
state layers, models with no attention layer.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from attnmem.calc.inference_step import CUBLAS_WORKSPACE_BYTES
from attnmem.calc.serving import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CUDA_GRAPH_BYTES,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_NON_TORCH_BYTES,
    ServingCapacity,
    pool_settings,
)
from attnmem.calc.serving_layout import KVLayout, layout_capacity
from attnmem.calc.units import MAX_BATCH, MAX_SEQ_LEN, check_int, dtype_name
from attnmem.trace.inference import (
    TRACE_DTYPES,
    TRACE_LOCK,
    TraceTooSlow,
    _built,
    _cache_kw,
    _experts,
    _held_state,
    _module_state,
    _new_cache,
    _OwnHooks,
    _reset_module_state,
    _returned_cache,
    loop_guard,
)
from attnmem.trace.recorder import Recorder, replay

#: Tokens of the short prefill that fills the cache layers (their shapes give the layout).
LAYOUT_TOKENS = 8
#: Weight dtypes the trace prices (bytes per parameter; buffers keep their own width).
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
#: Where each figure comes from: calc's rules are never used for these models.
FROM_TRACE = "trace"
FROM_BOUND = "bound"
FROM_GIVEN = "given"
FROM_NONE = "not counted"


@dataclass(frozen=True)
class TracedLayout:
    """What one request holds in the model's cache layers (KVLayout) and how it was read."""

    layout: KVLayout
    model_class: str
    layer_classes: dict[str, int]  # cache layer class -> layers
    state_dtypes: tuple[str, ...]  # dtypes of the state tensors, as transformers holds them
    transformers_version: str


def _text_config(d: dict) -> Any:
    from attnmem.trace.weights import _config

    cfg = _config(d)
    return cfg.get_text_config(decoder=True)


def _layer_types(cfg: Any, n: int) -> list[str]:
    """transformers' cache layer type of each layer (cache_utils.get_layer_types_and_kwargs)."""
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        types, _ = get_layer_types_and_kwargs(cfg)
    except (ImportError, AttributeError, TypeError):
        types = list(getattr(cfg, "layer_types", None) or [])
    return (list(types) + [""] * n)[:n]  # one per cache layer


def trace_kv_layout(d: dict, dtype: str = "bf16") -> TracedLayout:
    """The KVLayout of config dict `d` read from transformers' own cache layers (module
    docstring); ValueError names why it cannot be counted."""
    if dtype not in TRACE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: the trace runs {tuple(TRACE_DTYPES)}")
    return _layout(json.dumps(d, sort_keys=True), dtype)


@lru_cache(maxsize=32)
def _layout(text: str, dtype: str) -> TracedLayout:
    import torch
    import transformers

    d = json.loads(text)
    cfg = _text_config(d)
    if getattr(cfg, "kv_lora_rank", None):
        raise ValueError(
            "multi-head latent attention (kv_lora_rank): transformers' cache holds the K and V "
            "expanded per head, vLLM's MLAAttentionSpec the latent (kv_lora_rank + "
            "qk_rope_head_dim per token), so the cache layers do not give vLLM's KV bytes")
    with TRACE_LOCK:
        model = _built(text, dtype, "eager")
        meta = torch.device("meta")
        cache = _new_cache(model)
        kw = {_cache_kw(model): cache} if cache is not None else {}
        before = _module_state(model)
        name = type(model).__name__
        try:
            with torch.no_grad():
                _experts(model, "grouped_mm")
                ids = torch.zeros(1, LAYOUT_TOKENS, dtype=torch.long, device=meta)
                out = model(input_ids=ids, position_ids=torch.zeros_like(ids), use_cache=True,
                            logits_to_keep=1, **kw)
            cache = _returned_cache(out, model, cache)  # a cache filled in place is the one
            held = _held_state(model, before)
        except _OwnHooks:
            raise ValueError(f"{name} carries its decoding state under a name of its own, not "
                             f"in a transformers cache, so no cache layers give vLLM's layout"
                             ) from None
        except Exception as e:  # the model's own code refuses, or cannot run on meta
            raise ValueError(f"transformers' {name} could not run a prefill on "
                             f"the meta device to fill its cache: {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:300]}") from None
        finally:
            _reset_module_state(model, before)
        if held:
            raise ValueError(f"{name} keeps part of its decoding state in its layers, not in "
                             f"its transformers cache, so the cache's layers do not give "
                             f"vLLM's layout")
    return _read_layers(cache, cfg, name, transformers.__version__)


_KV_ONLY = {"DynamicLayer", "DynamicSlidingWindowLayer"}
_STATE_ONLY = {"LinearAttentionLayer"}
_BOTH = {"LinearAttentionAndFullAttentionLayer", "LinearAttentionAndSlidingWindowAttentionLayer"}
_NOTHING = {"DummyLayer"}


def _read_layers(cache: Any, cfg: Any, model_class: str, version: str) -> TracedLayout:
    """KVLayout of a filled cache (one request): each layer by its class (module docstring)."""
    import torch

    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list) or not layers:
        raise ValueError(f"{model_class} keeps its own cache ({type(cache).__name__}) rather "
                         "than transformers' cache layers, so its per-token KV is not read here")
    types = _layer_types(cfg, len(layers))
    classes: dict[str, int] = {}
    per_token: set[int] = set()
    windows: set[int] = set()
    full = sliding = chunked = states = state_bytes = 0
    dtypes: set[str] = set()
    for layer, kind in zip(layers, types, strict=True):
        name = type(layer).__name__
        classes[name] = classes.get(name, 0) + 1
        if name not in _KV_ONLY | _STATE_ONLY | _BOTH | _NOTHING:
            raise ValueError(f"{model_class}'s cache has a {name} layer, whose vLLM cache "
                             "layout is not read here (the cache layers read are "
                             f"{', '.join(sorted(_KV_ONLY | _STATE_ONLY | _BOTH))})")
        if name in _KV_ONLY | _BOTH:
            k, v = layer.keys, layer.values
            if not isinstance(k, torch.Tensor) or k.dim() != 4 or k.shape[-2] == 0:
                raise ValueError(f"{model_class}'s {name} held no K/V after a prefill")
            per_token.add(k.numel() // k.shape[-2] + v.numel() // v.shape[-2])
            if "Sliding" in name and kind != "chunked_attention":
                sliding += 1
                windows.add(int(layer.sliding_window))
            else:
                full += 1
                chunked += kind == "chunked_attention"
        if name in _STATE_ONLY | _BOTH:
            held = [t for t in (*layer.conv_states.values(), *layer.recurrent_states.values())
                    if isinstance(t, torch.Tensor)]
            states += 1
            state_bytes += sum(t.numel() * t.element_size() for t in held)
            dtypes.update(str(t.dtype).removeprefix("torch.") for t in held)
    if not per_token:
        raise ValueError(f"{model_class} has no attention layer: vLLM holds one state per "
                         "request and no KV blocks, which this page does not model")
    if len(per_token) > 1:
        raise ValueError(f"{model_class}'s attention layers cache different sizes per token "
                         f"({', '.join(f'{n:,}' for n in sorted(per_token))} elements): vLLM's "
                         "unification of their page sizes is not modelled")
    if len(windows) > 1:
        raise ValueError(f"{model_class}'s sliding layers have several windows "
                         f"({sorted(windows)}); one is modelled")
    layout = KVLayout(full_layers=full, sliding_layers=sliding,
                      window=windows.pop() if windows else None,
                      elements_per_token=per_token.pop(), state_layers=states,
                      state_bytes=state_bytes, chunked_layers=chunked)
    return TracedLayout(layout, model_class, classes, tuple(sorted(dtypes)), version)


@dataclass(frozen=True)
class TracedProfile:
    """The profile run's work traced in transformers' modules (module docstring)."""

    tokens: int
    rows: int
    attention: str  # "sdpa" (torch's choice, fused) or "eager" where SDPA cannot run
    dtype: str
    activation_bytes: int  # the forward's or the logits' peak above the weights, + cuBLAS
    at_peak: tuple[tuple[str, int, int], ...]
    model_class: str
    seconds: float
    note: str = ""


def trace_profile_run(d: dict, tokens: int, rows: int, dtype: str = "bf16") -> TracedProfile:
    """The activation bound of vLLM's profile run for config dict `d` (module docstring):
    ValueError names why it cannot be traced."""
    t = check_int("max_num_batched_tokens", tokens, 1, MAX_SEQ_LEN)
    r = min(check_int("max_num_seqs", rows, 1, MAX_BATCH), t)
    if dtype not in TRACE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: the trace runs {tuple(TRACE_DTYPES)}")
    return _profile(json.dumps(d, sort_keys=True), t, r, dtype)


@lru_cache(maxsize=64)
def _profile(text: str, t: int, r: int, dtype: str) -> TracedProfile:
    from attnmem.calc.backends import NoKernel

    t0 = time.perf_counter()
    note = ""
    try:
        events, cls = _record_profile(text, t, r, dtype, "sdpa")
        attention = "sdpa"
    except (NoKernel, ValueError) as err:
        if isinstance(err, ValueError) and "scaled_dot_product_attention" not in str(err):
            raise
        # the model's class takes no SDPA (or torch has no fused kernel for it): transformers
        # runs it eager, which holds the scores: a much looser bound, said so
        events, cls = _record_profile(text, t, r, dtype, "eager")
        attention = "eager"
        note = ("traced with transformers' eager attention (its s x s scores: a loose bound), "
                "as SDPA cannot run it: " + " ".join(str(err).split())[:200])
    top = replay(events)["forward"]
    at_peak = tuple(sorted(((k, c, b) for k, (c, b) in top.at_peak.items()),
                           key=lambda x: -x[2]))
    return TracedProfile(t, r, attention, dtype, top.peak + CUBLAS_WORKSPACE_BYTES, at_peak,
                         cls, time.perf_counter() - t0, note)


def _record_profile(text: str, t: int, r: int, dtype: str, attention: str
                    ) -> tuple[list, str]:
    import contextlib

    import torch

    from attnmem.calc.backends import NoKernel
    from attnmem.trace.fake_attention import sdpa_as
    from attnmem.trace.masks import unpacked_rows

    with TRACE_LOCK:
        model = _built(text, dtype, attention)
        rec = Recorder(values=True)
        rec.known(*model.parameters(), *model.buffers())
        meta = torch.device("meta")
        fake = sdpa_as(attention) if attention != "eager" else contextlib.nullcontext()
        # vLLM's profile run keeps the dummy run's hidden states (t, h) while its sampler runs
        # (gpu_model_runner.py profile_run: _dummy_run's output, then _dummy_sampler_run):
        # the base model's last hidden state is held here until the logits are done
        held: list = []
        hook = model.base_model.register_forward_hook(
            lambda _m, _a, o: held.append(o[0] if isinstance(o, tuple) else
                                          getattr(o, "last_hidden_state", o)))
        try:
            # one sequence of positions 0..t-1 (vLLM's dummy run is one batch of t tokens):
            # masking_utils' packed-rows check reads values, so it is answered as on the GPU
            with torch.no_grad(), unpacked_rows(), rec.track_modules(model), fake, rec, \
                    loop_guard(rec, model):
                _experts(model, "grouped_mm")
                rec.mark("forward")
                ids = torch.zeros(1, t, dtype=torch.long, device=meta)
                pos = torch.zeros(1, t, dtype=torch.long, device=meta)
                out = model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=r)
                del ids, pos
                logits = out.logits.to(copy=True, dtype=torch.float32)  # the sampler's fp32
                del out, logits
                held.clear()
                rec.mark("end")
        except (NoKernel, TraceTooSlow):
            raise
        except Exception as e:
            raise ValueError(f"transformers' {type(model).__name__} could not run the profile "
                             f"forward on the meta device: {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:300]}") from None
        finally:
            hook.remove()
            held.clear()
        return list(rec.events), type(model).__name__


@dataclass(frozen=True)
class TracedServing:
    """Serving capacity of a model outside calc's rules, each figure with its source."""

    capacity: ServingCapacity
    layout: TracedLayout
    weights_bytes: int
    param_count: int
    profile: TracedProfile | None
    activation_from: str  # FROM_BOUND (traced), FROM_GIVEN (vLLM's log) or FROM_NONE
    activation_refused: str  # why the trace could not give it ("" where it did)
    sources: dict[str, str] = field(default_factory=dict)  # part -> where it came from

    @property
    def capacity_is_upper_bound(self) -> bool:
        """No activation peak is in the budget: the pool, blocks and requests are at most."""
        return self.activation_from == FROM_NONE

    @property
    def capacity_is_lower_bound(self) -> bool:
        """The activation term is the trace's upper bound, or chunked layers are counted as
        full attention: the pool, blocks and requests are at least these."""
        return self.activation_from == FROM_BOUND or self.layout.layout.chunked_layers > 0


def traced_serving(d: dict, gpu_bytes: int | str, seq_len: int, *, weight_dtype: str = "bf16",
                   kv_dtype: str = "bf16",
                   gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                   block_size: int = DEFAULT_BLOCK_SIZE,
                   max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                   max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                   cuda_graph_bytes: int = DEFAULT_CUDA_GRAPH_BYTES,
                   non_torch_bytes: int = DEFAULT_NON_TORCH_BYTES,
                   activation_bytes: int | None = None,
                   cuda_graphs_in_budget: bool = True) -> TracedServing:
    """attnmem.calc.serving_capacity's answer for config dict `d`, counted from transformers'
    modules (module docstring). ValueError names a bad input or what cannot be counted (the
    weights or the KV layout); an activation peak that cannot be traced is not an error: the
    answer then says so and its capacity is an upper bound."""
    from attnmem.trace.weights import trace_weights

    p = pool_settings(gpu_bytes, seq_len, gpu_memory_utilization, block_size,
                      max_num_batched_tokens, max_num_seqs, cuda_graph_bytes, non_torch_bytes,
                      cuda_graphs_in_budget)
    wd = dtype_name(weight_dtype) if isinstance(weight_dtype, str) else weight_dtype
    if wd not in WEIGHT_BYTES:
        raise ValueError(f"weights {weight_dtype!r:.40}: the trace prices weights at "
                         f"{', '.join(WEIGHT_BYTES)} (a quantized checkpoint's stored bytes are "
                         "counted by calc's rules only)")
    kvd = dtype_name(kv_dtype)
    w = trace_weights(d)
    weights = w.weight_bytes(WEIGHT_BYTES[wd])
    layout = trace_kv_layout(d, wd)
    lay = layout.layout
    version = layout.transformers_version
    kv_src = (f"{FROM_TRACE}: {lay.elements_per_token:,} K+V elements per token in each of "
              f"{lay.attention_layers} attention layers, read from {layout.model_class}'s "
              f"cache layers ({', '.join(f'{n} {c}' for c, n in layout.layer_classes.items())}) "
              f"after a prefill on the meta device (transformers {version}), at {kvd} as vLLM "
              "pages them")
    if lay.chunked_layers:
        kv_src += (f"; {lay.chunked_layers} chunked-attention layers counted as full attention "
                   "(vLLM without its hybrid KV cache manager; with it they keep at most chunk + "
                   "max_num_batched_tokens tokens: more requests than shown)")
    sources = {
        "weights": f"{FROM_TRACE}: {w.param_count:,} parameters of {w.model_class} built on the "
                   f"meta device, at {wd}, plus its buffers (transformers {w.transformers_version})",
        "KV cache": kv_src,
    }
    if lay.state_layers:
        sources["state"] = (
            f"{FROM_TRACE}: the conv and recurrent states of {lay.state_layers} layers as "
            f"transformers' cache holds them for one request ({', '.join(layout.state_dtypes)}); "
            "vLLM keeps the conv state one column shorter, the recurrent state in "
            "mamba_ssm_cache_dtype, and pads a state page to the attention page (not modelled)")
    profile, refused = None, ""
    if activation_bytes is not None:
        act, act_from = activation_bytes, FROM_GIVEN
        sources["activation peak"] = f"{FROM_GIVEN}: the figure of vLLM's start-up log"
    else:
        try:
            profile = trace_profile_run(d, p.batched_tokens, p.max_num_seqs, wd)
        except ValueError as err:  # NoKernel too: the term is refused, the KV still counted
            refused = " ".join(str(err).split())[:400]
        except Exception as err:  # the model's code failed on meta: said, never a traceback
            refused = (f"the trace failed in the model's code ({type(err).__name__}: "
                       f"{' '.join(str(err).split())[:300]})")
        if profile is not None:
            act, act_from = profile.activation_bytes, FROM_BOUND
            sources["activation peak"] = (
                f"{FROM_BOUND}: transformers' {profile.model_class} traced on the meta device "
                f"over {profile.tokens:,} tokens with the logits of {profile.rows:,} rows and "
                f"their fp32 copy ({profile.attention}; cuBLAS workspace included): vLLM's own "
                "fused modules hold less in its profile run, so its figure is lower"
                + (f"; {profile.note}" if profile.note else ""))
        else:
            act, act_from = 0, FROM_NONE
            sources["activation peak"] = (f"{FROM_NONE}: {refused}; the capacity shown is an "
                                          "upper bound (give vLLM's logged figure to count it)")
    cap = layout_capacity(lay, p, weights, act, act_from != FROM_GIVEN, kvd)
    return TracedServing(cap, layout, weights, w.param_count, profile, act_from, refused,
                         sources)
