"""Packed-sequence mask requests in both structures transformers builds: 5.17's
and_masks(causal [+ window], packed ids) and later 5.x's and_masks(remap_positions(causal
[+ window]), packed ids). Both must come back as the kernel's `PackedSequences` (cu_seqlens
of the runs of equal ids), never as a materialised mask our kernel refuses. The 5.17 form was
found on the H200 (transformers 5.17): every packed training row got a (1, 1, T, T) mask."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
mu = pytest.importorskip("transformers.masking_utils")

IDS = torch.tensor([[0] * 5 + [1] * 3 + [2] * 4])  # sequences of 5, 3, 4 tokens
T = IDS.shape[1]


def _request(mask_function, local_size=None):
    from attnmem.kernels.hf.attention import _mask_function

    return _mask_function(batch_size=1, q_length=T, kv_length=T, q_offset=0, kv_offset=0,
                          mask_function=mask_function, attention_mask=None,
                          allow_is_causal_skip=False, dtype=torch.float32, config=None,
                          use_vmap=False, device=torch.device("cpu"), local_size=local_size)


def _forms(base):
    forms = {"5.17": mu.and_masks(base, mu.packed_sequence_mask_function(IDS))}
    remap = getattr(mu, "remap_positions_for_packed_sequence", None)
    if remap is not None:  # later 5.x
        forms["5.2x"] = mu.and_masks(remap(base, IDS), mu.packed_sequence_mask_function(IDS))
    return forms


@pytest.mark.parametrize("window", [None, 3])
def test_packed_requests_of_either_structure_become_cu_seqlens(window):
    from attnmem.kernels.hf.attention import PackedSequences

    base = (mu.causal_mask_function if window is None
            else mu.sliding_window_causal_mask_function(window))
    for name, fn in _forms(base).items():
        got = _request(fn, local_size=window)
        assert isinstance(got, PackedSequences), (name, type(got))
        assert got.cu_seqlens.tolist() == [0, 5, 8, 12], name
        assert got.window == window, name


def test_a_packed_request_with_something_added_is_materialised():
    """An extra and-mask (here: keys before 10 only) is not the plain packed mask: the request
    falls through to SDPA's mask, which the kernel then refuses with the reason."""
    from attnmem.kernels.hf.attention import PackedSequences

    extra = mu.and_masks(mu.causal_mask_function, lambda b, h, q, k: k < 10)
    got = _request(mu.and_masks(extra, mu.packed_sequence_mask_function(IDS)))
    assert not isinstance(got, PackedSequences)
