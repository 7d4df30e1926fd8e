"""calc's prediction for a training-step configuration: ``attnmem.calc.training_step(
ModelConfig.from_hf_config(config), batch, seq_len, attention=..., precision=...,
checkpointing=..., adapters=..., base_dtype=..., packed_lengths=..., optimizer=...,
kbit_prepare=..., liger=..., offload_activations=...)`` when calc has it (else empty, and the
message says why); packed lengths that calc's check_packed refuses (an attention without a
packed path, e.g. SDPA's flash backend) are a refusal as for LoRA, and so is any ValueError
for a configuration with a recipe lever (an optimizer other than AdamW, kbit_prepare, liger,
offload_activations; issue 43): calc's reason for not counting the combination (Liger on a
tied model, an 8-bit optimizer on a MoE, ...), recorded before any model is built.
With adapter lora, ``adapters=attnmem.calc.LoRA(rank, alpha, targets, dropout,
adapter_dtype)`` (``calc_lora``) and the configuration's base_dtype; a ValueError from attnmem.calc for
such a configuration is a refusal (``Prediction.refused``: what calc does not model, e.g.
autocast or Phi-3's fused projections with adapters), which the procedure records as
'unavailable' with calc's reason instead of measuring; a model calc cannot read at all is no
refusal (measured, without a prediction).

When calc's rules refuse the model or the case (an exception from
``ModelConfig.from_hf_config`` or ``training_step``: a type without rules, Llama 4), the
meta-device trace predicts it instead where it runs the case
(``attnmem.trace.training.trace_training``, issue 42: bf16 precision, no adapters, no packing,
eager or an SDPA backend), and the message says "predicted by the meta-device trace (calc:
<reason>)".

No torch or transformers at import time (calc and the trace are imported when asked).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from attnmem.measure.model_common import short_error
from attnmem.measure.train.config import TrainConfig


class Prediction(NamedTuple):
    peak: int | None
    before: int | None
    message: str  # '' when predicted
    refused: str | None = None  # calc's ValueError for a fine-tuning configuration


def calc_lora(cfg: TrainConfig) -> Any:
    """attnmem.calc.training_step.LoRA for cfg's adapter fields, None for full training."""
    if not cfg.lora:
        return None
    from attnmem.calc.training_step import LoRA

    return LoRA(cfg.rank, cfg.alpha, cfg.targets, cfg.lora_dropout, cfg.adapter_dtype)


def prediction(cfg: TrainConfig, config_dict: dict[str, Any]) -> Prediction:
    """attnmem.calc.training_step for cfg (module docstring)."""
    try:
        from attnmem.calc import ModelConfig, training_step
        from attnmem.calc.training_step import check_packed
    except ImportError as exc:
        return Prediction(None, None, f"no prediction: calc did not import ({exc})")
    try:
        model = ModelConfig.from_hf_config(config_dict, name=cfg.model)
    except Exception as exc:  # noqa: BLE001 - a failed prediction never costs the measurement
        return _trace_fallback(cfg, config_dict, short_error(exc, 200))
    try:
        kw: dict[str, Any] = {}
        if cfg.lora or cfg.base_dtype != "bf16":
            kw = {"adapters": calc_lora(cfg), "base_dtype": cfg.base_dtype}
        if cfg.packed:
            kw["packed_lengths"] = cfg.packed_lengths()
            try:
                check_packed(model, kw["packed_lengths"], cfg.batch, cfg.seq_len,
                             cfg.attention, False)
            except ValueError as exc:
                exc.packed_refusal = True  # type: ignore[attr-defined]
                raise
        if cfg.has_levers():  # the plain step's keywords are calc's defaults: left out
            kw.update(cfg.lever_kwargs())
        m = training_step(model, cfg.batch, cfg.seq_len, attention=cfg.attention,
                          precision=cfg.precision, checkpointing=cfg.checkpointing, **kw)
        return Prediction(int(m.peak_bytes), int(m.before_step_bytes), "")
    except Exception as exc:  # noqa: BLE001 - a failed prediction never costs the measurement
        why = short_error(exc, 200)
        refused = (" ".join(str(exc).split())[:300]
                   if (cfg.lora or cfg.has_levers() or _packed_refusal(exc))
                   and isinstance(exc, ValueError)
                   else None)
        if refused:
            return Prediction(None, None, f"no prediction: {why}", refused)
        return _trace_fallback(cfg, config_dict, why)


#: What the training trace runs (attnmem.trace.training: attnmem.trace.inference's
#: TRACE_ATTENTIONS, written out so that this module imports no torch).
TRACE_ATTENTIONS = ("eager", "sdpa", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn")


def trace_case(cfg: TrainConfig) -> str:
    """Why the meta-device trace cannot predict cfg ('' when it can)."""
    if cfg.precision != "bf16":
        return f"the trace runs bf16 precision only, not {cfg.precision!r}"
    if cfg.lora or cfg.base_dtype != "bf16":
        return "the trace runs full training only, not adapters"
    if cfg.packed:
        return "the trace runs dense rows only, not packed sequences"
    if cfg.has_levers():
        return f"the trace runs torch's AdamW without recipe levers, not {cfg.lever_label()!r}"
    if cfg.attention not in TRACE_ATTENTIONS:
        return f"the trace runs {', '.join(TRACE_ATTENTIONS)}, not {cfg.attention!r}"
    return ""


def traced(cfg: TrainConfig, config_dict: dict[str, Any]) -> tuple[int, int]:
    """(peak, before-step) bytes of cfg from attnmem.trace.training.trace_training; raises
    what the trace raises (ValueError, NoKernel)."""
    from attnmem.trace.training import trace_training

    t = trace_training(config_dict, cfg.batch, cfg.seq_len, attention=cfg.attention,
                       dtype="bf16", checkpointing=bool(cfg.checkpointing), lora_rank=None)
    return int(t.peak_bytes), int(t.before_step_bytes)


def _trace_fallback(cfg: TrainConfig, config_dict: dict[str, Any], why_calc: str) -> Prediction:
    """The trace's prediction where calc's rules gave none (``why_calc``)."""
    cannot = trace_case(cfg)
    if cannot:
        return Prediction(None, None, f"no prediction: {why_calc}; {cannot}")
    try:
        peak, before = traced(cfg, config_dict)
    except Exception as exc:  # noqa: BLE001 - a failed prediction never costs the measurement
        return Prediction(None, None,
                          f"no prediction: {why_calc}; the trace: {short_error(exc, 200)}")
    return Prediction(peak, before, f"predicted by the meta-device trace (calc: {why_calc})")


def _packed_refusal(exc: BaseException) -> bool:
    return bool(getattr(exc, "packed_refusal", False))


def predict(cfg: TrainConfig, config_dict: dict[str, Any]) -> tuple[int | None, int | None, str]:
    """attnmem.calc.training_step's (peak, before-step) bytes for cfg, or (None, None, why)."""
    p = prediction(cfg, config_dict)
    return p.peak, p.before, p.message
