"""Many GPUs: context parallelism (ring attention). How long a context fits on c GPUs, what
each GPU holds, and what it sends.

Thin page: widgets -> attnmem.calc.context_parallel (per-rank memory replayed from attnmem/kernels/ring and
torch's context_parallel; traffic; a training estimate) -> metrics, two charts over c = 1 to
64, the ring schedule as a heatmap (ranks x steps, which key/value block each rank holds) and
the rank's tensors at its peak; measured points from data/ring_one_rank_h200.csv (written by
``python -m attnmem.measure.ring.one_rank``) where the shape matches.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run on its own (AppTest)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from attnmem.calc import GPUS, MAX_SEQ_LEN, MODELS, cp_sweep  # noqa: E402
from attnmem.calc.context_parallel import (  # noqa: E402
    CP_IMPL_LABELS,
    CP_IMPLEMENTATIONS,
    context_parallel_memory,
    context_parallel_training,
    ring_comm_bytes,
    ring_schedule,
    ring_step_kind,
    zigzag_chunks,
)
from attnmem.calc.units import short_len  # noqa: E402
from attnmem.measure.ring import results as ring_results  # noqa: E402
from attnmem.pages.ui import charts, pickers, tables, widgets  # noqa: E402
from attnmem.pages.ui.messages import COMPUTED  # noqa: E402
from attnmem.pages.ui.state import cached, get_unit, kept, page_setup, sync_url  # noqa: E402
from attnmem.pages.ui.units import fmt, in_unit  # noqa: E402
from attnmem.pages.ui.url_state import (  # noqa: E402
    BoolParam,
    ChoiceParam,
    IntParam,
    md_escape,
)

MEASURED_SHAPE = "H = 32, d = 128 (the measured shape)"
SPECS = {
    "model": ChoiceParam("Llama 3.1 8B", tuple(MODELS)),
    "gpu": pickers.GPU_SPEC,
    "impl": ChoiceParam("triton", CP_IMPLEMENTATIONS),
    "s": IntParam(131072, 2, MAX_SEQ_LEN),
    "c": IntParam(8, 1, cp_sweep.MAX_C),
    "pass": ChoiceParam("fwd+bwd", ("fwd", "fwd+bwd")),
    "dtype": ChoiceParam("bf16", ("bf16", "fp16", "fp32")),
    "attn": ChoiceParam("model", ("model", MEASURED_SHAPE)),
    "ckpt": BoolParam(True),
    "shard": BoolParam(True),
}


@cached()
def per_gpu_sweep(impl: str, heads: int, kv_heads: int, head_dim: int, dtype: str, s: int,
                  backward: bool) -> pd.DataFrame:
    return cp_sweep.per_gpu_sweep(impl, heads, kv_heads, head_dim, dtype, s, backward)


@cached(max_entries=2048)
def longest_at(model_name: str, gpu_bytes: int, impl: str, dtype: str, ckpt: bool, shard: bool,
               heads: int, kv_heads: int, head_dim: int, world: int) -> dict:
    """attnmem.calc.cp_sweep.longest_at, cached point by point by the model's name."""
    return cp_sweep.longest_at(MODELS[model_name], gpu_bytes, impl, dtype, ckpt, shard, heads,
                               kv_heads, head_dim, world)


@cached(max_entries=256)
def cp_memory(impl: str, heads: int, s: int, head_dim: int, dtype: str, backward: bool,
              world: int, kv_heads: int):
    """attnmem.calc.context_parallel_memory (batch 1, causal), kept across runs and sessions:
    a replay of the ring's schedule, ~40 ms of CPU (issue 45 item 5)."""
    return context_parallel_memory(impl, 1, heads, s, head_dim, dtype, True, backward, world,
                                   kv_heads)


@cached(max_entries=256)
def cp_training(model, world: int, s: int, impl: str, ckpt: bool, shard: bool):
    """attnmem.calc.context_parallel_training, kept as cp_memory is (keyed by the model's
    fields): a training step with the ring's attention peaks, ~70 ms of CPU."""
    return context_parallel_training(model, world, s, impl=impl, checkpointing=ckpt,
                                     shard_states=shard)


@kept(256)
def longest_sweep(model_name: str, gpu_bytes: int, impl: str, dtype: str, ckpt: bool, shard: bool,
                  heads: int, kv_heads: int, head_dim: int, world: int) -> pd.DataFrame:
    """cp_sweep.longest_sweep over `longest_at` (cached point by point, so another GPU count
    reuses the other twelve), kept whole by its inputs, shared read-only: thirteen cached
    calls' keys hashed cost ~5 ms a run (issue 45 item 5)."""
    return cp_sweep.longest_sweep(
        lambda c: longest_at(model_name, gpu_bytes, impl, dtype, ckpt, shard, heads, kv_heads,
                             head_dim, c), world)


def _ring_stamp() -> tuple[int, int]:
    """The bundled ring CSV's modification time and size ((0, 0) where absent)."""
    try:
        st_ = ring_results.DATA.stat()
        return st_.st_mtime_ns, st_.st_size
    except OSError:
        return 0, 0


@kept(4)
def ring_measurements(stamp: tuple[int, int]) -> tuple[pd.DataFrame | None, list[pd.DataFrame]]:
    """The one-rank measurements (read and checked: ~10 ms a run before, issue 45 item 5) and
    the two tables the page shows of them (memory, then time: each fits a 1280 px window),
    kept while the file's stamp is the same; shared read-only."""
    measured = ring_results.read_ring_measurements()
    if measured is None:
        return None, []
    table = ring_results.with_link_speed(measured)
    run = ("seq_len", "world_size", "rank", "pass")
    return measured, [table[[col for col in (*run, *what) if col in table.columns]]
                      for what in (("peak_bytes", "predicted_bytes", "error_pct"),
                                   ("fwd_step_ms", "bwd_step_ms", "link_GBps_to_hide_kv", "gpu"))]


@kept(128)
def per_gpu_view(impl: str, heads: int, kv_heads: int, head_dim: int, dtype: str, s_in: int,
                 backward: bool, pas: str, unit: str,
                 stamp: tuple[int, int]) -> tuple[pd.DataFrame, dict]:
    """The per-GPU sweep and its figure (a plotly dict: the computed line, and the measured
    ranks where the bundled run has this shape), kept across runs and sessions by the inputs
    and the measurements' stamp; shared read-only."""
    sweep = per_gpu_sweep(impl, heads, kv_heads, head_dim, dtype, s_in, backward)
    traces = [dict(type="scatter", x=sweep["GPUs"].tolist(),
                   y=[in_unit(b, unit) for b in sweep["per_gpu_bytes"]], mode="lines+markers",
                   name=f"computed: {CP_IMPL_LABELS[impl]}",
                   hovertemplate="%{x} GPUs: %{y:.3f} " + unit + "<extra></extra>")]
    measured = ring_measurements(stamp)[0]
    if measured is not None:
        shown = ring_results.rows_of_shape(measured, heads, kv_heads, head_dim, dtype, pas, s_in)
        if impl == "triton" and len(shown):
            worst = ring_results.worst_rank_peaks(shown)
            inputs = {int(r.GPUs): int(r.inputs_bytes) for r in sweep.itertuples()}
            traces.append(dict(
                type="scatter", mode="markers", name="measured (one rank simulated, H200)",
                x=worst["world_size"].tolist(),
                y=[in_unit(int(b) + inputs.get(int(w), 0), unit)
                   for w, b in zip(worst["world_size"], worst["peak_bytes"], strict=True)],
                marker=dict(size=11, symbol="x")))
    fig = charts.figure(traces, "GPUs in the ring (c)", f"per GPU ({unit})", height=360,
                        yaxis=dict(type="log"))
    return sweep, fig


@kept(64)
def ring_figure(shown_c: int) -> dict:
    """The ring schedule of `shown_c` GPUs as a heatmap (a plotly dict): which key/value block
    each rank holds at each step; ~1,000 hover texts at 32 GPUs, built once per count."""
    held = ring_schedule(shown_c)
    text = [[f"{j}" for j in row_] for row_ in held]
    hover = [[f"rank {r}, step {t}: K/V of rank {held[r][t]} (chunks "
              f"{', '.join(map(str, zigzag_chunks(held[r][t], shown_c)))}), "
              f"{ring_step_kind(r, shown_c, t, True).replace('_', ' ')}"
              for t in range(shown_c)] for r in range(shown_c)]
    heat = dict(type="heatmap", z=held, text=text, texttemplate="%{text}" if shown_c <= 16 else "",
                customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                colorscale="Viridis", showscale=False, x=list(range(shown_c)),
                y=list(range(shown_c)))
    return charts.figure([heat], "step t", "rank r", height=min(120 + 24 * shown_c, 560),
                         yaxis=dict(autorange="reversed"))


page_setup("many_gpus")
charts.preload()  # plotly.js starts loading now, not after every element above the chart
st.title("Many GPUs: context parallelism")
st.markdown("**How long a context fits on c GPUs, and what does each GPU hold?** Ring "
            "attention splits the sequence over c GPUs and passes the key/value blocks around "
            "a ring (causal: zigzag load balancing, rank r holds chunks r and 2c−1−r).")

top = st.columns([1.7, 2, 2.3])  # the third choice's longest value fits at 1280 px
picked = pickers.model_picker(SPECS["model"], MODELS, where=top[0])
model_name, model = picked.choice, picked.model
gpu = pickers.gpu_picker(SPECS["gpu"], where=top[1])
impl = widgets.select("Ring", "impl", SPECS["impl"], where=top[2],
                      format_func=lambda i: CP_IMPL_LABELS[i])
row = st.columns(4)
world = widgets.int_input("GPUs in the ring (c)", "c", SPECS["c"], where=row[0])
pas = widgets.radio("Pass", "pass", SPECS["pass"], where=row[1])
dtype = widgets.select("dtype", "dtype", SPECS["dtype"], where=row[2])
attn = widgets.select("Attention shape", "attn", SPECS["attn"], where=row[3])
row2 = st.columns(2)
ckpt = widgets.toggle("Activation checkpointing (training step)", "ckpt", SPECS["ckpt"],
                      where=row2[0])
shard = widgets.toggle("Weights, gradients, optimizer sharded over the c GPUs (FSDP)", "shard",
                       SPECS["shard"], where=row2[1])
s_in = widgets.seq_len_input("Total context s (tokens)", "s", SPECS["s"], hi_pow2=1 << 24)

if attn == "model":
    heads, kv_heads, head_dim = model.num_heads, model.num_kv_heads, model.head_dim
else:
    heads, kv_heads, head_dim = 32, 32, 128
backward = pas == "fwd+bwd"
unit = get_unit()
s = cp_sweep.round_for(s_in, world)
if s != s_in:
    st.info(f"s = {s_in:,} does not split into {2 * world} equal chunks (zigzag over {world} "
            f"GPUs): using s = {s:,}.")
if s == 0:
    st.error(f"s must be at least {2 * world} tokens for {world} GPUs.", icon=":material/block:")
    sync_url(SPECS)
    st.stop()
try:
    mem = cp_memory(impl, heads, s, head_dim, dtype, backward, world, kv_heads)
    comm = ring_comm_bytes(1, heads, s, head_dim, dtype, world, kv_heads, backward, impl)
    longest = longest_sweep(model_name, GPUS[gpu], impl, dtype, ckpt, shard, heads, kv_heads,
                            head_dim, world)
except ValueError as err:
    st.error(md_escape(f"These settings cannot be computed: {err}"), icon=":material/block:")
    sync_url(SPECS)
    st.stop()
try:
    train = cp_training(model, world, s, impl, ckpt, shard)
except ValueError as err:  # e.g. torch's ring (equal heads only) with a GQA model
    train = None
    st.warning(md_escape(f"No training estimate for {model.name} with this ring: {err}"))

here = longest[longest["GPUs"] == world].iloc[0]
m1, m2, m3, m4 = st.columns(4)
m1.metric("Per GPU: one attention call", fmt(mem.total_bytes, unit),
          help=f"{COMPUTED}: rank {mem.rank}'s local q, k, v"
               f"{', dO' if backward else ''} ({fmt(mem.inputs_bytes, unit)}) plus its extra "
               f"peak ({fmt(mem.peak_extra_bytes, unit)}), attnmem.calc.context_parallel_memory.")
ts = here["training_seq_len"]
m2.metric(f"Longest context on {world} × {gpu.split(' ')[1] if ' ' in gpu else gpu}",
          "—" if pd.isna(ts) else f"{int(ts):,}",
          help=f"{COMPUTED}: the longest trainable context; {model.name}, causal, batch 1, bf16, AdamW; attnmem.calc.training_step "
               "on s/c tokens per GPU (FSDP over the c GPUs when sharded) with the ring's "
               "attention peaks in place of a plain call's (attnmem.calc.max_context_parallel_seq_len).")
trained = model.max_position_embeddings
if trained and not pd.isna(ts) and int(ts) > trained:
    st.info(f"The longest trainable context, {int(ts):,} tokens, is past the {trained:,} "
            f"{model.name} was trained for: training that far also needs its positions "
            "extended (e.g. a larger RoPE base), which the memory figure does not include.",
            icon=":material/warning:")
if trained and s > trained:
    st.info(f"s = {s:,} is past the {trained:,} tokens {model.name} was trained for.",
            icon=":material/warning:")
m3.metric("Sent per GPU per call", fmt(comm.total_bytes, unit),
          help=f"{COMPUTED}: forward (c−1)·2·B·H_kv·(s/c)·d·e = {fmt(comm.forward_bytes, unit)}"
               f"; backward the same plus c·2·B·H_kv·(s/c)·d·4 (fp32 dK, dV) = "
               f"{fmt(comm.backward_bytes, unit)} (Liu et al. 2023, arXiv 2310.01889).")
step_layers = model.num_layers * (2 if ckpt else 1)
per_step = model.num_layers * comm.total_bytes + (
    model.num_layers * comm.forward_bytes if ckpt else 0)
m4.metric("Sent per GPU per step", fmt(per_step, unit),
          help=f"{COMPUTED}: {model.num_layers} layers × (forward + backward)"
               f"{' + the recomputed forward of checkpointing' if ckpt else ''}.")
if world == 2:
    st.caption("Two GPUs hold about what one does for attention alone: the fp32 accumulators "
               "and the double-buffered blocks cost what halving the sequence saves; from three "
               "on, each GPU holds less (the rest of the model's activations halve at once).")

left, right = st.columns(2)
with left:
    st.markdown(f"**Per GPU, one attention call over s ≈ {short_len(s)} tokens, by GPU count**")
    ring_stamp = _ring_stamp()
    sweep, fig = per_gpu_view(impl, heads, kv_heads, head_dim, dtype, s_in, backward, pas, unit,
                              ring_stamp)
    charts.chart(fig, "cp_per_gpu", "many_gpus_per_gpu", sweep, content_key=(
        "per gpu", impl, heads, kv_heads, head_dim, dtype, s_in, backward, pas, unit, ring_stamp))
with right:
    # The numbers as a table, the chart one click away: each plotly chart drawn costs a direct
    # load 0.5-0.8 s (issue 45 item 3); the per-GPU chart beside it stays drawn.
    st.markdown(f"**Longest context on c × {md_escape(gpu)}** (tokens)")
    tables.table(pd.DataFrame({
        "GPUs (c)": [f"{int(c):,}" for c in longest["GPUs"]],
        f"training step of {model.name}": ["—" if pd.isna(v) else f"{int(v):,}"
                                           for v in longest["training_seq_len"]],
        "one attention call, fwd+bwd": ["—" if pd.isna(v) else f"{int(v):,}"
                                        for v in longest["attention_seq_len"]],
    }), hide_index=True)
    traces = [
        dict(type="scatter", x=longest["GPUs"].tolist(),
             y=longest["training_seq_len"].tolist(), mode="lines",
             name=f"training step of {model.name}"),
        dict(type="scatter", x=longest["GPUs"].tolist(),
             y=longest["attention_seq_len"].tolist(), mode="lines",
             name="one attention call, forward+backward"),
    ]
    fig = charts.figure(traces, "GPUs in the ring (c)", "tokens", height=360, yaxis=dict(type="log"))
    charts.chart_on_open("Chart: longest context by GPU count", fig, "cp_longest",
                         "many_gpus_longest", longest)

shown_c = min(world, 32)
charts.chart_on_open(f"The ring on {world} GPUs: which key/value block each rank holds at each step",
                     ring_figure(shown_c), "cp_ring", "many_gpus_ring", content_key=("ring", shown_c))
st.caption(("Showing the first 32 ranks. " if world > 32 else "") +
           "Cell = the rank whose key/value block is held, (r − t) mod c (Liu et al. 2023, "
           "Algorithm 1). Step 0: the local shard with the causal mask; a block from a lower "
           "rank: all queries × its first chunk; from a higher rank: the second query chunk × "
           "all its keys (attnmem.kernels.ring.step_kind; torch's _templated_ring_attention).")

st.markdown(f"**What rank {mem.rank} holds at its peak** (the rank with the largest peak)")
terms = pd.DataFrame(mem.terms, columns=["tensor", "bytes"])
terms = pd.concat([pd.DataFrame([{"tensor": "local inputs (q, k, v" + (", dO)" if backward
                                                                         else ")"),
                                  "bytes": mem.inputs_bytes}]), terms], ignore_index=True)
tables.table(terms.assign(size=terms["bytes"].map(lambda b: fmt(b, unit)))[
    ["tensor", "size", "bytes"]], hide_index=True)
if train is not None:
    st_ = train.step
    t_rows = pd.DataFrame([
        {"part": "weights, gradients, AdamW state" + (" (FSDP over the c GPUs)" if shard
                                                      and world > 1 else ""),
         "bytes": st_.before_step_bytes},
        {"part": f"activations of {train.local_seq_len:,} local tokens (end of forward)",
         "bytes": st_.activations_bytes},
        {"part": "ring attention, forward extra (one layer)", "bytes": train.ring_forward_bytes},
        {"part": "ring attention, forward+backward extra (one layer)",
         "bytes": train.ring_backward_bytes},
        {"part": f"peak ({train.peak_phase})", "bytes": train.total_bytes},
    ])
    with st.expander(f"Training step per GPU at s = {s:,} (bf16, attnmem.calc.training_step on "
                     f"{train.local_seq_len:,} tokens with the ring's attention): "
                     f"{fmt(train.total_bytes, unit)}"):
        tables.table(t_rows.assign(size=t_rows["bytes"].map(lambda b: fmt(b, unit)))[
            ["part", "size", "bytes"]], hide_index=True)

measured, measured_tables = ring_measurements(ring_stamp)
if measured is None:
    st.caption("Measured: none yet (data/ring_one_rank_h200.csv is written by `python -m "
               "attnmem.measure.ring.one_rank --out DIR` on one GPU).")
else:
    with st.expander(f"Measured on one GPU: {len(measured)} rank runs, largest |error| "
                     f"{measured['error_pct'].abs().max():.3f}%"):
        # Memory, then time: two tables of the same runs, each fits a 1280 px window.
        for i, table in enumerate(measured_tables):
            tables.table(table, hide_index=True, content_key=("ring measured", ring_stamp, i))
        st.caption("Measured: one rank of the ring simulated on one GPU (its incoming blocks "
                   "copied in place of communication; attnmem/measure/ring/simulate.py); peak = "
                   "max_memory_allocated during the call minus memory_allocated before. "
                   "link_GBps_to_hide_kv: K/V bytes of one step ÷ the step's measured local "
                   "forward time, the bandwidth at which the send hides behind the work.")
st.caption(f"{COMPUTED} unless marked measured. Per-rank memory: attnmem/calc/context_parallel.py "
           "(replays attnmem/kernels/ring/ring.py, and torch 2.13's _context_parallel/_attention.py "
           "for the SDPA rings; torch keeps all c key/value blocks after its all-gather). "
           f"{step_layers} attention passes per training step.")
sync_url(SPECS)
