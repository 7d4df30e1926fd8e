"""'GPUs needed' says "never fits" when no count of GPUs can fit, not the search's bound
(issue 32, item 3: "more than 1,024" for an eager run that never fits at any count)."""

from __future__ import annotations

from pathlib import Path

from _frames import grids  # HTML tables and grids alike
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]


def _needed_cells(**query: str) -> list[str]:
    at = AppTest.from_file(str(ROOT / "attnmem" / "pages" / "training.py"), default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception
    table = next(t.value for t in grids(at) if any(str(col).startswith("GPUs needed") for col in t.value))
    col = next(col for col in table if str(col).startswith("GPUs needed"))
    return list(table[col])


def test_eager_at_a_long_context_never_fits() -> None:
    # eager keeps s x s probabilities per layer per replica: at 65,536 tokens that is far more
    # than 16 GB whatever the number of GPUs
    cells = _needed_cells(attns="eager", s="65536", gpu="NVIDIA T4 16GB")
    assert cells[0].startswith("never fits"), cells


def test_a_fitting_layout_gives_a_count() -> None:
    cells = _needed_cells(attns="sdpa_flash", s="4096", gpu="NVIDIA H100 80GB")
    assert cells[0].replace(",", "").isdigit(), cells


def test_never_fits_says_why_under_the_table() -> None:
    # the cell says "never fits" (short enough not to be cut off at 1280 px); the reason is
    # the caption under the table, shown only when a row never fits
    def captions(**query: str) -> list[str]:
        at = AppTest.from_file(str(ROOT / "attnmem" / "pages" / "training.py"), default_timeout=120)
        for key, value in query.items():
            at.query_params[key] = value
        at.run()
        assert not at.exception
        return [x.value for x in at.caption]

    why = "activations alone exceed the GPU"
    assert any(why in x for x in captions(attns="eager", s="65536", gpu="NVIDIA T4 16GB"))
    assert not any(why in x for x in captions(attns="sdpa_flash", s="4096", gpu="NVIDIA H100 80GB"))
