"""generate()'s peak of any causal LM, traced: `trace_inference`, the entry the CLI, the pages
and the harness's predictions call. It answers from the layer shortcut
(attnmem.trace.layer_blocks: a few layers traced, the full depth built and checked event for
event) where that holds, else from a trace of the whole model (attnmem.trace.inference.record),
and replays the events through the caching allocator (attnmem.trace.inference.result).

Its own module so that the shortcut, which runs the full recorder, and the recorder's module
import each other in one direction only.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache

from attnmem.calc.units import MAX_BATCH, MAX_SEQ_LEN, check_int
from attnmem.trace import layer_blocks
from attnmem.trace.inference import TRACE_ATTENTIONS, TracedInference, _torch_dtype, result


def trace_inference(d: dict, batch: int, prompt_len: int, new_tokens: int = 1,
                    attention: str = "sdpa", dtype: str = "bf16") -> TracedInference:
    """generate()'s peak for the causal LM that config dict `d` describes (see
    attnmem.trace.inference's module docstring); ValueError names a bad input or why
    transformers cannot build the model, and attnmem.calc.backends.NoKernel why a forced SDPA
    backend has no kernel for a call."""
    b = check_int("batch", batch, 1, MAX_BATCH)
    s = check_int("prompt_len", prompt_len, 1, MAX_SEQ_LEN)
    n = check_int("new_tokens", new_tokens, 1, MAX_SEQ_LEN - s)
    if attention not in TRACE_ATTENTIONS:
        raise ValueError(f"attention {attention!r}: the trace runs {TRACE_ATTENTIONS}")
    _torch_dtype(dtype)
    return _trace(json.dumps(d, sort_keys=True), b, s, n, attention, dtype)


@lru_cache(maxsize=256)
def _trace(text: str, b: int, s: int, n: int, attention: str, dtype: str) -> TracedInference:
    t0 = time.perf_counter()
    rec = layer_blocks.record(text, b, s, n, attention, dtype)
    return result(rec, b, s, n, attention, dtype, time.perf_counter() - t0)
