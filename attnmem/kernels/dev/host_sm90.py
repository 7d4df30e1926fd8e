# Measured: host microseconds per short forward call, Gluon vs Triton path (H200).
"""Host microseconds per forward call on a tiny shape, by path (the GPU work is ~5 us):

    python -m attnmem.kernels.dev.host_sm90
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnmem.kernels.flash import fwd_sm90 as k90
from attnmem.kernels.flash.api import flash_attention
from attnmem.kernels.flash.config import SETTINGS, KernelConfig
from attnmem.measure.bench.speed import host_us_per_call


def per_call(fn, n=2000):
    return host_us_per_call(fn, n, warmup=50)


q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
print("sm90 via flash_attention  ", round(per_call(lambda: flash_attention(q, k, v)), 1))
print("generic via flash_attention", round(per_call(
    lambda: flash_attention(q, k, v, config=KernelConfig(sm90=False))), 1))
print("sm90 forward only          ", round(per_call(
    lambda: k90.attention_forward_sm90(q, k, v, False, 0.18)), 1))
SETTINGS.direct_launch = False
print("sm90 forward, JIT dispatch ", round(per_call(
    lambda: k90.attention_forward_sm90(q, k, v, False, 0.18)), 1))
SETTINGS.direct_launch = True
print("descriptors x4             ", round(per_call(
    lambda: [k90._descriptor(q, 64, k90._layout(q.dtype, 64, 64)) for _ in range(4)]), 1))
print("torch.empty x2             ", round(per_call(
    lambda: (torch.empty((1, 2, 128, 64), dtype=q.dtype, device=q.device),
             torch.empty((1, 2, 128), dtype=torch.float32, device=q.device))), 1))
print("usable                     ", round(per_call(lambda: k90.usable(q, k, v)), 1))
print("sdpa cudnn                 ", end=" ")
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    print(round(per_call(lambda: F.scaled_dot_product_attention(q, k, v)), 1))
