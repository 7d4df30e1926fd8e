"""The command line for models calc's rules do not answer: generate() traced on the meta device
(attnmem.trace), from --model's config.json (a preset's published one, a file or a Hub id).
Imported after the arguments are parsed; torch and transformers are imported only to trace."""

from __future__ import annotations

import argparse
from typing import Any

from attnmem.cli.common import UsageError, _names_a_file, resolve_gpu


def _raw_config(spec: str) -> dict | None:
    """config.json of --model as a dict: a preset's published one, a file, or a Hub id's."""
    import copy
    from pathlib import Path

    from attnmem.calc.config_json import MAX_CONFIG_BYTES, load_config_json
    from attnmem.calc.presets import PRESET_HF_CONFIGS
    from attnmem.hub import fetch_config_dict, looks_like_repo_id

    folded = {name.lower(): name for name in PRESET_HF_CONFIGS}
    if spec.lower() in folded:  # a preset: its published config.json
        return copy.deepcopy(PRESET_HF_CONFIGS[folded[spec.lower()]][1])
    path = Path(spec).expanduser()
    if path.is_file():
        with open(path, "rb") as f:
            return load_config_json(f, max_bytes=MAX_CONFIG_BYTES)
    if not _names_a_file(spec) and looks_like_repo_id(spec):
        return fetch_config_dict(spec)
    return None



class _LowerBound(Exception):
    """calc's rules give only a lower bound for this model (the reason): trace it instead."""



def _config_to_trace(a: argparse.Namespace, no_rules: BaseException) -> dict | None:
    """--model's config.json as a dict, for the trace of a model calc has no rules for; None
    where --model names no file or Hub id to trace (calc's refusal then stands). UsageError
    (with calc's reason) where torch or transformers, which the trace runs, are not here."""
    try:
        d = _raw_config(a.model)
    except (OSError, ValueError):
        return None
    if d is None:
        return None
    try:
        import attnmem.trace.inference  # noqa: F401  (imports torch and transformers)
    except ImportError as err:  # the bare CLI install: no torch or transformers
        raise UsageError(f"{no_rules}; tracing the model instead needs torch and transformers "
                         f"({err})") from None
    return d



def _trace_counted_from(t: Any, d: dict, lower_bound: str = "") -> str:
    """The "counted from" line of a traced answer (after "counted from the ")."""
    why = (f"calc's rules give only a lower bound: {lower_bound}" if lower_bound else
           f"calc has no rules for model_type {d.get('model_type')!r}")
    return (f"trace: transformers {t.transformers_version}'s {t.model_class} run on the meta "
            f"device, fused attention per attnmem.calc.peak ({why})")



def _trained_context_of(d: dict) -> int | None:
    """max_position_embeddings of a config dict (its text_config's for a multimodal one)."""
    inner = d.get("text_config")
    got = d.get("max_position_embeddings") or (
        inner.get("max_position_embeddings") if isinstance(inner, dict) else None)
    return got if isinstance(got, int) and not isinstance(got, bool) else None



def _traced_memory(a: argparse.Namespace, no_rules: BaseException) -> dict | None:
    """`attnmem memory` for a model calc has no rules for: generate()'s peak traced on the
    meta device (attnmem.trace.inference), or None where there is no config to trace. A trace
    that cannot run raises ValueError with both reasons."""
    from attnmem.calc.backends import NoKernel
    from attnmem.calc.memory import INFERENCE_IMPL

    d = _config_to_trace(a, no_rules)
    if d is None:
        return None
    from attnmem.trace.generate import trace_inference
    from attnmem.trace.inference import TRACE_ATTENTIONS

    attention = INFERENCE_IMPL.get(a.impl, a.impl)
    if attention not in TRACE_ATTENTIONS:
        raise UsageError(f"{no_rules}; the trace runs --impl {', '.join(TRACE_ATTENTIONS)} "
                         f"(naive as eager), got --impl {a.impl!r}")
    if a.weight_dtype != a.act_dtype or a.kv_dtype != a.act_dtype:
        raise UsageError(f"{no_rules}; the trace runs the model in one dtype: give the same "
                         f"--weight-dtype, --kv-dtype and --act-dtype (got {a.weight_dtype}, "
                         f"{a.kv_dtype}, {a.act_dtype})")
    counted_as = ""
    try:
        try:
            t = trace_inference(d, a.batch, a.seq_len, 1, attention=attention,
                                dtype=a.act_dtype)
        except NoKernel as err:
            # as calc's model_memory does: count generate() as transformers runs it by default
            # (SDPA, torch choosing the backend), and say so
            t = trace_inference(d, a.batch, a.seq_len, 1, attention="sdpa", dtype=a.act_dtype)
            counted_as = f"counted as SDPA with torch's choice of backend: {err}"
        except ValueError as err:
            if attention == "eager" or "scaled_dot_product_attention" not in str(err):
                raise
            # the model's class takes no SDPA (gpt-oss: its sinks): transformers runs it eager
            t = trace_inference(d, a.batch, a.seq_len, 1, attention="eager", dtype=a.act_dtype)
            counted_as = ("counted as transformers' eager attention: "
                          + " ".join(str(err).split())[:200])
    except NoKernel as err:
        raise UsageError(f"--impl {a.impl}: {err}") from None
    except ValueError as err:
        raise UsageError(f"{no_rules}; and the trace: {err}") from None
    gpu = resolve_gpu(a.gpu)
    trained = _trained_context_of(d)
    longest, how = None, ""
    if a.longest:
        from attnmem.calc.units import MAX_SEQ_LEN
        from attnmem.trace.lengths import longest_prompt

        longest, how = longest_prompt(d, a.batch, 1, t.attention, a.act_dtype, gpu,
                                      MAX_SEQ_LEN - 1)
    return {"model": str(a.model)[:200], "model_class": t.model_class, "batch": t.batch,
            "seq_len": t.prompt_len, "impl": a.impl, "dtype": t.dtype,
            "weights_bytes": t.weights_bytes, "kv_cache_bytes": t.kv_cache_bytes,
            "workspace_bytes": t.fixed_bytes, "activation_bytes": t.activation_bytes,
            "total_bytes": t.peak_bytes, "peak_phase": t.peak_phase,
            "at_peak": [list(x) for x in t.at_peak[:8]], "gpu": a.gpu, "gpu_bytes": gpu,
            "fits": t.peak_bytes <= gpu, "trained_context": trained,
            "seq_len_past_trained_context": bool(trained and a.seq_len > trained),
            "longest_context": longest, "longest_context_how": how,
            "counted_as": counted_as,
            "counted_from": _trace_counted_from(
                t, d, str(no_rules) if isinstance(no_rules, _LowerBound) else ""),
            "trace_seconds": round(t.seconds, 2)}


def _traced_serve(a: argparse.Namespace, no_rules: BaseException) -> dict | None:
    """`attnmem serve` for a model calc has no rules for: vLLM's KV pool counted from
    transformers' own modules (attnmem.trace.serving: weights and the cache layers traced, the
    activation peak a traced upper bound or --activation-bytes), or None where there is no
    config to trace. What cannot be counted is refused with both reasons."""
    from dataclasses import asdict

    d = _config_to_trace(a, no_rules)
    if d is None:
        return None
    from attnmem.trace.serving import traced_serving

    if a.act_dtype != a.weight_dtype:
        raise UsageError(f"{no_rules}; the trace runs the model in one dtype: give the same "
                         f"--weight-dtype and --act-dtype (got {a.weight_dtype}, {a.act_dtype})")
    try:
        r = traced_serving(
            d, resolve_gpu(a.gpu), a.seq_len, weight_dtype=a.weight_dtype, kv_dtype=a.kv_dtype,
            gpu_memory_utilization=a.gpu_memory_utilization, block_size=a.block_size,
            max_num_batched_tokens=a.max_num_batched_tokens, max_num_seqs=a.max_num_seqs,
            cuda_graph_bytes=a.cuda_graph_bytes, non_torch_bytes=a.non_torch_bytes,
            activation_bytes=a.activation_bytes)
    except ValueError as err:
        raise UsageError(f"{no_rules}; and the trace: {err}") from None
    except Exception as err:  # the model's own code on meta: said, never a traceback
        raise UsageError(f"{no_rules}; and the trace failed in the model's code "
                         f"({type(err).__name__}: {' '.join(str(err).split())[:300]})") from None
    cap, lay = r.capacity, r.layout.layout
    trained = _trained_context_of(d)
    return {"model": str(a.model)[:200], "model_class": r.layout.model_class, "gpu": a.gpu,
            **asdict(cap), "concurrent_sequences": cap.concurrent_sequences,
            "params": r.param_count, "kv_layers": lay.attention_layers,
            "sliding_layers": lay.sliding_layers, "sliding_window": lay.window,
            "chunked_layers_as_full": lay.chunked_layers,
            "kv_elements_per_token_per_layer": lay.elements_per_token,
            "state_layers": lay.state_layers, "state_bytes_per_request": lay.state_bytes,
            "activation_from": r.activation_from, "activation_refused": r.activation_refused,
            "capacity_is_upper_bound": r.capacity_is_upper_bound,
            "capacity_is_lower_bound": r.capacity_is_lower_bound,
            "trained_context": trained, "sources": r.sources,
            "counted_from": (f"trace: transformers {r.layout.transformers_version}'s "
                             f"{r.layout.model_class} on the meta device (calc has no rules for "
                             f"model_type {d.get('model_type')!r}); vLLM's accounting from "
                             "attnmem.calc.serving_layout"),
            "trace_seconds": round(r.profile.seconds, 2) if r.profile else None}
