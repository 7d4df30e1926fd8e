"""What transformers' mask code would read from values that meta tensors do not hold."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def unpacked_rows() -> Iterator[None]:
    """Rows are whole sequences (position ids 0..s-1): masking_utils' check for packed rows
    (`find_packed_sequence_indices`, which reads the position ids' values, and so cannot run
    on meta) answers None, as it does for such rows on the GPU. Every trace runs whole rows
    (a prompt per row for generate(), one sequence per row for a training step or vLLM's
    profile run). Its few (B, s) temporaries are not counted."""
    from transformers import masking_utils

    real = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = real
