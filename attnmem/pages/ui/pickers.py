"""The model and GPU pickers the pages share. Streamlit widgets.

`gpu_options` orders the GPUs of a GPU spec by memory.
"""

from __future__ import annotations

from collections.abc import Mapping


def gpu_options(gpus: Mapping[str, int]) -> tuple[str, ...]:
    """GPU names ordered by memory size."""
    return tuple(sorted(gpus, key=lambda name: (gpus[name], name)))
