"""URL-bound input state: every page's inputs live in the URL and carry over between pages.
Streamlit session state.

Each input has a key, which is also its query-parameter name, and a spec from
attnmem.pages.ui.url_state that says its type, default and bounds. Before a widget is drawn,
`init` puts its value into st.session_state: the value this page's widget already has, else the
URL's (parsed; a bad value gives the default and a st.warning naming the key, the value and
what is accepted), else the last value this session gave an input of the same name and spec on
any page, else the default. After the page has drawn everything, `sync_url` writes the page's
inputs back into the URL, so the address bar is always a link to the current view. Every page
calls `page_setup(name)` first and `sync_url(specs)` last.

The memory unit (GB or GiB, key `unit`) is one of these values on every page: app.py draws its
switch (attnmem.pages.ui.units.unit_switch) and `sync_url` writes it into every URL. `cached`
is the bounded st.cache_data the pages keep their sweeps in between runs; `kept` the bounded
st.cache_resource for what they share read-only.
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import streamlit as st

from attnmem.pages.ui.messages import warn
from attnmem.pages.ui.url_state import (
    BoolParam,
    ChoiceParam,
    FloatParam,
    IntParam,
    MultiChoiceParam,
    TextParam,
)

Spec = IntParam | FloatParam | ChoiceParam | BoolParam | MultiChoiceParam | TextParam

UNIT_KEY = "unit"
UNIT_SPEC = ChoiceParam("GB", ("GB", "GiB"))
_KEEP = "_url_keep"  # session_state: (URL name, spec) -> last value used on any page
_OWNER = "_url_owner"  # session_state: key -> page whose widget holds it now
_PAGE = "_url_page"  # session_state: the page being drawn


def _query_raw(key: str) -> str | list[str] | None:
    """The raw URL value(s) of a key: None if absent, a string, or a list if repeated."""
    values = st.query_params.get_all(key)
    if not values:
        return None
    return values[0] if len(values) == 1 else list(values)


def _valid(spec: Spec, value: Any) -> bool:
    if isinstance(spec, MultiChoiceParam):
        return isinstance(value, (list, tuple)) and spec.is_valid(tuple(value))
    return spec.is_valid(value)


def _widget_value(spec: Spec, value: Any) -> Any:
    return list(value) if isinstance(spec, MultiChoiceParam) else value


#: The server's garbage-collection thresholds (gc.set_threshold), set at the first page run.
GC_THRESHOLDS = (10_000, 20, 20)
#: Whether the objects alive at the first page run were moved out of the garbage collector's
#: view (`_freeze_startup`).
_FROZEN = False


def _freeze_startup() -> None:
    """Once per process, at the first page run: gc.freeze() the ~110,000 objects that exist then
    (the modules of Streamlit, pandas, plotly and attnmem, their functions and classes), so
    that Python's full collections stop walking them. The server runs every session in one
    process: a full collection walked ~460,000 objects, 0.2-1 s with every session stopped
    (12 in a 60 s load test, issue 45 item 5). What exists at the first run lives as long as
    the process, so freezing it loses nothing; later objects are collected as before, with
    the thresholds GC_THRESHOLDS."""
    global _FROZEN
    if not _FROZEN:
        _FROZEN = True
        gc.freeze()
        # Collections less often: a run allocates ~10^5 objects and frees nearly all of them by
        # reference counting; at Python's default (700, 10, 10) that is a young collection
        # every ~700 allocations and a full one every few seconds under load.
        gc.set_threshold(*GC_THRESHOLDS)


def page_setup(name: str) -> None:
    """Call first on every page: names the page whose widgets the following calls draw."""
    _freeze_startup()
    st.session_state[_PAGE] = name


def current_page() -> str:
    """The page being drawn (page_setup's name; "" before any page has run)."""
    return st.session_state.get(_PAGE, "")


def claim(key: str, page: str | None = None) -> bool:
    """Record that `key` now belongs to this page's widget; True if it already did.

    Widget state survives one run after a page switch, so a key that another page's widget
    used (same URL name, different widget) must be set again explicitly, or the new widget
    would start from its own default instead of the shared value.
    """
    owners: dict[str, str] = st.session_state.setdefault(_OWNER, {})
    page = page if page is not None else current_page()
    mine = owners.get(key) == page
    owners[key] = page
    return mine


def _keep_key(key: str, spec: Spec) -> str:
    """Values are shared across pages by URL name AND spec: the same name with the same type,
    default and bounds means the same input (H on Score matrix, Scaling and the explainer);
    the same name with another spec (the score page's dtype, which has 'custom') is its own."""
    return f"{key}\x1f{spec!r}"


def init(key: str, spec: Spec, page: str | None = None) -> None:
    """Put the value of widget `key` into session_state before the widget is drawn.

    The value is written on every run, even when it is this page's widget's own value: a
    value written through session_state is sent to the browser with the widget, so the box
    on screen always shows the value this run computes with. Left unwritten, the browser
    draws the widget from what it remembers for that widget, which after a page switch in
    the middle of a run can be another visit's value (issue 32: the widgets showed a T4 and
    s = 1 while the numbers were the H100's and 8,192's).
    """
    keep: dict[str, Any] = st.session_state.setdefault(_KEEP, {})
    if claim(key, page) and key in st.session_state and _valid(spec, st.session_state[key]):
        st.session_state[key] = st.session_state[key]
        return
    kept = keep.get(_keep_key(key, spec))
    raw = _query_raw(key)
    parsed = spec.parse(key, raw) if raw is not None else None
    if parsed is not None and parsed.warning:
        warn(parsed.warning)
        value = spec.default
    elif parsed is not None:
        value = parsed.value
    elif kept is not None and _valid(spec, kept):
        value = kept
    else:
        value = spec.default
    st.session_state[key] = _widget_value(spec, value)


def sync_url(specs: Mapping[str, Spec]) -> None:
    """Write the page's inputs (and the unit) into the URL; remember them for other pages."""
    keep: dict[str, Any] = st.session_state.setdefault(_KEEP, {})
    wanted: dict[str, str] = {UNIT_KEY: get_unit()}
    keep[_keep_key(UNIT_KEY, UNIT_SPEC)] = wanted[UNIT_KEY]
    for key, spec in specs.items():
        if key in st.session_state:
            value = st.session_state[key]
            value = tuple(value) if isinstance(spec, MultiChoiceParam) else value
            keep[_keep_key(key, spec)] = value
            wanted[key] = spec.to_url(value)
    if st.query_params.to_dict() != wanted:
        st.query_params.from_dict(wanted)


def get_unit() -> str:
    """'GB' or 'GiB': the sidebar switch's value, else the URL's, else GB."""
    value = st.session_state.get(UNIT_KEY)
    if value in UNIT_SPEC.choices:
        return value
    parsed = UNIT_SPEC.parse(UNIT_KEY, _query_raw(UNIT_KEY))
    if parsed.warning is None and _query_raw(UNIT_KEY) is not None:
        return parsed.value
    kept = st.session_state.get(_KEEP, {}).get(_keep_key(UNIT_KEY, UNIT_SPEC))
    return kept if kept in UNIT_SPEC.choices else UNIT_SPEC.default


#: The Streamlit wrapper made for each cached function (`_wrapped`): by its file, name, line
#: and code (code objects compare by content, which leaves out the file), then its options.
_WRAPPED: dict[tuple, dict[tuple, Callable[..., Any]]] = {}


def _wrapped(decorator: Callable[..., Any], options: dict[str, Any]
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`decorator(**options)` applied to a function once per code object, not once per run.

    A page script runs top to bottom on every rerun, so a function it defines is decorated
    again each time, and Streamlit keys the new wrapper by the function's source: it reads and
    tokenizes that source (inspect.getsource) each run, 0.5-2 ms a function, up to 10 ms a run
    on a page that keeps a dozen (issue 45 item 5). The server compiles a page once and runs
    that code object on every rerun, so the function's code object is the same each time: the
    wrapper made the first time is returned again, with the same cache (Streamlit keys its
    storage by the function's source either way). The first run's function is the one the
    wrapper calls on a miss; a cached function must take what it depends on as arguments (its
    cache key is made of them), so it reads no global that another run would set differently."""
    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        code = func.__code__
        by_options = _WRAPPED.setdefault(
            (code.co_filename, code.co_qualname, code.co_firstlineno, code), {})
        key = (decorator, tuple(sorted(options.items())))
        if key not in by_options:
            by_options[key] = _by_keyword(decorator(**options)(func), func)
        return by_options[key]
    return decorate


def _by_keyword(cached_func: Callable[..., Any], func: Callable[..., Any]) -> Callable[..., Any]:
    """`cached_func` called with every positional argument passed by its parameter's name.

    Streamlit names each positional argument of a cached call through inspect.signature, once
    per argument per call (~0.1 ms each: 2-5 ms a run on a page whose cached calls take ten
    arguments); a keyword argument brings its name. The key is the same either way (each
    argument's name, then its value, in order), so are the arguments whose name starts with
    "_" (left out of it). A function with *args is called as it is."""
    params = inspect.signature(func).parameters.values()
    if any(p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY) for p in params):
        return cached_func
    names = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) > len(names):
            return cached_func(*args, **kwargs)
        return cached_func(**dict(zip(names, args, strict=False)), **kwargs)  # fewer: defaults

    call.clear = cached_func.clear  # type: ignore[attr-defined]
    return call


def cached(max_entries: int = 64) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """st.cache_data for sweeps, bounded so a long session cannot grow memory without limit
    (each call returns a copy of the value); decorated once per function (`_wrapped`)."""
    return _wrapped(st.cache_data, {"max_entries": max_entries, "show_spinner": False})


def kept(max_entries: int | None = 64) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """st.cache_resource, bounded: the value is kept once and shared by every run and session,
    not copied (pickling a frame back costs milliseconds), so callers must not change it;
    decorated once per function (`_wrapped`)."""
    return _wrapped(st.cache_resource, {"max_entries": max_entries, "show_spinner": False})
