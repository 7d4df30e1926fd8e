"""Elements drawn once and replayed: a chart or table whose content was already drawn (by this
session or another) is sent again from Streamlit's cache instead of being built again.
Streamlit widgets.

Streamlit runs every session's script in one process (one core's worth of Python under the
GIL), so each run's CPU adds to every other session's wait (issue 45 item 5). Turning a
figure into a chart element costs 3-10 ms a chart (plotly validates every property of every
trace, then serialises it); a table 2-40 ms (its column widths measured cell by cell, the
frame turned into Arrow or a styled HTML table). A run that draws the same content again,
which is most runs (the other inputs of a page moved, or another session opened the page with
the same values), needs none of that: `drawn` keys an st.cache_resource function by a digest
of the content, and Streamlit replays the element messages recorded inside it on a hit
(Streamlit's cached-function replay, st.cache_resource "Using Streamlit commands in cached
functions"). The content's pickle is the key, so a hit is exactly the same content: the same
numbers and text are drawn, never an older figure.

Only non-widget elements go through here (charts and tables: a widget inside a cached
function is refused by Streamlit); their download buttons stay outside.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from typing import Any

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

#: How many distinct elements are kept, per kind (charts, grids, HTML tables). An element's
#: messages are 5-200 KB (a grid's Arrow bytes, a chart's JSON), so the cache stays under
#: ~50 MB; scripts/load_test.py checks that the server's memory stops growing.
MAX_ENTRIES = 256


def digest(*content: Any) -> str | None:
    """A digest of `content` (its pickle): equal for equal figures, frames and options; None
    where something in it cannot be pickled (then nothing is replayed)."""
    try:
        data = pickle.dumps(content, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return None
    return hashlib.blake2b(data, digest_size=20).hexdigest()


@st.cache_resource(max_entries=MAX_ENTRIES, show_spinner=False)
def _replayed(kind: str, content_digest: str, _draw: Callable[[], None]) -> None:
    """Runs `_draw` once per (kind, content): Streamlit records the elements it drew and
    replays them on every later call with the same arguments."""
    _draw()


def can_replay(where: Any) -> bool:
    """Whether `drawn` can place an element in `where`: the page (the streamlit module) or a
    container; not a stand-in object (a test's), which is drawn on directly."""
    return where is st or isinstance(where, DeltaGenerator)


def drawn(kind: str, content: tuple[Any, ...], draw: Callable[[], None],
          where: Any = st) -> None:
    """Draw with `draw()`, or replay what an earlier call with equal `content` drew.

    `draw` draws non-widget elements through the `st` module (st.plotly_chart, not
    where.plotly_chart): `where`, the page or a container (can_replay), is entered around
    the call, so a drawn and a replayed element land in the same place. `content` must
    determine everything `draw` sends (the figure or frame and every option, the element's
    key included); `kind` names the element, so two helpers never share an entry."""
    key = digest(kind, content)
    if key is None:
        if where is st:
            draw()
        else:
            with where:
                draw()
        return
    if where is st:
        _replayed(kind, key, draw)
    else:
        with where:
            _replayed(kind, key, draw)
