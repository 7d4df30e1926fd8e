"""Training step: weights, gradients, AdamW state and activations of one step, per GPU.

Thin page: widgets -> attnmem.calc.training_step (one per attention implementation) -> stacked bars,
the peak and where it occurs, the longest trainable context; the bundled H200 measurements
(data/training_steps_h200.csv, read through attnmem.measure.train.store.read_rows) beside
the predictions; and the "7B at 32k" answer.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from typing import Any  # noqa: E402

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from attnmem.calc import (  # noqa: E402
    GPUS,
    MAX_SEQ_LEN,
    MODELS,
    PRECISIONS,
    SHARDING_LABELS,
    SHARDINGS,
    TRAIN_ATTENTION_LABELS,
    TRAIN_ATTENTIONS,
    ModelConfig,
    max_train_seq_len,
    train_gpus_needed,
    training_step,
)
from attnmem.calc.backends import NoKernel  # noqa: E402
from attnmem.calc.training_step import LORA_PART, OPTIMIZERS, PHASES  # noqa: E402
from attnmem.calc.training_step import LoRA as calc_lora  # noqa: E402
from attnmem.pages.ui import charts, tables, widgets  # noqa: E402
from attnmem.pages.ui import finetune as ft_  # noqa: E402
from attnmem.pages.ui.labels import TRAINING_PART_COLORS  # noqa: E402
from attnmem.pages.ui.messages import COMPUTED, longest_past_trained_note, trained_context_note  # noqa: E402
from attnmem.pages.ui.pickers import gpu_options  # noqa: E402
from attnmem.pages.ui.state import cached, get_unit, page_setup, sync_url  # noqa: E402
from attnmem.pages.ui.units import fmt, in_unit  # noqa: E402
from attnmem.pages.ui.url_state import (  # noqa: E402
    BoolParam,
    ChoiceParam,
    IntParam,
    MultiChoiceParam,
    md_escape,  # noqa: E402
)
from attnmem.pages.ui.weights import gpu_caption, usable_bytes  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "data" / "training_steps_h200.csv"
#: Sharded steps (DDP, FSDP2) on several GPUs, one row per rank (attnmem.measure.train_dist).
DIST_DATA = DATA.with_name("training_steps_dist_h200.csv")
#: train_dist's sharding names as attnmem.calc.parallel's layouts (train_dist.CALC_SHARDING).
DIST_SHARDINGS = {"ddp": "none", "fsdp": "fsdp"}
H200, H100 = "NVIDIA H200 141GB", "NVIDIA H100 80GB"
MEASURED_PREFIX = "measured shape: "
PRECISION_LABELS = {"bf16": "bf16 parameters and AdamW state",
                    "amp_bf16": "fp32 parameters under autocast(bf16)"}
DEFAULT_ATTNS = ("eager", "sdpa_flash", "sdpa_cudnn", "triton")


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


TRAIN_SHAPES = _train_models()
# Every preset is offered (MoE models are counted now, issue 34); one calc still refuses
# (MLA, hybrids, gpt-oss with an attention other than eager) shows calc's reason on the page
# instead of numbers.
CHOICES = dict(MODELS)
for _name, _cfg in TRAIN_SHAPES.items():
    try:
        CHOICES[MEASURED_PREFIX + _name] = ModelConfig.from_hf_config(_cfg, name=_name)
    except ValueError:
        pass

SPECS = {
    "model": ChoiceParam("Llama 3.1 8B", tuple(CHOICES)),
    "b": IntParam(1, 1, 65_536),  # the same spec as the other pages: B carries over
    "s": IntParam(4096, 1, MAX_SEQ_LEN),
    "prec": ChoiceParam("bf16", PRECISIONS),
    "ckpt": BoolParam(False),
    "attns": MultiChoiceParam(DEFAULT_ATTNS, TRAIN_ATTENTIONS, min_items=1),
    "opt": ChoiceParam("adamw", OPTIMIZERS),
    "gpus": IntParam(1, 1, 65_536),
    "tp": IntParam(1, 1, 1024),
    "shard": ChoiceParam("none", SHARDINGS),
    "ep": IntParam(1, 1, 65_536),  # expert-parallel degree (MoE models only)
    "gpu": ChoiceParam(H100, gpu_options(GPUS)),
    # Fine-tuning method (issue 34): full training, LoRA on a bf16 base, QLoRA on a 4-bit base.
    "ft": ChoiceParam("full", ft_.METHODS),
    "rank": IntParam(ft_.DEFAULT_RANK, 1, 1 << 16),
    "targets": ChoiceParam(ft_.DEFAULT_TARGETS, ft_.TARGETS),
    "adt": ChoiceParam(ft_.DEFAULT_ADAPTER_DTYPE, ft_.ADAPTER_DTYPE_CHOICES),
    "dq": BoolParam(False),
    # every column of a wide table, not only its first ones (each fits a 1280 px window)
    "mcols": tables.ALL_COLUMNS,  # the measured single-GPU rows
    "dcols": tables.ALL_COLUMNS,  # the measured sharded rows
    "acols": tables.ALL_COLUMNS,  # "Can I train a 7B at 32k on one GPU?"
}
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


def _row_model(row: pd.Series) -> ModelConfig | None:
    name = str(row.get("model", ""))
    try:
        from attnmem.measure import train_models

        layers = row.get("layers")
        layers = None if layers is None or pd.isna(layers) else int(layers)
        return ModelConfig.from_hf_config(train_models.hf_config(name, layers=layers), name=name)
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


def _measured_ok(df: pd.DataFrame):
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


def read_measured_dist(path: Path = DIST_DATA) -> pd.DataFrame:
    """The bundled sharded training-step rows (attnmem.measure.train_dist.read_rows); an empty
    frame when the file is not there."""
    if not path.exists():
        return pd.DataFrame()
    from attnmem.measure.train_dist import read_rows

    return pd.DataFrame(read_rows(path))


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
            "peak": fmt(r["peak_bytes"], unit) if ok else "—",
            "fits": ("yes" if r["fits"] else "no") if ok else "—",
            "longest context": (f"{r['longest_context']:,}" if r["longest_context"] else "none")
            if ok else "—",
            "GPUs (full training)": gpus_cell,
            "measured peak (H200)":
                fmt(measured_peak[r["method"]], unit) if r["method"] in measured_peak else
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
        shown[col] = shown[col].map(lambda b: "—" if b is None or pd.isna(b) else fmt(b, unit))
    if "packed" in shown.columns:  # dense rows: no packed lengths
        packed = shown["packed"].map(lambda t: t is not None and not pd.isna(t))
        # the method says "packed" too: the lengths' column is not among a narrow table's first
        shown["method"] = [f"{m}, packed" if p else m for m, p in zip(shown["method"], packed, strict=True)]
        shown["packed"] = shown["packed"].map(lambda t: "—" if t is None or pd.isna(t) else t)
    for col in [x for x in shown.columns if x.endswith(" error")]:
        shown[col] = shown[col].map(lambda e: "—" if e is None or pd.isna(e) else f"{e:+.2%}")
    return shown


@cached(max_entries=256)
def longest(choice: str, gpu_bytes: int, batch: int, kw: tuple, ft: tuple = ()) -> int:
    """Exact search over s (attnmem.calc.max_train_seq_len); cached by the model's name (hashing a
    ModelConfig costs more than the search). ft: the fine-tuning settings (method, rank,
    targets, adapter dtype, double quantization; empty: full training)."""
    return max_train_seq_len(CHOICES[choice], gpu_bytes, batch, **dict(kw),
                             **ft_.calc_kwargs(*ft) if ft else {})


@cached(max_entries=256)
def needed(choice: str, gpu_bytes: int, batch: int, s: int, kw: tuple) -> int:
    return train_gpus_needed(CHOICES[choice], gpu_bytes, batch, s, max_gpus=1024, **dict(kw))


@cached(max_entries=256)
def never_fits(choice: str, gpu_bytes: int, batch: int, s: int, kw: tuple) -> bool:
    """True when no number of GPUs fits: at 2^20 GPUs the sharded states are next to nothing,
    so what is left is one replica's activations, which more GPUs of this layout never split."""
    return ft_.never_fits(CHOICES[choice], gpu_bytes, batch, s, dict(kw))


def seven_b_at_32k(measured: pd.DataFrame, unit: str) -> pd.DataFrame:
    """Which attention trains a Llama-2-7B / Llama-3-8B at s = 32,768, B = 1, bf16 on one
    H200 or H100: predicted peak (with and without checkpointing) and, where bundled, the
    measured step time of the few-layer model of the same widths."""
    models: dict[str, ModelConfig] = {"Llama 3.1 8B": MODELS["Llama 3.1 8B"]}
    try:
        from attnmem.measure import train_models

        models["Llama 2 7B"] = ModelConfig.from_hf_config(
            train_models.hf_config("llama2-7b-2l", layers=32), name="Llama 2 7B")
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
                    "peak": fmt(m.peak_bytes, unit),
                    "fits one H200": "yes" if m.peak_bytes <= usable_bytes(H200) else "no",
                    "fits one H100": "yes" if m.peak_bytes <= usable_bytes(H100) else "no",
                    "where": m.peak_phase,
                    "2-layer step (ms)": "—" if ms is None else f"{ms:,.0f}",
                })
    return pd.DataFrame(rows)


page_setup("training")
st.title("Training step")
st.markdown("**How much memory does one training step take, where is its peak, and does it "
            "fit?** Weights, gradients, AdamW's two moments and every activation autograd "
            "keeps, per attention implementation, per GPU.")

top = st.columns([1.5, 1.3, 1.7])  # wide enough for "bf16: bf16 parameters and AdamW state"
choice = widgets.select("Model", "model", SPECS["model"], where=top[0])
gpu = widgets.select("GPU", "gpu", SPECS["gpu"], where=top[1], format_func=lambda g: f"{g} ({fmt(GPUS[g])})")
prec = widgets.select("Precision", "prec", SPECS["prec"], where=top[2], format_func=lambda p: f"{p}: {PRECISION_LABELS[p]}")
tune = st.columns([2.2, 1, 1.6, 1, 1.4])
method = widgets.radio("What is trained", "ft", SPECS["ft"], where=tune[0],
                 format_func=lambda m: ft_.METHOD_LABELS[m],
                 help="Full training: every weight gets a gradient and AdamW state. LoRA (peft): "
                      "the base is frozen; only rank-r adapters train. QLoRA: LoRA on a base "
                      "stored in bitsandbytes 4-bit NF4.")
full = method == "full"
rank = widgets.int_input("LoRA rank r", "rank", SPECS["rank"], where=tune[1], disabled=full)
targets = widgets.select("LoRA targets", "targets", SPECS["targets"], where=tune[2], disabled=full,
                   format_func=lambda t: ft_.TARGET_LABELS[t],
                   help="attention: q, k, v, o; all-linear: q, k, v, o, gate, up, down "
                        "(never lm_head, as peft's all-linear)")
adt = widgets.select("Adapter dtype", "adt", SPECS["adt"], where=tune[3], disabled=full,
               help="fp32: peft's default (autocast_adapter_dtype=True); bf16: "
                    "autocast_adapter_dtype=False")
dq = widgets.toggle("Double quantization (QLoRA)", "dq", SPECS["dq"], where=tune[4],
              disabled=method != "qlora",
              help="bnb_4bit_use_double_quant: the absmax constants in 8 bits")
ft_settings = (rank, targets, adt, dq)
ft_kw = ft_.calc_kwargs(method, *ft_settings)
row = st.columns([1, 1, 1, 3])
opt = widgets.select("Optimizer", "opt", SPECS["opt"], where=row[1])
batch = widgets.int_input("Batch size", "b", SPECS["b"], where=row[0])
ckpt = widgets.toggle("Activation checkpointing (every layer)", "ckpt", SPECS["ckpt"], where=row[2])
attns = widgets.multiselect("Attention implementations", "attns", SPECS["attns"], where=row[3],
                      format_func=lambda a: TRAIN_ATTENTION_LABELS.get(a, a))
if not attns:
    attns = list(DEFAULT_ATTNS)
seq_len = widgets.seq_len_input("Context length s (tokens)", "s", SPECS["s"], hi_pow2=1 << 20)
lay = st.columns(4)
gpus = widgets.int_input("GPUs N (= tensor parallel × data parallel)", "gpus", SPECS["gpus"], where=lay[0])
tp = widgets.int_input("Tensor-parallel degree t", "tp", SPECS["tp"], where=lay[1])
shard = widgets.select("Sharding over data-parallel replicas", "shard", SPECS["shard"], where=lay[2],
                 format_func=lambda s: SHARDING_LABELS[s])
model = CHOICES[choice]
ep = widgets.int_input("Expert-parallel degree (MoE)", "ep", SPECS["ep"], where=lay[3],
                 disabled=model.num_experts <= 1,
                 help="Each of ep data-parallel ranks holds 1/ep of every layer's experts; "
                      "tokens reach them by all-to-all, balanced routing assumed (counted, not "
                      "measured). It divides N / t and the experts per layer.")
ep = ep if model.num_experts > 1 else 1

unit = get_unit()
gpu_bytes = usable_bytes(gpu)  # what torch can use where sourced (attnmem.calc.gpus), else the spec sheet
st.caption(md_escape(gpu_caption(gpu, unit, what="\"Fits\", the longest context and GPUs needed")))
trained_context_note(model, seq_len)
kw = dict(precision=prec, checkpointing=ckpt, optimizer=opt, gpus=gpus, tp=tp, sharding=shard,
          ep=ep)


def side_by_side_section() -> None:
    """Full, LoRA and QLoRA side by side for this model, batch, length and GPU (first attention
    selected), every number computed; a method calc refuses shows the reason."""
    rows = ft_.side_by_side(model, gpu_bytes, batch, seq_len, dict(kw, attention=attns[0]),
                            *ft_settings)
    st.markdown("### Which of these fits on my GPU, at what length?")
    st.markdown(f"{md_escape(model.name)}, batch {batch:,}, s = {seq_len:,}, "
                f"{TRAIN_ATTENTION_LABELS[attns[0]]}, on {md_escape(gpu)}; LoRA rank {rank}, "
                f"{targets}, {adt} adapters; QLoRA double quantization {'on' if dq else 'off'}.")
    methods = set(compared["method"]) if not compared.empty else set()
    peaks = {}
    if shape and gpus == 1 and not compared.empty:
        at = compared[(compared["model"] == shape) & (compared["batch"] == batch)
                      & (compared["seq_len"] == seq_len) & (compared["precision"] == prec)
                      & (compared["checkpointing"] == ckpt) & (compared["attention"] == attns[0])
                      & compared["packed"].isna()]
        peaks = {r["method"]: int(r["measured peak"]) for _, r in at.iterrows()}
    fit_names = [ft_.METHOD_LABELS[r["method"]] for r in rows if r["fits"]]
    where = f"one {gpu}" if gpus == 1 else f"each {gpu} of {gpus:,}"
    st.markdown(f"**On {md_escape(where)} at s = {seq_len:,}**: "
                + (f"fits with {', '.join(fit_names)} (computed)." if fit_names else
                   "none of full training, LoRA or QLoRA fits (computed)."))
    side = side_by_side_table(rows, unit, peaks, methods)
    tables.table(side.drop(columns=[REASON]), hide_index=True)
    for name, why in zip(side["method"], side[REASON], strict=True):
        if why:
            st.markdown(md_escape(f"{name}: not computed: {why}"))
    longest_past_trained_note(model, max(((r["longest_context"] or 0) for r in rows
                                            if r["refused"] is None), default=0))
    lora_measured = len(methods - {"full"})
    st.caption(f"{COMPUTED}: the peak and whether it fits from attnmem.calc.training_step, the "
               "longest context from attnmem.calc.max_train_seq_len with the same "
               "keywords, and the GPUs needed from attnmem.calc.train_gpus_needed for full training (LoRA is modelled on "
               "one GPU). Measured: the bundled H200 steps (data/training_steps_h200.csv) "
               + ("are full training only; LoRA and QLoRA steps are not measured yet (the "
                  "harness `python -m attnmem.measure --train --plan h200-lora` exists and has "
                  "not run on a GPU yet)." if not lora_measured else
                  "include LoRA/QLoRA rows (below, with their predictions)."))


measured = read_measured()
compared = predicted_rows(measured) if not measured.empty else pd.DataFrame()
shape = choice[len(MEASURED_PREFIX):] if choice.startswith(MEASURED_PREFIX) else None
steps: dict = {}
no_kernel: dict[str, str] = {}  # attentions torch has no kernel for at these inputs: why
try:
    for a in attns:
        try:
            steps[a] = training_step(model, batch, seq_len, attention=a, **kw, **ft_kw)
        except NoKernel as err:
            no_kernel[a] = str(err)
    if not steps:
        raise ValueError(" / ".join(no_kernel.values()))
except ValueError as err:
    st.error(md_escape(f"These settings cannot be computed: {err}"), icon=":material/block:")
    side_by_side_section()
    sync_url(SPECS)
    st.stop()
for a, why in no_kernel.items():
    st.warning(md_escape(f"Not computed: {TRAIN_ATTENTION_LABELS[a]}: {why}"),
               icon=":material/block:")

first_attn = next(iter(steps))
first = steps[first_attn]
dp = gpus // tp
st.caption(
    f"**{md_escape(model.name)}**: {model.num_layers} layers, hidden {model.hidden_size:,}, "
    f"{model.num_heads} query / {model.num_kv_heads} KV heads of {model.head_dim}, MLP "
    f"{model.intermediate_size:,}, vocabulary {model.vocab_size:,}. Per GPU: {gpus:,} GPU(s) = "
    f"tensor parallel {tp} × data parallel {dp}, sharding {SHARDING_LABELS[shard]}"
    + (f", experts split over {ep} ranks (all-to-all, balanced routing)." if ep > 1 else "."))

cols = st.columns(len(steps))
for col, (a, m) in zip(cols, steps.items(), strict=True):
    with col:
        st.metric(f"{TRAIN_ATTENTION_LABELS[a]}: peak", fmt(m.peak_bytes, unit),
                  help=f"{COMPUTED}: the peak per GPU, attnmem.calc.training_step, at '{m.peak_phase}'.")
        st.caption(f"Peak at **{m.peak_phase}**; before the step {fmt(m.before_step_bytes, unit)}.")
        if m.peak_bytes <= gpu_bytes:
            st.success(f"Fits one {gpu} ({fmt(gpu_bytes - m.peak_bytes, unit)} free).", icon=":material/check_circle:")
        else:
            st.error(f"Does not fit one {gpu}: {fmt(m.peak_bytes - gpu_bytes, unit)} over.", icon=":material/cancel:")

# Stacked bars: what exists before the step, then the activations at the end of the forward;
# the peak of the step as a marker (its moment holds some of these, and gradients).
parts = ["weights", "optimizer state", "buffers", *[p for p in PART_COLORS if p not in
                                                      ("weights", "optimizer state", "buffers")]]
labels = [TRAIN_ATTENTION_LABELS[a] for a in steps]


def part_bytes(m: Any, part: str) -> int:
    if part == "weights":
        return m.weights_bytes
    if part == "optimizer state":
        return m.optimizer_bytes
    if part == "buffers":
        return m.before_step_bytes - m.weights_bytes - m.optimizer_bytes
    return m.part(part)


hits = compared[(compared["model"] == shape) & (compared["method"] == method) & (compared["batch"] == batch)
                & (compared["seq_len"] == seq_len) & (compared["precision"] == prec)
                & (compared["checkpointing"] == ckpt) & compared["attention"].isin(attns)
                & compared["packed"].isna()] \
    if not compared.empty else compared
traces = []
for part in parts:
    ys = [part_bytes(m, part) for m in steps.values()]
    if not any(ys):
        continue
    traces.append(dict(
        type="bar", name=part, x=labels, y=[in_unit(y, unit) for y in ys],
        marker=dict(color=PART_COLORS[part]), customdata=[fmt(y, unit) for y in ys],
        hovertemplate="%{x}<br>" + part + ": %{customdata}<extra></extra>"))
traces.append(dict(
    type="scatter", mode="markers", name="peak of the step", x=labels,
    y=[in_unit(m.peak_bytes, unit) for m in steps.values()],
    marker=dict(symbol="diamond", size=14, color="#CC3311"),
    customdata=[f"{fmt(m.peak_bytes, unit)} at {m.peak_phase}" for m in steps.values()],
    hovertemplate="%{x}<br>peak: %{customdata}<extra></extra>"))
if shape and len(hits) and gpus == 1:  # the H200's measured peak beside each prediction
    got = {r["attention"]: r for _, r in hits.iterrows()}
    shown_at = [a for a in steps if a in got]
    traces.append(dict(
        type="scatter", mode="markers", name="measured peak (H200)",
        x=[TRAIN_ATTENTION_LABELS[a] for a in shown_at],
        y=[in_unit(got[a]["measured peak"], unit) for a in shown_at],
        marker=dict(symbol="x-thin", size=16, line=dict(width=3, color="#000000")),
        customdata=[f"{fmt(got[a]['measured peak'], unit)} (prediction "
                    f"{got[a]['peak error']:+.2%})" for a in shown_at],
        hovertemplate="%{x}<br>measured: %{customdata}<extra></extra>"))
cap = in_unit(gpu_bytes, unit)  # the GPU as a line across the whole (categorical) axis
dash = dict(color="rgba(128,128,128,0.9)", dash="dash", width=1.5)
traces.append(dict(type="scatter", mode="lines", x=labels, y=[cap] * len(labels), line=dash,
                   name=f"{gpu} ({fmt(gpu_bytes, unit)})", zorder=1,  # above the bars
                   hovertemplate=f"{gpu}: {fmt(gpu_bytes, unit)}<extra></extra>"))
fig = charts.figure(traces, "", f"memory per GPU ({unit})", 460, barmode="stack", shapes=[dict(
    type="line", xref="paper", x0=0, x1=1, yref="y", y0=cap, y1=cap, line=dash, layer="above")])
table = pd.DataFrame([{"attention": a, **{p: part_bytes(m, p) for p in parts},
                       "gradients": m.gradients_bytes, "peak": m.peak_bytes,
                       "peak phase": m.peak_phase} for a, m in steps.items()])
charts.chart(fig, "training_chart", "training-step", table.assign(model=model.name, batch=batch, seq_len=seq_len))
st.caption(f"{COMPUTED}. Bars: before the step (weights, AdamW state, buffers: cuBLAS "
           "workspaces, inputs and the layout's) plus the activations alive at the end of the "
           "forward; the diamond is the step's peak (attnmem/calc/training_step.py lists each moment "
           "and every tensor with its source).")

st.markdown("**Each moment of the step (per GPU)** — the peak is the largest")
# A moment the model does not have (the tied embedding's backward of an untied model) is left out.
tables.table(pd.DataFrame([{"moment": ph, **{TRAIN_ATTENTION_LABELS[a]: fmt(m.phases[ph], unit)
                                              for a, m in steps.items()}}
                           for ph in PHASES if ph in next(iter(steps.values())).phases]),
             hide_index=True)

with st.expander("Every activation term of " + TRAIN_ATTENTION_LABELS[first_attn]):
    tables.text_table(  # bytes as text: eager's s×s terms can exceed 64-bit integers (s = 10^8)
        pd.DataFrame([{"part": p, "tensor": lab, "size": fmt(x, unit), "bytes": f"{x:,}"}
                      for p, lab, x in first.activation_terms]))

fit_rows = []
longest_seen = []
never_any = False
for a in steps:
    ka = tuple(sorted(dict(kw, attention=a).items()))
    s_max = longest(choice, gpu_bytes, batch, ka, () if full else (method, *ft_settings))
    longest_seen.append(s_max)
    ka_need = tuple(sorted(dict(attention=a, precision=prec, checkpointing=ckpt, optimizer=opt,
                                sharding="zero3" if shard == "none" else shard, tp=tp,
                                ep=ep).items()))
    n_need = 0 if not full else needed(choice, gpu_bytes, batch, seq_len, ka_need)
    if not full:
        need_text = "— (LoRA and QLoRA are modelled on one GPU)"
    elif n_need:
        need_text = f"{n_need:,}"
    elif never_fits(choice, gpu_bytes, batch, seq_len, ka_need):
        need_text = "never fits"  # why: the caption under the table (a long cell is cut off)
        never_any = True
    else:
        need_text = "more than 1,024"
    fit_rows.append({"attention": TRAIN_ATTENTION_LABELS[a],
                     "longest trainable context on this layout": f"{s_max:,}" if s_max else "none",
                     f"GPUs needed at s = {seq_len:,} ({'ZeRO-3' if shard == 'none' else shard}, t = {tp})":
                         need_text})
st.markdown(f"**Longest context and GPUs needed on {md_escape(gpu)}** (exact integer searches)")
tables.table(pd.DataFrame(fit_rows), hide_index=True)
longest_past_trained_note(model, max(longest_seen, default=0))
if never_any:
    st.caption("*Never fits*: one replica's activations alone exceed the GPU, so no number of "
               "GPUs fits (ZeRO-3 shards weights, gradients and optimizer state, not activations).")

side_by_side_section()

st.markdown("### Measured on an H200 against the prediction")
if measured.empty:
    st.info("No bundled training-step measurements yet (data/training_steps_h200.csv). Run "
            "`python -m attnmem.measure --train --plan h200` on a GPU to make them.")
if not compared.empty:
    if shape and len(hits) and gpus == 1:
        st.markdown("Rows matching these inputs (measured peak is `max_memory_allocated()` over the step):")
        view = hits
    else:
        st.markdown("No measured row matches these inputs (pick a *measured shape* model, one "
                    "GPU, and a measured length): every bundled row with its prediction.")
        view = compared
    tables.wide_table(shown_table(view, unit).rename(columns=MEASURED_SHORT), MEASURED_FIRST, "mcols")
    errs = compared["peak error"].dropna()
    big = compared[compared["seq_len"] >= 1024]["peak error"].dropna()
    if len(errs):
        st.caption(f"Measured: {len(compared)} rows; largest |error| of the peak "
                   f"{errs.abs().max():.2%} (s ≥ 1,024: {big.abs().max() if len(big) else float('nan'):.2%}).")

st.markdown("### Sharded over several GPUs (DDP, FSDP2): measured against the per-GPU prediction")
dist = read_measured_dist()
dist_rows = predicted_dist_rows(dist) if not dist.empty else pd.DataFrame()
if dist_rows.empty:
    st.caption("None measured yet: no machine with several GPUs has been available to this "
               "project. `python -m attnmem.measure.train_dist --nproc-per-node N --sharding "
               "ddp fsdp ...` measures every rank of a DDP or FSDP2 (fully_shard) step of the "
               "same models and writes data/training_steps_dist_h200.csv, which this section "
               "then shows with the error of every prediction (NOTES.md, Multi-GPU harnesses).")
else:
    tables.wide_table(shown_table(dist_rows, unit).rename(columns=MEASURED_SHORT), DIST_FIRST, "dcols")
    errs = dist_rows["peak error"].dropna()
    st.caption(f"Measured: {len(dist_rows)} ranks; largest |error| of the peak "
               f"{errs.abs().max() if len(errs) else float('nan'):.2%}. The held bytes are "
               "counted from each rank's tensors after the warm-up step (parameter shards, "
               "gradients, AdamW state).")

st.markdown("### Can I train a 7B at 32k on one GPU?")
st.markdown("Llama-2-7B and Llama-3-8B shapes, s = 32,768, B = 1, bf16 parameters and AdamW "
            "state, one GPU (computed; the step time is measured on the 2-layer model of the "
            "same widths where bundled).")
answer = seven_b_at_32k(measured, unit)
for gpu_name, col in ((H200, "fits one H200"), (H100, "fits one H100")):
    ok = answer[answer[col] == "yes"]
    if ok.empty:
        st.markdown(f"- **One {gpu_name}**: no attention fits either model at 32k, even with "
                    "checkpointing (computed).")
    else:
        said = "; ".join(f"{r['model']}: {r['attention']} (checkpointing {r['checkpointing']}, "
                         f"{r['peak']})" for _, r in ok.iterrows())
        st.markdown(f"- **One {gpu_name}**: {md_escape(said)}.")
tables.wide_table(answer, SEVEN_B_FIRST, "acols")
st.caption("At this length the fp32 log-softmax and its two gradients (12·s·V bytes) and, "
           "for eager attention, the s×s softmax of every layer decide it: the fused kernels "
           "keep only an output and a log-sum-exp per row.")

sync_url(SPECS)
