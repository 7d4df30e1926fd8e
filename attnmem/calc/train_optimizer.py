"""Optimizer state of a training step other than torch's AdamW: bitsandbytes' 8-bit AdamW
(plain and paged) and transformers' Adafactor, counted tensor by tensor from what each library
allocates (`optimizer_state`). torch's AdamW ("adamw", "adamw_fused") and SGD stay in
attnmem/calc/parallel.py and attnmem/calc/training_step.py, unchanged.

Each rule applies to one parameter tensor, so the model's parameters are listed as tensors
(`param_tensors`, `lora_tensors`) whose sizes add up to attnmem.calc.params' count.
Under ZeRO/FSDP the state is divided by the data-parallel degree as AdamW's is
(attnmem.calc.parallel): the per-tensor rules (min_8bit_size, the 256-element blocks, the paged
threshold, Adafactor's factoring) are applied to the whole tensors before the division, an
approximation for the shards a rank really holds (a shard of a small tensor may fall below a
threshold the whole tensor passes); the quantization maps are per rank, not divided.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import prod

from attnmem.calc.models import ModelConfig
from attnmem.calc.params import param_count
from attnmem.calc.units import ceil_bytes

#: The optimizers counted here (the others of train_common.OPTIMIZERS are torch's).
LIBRARY_OPTIMIZERS: tuple[str, ...] = ("adamw_8bit", "paged_adamw_8bit", "adafactor")
#: bitsandbytes Optimizer2State(min_8bit_size=4096): smaller tensors keep fp32 states.
MIN_8BIT_SIZE = 4096
#: bitsandbytes Optimizer2State.init_state: `blocksize = 256` for the fp32 absmax per block.
BNB_BLOCKSIZE = 256
#: Optimizer8bit.get_state_buffer: paged (unified memory) only when p.numel() >= 1e5.
BNB_PAGED_MIN = 100_000
#: Optimizer8bit.fill_qmap: create_dynamic_map(signed=True) and (signed=False), 2**8 fp32 each.
BNB_QMAP_BYTES = 2 * 256 * 4

Tensors = list[tuple[int, tuple[int, ...]]]  # (how many, shape)


@dataclass(frozen=True)
class OptimizerState:
    """Per-GPU optimizer state: `device` bytes are caching-allocator memory (in before-step and
    every moment); `paged` bytes live in CUDA unified (managed) memory, which
    torch.cuda.max_memory_allocated() does not count; `step_temporary` is the largest extra the
    optimizer step allocates."""

    device: int
    paged: int
    step_temporary: int


def param_tensors(model: ModelConfig) -> Tensors:
    """The parameter tensors of a dense decoder as transformers 5 creates them (modeling_llama.py
    and its relatives, modeling_phi3.py's fused qkv_proj and gate_up_proj, modeling_gpt2.py's
    Conv1D layers). Raises ValueError for models it does not list (MoE, MLA, hybrids) or whose
    sum differs from attnmem.calc.params.param_count."""
    if model.num_experts > 1 or model.is_mla or model.state_mixer is not None:
        raise ValueError(f"per-tensor optimizer state ({', '.join(LIBRARY_OPTIMIZERS)}) is "
                         f"counted for dense decoders; {model.name!r} is not one (MoE, MLA or "
                         "a hybrid); accepted for it: adamw, adamw_fused, sgd")
    h, d, L, i = model.hidden_size, model.head_dim, model.num_layers, model.intermediate_size
    q, kv = model.num_heads * d, model.num_kv_heads * d
    out: Tensors = [(1, (model.vocab_size, h))]
    if not model.tie_embeddings:
        out.append((1, (model.vocab_size, h)))
    if model.learned_positions:
        out.append((1, (model.learned_positions, h)))
    norm = [(1, (h,)), (1, (h,))] if model.norm_bias else [(1, (h,))]
    out += norm  # final norm
    layer: Tensors = [(model.norms_per_layer * n, s) for n, s in norm]
    if model.model_type == "gpt2":  # Conv1D c_attn, c_proj, c_fc, mlp c_proj, with biases
        layer += [(1, (h, 3 * h)), (1, (3 * h,)), (1, (h, h)), (1, (h,)),
                  (1, (h, i)), (1, (i,)), (1, (i, h)), (1, (h,))]
    else:
        qw = 2 * q if model.attention_output_gate else q
        if model.model_type == "phi3":
            layer += [(1, (qw + 2 * kv, h)), (1, (h, q)), (1, (2 * i, h)), (1, (h, i))]
        else:
            layer += [(1, (qw, h)), (2, (kv, h)), (1, (h, q)), (2, (i, h)), (1, (h, i))]
        if model.attention_bias:
            layer += [(1, (q,)), (2, (kv,))]
        if model.attention_out_bias:
            layer.append((1, (h,)))
        if model.qk_norm:
            layer.append((2, (d,)))
        if model.attention_sinks:
            layer.append((1, (model.num_heads,)))
        if model.mlp_bias:
            layer += [(2, (i,)), (1, (h,))]
    out += [(L * n, s) for n, s in layer]
    if sum(n * prod(s) for n, s in out) != param_count(model):
        raise ValueError(f"per-tensor optimizer state: {model.name!r}'s tensors are not listed "
                         "here (their sum differs from its parameter count); accepted for it: "
                         "adamw, adamw_fused, sgd")
    return out


def lora_tensors(shapes: dict[str, tuple[int, int]], targets: tuple[str, ...], rank: int,
                 layers: int) -> Tensors:
    """peft's trainable tensors: per adapted linear and layer lora_A (r × in), lora_B (out × r);
    `shapes` maps a target to its (in_features, out_features)."""
    out: Tensors = []
    for name in targets:
        fan_in, fan_out = shapes[name]
        out += [(layers, (rank, fan_in)), (layers, (fan_out, rank))]
    return out


def _adamw_8bit(tensors: Tensors) -> tuple[int, int]:
    """(device bytes, paged bytes) of bitsandbytes' AdamW8bit / PagedAdamW8bit for one GPU
    holding every tensor (bitsandbytes/optim/optimizer.py, Optimizer2State.init_state, and
    Optimizer8bit.get_state_buffer; AdamW8bit and PagedAdamW8bit in bitsandbytes/optim/adamw.py
    are Optimizer2State with optim_bits=8, min_8bit_size=4096, is_paged False / True):
    - a tensor of n < min_8bit_size elements: state1 and state2 in fp32 (8n), whatever the
      parameter dtype;
    - otherwise state1 and state2 in uint8 (2n) and absmax1, absmax2 in fp32, one per block of
      blocksize = 256 elements, blocks = n // 256 + bool(n % 256): 8·ceil(n / 256);
    - qmap1, qmap2: the two dynamic maps (create_dynamic_map, 256 fp32 each), shared by every
      tensor (self.name2qmap), once when any tensor is 8-bit;
    - max_unorm = 0 by default: no unorm_vec.
    Paged: get_state_buffer puts state1/state2 in unified memory (F.get_paged) only when
    p.numel() >= 1e5; smaller states, absmax and the maps are ordinary device tensors.
    The second element is the state that a paged optimizer would page (the caller decides)."""
    device = paged = 0
    any8 = False
    for count, shape in tensors:
        n = prod(shape)
        if n < MIN_8BIT_SIZE:
            states, rest = 8 * n, 0
        else:
            any8 = True
            states, rest = 2 * n, 8 * (-(-n // BNB_BLOCKSIZE))
        if n >= BNB_PAGED_MIN:
            paged += count * states
        else:
            device += count * states
        device += count * rest
    return device + (BNB_QMAP_BYTES if any8 else 0), paged


def _adafactor(tensors: Tensors) -> int:
    """Bytes of transformers' Adafactor state with its defaults (transformers
    src/transformers/optimization.py, class Adafactor: beta1=None, so no exp_avg; _get_options:
    factored = len(shape) >= 2): a factored tensor keeps exp_avg_sq_row (shape[:-1]) and
    exp_avg_sq_col (shape[:-2] + shape[-1:]), a 1-D one exp_avg_sq (its shape); all fp32
    (`torch.zeros(...).to(grad)` after `grad = grad.float()` for bf16/fp16 gradients).
    state["step"] is a Python int; state["RMS"] = `self._rms(p_data_fp32)` is a 0-d fp32
    tensor on the parameter's device (4 bytes per tensor; found by the harness's CPU test
    against the real optimizer, tests/measure/test_train_recipes.py)."""
    total = 0
    for count, shape in tensors:
        if len(shape) >= 2:
            total += count * 4 * (prod(shape[:-1]) + prod(shape[:-2]) * shape[-1])
        else:
            total += count * 4 * prod(shape)
        total += count * 4  # state["RMS"]
    return total


def _adafactor_step(tensors: Tensors, param_bytes: int) -> int:
    """Adafactor.step's largest temporary, one parameter at a time (same source): for a bf16
    parameter of n elements the fp32 gradient copy (grad.float()) and parameter copy
    (p.data.float()), `update = grad**2 + eps` (grad**2 and the sum alive together) and later
    the new update from _approx_sq_grad beside the old one: 16n; an fp32 parameter (amp_bf16)
    copies neither: 8n. Counted from the code, not measured."""
    n = max(prod(s) for _, s in tensors)
    return (16 if param_bytes == 2 else 8) * n


def optimizer_state(optimizer: str, tensors: Tensors, param_bytes: int, shards: int,
                    ) -> OptimizerState:
    """Per-GPU state of a LIBRARY_OPTIMIZERS optimizer over `tensors` (the trainable ones),
    parameters of `param_bytes` bytes, the state divided over `shards` ranks (1, or the
    data-parallel degree under ZeRO/FSDP, as AdamW's). "adamw_8bit": everything on the device;
    "paged_adamw_8bit": the same bytes, the states of tensors of >= 1e5 elements in unified
    memory (`paged`, not in the allocator's peak); "adafactor": on the device. The 8-bit
    update (optimizer_update_8bit_blockwise) works in place: no step temporary."""
    if optimizer == "adafactor":
        dev = ceil_bytes(Fraction(_adafactor(tensors), shards))
        tmp = ceil_bytes(Fraction(_adafactor_step(tensors, param_bytes), shards))
        return OptimizerState(dev, 0, tmp)
    dev, pg = _adamw_8bit(tensors)
    qmaps = BNB_QMAP_BYTES if dev >= BNB_QMAP_BYTES and any(
        prod(s) >= MIN_8BIT_SIZE for _, s in tensors) else 0
    dev = ceil_bytes(Fraction(dev - qmaps, shards)) + qmaps
    pg = ceil_bytes(Fraction(pg, shards))
    if optimizer == "adamw_8bit":
        return OptimizerState(dev + pg, 0, 0)
    return OptimizerState(dev, pg, 0)
