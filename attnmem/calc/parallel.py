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

Expert parallelism (MoE, `ep`): the dp data-parallel ranks form dp/ep groups of ep ranks; each
rank of a group holds E/ep of every MoE layer's experts, and the same experts are replicated
over the dp/ep expert-data-parallel ranks (Lepikhin et al. 2020, GShard, arXiv 2006.16668,
sec. 2.2-3.1: experts sharded across devices, the rest replicated; Rajbhandari et al. 2022,
DeepSpeed-MoE, arXiv 2201.05596, sec. 5: expert parallelism combined with data parallelism and
ZeRO; Megatron-LM's expert_model_parallel_size inside the data-parallel group). The experts'
weights, gradients and optimizer state follow the layout's sharding over their own
expert-data-parallel group of dp/ep ranks (DeepSpeed-MoE shards expert parameters over the
expert-data-parallel group), the other parameters over dp as above. Per GPU that is
(experts / ep) / (dp / ep) = experts / dp of expert state under full sharding, so ep saves
expert memory where it is not sharded (DDP, and the weights under ZeRO-1/2) and shrinks the
gathered expert buffers of ZeRO-3/FSDP. A group of one rank (dp = ep) has no expert
gradients to all-reduce, so no DDP buckets for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from attnmem.calc.models import ModelConfig
from attnmem.calc.params import param_breakdown
from attnmem.calc.units import ceil_bytes, check_int

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
    ep: int = 1  # expert-parallel degree (MoE): ranks that split each layer's experts

    @property
    def dp(self) -> int:
        return self.gpus // self.tp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same experts (the experts' data-parallel group)."""
        return self.dp // self.ep


def make_layout(model: ModelConfig, gpus: int, tp: int, sharding: str, ep: int = 1) -> Layout:
    """A validated layout: tp divides gpus, the query heads and the MLP width; the key/value
    heads divide by tp or tp by them (replicated KV heads, as Megatron does); ep (MoE only)
    divides the data-parallel ranks and the experts of a layer."""
    n = check_int("gpus", gpus, 1, MAX_GPUS)
    t = check_int("tp", tp, 1, n)
    e = check_int("ep", ep, 1, MAX_GPUS)
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
    if e > 1:
        if model.num_experts <= 1:
            raise ValueError(f"ep={e}: expert parallelism needs a MoE model; {model.name!r} is "
                             "dense (ep=1)")
        if (n // t) % e:
            raise ValueError(f"ep ({e}) must divide the data-parallel ranks gpus / tp "
                             f"({n // t}); accepted: a divisor of {n // t}")
        if model.num_experts % e:
            raise ValueError(f"ep ({e}) must divide the experts per layer "
                             f"({model.num_experts}) of {model.name}")
    return Layout(n, t, sharding, e)


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


def expert_params(model: ModelConfig) -> int:
    """Parameters of the routed experts of every MoE layer (weights and biases; not the router
    or a shared expert): what expert parallelism splits. 0 for a dense model."""
    if model.num_experts <= 1:
        return 0
    full, one = param_breakdown(model)["mlp"], param_breakdown(model, experts=1)["mlp"]
    return (full - one) // (model.num_experts - 1) * model.num_experts


def layout_bytes(model: ModelConfig, lay: Layout, precision: str) -> dict[str, int]:
    """Per-GPU weights, gradients, optimizer state (AdamW: two moments), the buffers kept
    across steps and those alive during the step (module docstring); "expert_gradients" is the
    part of "gradients" that belongs to the routed experts. The experts (expert_params, E/ep
    of them per rank, tp = 1 with MoE) are sharded over the expert-data-parallel group, the
    rest over dp; with ep = 1 both groups are dp and the sums are those of one group."""
    e = 4 if precision == "amp_bf16" else 2  # parameter = gradient = state dtype
    p = tp_params(model, lay.tp)
    px = Fraction(expert_params(model), lay.tp)  # all experts (tp = 1 whenever ep > 1)
    pd = p - px  # everything but the routed experts
    pxl = px / lay.ep  # the experts this rank holds
    dp, dpx = lay.dp, lay.expert_dp
    s = lay.sharding
    w = (pd / dp + pxl / dpx) if s in ("zero3", "fsdp") else pd + pxl
    gx = pxl / dpx if s in ("zero2", "zero3", "fsdp") else pxl
    g = (pd / dp if s in ("zero2", "zero3", "fsdp") else pd) + gx
    o = 2 * (pd / dp + pxl / dpx) if s != "none" else 2 * (pd + pxl)
    persistent = Fraction(0)
    step = Fraction(0)
    if dp > 1 and s in ("none", "zero1"):
        # DDP buckets: a second copy of every gradient that is all-reduced (the experts' only
        # when their group has more than one rank)
        persistent = (pd + (pxl if dpx > 1 else 0)) * e
    elif dp > 1 and s == "zero2":
        step = min(pd + pxl, Fraction(ZERO_REDUCE_BUCKET)) * e
    elif dp > 1:
        pb = param_breakdown(model)
        root = Fraction(pb["embeddings"] + pb["lm_head"], lay.tp) + model.hidden_size
        per_layer = layer_params(model, lay.tp)
        per_layer_x = px / model.num_layers / lay.ep  # this rank's experts of one layer
        per_layer_d = per_layer - px / model.num_layers
        step = ((root + 2 * per_layer_d) * e * (1 - Fraction(1, dp))
                + 2 * per_layer_x * e * (1 - Fraction(1, dpx)) + (per_layer_d + per_layer_x) * e)
    return {
        "weights": ceil_bytes(w * e), "gradients": ceil_bytes(g * e),
        "optimizer": ceil_bytes(o * e), "persistent_buffers": ceil_bytes(persistent),
        "step_buffers": ceil_bytes(step), "expert_gradients": ceil_bytes(gx * e),
    }
