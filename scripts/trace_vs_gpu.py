"""The meta-device trace against the bundled GPU measurements (issue 42's cross-check).

For every bundled row the trace can run (generate() with a dynamic cache and no chunking,
SDPA or eager attention, in data/inference_steps_h200.csv; training steps in bf16 without
adapters or packing, in data/training_steps_h200.csv), trace the same model (the harness's
own config: attnmem.measure.infer_models / train_models) and print the measured peak, the
trace's, its error and the rules' error. Writes the rows as CSV to the path given, if any.

    .venv/bin/python scripts/trace_vs_gpu.py [out.csv]
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.status == "ok"]


def inference_rows() -> list[dict]:
    from attnmem.measure import infer_models
    from attnmem.trace.generate import trace_inference
    from attnmem.trace.inference import TRACE_ATTENTIONS

    df = _ok(pd.read_csv(ROOT / "data" / "inference_steps_h200.csv"))
    df = df[(df.cache == "dynamic") & df.prefill_chunk.isna()
            & df.attention.isin(TRACE_ATTENTIONS)]
    out = []
    for _, r in df.iterrows():
        d = infer_models.hf_config(r.model, int(r.layers))
        t0 = time.perf_counter()
        try:
            t = trace_inference(d, int(r.batch), int(r.prompt_len), int(r.new_tokens),
                                attention=r.attention)
            got, why = t.peak_bytes, ""
        except ValueError as e:
            got, why = None, str(e)[:120]
        out.append({"kind": "generate()", "model": r.model, "attention": r.attention,
                    "shape": f"B{r.batch} s{r.prompt_len} N{r.new_tokens}",
                    "measured": int(r.peak_bytes), "traced": got,
                    "trace_error": None if got is None else got / r.peak_bytes - 1,
                    "rules_error": r.peak_rel_error, "seconds": time.perf_counter() - t0,
                    "note": why})
    return out


def training_rows() -> list[dict]:
    from attnmem.measure import train_models
    from attnmem.trace.inference import TRACE_ATTENTIONS
    from attnmem.trace.training import trace_training

    df = _ok(pd.read_csv(ROOT / "data" / "training_steps_h200.csv"))
    df = df[(df.precision == "bf16") & (df.adapter.isna() | (df.adapter == "none"))
            & df.packed_lengths.isna() & df.attention.isin(TRACE_ATTENTIONS)]
    out = []
    for _, r in df.iterrows():
        d = train_models.hf_config(r.model, int(r.layers))
        t0 = time.perf_counter()
        try:
            t = trace_training(d, int(r.batch), int(r.seq_len), attention=r.attention,
                               checkpointing=bool(r.checkpointing))
            got, why = t.peak_bytes, ""
        except ValueError as e:
            got, why = None, str(e)[:120]
        out.append({"kind": "training" + (" ckpt" if r.checkpointing else ""),
                    "model": r.model, "attention": r.attention,
                    "shape": f"B{r.batch} s{r.seq_len}", "measured": int(r.peak_bytes),
                    "traced": got, "trace_error": None if got is None else
                    got / r.peak_bytes - 1, "rules_error": r.peak_rel_error,
                    "seconds": time.perf_counter() - t0, "note": why})
    return out


def main(argv: list[str]) -> None:
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    rows = pd.DataFrame(inference_rows() + training_rows())
    if argv:
        rows.to_csv(argv[0], index=False)
    ran = rows[rows.traced.notna()]
    worst = ran.assign(abs_err=ran.trace_error.abs()).groupby(["kind", "model"]).agg(
        rows=("abs_err", "size"), worst_trace=("abs_err", "max"),
        worst_rules=("rules_error", lambda x: x.abs().max()))
    print(worst.to_string(float_format=lambda x: f"{100 * x:.3f}%"))
    print(f"\n{len(ran)} rows traced, {len(rows) - len(ran)} refused; worst trace error "
          f"{100 * ran.trace_error.abs().max():.3f}%")
    for _, r in rows[rows.traced.isna()].iterrows():
        print("refused:", r.kind, r.model, r.attention, r.shape, r.note)


if __name__ == "__main__":
    main(sys.argv[1:])
