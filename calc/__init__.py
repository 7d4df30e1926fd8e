"""The analytic model of attention memory: pure functions over plain numbers.

Pure on purpose: stdlib and pandas only, never streamlit, torch or triton, so the app, the
tests and the measurement harness all share one model. The public names and their meanings
are listed in calc/API.md.
"""

from __future__ import annotations

from calc.models import ModelConfig
from calc.scores import score_matrix_bytes
from calc.units import (
    DTYPE_BYTES,
    DTYPES,
    GB,
    GIB,
    MAX_BATCH,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_SEQ_LEN,
    check_int,
    dtype_bytes,
    dtype_name,
    format_bytes,
    format_gb,
    format_gib,
    to_unit,
)

__all__ = [
    "DTYPES",
    "DTYPE_BYTES",
    "GB",
    "GIB",
    "MAX_BATCH",
    "MAX_HEADS",
    "MAX_HEAD_DIM",
    "MAX_SEQ_LEN",
    "ModelConfig",
    "check_int",
    "dtype_bytes",
    "dtype_name",
    "format_bytes",
    "format_gb",
    "format_gib",
    "score_matrix_bytes",
    "to_unit",
]
