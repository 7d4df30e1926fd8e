"""attnmem.trace.known: reductions over the keys of a mask made from aranges are computed over
blocks of query rows, exactly as the whole tensor gives them, with no (s, s) value held."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import attnmem.trace.known as known  # noqa: E402
from attnmem.trace.recorder import Recorder  # noqa: E402


def _reads(device: str, s: int, window: int) -> list:
    """What a model reads of a (B, 1, s, s) mask built as masking_utils builds it (aranges,
    broadcast comparisons, expand), with padding on the left of row 1, through the views and
    reductions the blockwise path follows: Kolibri's first/last visible key and `any`, and
    others (transpose, permute, squeeze, where, amax, argmin, all, a nested reduction)."""
    q = torch.arange(s, device=device)
    kv = torch.arange(s, device=device) + 0
    pad = torch.arange(2, device=device)[:, None] * 3 <= torch.arange(s, device=device)
    causal = kv[None, None, None, :] <= q[None, None, :, None]
    near = kv[None, None, None, :] > q[None, None, :, None] - window
    mask = (causal & near & pad[:, None, None, :]).expand(2, -1, s, s)
    visible = mask[:, 0]
    starts = visible.int().argmax(-1)
    ends = visible.shape[-1] - visible.flip(-1).int().argmax(-1)
    lengths = (ends - starts) * visible.any(-1)
    t = visible.transpose(1, 2)
    p = mask.permute(0, 2, 3, 1).squeeze(-1)
    w = torch.where(visible, q[None, None, :], -1)
    return [starts.tolist(), ends.tolist(), lengths.tolist(),
            t.int().argmin(1, keepdim=True).tolist(), p.all(-1).tolist(),
            w.amax(-1).tolist(), (w.amax(-1, keepdim=True) > 4).any(-1).tolist(),
            visible.flip(1).int().argmax(-1).tolist()]


@pytest.mark.parametrize("s, window", [(37, 5), (64, 64), (9, 1)])
def test_blockwise_reductions_equal_the_whole_mask_and_a_cpu_run(monkeypatch, s, window):
    cpu = _reads("cpu", s, window)
    with Recorder(values=True):
        whole = _reads("meta", s, window)
    assert whole == cpu
    # blocks of a few rows; the whole (2, s, s) int32 mask would be refused
    monkeypatch.setattr(known, "BLOCK_BYTES", 3 * 4 * s)
    monkeypatch.setattr(known, "MAX_BYTES", 2 * s * s - 1)
    with Recorder(values=True):
        assert _reads("meta", s, window) == cpu
    # without blocks the same reads are refused: the path above did not hold the mask
    monkeypatch.setattr(known, "BLOCK_BYTES", 1 << 40)
    with Recorder(values=True), pytest.raises(known.ValuesTooLarge):
        _reads("meta", s, window)


def test_a_value_read_whole_is_still_refused_past_the_limit(monkeypatch):
    """Blocks serve reductions only: reading the mask itself still needs all of it."""
    monkeypatch.setattr(known, "BLOCK_BYTES", 16)
    monkeypatch.setattr(known, "MAX_BYTES", 30 * 30 - 1)
    with Recorder(values=True):
        q = torch.arange(30, device="meta")
        mask = q[None, :] <= q[:, None]
        assert mask.int().argmax(-1).tolist() == [0] * 30
        with pytest.raises(known.ValuesTooLarge, match="900 bytes"):
            mask.tolist()
        with pytest.raises(known.ValuesTooLarge, match="3,600 bytes"):
            mask.int().argmax().item()  # over every dim: no dim is kept to split


def test_kolibri_traced_blockwise_equals_its_trace_with_the_whole_mask(monkeypatch):
    """Kolibri-1.1's indexer reads its first/last visible keys and `any` of the causal mask
    (tests/trace/test_refused_tail.py checks those reads against a real CPU run). At 60
    tokens both ways run: blocks of one row, with the whole (B, s, s) int32 mask refused,
    give the same events, event for event, as the whole mask."""
    import json

    from attnmem.trace.inference import record
    from attnmem.trace.recorder import flat
    from tests.trace.test_refused_tail import _kolibri, _normal

    d = _kolibri().to_dict()
    d["architectures"] = ["Kolibri1_1ForCausalLM"]
    text = json.dumps(d, sort_keys=True)
    whole = record(text, 2, 60, 2, "eager", "bf16")
    monkeypatch.setattr(known, "BLOCK_BYTES", 8)
    monkeypatch.setattr(known, "MAX_BYTES", 2 * 60 * 60 - 1)
    blocks = record(text, 2, 60, 2, "eager", "bf16")
    assert len(list(flat(blocks.events))) > 1000
    assert _normal(blocks.events) == _normal(whole.events)
    assert blocks.cache_bytes == whole.cache_bytes
    monkeypatch.setattr(known, "BLOCK_BYTES", 1 << 40)  # the same limit, no blocks: refused
    with pytest.raises(ValueError, match="reads values computed from a tensor"):
        record(text, 2, 60, 2, "eager", "bf16")
