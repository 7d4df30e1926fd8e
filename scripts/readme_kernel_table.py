"""The README's kernel table, built from one bundled benchmark run.

Reads the rows `python -m attnmem.measure.bench` wrote (the CSV schema of attnmem.measure.bench.speed: impl,
dtype, batch, seq_len, head_dim, causal, mode, tflops, status, gpu, torch_version,
triton_version, timestamp, kv_heads, packed_lengths), picks forward+backward at the shapes in
`SHAPES`, and writes a Markdown table of our kernel ("triton" in the CSV) against each peer the
run timed (cuDNN, SDPA's FlashAttention-2, FlashAttention-4 where present), with the ratios,
and a last row: the geometric mean of our TFLOP/s over each peer's across every dense
forward+backward shape of the run where both are ok (packed batches left out: SDPA runs them
on nested tensors, which says more about that path than about the kernels). The caption gives
the run's date (its timestamps), the GPU and versions (its columns) and the command.

    python scripts/readme_kernel_table.py            # print the table
    python scripts/readme_kernel_table.py --write    # put it into README.md between the markers
    python scripts/readme_kernel_table.py --check    # exit 1 if README.md's table differs

A newer run: pass --csv and --command (and edit `SHAPES` if it timed other shapes), then
--write. tests/test_readme_table.py checks that README.md holds what this prints.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "data" / "kernel_speed_training_eager_h200.csv"
README = ROOT / "README.md"
COMMAND = "python -m attnmem.measure.bench --preset training --impls triton sdpa_cudnn fa4 --rounds 2"
START = "<!-- kernel table: built by scripts/readme_kernel_table.py -->"
END = "<!-- end of kernel table -->"
OURS = "triton"
#: Peers in column order, with their column names.
PEERS = {"sdpa_cudnn": "cuDNN", "sdpa_flash": "FA2", "fa4": "FA4"}
#: (dtype, head dim, H_kv, causal, B, s) at H = 32: the six B = 1 anchors' spread (MHA and GQA
#: 4:1, causal and not, d = 64 and 128), a length that is not a power of two, and batched short
#: sequences.
SHAPES = (
    ("bf16", 128, 32, False, 1, 4096),
    ("bf16", 128, 32, True, 1, 16384),
    ("bf16", 128, 8, True, 1, 8192),
    ("bf16", 64, 32, True, 1, 8192),
    ("fp16", 64, 32, False, 2, 6000),
    ("fp16", 128, 32, True, 8, 8192),
    ("bf16", 128, 32, False, 16, 1024),
    ("bf16", 64, 8, True, 256, 512),
    ("fp16", 64, 8, False, 16, 512),
)


def read(path: Path) -> list[dict]:
    """The CSV's rows as dicts; SystemExit naming the file and the missing column otherwise."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise SystemExit(f"cannot read the benchmark CSV {path}: {e}") from e
    need = {"impl", "dtype", "batch", "seq_len", "head_dim", "causal", "mode", "tflops",
            "status", "gpu", "torch_version", "triton_version", "timestamp", "kv_heads"}
    missing = need - set(rows[0] if rows else need)
    if not rows or missing:
        raise SystemExit(f"{path} is not an attnmem.measure.bench CSV with rows "
                         f"(missing: {', '.join(sorted(missing)) or 'every row'})")
    return rows


def _key(r: dict) -> tuple:
    return (r["dtype"], int(r["head_dim"]), int(r["kv_heads"]), r["causal"] == "True",
            int(r["batch"]), int(r["seq_len"]))


def speeds(rows: list[dict]) -> dict[tuple, dict[str, float]]:
    """{shape: {impl: TFLOP/s}} of the dense forward+backward rows that ran ("ok")."""
    out: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r["mode"] == "fwd_bwd" and r["status"] == "ok" and not r.get("packed_lengths"):
            out.setdefault(_key(r), {})[r["impl"]] = float(r["tflops"])
    return out


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def table(path: Path = CSV, command: str = COMMAND) -> str:
    """The caption and the Markdown table (module docstring)."""
    rows = read(path)
    got = speeds(rows)
    missing = [s for s in SHAPES if OURS not in got.get(s, {})]
    if missing:
        raise SystemExit(f"{path} has no ok forward+backward row of {OURS!r} at "
                         f"{', '.join(map(str, missing))}; edit SHAPES to shapes the run timed")
    peers = [p for p in PEERS if any(p in got[s] for s in SHAPES)]
    stamps = sorted(r["timestamp"] for r in rows)
    first, last = stamps[0][:16].replace("T", " "), stamps[-1][11:16]
    when = first + (f"-{last}" if last != first[11:] else "") + " UTC"
    r0 = rows[0]
    caption = (f"Forward+backward TFLOP/s, H = 32, eager calls, every implementation in one "
               f"process, measured {when} on one {r0['gpu']} (torch {r0['torch_version']}, "
               f"triton {r0['triton_version']}): `{command}`, rows in "
               f"`{path.relative_to(ROOT).as_posix()}`. \"ours\" is what `flash_attention` runs "
               "by default.")
    lines = [
        *textwrap.wrap(caption, 100, break_long_words=False, break_on_hyphens=False),
        "",
        "| dtype | d | H_kv | causal | B | s | ours | "
        + " | ".join(PEERS[p] for p in peers) + " | "
        + " | ".join(f"ours/{PEERS[p]}" for p in peers) + " |",
        "| --- " * (7 + 2 * len(peers)) + "|",
    ]
    for s in SHAPES:
        dtype, d, kv, causal, b, n = s
        have = got[s]
        cells = [f"{have[p]:.0f}" if p in have else "-" for p in peers]
        ratios = [f"{have[OURS] / have[p]:.2f}" if p in have else "-" for p in peers]
        lines.append(f"| {dtype} | {d} | {kv} | {'yes' if causal else 'no'} | {b} | {n} | "
                     f"{have[OURS]:.0f} | " + " | ".join(cells + ratios) + " |")
    ours = [v for v in got.values() if OURS in v]
    means = []
    for p in peers:
        ratios = [v[OURS] / v[p] for v in ours if p in v]
        note = "" if len(ratios) == len(ours) else f" ({len(ratios)} shapes)"
        means.append(f"{geomean(ratios):.2f}{note}" if ratios else "-")
    lines.append(f"| geometric mean, all {len(ours)} dense shapes of the run |" + " |" * (6 + len(peers))
                 + " " + " | ".join(means) + " |")
    return "\n".join(lines)


def replace_in(text: str, block: str) -> str:
    """text with what lies between START and END replaced by block; ValueError without them."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"README.md needs one {START!r} line before one {END!r} line")
    head, rest = text.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{block}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--csv", type=Path, default=CSV, help="the run's CSV (default: %(default)s)")
    p.add_argument("--command", default=COMMAND, help="the command that wrote it, for the caption")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="put the table into README.md")
    g.add_argument("--check", action="store_true", help="exit 1 if README.md's table differs")
    args = p.parse_args(argv)
    block = table(args.csv.resolve(), args.command)
    if not (args.write or args.check):
        print(block)
        return 0
    text = README.read_text(encoding="utf-8")
    new = replace_in(text, block)
    if args.check:
        if new != text:
            print("README.md's kernel table is not what scripts/readme_kernel_table.py builds; "
                  "run it with --write", file=sys.stderr)
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
