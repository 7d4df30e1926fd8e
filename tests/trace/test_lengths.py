"""The length model (attnmem.trace.lengths): generate()'s trace at any prompt length from a
few traces, exact against a trace of its own between the fitted lengths, refused where the
program branches on the length, and the longest prompt it finds confirmed by traces."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attnmem.trace.generate import trace_inference  # noqa: E402
from attnmem.trace.lengths import length_model, longest_prompt  # noqa: E402


def _tiny(cls_name: str = "Olmo2Config", **extra) -> dict:
    cfg = getattr(transformers, cls_name)(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1000, pad_token_id=None, **extra)
    return {**cfg.to_dict(), "model_type": cfg.model_type}


# (flash on a model this small splits its keys over a count that changes with s, a branch:
# the model is refused there, as it should be; real widths have one split)
@pytest.mark.parametrize("attention,new", [("sdpa_cudnn", 1), ("eager", 5)])
def test_between_its_traces_the_model_is_the_trace(attention: str, new: int) -> None:
    d = _tiny()
    m = length_model(d, 2, new, attention, "bf16", 128, 1024)
    assert m is not None
    for s in (129, 333, 700, 1023):  # none of them fitted or checked
        got, want = m.peak(s), trace_inference(d, 2, s, new, attention=attention)
        assert (got.prefill_peak_bytes, got.decode_peak_bytes, got.kv_cache_bytes) == (
            want.prefill_peak_bytes, want.decode_peak_bytes, want.kv_cache_bytes)
    with pytest.raises(ValueError, match="covers 128 to 1024"):
        m.peak(2000)


def test_a_branch_on_the_length_gives_no_model() -> None:
    """A sliding window of 300 inside 128..1024: transformers passes a mask past it, so the
    traces are different programs and no polynomial is claimed."""
    d = _tiny("MistralConfig", sliding_window=300)
    assert length_model(d, 1, 1, "sdpa_cudnn", "bf16", 128, 1024) is None
    assert length_model(d, 1, 1, "sdpa_cudnn", "bf16", 400, 1024) is not None


def test_longest_prompt_is_confirmed_by_traces() -> None:
    d = _tiny()
    at = trace_inference(d, 1, 3000, 1, attention="eager").peak_bytes
    s, how = longest_prompt(d, 1, 1, "eager", "bf16", at, 1 << 20)
    assert trace_inference(d, 1, s, 1, attention="eager").peak_bytes <= at
    assert trace_inference(d, 1, s + 1, 1, attention="eager").peak_bytes > at
    assert s >= 3000 and "length model" in how
    assert longest_prompt(d, 1, 1, "eager", "bf16", 1000, 1 << 20)[0] == 0


def test_trace_at_answers_later_lengths_from_its_model() -> None:
    """The first length is a trace; the second near it builds a length model over half to
    twice the first (once) and answers from it; both equal traces of their own."""
    from attnmem.trace import lengths

    d = {**_tiny(), "num_hidden_layers": 1}
    first = lengths.trace_at(d, 1, 400, 3, attention="eager")
    assert first == trace_inference(d, 1, 400, 3, attention="eager")
    for s in (777, 250):
        later = lengths.trace_at(d, 1, s, 3, attention="eager")
        want = trace_inference(d, 1, s, 3, attention="eager")
        assert (later.peak_bytes, later.kv_cache_bytes, later.at_peak) == (
            want.peak_bytes, want.kv_cache_bytes, want.at_peak)
    (model,) = [m for key, ms in lengths._MODELS.items() if key[1:] == (1, 3, "eager", "bf16")
                for m in ms.values() if m is not None]
    assert (model.lo, model.hi) == (200, 800)
