"""Why a test of the Hopper (sm_90) Gluon kernels cannot run on this machine's GPU, or None."""

from __future__ import annotations


def hopper_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if torch.cuda.get_device_capability()[0] != 9:
        return f"compute capability {torch.cuda.get_device_capability()} is not 9.x"
    return None
