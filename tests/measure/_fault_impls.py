"""Fault-injecting implementations for tests/measure/test_faults.py, run inside the measurement child
(``run_points(..., impl_module="tests.measure._fault_impls")``).

Every real implementation name is served by one fake whose behaviour depends on the sequence
length, so the page and the store see ordinary names (colours, labels, predictions work):

    s = 256   ok                         s = 1024  hangs (sleeps past any time limit)
    s = 512   the process is SIGKILLed   s = 2048  CUDA out of memory (simulated)
    anything else: ok

Killing itself with SIGKILL is indistinguishable, for the parent, from being killed by the
kernel's OOM killer or by a user: the pipe closes and the exit status is -9.
"""

from __future__ import annotations

import os
import signal
import time

import torch

from attnmem.measure import registry
from attnmem.measure.harness import CpuDevice

KILLED_AT = 512
HANG_AT = 1024
OOM_AT = 2048


def _fake(q, k, v, causal=False, scale=None):
    s = q.shape[-2]
    if s == KILLED_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    if s == HANG_AT:
        time.sleep(600)
    if s == OOM_AT:
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 96.00 GiB (simulated by tests/_fault_impls)")
    return q * 1.0


def get_implementation(name: str):
    return registry.Implementation(name, name, _fake)


def make_device():
    return CpuDevice()
