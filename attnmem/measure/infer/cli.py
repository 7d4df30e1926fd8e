"""The command line of the inference measurement: ``python -m attnmem.measure --infer ...``
(``main``; ``--plan h200`` is the bundled reference sweep, ``--repredict`` recomputes a CSV's
predictions, ``--db`` also stores the run in SQLite). Lists take spaces or commas. No torch or
transformers at import time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from attnmem.measure import infer_models
from attnmem.measure.infer.config import (
    ATTENTIONS,
    CACHES,
    INFER_COLUMNS,
    InferConfig,
    InferResult,
)
from attnmem.measure.infer.plan import PLANS, expand
from attnmem.measure.infer.store import InferStore, repredict
from attnmem.measure.infer.worker import run_infer
from attnmem.measure.model_common import choices, ints, words
from attnmem.measure.run_common import add_run_options, measure_to_csv, status_note


def _chunks(values: Sequence[str]) -> list[int | None]:
    given = words(values)
    out: list[int | None] = []
    for w in given:
        if w.lower() == "none":
            out.append(None)
            continue
        try:
            v = int(w)
        except ValueError:
            v = 0
        if v < 1:
            raise SystemExit(f"error: --prefill-chunk takes 'none' or whole numbers >= 1, got "
                             f"{w!r}")
        out.append(v)
    if not out:
        raise SystemExit("error: --prefill-chunk needs a value ('none' or whole numbers >= 1)")
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m attnmem.measure --infer",
        description="Measure generate() of real transformers models (random init, no "
                    "download): weights, prefill peak, peak, reserved, KV cache, prefill and "
                    "decode time. Lists take spaces or commas.")
    ap.add_argument("--model", nargs="+", default=["llama3.2-1b"],
                    help=f"model names ({', '.join(infer_models.NAMES)})")
    ap.add_argument("--layers", type=int, default=None, help="override the models' layer count")
    ap.add_argument("--prompt-len", nargs="+", default=["1000", "4096"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=8, help="tokens generated (>= 1)")
    ap.add_argument("--attention", nargs="+", default=["sdpa_flash", "triton"],
                    help=f"attentions ({', '.join(ATTENTIONS)})")
    ap.add_argument("--cache", nargs="+", default=["dynamic"], help="dynamic, static (or both)")
    ap.add_argument("--prefill-chunk", nargs="+", default=["none"],
                    help="prompt tokens per prefill forward: 'none' (whole prompt) or numbers")
    ap.add_argument("--plan", choices=sorted(PLANS), default=None,
                    help="a bundled sweep instead of the cross product (h200: the reference)")
    add_run_options(ap, timeout=300.0, out="inference.csv", prefix="infer",
                    repredict_help="measure nothing: recompute the predicted_* columns and "
                                   "errors of CSV's rows from the current calc and write "
                                   "--out")
    return ap


def configs_from_args(args: argparse.Namespace) -> list[InferConfig]:
    if args.plan:
        return PLANS[args.plan]()
    for name, value in (("--batch", args.batch), ("--new-tokens", args.new_tokens)):
        if value < 1:
            raise SystemExit(f"error: {name} must be a whole number >= 1, got {value}")
    if args.layers is not None and args.layers < 1:
        raise SystemExit(f"error: --layers must be a whole number >= 1, got {args.layers}")
    models = choices(args.model, infer_models.NAMES, "model(s)")
    attentions = choices(args.attention, ATTENTIONS, "attention(s)")
    cache_words = choices(args.cache, (*CACHES, "both"), "cache kind(s)")
    caches = [c for c in CACHES if c in cache_words or "both" in cache_words]
    lens = ints(args.prompt_len, "--prompt-len", 1)
    return expand(models, lens, attentions, caches=caches,
                  prefill_chunks=_chunks(args.prefill_chunk), batch=args.batch,
                  new_tokens=args.new_tokens, layers=args.layers)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repredict is not None:
        try:
            n = repredict(args.repredict, args.out)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{n} inference rows re-predicted from attnmem.calc into {args.out}")
        return 0
    return measure_to_csv(args, configs_from_args(args), run=run_infer, columns=INFER_COLUMNS,
                          store=InferStore, describe=_describe)


def _describe(res: InferResult) -> str:
    """A progress line (after its count and time)."""
    peak = f"peak {res.peak_bytes / 2**30:.2f} GiB" if res.peak_bytes else ""
    err = f"err {100 * res.peak_rel_error:+.1f}%" if res.peak_rel_error is not None else ""
    return (f"{res.model} {res.attention} {res.cache} B={res.batch} prompt={res.prompt_len}"
            f"{f' chunk={res.prefill_chunk}' if res.prefill_chunk else ''}: "
            f"{res.status} {peak} {err} {status_note(res)}")
