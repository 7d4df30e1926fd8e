"""Training step: weights, gradients, AdamW state and activations of one step, per GPU.

Thin page: widgets -> attnmem.calc.training_step (one per attention implementation, run by
attnmem/pages/ui/training.py) -> stacked bars, the peak and where it occurs, the longest
trainable context; the bundled H200 measurements (data/training_steps_h200.csv and
data/training_steps_dist_h200.csv, read and predicted by attnmem.pages.ui.training.bundled)
beside the predictions; and the "7B at 32k" answer.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from attnmem.calc import (  # noqa: E402
    GPUS,
    MAX_SEQ_LEN,
    PRECISIONS,
    SHARDING_LABELS,
    SHARDINGS,
    TRAIN_ATTENTION_LABELS,
    TRAIN_ATTENTIONS,
    max_train_seq_len,
    train_gpus_needed,
)
from attnmem.calc.training_step import OPTIMIZERS, PHASES  # noqa: E402
from attnmem.measure import on_this_gpu as gpu_run  # noqa: E402
from attnmem.pages.ui import charts, measure_here, pickers, tables, widgets  # noqa: E402
from attnmem.pages.ui import finetune as ft_  # noqa: E402
from attnmem.pages.ui import hub_model as hub  # noqa: E402
from attnmem.pages.ui import traced_training as ttr  # noqa: E402
from attnmem.pages.ui import traced_training_view as ttv  # noqa: E402
from attnmem.pages.ui import training as tr  # noqa: E402
from attnmem.pages.ui.custom_config import CUSTOM  # noqa: E402
from attnmem.pages.ui.messages import (  # noqa: E402
    COMPUTED,
    longest_past_trained_note,
    trained_context_note,
    warn,
)
from attnmem.pages.ui.state import cached, get_unit, kept, page_setup, sync_url  # noqa: E402
from attnmem.pages.ui.units import fmt  # noqa: E402
from attnmem.pages.ui.url_state import (  # noqa: E402
    BoolParam,
    ChoiceParam,
    IntParam,
    MultiChoiceParam,
    md_escape,
)
from attnmem.pages.ui.weights import usable_bytes  # noqa: E402

PRECISION_LABELS = {"bf16": "bf16 parameters and AdamW state",
                    "amp_bf16": "fp32 parameters under autocast(bf16)"}
DEFAULT_ATTNS = ("eager", "sdpa_flash", "sdpa_cudnn", "triton")

SPECS = {
    # a Hub id or a config.json too: one calc has rules for is computed, any other traced
    "model": ChoiceParam("Llama 3.1 8B", (*tr.CHOICES, hub.HUB, CUSTOM)),
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
    "gpu": ChoiceParam(tr.H100, pickers.gpu_options(GPUS)),
    # Fine-tuning method (issue 34): full training, LoRA on a bf16 base, QLoRA on a 4-bit base.
    "ft": ChoiceParam("full", ft_.METHODS),
    "rank": IntParam(ft_.DEFAULT_RANK, 1, 1 << 16),
    "targets": ChoiceParam(ft_.DEFAULT_TARGETS, ft_.TARGETS),
    "adt": ChoiceParam(ft_.DEFAULT_ADAPTER_DTYPE, ft_.ADAPTER_DTYPE_CHOICES),
    "dq": BoolParam(False),
    # Recipe levers (issue 43), beside "opt" and "ckpt": what makes the step fit
    "kbit": BoolParam(False),
    "liger": BoolParam(False),
    "offload": BoolParam(False),
    "pf": BoolParam(False),
    "trlhead": BoolParam(False),  # TRL SFTTrainer's fused LM head as the loss
    # every column of a wide table, not only its first ones (each fits a 1280 px window)
    "mcols": tables.ALL_COLUMNS,  # the measured single-GPU rows
    "dcols": tables.ALL_COLUMNS,  # the measured sharded rows
    "acols": tables.ALL_COLUMNS,  # "Can I train a 7B at 32k on one GPU?"
}


def of(key):
    """The model a cache key names: a choice's name (hashing a ModelConfig costs more than the
    search), or the model itself where it came from a Hub id or a config.json."""
    return tr.CHOICES[key] if isinstance(key, str) else key


@cached(max_entries=256)
def longest(key, gpu_bytes: int, batch: int, kw: tuple, ft: tuple = ()) -> int:
    """Exact search over s (attnmem.calc.max_train_seq_len); cached by the model's key (`of`).
    ft: the fine-tuning settings (method, rank, targets, adapter dtype, double quantization;
    empty: full training)."""
    return max_train_seq_len(of(key), gpu_bytes, batch, **dict(kw),
                             **ft_.calc_kwargs(*ft) if ft else {})


@cached(max_entries=256)
def needed(key, gpu_bytes: int, batch: int, s: int, kw: tuple) -> int:
    return train_gpus_needed(of(key), gpu_bytes, batch, s, max_gpus=1024, **dict(kw))


@cached(max_entries=256)
def never_fits(key, gpu_bytes: int, batch: int, s: int, kw: tuple) -> bool:
    """True when no number of GPUs fits: at 2^20 GPUs the sharded states are next to nothing,
    so what is left is one replica's activations, which more GPUs of this layout never split."""
    return ft_.never_fits(of(key), gpu_bytes, batch, s, dict(kw))


def _items(d: dict) -> tuple:
    """A keywords dict as a cache key (sorted items)."""
    return tuple(sorted(d.items()))


@kept(256)
def run_levers(key, batch: int, seq_len: int, attns: tuple[str, ...], base_kw: tuple,
               levers: tuple) -> tuple[dict, dict, dict]:
    """tr.run_levers, kept across runs and sessions by its inputs (the model by its key, `of`),
    shared read-only: one training step per attention, every run (issue 45 item 5). A refusal
    is raised again on every run (Streamlit keeps no exception)."""
    return tr.run_levers(of(key), batch, seq_len, list(attns), dict(base_kw), dict(levers))


@kept(256)
def cheapest(key, batch: int, seq_len: int, gpu_bytes: int, base: tuple, unit: str) -> tr.Cheapest:
    """tr.cheapest (the levers' combinations: ~12 training steps), kept as run_levers is."""
    return tr.cheapest(of(key), batch, seq_len, gpu_bytes, dict(base), unit)


@kept(256)
def side_by_side(key, gpu_bytes: int, batch: int, seq_len: int, kw: tuple,
                 ft_settings: tuple) -> list:
    """ft_.side_by_side (full, LoRA and QLoRA: their steps and longest contexts), kept as
    run_levers is."""
    return ft_.side_by_side(of(key), gpu_bytes, batch, seq_len, dict(kw), *ft_settings,
                            longest=lambda _m, g, b, **k: longest(key, g, b, tuple(sorted(k.items()))))


@kept(256)
def fit_table(key, gpu_bytes: int, batch: int, seq_len: int, attns: tuple[str, ...], kw: tuple,
              lever_kw: tuple, method: str, ft_settings: tuple, prec: str, ckpt: bool, opt: str,
              shard: str, tp: int, ep: int) -> tuple[list[dict], list[int], bool, list[tuple[str, str]]]:
    """The "Longest context and GPUs needed" rows for `attns` (none for a padding-free row:
    its lengths are given, nothing to search), the longest contexts found, whether any
    attention never fits, and the notes to show above the table (("caption" or "warn",
    text)). Kept across runs and sessions, shared read-only: twelve cached searches' keys
    hashed on every run cost ~10 ms (issue 45 item 5)."""
    full = method == "full"
    kw = dict(kw)
    lever_kw = dict(lever_kw)
    fit_rows, longest_seen, notes = [], [], []
    never_any = False
    for a in attns:
        ka = tuple(sorted(dict(kw, attention=a, **lever_kw).items()))
        s_max = longest(key, gpu_bytes, batch, ka, () if full else (method, *ft_settings))
        longest_seen.append(s_max)
        ka_need = tuple(sorted(dict(attention=a, precision=prec, checkpointing=ckpt, optimizer=opt,
                                    sharding="zero3" if shard == "none" else shard, tp=tp,
                                    ep=ep, **lever_kw).items()))
        try:
            n_need = 0 if not full else needed(key, gpu_bytes, batch, seq_len, ka_need)
            never = full and not n_need and never_fits(key, gpu_bytes, batch, seq_len, ka_need)
            why_not = ""
        except ValueError as err:  # a lever calc does not count on a sharded layout
            n_need, never, why_not = 0, False, str(err)
        if not full:
            need_text = "— (LoRA and QLoRA are modelled on one GPU)"
        elif why_not:
            need_text = "not computed"
            said = f"GPUs needed with {TRAIN_ATTENTION_LABELS[a]}: not computed: {why_not}"
            if shard == "none":  # ZeRO-3 was this table's assumption, not the user's choice
                notes.append(("caption", md_escape(said + " (the table assumes ZeRO-3 over the GPUs)")))
            else:
                notes.append(("warn", said))
        elif n_need:
            need_text = f"{n_need:,}"
        elif never:
            need_text = "never fits"  # why: the caption under the table (a long cell is cut off)
            never_any = True
        else:
            need_text = "more than 1,024"
        fit_rows.append({"attention": TRAIN_ATTENTION_LABELS[a],
                         "longest trainable context on this layout": f"{s_max:,}" if s_max else "none",
                         f"GPUs needed at s = {seq_len:,} ({'ZeRO-3' if shard == 'none' else shard}, t = {tp})":
                             need_text})
    return fit_rows, longest_seen, never_any, notes


def apply_trl() -> None:
    """The TRL box's button: calc's mapping of the pasted arguments sets the page's inputs
    (attnmem.pages.ui.training.trl_settings), which the URL then keeps; a refusal is said."""
    try:
        got = tr.trl_settings(st.session_state.get("_trl_text", ""), SPECS)
    except ValueError as err:
        st.session_state["_trl_said"] = ("refused", str(err))
        return
    for key, value in got.values.items():
        st.session_state[key] = value
    st.session_state["_trl_said"] = ("applied", got.notes, got.ignored)


page_setup("training")
charts.preload("PlotlyChart", "DataFrame")  # plotly.js and the data grid start loading now
st.title("Training step")
st.markdown("**How much memory does one training step take, where is its peak, and does it "
            "fit?** Weights, gradients, AdamW's two moments and every activation autograd "
            "keeps, per attention implementation, per GPU.")
# The answer comes first on screen, above the inputs (the first number on screen at 1280x800
# without scrolling, issue 45 item 2): the one line, then each attention's peak per GPU and
# verdict; both are filled once computed. The recipe levers and the TRL box are drawn below the
# inputs but read before the answer is computed.
top_answer = st.container()  # the answer in one line
answer_box = st.container()  # the peaks, verdicts and calc's refusals
measure_box = st.container()  # "Measure on this GPU", collapsed, under the answer

top = st.columns([1.5, 1.3, 1.7])  # wide enough for "bf16: bf16 parameters and AdamW state"
picked = pickers.model_picker(SPECS["model"], tr.CHOICES, where=top[0], traceable=True)
choice, model = picked.choice, picked.model
key = choice if choice in tr.CHOICES else model  # the searches' cache key (`of`)
used = dict(SPECS) | picked.specs  # a Hub id goes into the URL, never the file
gpu = pickers.gpu_picker(SPECS["gpu"], where=top[1])
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
ep = widgets.int_input("Expert-parallel degree (MoE)", "ep", SPECS["ep"], where=lay[3],
                       disabled=model.num_experts <= 1,
                       help="Each of ep data-parallel ranks holds 1/ep of every layer's experts; "
                            "tokens reach them by all-to-all, balanced routing assumed (counted, not "
                            "measured). It divides N / t and the experts per layer.")
ep = ep if model.num_experts > 1 else 1

lever_box = st.expander("What makes it fit: recipe levers, the cheapest combination that fits, "
                        "your TRL arguments", expanded=True)
with lever_box:
    st.text_area("Paste your TRL SFTConfig arguments (JSON, or key=value lines)", key="_trl_text",
                 height=90, max_chars=4000,
                 placeholder='{"per_device_train_batch_size": 4, "max_length": 4096, '
                             '"optim": "paged_adamw_8bit", "use_liger_kernel": true}',
                 help="The arguments that change memory (gradient_checkpointing, bf16, optim, "
                      "padding_free, packing, use_liger_kernel, activation_offloading, "
                      "per_device_train_batch_size, max_length) set this page's inputs; the "
                      "others keep TRL's defaults (attnmem/calc/train_levers.py cites them).")
    st.button("Apply the TRL arguments", on_click=apply_trl)
    trl_said = st.session_state.pop("_trl_said", None)
    if trl_said and trl_said[0] == "refused":
        warn(f"TRL arguments not applied: {trl_said[1]}")
    elif trl_said:
        st.caption(md_escape("TRL arguments applied: " + "; ".join(trl_said[1])
                             + (f". Ignored (no memory effect here): {', '.join(trl_said[2])}"
                                if trl_said[2] else "")))
    lev = st.columns(5)
    kbit = widgets.toggle(tr.LEVER_LABELS["kbit"], "kbit", SPECS["kbit"], where=lev[0],
                          disabled=method != "qlora",
                          help="QLoRA only: fp32 embeddings, lm_head and norms, checkpointing "
                               "with input gradients (peft's source, attnmem/calc/train_recipes.py)")
    liger = widgets.toggle(tr.LEVER_LABELS["liger"], "liger", SPECS["liger"], where=lev[1],
                           help="apply_liger_kernel_to_llama: the full logits are never built "
                                "(attnmem/calc/train_liger.py)")
    offload = widgets.toggle(tr.LEVER_LABELS["offload"], "offload", SPECS["offload"], where=lev[2],
                             help="torch.autograd.graph.save_on_cpu(pin_memory=True): saved "
                                  "tensors wait in host memory (full training only)")
    pf = widgets.toggle(tr.LEVER_LABELS["pf"], "pf", SPECS["pf"], where=lev[3],
                        help=f"The {batch:,} sequence(s) of s tokens in one row with position_ids "
                             "restarting at each (attnmem/calc/train_packed.py)")
    trl_head = widgets.toggle(tr.LEVER_LABELS["trlhead"], "trlhead", SPECS["trlhead"],
                              where=lev[4],
                              help="TRL 1.16's SFTTrainer scores tokens through a chunked LM "
                                   "head instead of the model's logits "
                                   "(attnmem/calc/train_trl_loss.py); set by the TRL box")
    cheapest_box = st.container()

if picked.traced is not None:  # outside calc's rules: transformers' own modules, traced
    unit, gpu_bytes = get_unit(), usable_bytes(gpu)
    below = st.container()  # what the traced peak holds and where, under the inputs
    with answer_box:
        pickers.gpu_note(gpu, unit, what="\"Fits\"")
        bad = ttr.unsupported(prec, method, adt, opt, kbit, liger, offload, pf, gpus, tp, shard,
                              ep) + (["TRL's fused LM head (not traced)"] if trl_head else [])
        if bad:
            ttv.refused(picked.traced, bad, top_answer)
        else:
            with st.spinner(ttv.tv.SPINNER):
                traced_steps = ttr.training(picked.traced, batch, seq_len, tuple(attns), ckpt,
                                            None if full else rank, targets)
            ttv.show(traced_steps, gpu, gpu_bytes, unit, f"one {gpu}",
                     lambda a: TRAIN_ATTENTION_LABELS.get(a, a), top_answer, details=below)
    cheapest_box.caption("Not searched for a model outside calc's rules: the levers are "
                         "calc's, and the trace runs none of them.")
    sync_url(used)
    st.stop()
step_b, step_s, packed = tr.step_shape(batch, seq_len, pf)
levers = tr.lever_kwargs(method, kbit, liger, offload, packed, trl_head)
plain = not levers  # the measured rows and the searches over s are for dense rows, no levers

unit = get_unit()
gpu_bytes = usable_bytes(gpu)  # what torch can use where sourced (attnmem.calc.gpus), else the spec sheet
kw = dict(precision=prec, checkpointing=ckpt, optimizer=opt, gpus=gpus, tp=tp, sharding=shard,
          ep=ep)


@kept(4)
def _bundled(stamp: tuple[tuple[str, int, int], ...]) -> tr.Bundled:
    """tr.bundled(), kept across runs and sessions: ~620 rows each predicted by calc, ~0.8 s of
    CPU that every run paid (issue 45 item 5); shared read-only, not copied per run. ``stamp``:
    the files' (path, mtime, size), so a replaced CSV is read and predicted again."""
    return tr.bundled()


def _stamp() -> tuple[tuple[str, int, int], ...]:
    """The bundled files' path, modification time and size (0, 0 where absent)."""
    out = []
    for p in (tr.DATA, tr.DIST_DATA):
        try:
            st_ = p.stat()
            out.append((str(p), st_.st_mtime_ns, st_.st_size))
        except OSError:
            out.append((str(p), 0, 0))
    return tuple(out)


@kept(8)
def _bundled_shown(stamp: tuple[tuple[str, int, int], ...], which: str, unit: str) -> pd.DataFrame:
    """The bundled rows (``which``: "compared" or "dist") in the user's unit with the short
    headers, kept as _bundled is (~620 rows formatted: ~60 ms of CPU a run)."""
    rows = getattr(_bundled(stamp), which)
    return tr.shown_table(rows, unit).rename(columns=tr.MEASURED_SHORT)


@kept(8)
def _seven_b(stamp: tuple[tuple[str, int, int], ...], unit: str) -> tuple[pd.DataFrame, list[str]]:
    """tr.seven_b_at_32k on the bundled rows and the answer per GPU as a line each, kept as
    _bundled is (~20 training steps)."""
    answer = tr.seven_b_at_32k(_bundled(stamp).rows, unit)
    lines = []
    for gpu_name, col in ((tr.H200, "fits one H200"), (tr.H100, "fits one H100")):
        ok = answer[answer[col] == "yes"]
        if ok.empty:
            lines.append(f"- **One {gpu_name}**: no attention fits either model at 32k, even with "
                         "checkpointing (computed).")
        else:
            said = "; ".join(f"{r['model']}: {r['attention']} (checkpointing {r['checkpointing']}, "
                             f"{r['peak']})" for _, r in ok.iterrows())
            lines.append(f"- **One {gpu_name}**: {md_escape(said)}.")
    return answer, lines


@kept(256)
def matching(stamp: tuple[tuple[str, int, int], ...], shape: str | None, batch: int, seq_len: int,
             prec: str, ckpt: bool, attns: tuple[str, ...], method: str | None) -> pd.DataFrame:
    """tr.matching_rows of the bundled rows, kept across runs and sessions by the inputs
    (boolean masks over ~620 rows of arrow strings: ~4 ms a call, twice a run)."""
    return tr.matching_rows(_bundled(stamp).compared, shape, batch, seq_len, prec, ckpt,
                            list(attns), method=method)


@kept(256)
def side_view(key, gpu_bytes: int, batch: int, seq_len: int, kw: tuple, ft_settings: tuple,
              unit: str, peaks: tuple, methods: tuple) -> tuple[list, pd.DataFrame, list, int]:
    """side_by_side's rows and what the section shows of them: the methods that fit, the table
    (calc's reasons left out), (method, reason) where calc refused one, and the longest context
    computed; kept as side_by_side is."""
    rows = side_by_side(key, gpu_bytes, batch, seq_len, kw, ft_settings)
    side = tr.side_by_side_table(rows, unit, dict(peaks), set(methods))
    fit_names = [ft_.METHOD_LABELS[r["method"]] for r in rows if r["fits"]]
    reasons = [(name, why) for name, why in zip(side["method"], side[tr.REASON], strict=True) if why]
    longest_done = max(((r["longest_context"] or 0) for r in rows if r["refused"] is None), default=0)
    return fit_names, side.drop(columns=[tr.REASON]), reasons, longest_done


@kept(256)
def cheapest_view(key, batch: int, seq_len: int, gpu_bytes: int, base: tuple,
                  unit: str) -> tuple[tr.Cheapest, pd.DataFrame, list]:
    """cheapest and what the section shows of each lever alone: the table (calc's reasons left
    out) and (lever, reason) where calc refused one; kept as cheapest is."""
    best = cheapest(key, batch, seq_len, gpu_bytes, base, unit)
    alone = best.alone
    reasons = [(name, why) for name, why in zip(alone["lever"], alone[tr.REASON], strict=True)
               if why and why != "already on"]  # calc's reason, as the side-by-side table says it
    return best, alone.drop(columns=[tr.REASON]), reasons


@kept(256)
def steps_view(run_key: tuple, unit: str, gpu: str, gpu_bytes: int, hits_key: tuple | None,
               model_name: str, batch: int, seq_len: int) -> dict:
    """What the page draws of run_levers' steps (`run_key`: its arguments): the stacked bars
    (a plotly dict) and their CSV, each moment of the step, and the first attention's
    activation terms; kept across runs and sessions by the inputs. `hits_key`: matching's
    arguments for the measured peaks laid on the bars, or None."""
    steps = run_levers(*run_key)[0]
    first = next(iter(steps.values()))
    hits = matching(*hits_key) if hits_key is not None else None
    traces, layout = tr.step_figure(steps, unit, gpu, gpu_bytes, hits)
    return {
        "figure": charts.figure(traces, "", f"memory per GPU ({unit})", 460, **layout),
        "csv": tr.step_table(steps).assign(model=model_name, batch=batch, seq_len=seq_len),
        # A moment the model does not have (the tied embedding's backward of an untied model)
        # is left out.
        "moments": pd.DataFrame([{"moment": ph, **{TRAIN_ATTENTION_LABELS[a]: fmt(m.phases[ph], unit)
                                                   for a, m in steps.items()}}
                                 for ph in tr.moments(first.phases, PHASES)]),
        # bytes as text: eager's s×s terms can exceed 64-bit integers (s = 10^8)
        "terms": pd.DataFrame([{"part": p, "tensor": lab, "size": fmt(x, unit), "bytes": f"{x:,}"}
                               for p, lab, x in first.activation_terms]),
    }


stamp = _stamp()
bundled = _bundled(stamp)  # the H200 rows beside their predictions
compared = bundled.compared
shape = tr.measured_shape(choice)
where_said = f"one {gpu}" if gpus == 1 else f"each {gpu} of {gpus:,}"


def side_by_side_section() -> None:
    """Full, LoRA and QLoRA side by side for this model, batch, length and GPU (first attention
    selected), every number computed; a method calc refuses shows the reason."""
    st.markdown("### Which of these fits on my GPU, at what length?")
    st.markdown(f"{md_escape(model.name)}, batch {batch:,}, s = {seq_len:,}, "
                f"{TRAIN_ATTENTION_LABELS[attns[0]]}, on {md_escape(gpu)}; LoRA rank {rank}, "
                f"{targets}, {adt} adapters; QLoRA double quantization {'on' if dq else 'off'}.")
    methods = set(compared["method"]) if not compared.empty else set()
    peaks = {}
    if shape and gpus == 1 and plain:
        at = matching(stamp, shape, batch, seq_len, prec, ckpt, tuple(attns[:1]), None)
        peaks = {r["method"]: int(r["measured peak"]) for _, r in at.iterrows()}
    side_key = (key, gpu_bytes, step_b, step_s, _items(dict(kw, attention=attns[0], **levers)),
                ft_settings, unit, tuple(peaks.items()), tuple(sorted(methods)))
    fit_names, side, reasons, longest_done = side_view(*side_key)
    where = f"one {gpu}" if gpus == 1 else f"each {gpu} of {gpus:,}"
    st.markdown(f"**On {md_escape(where)} at s = {seq_len:,}**: "
                + (f"fits with {', '.join(fit_names)} (computed)." if fit_names else
                   "none of full training, LoRA or QLoRA fits (computed)."))
    tables.table(side, hide_index=True, content_key=("training side", side_key))
    for name, why in reasons:
        st.markdown(md_escape(f"{name}: not computed: {why}"))
    longest_past_trained_note(model, longest_done)
    lora_measured = len(methods - {"full"})
    st.caption(f"{COMPUTED}: the peak and whether it fits from attnmem.calc.training_step, the "
               "longest context from attnmem.calc.max_train_seq_len with the same "
               "keywords, and the GPUs needed from attnmem.calc.train_gpus_needed for full training (LoRA is modelled on "
               "one GPU). Measured: the bundled H200 steps (data/training_steps_h200.csv) "
               + ("are full training only; LoRA and QLoRA steps are not measured yet (the "
                  "harness `python -m attnmem.measure --train --plan h200-lora` exists and has "
                  "not run on a GPU yet)." if not lora_measured else
                  "include LoRA/QLoRA rows (below, with their predictions)."))


def cheapest_section(attention: str) -> tr.Cheapest:
    """Under the levers: the fewest levers on top of these settings that fit the GPU
    (attnmem.calc.train_levers.cheapest_fit) with each one's saving, and each lever alone."""
    base = dict(kw, attention=attention, **ft_kw, **levers)
    cheap_key = (key, step_b, step_s, gpu_bytes, _items(base), unit)
    best, alone_shown, alone_reasons = cheapest_view(*cheap_key)
    where = where_said
    with cheapest_box:
        st.markdown(f"**Cheapest combination that fits {md_escape(where)} at s = {seq_len:,}** "
                    f"({TRAIN_ATTENTION_LABELS[attention]}, on top of the settings above)")
        if not best.fits:
            st.error(md_escape(f"No combination of Liger, 8-bit or paged 8-bit AdamW, checkpointing and "
                 f"offloading fits {where}; the smallest peak computed is "
                 f"{fmt(best.peak_bytes, unit)}." if best.peak_bytes else
                 "No combination of the levers is computed for these settings (calc's reasons "
                 "under the table below)."), icon=":material/cancel:")
        elif not best.levers:
            st.success(f"Fits as it is ({fmt(best.peak_bytes, unit)}): no lever needed "
                       "(computed).", icon=":material/check_circle:")
        else:
            st.success(md_escape(f"Fits with {' + '.join(best.levers)}: peak "
                                 f"{fmt(best.peak_bytes, unit)} (computed)."),
                       icon=":material/check_circle:")
            tables.table(best.combo, hide_index=True, content_key=("training combo", cheap_key))
        st.markdown("Each lever alone on top of these settings:")
        tables.table(alone_shown, hide_index=True, content_key=("training alone", cheap_key))
        for name, why in alone_reasons:
            st.markdown(md_escape(f"{name}: not computed: {why}"))
        if best.alone.attrs.get("base_refused"):
            st.markdown(md_escape("These settings as chosen are not computed ("
                                  + best.alone.attrs["base_refused"] + "): the combination and "
                                  "the table start from them without Liger and offloading."))
        st.caption(f"{COMPUTED}: every peak from attnmem.calc.training_step, each lever counted "
                   "from its library's source (attnmem/calc/train_optimizer.py, train_liger.py, "
                   "train_recipes.py); the fewest levers, then the lowest peak, from "
                   "attnmem.calc.train_levers.cheapest_fit; a lever's saving is the combination's "
                   "peak without it minus with it. Order of cost: Liger, 8-bit AdamW, paged "
                   "8-bit AdamW (its state in CUDA unified memory, not counted in the peak, as "
                   "max_memory_allocated does not), checkpointing (recomputes the forward), "
                   "offloading (copies to the host). Not measured on a GPU yet.")
    return best


with answer_box:
    pickers.gpu_note(gpu, unit, what="\"Fits\", the longest context and GPUs needed")
    trained_context_note(model, seq_len)
    try:
        run_key = (key, step_b, step_s, tuple(attns), _items(dict(kw, **ft_kw)), _items(levers))
        steps, no_kernel, lever_refused = run_levers(*run_key)
    except tr.LeverRefusal as err:
        warn(f"These levers cannot be computed with these settings: {err}")
        top_answer.markdown("**Not computed with these levers**: calc's reason is just below; "
                            "what makes it fit is below the inputs.")
        cheapest_section(attns[0])
        side_by_side_section()
        sync_url(used)
        st.stop()
    except ValueError as err:
        st.error(md_escape(f"These settings cannot be computed: {err}"), icon=":material/block:")
        top_answer.markdown("**Not computed**: calc's reason is just below.")
        cheapest_box.caption("No cheapest combination: these settings are refused without any "
                             "lever (the message above).")
        side_by_side_section()
        sync_url(used)
        st.stop()
    for a, why in no_kernel.items():
        st.warning(md_escape(f"Not computed: {TRAIN_ATTENTION_LABELS[a]}: {why}"),
                   icon=":material/block:")
    for a, why in lever_refused.items():
        warn(f"Not computed with these levers: {TRAIN_ATTENTION_LABELS[a]}: {why}")

    first_attn = next(iter(steps))
    first = steps[first_attn]
    dp = gpus // tp
    st.caption(
        f"**{md_escape(model.name)}**: {model.num_layers} layers, hidden {model.hidden_size:,}, "
        f"{model.num_heads} query / {model.num_kv_heads} KV heads of {model.head_dim}, MLP "
        f"{model.intermediate_size:,}, vocabulary {model.vocab_size:,}. Per GPU: {gpus:,} GPU(s) = "
        f"tensor parallel {tp} × data parallel {dp}, sharding {SHARDING_LABELS[shard]}"
        + (f", experts split over {ep} ranks (all-to-all, balanced routing)." if ep > 1 else ".")
        + (f" Levers: {md_escape(tr.levers_said(levers, opt, ckpt))}." if not plain or opt != "adamw" else ""))

    cols = st.columns(len(steps))
    for col, (a, m) in zip(cols, steps.items(), strict=True):
        with col:
            st.metric(f"{TRAIN_ATTENTION_LABELS[a]}: peak", fmt(m.peak_bytes, unit),
                      help=f"{COMPUTED}: the peak per GPU, attnmem.calc.training_step, at '{m.peak_phase}'.")
            st.caption(f"Peak at **{m.peak_phase}**; before the step {fmt(m.before_step_bytes, unit)}."
                       + (f" Paged optimizer state in CUDA unified memory, not counted: "
                          f"{fmt(m.optimizer_paged_bytes, unit)}." if m.optimizer_paged_bytes else ""))
            if m.peak_bytes <= gpu_bytes:
                st.success(f"Fits one {gpu} ({fmt(gpu_bytes - m.peak_bytes, unit)} free).", icon=":material/check_circle:")
            else:
                st.error(f"Does not fit one {gpu}: {fmt(m.peak_bytes - gpu_bytes, unit)} over.", icon=":material/cancel:")
with measure_box:  # this page's exact inputs through the bundled harness (attnmem.measure.on_this_gpu)
    measure_here.section(
        "train", {a: lambda a=a: gpu_run.train_request(
            model, batch=batch, seq_len=seq_len, attention=a, precision=prec, checkpointing=ckpt,
            method=method, rank=rank, targets=targets, adapter_dtype=adt, double_quant=dq,
            optimizer=opt, kbit=kbit, liger=liger, offload=offload, padding_free=pf, gpus=gpus,
            tp=tp, sharding=shard, ep=ep) for a in steps},
        key="gpu_train", unit=unit, compared=compared, compared_key=("train: bundled", stamp),
        names=gpu_run.harness_models("train", model), length_col="seq_len", length=seq_len,
        batch=batch, label=lambda a: TRAIN_ATTENTION_LABELS.get(a, a),
        also={"precision": prec, "checkpointing": ckpt, "method": method},
        columns=("model", "method", "batch", "seq_len", "attention", "precision",
                 "checkpointing", "measured peak", "predicted peak", "peak error"))
# what makes it fit: for the attention with the lowest peak (the one closest to fitting)
best_attn = min(steps, key=lambda a: steps[a].peak_bytes)
best = cheapest_section(best_attn)
top_answer.markdown(tr.headline(steps, gpu_bytes, md_escape(where_said), unit, best, best_attn))

# Stacked bars: what exists before the step, then the activations at the end of the forward;
# the peak of the step as a marker (its moment holds some of these, and gradients), and the
# H200's measured peak where a bundled row has exactly these inputs.
hits_key = (stamp, shape, batch, seq_len, prec, ckpt, tuple(attns), method)
hits = matching(*hits_key)
if not plain:  # the bundled rows ran without the recipe levers
    hits = hits.iloc[0:0]
steps_key = (run_key, unit, gpu, gpu_bytes,
             (hits_key if plain else None) if shape and gpus == 1 else None,
             model.name, batch, seq_len)
drawn = steps_view(*steps_key)
charts.chart(drawn["figure"], "training_chart", "training-step", drawn["csv"],
             content_key=("training steps", steps_key))
st.caption(f"{COMPUTED}. Bars: before the step (weights, AdamW state, buffers: cuBLAS "
           "workspaces, inputs and the layout's) plus the activations alive at the end of the "
           "forward; the diamond is the step's peak (attnmem/calc/training_step.py lists each moment "
           "and every tensor with its source).")

st.markdown("**Each moment of the step (per GPU)** — the peak is the largest")
# A moment the model does not have (the tied embedding's backward of an untied model) is left out.
tables.table(drawn["moments"], hide_index=True, content_key=("training moments", steps_key))

with st.expander("Every activation term of " + TRAIN_ATTENTION_LABELS[first_attn]):
    tables.text_table(drawn["terms"], content_key=("training terms", steps_key))

lever_kw = {k: v for k, v in levers.items() if k != "packed_lengths"}
fit_rows, longest_seen, never_any, fit_notes = fit_table(
    key, gpu_bytes, batch, seq_len, () if pf else tuple(steps), _items(kw), _items(lever_kw),
    method, ft_settings, prec, ckpt, opt, shard, tp, ep)
for kind, text in fit_notes:
    (st.caption if kind == "caption" else warn)(text)
st.markdown(f"**Longest context and GPUs needed on {md_escape(gpu)}** (exact integer searches)")
if pf:
    st.caption("Padding-free: the row's sequence lengths are given (batch × s), so there is no "
               "longest context to search for, nor a GPU count (the layouts count dense rows).")
else:
    tables.table(pd.DataFrame(fit_rows), hide_index=True)
longest_past_trained_note(model, max(longest_seen, default=0))
if never_any:
    st.caption("*Never fits*: one replica's activations alone exceed the GPU, so no number of "
               "GPUs fits (ZeRO-3 shards weights, gradients and optimizer state, not activations).")

side_by_side_section()

st.markdown("### Measured on an H200 against the prediction")
if bundled.rows.empty:
    st.info("No bundled training-step measurements yet (data/training_steps_h200.csv). Run "
            "`python -m attnmem.measure --train --plan h200` on a GPU to make them.")
if not compared.empty:
    if shape and len(hits) and gpus == 1:
        st.markdown("Rows matching these inputs (measured peak is `max_memory_allocated()` over the step):")
        view = hits
    else:
        st.markdown("No measured row matches these inputs (pick a *measured shape* model, one "
                    "GPU, and a measured length): every bundled row with its prediction.")
        view = None  # every row: formatted once (_bundled_shown)
    tables.wide_table(_bundled_shown(stamp, "compared", unit) if view is None else
                      tr.shown_table(view, unit).rename(columns=tr.MEASURED_SHORT),
                      tr.MEASURED_FIRST, "mcols",
                      content_key=("bundled", stamp, "compared", unit) if view is None else None)
    errs = compared["peak error"].dropna()
    big = compared[compared["seq_len"] >= 1024]["peak error"].dropna()
    if len(errs):
        st.caption(f"Measured: {len(compared)} rows; largest |error| of the peak "
                   f"{errs.abs().max():.2%} (s ≥ 1,024: {big.abs().max() if len(big) else float('nan'):.2%}).")

st.markdown("### Sharded over several GPUs (DDP, FSDP2): measured against the per-GPU prediction")
dist_rows = bundled.dist
if dist_rows.empty:
    st.caption("None measured yet: no machine with several GPUs has been available to this "
               "project. `python -m attnmem.measure.train_dist --nproc-per-node N --sharding "
               "ddp fsdp ...` measures every rank of a DDP or FSDP2 (fully_shard) step of the "
               "same models and writes data/training_steps_dist_h200.csv, which this section "
               "then shows with the error of every prediction (NOTES.md, Multi-GPU harnesses).")
else:
    tables.wide_table(_bundled_shown(stamp, "dist", unit), tr.DIST_FIRST, "dcols",
                      content_key=("bundled", stamp, "dist", unit))
    errs = dist_rows["peak error"].dropna()
    st.caption(f"Measured: {len(dist_rows)} ranks; largest |error| of the peak "
               f"{errs.abs().max() if len(errs) else float('nan'):.2%}. The held bytes are "
               "counted from each rank's tensors after the warm-up step (parameter shards, "
               "gradients, AdamW state).")

st.markdown("### Can I train a 7B at 32k on one GPU?")
st.markdown("Llama-2-7B and Llama-3-8B shapes, s = 32,768, B = 1, bf16 parameters and AdamW "
            "state, one GPU (computed; the step time is measured on the 2-layer model of the "
            "same widths where bundled).")
answer, answer_lines = _seven_b(stamp, unit)
for line in answer_lines:
    st.markdown(line)
tables.wide_table(answer, tr.SEVEN_B_FIRST, "acols", content_key=("seven_b", stamp, unit))
st.caption("At this length the fp32 log-softmax and its two gradients (12·s·V bytes) and, "
           "for eager attention, the s×s softmax of every layer decide it: the fused kernels "
           "keep only an output and a log-sum-exp per row.")

sync_url(used)
