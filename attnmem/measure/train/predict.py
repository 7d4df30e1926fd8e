"""calc's prediction for a training-step configuration: ``attnmem.calc.training_step(
ModelConfig.from_hf_config(config), batch, seq_len, attention=..., precision=...,
checkpointing=..., adapters=..., base_dtype=..., packed_lengths=...)`` when calc has it (else
empty, and the message says why); packed lengths that calc's check_packed refuses (an
attention without a packed path, e.g. SDPA's flash backend) are a refusal as for LoRA.
With adapter lora, ``adapters=attnmem.calc.LoRA(rank, alpha, targets, dropout,
adapter_dtype)`` (``calc_lora``) and the configuration's base_dtype; a ValueError from attnmem.calc for
such a configuration is a refusal (``Prediction.refused``: what calc does not model, e.g.
autocast or Phi-3's fused projections with adapters), which the procedure records as
'unavailable' with calc's reason instead of measuring.

No torch or transformers at import time (calc is imported when asked).
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
        m = training_step(model, cfg.batch, cfg.seq_len, attention=cfg.attention,
                          precision=cfg.precision, checkpointing=cfg.checkpointing, **kw)
        return Prediction(int(m.peak_bytes), int(m.before_step_bytes), "")
    except Exception as exc:  # noqa: BLE001 - a failed prediction never costs the measurement
        why = short_error(exc, 200)
        refused = (" ".join(str(exc).split())[:300]
                   if (cfg.lora or _packed_refusal(exc)) and isinstance(exc, ValueError)
                   else None)
        return Prediction(None, None, f"no prediction: {why}", refused)


def _packed_refusal(exc: BaseException) -> bool:
    return bool(getattr(exc, "packed_refusal", False))


def predict(cfg: TrainConfig, config_dict: dict[str, Any]) -> tuple[int | None, int | None, str]:
    """attnmem.calc.training_step's (peak, before-step) bytes for cfg, or (None, None, why)."""
    p = prediction(cfg, config_dict)
    return p.peak, p.before, p.message
