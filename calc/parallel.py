"""Parallel layouts of a training step: what each GPU holds under data, ZeRO/FSDP and tensor
parallelism.

N GPUs = tp × dp: tensor parallelism of degree t (Megatron-LM, Shoeybi et al. 2019, arXiv
1909.08053, sec. 3: q/k/v and gate/up split by output columns, o and down by input rows, so
heads and MLP columns divide by t; the vocabulary too, embedding and lm_head vocab-parallel;
norms replicated) inside dp data-parallel replicas.

Sharding over the dp replicas (ZeRO, Rajbhandari et al. 2019, arXiv 1910.02054, sec. 5, with
Ψ parameters and K bytes of optimizer state per parameter: stage 1 keeps (2 + 2 + K/N_d)·Ψ,
stage 2 (2 + (2 + K)/N_d)·Ψ, stage 3 (2 + 2 + K)·Ψ/N_d; here the 2s are the bytes of the
parameter and gradient dtypes of the chosen precision, not always 2):
- "none": every replica holds everything. With dp > 1 that is DistributedDataParallel, whose
  gradient buckets (bucket_cap_mb = 25 each) together cover every gradient and, with the
  default gradient_as_bucket_view=False, are a second copy of them, allocated once and kept
  (torch.nn.parallel.DistributedDataParallel docs: gradient_as_bucket_view "can reduce peak
  memory usage, where the saved memory size will be equal to the total gradients size").
- "zero1": optimizer state sharded (torch ZeroRedundancyOptimizer / DeepSpeed stage 1); the
  gradients are still all-reduced through DDP's buckets (kept, as above).
- "zero2": gradients sharded too; gradients are reduce-scattered through a bucket of
  DeepSpeed's reduce_bucket_size, 5e8 elements by default (DeepSpeed config docs,
  zero_optimization.reduce_bucket_size), or all of them when fewer.
- "zero3" / "fsdp": parameters sharded too. During the step, FSDP (torch.distributed.fsdp
  fully_shard per decoder layer plus the root module) all-gathers one layer's parameters and
  prefetches the next (2 layers unsharded), keeps the root's (embeddings, lm_head, final norm)
  unsharded from its forward to its backward (fully_shard docs, reshard_after_forward: "The
  root FSDP state has its value specially set to False as a heuristic since its parameters
  would typically be immediately all-gathered for backward"), and reduce-scatters one layer's
  unsharded gradients. Those are the step buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from calc.models import ModelConfig
from calc.params import param_breakdown
from calc.units import ceil_bytes, check_int

SHARDINGS: tuple[str, ...] = ("none", "zero1", "zero2", "zero3", "fsdp")
SHARDING_LABELS: dict[str, str] = {
    "none": "none (DDP replicas)",
    "zero1": "ZeRO-1 (optimizer state)",
    "zero2": "ZeRO-2 (+ gradients)",
    "zero3": "ZeRO-3 (+ parameters)",
    "fsdp": "FSDP (fully_shard)",
}
MAX_GPUS = 1 << 20
#: DeepSpeed's default reduce_bucket_size (elements).
ZERO_REDUCE_BUCKET = 500_000_000


@dataclass(frozen=True)
class Layout:
    gpus: int  # N
    tp: int  # t
    sharding: str

    @property
    def dp(self) -> int:
        return self.gpus // self.tp


def make_layout(model: ModelConfig, gpus: int, tp: int, sharding: str) -> Layout:
    """A validated layout: tp divides gpus, the query heads and the MLP width; the key/value
    heads divide by tp or tp by them (replicated KV heads, as Megatron does)."""
    n = check_int("gpus", gpus, 1, MAX_GPUS)
    t = check_int("tp", tp, 1, n)
    if n % t:
        raise ValueError(f"gpus ({n}) must be a multiple of the tensor-parallel degree tp ({t})")
    if sharding not in SHARDINGS:
        raise ValueError(f"unknown sharding {sharding!r}; accepted: {', '.join(SHARDINGS)}")
    if model.num_heads % t or model.intermediate_size % t:
        raise ValueError(
            f"tp ({t}) must divide the query heads ({model.num_heads}) and the MLP width "
            f"({model.intermediate_size}) of {model.name}")
    kv = model.num_kv_heads
    if kv % t and t % kv:
        raise ValueError(f"tp ({t}) and the key/value heads ({kv}) must divide one another")
    return Layout(n, t, sharding)


def tp_params(model: ModelConfig, tp: int) -> Fraction:
    """Parameters one tensor-parallel rank holds: everything but the norms divided by tp
    (vocab-parallel embeddings; KV projections replicated when tp > H_kv are counted split,
    a small under-count), norms whole."""
    pb = param_breakdown(model)
    return Fraction(sum(pb.values()) - pb["norms"], tp) + pb["norms"]


def layer_params(model: ModelConfig, tp: int) -> Fraction:
    pb = param_breakdown(model)
    return Fraction(pb["attention"] + pb["mlp"], tp * model.num_layers) + \
        Fraction(pb["norms"] - model.hidden_size, model.num_layers)


def layout_bytes(model: ModelConfig, lay: Layout, precision: str) -> dict[str, int]:
    """Per-GPU weights, gradients, optimizer state (AdamW: two moments), the buffers kept
    across steps and those alive during the step (module docstring)."""
    e = 4 if precision == "amp_bf16" else 2  # parameter = gradient = state dtype
    p = tp_params(model, lay.tp)
    dp = lay.dp
    s = lay.sharding
    w = p / dp if s in ("zero3", "fsdp") else p
    g = p / dp if s in ("zero2", "zero3", "fsdp") else p
    o = 2 * p / dp if s != "none" else 2 * p
    persistent = Fraction(0)
    step = Fraction(0)
    if dp > 1 and s in ("none", "zero1"):
        persistent = p * e  # DDP buckets: a second copy of every gradient
    elif dp > 1 and s == "zero2":
        step = min(p, Fraction(ZERO_REDUCE_BUCKET)) * e
    elif dp > 1:
        pb = param_breakdown(model)
        root = Fraction(pb["embeddings"] + pb["lm_head"], lay.tp) + model.hidden_size
        per_layer = layer_params(model, lay.tp)
        gathered = root + 2 * per_layer
        step = gathered * e * (1 - Fraction(1, dp)) + per_layer * e
    return {
        "weights": ceil_bytes(w * e), "gradients": ceil_bytes(g * e),
        "optimizer": ceil_bytes(o * e), "persistent_buffers": ceil_bytes(persistent),
        "step_buffers": ceil_bytes(step),
    }
