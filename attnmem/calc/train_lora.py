"""A training step with a frozen base and LoRA or QLoRA adapters (peft): the adapters' values,
what each adapted layer keeps, the frozen base's bytes and the step's moments. Notation:
attnmem/calc/train_common.py.

LoRA and QLoRA (`adapters=LoRA(rank, alpha, targets, dropout, adapter_dtype)`, `base_dtype`):
a frozen base (peft's get_peft_model freezes every base parameter) with adapters on the named
linears (peft/tuners/lora/layer.py, LoraLayer.update_layer and Linear.forward). Adapters are
fp32 by default: get_peft_model's autocast_adapter_dtype=True upcasts them
(tuners_utils.cast_adapter_dtype); gradients and AdamW state exist for them only, in their
dtype. What the forward keeps changes where a weight is frozen (derivatives.yaml: mm keeps
`self` only for mat2's gradient and mat2 only for self's; mul.Tensor likewise): a frozen linear
keeps its weight, not its input, and a frozen norm weight keeps no normalized input; so the
norm outputs, o_proj's input, the MLP product and lm_head's input are gone, and each adapted
linear adds the fp32 cast of its input (peft's _cast_input_dtype, one copy per adapted linear)
or, with dropout, a bool mask (native_dropout) and the dropped input, kept by lora_A, plus
lora_A's T×r output kept by lora_B. Layer 0's input does not require grad (the embedding is
frozen), so what precedes its first adapter keeps nothing (_lora_layer_terms). Checkpointing
keeps the layer inputs as in full training. QLoRA ("nf4", "nf4_dq"): the decoder's linear
weights as bitsandbytes' Params4bit (attnmem.calc.quant.quantized_matrix_bytes), the rest bf16 (as a
BitsAndBytesConfig load with torch_dtype=bfloat16 leaves them, without
prepare_model_for_kbit_training's fp32 upcast, counted with kbit_prepare=True in
attnmem/calc/train_recipes.py), and the bf16 out×in copy
that MatMul4Bit dequantizes in its forward and backward, one matrix at a time, added to the
layers' backward moments. Checked: the CPU replays through peft 0.21
(tests/calc/test_training_lora.py) for the bf16 base; the 4-bit terms are counted from
bitsandbytes' source and not replayed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction

from attnmem.calc.models import ModelConfig, QuantConfig, check_model
from attnmem.calc.parallel import make_layout
from attnmem.calc.params import param_count
from attnmem.calc.quant import quantized_matrix_bytes
from attnmem.calc.train_common import (
    CUBLAS_WORKSPACE_BYTES,
    HEAD_LABELS,
    PARTS,
    PHASES,
    TrainingStepMemory,
    _Dims,
    _dims,
    _is_gpt2,
)
from attnmem.calc.train_dense import (
    _attention_backward_extra,
    _attention_forward_extra,
    _core_saved,
    _labels_bytes,
    _layer_terms,
    _model_terms,
)
from attnmem.calc.train_liger import (
    LIGER_PHASE,
    flce_forward_extra,
    liger_layer_terms,
    liger_model_terms,
    lora_liger_ckpt_moments,
    lora_liger_moments,
)
from attnmem.calc.train_optimizer import LIBRARY_OPTIMIZERS, lora_tensors, optimizer_state
from attnmem.calc.train_packed import (
    _check_kernel,
    _checkpoint_terms,
    _input_bytes,
    _mask_count,
    _masked_layers,
    _packed_bool_masks,
    _packed_terms,
    _packed_window,
)
from attnmem.calc.train_recipes import (
    attention_backward_extra_fp32,
    kbit_backward_extra,
    kbit_layer_terms,
    kbit_model_terms,
    kbit_upcast_bytes,
)
from attnmem.calc.units import ceil_bytes, check_int

#: The linear modules of a Llama-family decoder layer that LoRA may target (transformers'
#: module names, as peft's LoraConfig.target_modules matches them), with "attention" and
#: "all-linear" as peft spells its shorthand (peft/tuners/tuners_utils.py, INCLUDE_LINEAR_LAYERS
#: _SHORTHAND: every nn.Linear but the output layer, so never lm_head).
LORA_ATTENTION_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
LORA_MLP_TARGETS: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
LORA_TARGET_SETS: dict[str, tuple[str, ...]] = {
    "attention": LORA_ATTENTION_TARGETS,
    "all-linear": LORA_ATTENTION_TARGETS + LORA_MLP_TARGETS,
}
#: Base weight storage: "bf16" (the model in bf16, frozen), "nf4" (bitsandbytes 4-bit NF4,
#: fp32 absmax per 64 weights), "nf4_dq" (NF4 with double quantization: 8-bit absmax and an
#: fp32 second-level absmax per 256 blocks). Compute dtype bf16 in all three.
BASE_DTYPES: tuple[str, ...] = ("bf16", "nf4", "nf4_dq")
#: Adapter parameter dtype: peft's get_peft_model(..., autocast_adapter_dtype=True), its
#: default, upcasts bf16/fp16 adapters to fp32 (peft/tuners/tuners_utils.py
#: cast_adapter_dtype); "bf16" is autocast_adapter_dtype=False.
ADAPTER_DTYPES: tuple[str, ...] = ("fp32", "bf16")
LORA_PART = "LoRA adapters"
_LORA_REFUSED = {
    "lm_head": "lm_head is not a LoRA target here (peft's all-linear leaves it out, and a "
               "trainable V-wide adapter output is not counted)",
    "embed_tokens": "embeddings as LoRA targets (peft's lora.Embedding) are not counted",
}


@dataclass(frozen=True)
class LoRA:
    """A peft LoraConfig as far as memory goes (peft/tuners/lora/layer.py, LoraLayer.update_layer
    and Linear.forward): per targeted nn.Linear of in → out features, lora_A (r × in) and
    lora_B (out × r) without bias, nn.Dropout(dropout) when dropout > 0 (else nn.Identity),
    scaling = alpha / r (alpha changes no byte; it is validated and kept for the record).
    targets: "attention" (q, k, v, o), "all-linear" (q, k, v, o, gate, up, down) or a tuple of
    those module names. adapter_dtype: module constant ADAPTER_DTYPES. use_dora: DoRA is
    refused (its weight-norm terms are not counted)."""

    rank: int
    alpha: float = 16.0
    targets: str | tuple[str, ...] = "all-linear"
    dropout: float = 0.0
    adapter_dtype: str = "fp32"
    use_dora: bool = False


@dataclass(frozen=True)
class _Lora:
    """A validated LoRA: rank, the targeted module names, dropout, adapter bytes per element."""

    rank: int
    targets: tuple[str, ...]
    dropout: float
    e: int  # bytes of an adapter element (4 fp32, 2 bf16)


def _check_lora(lora: object) -> _Lora:
    if not isinstance(lora, LoRA):
        raise ValueError(f"adapters must be None or attnmem.calc.training_step.LoRA(...), not {lora!r}")
    r = check_int("LoRA rank", lora.rank, 1, 1 << 16)
    a = lora.alpha
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a < float("inf"):
        raise ValueError(f"LoRA alpha must be a positive finite number, not {a!r}")
    d = lora.dropout
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d < 1:
        raise ValueError(f"LoRA dropout must be a number in [0, 1), not {d!r}")
    if lora.adapter_dtype not in ADAPTER_DTYPES:
        raise ValueError(f"unknown LoRA adapter_dtype {lora.adapter_dtype!r}; accepted: "
                         f"{', '.join(ADAPTER_DTYPES)}")
    if lora.use_dora is not False:
        raise ValueError(f"use_dora={lora.use_dora!r}: DoRA (peft's lora/dora.py: the weight "
                         "norm of W + BA per forward, a full out×in product) is not modelled")
    t = lora.targets
    if isinstance(t, str):
        if t not in LORA_TARGET_SETS:
            raise ValueError(f"unknown LoRA targets {t!r}; accepted: "
                             f"{', '.join(LORA_TARGET_SETS)} or a tuple of module names from "
                             f"{', '.join(LORA_TARGET_SETS['all-linear'])}")
        names = LORA_TARGET_SETS[t]
    elif isinstance(t, (tuple, list)) and t:
        allowed = LORA_TARGET_SETS["all-linear"]
        for n in t:
            if n in _LORA_REFUSED:
                raise ValueError(f"LoRA target {n!r}: {_LORA_REFUSED[n]}")
            if not isinstance(n, str) or n not in allowed:
                raise ValueError(f"unknown LoRA target module {n!r} in {t!r} (experts, routers and "
                                 f"other modules are not counted); accepted: {', '.join(allowed)}")
        if len(set(t)) != len(t):
            raise ValueError(f"LoRA targets {t!r} name a module twice")
        names = tuple(n for n in allowed if n in t)
    else:
        raise ValueError(f"LoRA targets must be 'attention', 'all-linear' or a non-empty tuple "
                         f"of module names, not {t!r}")
    return _Lora(r, names, float(d), 4 if lora.adapter_dtype == "fp32" else 2)


def _check_lora_model(model: ModelConfig, precision: str, gpus: int, tp: int,
                      sharding: str) -> None:
    if _is_gpt2(model) or model.model_type == "phi3":
        raise ValueError(f"LoRA is counted for the Llama family's separate q/k/v/o and "
                         f"gate/up/down projections; {model.name!r} ({model.model_type}) fuses "
                         "them (GPT-2's Conv1D c_attn, Phi-3's qkv_proj): not modelled")
    if precision != "bf16":
        raise ValueError(f"precision {precision!r} with adapters: only 'bf16' (the base in "
                         "bf16 or 4-bit, no autocast) is modelled; under autocast the adapters' "
                         "fp32 inputs are cast again to bf16 per matmul, not counted")
    if (gpus, tp, sharding) != (1, 1, "none"):
        raise ValueError(f"gpus={gpus}, tp={tp}, sharding={sharding!r} with adapters: LoRA is "
                         "modelled on one GPU (gpus=1, tp=1, sharding='none')")


def _lora_shapes(model: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each targetable linear (modeling_llama.py)."""
    h, q, k, i = (model.hidden_size, model.num_heads * model.head_dim,
                  model.num_kv_heads * model.head_dim, model.intermediate_size)
    return {"q_proj": (h, q), "k_proj": (h, k), "v_proj": (h, k), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def lora_adapter_params(model: ModelConfig, lora: LoRA) -> int:
    """Trainable parameters: per targeted linear and layer, r·in (lora_A) + out·r (lora_B)."""
    check_model(model)
    return _adapter_params(model, _check_lora(lora))


def _adapter_params(model: ModelConfig, lo: _Lora) -> int:
    """lora_adapter_params for a validated LoRA."""
    shapes = _lora_shapes(model)
    return model.num_layers * sum(lo.rank * (shapes[n][0] + shapes[n][1]) for n in lo.targets)


def _adapter_terms(name: str, fan_in: int, t: int, lo: _Lora, grad_in: bool,
                   ) -> list[tuple[str, str, int]]:
    """What one adapted linear saves beyond its frozen base (peft lora.Linear.forward:
    `result = base_layer(x)`, `x = _cast_input_dtype(x, lora_A.weight.dtype)`,
    `result + lora_B(lora_A(dropout(x))) * scaling`, `result.to(result_dtype)`):
    - the frozen base matmul saves no input: derivatives.yaml mm saves `self` only for mat2's
      gradient (the generated code saves each input only when should_compute_output needs it),
      so it keeps the weight (a parameter) and not x;
    - lora_A keeps its input: the fp32 cast of x (a copy per adapted linear, 4·T·in) with fp32
      adapters; with bf16 adapters x itself (the shared base term, kept by the caller);
    - dropout > 0 (nn.Dropout → native_dropout on CUDA): a bool mask (T·in) when its input
      requires grad, and its output, kept by lora_A, in place of the cast;
    - lora_A's output (T·r), kept by lora_B; `* scaling` (a Python float) and the adds keep
      nothing; the adapters' own weights are parameters."""
    out = []
    if lo.dropout > 0:
        if grad_in:
            out.append((LORA_PART, f"{name}: lora dropout mask (bool, T×in), kept by "
                        "native_dropout", t * fan_in))
        out.append((LORA_PART, f"{name}: lora dropout output, kept by lora_A", lo.e * t * fan_in))
    elif lo.e == 4:
        out.append((LORA_PART, f"{name}: input cast to fp32 (peft _cast_input_dtype), kept by "
                    "lora_A", 4 * t * fan_in))
    return out + [(LORA_PART, f"{name}: lora_A output (T×r), kept by lora_B", lo.e * t * lo.rank)]


_FROZEN_NORM_OUT = ("normalized input (weight ×)", "fp32 normalized input (× (1 + w))")


def _lora_layer_terms(model: ModelConfig, dm: _Dims, impl: str, cache: bool, masked: bool,
                      lo: _Lora, first: bool) -> list[tuple[str, str, int]]:
    """One decoder layer's saved tensors with a frozen base and LoRA adapters: the full-training
    terms (_layer_terms) less what frozen weights no longer need, plus the adapters' terms.
    - A norm whose weight is frozen: `weight * x` (mul.Tensor) keeps `weight` for x's gradient
      and x only for weight's, so the normalized input is not kept (Gemma keeps 1 + w).
    - A frozen linear keeps no input (_adapter_terms); the norm output, the attention output
      made contiguous (o_proj) and the MLP product (down_proj) stay only where a bf16 adapter
      without dropout reads them.
    - first: layer 0, whose input (the frozen embedding's output) does not require grad (peft
      calls enable_input_require_grads only for prompt-learning methods): what precedes the
      first adapter keeps nothing. Its attention then keeps what the inputs that do require
      grad need: eager's q·kᵀ keeps k for q's gradient and q for k's, softmax's output exists
      as saved only when q or k is trained, P·V keeps P for v's gradient and v for P's; a fused
      kernel keeps q, k, v, output and log-sum-exp whenever any of them requires grad; in the
      MLP, act keeps gate(x) and the product keeps act(gate(x)) and up(x) for the side that is
      trained."""
    t = dm.t
    tg = set(lo.targets)
    shapes = _lora_shapes(model)
    qkv_grad = not first or bool(tg & {"q_proj", "k_proj", "v_proj"})
    mlp_in_grad = not first or bool(tg & set(LORA_ATTENTION_TARGETS))
    gate_grad = mlp_in_grad or "gate_proj" in tg
    up_grad = mlp_in_grad or "up_proj" in tg
    grad_in = {"q_proj": not first, "k_proj": not first, "v_proj": not first,
               "o_proj": qkv_grad, "gate_proj": mlp_in_grad, "up_proj": mlp_in_grad,
               "down_proj": gate_grad or up_grad}
    bf16_keeps = lo.e == 2 and lo.dropout == 0

    def adapters(names: tuple[str, ...]) -> list[tuple[str, str, int]]:
        out = []
        for n in names:
            if n in tg:
                label = ("o_proj input: " if n == "o_proj" else "") + n
                out += _adapter_terms(label, shapes[n][0], t, lo, grad_in[n])
        return out

    def keep_first(label: str) -> bool:
        """Layer 0 only: whether a term of the full-training list is still kept."""
        if label.startswith("input norm"):
            return False
        if label.startswith(("post-attention norm", "pre-MLP norm")):
            return mlp_in_grad
        if label.startswith("post-MLP norm"):
            return True
        if label.startswith(("k in the KV cache", "v in the KV cache")):
            return True
        if label.startswith("q_norm"):
            return "q_proj" in tg or not first
        if label.startswith("k_norm"):
            return "k_proj" in tg or not first
        if label.startswith(("gate(x)", "act(gate(x)), kept", "up(x)")):
            if mlp_in_grad:
                return True
            return ("up_proj" in tg) if label.startswith("act(gate(x)), kept") else \
                ("gate_proj" in tg)
        if label.startswith(("act(gate(x))·up(x)", "o_proj input", "q, k, v input",
                             "gate, up input")):
            return True  # the base term is decided, and the adapters' added, by the caller
        # the attention block: rotary q/k, v, the kernel's saved tensors, the mask bias
        if not qkv_grad:
            return False
        if impl == "eager":
            qk = bool(tg & {"q_proj", "k_proj"})
            if label.startswith("q after rotary"):
                return "k_proj" in tg
            if label.startswith("k after rotary"):
                return "q_proj" in tg
            if label.startswith("v"):
                return qk
            if label.startswith(("softmax output", "tanh of the soft-capped")):
                return qk
            if label.startswith("probabilities P"):
                return "v_proj" in tg
        return True

    terms: list[tuple[str, str, int]] = []
    o_done = False
    for part, label, x in _layer_terms(model, dm, impl, False, cache, masked):
        if first and not keep_first(label):
            continue
        if label.endswith(_FROZEN_NORM_OUT):
            continue
        if label.startswith("q, k, v input"):
            if bf16_keeps and tg & {"q_proj", "k_proj", "v_proj"} and (qkv_grad or not first):
                terms.append((part, label, x))
            terms += adapters(("q_proj", "k_proj", "v_proj"))
            continue
        if label.startswith("o_proj input"):
            if bf16_keeps and "o_proj" in tg:
                terms.append((part, label, x))
            terms += adapters(("o_proj",))
            o_done = True
            continue
        if not o_done and label.startswith(("post-attention norm", "pre-MLP norm")):
            terms += adapters(("o_proj",))
            o_done = True
        if label.startswith("gate, up input"):
            if bf16_keeps and tg & {"gate_proj", "up_proj"}:
                terms.append((part, label, x))
            terms += adapters(("gate_proj", "up_proj"))
            continue
        if label.startswith("act(gate(x))·up(x)"):
            if bf16_keeps and "down_proj" in tg:
                terms.append((part, label, x))
            terms += adapters(("down_proj",))
            continue
        terms.append((part, label, x))
    return terms


def _lora_model_terms(model: ModelConfig, dm: _Dims, impl: str) -> list[tuple[str, str, int]]:
    """The model-level terms with a frozen final norm and lm_head: the norm's output is kept by
    neither (lm_head keeps its weight for the input gradient, not its input)."""
    return [(p, lab, x) for p, lab, x in _model_terms(model, dm, False, impl)
            if not lab.endswith(_FROZEN_NORM_OUT) and not lab.startswith("lm_head input")]


def _base_weight_bytes(model: ModelConfig, base_dtype: str) -> tuple[int, int]:
    """(bytes of the frozen base, largest dequantized matrix in bytes; 0 for bf16).
    nf4/nf4_dq: every q/k/v/o/gate/up/down matrix of the decoder layers as bitsandbytes'
    Params4bit stores it (attnmem.calc.quant.quantized_matrix_bytes: ceil(n/2) packed bytes, absmax
    fp32 per 64 weights or, double-quantized, uint8 per 64 + fp32 per 256 blocks + the nested
    code, the 16-entry code); embeddings, norms and lm_head stay bf16 (transformers'
    get_keys_to_not_convert leaves lm_head out). The dequantized copy is the bf16 out×in matrix
    that bitsandbytes' MatMul4Bit makes with F.dequantize_4bit in its forward and again in its
    backward (bitsandbytes/autograd/_functions.py), one linear at a time."""
    total = param_count(model)
    if base_dtype == "bf16":
        return 2 * total, 0
    q = QuantConfig("bitsandbytes", 4, quant_type="nf4", double_quant=base_dtype == "nf4_dq")
    shapes = _lora_shapes(model).values()
    per_layer = sum(quantized_matrix_bytes(q, o, i) for i, o in shapes)
    linear = sum(i * o for i, o in shapes)
    weights = ceil_bytes(model.num_layers * per_layer) + 2 * (total - model.num_layers * linear)
    return weights, 2 * max(i * o for i, o in shapes)


def _lora_backward_extra(model: ModelConfig, dm: _Dims, impl: str, layer: list, lo: _Lora,
                         g_layer: int, deq: int) -> int:
    """Largest excess over (the layer's saved tensors + the incoming gradient) in a layer's
    backward with a frozen base: the MLP product's backward (the frozen down_proj's input
    gradient, then d(act) and d(up): three 2TI), an adapted linear's backward (lora_A's input
    gradient in the adapter dtype and its bf16 cast, beside the base's input gradient), or the
    attention call's (as in full training, with the adapters' gradients in place of the
    weights'); QLoRA adds the dequantized weight alive during the input gradient."""
    t, i = dm.t, dm.inter
    shapes = _lora_shapes(model)

    def grads(names: tuple[str, ...]) -> int:  # the adapters' gradients, adapter dtype
        return sum(lo.e * lo.rank * (shapes[n][0] + shapes[n][1]) for n in names
                   if n in lo.targets)

    mlp = 3 * 2 * t * i + grads(("down_proj",))
    lora = max((lo.e * t * shapes[n][0] + 2 * t * shapes[n][0] + 2 * t * shapes[n][0]
                for n in lo.targets), default=0)
    return max(mlp, lora, _lora_attention_extra(model, dm, impl, layer, lo)) + deq


def _lora_attention_extra(model: ModelConfig, dm: _Dims, impl: str, layer: list, lo: _Lora,
                          ) -> int:
    """The attention call's backward in a layer's backward with a frozen base: the MLP side
    freed, the adapters' gradients of o_proj and the MLP made."""
    shapes = _lora_shapes(model)
    grads = sum(lo.e * lo.rank * (shapes[n][0] + shapes[n][1])
                for n in ("o_proj", *LORA_MLP_TARGETS) if n in lo.targets)
    return -_core_saved(layer) + grads + _attention_backward_extra(impl, dm)


def _lora_step(model: ModelConfig, b: int, s: int, attention: str, checkpointing: bool,
              optimizer: str, cache: bool, lo: _Lora, base_dtype: str,
              lengths: tuple[int, ...] = (), kbit: bool = False, liger: bool = False,
              offload: bool = False) -> TrainingStepMemory:
    """The step with a frozen base and LoRA adapters, as training_step composes it (module
    docstring); kbit: after peft's prepare_model_for_kbit_training (attnmem/calc/
    train_recipes.py: fp32 norms, embeddings and lm_head, an fp32 residual stream)."""
    lay = make_layout(model, 1, 1, "none")
    dm = dataclasses.replace(_dims(model, b, s, 1), lengths=lengths,
                             window=_packed_window(model, lengths))
    L = model.num_layers
    keep_cache = cache and not checkpointing
    masked = _masked_layers(model, attention, dm)
    _check_kernel(model, attention, s, masked, lengths)
    if masked not in (0, L):
        raise ValueError(f"{model.name!r}: LoRA with sliding-window layers that get a mask beside "
                         "layers that do not is not modelled")
    mk = masked > 0
    first = _lora_layer_terms(model, dm, attention, keep_cache, mk, lo, True)
    rest = _lora_layer_terms(model, dm, attention, keep_cache, mk, lo, False)
    if kbit:  # every layer's input requires grad (enable_input_require_grads): layer 0 too
        first = rest = kbit_layer_terms(dm, attention, lo.targets, lo.rank, lo.dropout)
    if liger:  # attnmem/calc/train_liger.py
        first, rest = liger_layer_terms(first, dm), liger_layer_terms(rest, dm)
    a_first, a_rest = (sum(x for _, _, x in k) for k in (first, rest))
    stream = 4 if kbit else 2  # the residual stream is fp32 after the prepare step
    terms: list[tuple[str, str, int]] = []
    inputs = L * stream * dm.t * dm.h
    if checkpointing:
        terms.append(("residuals", f"layer inputs kept by the checkpoints ({L} × T·h)", inputs))
        terms += _checkpoint_terms(model, dm, attention, masked, stream)
    else:
        terms += [(p, f"{lab} (layer 0)", x) for p, lab, x in first]
        if L > 1:
            terms += [(p, f"{lab} (× {L - 1} layers)", (L - 1) * x) for p, lab, x in rest]
    if kbit:
        terms += kbit_model_terms(dm)
    elif liger:  # lm_head frozen: the fused loss makes no weight gradient
        terms += liger_model_terms(_model_terms(model, dm, False, attention), dm, 0)
    else:
        terms += _lora_model_terms(model, dm, attention)
    terms += _packed_terms(dm, attention)
    parts = dict.fromkeys((*PARTS, LORA_PART), 0)
    for p, _, x in terms:
        parts[p] += x
    acts = sum(parts.values())

    adapter = _adapter_params(model, lo)
    weights, deq = _base_weight_bytes(model, base_dtype)
    weights += lo.e * adapter + (kbit_upcast_bytes(model) if kbit else 0)
    grads = lo.e * adapter  # torch makes .grad in the parameter's dtype
    opt = 0 if optimizer == "sgd" else 2 * lo.e * adapter  # exp_avg, exp_avg_sq like the param
    paged = tmp = 0
    if optimizer in LIBRARY_OPTIMIZERS:  # only the adapters are trainable: only they have state
        st = optimizer_state(optimizer, lora_tensors(_lora_shapes(model), lo.targets, lo.rank,
                                                     model.num_layers), lo.e, 1)
        opt, paged, tmp = st.device, st.paged, st.step_temporary
    fixed = CUBLAS_WORKSPACE_BYTES + _input_bytes(dm)
    before = weights + opt + fixed
    base = before
    g_layer = ceil_bytes(Fraction(grads, L))
    tv = dm.t * dm.vocab
    lsm = 4 * tv
    tanh_logits = 2 * tv if model.model_type == "gemma2" else 0
    head_saved = sum(x for p, lab, x in terms if lab.startswith(HEAD_LABELS)
                     or p == "logits and loss")
    shared = sum(x for _, lab, x in terms if lab.startswith("cos and sin"))
    masks = _mask_count(model) * stream * dm.b * dm.s * dm.s if attention == "eager" else 0
    masks += _packed_bool_masks(model, dm, attention)
    layers_saved = a_first + (L - 1) * a_rest
    phases: dict[str, int] = {}
    last = rest if L > 1 else first
    a_last = sum(x for _, _, x in last)
    # Forward, the last layer's attention call (as in full training).
    kept = layers_saved - a_last if not checkpointing else inputs
    partial = a_last - _core_saved(last)
    phases[PHASES[0]] = (base + shared + masks + kept + partial
                         + _attention_forward_extra(attention, dm) + stream * dm.t * dm.h)
    kept_all = layers_saved if not checkpointing else inputs
    # the final norm: its input, the fp32 copy, x·rsqrt and the bf16 cast (kbit: x is fp32
    # already, x·rsqrt and the fp32 weight product)
    norm_out = (4 + 4 + 4) * dm.t * dm.h if kbit else (2 + 4 + 4 + 2) * dm.t * dm.h
    if liger:  # LigerRMSNorm: its input and output
        norm_out = (2 + 2) * dm.t * dm.h
    phases[PHASES[1]] = base + shared + masks + kept_all + norm_out + 4 * dm.t
    phases[PHASES[2]] = base + acts + 2 * 4 * tv
    # lm_head backward: the bf16 gradient of the logits and of lm_head's input; no weight
    # gradient (frozen: mm's mat2 gradient is not computed).
    # (kbit: lm_head is fp32, so the logits' gradient is log_softmax's fp32 one, and its input
    # gradient fp32)
    e_lm = 4 if kbit else 2
    phases[PHASES[3]] = (base + acts - lsm - tanh_logits - _labels_bytes(dm)
                         + (0 if kbit else 2 * tv) + e_lm * dm.t * dm.h + (4 * tv if kbit else 0))
    if liger:  # the fused loss: no log-softmax, no logits' gradients (train_liger.py)
        del phases[PHASES[2]], phases[PHASES[3]]
        phases[LIGER_PHASE] = base + acts + 2 * dm.t * dm.h + flce_forward_extra(dm, 0)
    after_loss = acts - head_saved
    dh = stream * dm.t * dm.h
    extra_last = _lora_backward_extra(model, dm, attention, last, lo, g_layer, deq)
    extra_first = _lora_backward_extra(model, dm, attention, first, lo, g_layer, deq)
    if kbit:
        attn = (-_core_saved(last) + 4 * sum(lo.rank * (i + o) for n, (i, o) in
                                             _lora_shapes(model).items()
                                             if n in lo.targets and n != "q_proj"
                                             and n != "k_proj" and n != "v_proj")
                + attention_backward_extra_fp32(attention, dm))
        extra_last = extra_first = kbit_backward_extra(dm, attn, lo.targets, lo.rank,
                                                     lo.dropout)
    phases[PHASES[4]] = base + after_loss + dh + extra_last + (a_last if checkpointing else 0)
    if checkpointing:  # the later layers' inputs are freed, layer 0 is recomputed
        at_first = after_loss - (L - 1) * stream * dm.t * dm.h + a_first
    else:
        at_first = after_loss - (L - 1) * a_rest
    phases[PHASES[5]] = base + at_first + (L - 1) * g_layer + dh + extra_first
    if liger and not checkpointing:  # the MLPs of the last layer and layer 0 (train_liger.py)
        phases.update(lora_liger_moments(
            dm, lo.rank, lo.e, lo.dropout > 0, lo.targets, last,
            base + shared + masks + layers_saved,
            base + after_loss + dh, _lora_attention_extra(model, dm, attention, last, lo), first,
            base + at_first + (L - 1) * g_layer + dh,
            _lora_attention_extra(model, dm, attention, first, lo)))
    elif liger:  # checkpointed: each layer recomputed inside its backward (train_liger.py).
        # transformers' checkpointing enable calls enable_input_require_grads (modeling_utils.py
        # _activation_checkpointing_enable, for every input_ids model), so layer 0's input
        # requires grad and layer 0 keeps what the later layers keep.
        phases.update(lora_liger_ckpt_moments(
            dm, lo.rank, lo.e, lo.dropout > 0, lo.targets, rest, rest,
            base + after_loss, base + after_loss + dh,
            base + after_loss - (L - 1) * stream * dm.t * dm.h + (L - 1) * g_layer + dh,
            _core_saved(rest), _core_saved(rest), _attention_forward_extra(attention, dm),
            _lora_attention_extra(model, dm, attention, rest, lo),
            _lora_attention_extra(model, dm, attention, rest, lo)))
    if optimizer == "adamw":
        tmp = ceil_bytes(Fraction(opt, 2))
    phases[PHASES[7]] = before + grads + tmp
    phase = max(phases, key=phases.__getitem__)
    return TrainingStepMemory(
        weights_bytes=weights, gradients_bytes=grads, optimizer_bytes=opt + paged,
        optimizer_paged_bytes=paged, activations=parts,
        buffers_bytes=0, before_step_bytes=before, peak_bytes=phases[phase], peak_phase=phase,
        phases=phases, activation_terms=tuple(terms), layout=lay, attention=attention,
        precision="bf16", checkpointing=checkpointing)
