"""The command line of the training-step measurement: ``python -m kernels.measure --train ...``
(``main``; ``--plan h200`` is the bundled reference sweep, ``--repredict`` recomputes a CSV's
predictions, ``--db`` also stores the run in SQLite). Lists take spaces or commas. No torch or
transformers at import time.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from kernels.measure import train_models
from kernels.measure.model_common import choices, ints, words
from kernels.measure.train.config import (
    ADAPTER_DTYPES,
    ADAPTERS,
    ATTENTIONS,
    BASE_DTYPES,
    LORA_TARGETS,
    PRECISIONS,
    TRAIN_COLUMNS,
    TrainConfig,
    TrainResult,
)
from kernels.measure.train.plan import FULL, PLANS, expand, lora_variants
from kernels.measure.train.store import TrainStore, csv_writer, repredict, write_row
from kernels.measure.train.worker import run_train


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m kernels.measure --train",
        description="Measure training steps of real transformers models (random init, no "
                    "download): memory before the step, peak, reserved, median step time. "
                    "Lists take spaces or commas.")
    ap.add_argument("--model", nargs="+", default=["llama3-8b-2l"],
                    help=f"model names ({', '.join(train_models.NAMES)})")
    ap.add_argument("--layers", type=int, default=None,
                    help="override the models' layer count")
    ap.add_argument("--seq-len", nargs="+", default=["1024", "4096"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--attention", nargs="+", default=["sdpa_flash", "triton"],
                    help=f"attentions ({', '.join(ATTENTIONS)})")
    ap.add_argument("--precision", nargs="+", default=["bf16"],
                    help=f"precisions ({', '.join(PRECISIONS)})")
    ap.add_argument("--checkpointing", nargs="+", default=["off"], help="off, on (or both)")
    ap.add_argument("--steps", type=int, default=3, help="measured steps (median time), >= 3")
    ap.add_argument("--adapter", nargs="+", default=["none"],
                    help=f"fine-tuning ({', '.join(ADAPTERS)}; none: full training, lora: peft "
                         "LoRA on a frozen base; both: none,lora)")
    ap.add_argument("--rank", nargs="+", default=None, help="LoRA ranks (default 16)")
    ap.add_argument("--alpha", type=float, default=None,
                    help="LoRA alpha (default: 2 x rank; no byte depends on it)")
    ap.add_argument("--targets", nargs="+", default=None,
                    help=f"LoRA targets ({', '.join(LORA_TARGETS)}; default all-linear)")
    ap.add_argument("--lora-dropout", type=float, default=None, help="LoRA dropout (default 0)")
    ap.add_argument("--adapter-dtype", default=None,
                    help=f"LoRA adapter dtype ({', '.join(ADAPTER_DTYPES)}; default fp32, "
                         "peft's autocast_adapter_dtype=True)")
    ap.add_argument("--base-dtype", nargs="+", default=None,
                    help=f"the frozen base's dtype with --adapter lora ({', '.join(BASE_DTYPES)}; "
                         "nf4 / nf4_dq: QLoRA through bitsandbytes; default bf16)")
    ap.add_argument("--plan", choices=sorted(PLANS), default=None,
                    help="a bundled sweep instead of the cross product (h200: the reference, "
                         "h200-lora: LoRA and QLoRA)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds: configurations not started by then are recorded as skipped")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per configuration")
    ap.add_argument("--lock-wait", type=float, default=0.0,
                    help="seconds to wait for a busy GPU")
    ap.add_argument("--out", type=Path, default=Path("training_steps.csv"), help="CSV to write")
    ap.add_argument("--db", type=Path, default=None,
                    help="also store the run in this SQLite file (tables train_runs, train_rows)")
    ap.add_argument("--label", default="", help="label of the stored run")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    ap.add_argument("--repredict", type=Path, default=None, metavar="CSV",
                    help="measure nothing: recompute the predicted_* columns and "
                         "peak_rel_error of CSV's rows from the current calc and write --out")
    ap.add_argument("--quiet", action="store_true")
    return ap


def configs_from_args(args: argparse.Namespace) -> list[TrainConfig]:
    if args.plan:
        return PLANS[args.plan]()
    if args.steps < 3:
        raise SystemExit(f"error: --steps must be at least 3 (a median of >= 3), got {args.steps}")
    if args.batch < 1:
        raise SystemExit(f"error: --batch must be >= 1, got {args.batch}")
    if args.layers is not None and args.layers < 1:
        raise SystemExit(f"error: --layers must be >= 1, got {args.layers}")
    models = choices(args.model, train_models.NAMES, "model(s)")
    attentions = choices(args.attention, ATTENTIONS, "attention(s)")
    precisions = choices(args.precision, PRECISIONS, "precision(s)")
    ck = choices(args.checkpointing, ("off", "on", "both"), "checkpointing value(s)")
    checkpointings = sorted({c for w in ck for c in {"off": [False], "on": [True],
                                                      "both": [False, True]}[w]})
    seq = ints(args.seq_len, "--seq-len", 2)
    return expand(models, seq, attentions, precisions, checkpointings, batch=args.batch,
                  layers=args.layers, steps=args.steps, finetunes=finetunes_from_args(args))


def finetunes_from_args(args: argparse.Namespace) -> list[dict]:
    """The fine-tuning variants of the command line (plan.lora_variants); SystemExit with one
    line for what calc's LoRA arguments refuse."""
    adapters = list(dict.fromkeys(choices(args.adapter, ADAPTERS, "adapter(s)")))
    lora_opts = {"--rank": args.rank, "--alpha": args.alpha, "--targets": args.targets,
                 "--lora-dropout": args.lora_dropout, "--adapter-dtype": args.adapter_dtype,
                 "--base-dtype": args.base_dtype}
    if "lora" not in adapters:
        given = [k for k, v in lora_opts.items() if v is not None]
        if args.base_dtype is not None and set(words(args.base_dtype)) - {"bf16"}:
            raise SystemExit("error: --base-dtype nf4/nf4_dq needs --adapter lora (QLoRA: a "
                             "4-bit base has no trainable weights)")
        if given and given != ["--base-dtype"]:
            raise SystemExit(f"error: {', '.join(given)} need(s) --adapter lora")
        return [FULL]
    ranks = ints(args.rank or ["16"], "--rank", 1)
    if any(r > 1 << 16 for r in ranks):
        raise SystemExit(f"error: --rank must be at most 65536, got {max(ranks)}")
    targets = list(dict.fromkeys(choices(args.targets or ["all-linear"], LORA_TARGETS,
                                         "LoRA target(s)")))
    bases = list(dict.fromkeys(choices(args.base_dtype or ["bf16"], BASE_DTYPES,
                                       "base dtype(s)")))
    alpha = args.alpha
    if alpha is not None and not 0 < alpha < float("inf"):
        raise SystemExit(f"error: --alpha must be a positive finite number, got {alpha}")
    dropout = 0.0 if args.lora_dropout is None else args.lora_dropout
    if not 0 <= dropout < 1:
        raise SystemExit(f"error: --lora-dropout must be in [0, 1), got {dropout}")
    dtype = args.adapter_dtype or "fp32"
    if dtype not in ADAPTER_DTYPES:
        raise SystemExit(f"error: unknown adapter dtype {dtype}; known: "
                         f"{', '.join(ADAPTER_DTYPES)}")
    out: list[dict] = [FULL] if "none" in adapters else []
    return out + lora_variants(ranks, targets, bases, alpha=alpha, dropout=dropout,
                               adapter_dtype=dtype)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repredict is not None:
        n = repredict(args.repredict, args.out)
        print(f"{n} training-step rows re-predicted from calc into {args.out}")
        return 0
    configs = configs_from_args(args)
    if args.list:
        for c in configs:
            print(c.label())
        print(f"{len(configs)} configurations")
        return 0
    from kernels.measure.child import GpuBusy

    args.out.parent.mkdir(parents=True, exist_ok=True)
    fh = open(args.out, "w", newline="")  # noqa: SIM115 - closed in finally
    writer = csv_writer(fh)
    writer.writerow(TRAIN_COLUMNS)
    fh.flush()
    t0 = time.monotonic()
    store = TrainStore(args.db) if args.db else None
    run_id: int | None = None

    def on_result(res: TrainResult, i: int, n: int) -> None:
        nonlocal run_id
        row = res.to_row()
        write_row(writer, row)
        fh.flush()
        if store is not None:
            if run_id is None:
                run_id = store.new_run(gpu=res.gpu, label=args.label or "command line")
            store.add_row(run_id, row)
        if not args.quiet:
            peak = f"peak {res.peak_bytes / 2**30:.2f} GiB" if res.peak_bytes else ""
            ms = f"{res.step_ms:.1f} ms" if res.step_ms else ""
            lora = (f" lora r={res.lora_rank} {res.lora_targets} {res.base_dtype}"
                    if res.adapter == "lora" else "")
            print(f"[{i + 1}/{n} {time.monotonic() - t0:6.1f}s] {res.model}{lora} {res.attention} "
                  f"{res.precision} ckpt={'on' if res.checkpointing else 'off'} s={res.seq_len}: "
                  f"{res.status} {peak} {ms} {res.message[:120] if res.status != 'ok' else ''}",
                  file=sys.stderr, flush=True)

    try:
        summary = run_train(configs, on_result=on_result, timeout_s=args.timeout,
                            budget_s=args.budget, lock_wait_s=args.lock_wait)
    except GpuBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: the rows measured so far are in {args.out}", file=sys.stderr)
        return 130
    except (sqlite3.Error, OSError) as exc:  # database locked or full, disk full, ...
        where = f"{args.db} (database)" if isinstance(exc, sqlite3.Error) else str(args.out)
        print(f"error: could not save a result to {where}: {exc}. The run stopped; the rows "
              f"saved before it are in {args.out}", file=sys.stderr)
        return 3
    finally:
        with contextlib.suppress(OSError):
            fh.close()
    counts: dict[str, int] = {}
    for r in summary.results:
        counts[r.status] = counts.get(r.status, 0) + 1
    print(f"{len(summary.results)} configurations in {summary.wall_s:.1f} s "
          f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}; "
          f"{summary.children_started} child process(es)); rows in {args.out}"
          + (f"; run {run_id} in {args.db}" if run_id is not None else ""))
    return 0
