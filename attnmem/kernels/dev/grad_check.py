"""The correctness rule of the kernel probes' GPU checks (attnmem.kernels.dev.ab_bwd,
attnmem.kernels.dev.bwd_sm90_check, and its floor in attnmem.kernels.dev.ab_fwd): a kernel's
gradient passes where its max |error| against the fp32 eager reference is at most twice plain
PyTorch's low-precision error plus ``FLOOR`` (the rule of tests/kernels/test_flash_attention.py),
on ``CHECK_SHAPES``.
"""

from __future__ import annotations

import torch

CHECK_SHAPES = [
    # B, H, H_kv, s, d, causal, dtype
    (1, 4, 4, 1000, 128, False, torch.bfloat16),
    (1, 4, 4, 1000, 128, True, torch.float16),
    (2, 8, 2, 780, 128, True, torch.bfloat16),  # GQA 4:1, ragged (s % 4 = 0: `usable`)
    (1, 4, 4, 1536, 64, False, torch.float16),
    (1, 8, 2, 1028, 64, True, torch.bfloat16),  # GQA 4:1, ragged
    (1, 4, 4, 4096, 128, True, torch.bfloat16),
    (1, 4, 4, 4096, 64, True, torch.float16),
]
FLOOR = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def reference_grads(q, k, v, do, causal, scale):
    """Gradients of the eager reference, in the inputs' dtype."""
    from attnmem.kernels.flash.reference import attention_reference

    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = attention_reference(q, k, v, causal, scale)
    return torch.autograd.grad(o, (q, k, v), do)
