"""The README's kernel table is what scripts/readme_kernel_table.py builds from the bundled run,
and the script computes what its docstring says (ratios, the geometric mean over dense shapes)."""

from __future__ import annotations

import csv
import importlib.util
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_kernel_table",
                                               ROOT / "scripts" / "readme_kernel_table.py")
rkt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rkt)

FIELDS = ["impl", "dtype", "batch", "heads", "seq_len", "head_dim", "causal", "mode", "median_ms",
          "tflops", "rel_err", "status", "gpu", "torch_version", "triton_version", "timestamp",
          "kv_heads", "impl_version", "packed_lengths"]


def test_readme_holds_the_built_table() -> None:
    assert rkt.main(["--check"]) == 0, "run: python scripts/readme_kernel_table.py --write"


def test_readme_table_is_short() -> None:
    """Issue 33: one dated kernel table of at most 10 rows (header and rule not counted)."""
    rows = [line for line in rkt.table().splitlines()
            if line.startswith("| ") and not line.startswith("| ---")]
    assert 2 <= len(rows) - 1 <= 10  # minus the header row


def _write(path: Path, rows: list[dict]) -> Path:
    base = {"heads": "32", "median_ms": "1", "rel_err": "", "gpu": "NVIDIA H200",
            "torch_version": "2.11.0", "triton_version": "3.6.0",
            "timestamp": "2026-12-01T23:47:27+00:00", "impl_version": "", "packed_lengths": "",
            "mode": "fwd_bwd", "status": "ok", "causal": "False", "kv_heads": "32"}
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({**base, **r})
    return path


def test_ratios_and_geomean_from_a_small_run(tmp_path, monkeypatch) -> None:
    shape_a = ("bf16", 128, 32, False, 1, 4096)
    shape_b = ("fp16", 64, 32, False, 2, 6000)
    monkeypatch.setattr(rkt, "ROOT", tmp_path)
    monkeypatch.setattr(rkt, "SHAPES", (shape_a,))

    def row(impl, shape, tflops, **extra):
        dtype, d, kv, causal, b, s = shape
        return {"impl": impl, "dtype": dtype, "head_dim": d, "kv_heads": kv, "causal": str(causal),
                "batch": b, "seq_len": s, "tflops": tflops, **extra}

    path = _write(tmp_path / "run.csv", [
        row("triton", shape_a, 500), row("sdpa_cudnn", shape_a, 400), row("sdpa_flash", shape_a, 250),
        row("triton", shape_b, 300), row("sdpa_cudnn", shape_b, 600), row("sdpa_flash", shape_b, 150),
        # neither a packed batch nor a forward-only row nor a failed one counts
        row("triton", shape_b, 1, packed_lengths="100+200"), row("sdpa_cudnn", shape_b, 9, mode="fwd"),
        row("fa4", shape_a, 0, status="unavailable: not installed"),
    ])
    text = rkt.table(path, "python -m attnmem.measure.bench --preset training")
    assert "| bf16 | 128 | 32 | no | 1 | 4096 | 500 | 400 | 250 | 1.25 | 2.00 |" in text
    assert "FA4" not in text  # no ok row of it
    cudnn = math.sqrt(500 / 400 * 300 / 600)
    flash = math.sqrt(500 / 250 * 300 / 150)
    assert text.splitlines()[-1].endswith(f"| {cudnn:.2f} | {flash:.2f} |")
    assert "all 2 dense shapes" in text and "2026-12-01 23:47 UTC" in text


def test_a_shape_the_run_lacks_is_named(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(rkt, "SHAPES", (("bf16", 128, 32, False, 1, 4096),))
    path = _write(tmp_path / "run.csv", [{"impl": "sdpa_cudnn", "dtype": "bf16", "head_dim": 128,
                                          "batch": 1, "seq_len": 4096, "tflops": 1}])
    with pytest.raises(SystemExit, match="4096"):
        rkt.table(path)


def test_markers_are_required() -> None:
    block = "x"
    assert rkt.replace_in(f"a\n{rkt.START}\nold\n{rkt.END}\nb", block) == f"a\n{rkt.START}\nx\n{rkt.END}\nb"
    with pytest.raises(ValueError, match="needs one"):
        rkt.replace_in("no markers here", block)
