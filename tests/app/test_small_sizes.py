"""Small sizes are shown in MB/KB (MiB/KiB), never as '0.00 GB' (issue 32, item 3; docs/APP.md,
"Units")."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attnmem.calc import format_bytes, score_matrix_bytes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("unit,want", [("GB", "65.54 KB"), ("GiB", "64.00 KiB")])
def test_score_matrix_headline_of_a_tiny_shape(unit: str, want: str) -> None:
    at = AppTest.from_file(str(ROOT / "attnmem" / "pages" / "score_matrix.py"), default_timeout=60)
    for key, value in {"h": "1", "s": "128", "dtype": "fp32", "unit": unit}.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception
    shown = [m.value for m in at.metric]
    n = score_matrix_bytes(1, 1, 128, "fp32")  # 65,536 bytes
    assert shown[0] == want == format_bytes(n, unit)
    assert not any(v.startswith("0.00") for v in shown), shown
