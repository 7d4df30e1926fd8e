"""NaN-filled kernel buffers for the attention tests: a row or tile that no program writes
shows as NaN instead of passing on whatever memory held."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def poison_empty():
    """Every buffer the kernels allocate through `attnmem.kernels.flash.common.empty` is NaN-filled."""
    from attnmem.kernels.flash import common

    real = common.empty
    common.empty = lambda *a, **k: real(*a, **k).fill_(float("nan"))
    try:
        yield
    finally:
        common.empty = real
