"""What a mixture-of-experts block keeps and makes in a training step (Mixtral, Qwen2-MoE,
Qwen3-MoE; gpt-oss's own block is attnmem/calc/train_gpt_oss.py), and what expert parallelism
adds. Notation: attnmem/calc/train_common.py; E experts per layer, k experts per token.

Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss; `_moe_terms`,
`_moe_backward_extra`): the MoE block as transformers 5.17 (the device image) runs it in
training, the router (Mixtral/Qwen*MoeTopKRouter) and
the experts through integrations/moe.py grouped_mm_experts_forward (the default
experts_implementation where torch has grouped_mm: CUDA sm80+ on torch >= 2.10, and CPU on
torch > 2.10, so the CPU replays run the same path). Per layer, S = T·k token-expert pairs:
the router's fp32 softmax (T·E) and top-k indices, (norm_topk_prob) the top-k sum and the
clone the in-place division keeps; three int64 permutation indices (S), the gathered states
(S·h), the gate_up output (S·2I), act (S·I), the product (S·I), the experts' outputs (S·h) and
the sorted routing weights (S; fp32 for Mixtral, whose router does not cast back, so its
weighted outputs and their backward are fp32); Qwen2-MoE's shared expert as a gated MLP of its
width with its sigmoid gate. Every expert gets a gradient (grouped_mm's backward makes mat2's
whole gradient) and AdamW state. The experts' backward is walked op by op. output_router_logits
(router_aux_loss=True; off in transformers' configs) adds load_balancing_loss_func's bf16
softmax of every layer's logits (L·T·E). Checked: CPU replays (tests/calc/test_training_moe.py)
of tiny Qwen3-MoE, Qwen2-MoE and Mixtral, eager and SDPA, checkpointing on and off, with and
without the auxiliary loss: the activations at the end of the forward equal to the byte; the
step's peak within 3% (Mixtral's routing-weight product keeps both fp32 products of its
backward alive before the cast back to bf16: counted). transformers 5.17's grouped_mm path also builds
the expert-parallel sentinel mask (bool, S) on every step and masks both grouped_mm outputs
out of place with it (later releases only under EP): counted (its backward copies too).
Refused with the reason: amp_bf16, tp > 1, LoRA on MoE, gpt-oss with another attention or a
KV cache or the auxiliary loss, MLA (DeepSeek), dense layers between MoE layers.

Expert parallelism (`ep`, attnmem.calc.parallel for the weights, gradients, optimizer state and
buffers): each of ep ranks holds E/ep experts of every layer; the rest is data-parallel as the
layout says. Tokens reach their experts by all-to-all (GShard, arXiv 2006.16668; DeepSpeed-MoE,
arXiv 2201.05596; Megatron-LM's MoEAlltoAllTokenDispatcher): assumed balanced routing and no
capacity factor, so each rank's experts process S = T·k pairs as without EP (`_ep_terms`), plus
two int64 sort indices per layer (saved), and in the backward the all-to-all receive buffers
and the sort gathers' zeros (S·h each, `_ep_combine_backward`, `_ep_dispatch_backward`); the
experts' gradients are those of the local experts. NCCL's own all-to-all staging is outside the
caching allocator and not counted. Counted, not measured (one GPU here); transformers' own EP
(its 'ep_router' plan keeps every token on every rank and all-reduces the outputs) is another
scheme, not modelled.
"""

from __future__ import annotations

from fractions import Fraction

from attnmem.calc.models import ModelConfig
from attnmem.calc.train_common import _Dims
from attnmem.calc.units import ceil_bytes, check_bool, check_int

#: MoE model types whose blocks are counted: router (MixtralTopKRouter / Qwen*MoeTopKRouter),
#: experts decorated with @use_experts_implementation (default "grouped_mm",
#: modeling_utils.get_correct_experts_implementation), Qwen2-MoE's gated shared expert.
MOE_MODEL_TYPES: tuple[str, ...] = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")
#: Released configs' norm_topk_prob where the model type does not fix it: Mixtral's router
#: always divides by the top-k sum (modeling_mixtral.py MixtralTopKRouter); Qwen3-MoE's
#: released configs set norm_topk_prob=true, Qwen2-MoE's (Qwen1.5-MoE, Qwen2-57B-A14B) false.
NORM_TOPK_DEFAULT: dict[str, bool] = {"mixtral": True, "qwen3_moe": True, "qwen2_moe": False,
                                      "gpt_oss": False}


#: Label of the sentinel mask term (docstring of _moe_terms); tests find it by label.
SENTINEL_LABEL = "expert-parallel sentinel mask (bool, S), kept by the masked_fills"


class _Walk:
    """Bytes alive and their high-water mark along a backward walked op by op (raw bytes, as
    the step's other terms count them)."""

    def __init__(self) -> None:
        self.cur = self.peak = 0

    def alloc(self, x: int) -> None:
        self.cur += x
        self.peak = max(self.peak, self.cur)

    def free(self, x: int) -> None:
        self.cur -= x


def _check_moe_model(model: ModelConfig) -> None:
    if model.model_type not in MOE_MODEL_TYPES:
        raise ValueError(
            f"training_step counts the MoE blocks of {', '.join(MOE_MODEL_TYPES)}; "
            f"{model.name!r} (model_type {model.model_type!r}) has another MoE block, not counted")
    if model.dense_mlp_layers or model.mlp_layers is not None:
        raise ValueError(
            f"{model.name!r}: MoE with dense MLP layers between the sparse ones (mlp_only_layers, "
            "decoder_sparse_step) is not modelled; every layer must have the MoE block")


def _check_moe_args(model: ModelConfig, ep: int, norm_topk_prob: object, router_aux_loss: object,
                    precision: str, tp: int, adapters: object) -> tuple[bool, bool]:
    """Validated (norm_topk, aux) of a MoE step; refusals with the reason."""
    e = check_int("ep", ep, 1, 1 << 16)
    aux = check_bool("router_aux_loss", router_aux_loss)
    if norm_topk_prob is not None:
        check_bool("norm_topk_prob", norm_topk_prob)
    if model.num_experts <= 1:
        if e != 1 or aux or norm_topk_prob is not None:
            raise ValueError(f"ep, norm_topk_prob and router_aux_loss apply to MoE models; "
                             f"{model.name!r} is dense")
        return False, False
    if precision != "bf16":
        raise ValueError(
            f"precision {precision!r} with MoE: only 'bf16' is modelled; under autocast "
            "transformers' grouped_mm is not autocast-enabled and runs in the fp32 weights' "
            "dtype (integrations/moe.py _grouped_mm: input.to(weight.dtype)), not counted")
    if tp != 1:
        raise ValueError(f"tp={tp} with MoE: tensor-parallel experts are not modelled (tp=1)")
    if adapters is not None:
        raise ValueError("LoRA adapters on a MoE model are not modelled (peft's targeting of "
                         "experts' 3-D parameters is not counted)")
    if model.model_type == "gpt_oss":
        if norm_topk_prob is not None:
            raise ValueError(f"norm_topk_prob={norm_topk_prob!r} with gpt-oss: its router takes "
                             "the softmax of the top-k logits (GptOssTopKRouter), no such option")
        if aux:
            raise ValueError("router_aux_loss=True with gpt-oss is not modelled (the recorded "
                             "router logits and transformers 5.17's load_balancing_loss_func "
                             "bincount path are not counted)")
    if model.model_type == "mixtral" and norm_topk_prob is False:
        raise ValueError("norm_topk_prob=False with Mixtral: its router always normalizes "
                         "(MixtralTopKRouter)")
    norm = NORM_TOPK_DEFAULT[model.model_type] if norm_topk_prob is None else norm_topk_prob
    return norm, aux


def _router_weight_bytes(model: ModelConfig) -> int:
    """Bytes of a routing weight: Mixtral's router returns the fp32 top-k softmax as it is
    (MixtralTopKRouter: no cast back), so the experts' weighted outputs are promoted to fp32;
    Qwen-MoE casts them to the hidden dtype (router_top_value.to(router_logits.dtype))."""
    return 4 if model.model_type == "mixtral" else 2


def _moe_terms(model: ModelConfig, dm: _Dims, norm_topk: bool) -> list[tuple[str, str, int]]:
    """What one MoE block keeps for its backward, bf16, S = T·k token-expert pairs (the norm
    output it reads is the caller's "gate, up input" term; the router's linear keeps it):
    - router (Mixtral/Qwen*MoeTopKRouter.forward): the bf16 logits die (the block drops them);
      softmax(fp32) keeps its fp32 output (T·E); topk keeps its int64 indices (T·k); with
      norm_topk_prob the in-place `router_top_value /= sum` keeps the fp32 sum (T) and a clone
      of the values before the division (T·k, in-place ops save the original self);
    - experts (integrations/moe.py grouped_mm_experts_forward): `hidden_states[perm // k]`
      keeps its int64 index (S) and makes the gathered states (S·h), kept by the gate_up
      grouped_mm with the int32 offsets (E); `sample_weights[perm]` keeps perm (S); gate and up
      are views of the S·2I output, kept by act (silu keeps its input) and the product; the
      product keeps act (S·I); the down grouped_mm keeps the product (S·I); the routing-weight
      product keeps the experts' outputs (S·h) and the sorted weights (S); the un-permuting
      gather keeps inv_perm (S, int64); the final view/sum keeps nothing
      (derivatives.yaml: index keeps indices, _grouped_mm keeps self and mat2, mul keeps both,
      silu keeps self, sum keeps sizes); transformers 5.17 (the device image) also builds the
      expert-parallel sentinel mask `(expert_ids_g >= num_experts).unsqueeze(-1)` (bool, S)
      on every step and masks the gathered states in place and both grouped_mm outputs out of
      place with it (masked_fill keeps the mask); later releases do this under EP only;
    - Qwen2-MoE's shared expert: a gated MLP of its width (4 tensors of T·I_s) and its gate
      `sigmoid(Linear(h, 1)(x)) * shared(x)`: sigmoid keeps its output (T), the product keeps
      it and the shared output (T·h)."""
    t, h, i = dm.t, dm.h, dm.inter
    ne, k = model.num_experts, model.experts_per_token
    s = t * k
    we = _router_weight_bytes(model)
    p = "MoE"
    terms = [(p, "router softmax output (fp32, T×E), kept by softmax", 4 * t * ne),
             (p, "top-k expert indices (int64, T×k), kept by topk", 8 * t * k)]
    if norm_topk:
        terms += [(p, "top-k sum (fp32, T), kept by the in-place division", 4 * t),
                  (p, "top-k weights before the in-place division (fp32 clone, T×k)", 4 * t * k)]
    terms += [
        (p, "pair-to-token index perm // k (int64, S), kept by the gather", 8 * s),
        (p, "sort permutation (int64, S), kept by the routing weights' gather", 8 * s),
        (p, SENTINEL_LABEL, s),
        (p, "tokens-per-expert offsets (int32, E), kept by grouped_mm", 4 * ne),
        (p, "gathered hidden states (S×h), kept by the gate_up grouped_mm", 2 * s * h),
        (p, "gate_up output (S×2I), kept through the gate and up views", 2 * s * 2 * i),
        (p, "act(gate) (S×I), kept by the product", 2 * s * i),
        (p, "act(gate)·up (S×I), kept by the down grouped_mm", 2 * s * i),
        (p, "expert outputs (S×h), kept by the routing-weight product", 2 * s * h),
        (p, "routing weights sorted by expert (S" + (", fp32)" if we == 4 else ")"), we * s),
        (p, "inverse permutation (int64, S), kept by the un-permuting gather", 8 * s)]
    terms += _ep_terms(model, dm)
    shared = model.shared_expert_intermediate_size
    if shared:
        terms.append(("MLP", "shared expert: gate(x), act, up(x), product (4 × T·I_s)",
                      4 * 2 * t * shared))
        if model.shared_expert_gate:
            terms += [("MLP", "shared expert gate: sigmoid output (T), kept by sigmoid and the "
                       "product", 2 * t),
                      ("MLP", "shared expert output (T×h), kept by the gate product", 2 * t * h)]
    return terms


def _moe_block_grads(model: ModelConfig, g_expert: Fraction, g_rest: Fraction | None = None,
                     ) -> tuple[int, int, int]:
    """Gradient bytes of one MoE block: (gate_up of all experts, down of all experts, router
    and shared expert). Every expert's gradient is made whole by grouped_mm's backward
    (derivatives.yaml _grouped_mm: mat2's gradient has mat2's shape, E × in × out). g_expert:
    per-GPU gradient bytes per expert parameter of the model (under expert parallelism it
    covers only the E/ep local experts); g_rest: the same for the router and shared expert
    (default g_expert)."""
    g_rest = g_expert if g_rest is None else g_rest
    h, i, ne = model.hidden_size, model.intermediate_size, model.num_experts
    shared = model.shared_expert_intermediate_size
    rest = h * ne + (3 * h * shared + (h if model.shared_expert_gate else 0) if shared else 0)
    if model.model_type == "gpt_oss":  # router bias, gate_up and down biases of every expert
        rest = h * ne + ne + ne * (2 * i + h)
    # gpt-oss: the experts' biases are a few E-wide rows, counted with the rest
    return (ceil_bytes(g_expert * ne * 2 * i * h), ceil_bytes(g_expert * ne * i * h),
            ceil_bytes(g_rest * rest))


def _moe_backward_extra(model: ModelConfig, dm: _Dims, g_per_param: Fraction,
                        g_rest: Fraction | None = None) -> int:
    """Largest excess over (the block's saved tensors + the incoming T·h gradient) during the
    MoE block's backward, walked op by op in the order autograd runs them (each node frees
    its saved tensors and its incoming gradient once it has run):
    un-permuting gather (zeros S·h + index_put), the routing-weight product (the experts'
    output gradient, and the weights' gradient through an S·h product summed to S), the down
    grouped_mm (input gradient S·I, every expert's weight gradient), the product (two S·I),
    silu (S·I), chunk's backward (cat into S·2I), the gate_up grouped_mm (S·h and every
    expert's gate_up gradient), the token gather (zeros T·h), the router (topk's zeros and
    softmax's gradient, T·E fp32). Mixtral's fp32 routing weights make the first three fp32
    (the fp32 sum's gradient T·h, the zeros and the product's gradient, cast back to bf16 for
    the bf16 expert outputs)."""
    t, h, i = dm.t, dm.h, dm.inter
    ne, k = model.num_experts, model.experts_per_token
    s = t * k
    we = _router_weight_bytes(model)
    g_up, g_down, _ = _moe_block_grads(model, g_per_param, g_rest)
    a2a = dm.ep > 1
    walk = _Walk()
    alloc, free = walk.alloc, walk.free

    shared = model.shared_expert_intermediate_size
    if shared and model.shared_expert_gate:  # the add's gradient reaches the gate product first
        alloc(2 * t * h)  # d(shared output) = g · sigmoid
        alloc(2 * t)  # d(sigmoid) summed
        free(2 * t * h + 2 * t)  # saved output and sigmoid output freed
    if we == 4:
        alloc(4 * t * h)  # `.to(bf16)` backward: the fp32 gradient of the fp32 sum
    alloc(we * s * h)  # index backward: zeros + index_put
    if we == 4:
        free(4 * t * h)
    free(8 * s)  # inv_perm
    # The routing-weight product's backward makes both products before it returns: g · w,
    # the experts' output gradient in the product's dtype (fp32 for Mixtral), and g · outputs,
    # summed to the weights' gradient; then Mixtral's is cast back to the bf16 outputs' dtype.
    alloc(we * s * h)
    alloc(we * s * h)
    alloc(we * s)
    free(we * s * h)
    if we == 4:
        alloc(2 * s * h)
        free(4 * s * h)
    free(we * s * h + 2 * s * h + we * s)  # the gather's gradient, expert outputs, weights
    if a2a:
        _ep_combine_backward(alloc, free, s, h)
    alloc(2 * s * h)  # 5.17's sentinel masked_fill: its backward copies the gradient
    free(2 * s * h)
    alloc(2 * s * i)  # down grouped_mm: input gradient
    alloc(g_down)  # every expert's down gradient
    free(2 * s * h + 2 * s * i)  # d(expert outputs), the saved product
    alloc(2 * 2 * s * i)  # d(act), d(up)
    free(2 * s * i + 2 * s * i)  # d(product), act
    alloc(2 * s * i)  # silu backward: d(gate)
    free(2 * s * i + 2 * 2 * s * i)  # d(act), the gate_up output
    alloc(2 * 2 * s * i)  # chunk backward: cat
    free(2 * 2 * s * i)  # d(gate), d(up)
    alloc(2 * 2 * s * i)  # 5.17's masked_fill of the gate_up output: a copy of the gradient
    free(2 * 2 * s * i)
    alloc(2 * s * h)  # gate_up grouped_mm: input gradient
    alloc(g_up)
    free(2 * 2 * s * i + 2 * s * h)  # the cat, the gathered states
    alloc(2 * s * h)  # 5.17's in-place masked_fill_ of the gathered states: a copy
    free(2 * s * h)
    if a2a:
        _ep_dispatch_backward(alloc, free, s, h)
    alloc(2 * t * h)  # the token gather's zeros
    free(2 * s * h + 8 * s)
    alloc(4 * t * ne)  # topk backward: zeros (fp32)
    alloc(4 * t * ne)  # softmax backward
    return walk.peak


def _aux_loss_terms(model: ModelConfig, dm: _Dims) -> list[tuple[str, str, int]]:
    """output_router_logits=True: load_balancing_loss_func (modeling_mixtral.py,
    modeling_qwen3_moe.py) takes every layer's bf16 router logits (recorded by OutputRecorder)
    and runs softmax on them in bf16, which keeps its output (T·E per layer); the logits
    themselves die with the model output; `tokens_per_expert * router_prob_per_expert` keeps
    the fp32 tokens_per_expert (E)."""
    n = model.num_layers
    return [("MoE", f"load-balancing loss: bf16 softmax of the router logits (× {n} layers)",
             n * 2 * dm.t * model.num_experts),
            ("MoE", "load-balancing loss: tokens per expert (fp32, E)", 4 * model.num_experts)]


def _ep_terms(model: ModelConfig, dm: _Dims) -> list[tuple[str, str, int]]:
    """What the all-to-all dispatch adds to a MoE block's saved tensors (ep > 1), under
    balanced routing. The S = T·k pairs sorted by expert are also sorted by the rank that owns
    the expert, so they go out in one all_to_all (Lepikhin et al. 2020, GShard, arXiv
    2006.16668, sec. 3.1: dispatch and combine by all-to-all; Megatron-LM
    core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher: permute, all-to-all,
    sort the received chunks by local expert; the combine in reverse). Each rank receives the
    pairs routed to its E/ep experts from all ep ranks: with balanced routing T·k/ep from each,
    S in all, the count its experts would process without EP, so the experts' intermediates
    are those of the block without EP. The all-to-all keeps nothing (its backward is the
    reverse all-to-all); the received pairs are sorted by local expert with a gather, which
    keeps its int64 index (S), and the experts' outputs are un-sorted before the return
    all-to-all by another (S). The gathered states the gate_up grouped_mm keeps and the
    returned outputs the routing-weight product keeps replace the local ones one for one. No
    capacity factor (dropless, as transformers' blocks are): a skewed routing sends a rank up
    to ep·S pairs, which this does not count."""
    if dm.ep <= 1:
        return []
    s = dm.t * model.experts_per_token
    return [("MoE", "expert parallelism: sort of the received pairs by local expert (int64, "
             "S), kept by its gather", 8 * s),
            ("MoE", "expert parallelism: un-sort before the return all-to-all (int64, S), "
             "kept by its gather", 8 * s)]


def _ep_combine_backward(alloc, free, s: int, h: int) -> None:  # noqa: ANN001
    """The combine's backward (ep > 1): the gradient of the returned outputs goes back by
    all-to-all (its receive buffer, S·h, beside the sent one), then the un-sorting gather's
    backward (zeros S·h + index_put) beside the received one; its index (S) is freed."""
    alloc(2 * s * h)
    free(2 * s * h)
    alloc(2 * s * h)
    free(2 * s * h + 8 * s)


def _ep_dispatch_backward(alloc, free, s: int, h: int) -> None:  # noqa: ANN001
    """The dispatch's backward (ep > 1): the sort gather's backward (zeros S·h + index_put)
    beside the gathered states' gradient, then the reverse all-to-all's receive buffer (S·h)
    beside the sent one; the sort index (S) is freed."""
    alloc(2 * s * h)
    free(2 * s * h + 8 * s)
    alloc(2 * s * h)
    free(2 * s * h)
