"""GPU memory capacities.

Values are the total device memory as the NVIDIA driver reports it (nvidia-smi's "MiB" column,
which is also torch.cuda.get_device_properties().total_memory) where we know that figure, and
the vendor's nominal capacity in binary units otherwise. A program can use a little less than
this (the CUDA context takes a few hundred MiB). Sources: vendor datasheets (NVIDIA A100, H100,
H200, B200, L4, L40S, GeForce RTX 3090/4090/5090; AMD Instinct MI300X/MI325X) and, for the H200,
nvidia-smi on our own measurement machine (143,771 MiB, 2026-11).
"""

from __future__ import annotations

MIB = 2**20
GIB = 2**30

#: name -> memory in bytes.
GPUS: dict[str, int] = {
    "NVIDIA T4 16GB": 15_360 * MIB,
    "NVIDIA L4 24GB": 23_034 * MIB,
    "NVIDIA A10 24GB": 23_028 * MIB,
    "NVIDIA RTX 3090 24GB": 24_576 * MIB,
    "NVIDIA RTX 4090 24GB": 24_564 * MIB,
    "NVIDIA RTX 5090 32GB": 32 * GIB,
    "NVIDIA V100 32GB": 32 * GIB,
    "NVIDIA A100 40GB": 40_960 * MIB,
    "NVIDIA L40S 48GB": 46_068 * MIB,
    "NVIDIA A100 80GB": 81_920 * MIB,
    "NVIDIA H100 80GB": 81_559 * MIB,
    "NVIDIA H100 NVL 94GB": 95_830 * MIB,
    "NVIDIA H200 141GB": 143_771 * MIB,
    "NVIDIA B200 180GB": 180 * GIB,
    "AMD MI300X 192GB": 192 * GIB,
    "AMD MI325X 256GB": 256 * GIB,
}

DEFAULT_GPU = "NVIDIA H100 80GB"
