"""Fixtures of the flash-attention tests (test_flash_attention.py, test_flash_attention_gpu.py;
their shared harness is _flash_check.py): ``fa``, the kernel's API module, and ``poisoned``,
every buffer the kernels allocate NaN-filled for the test. A test file's own fixture of the
same name wins (test_sliding_window.py has its own ``fa``)."""

from __future__ import annotations

import importlib

import pytest


@pytest.fixture(scope="module")
def fa():
    """attnmem.kernels.flash.api, imported in this process (compiled kernels; no driver call)."""
    return importlib.import_module("attnmem.kernels.flash.api")


@pytest.fixture
def poisoned():
    from _flash_check import poison_empty

    with poison_empty():
        yield
