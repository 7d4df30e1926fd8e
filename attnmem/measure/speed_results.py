"""Rows of the speed benchmark (``python -m attnmem.measure.bench``), as it writes them and as the Kernel
speed page reads them back.

The benchmark times every implementation on the same inputs, shape by shape; each CSV row is one
(implementation, dtype, shape, pass) with its median time and TFLOP/s. This module is the
format's one definition: ``attnmem.measure.bench.speed`` writes ``Row`` objects, the page reads them
with ``read_rows``, so that nothing but the benchmark's own command line imports the benchmark.
Stdlib only.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["OURS", "PEERS", "Row", "ratios", "read_rows"]

#: Our kernel's default path (what ``attnmem.kernels.flash.api.flash_attention`` runs) in the bench.
OURS = "triton"
#: The peers our kernel's TFLOP/s are divided by, in the order the tables show them.
PEERS: tuple[str, ...] = ("sdpa_cudnn", "sdpa_flash", "fa4")


@dataclass(frozen=True)
class Row:
    impl: str  # implementation name (attnmem.measure.registry names; "triton" is ours)
    dtype: str  # fp16 | bf16
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    causal: bool
    mode: str  # fwd | fwd_bwd
    median_ms: float  # do_bench median, milliseconds (nan when not run)
    tflops: float  # TFLOP/s by attnmem.calc.attention_flops over median_ms
    rel_err: float  # ||out - sdpa_ref|| / ||sdpa_ref|| of the forward output (nan if not checked)
    status: str  # ok | unsupported | unavailable | oom | wrong: ... | the error's first line
    gpu: str
    torch_version: str
    triton_version: str
    timestamp: str  # UTC, ISO 8601
    kv_heads: int = 0  # key/value heads (GQA when < heads); CSVs without the column: `heads`
    impl_version: str = ""  # the implementation's own package version where it has one
    # beyond torch and triton (fa4: flash-attn-4's); CSVs without the column: ""

    @property
    def key(self) -> tuple[str, int, int, bool, str, int]:
        """The shape and pass this row measured, without the implementation:
        (dtype, head_dim, kv_heads, causal, mode, seq_len); kv_heads 0 (unset) reads as heads."""
        return (self.dtype, self.head_dim, self.kv_heads or self.heads, self.causal, self.mode,
                self.seq_len)


def read_rows(path: str | os.PathLike[str]) -> list[Row]:
    """The rows of a CSV that the benchmark wrote, typed back. Raises ValueError naming the
    file and the first column or value that does not fit."""
    types = {"batch": int, "heads": int, "seq_len": int, "head_dim": int, "median_ms": float,
             "tflops": float, "rel_err": float}
    rows = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        optional = {"kv_heads", "impl_version"}  # columns added later than the first CSVs
        missing = set(Row.__dataclass_fields__) - set(reader.fieldnames or ()) - optional
        if missing:
            raise ValueError(f"{path}: not an attnmem.measure.bench CSV, missing columns {sorted(missing)}")
        for n, raw in enumerate(reader, start=2):
            try:
                vals = {k: types.get(k, str)(raw[k]) for k in Row.__dataclass_fields__
                        if k not in optional}
                vals["kv_heads"] = int(raw.get("kv_heads") or vals["heads"])
                vals["impl_version"] = raw.get("impl_version") or ""
                vals["causal"] = {"True": True, "False": False}[raw["causal"]]
            except (KeyError, ValueError) as exc:
                raise ValueError(f"{path}, line {n}: bad value ({exc})") from None
            rows.append(Row(**vals))
    return rows


def ratios(rows: Iterable[Row], ours: str = OURS, peers: Sequence[str] = PEERS,
           ) -> dict[tuple, dict[str, float]]:
    """For each shape and pass (``Row.key``): our TFLOP/s over each peer's, from rows whose
    status is ok on both sides; nan where either is missing or failed (never a ratio from a
    wrong or refused row)."""
    ok: dict[tuple, float] = {}
    keys: dict[tuple, None] = {}  # in the rows' order
    for r in rows:
        keys[r.key] = None
        if r.status == "ok" and math.isfinite(r.tflops) and r.tflops > 0:
            ok[(r.impl, *r.key)] = r.tflops
    out: dict[tuple, dict[str, float]] = {}
    for key in keys:
        mine = ok.get((ours, *key), math.nan)
        out[key] = {p: mine / ok.get((p, *key), math.nan) for p in peers}
    return out
