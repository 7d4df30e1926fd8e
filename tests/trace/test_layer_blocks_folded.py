"""The layer shortcut (attnmem.trace.layer_blocks) on models whose first layer allocates unlike
the others and whose layers loop over the tokens (Mamba): the head grows by a period, folded
loops stay folded in the expanded stream, and the result equals the full trace; and the meta
`torch.stack` fast path (attnmem.trace.recorder) gives the meta kernel's tensor."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attnmem.trace import inference, layer_blocks  # noqa: E402
from attnmem.trace.recorder import _meta_stack, flat, replay  # noqa: E402


def _mamba(layers: int, **kw) -> dict:
    c = transformers.MambaConfig(hidden_size=32, state_size=8, num_hidden_layers=layers,
                                 vocab_size=101, **kw)
    return {**c.to_dict(), "architectures": ["MambaForCausalLM"]}


@pytest.mark.parametrize("b, s, n", [(1, 100, 2), (2, 70, 3)])
def test_mamba_shortcut_grows_its_head_and_equals_the_full_trace(b, s, n):
    """Mamba's layer casts its input to the norm's dtype and its residual to fp32: layer 0
    (bf16 embeddings in) copies the residual, later layers (fp32 in) the input, so with a
    one-layer head the layer before the block allocates unlike the block. The plan takes a
    two-layer head; the scan's folded loops (100 and 70 steps) stay repeat events; events,
    cache and the replay's peaks equal the 9-layer model traced whole."""
    text = json.dumps(_mamba(9, layer_norm_epsilon=1e-5 * s), sort_keys=True)  # own plan
    first = layer_blocks.plan_for(text, "eager", "bf16")
    assert first is not None and (first.head, first.period, first.grown) == (1, 1, 0)
    got = layer_blocks.record(text, b, s, n, "eager", "bf16")
    pl = layer_blocks.plan_for(text, "eager", "bf16")
    assert pl is not None and (pl.head, pl.period, pl.grown) == (2, 1, 1)
    want = inference.record(text, b, s, n, "eager", "bf16")
    repeats = [ev for ev in got.events if ev[0] == "r"]
    assert len(repeats) == len([ev for ev in want.events if ev[0] == "r"])
    assert repeats and len(repeats) % 9 == 0  # one a layer in each forward over the prompt
    assert got.events == layer_blocks.canonical(want.events)
    assert tuple(flat(got.events)) == layer_blocks.canonical(tuple(flat(want.events)))
    assert got.cache_bytes == want.cache_bytes == layer_blocks.cache_bytes(want.events)
    p_got, p_want = replay(got.events), replay(want.events)
    assert {k: (v.peak, v.start, v.at_peak) for k, v in p_got.items()} == {
        k: (v.peak, v.start, v.at_peak) for k, v in p_want.items()}


def test_a_head_grown_too_often_is_refused(monkeypatch):
    """With no growth allowed, the one-layer head's mismatch refuses the shortcut (the full
    model answers) and says which layers differ."""
    monkeypatch.setattr(layer_blocks, "MAX_GROWN", 0)
    text = json.dumps(_mamba(8, layer_norm_epsilon=2e-5), sort_keys=True)
    got = layer_blocks.record(text, 1, 20, 1, "eager", "bf16")
    why = layer_blocks.plan(text, "bf16", "eager")
    assert isinstance(why, str) and "layers 0 and 1 allocate differently" in why
    assert got.events == inference.record(text, 1, 20, 1, "eager", "bf16").events


def test_folded_cache_and_numbering_equal_the_unrolled_stream():
    """cache_ids/cache_bytes and canonical read repeat events without unrolling them: the same
    as on the unrolled stream, where a repeat's kept outputs are freed outside it, its last
    iteration's carried tensor stays, and its first iteration frees what came before it."""
    tmpl = (("a", 512, "m|mul"), ("f", "prev", 1), ("a", 1024, "m|add"), ("f", "this", 0),
            ("a", 2048, "m|bmm"))
    events = (("a", 5, 100, "m|x"), ("a", 6, 200, "m|y"), ("a", 7, 300, "|ids"),
              ("r", tmpl, 4, 10, (5, 6, 9)), ("f", 12), ("f", 15), ("a", 30, 64, "m|z"),
              ("f", 5), ("f", 18))
    unrolled = tuple(flat(events))
    freed = {ev[1] for ev in unrolled if ev[0] == "f"}
    want = {ev[1] for ev in unrolled if ev[0] == "a" and ev[1] not in freed
            and not ev[3].startswith("|")}
    assert layer_blocks.cache_ids(events) == want == {20, 21, 30}
    assert layer_blocks.cache_bytes(events) == 1024 + 2048 + 64
    assert tuple(flat(layer_blocks.canonical(events))) == layer_blocks.canonical(unrolled)


@pytest.mark.parametrize("shape", [(3, 5), (1, 7), (2, 1, 4), (), (6,)])
def test_meta_stack_fast_path_is_the_meta_kernel(shape):
    for dim in range(-len(shape) - 1, len(shape) + 1):
        ts = [torch.empty(shape, device="meta", dtype=torch.bfloat16) for _ in range(70)]
        want = torch.stack(ts, dim)
        got = _meta_stack(torch, torch.ops.aten.stack.default, (ts, dim), {})
        assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
    few = [torch.empty(shape, device="meta") for _ in range(3)]
    assert _meta_stack(torch, torch.ops.aten.stack.default, (few, 0), {}) is None
    mixed = [torch.empty((2, 3), device="meta").t()] * 70  # not contiguous: the kernel's
    assert _meta_stack(torch, torch.ops.aten.stack.default, (mixed, 0), {}) is None
