"""generate()'s peak for any causal LM transformers builds, traced on the meta device.

What is predicted is what the inference measurement records (attnmem/measure/infer/
procedure.py, the same as attnmem.calc.inference_step): `max_memory_allocated()` over
`generate(input_ids, attention_mask, max_new_tokens=N, min_new_tokens=N, do_sample=False)` of
the model in bf16 (or fp16/fp32) after a warm-up: the weights and buffers, cuBLAS's workspace,
the inputs, the cache and the transients of the highest moment.

How: the model's own code runs on the meta device (`AutoModelForCausalLM.from_config` under
`torch.device("meta")`: shapes, dtypes and storage sizes, no memory), under
attnmem.trace.recorder.Recorder, which lists every storage made and freed in program order.
The events go through attnmem.calc.allocator (the CUDA caching allocator's blocks), so every
tensor counts as the block it would get. The parts a CPU or meta run does not show are the
rules calc already has:

- fused SDPA backends: attnmem.trace.fake_attention stands in for the call (transformers' own
  `sdpa_attention_forward` still decides repeat_kv, enable_gqa and the mask);
- cuBLAS's workspace (attnmem.calc.inference_step.CUBLAS_WORKSPACE_BYTES), made by the
  warm-up's first matmul and held;
- MoE experts as CUDA runs them (generation/utils.py `_optimize_model_for_decode`):
  `grouped_mm` for the prefill, `batched_mm` for decode, where the model lets the experts'
  implementation be set.

generate() itself is driven by hand, as its loop does (generation/utils.py `_sample`): it stops
at data-dependent checks on meta tensors. Each forward gets `input_ids`, `position_ids` (B, c)
int64 and `logits_to_keep=1`, the cache the first forward makes, and generate's own tensors
are made as it makes them: the int64 attention mask (B, tokens), the fp32 copy of the last
logits, the argmax, the ids grown by `torch.cat` each step. No mask tensor is passed to the
model: an all-ones mask is what a tokenizer gives for unpadded text, and masking_utils treats
it as no mask (`_ignore_causal_mask_sdpa`), so the model's masks are the same.

Phases: "prefill" (the prompt's forward and its logits) and "decode": the last decode step,
whose cache is the longest. For N ≥ 3 the cache before that step is made by an unreported
prefill of s + N − 3 tokens and one unreported decode step, so that sliding-window layers hold
their window, as they do after the first real decode step.
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from attnmem.calc.backends import NoKernel
from attnmem.calc.inference_step import CUBLAS_WORKSPACE_BYTES
from attnmem.calc.units import MAX_BATCH, MAX_SEQ_LEN, check_int
from attnmem.trace.fake_attention import SDPA_BACKENDS, sdpa_as
from attnmem.trace.masks import unpacked_rows
from attnmem.trace.recorder import PhasePeak, Recorder, replay

#: What the trace runs: transformers' eager attention as it is, or SDPA with a backend.
TRACE_ATTENTIONS = ("eager", *SDPA_BACKENDS)
TRACE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class TracedInference:
    """generate()'s memory traced on the meta device; bytes are absolute unless named."""

    model_class: str
    batch: int
    prompt_len: int
    new_tokens: int
    attention: str
    dtype: str
    weights_bytes: int  # parameters and buffers as the model holds them
    fixed_bytes: int  # cuBLAS workspace
    prefill_peak_bytes: int
    decode_peak_bytes: int | None  # None with one new token
    kv_cache_bytes: int  # every storage the cache holds after the last step
    at_peak: tuple[tuple[str, int, int], ...]  # (where|op, tensors, bytes) at the peak, largest first
    peak_phase: str
    seconds: float
    transformers_version: str

    @property
    def peak_bytes(self) -> int:
        return max(self.prefill_peak_bytes, self.decode_peak_bytes or 0)

    @property
    def activation_bytes(self) -> int:
        """The peak less weights, workspace and cache: inputs and transients."""
        return self.peak_bytes - self.weights_bytes - self.fixed_bytes - self.kv_cache_bytes


def _torch_dtype(dtype: str):
    import torch

    if dtype not in TRACE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: the trace runs {tuple(TRACE_DTYPES)}")
    return getattr(torch, TRACE_DTYPES[dtype])


@lru_cache(maxsize=8)
def _built(text: str, dtype: str, attn: str):
    """The model on meta (cached: building is most of a first answer's time)."""
    import torch
    from transformers import AutoModelForCausalLM

    from attnmem.trace.weights import _config

    cfg = _config(json.loads(text))
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=_torch_dtype(dtype),
                                                     attn_implementation=attn)
    except Exception as e:
        raise ValueError(f"transformers cannot build a causal LM from this "
                         f"'{cfg.model_type}' config: {' '.join(str(e).split())[:300]}"
                         ) from None
    return model.eval()


#: Seconds per token and layer of a trace for mixers whose torch fallback (used where their
#: CUDA kernels are absent, as on meta) loops in Python: transformers' reference selective scan
#: over every token (Jamba, 28 Mamba mixers: 418 s at 4,096 tokens on this 2-core host,
#: 2026-12-07) and the chunked gated delta rule over chunks of 64 tokens (Qwen3-Next, 36
#: layers: 54 s at 4,096 tokens, the host loaded). Matched on the class name of a module
#: that holds an A_log parameter.
SCAN_SECONDS_PER_TOKEN_LAYER = {"GatedDeltaNet": 0.0003, "Mixer": 0.004}
#: The longest a trace may be expected to take before it is refused instead of run.
MAX_TRACE_SECONDS = 30.0


def scan_cost(model) -> tuple[float, int]:
    """(seconds per token, layers) of the model's token-looping mixers (see above)."""
    per, n = 0.0, 0
    for m in model.modules():
        name = type(m).__name__
        if not hasattr(m, "A_log"):  # the state-space decay both kinds of mixer hold
            continue
        for frag, sec in SCAN_SECONDS_PER_TOKEN_LAYER.items():
            if name.endswith(frag):  # MambaMixer, Mamba2Mixer, BambaMixer, FalconH1Mixer, ...
                per, n = per + sec, n + 1
                break
    return per, n


def check_scan_cost(model, tokens: int) -> None:
    """ValueError where the model's token-looping mixers (Mamba's scan, the gated delta rule)
    would make the trace of `tokens` tokens take longer than MAX_TRACE_SECONDS."""
    per, n = scan_cost(model)
    est = per * tokens
    if est > MAX_TRACE_SECONDS:
        raise ValueError(
            f"{type(model).__name__} has {n} state-space or linear-attention layers, whose "
            f"torch fallback loops over the tokens on the meta device: about {est:,.0f} s to "
            f"trace {tokens:,} tokens, past the {MAX_TRACE_SECONDS:.0f} s a trace may take "
            f"here; the trace answers up to about {int(MAX_TRACE_SECONDS / per):,} tokens")


def _held_bytes(model) -> int:
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        st = t.untyped_storage()
        seen[id(st)] = st.nbytes()
    return sum(seen.values())


def _experts(model, impl: str) -> None:
    """Run MoE experts as `impl` where the model lets it be set (transformers >= 5.2x)."""
    can = getattr(model, "_can_set_experts_implementation", None)
    if can is not None and can() and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(impl)


def _cache_kw(model) -> str:
    """The forward's name for the cache: `cache` (transformers 5.25) or `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _new_cache(model) -> Any:
    """The cache generate() makes before the first forward (`_prepare_cache_for_generation`):
    a DynamicCache of the text config where the model takes one, else None (the model makes
    its own, as Mamba-style models do)."""
    from transformers import DynamicCache

    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if supports is not None and not supports():
        return None
    return DynamicCache(config=model.config.get_text_config(decoder=True))


def _cache_bytes(cache: Any) -> int:
    import torch

    seen: dict[int, int] = {}

    def walk(x: Any, depth: int) -> None:
        if isinstance(x, torch.Tensor):
            st = x.untyped_storage()
            seen[id(st)] = st.nbytes()
        elif depth < 3 and isinstance(x, (list, tuple)):
            for y in x:
                walk(y, depth + 1)
        elif depth < 3 and isinstance(x, dict):
            for y in x.values():
                walk(y, depth + 1)
        elif depth < 3 and hasattr(x, "__dict__"):
            for y in vars(x).values():
                walk(y, depth + 1)

    walk(cache, 0)
    return sum(seen.values())


def trace_inference(d: dict, batch: int, prompt_len: int, new_tokens: int = 1,
                    attention: str = "sdpa", dtype: str = "bf16") -> TracedInference:
    """generate()'s peak for the causal LM that config dict `d` describes (see the module
    docstring); ValueError names a bad input or why transformers cannot build the model, and
    attnmem.calc.backends.NoKernel why a forced SDPA backend has no kernel for a call."""
    b = check_int("batch", batch, 1, MAX_BATCH)
    s = check_int("prompt_len", prompt_len, 1, MAX_SEQ_LEN)
    n = check_int("new_tokens", new_tokens, 1, MAX_SEQ_LEN - s)
    if attention not in TRACE_ATTENTIONS:
        raise ValueError(f"attention {attention!r}: the trace runs {TRACE_ATTENTIONS}")
    _torch_dtype(dtype)
    return _trace(json.dumps(d, sort_keys=True), b, s, n, attention, dtype)


@dataclass(frozen=True)
class Recorded:
    """One traced generate(): the storage events (attnmem.trace.recorder) and what the replay
    needs besides them."""

    events: tuple
    weights_bytes: int
    cache_bytes: int
    model_class: str


@lru_cache(maxsize=256)
def _trace(text: str, b: int, s: int, n: int, attention: str, dtype: str) -> TracedInference:
    from attnmem.trace.layer_blocks import record as record_deep  # a few layers where exact

    t0 = time.perf_counter()
    rec = record_deep(text, b, s, n, attention, dtype)
    return result(rec, b, s, n, attention, dtype, time.perf_counter() - t0)


def result(rec: Recorded, b: int, s: int, n: int, attention: str, dtype: str,
           seconds: float) -> TracedInference:
    """TracedInference of recorded events: replayed through the caching allocator."""
    import transformers

    phases = replay(list(rec.events))
    base = rec.weights_bytes + CUBLAS_WORKSPACE_BYTES
    pre = phases["prefill"]
    dec: PhasePeak | None = phases.get("decode")
    top = dec if dec is not None and dec.peak > pre.peak else pre
    at_peak = tuple(sorted(((k, c, by) for k, (c, by) in top.at_peak.items()),
                           key=lambda x: -x[2]))
    return TracedInference(
        model_class=rec.model_class, batch=b, prompt_len=s, new_tokens=n,
        attention=attention, dtype=dtype, weights_bytes=rec.weights_bytes,
        fixed_bytes=CUBLAS_WORKSPACE_BYTES, prefill_peak_bytes=base + pre.peak,
        decode_peak_bytes=None if dec is None else base + dec.peak,
        kv_cache_bytes=rec.cache_bytes, at_peak=at_peak, peak_phase=top.name,
        seconds=seconds, transformers_version=transformers.__version__)


def _returned_cache(out: Any, model: Any) -> Any:
    """The cache a forward returns (5.25's `cache`, 5.17's `past_key_values`), or None for a
    model whose forward takes no cache at all (GPT-1): generate() then feeds the whole sequence
    each step, as the caller does. Refused, since their steps would be traced without the state
    generate() keeps: a recurrent state under another name (RWKV's `state`), and a forward that
    takes a cache but returns none (RecurrentGemma and XLM keep theirs inside the model or in
    the object they were given)."""
    if "cache" in out:
        return out["cache"]
    if "past_key_values" in out:
        return out["past_key_values"]
    name = type(model).__name__
    for other in ("state", "cache_params"):
        if other in out:
            raise ValueError(f"{name} returns its cache as `{other}`, which this trace "
                             f"does not pass back to the model")
    takes = set(inspect.signature(model.forward).parameters) & {"cache", "past_key_values"}
    if takes:
        raise ValueError(f"{name} takes a cache (`{takes.pop()}`) but returns none: it keeps "
                         f"its decoding state where this trace does not follow it")
    return None


def past_positions(config: Any, tokens: int) -> str:
    """Where a failed run had more tokens than the config's position limit, the likely cause
    ("" otherwise): learned position embeddings (GPT-1, ProphetNet, BERT-style decoders) have
    no row past it, so the model cannot run such a prompt at all."""
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        limit = getattr(config, key, None)
        if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < tokens:
            return (f"; {tokens:,} tokens are past the model's {key} ({limit:,}): a model with "
                    f"learned position embeddings cannot run them; give a prompt of at most "
                    f"{limit:,} tokens with the new ones")
    return ""


#: One trace at a time per process: a trace hooks the cached model's modules and patches
#: F.scaled_dot_product_attention, so two at once (Streamlit sessions are threads; the length
#: model's background traces) would record each other's tensors.
TRACE_LOCK = threading.RLock()


def record(text: str, b: int, s: int, n: int, attention: str, dtype: str) -> Recorded:
    """Run generate()'s steps on the meta device (module docstring) and keep the events."""
    with TRACE_LOCK:
        return _record(text, b, s, n, attention, dtype)


def _record(text: str, b: int, s: int, n: int, attention: str, dtype: str) -> Recorded:
    import contextlib

    import torch

    model = _built(text, dtype, "eager" if attention == "eager" else "sdpa")
    check_scan_cost(model, s + (s + n - 3 if n >= 3 else 0) + 2)
    cache_kw = _cache_kw(model)
    rec = Recorder()
    rec.known(*model.parameters(), *model.buffers())
    meta = torch.device("meta")
    fake = sdpa_as(attention) if attention != "eager" else contextlib.nullcontext()
    state: dict[str, Any] = {}

    def forward(ids: Any, cache: Any) -> Any:
        pos = torch.zeros(ids.shape, dtype=torch.long, device=meta)
        kw = {cache_kw: cache} if cache is not None else {}
        return model(input_ids=ids, position_ids=pos, use_cache=True, logits_to_keep=1, **kw)

    def step(ids: Any, mask: Any, cache: Any, first: bool = False) -> tuple[Any, Any, Any]:
        """One generate() iteration: the forward (the whole prompt when `first`, else the
        last token), the fp32 last logits, argmax, cat."""
        feed = ids if first or cache is None else ids[:, -1:]
        out = forward(feed, cache)
        cache = _returned_cache(out, model)
        logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
        del out
        nxt = logits.argmax(-1)
        del logits
        ids = torch.cat([ids, nxt[:, None]], dim=-1)
        mask = torch.cat([mask, torch.ones(b, 1, dtype=torch.long, device=meta)], dim=-1)
        return ids, mask, cache

    try:
        with torch.no_grad(), unpacked_rows(), rec.track_modules(model), fake, rec:
            _experts(model, "grouped_mm")
            rec.mark("prefill")
            ids = torch.zeros(b, s, dtype=torch.long, device=meta)
            mask = torch.ones(b, s, dtype=torch.long, device=meta)
            ids, mask, cache = step(ids, mask, _new_cache(model), first=True)
            if n >= 2:
                _experts(model, "batched_mm")
                if n >= 3:
                    rec.mark("setup")
                    del ids, mask, cache
                    ids = torch.zeros(b, s + n - 3, dtype=torch.long, device=meta)
                    mask = torch.ones(b, s + n - 3, dtype=torch.long, device=meta)
                    _experts(model, "grouped_mm")
                    ids, mask, cache = step(ids, mask, _new_cache(model), first=True)
                    _experts(model, "batched_mm")
                    ids, mask, cache = step(ids, mask, cache)
                rec.mark("decode")
                ids, mask, cache = step(ids, mask, cache)
            state["cache"] = _cache_bytes(cache)
            rec.mark("end")
            del ids, mask, cache
    except NoKernel:
        raise
    except Exception as e:  # the model's own code refuses these inputs, or cannot run on meta
        raise ValueError(f"transformers' {type(model).__name__} could not run generate()'s "
                         f"forward on the meta device: {type(e).__name__}: "
                         f"{' '.join(str(e).split())[:300]}"
                         f"{past_positions(model.config, s + n)}") from None
    finally:
        _experts(model, "grouped_mm")
    return Recorded(tuple(rec.events), _held_bytes(model), state["cache"],
                    type(model).__name__)
