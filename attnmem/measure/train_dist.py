"""Measure sharded training steps (DDP, FSDP2) of a real transformers model on N processes.

    torchrun --nproc-per-node N -m attnmem.measure.train_dist --sharding ddp fsdp \\
        --model llama3-8b-2l --seq-len 1000 8192 --precision bf16 amp_bf16 \\
        --checkpointing both --out training_steps_dist.csv

or, the same with the arguments checked before any process starts (a bad argument is one line
of message, no torchrun report), ``python -m attnmem.measure.train_dist --nproc-per-node N
...``, which then starts ``torchrun --standalone`` (a free port) itself.

Launched by torchrun rather than spawning its own processes: torchrun gives each rank the
standard environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT) that NCCL and the device
mesh read, runs one process per GPU with nothing shared, and ends the whole group when one rank
dies; the CPU tests launch it the same way (``python -m torch.distributed.run``), so the path
the tests cover is the path a GPU machine runs.

Backend: NCCL on CUDA, with ``NCCL_NVLS_ENABLE=0`` set before the process group starts (the
H200 machines require NVLink multicast off); gloo on CPU (tests; memory counters read nothing
there, the tensor counts below still do). Each rank uses GPU ``LOCAL_RANK``.

Per configuration (``attnmem.measure.train.config.TrainConfig`` plus the sharding), on every
rank, what the single-GPU harness does (attnmem.measure.train.procedure), distributed:

1. ``torch.manual_seed(seed)`` on every rank, then the model from its config
   (``train_models``; random init, no download) on the rank's device, as the harness builds
   it (same dtype per precision, same attention, checkpointing with use_reentrant=False).
   Sharding ``ddp``: ``DistributedDataParallel(model, gradient_as_bucket_view=False)``
   (default buckets of 25 MiB: attnmem.calc.parallel's "none" layout with its bucket copy of the
   gradients). ``fsdp``: ``fully_shard`` (FSDP2) on every decoder layer, then on the root
   module (attnmem.calc.parallel's "fsdp": embeddings, final norm and lm_head in the root group).
   AdamW(lr=1e-5), torch's default foreach path.
2. Data: one global batch of ``world_size x batch`` sequences of random token ids from
   ``seed + 1``; rank r takes rows r*batch ... (r+1)*batch - 1, the same every step (as the
   single-GPU harness reuses its ids). A one-process step on the whole global batch therefore
   sees the same data, and its loss is the mean of the ranks' losses (equal token counts).
3. One warm-up step. During it, after the backward, the bytes this rank holds are counted
   from the tensors themselves: the storages (``untyped_storage().nbytes()``, each storage
   once) of the local parameters (a DTensor's local tensor under FSDP2), of their ``.grad``
   and, after the optimizer step, of AdamW's exp_avg and exp_avg_sq (its ``step`` counters
   are CPU scalars, not device memory). With ``--count-buckets`` DDP gets a communication hook
   that records each gradient bucket's flat buffer once and then all-reduces it as DDP's
   default does (the allreduce hook): the bucket copy attnmem.calc.parallel counts.
4. ``before_step_bytes`` = ``memory_allocated()`` after the warm-up (caches emptied), then
   ``steps`` measured steps (>= 3), each started after a barrier and timed with CUDA events;
   ``peak_bytes`` = ``max_memory_allocated()`` over them, ``reserved_bytes`` likewise,
   ``step_ms`` the median. Out of memory is status ``oom``; an attention that cannot run the
   model is ``unavailable`` (the harness's rules).
5. Prediction: ``attnmem.calc.training_step(model, batch, seq_len, attention=..., precision=...,
   checkpointing=..., gpus=world_size, sharding="none" for ddp | "fsdp")`` per GPU, and
   ``attnmem.calc.parallel.layout_bytes`` for the weights, gradients, optimizer state and buffers.
6. Rank 0 gathers every rank's row (``all_gather_object``) and appends them to ``--out`` as
   soon as a configuration is done, so a run cut short keeps what it measured.

Rows: ``TRAIN_COLUMNS`` (attnmem.measure.train.config; peak_rel_error against the per-GPU
prediction), then ``DIST_EXTRA``:

    world_size                 N (processes = GPUs)
    sharding                   ddp | fsdp
    rank                       this row's rank
    global_batch               world_size x batch
    weights_bytes              storages of the local parameters after the warm-up step
    gradients_bytes            storages of the local .grad after the warm-up backward
    optimizer_bytes            storages of AdamW's exp_avg and exp_avg_sq after its step
    buckets_bytes              DDP's gradient bucket buffers (--count-buckets; else empty)
    predicted_weights_bytes    attnmem.calc.parallel.layout_bytes(...)["weights"]
    predicted_gradients_bytes  ...["gradients"]
    predicted_optimizer_bytes  ...["optimizer"]
    predicted_persistent_bytes ...["persistent_buffers"] (DDP's buckets)
    predicted_step_buffers_bytes ...["step_buffers"] (FSDP's gathered layers)
    losses                     this rank's loss of every step, warm-up first, space-separated

A rank that runs out of memory while the others wait in a collective leaves them waiting: the
process group's timeout (``--collective-timeout``) then ends the run, and the rows written so
far stay in ``--out``. Symmetric configurations (the same shapes on every rank) run out of
memory at the same operation on every rank, which is recorded as ``oom`` without a hang.

Bad arguments (an unknown sharding, model, attention or precision, a global batch that N does
not divide, a model calc refuses, fewer than 2 processes, no torchrun) end the run with a
message naming the value and what is accepted, before any process group starts.
No torch or transformers at import time.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnmem.measure import torchrun, train_models
from attnmem.measure.model_common import (
    ATTENTIONS,
    attention_context,
    attn_implementation,
    cell,
    choices,
    environment,
    kernels_hf_check,
    model_from_config,
    now_utc,
    short_error,
    unavailable_error,
    words,
)
from attnmem.measure.train import store as train_store
from attnmem.measure.train.config import (
    PRECISIONS,
    TRAIN_COLUMNS,
    TrainConfig,
    check_config,
    shape_fields,
)
from attnmem.measure.train.plan import expand
from attnmem.measure.train.procedure import USE_REENTRANT, enable_checkpointing

SHARDINGS = ("ddp", "fsdp")
#: What each sharding is in attnmem.calc.parallel's layouts.
CALC_SHARDING = {"ddp": "none", "fsdp": "fsdp"}
DIST_EXTRA: tuple[str, ...] = (
    "world_size", "sharding", "rank", "global_batch", "weights_bytes", "gradients_bytes",
    "optimizer_bytes", "buckets_bytes", "predicted_weights_bytes", "predicted_gradients_bytes",
    "predicted_optimizer_bytes", "predicted_persistent_bytes", "predicted_step_buffers_bytes",
    "losses",
)
DIST_COLUMNS: tuple[str, ...] = TRAIN_COLUMNS + DIST_EXTRA
DEFAULT_SEED = 1234


class Refusal(ValueError):
    """Bad arguments: the message names the value and what is accepted."""


@dataclass(frozen=True)
class DistConfig:
    """One sharded configuration: the single-GPU configuration plus the sharding."""

    base: TrainConfig
    sharding: str

    def label(self) -> str:
        return f"{self.sharding} {self.base.label()}"


# --------------------------------------------------------------------------------------------
# Checks and predictions (pure: no torch).
# --------------------------------------------------------------------------------------------

def calc_model(name: str, layers: int | None) -> Any:
    from attnmem.calc import ModelConfig

    return ModelConfig.from_hf_config(train_models.hf_config(name, layers), name=name)


def check_calc_model(name: str, layers: int | None, world_size: int, sharding: str) -> None:
    """Refuse a model (or layout) that attnmem.calc.training_step refuses, with calc's reason."""
    from attnmem.calc.training_step import training_step

    try:
        training_step(calc_model(name, layers), 1, 16, attention="sdpa_flash", precision="bf16",
                      gpus=world_size, sharding=CALC_SHARDING[sharding])
    except ValueError as exc:
        raise Refusal(f"calc refuses model {name!r} on {world_size} GPUs with sharding "
                      f"{sharding!r}: {exc}") from None


def predict(cfg: DistConfig, world_size: int) -> dict[str, Any]:
    """calc's per-GPU prediction for cfg: peak, before-step and the layout's terms; a
    'message' says why a value is missing (fp32 is not a precision calc models)."""
    from attnmem.calc.parallel import layout_bytes, make_layout
    from attnmem.calc.training_step import training_step

    b = cfg.base
    out: dict[str, Any] = {"message": ""}
    model = calc_model(b.model, b.layers)
    shard = CALC_SHARDING[cfg.sharding]
    try:
        lay = make_layout(model, world_size, 1, shard)
        # fp32 keeps 4-byte parameters, gradients and states: amp_bf16's layout terms
        w = layout_bytes(model, lay, b.precision if b.precision != "fp32" else "amp_bf16")
        out.update(predicted_weights_bytes=w["weights"], predicted_gradients_bytes=w["gradients"],
                   predicted_optimizer_bytes=w["optimizer"],
                   predicted_persistent_bytes=w["persistent_buffers"],
                   predicted_step_buffers_bytes=w["step_buffers"])
        m = training_step(model, b.batch, b.seq_len, attention=b.attention, precision=b.precision,
                          checkpointing=b.checkpointing, gpus=world_size, sharding=shard)
        out.update(predicted_peak_bytes=int(m.peak_bytes),
                   predicted_before_bytes=int(m.before_step_bytes))
    except ValueError as exc:
        out["message"] = f"no peak prediction: {short_error(exc, 200)}"
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N -m attnmem.measure.train_dist",
        description="Measure sharded training steps (DDP, FSDP2) of real transformers models on "
                    "N processes (one per GPU; gloo on CPU) against attnmem.calc.training_step's "
                    "per-GPU prediction. Lists take spaces or commas.")
    ap.add_argument("--sharding", nargs="+", default=["ddp", "fsdp"],
                    help=f"shardings ({', '.join(SHARDINGS)})")
    ap.add_argument("--model", nargs="+", default=["llama3-8b-2l"],
                    help=f"model names ({', '.join(train_models.NAMES)})")
    ap.add_argument("--layers", type=int, default=None, help="override the models' layer count")
    ap.add_argument("--seq-len", nargs="+", default=["1024", "4096"])
    ap.add_argument("--batch", type=int, default=None, help="sequences per GPU (default 1)")
    ap.add_argument("--global-batch", type=int, default=None,
                    help="sequences over all GPUs (a multiple of N); instead of --batch")
    ap.add_argument("--attention", nargs="+", default=["sdpa_flash"],
                    help=f"attentions ({', '.join(ATTENTIONS)})")
    ap.add_argument("--precision", nargs="+", default=["bf16"],
                    help=f"precisions ({', '.join(PRECISIONS)}; fp32: CPU tests, no "
                         "prediction)")
    ap.add_argument("--checkpointing", nargs="+", default=["off"], help="off, on (or both)")
    ap.add_argument("--steps", type=int, default=3, help="measured steps (median time), >= 3")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help="model and data seed")
    ap.add_argument("--count-buckets", action="store_true",
                    help="DDP: record the gradient buckets' bytes through a comm hook")
    ap.add_argument("--collective-timeout", type=float, default=600.0,
                    help="seconds a collective may wait before the process group gives up")
    ap.add_argument("--out", type=Path, default=Path("training_steps_dist.csv"),
                    help="CSV to write (rank 0)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                    help="outside torchrun: check the arguments for N processes, then start "
                         "them (torchrun --standalone); bad arguments are refused before any")
    return ap


def configs_from_args(args: argparse.Namespace, world_size: int) -> list[DistConfig]:
    """Every configuration of the command line, checked (Refusal names what is wrong)."""
    if world_size < 2:
        raise Refusal(f"world size {world_size}: a sharded step needs at least 2 processes "
                      "(torchrun --nproc-per-node N with N >= 2); one GPU is "
                      "`python -m attnmem.measure --train`")
    shardings = choices(args.sharding, SHARDINGS, "sharding(s)", Refusal)
    models = choices(args.model, train_models.NAMES, "model(s)", Refusal)
    attentions = choices(args.attention, ATTENTIONS, "attention(s)", Refusal)
    precisions = choices(args.precision, PRECISIONS, "precision(s)", Refusal)
    ck = choices(args.checkpointing, ("off", "on", "both"), "checkpointing value(s)",
                 Refusal)
    checkpointings = sorted({c for w in ck for c in {"off": [False], "on": [True],
                                                      "both": [False, True]}[w]})
    try:
        seq = [int(w) for w in words(args.seq_len)]
    except ValueError:
        raise Refusal(f"--seq-len must be whole numbers, got {' '.join(args.seq_len)}") from None
    if not seq or min(seq) < 2:
        raise Refusal(f"--seq-len must be whole numbers >= 2, got {' '.join(args.seq_len)}")
    if args.steps < 3:
        raise Refusal(f"--steps must be at least 3 (a median of >= 3), got {args.steps}")
    if args.layers is not None and args.layers < 1:
        raise Refusal(f"--layers must be >= 1, got {args.layers}")
    if args.batch is not None and args.global_batch is not None:
        raise Refusal("give --batch (per GPU) or --global-batch (over all GPUs), not both")
    if args.global_batch is not None:
        if args.global_batch < 1 or args.global_batch % world_size:
            raise Refusal(f"--global-batch {args.global_batch} must be a positive multiple of "
                          f"the world size {world_size} (each GPU takes an equal share); "
                          f"accepted: {world_size}, {2 * world_size}, ...")
        batch = args.global_batch // world_size
    else:
        batch = 1 if args.batch is None else args.batch
        if batch < 1:
            raise Refusal(f"--batch must be >= 1, got {batch}")
    if args.collective_timeout <= 0:
        raise Refusal(f"--collective-timeout must be > 0 seconds, got {args.collective_timeout}")
    for m in models:
        for s in shardings:
            check_calc_model(m, args.layers, world_size, s)
    return [DistConfig(c, s) for s in shardings
            for c in expand(models, seq, attentions, precisions, checkpointings, batch=batch,
                            layers=args.layers, steps=args.steps)]


# --------------------------------------------------------------------------------------------
# Counting what a rank holds.
# --------------------------------------------------------------------------------------------

def storage_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a DTensor counts its local tensor;
    None entries are skipped)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        local = getattr(t, "_local_tensor", None)
        if local is not None:
            t = local
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def optimizer_state_tensors(opt: Any) -> list[Any]:
    """AdamW's per-parameter state tensors, its CPU ``step`` counters left out."""
    return [v for state in opt.state.values() for k, v in state.items()
            if k != "step" and hasattr(v, "untyped_storage")]


class BucketCounter:
    """A DDP communication hook (``hook``): records each bucket's flat buffer (once per bucket
    index), then all-reduces it as DDP's default hook does."""

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.bytes: dict[int, int] = {}

        # A plain function without annotations: DDP reads the hook's __name__ and refuses
        # annotations other than GradBucket / Future (here they would be strings).
        def hook(state, bucket):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            self.bytes.setdefault(bucket.index(), bucket.buffer().untyped_storage().nbytes())
            return allreduce_hook(self.group, bucket)

        self.hook = hook

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


# --------------------------------------------------------------------------------------------
# One configuration on this rank.
# --------------------------------------------------------------------------------------------

def global_ids(vocab: int, global_batch: int, seq_len: int, seed: int) -> Any:
    """The run's global batch of token ids (CPU, int64), the same on every rank."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, vocab, (global_batch, seq_len), generator=g)


def build_model(hf: Any, precision: str, attention: str, checkpointing: bool, dev: str,
                seed: int) -> Any:
    """The model as attnmem.measure.train.procedure builds it, seeded so that every rank
    starts equal."""
    import torch

    torch.manual_seed(seed)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    impl = attn_implementation(attention)
    with torch.device(dev):
        model = model_from_config(hf, dtype, impl)
    if next(model.parameters()).device.type != dev:
        model.to(dev)
    model.train()
    if checkpointing:
        enable_checkpointing(model)
    return model


def shard_model(model: Any, sharding: str, dev: str, local_rank: int,
                buckets: BucketCounter | None) -> Any:
    """DDP around the model, or FSDP2 on each decoder layer and the root."""
    if sharding == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [local_rank] if dev == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=False)
        if buckets is not None:
            ddp.register_comm_hook(None, buckets.hook)
        return ddp
    from torch.distributed.fsdp import fully_shard

    layers = _decoder_layers(model)
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def _decoder_layers(model: Any) -> list[Any]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers to shard layer by layer")
    return list(layers)


def measure_rank(cfg: DistConfig, *, rank: int, world_size: int, local_rank: int,
                 seed: int = DEFAULT_SEED, count_buckets: bool = False,
                 device: Any = None) -> dict[str, Any]:
    """This rank's row for cfg (every rank calls it with the same cfg). Never raises for OOM
    or a refusal."""
    t0 = time.perf_counter()
    row = _measure_rank(cfg, rank, world_size, local_rank, seed, count_buckets, device)
    row["wall_s"] = round(time.perf_counter() - t0, 3)
    row["timestamp"] = now_utc()
    return row


def _measure_rank(cfg: DistConfig, rank: int, world_size: int, local_rank: int, seed: int,
                  count_buckets: bool, device: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from attnmem.measure.harness import default_device, is_oom

    b = cfg.base
    device = device or default_device()
    dev = "cuda" if device.name == "cuda" else "cpu"
    env = environment(device)
    if dev == "cuda":
        env["gpu"] = torch.cuda.get_device_name(local_rank)
    config_dict = train_models.hf_config(b.model, b.layers)
    hf = train_models.build_config(config_dict)
    pred = predict(cfg, world_size)
    notes = [pred.pop("message")] if pred.get("message") else []
    if b.precision == "fp32":
        notes.append("fp32: calc predicts bf16 and amp_bf16 only (the layout terms shown are "
                     "amp_bf16's, whose states are fp32 too)")
    if b.checkpointing:
        notes.append(f"checkpointing: use_reentrant={USE_REENTRANT}")
    row: dict[str, Any] = {c: None for c in DIST_COLUMNS}
    row.update(model=b.model, batch=b.batch, seq_len=b.seq_len, attention=b.attention,
               precision=b.precision, checkpointing=bool(b.checkpointing),
               **shape_fields(hf), **env, **pred, world_size=world_size,
               sharding=cfg.sharding, rank=rank, global_batch=world_size * b.batch)

    def done(status: str, message: str = "") -> dict[str, Any]:
        row["status"] = status
        row["message"] = "; ".join(m for m in [message, *notes] if m)
        return row

    bad = check_config(b)
    if bad:
        return done("error", bad)
    if b.attention == "triton":
        why = kernels_hf_check(hf, b.seq_len)
        if why:
            return done("unavailable", "our kernel cannot run this model: " + "; ".join(why))
    attn_ctx, why_not = attention_context(b.attention)
    if attn_ctx is None:
        return done("unavailable", why_not)
    autocast = b.precision == "amp_bf16"
    if autocast and dev != "cuda":
        notes.append("autocast on the CPU")
    state: dict[str, Any] = {}
    counts: dict[str, int] = {}
    buckets = BucketCounter() if (count_buckets and cfg.sharding == "ddp") else None
    try:
        gc.collect()
        device.empty_cache()
        # Only ``state`` holds the model, optimizer and inputs, so that clearing it frees
        # them, also after an OOM.
        state["model"] = build_model(hf, b.precision, b.attention, b.checkpointing, dev, seed)
        row["params"] = sum(p.numel() for p in state["model"].parameters())
        state["model"] = shard_model(state["model"], cfg.sharding, dev, local_rank, buckets)
        state["opt"] = torch.optim.AdamW(state["model"].parameters(), lr=1e-5)
        ids = global_ids(row["vocab"], world_size * b.batch, b.seq_len, seed)
        state["ids"] = ids[rank * b.batch:(rank + 1) * b.batch].to(dev)
        del ids
        s = state

        def step(count: bool = False) -> float:
            with attn_ctx():
                with (torch.autocast(dev, dtype=torch.bfloat16) if autocast
                      else contextlib.nullcontext()):
                    loss = s["model"](input_ids=s["ids"], labels=s["ids"], use_cache=False).loss
                loss.backward()
                if count:
                    params = list(s["model"].parameters())
                    counts["gradients"] = storage_bytes(p.grad for p in params)
                    counts["weights"] = storage_bytes(params)
                s["opt"].step()
                if count:
                    counts["optimizer"] = storage_bytes(optimizer_state_tensors(s["opt"]))
                s["opt"].zero_grad(set_to_none=True)
            return float(loss.detach())

        losses = [step(count=True)]
        device.sync()
        gc.collect()
        device.empty_cache()
        device.sync()
        dist.barrier()
        before = device.allocated()
        device.reset_peak()
        times: list[float] = []
        leftover = 0
        for _ in range(b.steps):
            box: list[float] = []
            dist.barrier()
            times.append(device.elapsed(lambda box=box: box.append(step())))
            losses.append(box[0])
            leftover = max(leftover, device.allocated() - before)
        peak = device.max_allocated()
        reserved = device.max_reserved()
    except Exception as exc:  # noqa: BLE001 - OOM and refusals are results; the rest 'error'
        status = ("oom" if is_oom(exc) else
                  "unavailable" if unavailable_error(exc) else "error")
        message = short_error(exc)
        del exc
        state.clear()
        gc.collect()
        device.empty_cache()
        return done(status, message)
    state.clear()
    gc.collect()
    device.empty_cache()
    if leftover > 0:
        notes.append(f"allocated memory grew by {leftover} bytes over a measured step")
    measured = dev == "cuda"
    row.update(weights_bytes=counts.get("weights"), gradients_bytes=counts.get("gradients"),
               optimizer_bytes=counts.get("optimizer"),
               buckets_bytes=buckets.total if buckets is not None else None,
               step_ms=round(statistics.median(times), 3), steps=len(times),
               loss=round(losses[-1], 6), losses=" ".join(f"{x:.6f}" for x in losses))
    if measured:
        row.update(before_step_bytes=before, peak_bytes=peak, reserved_bytes=reserved)
        if row.get("predicted_peak_bytes") is not None and peak:
            row["peak_rel_error"] = (row["predicted_peak_bytes"] - peak) / peak
    return done("ok")


# --------------------------------------------------------------------------------------------
# The run: process group, every configuration, rank 0 writes.
# --------------------------------------------------------------------------------------------

def _write_rows(path: Path, rows: list[dict[str, Any]], header: bool) -> None:
    mode = "w" if header else "a"
    with open(path, mode, newline="") as fh:
        w = csv.writer(fh, lineterminator="\r\n")
        if header:
            w.writerow(DIST_COLUMNS)
        for r in rows:
            w.writerow([cell(r.get(c)) for c in DIST_COLUMNS])


_DIST_INT = tuple(c for c in DIST_EXTRA if c not in ("sharding", "losses"))


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a sharded training-step CSV (DIST_COLUMNS), typed: the single-GPU columns as
    attnmem.measure.train.store.read_rows parses them, world_size, rank and the byte counts as
    integers (empty: None). A file without world_size or sharding raises ValueError naming
    them."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in ("world_size", "sharding", "rank")
                   if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: not a sharded training-step CSV (missing columns "
                             f"{', '.join(missing)})")
        raw = list(reader)
    rows = train_store.read_rows(path)
    for r, x in zip(rows, raw, strict=True):
        for c in _DIST_INT:
            v = x.get(c)
            r[c] = None if v in (None, "") else int(float(v))
        r["sharding"], r["losses"] = x.get("sharding") or "", x.get("losses") or ""
    return rows


def _summary(rows: list[dict[str, Any]]) -> str:
    r0 = rows[0]
    peaks = [r["peak_bytes"] for r in rows if r.get("peak_bytes")]
    pred = r0.get("predicted_peak_bytes")
    peak = f" peak max {max(peaks) / 2**30:.3f} GiB" if peaks else ""
    pr = f" predicted {pred / 2**30:.3f} GiB" if pred else ""
    ms = [r["step_ms"] for r in rows if r.get("step_ms")]
    t = f" {statistics.median(ms):.1f} ms" if ms else ""
    statuses = ",".join(sorted({r["status"] for r in rows}))
    return (f"{r0['sharding']} N={r0['world_size']} {r0['model']} {r0['attention']} "
            f"{r0['precision']} ckpt={'on' if r0['checkpointing'] else 'off'} "
            f"B={r0['batch']} s={r0['seq_len']}: {statuses}{peak}{pr}{t}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    env = torchrun.ranks()
    if env is None:
        return torchrun.start_ranks(
            argv, args.nproc_per_node, "attnmem.measure.train_dist",
            lambda n: configs_from_args(args, n),
            "`torchrun --nproc-per-node N -m attnmem.measure.train_dist ...` or "
            "`python -m attnmem.measure.train_dist --nproc-per-node N ...`, N >= 2")
    rank, world, local = env
    try:
        configs = configs_from_args(args, world)
    except Refusal as exc:
        if rank == 0:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        torchrun.init_process_group(args.collective_timeout, local)
    except ValueError as exc:
        print(f"error (rank {rank}): {exc}", file=sys.stderr)
        return 2
    import torch.distributed as dist

    t0 = time.monotonic()
    try:
        if rank == 0:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            _write_rows(args.out, [], header=True)
        for i, cfg in enumerate(configs):
            row = measure_rank(cfg, rank=rank, world_size=world, local_rank=local,
                               seed=args.seed, count_buckets=args.count_buckets)
            rows: list[Any] = [None] * world
            dist.all_gather_object(rows, row)
            if rank == 0:
                _write_rows(args.out, rows, header=False)
                if not args.quiet:
                    print(f"[{i + 1}/{len(configs)} {time.monotonic() - t0:6.1f}s] "
                          f"{_summary(rows)}", file=sys.stderr, flush=True)
        if rank == 0:
            print(f"{len(configs)} configuration(s) x {world} ranks in "
                  f"{time.monotonic() - t0:.1f} s; rows in {args.out}")
    except KeyboardInterrupt:
        if rank == 0:
            print(f"interrupted: the rows measured so far are in {args.out}", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"error (rank {rank}): could not write {args.out}: {exc}", file=sys.stderr)
        return 3
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    torchrun.exit_rank(main())
