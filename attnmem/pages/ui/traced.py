"""Models outside calc's rules, answered by the meta-device trace of transformers' own modules
(attnmem.trace.generate.trace_inference) on the Inference and "Will it fit?" pages (issue 42,
item 5). Pure: no Streamlit; torch and transformers are imported only by the trace itself.

- `Unruled`: a config.json whose model type calc has no rules for (`outside_rules`), with
  calc's refusal kept to show where the trace cannot answer;
- `missing`: why the trace cannot run here (torch or transformers not installed), or None;
- `inference`: one trace for the page's inputs -> `Answer` (the trace, or the reason it
  cannot answer: an input the trace does not run, NoKernel, ValueError);
- `longest_prompt`: the longest prompt that fits, searched over cached traces within
  SEARCH_BUDGET_S seconds of wall time (see its docstring for what is shown when the budget
  runs out);
- `parts`, `where_rows`, `counted_from`: the view's numbers and the "counted from" line.

Models within the rules keep the rules (the fast path); this module is never asked for them.
"""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from attnmem.calc import gpus_needed
from attnmem.calc.backends import NoKernel
from attnmem.calc.models import KNOWN_MODEL_TYPES
from attnmem.calc.units import MAX_SEQ_LEN
from attnmem.pages.ui.fit import TASK_LABELS, Verdict
from attnmem.trace.inference import TRACE_LOCK
from attnmem.trace.weights import TRACE_LIMITS, too_large  # noqa: F401  (the pages' names)

#: The attentions the trace runs (attnmem.trace.inference.TRACE_ATTENTIONS, repeated here so
#: that a page need not import the trace, i.e. torch, to draw its inputs).
TRACE_ATTENTIONS = ("eager", "sdpa", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
#: The model dtypes the trace builds the model in (weights and the KV cache alike).
TRACE_DTYPES = ("bf16", "fp16", "fp32")
#: Wall seconds the longest-prompt search may spend in traces (cached ones cost nothing).
SEARCH_BUDGET_S = 3.0
#: The label of every traced number (in help texts and captions), beside calc's "Computed".
TRACED = "Traced (meta-device run of transformers' own modules, not measured)"
#: How many entries of the moment of the peak the view lists.
TOP_AT_PEAK = 8


def rules_from(source: str = "attnmem.calc.inference_step") -> str:
    """The "counted from" line of an answer by calc's rules (the fast path)."""
    return (f"Counted from calc's hand-written rules for this model type ({source}), checked "
            "against measured H200 rows; not a trace.")


@dataclass(frozen=True)
class Unruled:
    """A config.json calc has no rules for; `text` is the dict as sorted JSON (hashable)."""

    text: str
    name: str
    model_type: str
    refusal: str  # calc's reason (ModelConfig.from_hf_config's ValueError)

    @property
    def config(self) -> dict:
        return json.loads(self.text)

    @classmethod
    def of(cls, d: dict, name: str, refusal: str) -> Unruled:
        return cls(json.dumps(d, sort_keys=True), name, _model_type(d), refusal)


def _model_type(d: dict) -> str:
    """The model type calc's rules would read: the nested text_config's, else the top one's."""
    inner = d.get("text_config")
    if isinstance(inner, dict) and isinstance(inner.get("model_type"), str):
        return inner["model_type"]
    top = d.get("model_type")
    return top if isinstance(top, str) else ""


def outside_rules(d: Any) -> bool:
    """Whether a config dict names a model type calc has no rules for (so that calc's refusal
    is the type's, not a wrong value in a type it models): those go to the trace."""
    if not isinstance(d, dict):
        return False
    t = _model_type(d)
    return bool(t) and t not in KNOWN_MODEL_TYPES


def missing() -> str | None:
    """Why the trace cannot run here, or None: it needs torch and transformers."""
    gone = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if not gone:
        return None
    return (f"{' and '.join(gone)} {'is' if len(gone) == 1 else 'are'} not installed here, so "
            "the meta-device trace of transformers' own modules, which answers models outside "
            "calc's rules, cannot run (pip install 'attention-memory[gpu]')")


@dataclass(frozen=True)
class Answer:
    """One trace for the page's inputs, or why there is none (`refused`)."""

    model: Unruled
    attention: str
    refused: str = ""
    traced: Any = None  # attnmem.trace.inference.TracedInference
    longest: Longest | None = None  # where `inference` was given the GPU's bytes
    notes: tuple[str, ...] = ()  # what the page should say beside the numbers


def unsupported(attention: str, dtype: str, kv_dtype: str | None = None,
                cache: str = "dynamic", prefill_chunk: int | None = None) -> list[str]:
    """The page inputs the trace does not run, each said in words (empty: all traceable)."""
    out = []
    if attention not in TRACE_ATTENTIONS:
        out.append(f"attention '{attention}': the trace runs transformers' eager attention and "
                   "SDPA (torch's choice or a forced FlashAttention-2 / memory-efficient / cuDNN "
                   "backend)")
    if dtype not in TRACE_DTYPES:
        out.append(f"weights '{dtype}': the trace builds the model in {', '.join(TRACE_DTYPES)}; "
                   "quantized or 8-bit weights are priced by calc's rules only")
    if kv_dtype is not None and kv_dtype != dtype:
        out.append(f"KV cache '{kv_dtype}' with {dtype} weights: transformers' dynamic cache "
                   "holds K and V in the model's dtype")
    if cache != "dynamic":
        out.append(f"a {cache} cache: the trace drives generate()'s dynamic cache only")
    if prefill_chunk:
        out.append("a chunked prefill: the trace feeds the whole prompt in one forward")
    return out


#: The trace's own lock (one trace at a time per process), for callers that run several
#: traces as one unit.
_LOCK = TRACE_LOCK


def _trace(model: Unruled, batch: int, prompt_len: int, new_tokens: int, attention: str,
           dtype: str):
    """The trace at these inputs (attnmem.trace.lengths.trace_at: a replay of a length model
    built in the background after the first trace near this length, else a trace; one at a
    time per process, under the trace's own lock)."""
    from attnmem.trace.lengths import trace_at

    return trace_at(model.config, batch, prompt_len, new_tokens, attention=attention,
                    dtype=dtype)


def inference(model: Unruled, batch: int, prompt_len: int, new_tokens: int,
              attention: str = "sdpa", dtype: str = "bf16", gpu_bytes: int | None = None,
              **kw: Any) -> Answer:
    """generate()'s peak for the inputs by the trace, and with `gpu_bytes` the longest prompt
    that fits (`longest_prompt`); kw: kv_dtype, cache, prefill_chunk (the Inference page's
    inputs the trace may not run: then `refused` says which and why)."""
    why = missing() or too_large(model.config)
    if why is None:
        bad = unsupported(attention, dtype, **kw)
        why = "the trace does not run " + "; ".join(bad) if bad else None
    if why is not None:
        return Answer(model, attention, refused=why)
    try:
        t = _trace(model, batch, prompt_len, new_tokens, attention, dtype)
    except ValueError as err:  # NoKernel is a ValueError too
        return Answer(model, attention, refused=str(err))
    except Exception as err:  # the model's own code failed on meta: said, never a traceback
        return Answer(model, attention, refused=(
            f"the trace failed in the model's code ({type(err).__name__}: "
            f"{' '.join(str(err).split())[:300]})"))
    longest = None
    if gpu_bytes is not None:
        longest = longest_prompt(model, gpu_bytes, batch, new_tokens, attention, dtype,
                                 prompt_len, SEARCH_BUDGET_S)
    return Answer(model, attention, traced=t, longest=longest, notes=quantized_note(model, dtype))


def quantized_note(model: Unruled, dtype: str) -> tuple[str, ...]:
    """A quantized checkpoint is built by the trace in `dtype` (transformers quantizes at load
    time, which the meta build does not run): its weights are counted at that width."""
    q = model.config.get("quantization_config")
    if not isinstance(q, dict):
        inner = model.config.get("text_config")
        q = inner.get("quantization_config") if isinstance(inner, dict) else None
    if not isinstance(q, dict):
        return ()
    method = str(q.get("quant_method", "quantized"))[:40]
    return (f"This checkpoint is stored quantized ({method}); the trace builds the model in "
            f"{dtype}, so its weights and peak are for {dtype} weights, not as stored.",)


@dataclass(frozen=True)
class Longest:
    """The longest prompt that fits by the trace: `exact` (the search finished: `fits` fits and
    `fits` + 1 does not, or `fits` is the longest the trace accepts), else the bracket the
    traces made so far give (`fits` fits, `fails` does not; 0 / None where none was found)."""

    fits: int
    fails: int | None
    exact: bool
    traces: int
    seconds: float
    note: str


@lru_cache(maxsize=64)
def longest_prompt(model: Unruled, gpu_bytes: int, batch: int, new_tokens: int,
                   attention: str, dtype: str, start: int,
                   budget_s: float | None = None) -> Longest:
    """The longest prompt with `new_tokens` generated after it whose traced peak fits
    `gpu_bytes`: doubling (or halving) from `start` (the page's prompt, already traced) to a
    bracket, then bisection to the integer, as attnmem.calc.max_inference_seq_len does over the
    rules. Each step is one trace (0.1-3 s, cached by its inputs); a step is begun only while
    the last one's time still fits in `budget_s` wall seconds (SEARCH_BUDGET_S by default).
    When the budget runs out the bracket found so far is returned (never an extrapolation):
    "fits at X, not at Y"; so is it when a trace fails for a reason other than NoKernel. A
    length a forced backend has no kernel for counts as not fitting, as calc's search counts
    it. Cached by its inputs, so a page re-run shows the same answer."""
    budget_s = SEARCH_BUDGET_S if budget_s is None else budget_s
    hi_limit = MAX_SEQ_LEN - new_tokens
    t0 = time.perf_counter()
    count = 0
    last = 0.0

    def fits(s: int) -> bool:
        nonlocal count, last
        t = time.perf_counter()
        try:
            ok = _trace(model, batch, s, new_tokens, attention, dtype).peak_bytes <= gpu_bytes
        except NoKernel:  # no kernel at this length: does not fit, as calc's search counts it
            ok = False
        except Exception as err:  # any other failure ends the search: no guess past it
            raise _Stopped(f"a trace failed at {s:,} tokens ({type(err).__name__})") from None
        count += 1
        last = time.perf_counter() - t
        return ok

    def time_left() -> bool:
        return time.perf_counter() - t0 + last <= budget_s

    def done(lo: int, hi: int | None, exact: bool, note: str) -> Longest:
        return Longest(lo, hi, exact, count, time.perf_counter() - t0, note)

    state = {"lo": 0, "hi": None}  # lo fits (0: none found yet), hi does not (None: none yet)
    try:
        return _search(fits, time_left, done, state, min(max(start, 1), hi_limit), hi_limit,
                       new_tokens)
    except _Stopped as stop:
        return done(state["lo"], state["hi"], False, str(stop))


class _Stopped(Exception):
    """A trace of the longest-prompt search failed for a reason other than NoKernel."""


def _search(fits, time_left, done, state: dict, s: int, hi_limit: int, new_tokens: int
            ) -> Longest:
    """longest_prompt's steps; `state` holds the bracket so far (for a stopped search)."""
    lo, hi = 0, None
    if fits(s):
        lo = state["lo"] = s
    else:
        hi = state["hi"] = s
    while hi is None and lo < hi_limit:  # double up to a length that does not fit
        if not time_left():
            return done(lo, None, False, "search stopped at its time budget while doubling")
        nxt = min(lo * 2, hi_limit)
        if fits(nxt):
            lo = state["lo"] = nxt
        else:
            hi = state["hi"] = nxt
    if hi is None:
        return done(lo, None, True, f"the longest prompt the trace accepts ({hi_limit:,} "
                                    f"tokens with {new_tokens:,} new) fits")
    while lo == 0 and hi > 1:  # halve down to a length that fits
        if not time_left():
            return done(0, hi, False, "search stopped at its time budget while halving")
        nxt = hi // 2
        if fits(nxt):
            lo = state["lo"] = nxt
        else:
            hi = state["hi"] = nxt
    if lo == 0:
        return done(0, 1, True, "not even a 1-token prompt fits")
    while hi - lo > 1:
        if not time_left():
            return done(lo, hi, False, "search stopped at its time budget while bisecting")
        mid = (lo + hi) // 2
        if fits(mid):
            lo = state["lo"] = mid
        else:
            hi = state["hi"] = mid
    return done(lo, hi, True, "exact integer search over traces")


def parts(t: Any) -> dict[str, int]:
    """The traced peak in parts (sum = peak): weights, cuBLAS workspace, the KV cache at the
    end of generate(), and the rest of the peak (inputs and transients; at a prefill peak it
    also holds the difference between the final cache and the cache then)."""
    return {"weights": t.weights_bytes, "cuBLAS workspace": t.fixed_bytes,
            "KV cache (after the last step)": t.kv_cache_bytes,
            "activations and inputs at the peak": t.activation_bytes}


def where_rows(t: Any, top: int = TOP_AT_PEAK) -> list[dict[str, Any]]:
    """The largest entries alive at the peak: module (dotted path in the model), op, tensors,
    bytes as the caching allocator's blocks."""
    rows = []
    for key, count, nbytes in t.at_peak[:top]:
        module, _, op = key.rpartition("|")
        rows.append({"module": module or "(generate's own tensors)", "op": op,
                     "tensors": count, "bytes": nbytes})
    return rows


def counted_from(t: Any) -> str:
    """The "counted from" line of a traced answer."""
    return (f"Counted from a meta-device trace of transformers' own modules ({t.model_class}, "
            f"transformers {t.transformers_version}): every storage the model's code makes and "
            "frees, replayed through the CUDA caching allocator's rules (attnmem.calc.allocator); "
            "fused SDPA backends and the cuBLAS workspace from calc's rules. Not calc's "
            "hand-written rules, which have none for this model type; not measured.")


#: The "Will it fit?" page's inference: transformers' default attention, then eager (as
#: attnmem.pages.ui.fit.INFER_ORDER tries them over the rules).
FIT_ORDER = ("sdpa", "eager")


def fit_verdict(model: Unruled, task: str, gpu_bytes: int, batch: int, prompt_len: int,
                new_tokens: int, dtype: str = "bf16") -> Verdict:
    """The "Will it fit?" answer for a model outside calc's rules: inference only, by the
    trace (SDPA, else eager where SDPA cannot build or run the model); other tasks, a
    refusal that says why. Fields as attnmem.pages.ui.fit.inference fills them."""
    src = "attnmem.trace.generate.trace_inference"
    if task != "inference":
        return Verdict(task, src, gpu_bytes, refused=(
            f"calc's rules do not cover model type '{model.model_type}', and the meta-device "
            f"trace that answers such models covers generate() only; choose the task "
            f"'{TASK_LABELS['inference']}'"))
    answers = [inference(model, batch, prompt_len, new_tokens, a, dtype, gpu_bytes=gpu_bytes)
               for a in FIT_ORDER[:1]]
    if answers[0].traced is None and not missing() and not unsupported("eager", dtype):
        answers.append(inference(model, batch, prompt_len, new_tokens, "eager", dtype,
                                 gpu_bytes=gpu_bytes))
    ans = answers[-1]
    if ans.traced is None:
        return Verdict(task, src, gpu_bytes, refused=" / ".join(
            dict.fromkeys(a.refused for a in answers)) + f". calc's rules: {model.refusal}")
    t, lg = ans.traced, ans.longest
    notes = list(ans.notes)
    if len(answers) > 1:
        notes.append(f"SDPA cannot be traced for this model ({answers[0].refused}): eager "
                     "attention is used instead.")
    longest, unknown = lg.fits, ""
    if not lg.exact:
        unknown = (f"fits at {lg.fits:,}" if lg.fits else "") + (
            f"{', not' if lg.fits else 'not'} at {lg.fails:,}" if lg.fails else "")
    nothing = ""
    if lg.exact and lg.fits == 0:
        nothing = ("the weights alone (with the 32 MiB cuBLAS workspace) exceed the GPU"
                   if t.weights_bytes + t.fixed_bytes >= gpu_bytes else
                   f"the weights fit, but not a 1-token prompt with batch {batch:,} and "
                   f"{new_tokens:,} new tokens")
    return Verdict(
        task, src, gpu_bytes, fits=t.peak_bytes <= gpu_bytes, peak_bytes=t.peak_bytes,
        limit_bytes=gpu_bytes, parts=parts(t), where=t.peak_phase, attention=ans.attention,
        longest=longest,
        longest_source=(f"a search over traces ({lg.traces} in {lg.seconds:.1f} s: {lg.note}; "
                        f"at most {SEARCH_BUDGET_S:g} s of tracing per input change)"),
        longest_at_bound=lg.exact and lg.fits >= MAX_SEQ_LEN - new_tokens,
        longest_unknown=unknown,
        gpus=gpus_needed(t.peak_bytes, gpu_bytes),
        gpus_how="attnmem.calc.gpus_needed: an ideal split of the traced peak (tensor parallel "
                 "without duplicated activations); a lower bound",
        nothing_fits=nothing, notes=tuple(notes), counted_from=counted_from(t),
        at_peak=tuple(where_rows(t)))
