"""generate()'s traced peak at any prompt length from a few traces: each tensor as a polynomial.

A trace (attnmem.trace.inference) is a list of storage events. For one model, batch, number of
new tokens, attention and dtype, the program that makes them does not depend on the prompt
length s, as long as no branch does (a sliding window shorter than the keys, a chunked-
attention boundary, a mask transformers stops skipping): then every trace has the same events
in the same order, and each tensor's size is a polynomial in s of degree at most 2 (the
activations B·s·w, eager's scores B·H·s², the cache B·(s + N)·w, constants).

`LengthModel` traces three lengths, solves each event's quadratic exactly (rational
arithmetic), and checks it on a fourth and a fifth trace: one event off by one byte, or any
event added, dropped or moved, and there is no model (None), so the caller traces each length
itself. Between its fitted lengths the model gives each tensor's exact size; the peak is then
the same allocator replay as a trace's (attnmem.calc.allocator), with no model code run: tens
of milliseconds against seconds. Outside [lo, hi] it is not used.

Where the layer shortcut holds (attnmem.trace.layer_blocks), the five traces are of the model
with a few layers and the fitted skeleton is expanded once to the full depth (its check, a
trace one block longer, is run at one of the lengths unless a first answer ran it already);
the cache's bytes are the sum of the quadratics of the tensors it holds at the end.

Sizes that are not polynomials in s would be rounded (the memory-efficient backend pads its
mask's columns to 16; FlashAttention's split-KV count depends on the tiles): they fail the
checks, or, between checked lengths, differ by the rounding only; `peak` is exact at the
traced lengths and the callers confirm a searched answer with a trace of its own.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

from attnmem.calc.units import MAX_SEQ_LEN
from attnmem.trace import layer_blocks
from attnmem.trace.inference import Recorded, TracedInference, record, result
from attnmem.trace.recorder import flat

#: Shortest span worth a model: below it the callers trace each length.
MIN_SPAN = 64


@dataclass(frozen=True)
class LengthModel:
    """Each event of a traced generate() with its size as a quadratic in the prompt length."""

    lo: int
    hi: int
    skeleton: tuple  # the events, sizes replaced by their index in `coeffs`
    coeffs: tuple[tuple[Fraction, Fraction, Fraction], ...]
    cache: tuple[Fraction, Fraction, Fraction]
    weights_bytes: int
    model_class: str
    key: tuple  # (config text, batch, new tokens, attention, dtype)
    seconds: float  # the traces it took

    def recorded(self, s: int) -> Recorded:
        if not self.lo <= s <= self.hi:
            raise ValueError(f"prompt_len {s}: this model covers {self.lo} to {self.hi}")
        s2 = s * s  # integer numerators over one denominator: no Fraction per event
        sizes = [(a * s2 + b * s + c) // den for a, b, c, den in self.integer_coeffs]
        events = tuple(ev if ev[0] != "a" else (ev[0], ev[1], sizes[ev[2]], ev[3])
                       for ev in self.skeleton)
        return Recorded(events, self.weights_bytes, _eval(self.cache, s), self.model_class)

    @property
    def integer_coeffs(self) -> tuple[tuple[int, int, int, int], ...]:
        cached = self.__dict__.get("_int")
        if cached is None:
            cached = tuple(_integer(c) for c in self.coeffs)
            object.__setattr__(self, "_int", cached)
        return cached

    def peak(self, s: int) -> TracedInference:
        """The trace at prompt length s, from the model (no model code runs)."""
        t0 = time.perf_counter()
        _, b, n, attention, dtype = self.key
        return result(self.recorded(s), b, s, n, attention, dtype, time.perf_counter() - t0)


def _integer(c: tuple[Fraction, Fraction, Fraction]) -> tuple[int, int, int, int]:
    den = c[0].denominator * c[1].denominator * c[2].denominator
    return (int(c[0] * den), int(c[1] * den), int(c[2] * den), den)


def _eval(c: tuple[Fraction, Fraction, Fraction], s: int) -> int:
    v = c[0] * s * s + c[1] * s + c[2]
    return int(v)


def _quadratic(xs: tuple[int, int, int], ys: tuple[int, int, int]
               ) -> tuple[Fraction, Fraction, Fraction]:
    """The a, b, c of a·x² + b·x + c through three points (Lagrange, exact)."""
    (x0, x1, x2), (y0, y1, y2) = xs, ys
    l0 = Fraction(y0, (x0 - x1) * (x0 - x2))
    l1 = Fraction(y1, (x1 - x0) * (x1 - x2))
    l2 = Fraction(y2, (x2 - x0) * (x2 - x1))
    a = l0 + l1 + l2
    b = -(l0 * (x1 + x2) + l1 * (x0 + x2) + l2 * (x0 + x1))
    c = l0 * x1 * x2 + l1 * x0 * x2 + l2 * x0 * x1
    return a, b, c


def _shape(ev: tuple) -> tuple:
    return ev if ev[0] != "a" else (ev[0], ev[1], ev[3])


def length_model(d: dict, batch: int, new_tokens: int, attention: str, dtype: str, lo: int,
                 hi: int, at: int | None = None) -> LengthModel | None:
    """A LengthModel over prompt lengths lo..hi, or None where the traces' events do not
    follow one program with quadratic sizes (see the module docstring). `at`: a length inside
    to fit at (one already traced, whose trace is reused), else the middle."""
    if hi - lo < MIN_SPAN:
        return None
    return _model(json.dumps(d, sort_keys=True), batch, new_tokens, attention, dtype, lo, hi,
                  at if at is not None and lo < at < hi else (lo + hi) // 2)


def _lengths(lo: int, mid: int, hi: int) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """Three lengths to fit at and two others to check at, all different."""
    fit_at = (lo, mid, hi)
    check_at = []
    for c in ((3 * lo + hi) // 4, (lo + 3 * hi) // 4):
        while c in fit_at or c in check_at:
            c += 1 if c < hi - 1 else -1
        check_at.append(c)
    return fit_at, (check_at[0], check_at[1])


def _runs(text: str, b: int, n: int, attention: str, dtype: str,
          lengths: tuple[int, ...]) -> tuple[dict[int, Recorded], layer_blocks.LayerPlan | None]:
    """The traces the model is fitted and checked on: of the short model where the layer
    shortcut holds (attnmem.trace.layer_blocks; its check against the longer short model run
    at one of the lengths unless one was checked already), else of the model itself."""
    pl = layer_blocks.plan_for(text, attention, dtype)
    if pl is not None:
        try:
            if not layer_blocks.was_checked(text, b, n, attention, dtype) & set(lengths):
                pl = layer_blocks.checked(pl, text, b, lengths[1], n, attention, dtype)
            runs = {s: layer_blocks.short_record(pl.short_text, b, s, n, attention, dtype)
                    for s in lengths}
            return runs, pl
        except layer_blocks.NotRepeating:
            pass
        except ValueError:  # the short model's code refused: the full traces say why
            pass
    return {s: record(text, b, s, n, attention, dtype) for s in lengths}, None


@lru_cache(maxsize=64)
def _model(text: str, b: int, n: int, attention: str, dtype: str, lo: int, hi: int,
           mid: int) -> LengthModel | None:
    t0 = time.perf_counter()
    fit_at, check_at = _lengths(lo, mid, hi)
    runs, pl = _runs(text, b, n, attention, dtype, (*fit_at, *check_at))
    plain = {s: tuple(flat(r.events)) for s, r in runs.items()}  # folded loops unrolled
    first = plain[lo]
    if any(len(p) != len(first) for p in plain.values()):
        return None
    skeleton: list[tuple] = []
    coeffs: list[tuple[Fraction, Fraction, Fraction]] = []
    for i, ev in enumerate(first):
        evs = [plain[s][i] for s in (*fit_at, *check_at)]
        if any(_shape(e) != _shape(ev) for e in evs):
            return None
        if ev[0] != "a":
            skeleton.append(ev)
            continue
        c = _quadratic(fit_at, tuple(e[2] for e in evs[:3]))
        if any(_eval(c, s) != e[2] for s, e in zip(check_at, evs[3:], strict=True)):
            return None
        skeleton.append(("a", ev[1], len(coeffs), ev[3]))
        coeffs.append(c)
    if pl is None:
        cache = _quadratic(fit_at, tuple(runs[s].cache_bytes for s in fit_at))
        if any(_eval(cache, s) != runs[s].cache_bytes for s in check_at):
            return None
        weights, model_class = runs[lo].weights_bytes, runs[lo].model_class
    else:  # the full depth's skeleton from the short one's (layer_blocks.expand)
        short = _cache_poly(coeffs, skeleton)
        if any(_eval(short, s) != runs[s].cache_bytes for s in runs):
            return None
        skeleton = list(layer_blocks.expand(tuple(skeleton), pl.layers_name, pl.short_depth,
                                            pl.head, pl.period, pl.depth))
        cache = _cache_poly(coeffs, skeleton)
        weights, model_class = pl.weights_bytes, pl.model_class
    return LengthModel(lo, hi, tuple(skeleton), tuple(coeffs), cache, weights, model_class,
                       (text, b, n, attention, dtype), time.perf_counter() - t0)


def _cache_poly(coeffs: list, skeleton: list) -> tuple[Fraction, Fraction, Fraction]:
    """The cache's bytes as a quadratic: the sum of those of the allocations it holds at the
    end (attnmem.trace.layer_blocks.cache_ids)."""
    index = {ev[1]: ev[2] for ev in skeleton if ev[0] == "a"}
    a = b = c = Fraction(0)
    for x in layer_blocks.cache_ids(tuple(skeleton)):
        qa, qb, qc = coeffs[index[x]]
        a, b, c = a + qa, b + qb, c + qc
    return a, b, c


def longest_prompt(d: dict, batch: int, new_tokens: int, attention: str, dtype: str,
                   budget: int, limit: int) -> tuple[int, str]:
    """The longest prompt whose traced generate() peak is at most `budget` bytes, up to
    `limit` tokens, and how it was found. Doubling from 1,024 tokens with a trace each, then a
    search inside the last bracket on a LengthModel (exact between its traces), confirmed by
    tracing the answer and the next length. Where no LengthModel holds (a branch on s inside
    the bracket) the bisection traces each length. 0: not even one token fits."""
    from attnmem.trace.generate import trace_inference

    def fits(s: int) -> bool:
        return trace_inference(d, batch, s, new_tokens, attention=attention,
                               dtype=dtype).peak_bytes <= budget

    if not fits(1):
        return 0, "not even a 1-token prompt fits"
    lo, hi = 1, min(1024, limit)
    while fits(hi):
        if hi >= limit:
            return limit, f"fits at the limit of {limit:,} tokens"
        lo, hi = hi, min(2 * hi, limit)
    model = length_model(d, batch, new_tokens, attention, dtype, lo, hi)
    how = "bisected on a length model, confirmed by a trace" if model else \
        "bisected with a trace per length"

    def fits_fast(s: int) -> bool:
        return model.peak(s).peak_bytes <= budget if model else fits(s)

    while hi - lo > 1:  # lo fits, hi does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits_fast(mid) else (lo, mid)
    if model and not (fits(lo) and not fits(hi)):  # a size the model rounded: trace around it
        while lo > 1 and not fits(lo):
            lo -= 1
        while lo + 1 <= limit and fits(lo + 1):
            lo += 1
        how = "bisected on a length model, then corrected by traces"
    return lo, how


#: LengthModels built or being built, by (config text, batch, new tokens, attention, dtype):
#: (lo, hi) -> the model, or None where none holds (not tried again).
_MODELS: dict[tuple, dict[tuple[int, int], LengthModel | None]] = {}
_MODELS_LOCK = threading.Lock()
#: (key, span) whose model was tried (built, or found not to hold)
_TRIED: set[tuple[tuple, tuple[int, int]]] = set()
#: (key, span) -> the traced length the span was made around (the model is fitted there)
_CENTRE: dict[tuple[tuple, tuple[int, int]], int] = {}
#: A first answer builds its length model at once where the answer took at most this long
#: (seconds): the model's four other traces then cost about twice the answer's (two short
#: traces of which the model reuses one), keeping the first answer within issue 42's 3 s.
BUILD_WITH_FIRST_S = 0.8
#: Config keys whose integer values are lengths the program may branch at (a sliding window,
#: Llama 4's attention chunk, long-RoPE's original context, Llama 4's attention temperature
#: floor): a span is kept on one side of each.
_LENGTH_KEYS = ("window", "chunk", "position", "context", "floor_scale")


def _branch_lengths(d: Any) -> set[int]:
    """Integer values of the config's length-like keys (_LENGTH_KEYS), at any depth."""
    out: set[int] = set()
    if isinstance(d, dict):
        for k, v in d.items():
            if isinstance(v, (dict, list)):
                out |= _branch_lengths(v)
            elif isinstance(v, int) and not isinstance(v, bool) and isinstance(k, str) \
                    and any(w in k for w in _LENGTH_KEYS):
                out.add(v)
    elif isinstance(d, list):
        for v in d:
            if isinstance(v, (dict, list)):
                out |= _branch_lengths(v)
    return out


def span_around(s: int, d: dict | None = None, new_tokens: int = 1) -> tuple[int, int]:
    """The lengths a model is built over for a page at prompt length s: half to twice s,
    kept on s's side of every length in the config that the program may branch at (a model
    across a sliding window or an attention chunk would not hold: its traces differ), with a
    margin of the new tokens (the decode phase's cache is s + N - 1 long)."""
    lo, hi = max(1, s // 2), min(2 * s, MAX_SEQ_LEN - 1)
    margin = new_tokens + 2
    for v in _branch_lengths(d) if d is not None else ():
        if s + margin < v - margin and v - margin <= hi:
            hi = v - margin
        elif v + margin < s and v + margin >= lo:
            lo = v + margin
    return lo, hi


def trace_at(d: dict, batch: int, prompt_len: int, new_tokens: int = 1,
             attention: str = "sdpa", dtype: str = "bf16") -> TracedInference:
    """generate()'s trace at prompt_len: from a LengthModel that covers it (a replay, tens of
    milliseconds), else a trace of its own. A first answer that took at most
    BUILD_WITH_FIRST_S builds the LengthModel over `span_around` its length at once (fitted
    at that length, so its trace is reused); otherwise the second length asked near it (a
    slider's first move) builds it, once. Later moves inside the span are replays. The
    answers are the same either way (exact between a model's traces; see the module docstring
    for sizes it would round). No background thread: torch code still running when the
    interpreter exits aborts the process."""
    from attnmem.trace.generate import trace_inference

    text = json.dumps(d, sort_keys=True)
    key = (text, batch, new_tokens, attention, dtype)
    with _MODELS_LOCK:
        spans = _MODELS.setdefault(key, {})
        held = [m for m in spans.values() if m is not None and m.lo <= prompt_len <= m.hi]
        todo = [sp for sp, m in spans.items() if m is None and sp[0] <= prompt_len <= sp[1]
                and (key, sp) not in _TRIED]
    if held:
        return held[0].peak(prompt_len)
    for span in todo:  # an earlier length's span, no model tried yet: build it now
        m = _build(d, key, span)
        if m is not None:
            return m.peak(prompt_len)
    t0 = time.perf_counter()
    t = trace_inference(d, batch, prompt_len, new_tokens, attention=attention, dtype=dtype)
    span = span_around(prompt_len, d, new_tokens)
    if span[1] - span[0] >= MIN_SPAN and span not in spans:
        with _MODELS_LOCK:
            spans.setdefault(span, None)
            _CENTRE[(key, span)] = prompt_len
        if time.perf_counter() - t0 <= BUILD_WITH_FIRST_S:
            _build(d, key, span)
    return t


def _build(d: dict, key: tuple, span: tuple[int, int]) -> LengthModel | None:
    """Build (once) the LengthModel of a span trace_at noted."""
    _, batch, new_tokens, attention, dtype = key
    with _MODELS_LOCK:
        _TRIED.add((key, span))
        at = _CENTRE.get((key, span))
    try:
        m = length_model(d, batch, new_tokens, attention, dtype, span[0], span[1], at=at)
    except ValueError:  # a length the model's code refuses: traces answer
        m = None
    with _MODELS_LOCK:
        _MODELS[key][span] = m
    return m
