"""calc's prediction for an inference configuration: ``calc.inference_step(
ModelConfig.from_hf_config(config), batch, prompt_len, new_tokens, attention=...,
weight_dtype="bf16", kv_dtype="bf16", cache=..., prefill_chunk=...)`` (``predict``; the
procedure's step 7, attnmem.measure.infer.procedure). When calc lacks it or refuses the case
the predicted columns are empty and the message says why. ``rel_error``: the rows'
(predicted - measured) / measured.

No torch or transformers at import time (calc and the trace are imported when asked).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnmem.measure.infer.config import InferConfig
from attnmem.measure.model_common import short_error

_PREDICTED = ("predicted_peak_bytes", "predicted_prefill_peak_bytes", "predicted_cache_bytes",
              "predicted_peak_phase")


def _inference_step() -> Callable[..., Any]:
    """calc's inference_step function (raises ImportError or AttributeError when missing)."""
    import importlib
    import types

    from attnmem import calc

    fn = getattr(calc, "inference_step", None)
    if fn is None or isinstance(fn, types.ModuleType):
        fn = importlib.import_module("calc.inference_step").inference_step
    return fn


#: What the trace runs (attnmem.trace.inference.TRACE_ATTENTIONS, written out so that this
#: module imports no torch): transformers' eager attention, SDPA as torch picks the backend,
#: and SDPA with one backend forced.
TRACE_ATTENTIONS = ("eager", "sdpa", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn")


def trace_case(cfg: InferConfig) -> str:
    """Why the meta-device trace cannot predict cfg ('' when it can)."""
    if cfg.cache != "dynamic":
        return f"the trace runs the dynamic cache only, not {cfg.cache!r}"
    if cfg.prefill_chunk is not None:
        return "the trace runs the whole prompt in one prefill, not chunks"
    if cfg.attention not in TRACE_ATTENTIONS:
        return f"the trace runs {', '.join(TRACE_ATTENTIONS)}, not {cfg.attention!r}"
    return ""


def traced(cfg: InferConfig, config_dict: dict[str, Any]) -> dict[str, Any]:
    """The predicted_* columns for cfg from attnmem.trace.generate.trace_inference (one trace:
    its prefill phase is the prefill run's peak, the whole prompt's forward and its logits).
    Raises what the trace raises (ValueError, NoKernel)."""
    from attnmem.trace.generate import trace_inference

    t = trace_inference(config_dict, cfg.batch, cfg.prompt_len, cfg.new_tokens,
                        attention=cfg.attention, dtype="bf16")
    return {"predicted_peak_bytes": int(t.peak_bytes),
            "predicted_prefill_peak_bytes": int(t.prefill_peak_bytes),
            "predicted_cache_bytes": int(t.kv_cache_bytes),
            "predicted_peak_phase": str(t.peak_phase)}


def _trace_fallback(cfg: InferConfig, config_dict: dict[str, Any], empty: dict[str, Any],
                    why_calc: str) -> tuple[dict[str, Any], str]:
    """The trace's prediction where calc's rules gave none (``why_calc``)."""
    cannot = trace_case(cfg)
    if cannot:
        return empty, f"no prediction: {why_calc}; {cannot}"
    try:
        return traced(cfg, config_dict), \
            f"predicted by the meta-device trace (calc: {why_calc})"
    except Exception as exc:  # noqa: BLE001 - a failed prediction never costs the measurement
        return empty, f"no prediction: {why_calc}; the trace: {short_error(exc, 200)}"


def predict(cfg: InferConfig, config_dict: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The predicted_* columns for cfg from attnmem.calc.inference_step, or from the meta-device
    trace where calc's rules refuse the model or the case (module docstring); empty and a
    reason when neither predicts it."""
    empty = {k: ("" if k == "predicted_peak_phase" else None) for k in _PREDICTED}
    try:
        from attnmem.calc import ModelConfig

        fn = _inference_step()
    except (ImportError, AttributeError) as exc:
        return empty, f"no prediction: calc has no inference_step ({short_error(exc, 200)})"
    try:
        model = ModelConfig.from_hf_config(config_dict, name=cfg.model)
        m = fn(model, cfg.batch, cfg.prompt_len, cfg.new_tokens, attention=cfg.attention,
               weight_dtype="bf16", kv_dtype="bf16", cache=cfg.cache,
               prefill_chunk=cfg.prefill_chunk)
        # The prefill run (step 4) makes one token: its own prediction (a static cache is
        # sized by the tokens asked for, so N matters even before the first decode step).
        one = m if cfg.new_tokens == 1 else fn(
            model, cfg.batch, cfg.prompt_len, 1, attention=cfg.attention, weight_dtype="bf16",
            kv_dtype="bf16", cache=cfg.cache, prefill_chunk=cfg.prefill_chunk)
        return {"predicted_peak_bytes": int(m.peak_bytes),
                "predicted_prefill_peak_bytes": int(one.peak_bytes),
                "predicted_cache_bytes": int(m.kv_cache_bytes),
                "predicted_peak_phase": str(m.peak_phase)}, ""
    except Exception as exc:  # noqa: BLE001 - a failed prediction never costs the measurement
        return _trace_fallback(cfg, config_dict, empty, short_error(exc, 200))


def rel_error(predicted: int | None, measured: int | None) -> float | None:
    """(predicted - measured) / measured, or None when either is missing."""
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured
