"""The pages' input widgets, each bound to the URL parameter of its key (attnmem.pages.ui.state):
number boxes, selectors, switches and the sequence-length slider. Streamlit widgets.

Every widget takes `where` (st, a column, a container) and passes other keywords to Streamlit.

A number box is given its session-state value as `value` too. Streamlit 1.67's frontend
(NumberInput) first draws a box that is new to the browser (every page visit, direct load or
Back) from the element's default, and only an effect after that paint applies the value set
through session state; with no `value` the default is min_value, so every box read "1" for
60-300 ms on the 2-core machine (a click on + then stepped from the wrong number's display,
and tests read "1"). A keyed number box's identity is its key alone (key_as_main_identity),
so passing the value does not make a new widget when it changes. Streamlit logs that a value
is both passed and set through session state; .streamlit/config.toml turns that log line off.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from attnmem.calc.units import short_len
from attnmem.pages.ui.state import claim, init
from attnmem.pages.ui.url_state import (
    BoolParam,
    ChoiceParam,
    FloatParam,
    IntParam,
    MultiChoiceParam,
    nearest_power_of_two,
)


def int_input(label: str, key: str, spec: IntParam, where: Any = st, **kw: Any) -> int:
    init(key, spec)
    return int(where.number_input(label, min_value=spec.lo, max_value=spec.hi, step=1, key=key,
                                  value=int(st.session_state[key]), **kw))


def float_input(label: str, key: str, spec: FloatParam, where: Any = st, **kw: Any) -> float:
    init(key, spec)
    return float(where.number_input(label, min_value=float(spec.lo), max_value=float(spec.hi),
                                    key=key, value=float(st.session_state[key]), **kw))


def select(label: str, key: str, spec: ChoiceParam, where: Any = st, **kw: Any) -> str:
    init(key, spec)
    return where.selectbox(label, spec.choices, key=key, **kw)


def radio(label: str, key: str, spec: ChoiceParam, where: Any = st, **kw: Any) -> str:
    init(key, spec)
    return where.radio(label, spec.choices, key=key, horizontal=True, **kw)


def multiselect(label: str, key: str, spec: MultiChoiceParam, where: Any = st, **kw: Any) -> list[str]:
    init(key, spec)
    kw.setdefault("wrap", True)  # chips on more rows, not scrolled out of a narrow column's view
    return list(where.multiselect(label, spec.choices, key=key, **kw))


def toggle(label: str, key: str, spec: BoolParam, where: Any = st, **kw: Any) -> bool:
    init(key, spec)
    kw.setdefault("wrap", True)  # a long label wraps; in a column Streamlit would cut it off with …
    return bool(where.checkbox(label, key=key, **kw))


def seq_len_input(
    label: str,
    key: str,
    spec: IntParam,
    lo_pow2: int = 128,
    hi_pow2: int = 1 << 24,
    where: Any = st,
    help: str | None = None,
) -> int:
    """Sequence length: a log-scaled slider over powers of two plus an exact number box.

    The number box (key `key`, in the URL) is the value; the slider (key `key`+'_pow2', not in
    the URL) moves it in powers of two and follows it to the nearest power of two.
    """
    skey = f"_{key}_pow2"
    options = [1 << p for p in range(lo_pow2.bit_length() - 1, hi_pow2.bit_length())]
    init(key, spec)

    def from_slider() -> None:
        st.session_state[key] = int(st.session_state[skey])

    def from_number() -> None:
        st.session_state[skey] = nearest_power_of_two(int(st.session_state[key]), lo_pow2, hi_pow2)

    near = nearest_power_of_two(int(st.session_state[key]), lo_pow2, hi_pow2)
    claim(skey)
    st.session_state[skey] = near  # written every run, as init does: the slider shows the box
    left, right = where.columns([3, 1])
    left.select_slider(
        f"{label} (log scale: powers of two)", options, key=skey, format_func=short_len,
        on_change=from_slider, help=help,
    )
    value = right.number_input(
        "exact", min_value=spec.lo, max_value=spec.hi, step=1, key=key, on_change=from_number,
        value=int(st.session_state[key]),  # drawn first from this, not min_value (module doc)
        help=f"Any whole number from {spec.lo:,} to {spec.hi:,}.",
    )
    return int(value)
