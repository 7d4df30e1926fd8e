"""The command line of the training-step measurement: ``python -m attnmem.measure --train ...``
(``main``; ``--plan h200`` is the bundled reference sweep, ``--repredict`` recomputes a CSV's
predictions, ``--db`` also stores the run in SQLite). Lists take spaces or commas. No torch or
transformers at import time.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from attnmem.measure import train_models
from attnmem.measure.model_common import choices, ints, words
from attnmem.measure.run_common import add_run_options, measure_to_csv, status_note
from attnmem.measure.train.config import (
    ADAPTER_DTYPES,
    ADAPTERS,
    ATTENTIONS,
    BASE_DTYPES,
    LORA_TARGETS,
    OPTIMIZERS,
    PRECISIONS,
    TRAIN_COLUMNS,
    TrainConfig,
    TrainResult,
    parse_pack,
)
from attnmem.measure.train.plan import FULL, PLANS, expand, lever_variants, lora_variants
from attnmem.measure.train.store import TrainStore, read_rows, repredict
from attnmem.measure.train.worker import run_train


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m attnmem.measure --train",
        description="Measure training steps of real transformers models (random init, no "
                    "download): memory before the step, peak, reserved, median step time. "
                    "Lists take spaces or commas.")
    ap.add_argument("--model", nargs="+", default=["llama3-8b-2l"],
                    help=f"model names ({', '.join(train_models.NAMES)})")
    ap.add_argument("--layers", type=int, default=None,
                    help="override the models' layer count")
    ap.add_argument("--seq-len", nargs="+", default=["1024", "4096"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--packed", nargs="+", default=None, metavar="PACK",
                    help="padding-free rows in place of --seq-len: each PACK is the lengths of "
                         "the sequences packed into one row joined by '+' (e.g. 1000+3000+96; "
                         "batch 1, position_ids restarting at each); default: none, dense rows")
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
    ap.add_argument("--optimizer", nargs="+", default=["adamw"],
                    help=f"optimizers ({', '.join(OPTIMIZERS)}; adamw: torch AdamW, foreach; "
                         "adamw_8bit / paged_adamw_8bit: bitsandbytes; adafactor: "
                         "transformers' Adafactor; sgd: torch SGD, momentum 0)")
    ap.add_argument("--kbit-prepare", nargs="+", default=["off"],
                    help="off, on (or both): peft's prepare_model_for_kbit_training on the "
                         "4-bit base before the adapters (the QLoRA recipe; needs --adapter "
                         "lora, --base-dtype nf4 or nf4_dq and --checkpointing on)")
    ap.add_argument("--liger", nargs="+", default=["off"],
                    help="off, on (or both): liger-kernel's apply_liger_kernel_to_<arch> "
                         "(RoPE, RMSNorm, SwiGLU, fused linear cross-entropy)")
    ap.add_argument("--offload-activations", nargs="+", default=["off"],
                    help="off, on (or both): forward and backward under "
                         "torch.autograd.graph.save_on_cpu(pin_memory=True)")
    ap.add_argument("--plan", choices=sorted(PLANS), default=None,
                    help="a bundled sweep instead of the cross product (h200: the reference, "
                         "h200-lora: LoRA and QLoRA, h200-moe: mixture of experts, "
                         "h200-packed: packed sequences on our kernel beside dense rows, "
                         "h200-recipes: optimizers, peft's prepare step, Liger, offloading, "
                         "alone and combined)")
    ap.add_argument("--plan-attention", nargs="+", default=None, metavar="ATTENTION",
                    help="with --plan: only the plan's rows on these attentions (run a "
                         "slow part, such as our kernel's first fp32 compilations, apart)")
    ap.add_argument("--skip-done", type=Path, default=None, metavar="CSV",
                    help="leave out the configurations that CSV already holds as measured "
                         "(status ok): finishes a plan a budget cut, into a new --out")
    add_run_options(ap, timeout=180.0, out="training_steps.csv", prefix="train",
                    repredict_help="measure nothing: recompute the predicted_* columns and "
                                   "peak_rel_error of CSV's rows from the current calc and "
                                   "write --out")
    return ap


def configs_from_args(args: argparse.Namespace) -> list[TrainConfig]:
    configs = _configs(args)
    only = getattr(args, "plan_attention", None)
    if only:
        if not args.plan:
            raise SystemExit("error: --plan-attention filters a --plan; without one use "
                             "--attention")
        keep = set(choices(only, ATTENTIONS, "attention(s)"))
        configs = [c for c in configs if c.attention in keep]
    if getattr(args, "skip_done", None) is None:
        return configs
    if not args.skip_done.is_file():
        raise SystemExit(f"error: --skip-done {args.skip_done}: file not found")
    try:
        rows = read_rows(args.skip_done)
    except ValueError as e:
        raise SystemExit(f"error: --skip-done {e}") from None
    done = {_key(TrainConfig.from_row(r)) for r in rows if r.get("status") == "ok"}
    return [c for c in configs if _key(c) not in done]


def _key(c: TrainConfig) -> tuple:
    """What names a measured configuration: its series and its length, with the layer count
    resolved (a plan leaves it None for the model's own; a row records the number built)."""
    key = list(c.series())
    if key[1] is None and c.model in train_models.MODELS:
        key[1] = train_models.MODELS[c.model][1]
    return (*key, c.seq_len)


def _configs(args: argparse.Namespace) -> list[TrainConfig]:
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
    checkpointings = switch(args.checkpointing, "checkpointing")
    finetunes = [{**ft, **lv} for ft in finetunes_from_args(args)
                 for lv in levers_from_args(args)]
    if args.packed:
        return [c for pack in packs_from_args(args)
                for c in expand(models, [sum(pack)], attentions, precisions, checkpointings,
                                layers=args.layers, steps=args.steps,
                                finetunes=[{**ft, "packed": "+".join(map(str, pack))}
                                           for ft in finetunes])]
    seq = ints(args.seq_len, "--seq-len", 2)
    return expand(models, seq, attentions, precisions, checkpointings, batch=args.batch,
                  layers=args.layers, steps=args.steps, finetunes=finetunes)


def switch(values: Sequence[str], what: str) -> list[bool]:
    """off / on / both as the sorted booleans; SystemExit naming the bad word otherwise."""
    got = choices(values, ("off", "on", "both"), f"{what} value(s)")
    return sorted({c for w in got for c in {"off": [False], "on": [True],
                                             "both": [False, True]}[w]})


def levers_from_args(args: argparse.Namespace) -> list[dict]:
    """The recipe variants of the command line (plan.lever_variants): optimizers × the
    levers' off/on values. Whether calc counts a combination is decided per row (an
    'unavailable' row with calc's reason, before any model is built)."""
    optimizers = list(dict.fromkeys(choices(args.optimizer, OPTIMIZERS, "optimizer(s)")))
    return lever_variants(optimizers, switch(args.kbit_prepare, "--kbit-prepare"),
                          switch(args.liger, "--liger"),
                          switch(args.offload_activations, "--offload-activations"))


def packs_from_args(args: argparse.Namespace) -> list[tuple[int, ...]]:
    """The --packed rows' lengths; SystemExit with one line for a malformed pack or a
    --batch other than 1."""
    if args.batch != 1:
        raise SystemExit(f"error: --packed rows are one row each: --batch must be 1, got "
                         f"{args.batch}")
    packs = []
    for w in args.packed:
        for pack in w.split(","):
            try:
                lengths = parse_pack(pack.strip())
            except ValueError:
                raise SystemExit(f"error: --packed takes sequence lengths (whole numbers >= 1) "
                                 f"joined by '+', e.g. 1000+3000+96; got {pack!r}") from None
            if sum(lengths) < 2:
                raise SystemExit(f"error: --packed {pack!r} adds up to fewer than 2 tokens")
            packs.append(lengths)
    return packs


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
        print(f"{n} training-step rows re-predicted from attnmem.calc into {args.out}")
        return 0
    return measure_to_csv(args, configs_from_args(args), run=run_train, columns=TRAIN_COLUMNS,
                          store=TrainStore, describe=_describe)


def _describe(res: TrainResult) -> str:
    """A progress line (after its count and time)."""
    peak = f"peak {res.peak_bytes / 2**30:.2f} GiB" if res.peak_bytes else ""
    ms = f"{res.step_ms:.1f} ms" if res.step_ms else ""
    lora = (f" lora r={res.lora_rank} {res.lora_targets} {res.base_dtype}"
            if res.adapter == "lora" else "")
    pack = f" packed={res.packed_lengths}" if res.packed_lengths else ""
    levers = TrainConfig.from_row(res.to_row()).lever_label()
    return (f"{res.model}{lora} {res.attention} {res.precision} "
            f"ckpt={'on' if res.checkpointing else 'off'} B={res.batch} s={res.seq_len}{pack}"
            f"{' ' + levers if levers else ''}: "
            f"{res.status} {peak} {ms} {status_note(res)}")
