"""The Training step page's logic, kept out of the page (pure: calc, pandas and the measurement
package's torch-free modules; no Streamlit).

- `CHOICES`: the presets and the measured training shapes (attnmem.measure.train_models) the
  model selector offers;
- `run_all`: attnmem.calc.training_step for each chosen attention, with the reason of each one
  torch has no kernel for;
- `bundled`: the bundled H200 rows (data/training_steps_h200.csv and the sharded steps of
  data/training_steps_dist_h200.csv) beside the current prediction for each
  (`predicted_rows`, `predicted_dist_rows`) and its relative error;
- the tables and the chart the page draws from these: `step_figure`, `shown_table`,
  `side_by_side_table`, `seven_b_at_32k`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from attnmem.calc import (
    MODELS,
    PRECISIONS,
    TRAIN_ATTENTION_LABELS,
    ModelConfig,
    training_step,
)
from attnmem.calc.backends import NoKernel
from attnmem.calc.training_step import LORA_PART
from attnmem.calc.training_step import LoRA as calc_lora
from attnmem.calc.units import format_bytes, to_unit
from attnmem.pages.ui import finetune as ft_
from attnmem.pages.ui.labels import TRAINING_PART_COLORS
from attnmem.pages.ui.weights import usable_bytes

DATA = Path(__file__).resolve().parents[3] / "data" / "training_steps_h200.csv"
#: Sharded steps (DDP, FSDP2) on several GPUs, one row per rank (attnmem.measure.train_dist).
DIST_DATA = DATA.with_name("training_steps_dist_h200.csv")
#: train_dist's sharding names as attnmem.calc.parallel's layouts (train_dist.CALC_SHARDING).
DIST_SHARDINGS = {"ddp": "none", "fsdp": "fsdp"}
H200, H100 = "NVIDIA H200 141GB", "NVIDIA H100 80GB"
MEASURED_PREFIX = "measured shape: "
#: calc's reason for refusing a method, in side_by_side_table (written under the table).
REASON = "calc's reason (not computed)"
#: Shorter headers of the measured rows (the section's title says they are peaks per GPU;
#: checkpointing's cells say on or off).
MEASURED_SHORT = {"seq_len": "s", "checkpointing": "ckpt", "measured peak": "measured",
                  "predicted peak": "predicted", "peak error": "error"}
#: The measured rows' columns shown by default: the inputs that tell the rows apart and the
#: peak against its prediction (the packed lengths, before-step bytes, the phase and the time
#: under "show all"; a packed row's method says "packed").
MEASURED_FIRST = ("model", "method", "batch", "s", "attention", "precision", "ckpt",
                  "measured", "predicted", "error")
#: The same for a rank of a sharded step.
DIST_FIRST = ("sharding", "GPUs", "rank", "model", "batch", "s", "measured", "predicted", "error")
#: "Can I train a 7B at 32k?": the answer by default; where the peak occurs under "show all".
SEVEN_B_FIRST = ("model", "attention", "checkpointing", "peak", "fits one H200",
                 "fits one H100", "2-layer step (ms)")
#: Colours of the stacked parts (Okabe & Ito, as attnmem.pages.ui.labels).
PART_COLORS = {**TRAINING_PART_COLORS, "MoE": "#117733",  # green
               LORA_PART: "#332288"}  # indigo (issue 34's parts)
#: The parts that exist before the step, first in the stacked bars; the activations follow.
BEFORE_STEP = ("weights", "optimizer state", "buffers")
PARTS = (*BEFORE_STEP, *[p for p in PART_COLORS if p not in BEFORE_STEP])


def _train_models() -> dict[str, dict[str, Any]]:
    """The measured training shapes (attnmem.measure.train_models), when that module is here."""
    try:
        from attnmem.measure import train_models
    except ImportError:  # pragma: no cover - the measurement package is part of the repo
        return {}
    out = {}
    for name in train_models.NAMES:
        if name.startswith("tiny"):
            continue
        try:
            out[name] = train_models.hf_config(name)
        except (ValueError, OSError):
            continue
    return out


def _choices() -> dict[str, ModelConfig]:
    """Every preset (MoE models are counted, issue 34; a model calc refuses, such as MLA,
    hybrids or gpt-oss with an attention other than eager, shows calc's reason on the page
    instead of numbers), then each measured shape under MEASURED_PREFIX."""
    out = dict(MODELS)
    for name, cfg in _train_models().items():
        try:
            out[MEASURED_PREFIX + name] = ModelConfig.from_hf_config(cfg, name=name,
                                                                    with_transformers=False)
        except ValueError:
            pass
    return out


CHOICES = _choices()


def measured_shape(choice: str) -> str | None:
    """The measurement name of a choice that is a measured shape, else None."""
    return choice[len(MEASURED_PREFIX):] if choice.startswith(MEASURED_PREFIX) else None


def run_all(model: ModelConfig, batch: int, seq_len: int, attentions: Iterable[str],
            **kw: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """attnmem.calc.training_step for each attention: ({attention: result}, {attention: why torch
    has no kernel for it at these inputs}). ValueError when calc refuses the inputs, or when
    no attention has a kernel (the reasons joined)."""
    steps: dict[str, Any] = {}
    no_kernel: dict[str, str] = {}
    for a in attentions:
        try:
            steps[a] = training_step(model, batch, seq_len, attention=a, **kw)
        except NoKernel as err:
            no_kernel[a] = str(err)
    if not steps:
        raise ValueError(" / ".join(no_kernel.values()))
    return steps, no_kernel


# --- the bundled measurements beside the prediction -------------------------------------------


def read_measured(path: Path = DATA) -> pd.DataFrame:
    """The bundled training-step rows through the measurement system's reader
    (attnmem.measure.train.store.read_rows); an empty frame when the file is not there."""
    if not path.exists():
        return pd.DataFrame()
    try:
        from attnmem.measure.train.store import read_rows
    except ImportError:  # the reader is the measurement system's; read the CSV plainly
        return pd.read_csv(path)
    return pd.DataFrame(read_rows(path))


def read_measured_dist(path: Path = DIST_DATA) -> pd.DataFrame:
    """The bundled sharded training-step rows (attnmem.measure.train_dist.read_rows); an empty
    frame when the file is not there."""
    if not path.exists():
        return pd.DataFrame()
    from attnmem.measure.train_dist import read_rows

    return pd.DataFrame(read_rows(path))


def _row_model(row: pd.Series) -> ModelConfig | None:
    name = str(row.get("model", ""))
    try:
        from attnmem.measure import train_models

        layers = row.get("layers")
        layers = None if layers is None or pd.isna(layers) else int(layers)
        return ModelConfig.from_hf_config(train_models.hf_config(name, layers=layers), name=name,
                                          with_transformers=False)
    except (ImportError, ValueError, OSError, TypeError):
        return None


def _row_method(r: pd.Series) -> tuple[str, dict[str, Any]]:
    """A measured row's method (full, lora, qlora) and its adapter keywords for calc (the
    harness's adapter columns; a row without them is full training)."""
    adapter = r.get("adapter")
    if adapter is None or pd.isna(adapter) or adapter in ("", "none"):
        return "full", {}
    base = r.get("base_dtype")
    base = "bf16" if base is None or pd.isna(base) or not base else str(base)
    try:
        lora = calc_lora(rank=int(r["lora_rank"]), alpha=float(r.get("lora_alpha") or 16.0),
                         targets=str(r.get("lora_targets") or ft_.DEFAULT_TARGETS),
                         dropout=float(r.get("lora_dropout") or 0.0),
                         adapter_dtype=str(r.get("adapter_dtype") or "fp32"))
    except (TypeError, ValueError, KeyError):
        return "lora" if base == "bf16" else "qlora", {"adapters": "unreadable"}
    return "lora" if base == "bf16" else "qlora", {"adapters": lora, "base_dtype": base}


def _row_packed(r: pd.Series) -> tuple[int, ...]:
    """A measured row's packed sequence lengths (the harness's ``packed_lengths`` column,
    '1000+3000+96'); () for a dense row or one without the column."""
    text = r.get("packed_lengths")
    if text is None or (isinstance(text, float) and pd.isna(text)) or text == "":
        return ()
    from attnmem.measure.train.config import parse_pack

    return parse_pack(str(text))


def _compared(r: pd.Series, layout: dict[str, Any] | None) -> tuple[dict[str, Any], Any]:
    """One measured row beside attnmem.calc.training_step's prediction for it (``layout``: the
    gpus/sharding keywords, empty for one GPU, None for a layout calc does not know): the
    shared columns, and the prediction (None where calc cannot make one)."""
    model, m = _row_model(r), None
    method, ft_kw = _row_method(r)
    packed = _row_packed(r)
    if packed:
        ft_kw = {**ft_kw, "packed_lengths": packed}
    if layout is not None and model is not None and r.get("precision") in PRECISIONS:
        try:
            m = training_step(model, int(r["batch"]), int(r["seq_len"]),
                              attention=str(r["attention"]), precision=str(r["precision"]),
                              checkpointing=bool(r["checkpointing"]), **layout, **ft_kw)
        except (ValueError, TypeError):
            pass
    pred = None if m is None else m.peak_bytes
    before = None if m is None else m.before_step_bytes
    peak, mb = int(r["peak_bytes"]), r.get("before_step_bytes")
    return {
        "model": r["model"], "method": method,
        "batch": int(r["batch"]), "seq_len": int(r["seq_len"]),
        "packed": "+".join(map(str, packed)) if packed else None,
        "attention": r["attention"], "precision": r["precision"],
        "checkpointing": bool(r["checkpointing"]),
        "measured peak": peak, "predicted peak": pred,
        "peak error": None if pred is None else (pred - peak) / peak,
        "measured before": None if pd.isna(mb) else int(mb), "predicted before": before,
        "before error": None if before is None or pd.isna(mb) else (before - mb) / mb,
    }, m


def _measured_ok(df: pd.DataFrame) -> Iterator[pd.Series]:
    """The rows of df with status ok and a measured peak."""
    for _, r in df.iterrows():
        if r.get("status") == "ok" and not pd.isna(r.get("peak_bytes")):
            yield r


def predicted_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Every measured row (status ok) with the current prediction and its relative error."""
    rows = []
    for r in _measured_ok(df):
        row, m = _compared(r, {})
        rows.append({**row, "predicted phase": None if m is None else m.peak_phase,
                     "step_ms": r.get("step_ms")})
    return pd.DataFrame(rows)


def predicted_dist_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Every measured rank (status ok) of a sharded step with attnmem.calc.training_step's per-GPU
    prediction for its layout (gpus = world_size, DDP as sharding "none", FSDP2 as "fsdp")
    and the relative errors of the peak, before-step and the bytes the rank holds."""
    rows = []
    for r in _measured_ok(df):
        sharding = DIST_SHARDINGS.get(str(r.get("sharding")))
        n = int(r["world_size"])
        row, m = _compared(r, {"gpus": n, "sharding": sharding} if sharding else None)
        row = {"sharding": r["sharding"], "GPUs": n, "rank": r.get("rank"), **row,
               "step_ms": r.get("step_ms")}
        if m is not None:  # what the rank holds, counted from its tensors
            for part, p in (("weights", m.weights_bytes), ("gradients", m.gradients_bytes),
                            ("optimizer", m.optimizer_bytes)):
                got = r.get(f"{part}_bytes")
                row[f"{part} error"] = None if got is None or pd.isna(got) or not got else \
                    (p - got) / got
        rows.append(row)
    return pd.DataFrame(rows)


class Bundled(NamedTuple):
    """The bundled measurements as the page shows them."""

    rows: pd.DataFrame  #: data/training_steps_h200.csv as read (empty when absent)
    compared: pd.DataFrame  #: its rows with status ok beside the prediction (predicted_rows)
    dist: pd.DataFrame  #: the sharded ranks beside the prediction (predicted_dist_rows)


def bundled(path: Path = DATA, dist_path: Path = DIST_DATA) -> Bundled:
    """Every bundled training-step row and sharded rank, each beside the current prediction."""
    rows = read_measured(path)
    dist = read_measured_dist(dist_path)
    return Bundled(rows, predicted_rows(rows) if not rows.empty else pd.DataFrame(),
                   predicted_dist_rows(dist) if not dist.empty else pd.DataFrame())


def matching_rows(compared: pd.DataFrame, shape: str | None, batch: int, seq_len: int,
                  precision: str, checkpointing: bool, attentions: Sequence[str],
                  method: str | None = None) -> pd.DataFrame:
    """The dense compared rows measured at exactly these inputs (any method when ``method`` is
    None); empty when there are none."""
    if compared.empty:
        return compared
    hit = ((compared["model"] == shape) & (compared["batch"] == batch)
           & (compared["seq_len"] == seq_len) & (compared["precision"] == precision)
           & (compared["checkpointing"] == checkpointing)
           & compared["attention"].isin(attentions) & compared["packed"].isna())
    if method is not None:
        hit &= compared["method"] == method
    return compared[hit]


# --- what the page shows ----------------------------------------------------------------------


def part_bytes(m: Any, part: str) -> int:
    """The bytes of one of PARTS in a training_step result: the states before the step, the
    buffers (the rest of before-step), or an activation part."""
    if part == "weights":
        return m.weights_bytes
    if part == "optimizer state":
        return m.optimizer_bytes
    if part == "buffers":
        return m.before_step_bytes - m.weights_bytes - m.optimizer_bytes
    return m.part(part)


def step_figure(steps: dict[str, Any], unit: str, gpu: str, gpu_bytes: int,
                measured: pd.DataFrame | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The stacked bars of each attention's step (what exists before the step, then the
    activations at the end of the forward), the step's peak as a marker, the H200's measured
    peak where ``measured`` has a row for the attention, and the GPU as a dashed line: (traces,
    the figure's layout keywords for attnmem.pages.ui.charts.figure)."""
    labels = [TRAIN_ATTENTION_LABELS[a] for a in steps]
    traces = []
    for part in PARTS:
        ys = [part_bytes(m, part) for m in steps.values()]
        if not any(ys):
            continue
        traces.append(dict(
            type="bar", name=part, x=labels, y=[to_unit(y, unit) for y in ys],
            marker=dict(color=PART_COLORS[part]), customdata=[format_bytes(y, unit) for y in ys],
            hovertemplate="%{x}<br>" + part + ": %{customdata}<extra></extra>"))
    traces.append(dict(
        type="scatter", mode="markers", name="peak of the step", x=labels,
        y=[to_unit(m.peak_bytes, unit) for m in steps.values()],
        marker=dict(symbol="diamond", size=14, color="#CC3311"),
        customdata=[f"{format_bytes(m.peak_bytes, unit)} at {m.peak_phase}" for m in steps.values()],
        hovertemplate="%{x}<br>peak: %{customdata}<extra></extra>"))
    if measured is not None and len(measured):  # the H200's measured peak beside each prediction
        got = {r["attention"]: r for _, r in measured.iterrows()}
        shown_at = [a for a in steps if a in got]
        traces.append(dict(
            type="scatter", mode="markers", name="measured peak (H200)",
            x=[TRAIN_ATTENTION_LABELS[a] for a in shown_at],
            y=[to_unit(got[a]["measured peak"], unit) for a in shown_at],
            marker=dict(symbol="x-thin", size=16, line=dict(width=3, color="#000000")),
            customdata=[f"{format_bytes(got[a]['measured peak'], unit)} (prediction "
                        f"{got[a]['peak error']:+.2%})" for a in shown_at],
            hovertemplate="%{x}<br>measured: %{customdata}<extra></extra>"))
    cap = to_unit(gpu_bytes, unit)  # the GPU as a line across the whole (categorical) axis
    dash = dict(color="rgba(128,128,128,0.9)", dash="dash", width=1.5)
    traces.append(dict(type="scatter", mode="lines", x=labels, y=[cap] * len(labels), line=dash,
                       name=f"{gpu} ({format_bytes(gpu_bytes, unit)})", zorder=1,  # above the bars
                       hovertemplate=f"{gpu}: {format_bytes(gpu_bytes, unit)}<extra></extra>"))
    layout = dict(barmode="stack", shapes=[dict(type="line", xref="paper", x0=0, x1=1, yref="y",
                                                y0=cap, y1=cap, line=dash, layer="above")])
    return traces, layout


def step_table(steps: dict[str, Any]) -> pd.DataFrame:
    """The chart's numbers, in bytes: each part, the gradients, the peak and where it occurs."""
    return pd.DataFrame([{"attention": a, **{p: part_bytes(m, p) for p in PARTS},
                          "gradients": m.gradients_bytes, "peak": m.peak_bytes,
                          "peak phase": m.peak_phase} for a, m in steps.items()])


def side_by_side_table(rows: list[dict[str, Any]], unit: str,
                       measured_peak: dict[str, int] | None = None,
                       measured_methods: set[str] | frozenset[str] = frozenset()) -> pd.DataFrame:
    """attnmem.pages.ui.finetune.side_by_side's rows for display: sizes in `unit`, "—" where a method
    has no such number, calc's reason where it refuses the method (column REASON: the page
    writes it under the table, a sentence being too long for a cell). measured_peak: the H200's
    measured peak of a bundled row at exactly these inputs, by method; measured_methods: the
    methods the bundled CSV has rows of at all."""
    measured_peak = measured_peak or {}
    out = []
    for r in rows:
        ok = r["refused"] is None
        gpus_cell = "—" if r["method"] != "full" else (
            "—" if not ok else f"{r['gpus_needed']:,}" if r["gpus_needed"] else
            ("never fits" if r.get("never_fits") else f"more than {ft_.MAX_GPUS:,}")
            if r["gpus_needed"] == 0 else "—")
        out.append({
            "method": ft_.METHOD_LABELS[r["method"]],
            "peak": format_bytes(r["peak_bytes"], unit) if ok else "—",
            "fits": ("yes" if r["fits"] else "no") if ok else "—",
            "longest context": (f"{r['longest_context']:,}" if r["longest_context"] else "none")
            if ok else "—",
            "GPUs (full training)": gpus_cell,
            "measured peak (H200)":
                format_bytes(measured_peak[r["method"]], unit) if r["method"] in measured_peak else
                "no row at these inputs" if r["method"] in measured_methods else
                "not measured yet",
            REASON: "" if ok else r["refused"],
        })
    return pd.DataFrame(out)


def shown_table(df: pd.DataFrame, unit: str) -> pd.DataFrame:
    """df for display: byte columns in ``unit``, errors as signed percentages, "—" for none."""
    shown = df.copy()
    if "checkpointing" in shown:
        shown["checkpointing"] = shown["checkpointing"].map(lambda x: "on" if x else "off")
    for col in ("measured peak", "predicted peak", "measured before", "predicted before"):
        shown[col] = shown[col].map(lambda b: "—" if b is None or pd.isna(b) else format_bytes(b, unit))
    if "packed" in shown.columns:  # dense rows: no packed lengths
        packed = shown["packed"].map(lambda t: t is not None and not pd.isna(t))
        # the method says "packed" too: the lengths' column is not among a narrow table's first
        shown["method"] = [f"{m}, packed" if p else m for m, p in zip(shown["method"], packed, strict=True)]
        shown["packed"] = shown["packed"].map(lambda t: "—" if t is None or pd.isna(t) else t)
    for col in [x for x in shown.columns if x.endswith(" error")]:
        shown[col] = shown[col].map(lambda e: "—" if e is None or pd.isna(e) else f"{e:+.2%}")
    return shown


def seven_b_at_32k(measured: pd.DataFrame, unit: str) -> pd.DataFrame:
    """Which attention trains a Llama-2-7B / Llama-3-8B at s = 32,768, B = 1, bf16 on one
    H200 or H100: predicted peak (with and without checkpointing) and, where bundled, the
    measured step time of the few-layer model of the same widths."""
    models: dict[str, ModelConfig] = {"Llama 3.1 8B": MODELS["Llama 3.1 8B"]}
    try:
        from attnmem.measure import train_models

        models["Llama 2 7B"] = ModelConfig.from_hf_config(
            train_models.hf_config("llama2-7b-2l", layers=32), name="Llama 2 7B",
            with_transformers=False)
    except (ImportError, ValueError, OSError):
        pass
    shape_of = {"Llama 3.1 8B": "llama3-8b-2l", "Llama 2 7B": "llama2-7b-2l"}
    rows = []
    for name, model in models.items():
        for attn in ("eager", "sdpa_flash", "sdpa_cudnn", "triton"):
            for ckpt in (False, True):
                m = training_step(model, 1, 32768, attention=attn, precision="bf16",
                                  checkpointing=ckpt)
                ms = None
                if not measured.empty and "step_ms" in measured:
                    hit = measured[(measured["model"] == shape_of[name])
                                   & (measured["seq_len"] == 32768)
                                   & (measured["attention"] == attn)
                                   & (measured["precision"] == "bf16")
                                   & (measured["checkpointing"] == ckpt)
                                   & (measured["status"] == "ok")]
                    if len(hit):
                        ms = float(hit["step_ms"].iloc[0])
                rows.append({
                    "model": name, "attention": TRAIN_ATTENTION_LABELS[attn],
                    "checkpointing": "on" if ckpt else "off",
                    "peak": format_bytes(m.peak_bytes, unit),
                    "fits one H200": "yes" if m.peak_bytes <= usable_bytes(H200) else "no",
                    "fits one H100": "yes" if m.peak_bytes <= usable_bytes(H100) else "no",
                    "where": m.peak_phase,
                    "2-layer step (ms)": "—" if ms is None else f"{ms:,.0f}",
                })
    return pd.DataFrame(rows)


# --- what makes it fit: the recipe levers (issue 43) ------------------------------------------

#: The page's lever inputs (URL keys) and what they say, beside the optimizer and checkpointing.
LEVER_LABELS = {
    "kbit": "peft prepare_model_for_kbit_training (QLoRA)",
    "liger": "Liger kernels (RMSNorm, SwiGLU, fused linear cross-entropy)",
    "offload": "Offload activations to the CPU (save_on_cpu)",
    "pf": "Padding-free: the batch packed into one row (TRL padding_free / packing)",
    "trlhead": "TRL's fused LM head (SFTTrainer's loss: no full logits)",
}


class LeverRefusal(ValueError):
    """calc refuses the levers chosen, where the same step without them is computed."""


def step_shape(batch: int, seq_len: int, padding_free: bool) -> tuple[int, int, tuple[int, ...] | None]:
    """(batch, seq_len, packed_lengths) as training_step takes them: padding-free puts the
    batch's `batch` sequences of seq_len into one row (TRL's padding_free, worst case: every
    sequence at max_length), as attnmem.calc.train_levers.trl_kwargs does."""
    if padding_free:
        return 1, batch * seq_len, (seq_len,) * batch
    return batch, seq_len, None


def lever_kwargs(method: str, kbit: bool, liger: bool, offload: bool,
                 packed: tuple[int, ...] | None, trl_head: bool = False) -> dict[str, Any]:
    """The recipe keywords of training_step the page's levers set (kbit only for QLoRA: the
    prepare step is for a k-bit base; the input is kept, not applied, for the others);
    trl_head: TRL SFTTrainer's fused LM head as the loss (attnmem/calc/train_trl_loss.py)."""
    kw: dict[str, Any] = {}
    if trl_head:
        kw["loss"] = "trl_fused"
    if kbit and method == "qlora":
        kw["kbit_prepare"] = True
    if liger:
        kw["liger"] = True
    if offload:
        kw["offload_activations"] = True
    if packed:
        kw["packed_lengths"] = packed
    return kw


def run_levers(model: ModelConfig, batch: int, seq_len: int, attentions: Iterable[str],
               base_kw: dict[str, Any], levers: dict[str, Any],
               ) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """run_all with the levers: ({attention: result}, {attention: no kernel}, {attention:
    calc's reason for refusing the levers}). A refusal that does not come from the levers (the
    same step without them is refused too) is raised as run_all raises it; LeverRefusal when
    the levers are refused for every attention."""
    if not levers:
        steps, no_kernel = run_all(model, batch, seq_len, attentions, **base_kw)
        return steps, no_kernel, {}
    steps: dict[str, Any] = {}
    no_kernel: dict[str, str] = {}
    refused: dict[str, str] = {}
    plain_b, plain_s = (batch, seq_len)
    if "packed_lengths" in levers:  # the same tokens as dense rows
        plain_b, plain_s = len(levers["packed_lengths"]), levers["packed_lengths"][0]
    for a in attentions:
        try:
            steps[a] = training_step(model, batch, seq_len, attention=a, **base_kw, **levers)
        except NoKernel as err:
            no_kernel[a] = str(err)
        except ValueError as err:
            try:
                training_step(model, plain_b, plain_s, attention=a, **base_kw)
            except NoKernel as err2:
                no_kernel[a] = str(err2)
                continue
            # any other ValueError: not the levers' refusal; raised as run_all raises it
            refused[a] = str(err)
    if not steps:
        if refused:
            raise LeverRefusal(" / ".join(dict.fromkeys(refused.values())))
        raise ValueError(" / ".join(no_kernel.values()))
    return steps, no_kernel, refused


#: The levers cheapest_fit tries, as the page's inputs call them.
LEVER_INPUT = {"liger": "Liger kernels", "8-bit AdamW": "optimizer adamw_8bit",
               "paged 8-bit AdamW": "optimizer paged_adamw_8bit",
               "checkpointing": "activation checkpointing",
               "offload activations": "offload activations"}


class Cheapest(NamedTuple):
    """What makes it fit (attnmem.calc.train_levers): the fewest levers on top of the page's
    settings whose peak fits (`levers`, `peak_bytes`, `fits`), the saving of each lever of that
    combination (`combo`), and each lever alone on top of the settings (`alone`, with calc's
    reason where refused)."""

    levers: list[str]
    peak_bytes: int
    fits: bool
    combo: pd.DataFrame
    alone: pd.DataFrame


def cheapest(model: ModelConfig, batch: int, seq_len: int, gpu_bytes: int,
             base: dict[str, Any], unit: str) -> Cheapest:
    """calc's cheapest_fit and each lever alone over the page's step (base: every keyword of
    training_step but the model, batch and length), as tables in `unit`. Where calc refuses
    `base` itself, the search starts from it without Liger and offloading, and the table's
    attrs["base_refused"] holds calc's reason."""
    from attnmem.calc.train_levers import LEVERS, cheapest_fit

    def step(**kw: Any) -> Any:
        return training_step(model, batch, seq_len, **kw)

    why0 = ""
    try:
        step(**base)
    except ValueError as err:  # the chosen levers refused together: search from the step
        why0 = str(err)         # without Liger and offloading (both are levers tried)
        base = {**base, "liger": False, "offload_activations": False}
    levers, peak, rows = cheapest_fit(step, gpu_bytes, base)
    fits = bool(rows) or (not levers and 0 < peak <= gpu_bytes)
    combo = pd.DataFrame([{"lever": r.lever, "input on this page": LEVER_INPUT.get(r.lever, r.lever),
                           "saving (computed)": format_bytes(r.saving_bytes, unit)} for r in rows],
                         columns=["lever", "input on this page", "saving (computed)"])
    try:
        p0: int | None = step(**base).peak_bytes
    except ValueError:
        p0 = None
    alone = []
    for name, kw in LEVERS:
        row = {"lever": name, "peak with it": "—", "saving": "—", "fits": "—",
               "calc's reason (not computed)": ""}
        if all(base.get(k) == v for k, v in kw.items()):
            row["calc's reason (not computed)"] = "already on"
        try:
            p = step(**{**base, **kw}).peak_bytes
            row.update({"peak with it": format_bytes(p, unit),
                        "saving": "—" if p0 is None else format_bytes(p0 - p, unit),
                        "fits": "yes" if p <= gpu_bytes else "no"})
        except ValueError as err:
            row["calc's reason (not computed)"] = str(err)
        alone.append(row)
    alone_df = pd.DataFrame(alone)
    if why0:
        alone_df.attrs["base_refused"] = why0
    return Cheapest(levers, peak, fits, combo, alone_df)


#: The page inputs TRL's arguments set (attnmem.calc.train_levers.trl_kwargs).
TRL_KEYS = ("b", "s", "prec", "ckpt", "opt", "liger", "offload", "pf", "trlhead")


class TrlSettings(NamedTuple):
    values: dict[str, Any]  #: page key -> value (TRL_KEYS)
    notes: tuple[str, ...]  #: what the mapping assumed (calc's notes)
    ignored: tuple[str, ...]  #: keys that change no memory here


#: The TRL argument behind each page input TRL sets (for the messages).
TRL_NAMES = {"b": "per_device_train_batch_size", "s": "max_length", "prec": "bf16",
             "ckpt": "gradient_checkpointing", "opt": "optim", "liger": "use_liger_kernel",
             "offload": "activation_offloading", "pf": "padding_free / packing",
             "trlhead": "loss_type"}


def trl_settings(text: str, specs: dict[str, Any] | None = None) -> TrlSettings:
    """TRL SFTConfig arguments pasted as JSON or key=value lines -> the page's inputs;
    ValueError naming the bad value and what is accepted (calc's message, or, with `specs`,
    the page's url_state spec of an input whose range is narrower than TRL's)."""
    from attnmem.calc.train_levers import parse_trl_args, trl_kwargs

    m = trl_kwargs(parse_trl_args(text))
    packed = m.kwargs.get("packed_lengths")
    b, s = (len(packed), packed[0]) if packed else (m.batch, m.seq_len)
    values = {"b": b, "s": s, "prec": m.kwargs["precision"], "ckpt": m.kwargs["checkpointing"],
              "opt": m.kwargs["optimizer"], "liger": m.kwargs["liger"],
              "offload": m.kwargs["offload_activations"], "pf": bool(packed),
              "trlhead": m.loss == "trl_fused"}
    for key, value in values.items():
        spec = (specs or {}).get(key)
        if spec is not None and not spec.is_valid(value):
            lo, hi = getattr(spec, "lo", None), getattr(spec, "hi", None)
            raise ValueError(f"TRL {TRL_NAMES[key]}={value!r}: outside this page's range"
                             + (f"; accepted: {lo:,} to {hi:,}" if lo is not None else ""))
    return TrlSettings(values, m.notes, m.ignored)


def moments(phases: dict[str, int], order: Sequence[str]) -> list[str]:
    """The moments of a step in calc's order (`order`: PHASES), then the ones a lever adds
    (Liger's fused loss: attnmem.calc.train_liger.LIGER_PHASE); absent ones left out."""
    return [p for p in order if p in phases] + [p for p in phases if p not in order]


def levers_said(levers: dict[str, Any], optimizer: str, checkpointing: bool) -> str:
    """The levers in force, in words, for the caption above the answer."""
    said = [f"optimizer {optimizer}"] + (["checkpointing"] if checkpointing else [])
    said += [LEVER_LABELS[k] for k, on in (("kbit", levers.get("kbit_prepare")),
                                           ("liger", levers.get("liger")),
                                           ("offload", levers.get("offload_activations")),
                                           ("pf", levers.get("packed_lengths")),
                                           ("trlhead", levers.get("loss") == "trl_fused"))
              if on]
    return ", ".join(said)


def headline(steps: dict[str, Any], gpu_bytes: int, where: str, unit: str,
             best: Cheapest | None, best_attn: str | None = None) -> str:
    """The answer in one line of markdown for the top of the page (seen at 1280 × 800 without
    scrolling): each attention's peak per GPU and whether it fits `where`, and, where one does
    not, the cheapest combination of levers that fits for `best_attn` (default: the first);
    `where` comes markdown-escaped (numbers and labels here are ours)."""
    parts = []
    for a, m in steps.items():
        over = m.peak_bytes - gpu_bytes
        parts.append(f"{TRAIN_ATTENTION_LABELS[a]} **{format_bytes(m.peak_bytes, unit)}, "
                     + ("fits**" if over <= 0 else
                        f"does not fit** ({format_bytes(over, unit)} over)"))
    text = f"**Answer on {where}** (computed, peak per GPU): " + " · ".join(parts) + "."
    if best is not None and any(m.peak_bytes > gpu_bytes for m in steps.values()):
        first = TRAIN_ATTENTION_LABELS[best_attn or next(iter(steps))]  # the cheapest table's
        if best.fits and best.levers:
            text += (f" What makes {first} fit: **{' + '.join(best.levers)}** "
                     f"({format_bytes(best.peak_bytes, unit)}; *What makes it fit*, below).")
        elif not best.fits:
            text += f" No combination of the levers makes {first} fit (*What makes it fit*, below)."
    return text

