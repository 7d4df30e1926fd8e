"""The shape of a measurement result, once: its statuses, its columns and the dtypes it runs.

The harness writes ``PointResult`` rows, the child process sends them as JSON, the store keeps
them in SQLite and validates uploaded CSVs against the same columns and statuses, and the page
reads them back: all of them import these names from here. Stdlib only at import (calc when a
dtype is read; never torch), so the store and the pages import it on any machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

#: What happened to a point: measured (ok), out of memory (oom), the implementation does not run
#: here (unavailable), not run because its predicted peak exceeds the caller's limit (skipped),
#: failed otherwise (error); the child-process runner adds timeout and crashed.
STATUSES: tuple[str, ...] = ("ok", "oom", "unavailable", "skipped", "error", "timeout", "crashed")

#: Dtypes an attention call can be measured in (floating point, 16 or 32 bits); calc knows more
#: (fp8, int8, int4) for memory arithmetic only.
DTYPES: tuple[str, ...] = ("fp16", "bf16", "fp32")


def canonical_dtype(dtype: Any) -> str:
    """'fp16' | 'bf16' | 'fp32' for a name or torch spelling (attnmem.calc.units.dtype_name's aliases,
    plus any 'torch.' prefix); ValueError naming what is accepted otherwise."""
    from attnmem.calc.units import dtype_name  # calc's one table of aliases (imported when needed)

    text = str(dtype).strip()
    try:
        key = dtype_name(text.lower().removeprefix("torch."))
    except ValueError:
        key = None
    if key not in DTYPES:
        raise ValueError(
            f"dtype must be one of fp16, bf16, fp32 (or float16, bfloat16, float32), got {dtype!r}"
        )
    return key


@dataclass(frozen=True)
class PointResult:
    """One result row (the columns of the CSV, the store and the page)."""

    impl: str
    batch: int
    heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    dtype: str
    causal: bool
    backward: bool
    status: str  # one of STATUSES
    median_ms: float | None = None  # do_bench median of the whole call
    tflops: float | None = None  # attnmem.calc.attention_flops / median time
    peak_extra_bytes: int | None = None  # max_memory_allocated during the call - before
    reserved_bytes: int | None = None  # max_memory_reserved during the call (whole allocator)
    reserved_extra_bytes: int | None = None  # that minus memory_reserved() before the call
    before_bytes: int | None = None  # memory_allocated() before the call (inputs and dO)
    predicted_bytes: int | None = None  # attnmem.calc.attention_peak_bytes
    rel_error: float | None = None  # (predicted - measured) / measured
    message: str = ""  # why (oom text, unavailable reason, notes)
    wall_s: float | None = None  # wall-clock seconds the whole point took (warm-up, timing)
    gpu_name: str = ""
    driver: str = ""
    torch_version: str = ""
    triton_version: str = ""
    timestamp: str = ""  # ISO 8601, UTC

    @property
    def mode(self) -> str:
        return "fwd+bwd" if self.backward else "fwd"

    def to_row(self) -> dict[str, Any]:
        return asdict(self)


#: Column order of result rows (CSV, store, page).
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(PointResult))
