"""The command line of the two presets that are not dense grids of ``speed``:
``--preset decode`` (attnmem.measure.bench.decode) and ``--preset random --seed N``
(attnmem.measure.bench.random_grid). ``speed.main`` hands a command line naming either to
`route`; both write their CSV and a markdown table under ``--out``."""

from __future__ import annotations

import argparse

__all__ = ["OWN_PRESETS", "parse", "route"]

OWN_PRESETS = ("decode", "random")


def _preset_of(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a == "--preset" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--preset="):
            return a.split("=", 1)[1]
    return None


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return n


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m attnmem.measure.bench --preset {decode,random}",
        description="decode: our split-KV path against SDPA's backends and FA4 (B 1-64, "
                    "cache 1k-128k, 1 and 8 new queries); random: a seeded grid of real "
                    "models' head configurations, forward and forward+backward against "
                    "cuDNN and FA4.")
    p.add_argument("--preset", choices=OWN_PRESETS, required=True)
    p.add_argument("--out", required=True, help="folder for the CSV and the markdown table")
    p.add_argument("--seed", type=int, default=None,
                   help="--preset random: the seed of the draw (required there)")
    p.add_argument("--rounds", type=_positive, default=None,
                   help="interleaved rounds per shape (default: decode 3, random 2)")
    p.add_argument("--budget-s", type=float, default=220.0,
                   help="--preset random: start no new shape after this many seconds")
    args = p.parse_args(argv)
    if args.preset == "random" and args.seed is None:
        p.error("--preset random needs --seed N (the draw depends on it alone)")
    if args.preset == "decode" and args.seed is not None:
        p.error("--seed applies to --preset random only")
    if not args.budget_s > 0:
        p.error(f"--budget-s must be a positive number of seconds, got {args.budget_s}")
    return args


def route(argv: list[str]) -> int | None:
    """Run the decode or random preset when ``argv`` names one (its exit status), else None."""
    if _preset_of(argv) not in OWN_PRESETS:
        return None
    args = parse(argv)
    if args.preset == "decode":
        from attnmem.measure.bench import decode

        return decode.main(args.out, args.rounds or 3)
    from attnmem.measure.bench import random_grid

    return random_grid.main(args.seed, args.out, args.rounds or 2, args.budget_s)
