"""The Inference page's logic, kept out of the page (pure: calc, pandas and the measurement
package's torch-free modules; no Streamlit).

- `run_all`: attnmem.calc.inference_step for every attention implementation, with the reason of each
  one calc refuses;
- `chunk_savings`: the peak with the prompt fed whole against fed in chunks;
- `measured_shapes`, `same_shape`: the model configs the bundled H200 rows were measured on,
  and whether a model has one of their shapes;
- `read_measured`, `compared_rows`: the bundled rows (attnmem.measure.infer.store.read_rows)
  beside the current attnmem.calc.inference_step prediction for each and its relative error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from attnmem.calc import ModelConfig
from attnmem.calc.inference_step import INFER_ATTENTIONS, InferenceMemory, inference_step

DATA = Path(__file__).resolve().parents[3] / "data" / "inference_steps_h200.csv"
#: Chunk sizes the chunked-prefill table compares with the whole prompt (and the user's own).
CHUNKS = (512, 2048, 8192)
#: ModelConfig fields that name or describe a config but do not change its memory.
_NOT_SHAPE = ("name", "source", "read_as", "defaults_from", "max_position_embeddings",
              "torch_dtype")


def run_all(model: ModelConfig, batch: int, prompt_len: int, new_tokens: int,
            attentions: Iterable[str] = INFER_ATTENTIONS, **kw: Any
            ) -> tuple[dict[str, InferenceMemory], dict[str, str]]:
    """attnmem.calc.inference_step for each attention: ({attention: result}, {attention: why refused})."""
    done: dict[str, InferenceMemory] = {}
    refused: dict[str, str] = {}
    for a in attentions:
        try:
            done[a] = inference_step(model, batch, prompt_len, new_tokens, attention=a, **kw)
        except ValueError as err:
            refused[a] = str(err)
    return done, refused


def chunk_sizes(prompt_len: int, chosen: int | None) -> list[int | None]:
    """None (the whole prompt at once), then the chunk sizes shorter than the prompt (a chunk
    as long as the prompt is the whole prompt), with the user's own chunk among them."""
    sizes = {x for x in (*CHUNKS, chosen) if x and x < prompt_len}
    return [None, *sorted(sizes)]


def chunk_savings(model: ModelConfig, batch: int, prompt_len: int, new_tokens: int,
                  **kw: Any) -> pd.DataFrame:
    """The generate() peak with the prompt fed whole and fed C tokens at a time (kw: the
    inference_step keywords but prefill_chunk): one row per chunk size, bytes and the saving
    against the whole prompt."""
    chosen = kw.pop("prefill_chunk", None)
    rows = []
    base = None
    for chunk in chunk_sizes(prompt_len, chosen):
        m = inference_step(model, batch, prompt_len, new_tokens, prefill_chunk=chunk, **kw)
        base = m.peak_bytes if base is None else base
        rows.append({"prefill chunk": chunk, "prefill peak": m.prefill_peak_bytes,
                     "decode peak": m.decode_peak_bytes, "peak": m.peak_bytes,
                     "saved": base - m.peak_bytes, "where": m.peak_phase})
    return pd.DataFrame(rows)


def shape_key(model: ModelConfig) -> tuple:
    """A model's memory-relevant fields (every ModelConfig field but its name, source and
    trained context): two configs with the same key give the same calc numbers."""
    # fields' reprs, not dataclasses.asdict: its deep copy was 20 ms a page run (13 keys)
    return tuple(sorted((f.name, repr(getattr(model, f.name))) for f in dataclasses.fields(model)
                        if f.name not in _NOT_SHAPE))


def measured_shapes() -> dict[str, ModelConfig]:
    """The configs of the measured inference models (attnmem.measure.infer_models, read as
    calc reads them), by their measurement name; the CPU-test `tiny-*` ones are left out."""
    try:
        from attnmem.measure import infer_models
    except ImportError:  # pragma: no cover - the measurement package is part of the repo
        return {}
    out = {}
    for name in infer_models.NAMES:
        if name.startswith("tiny"):
            continue
        try:
            out[name] = ModelConfig.from_hf_config(infer_models.hf_config(name), name=name,
                                                   with_transformers=False)
        except (ValueError, OSError):
            continue
    return out


def same_shape(model: ModelConfig, shapes: dict[str, ModelConfig]) -> str | None:
    """The measurement name whose config has the model's shape, if any."""
    key = shape_key(model)
    return next((name for name, m in shapes.items() if shape_key(m) == key), None)


def read_measured(path: Path = DATA) -> pd.DataFrame:
    """The bundled inference rows through the measurement system's reader
    (attnmem.measure.infer.store.read_rows, no torch import); empty when the file is absent."""
    if not path.exists():
        return pd.DataFrame()
    from attnmem.measure.infer.store import read_rows

    return pd.DataFrame(read_rows(path))


def _row_model(name: str, layers: Any, cache: dict) -> ModelConfig | None:
    key = (name, layers)
    if key not in cache:
        try:
            from attnmem.measure import infer_models

            n = None if layers is None or pd.isna(layers) else int(layers)
            cache[key] = ModelConfig.from_hf_config(infer_models.hf_config(name, layers=n),
                                                    name=name, with_transformers=False)
        except (ImportError, ValueError, OSError, TypeError):
            cache[key] = None
    return cache[key]


def compared_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Every measured row with status ok beside attnmem.calc.inference_step's current prediction for
    it (bf16 weights and cache, as the harness runs): measured and predicted peak and prefill
    peak, the relative errors (predicted − measured) / measured, where calc puts the peak."""
    rows, models = [], {}
    if df.empty:
        return pd.DataFrame()
    for _, r in df.iterrows():
        if r.get("status") != "ok" or r.get("peak_bytes") is None or pd.isna(r.get("peak_bytes")):
            continue
        model = _row_model(str(r["model"]), r.get("layers"), models)
        chunk = r.get("prefill_chunk")
        chunk = None if chunk is None or pd.isna(chunk) else int(chunk)
        m = None
        if model is not None:
            try:
                m = inference_step(model, int(r["batch"]), int(r["prompt_len"]),
                                   int(r["new_tokens"]), attention=str(r["attention"]),
                                   weight_dtype="bf16", kv_dtype="bf16", cache=str(r["cache"]),
                                   prefill_chunk=chunk)
            except ValueError:
                m = None
        peak, pre = int(r["peak_bytes"]), r.get("prefill_peak_bytes")
        pre = None if pre is None or pd.isna(pre) else int(pre)
        rows.append({
            "model": r["model"], "batch": int(r["batch"]), "prompt": int(r["prompt_len"]),
            "new tokens": int(r["new_tokens"]), "attention": r["attention"],
            "cache": r["cache"], "prefill chunk": chunk,
            "measured peak": peak, "predicted peak": None if m is None else m.peak_bytes,
            "peak error": None if m is None else (m.peak_bytes - peak) / peak,
            "measured prefill peak": pre,
            "predicted prefill peak": None if m is None else m.prefill_peak_bytes,
            "prefill error": None if m is None or not pre else (m.prefill_peak_bytes - pre) / pre,
            "predicted where": None if m is None else m.peak_phase,
            "prefill ms": r.get("prefill_ms"), "decode ms/token": r.get("decode_ms_per_token"),
        })
    return pd.DataFrame(rows)


#: Colours of the parts of the peak (attnmem.calc.inference_step's parts, plus weights and the fixed
#: inputs), as the other pages colour theirs: weights and KV cache as on Model memory,
#: attention and MLP as on Training step (Okabe & Ito; Paul Tol's wine and indigo for the rest).
PART_COLORS: dict[str, str] = {
    "weights": "#0072B2", "KV cache": "#56B4E9", "inputs": "#999999",
    "hidden states": "#E69F00", "norm": "#F0E442", "attention": "#D55E00", "MLP": "#CC79A7",
    "MoE": "#882255", "masks and rotary": "#009E73", "logits": "#332288",
}
