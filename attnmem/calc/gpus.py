"""GPU memory capacities: the spec-sheet figure and the total the driver reports to torch.

`GPUS` holds the total device memory as the NVIDIA driver reports it in nvidia-smi's "MiB"
column where we know that figure, and the vendor's nominal capacity in binary units otherwise
(sources: vendor datasheets for NVIDIA A100, H100, H200, B200, L4, L40S, GeForce RTX
3090/4090/5090 and AMD Instinct MI300X/MI325X; for the H200, nvidia-smi on our own measurement
machine, 143,771 MiB, 2026-11). These are the figures the pages have always shown; they stay.

`GPU_TORCH_TOTAL` is the memory torch sees: `torch.cuda.mem_get_info()[1]` (= the
total_memory of torch.cuda.get_device_properties), which the driver reports a few hundred MiB
below nvidia-smi's total (memory it reserves for itself). vLLM multiplies this figure by
gpu_memory_utilization (vllm/v1/worker/gpu_worker.py requests torch.cuda.mem_get_info), so it
is what attnmem.calc.serving_capacity uses for a GPU name. Each figure is PyTorch's own out-of-memory
message, "GPU 0 has a total capacity of X GiB" (c10/cuda/CUDACachingAllocator.cpp prints the
cudaMemGetInfo total), as quoted in the public report named in GPU_TORCH_TOTAL_SOURCES; it is
printed to 0.01 GiB, so each figure is good to +-5 MiB, and it varies slightly with the driver
(H100 80GB HBM3 reports between 79.11 and 79.21 GiB across drivers). None: no sourced figure,
the table says so and the spec-sheet figure is used.

The H200's figure is measured, in bytes: `torch.cuda.mem_get_info()` on our H200 returned a
total of 150,109,880,320 bytes (139.801 GiB) in the lead's H200 run of 2026-12-01 (torch
2.11.0+cu130, driver 580.159.04: the torch and driver that machine's rows of that day record in
data/inference_steps_h200.csv and data/training_steps_h200.csv), 615 MiB below nvidia-smi's
143,771 MiB. It replaces the figure read off public 8xH200 logs (139.80 GiB), which it agrees
with to 0.01 GiB.

Pages (Model memory, Serving, Inference, Training) answer "fits" and size the serving budget
with `torch_total_bytes` and show the spec figure beside it (`torch_total_note` says which
figure is used and where it comes from).
"""

from __future__ import annotations

from decimal import Decimal

MIB = 2**20
GIB = 2**30

#: name -> memory in bytes (spec sheet / nvidia-smi total, see the module docstring).
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


def _gib(text: str) -> int:
    return int(Decimal(text) * GIB)


#: name -> (figure, source); None where no figure is sourced. The figure is either a string,
#: GiB as PyTorch's out-of-memory message prints it (+-5 MiB), with the public report that
#: printed it, or an int, bytes measured with torch.cuda.mem_get_info() on our own machine.
GPU_TORCH_TOTAL_SOURCES: dict[str, tuple[str | int, str] | None] = {
    "NVIDIA T4 16GB": ("14.75", "github.com/hpcaitech/Open-Sora issue 697 (Colab T4)"),
    "NVIDIA L4 24GB": None,
    "NVIDIA A10 24GB": None,
    "NVIDIA RTX 3090 24GB": None,
    "NVIDIA RTX 4090 24GB": ("23.64", "github.com/3DTopia/Phidias-Diffusion issue 8 (RTX 4090)"),
    "NVIDIA RTX 5090 32GB": None,
    "NVIDIA V100 32GB": None,
    "NVIDIA A100 40GB": ("39.50", "github.com/TianheWu/CoSeR issue 10 (one A100 40GB)"),
    "NVIDIA L40S 48GB": None,
    "NVIDIA A100 80GB": ("79.25", "github.com/levihsu/OOTDiffusion issue 235 (A100 80GB)"),
    "NVIDIA H100 80GB": ("79.11", "github.com/vllm-project/vllm issue 27508 (gpt-oss-120b on "
                                  "H100)"),
    "NVIDIA H100 NVL 94GB": ("93.00", "github.com/ali-vilab/VACE issue 56 (H100 NVL 94GB)"),
    "NVIDIA H200 141GB": (150_109_880_320, "measured: torch.cuda.mem_get_info() total on our "
                                           "H200, the lead's run of 2026-12-01 (torch "
                                           "2.11.0+cu130, driver 580.159.04)"),
    "NVIDIA B200 180GB": ("178.36", "PyTorch OOM messages of 8xB200 training runs in public "
                                    "logs"),
    "AMD MI300X 192GB": None,
    "AMD MI325X 256GB": None,
}

#: name -> bytes torch reports as the device total (None: not sourced, see the sources table).
GPU_TORCH_TOTAL: dict[str, int | None] = {
    name: None if src is None else src[0] if isinstance(src[0], int) else _gib(src[0])
    for name, src in GPU_TORCH_TOTAL_SOURCES.items()
}

#: GPUs whose torch total was measured on our own machine (an int in the sources table).
GPU_TORCH_TOTAL_MEASURED: frozenset[str] = frozenset(
    name for name, src in GPU_TORCH_TOTAL_SOURCES.items()
    if src is not None and isinstance(src[0], int))


def torch_total_bytes(name: str) -> int:
    """The device total torch reports for a GPU of GPUS, where sourced; else its GPUS figure
    (the spec sheet; the table GPU_TORCH_TOTAL_SOURCES says which). ValueError for a name that
    is not in GPUS, listing them."""
    if not isinstance(name, str) or name not in GPUS:
        raise ValueError(f"GPU {str(name)[:60]!r} is not one of: {', '.join(GPUS)}")
    total = GPU_TORCH_TOTAL[name]
    return GPUS[name] if total is None else total


def torch_total_note(name: str) -> str:
    """One sentence for pages: which figure "fits" uses for this GPU and where it comes from
    (measured on our machine, a PyTorch message in a public report, or the spec sheet where no
    torch figure is sourced). ValueError for a name that is not in GPUS."""
    torch_total_bytes(name)  # validates the name
    src = GPU_TORCH_TOTAL_SOURCES[name]
    if src is None:
        return ("no torch total is sourced for this GPU, so the spec-sheet figure is used "
                "(torch sees a few hundred MiB less: the driver keeps some)")
    if name in GPU_TORCH_TOTAL_MEASURED:
        return f"the total torch can use, {src[1]}"
    return (f"the total torch can use, as PyTorch's out-of-memory message printed it "
            f"({src[0]} GiB, {src[1]})")
