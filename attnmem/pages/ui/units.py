"""The GB/GiB switch and byte counts in the user's unit. Streamlit widgets.

The unit is a URL-bound value like the pages' inputs (key `unit`, attnmem.pages.ui.state): the
switch is drawn once per run, by app.py in the sidebar, and every page reads it through
`get_unit`. Sizes below one GB (GiB) are shown in MB/KB (MiB/KiB) instead of 0.00
(attnmem.calc.units.format_bytes).
"""

from __future__ import annotations

import streamlit as st

from attnmem.calc.units import format_bytes, to_unit
from attnmem.pages.ui.state import UNIT_KEY, UNIT_SPEC, get_unit, init

UNIT_HELP = "GB = 10⁹ bytes (what vendors print on the box); GiB = 2³⁰ bytes (what nvidia-smi and PyTorch report)."


def unit_switch() -> str:
    """The GB/GiB switch (drawn once per run, by app.py in the sidebar)."""
    init(UNIT_KEY, UNIT_SPEC, page="app")
    unit = st.radio("Memory unit", UNIT_SPEC.choices, key=UNIT_KEY, horizontal=True, help=UNIT_HELP)
    if st.query_params.get(UNIT_KEY) != unit:
        st.query_params[UNIT_KEY] = unit
    return unit


def fmt(n_bytes: int | float, unit: str | None = None) -> str:
    """Bytes in the user's unit (GB or GiB; MB/KB below one)."""
    return format_bytes(n_bytes, unit or get_unit())


def in_unit(n_bytes: int | float, unit: str | None = None) -> float:
    return to_unit(n_bytes, unit or get_unit())
