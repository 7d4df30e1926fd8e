"""Shared pytest set-up: the `gpu` marker skips with a stated reason where CUDA is absent."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


def _cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any("gpu" in item.keywords for item in items):
        return
    reason = _cuda_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test skipped: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Shared helpers for the tests in the layer folders (``from _robust import ...``).
sys.path.insert(0, str(Path(__file__).resolve().parent))
