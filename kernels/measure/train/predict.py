"""calc's prediction for a training-step configuration: ``calc.training_step(
ModelConfig.from_hf_config(config), batch, seq_len, attention=..., precision=...,
checkpointing=...)`` when calc has it (else empty, and the message says why).

No torch or transformers at import time (calc is imported when asked).
"""

from __future__ import annotations

from typing import Any

from kernels.measure.model_common import short_error
from kernels.measure.train.config import TrainConfig


def predict(cfg: TrainConfig, config_dict: dict[str, Any]) -> tuple[int | None, int | None, str]:
    """calc.training_step's (peak, before-step) bytes for cfg, or (None, None, why)."""
    try:
        from calc import ModelConfig, training_step
    except ImportError as exc:
        return None, None, f"no prediction: calc did not import ({exc})"
    try:
        model = ModelConfig.from_hf_config(config_dict, name=cfg.model)
        m = training_step(model, cfg.batch, cfg.seq_len, attention=cfg.attention,
                          precision=cfg.precision, checkpointing=cfg.checkpointing)
        return int(m.peak_bytes), int(m.before_step_bytes), ""
    except Exception as exc:  # noqa: BLE001 - a failed prediction never costs the measurement
        return None, None, f"no prediction: {short_error(exc, 200)}"
