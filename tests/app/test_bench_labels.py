"""Every series the speed benchmark can write (attnmem.measure.bench.speed.IMPLS) has its own label and
colour on the Kernel speed page (attnmem/pages/ui/labels.py), no two the same: a new variant would
otherwise show as its raw name in the fallback grey."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")


def test_every_bench_series_has_a_label_and_a_colour() -> None:
    from attnmem.measure.bench.speed import IMPLS
    from attnmem.pages.ui.labels import IMPL_COLORS, IMPL_LABELS

    missing = [n for n in IMPLS if n not in IMPL_LABELS or n not in IMPL_COLORS]
    assert not missing, missing
    colours = [IMPL_COLORS[n] for n in IMPLS]
    assert len(set(colours)) == len(colours)
    labels = [IMPL_LABELS[n] for n in IMPLS]
    assert len(set(labels)) == len(labels)
