"""The recipe levers of a fine-tuning step (issue 43): peft's `prepare_model_for_kbit_training`
(`kbit_prepare`) and activation offloading to the CPU (`offload_activations`). Liger's kernels:
attnmem/calc/train_liger.py. attnmem/calc/training_step.py and train_lora.py compose them.
Notation: attnmem/calc/train_common.py.

kbit_prepare (peft 0.21, src/peft/utils/other.py, prepare_model_for_kbit_training, as the
QLoRA recipes call it before get_peft_model):
- `param.requires_grad = False` for every parameter (the base is frozen; peft adds adapters);
- every fp16/bf16 parameter that is not a bitsandbytes `Params4bit` gets
  `param.data = param.data.to(torch.float32)`: the embeddings, lm_head and every norm weight of
  a 4-bit model become fp32 (the bf16 storage is freed); the 4-bit linears stay as they are.
  Before-step grows by exactly 2 bytes per non-quantized parameter (`kbit_upcast_bytes`);
- for a model loaded in k-bit (`is_loaded_in_4bit`) and use_gradient_checkpointing=True (its
  default): `enable_input_require_grads()` (a forward hook on the input embeddings:
  `output.requires_grad_(True)`) when use_reentrant is not passed as False, then
  `gradient_checkpointing_enable(...)`; transformers 5 calls enable_input_require_grads there
  itself (modeling_utils.py, _activation_checkpointing_enable: needs_embedding_grads for an
  input_ids model). So layer 0 keeps what every other layer keeps.
What the fp32 casts do to the activations (no autocast, as the harness's step runs): the
embedding output is fp32, so the residual stream is fp32 from the first layer on; RMSNorm's
`hidden_states.to(float32)` is its input itself and `weight * x.to(input_dtype)` is fp32
(fp32 weight); bitsandbytes' Linear4bit.forward casts its input to the compute dtype (bf16)
and its output back: `bnb.matmul_4bit(x.to(compute_dtype), ...).to(inp_dtype)`
(bitsandbytes/nn/modules.py), so q, k, v, o, gate, up, down outputs are fp32; MatMul4Bit
saves no input (bitsandbytes/autograd/_functions.py: ctx.tensors = (None, B)). peft's
lora/bnb.py Linear4bit.forward: `result = result.clone()` (a transient), then
`_cast_input_dtype(x, lora_A.weight.dtype)`, a no-op for an fp32 input and fp32 adapters: the
adapters of q, k and v keep the one fp32 norm output between them, not a cast each. The
rotary cos and sin follow the hidden states' dtype (fp32); attention runs on fp32 q, k, v, so
only implementations that take fp32 run it (`KBIT_ATTENTIONS`: SDPA's memory-efficient
backend, which torch picks for fp32 on CUDA, and our Triton kernel); lm_head (fp32, frozen)
makes fp32 logits, which the loss's `logits.float()` does not copy.

offload_activations (torch/autograd/graph.py, save_on_cpu(pin_memory=True), as transformers'
activation_checkpointing_enable(offload=True) wraps each checkpoint and as a user wraps the
forward): every tensor autograd saves is packed by `torch.empty(size, pin_memory=True)` +
`copy_` into pinned host memory, and unpacked by `tensor.to(device)` when the node that saved
it runs its backward. So the GPU keeps none of the saved activations after they are consumed
by the forward; what stays on the GPU: weights, gradients, optimizer state, the forward's
live tensors of the layer being computed (counted as that layer's saved tensors: an upper
bound), the loss's transients, and in the backward the unpacked tensors of the layer being
differentiated (that layer's saved tensors again: a node's unpacked tensors die with it),
plus a GPU copy of every saved *parameter* as its node unpacks it (a linear keeps its weight
for the input gradient: pack copies the weight to the host too), so the backward adds the
largest weight matrix unpacked (lm_head's V×h at its backward, a layer's largest matrix in a
layer's). Pinned host memory is the host's: `offload_host_bytes` says how much (each node
packs its own copy of a tensor it saves, so a tensor saved by several nodes is counted once
here: a lower bound).
"""

from __future__ import annotations

from attnmem.calc.models import ModelConfig
from attnmem.calc.params import param_breakdown
from attnmem.calc.peak import attention_peak_terms
from attnmem.calc.train_common import _Dims
from attnmem.calc.train_dense import _GEMMA, _attention_core, _expands_kv, _labels_bytes
from attnmem.calc.units import check_bool

#: Attentions that run the fp32 q, k, v of a kbit-prepared model (attnmem.calc.attention_call
#: IMPL_DTYPES: SDPA flash, cuDNN and FA4 take bf16/fp16 only; eager's fp32 path is not counted).
KBIT_ATTENTIONS: tuple[str, ...] = ("sdpa_efficient", "triton")
#: Model types whose kbit-prepared layers are counted (Llama-family RMSNorm, separate
#: projections, no qk-norm).
KBIT_MODEL_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2")
LORA_PART = "LoRA adapters"


def check_kbit(model: ModelConfig, kbit: object, lora: object, base_dtype: str,
               attention: str, checkpointing: bool, lengths: tuple[int, ...]) -> bool:
    """Validate kbit_prepare=...; the reasons name what is not modelled and what is."""
    check_bool("kbit_prepare", kbit)
    if not kbit:
        return False
    if lora is None:
        raise ValueError("kbit_prepare=True without adapters: prepare_model_for_kbit_training "
                         "freezes every base parameter; pass adapters=LoRA(...) (QLoRA)")
    if base_dtype == "bf16":
        raise ValueError("kbit_prepare=True with base_dtype='bf16': on a model not loaded in "
                         "k-bit peft casts every bf16 parameter to fp32 (the whole base) and "
                         "turns no checkpointing on: an fp32 model, not modelled; accepted: "
                         "base_dtype 'nf4' or 'nf4_dq'")
    if model.model_type not in KBIT_MODEL_TYPES or model.qk_norm or model.model_type in _GEMMA:
        raise ValueError(f"kbit_prepare=True on {model.name!r} ({model.model_type}): the fp32 "
                         "layers are counted for " + ", ".join(KBIT_MODEL_TYPES)
                         + " (RMSNorm, separate projections, no qk-norm)")
    if attention not in KBIT_ATTENTIONS:
        raise ValueError(f"kbit_prepare=True with attention {attention!r}: the fp32 embeddings "
                         "make q, k, v fp32 (no autocast), which it does not run or is not "
                         f"counted for; accepted: {', '.join(KBIT_ATTENTIONS)} (torch's SDPA "
                         "picks its memory-efficient backend for fp32)")
    if not checkpointing:
        raise ValueError("kbit_prepare=True with checkpointing=False "
                         "(prepare_model_for_kbit_training(use_gradient_checkpointing=False)): "
                         "layer 0 without input gradients in fp32 is not counted; its default "
                         "turns checkpointing on: pass checkpointing=True")
    if lengths:
        raise ValueError("kbit_prepare=True with packed_lengths: not modelled (dense rows only)")
    return True


def kbit_upcast_bytes(model: ModelConfig) -> int:
    """The bytes the prepare step adds before the step: 2 per parameter that is not a 4-bit
    decoder linear (bf16 -> fp32: embeddings, lm_head unless tied, every norm weight)."""
    pb = param_breakdown(model)
    return 2 * (sum(pb.values()) - pb["attention"] - pb["mlp"])


def _adapter(name: str, fan_in: int, t: int, rank: int, dropout: float,
             ) -> list[tuple[str, str, int]]:
    """An fp32 adapter on an fp32 input: with dropout a bool mask (CUDA native_dropout) and the
    dropped fp32 input, kept by lora_A; without, lora_A keeps the shared input (the caller's);
    lora_A's T×r fp32 output, kept by lora_B."""
    out = []
    if dropout > 0:
        out += [(LORA_PART, f"{name}: lora dropout mask (bool, T×in)", t * fan_in),
                (LORA_PART, f"{name}: lora dropout output (fp32), kept by lora_A", 4 * t * fan_in)]
    return out + [(LORA_PART, f"{name}: lora_A output (fp32 T×r), kept by lora_B", 4 * t * rank)]


def kbit_layer_terms(dm: _Dims, impl: str, targets: tuple[str, ...], rank: int,
                     dropout: float) -> list[tuple[str, str, int]]:
    """One decoder layer of a kbit-prepared QLoRA model (module docstring): fp32 residual stream,
    frozen fp32 norms, 4-bit linears with fp32 outputs, fp32 adapters; every layer's input
    requires grad (enable_input_require_grads)."""
    t, h, i = dm.t, dm.h, dm.inter
    tg = set(targets)
    keep = dropout == 0  # lora_A keeps its (shared) input only without dropout
    shapes = {"q_proj": h, "k_proj": h, "v_proj": h, "o_proj": dm.q,
              "gate_proj": h, "up_proj": h, "down_proj": i}

    def adapters(names: tuple[str, ...]) -> list[tuple[str, str, int]]:
        out = []
        for n in names:
            if n in tg:
                out += _adapter("o_proj input: o_proj" if n == "o_proj" else n, shapes[n], t,
                                rank, dropout)
        return out

    def norm(where: str) -> list[tuple[str, str, int]]:  # frozen fp32 weight: no output kept
        return [("residuals", f"{where}: its fp32 input (the residual stream), kept by pow",
                 4 * t * h),
                ("norms", f"{where}: rsqrt of the mean square (fp32)", 4 * t)]

    expand = _expands_kv(impl, dm)
    kv = dm.q if expand else dm.k
    terms = norm("input norm")
    if keep and tg & {"q_proj", "k_proj", "v_proj"}:
        terms.append(("projections", "q, k, v adapters' input: the fp32 norm output (one "
                      "tensor: no cast)", 4 * t * h))
    terms += adapters(("q_proj", "k_proj", "v_proj"))
    terms += [("rotary", "q after rotary (fp32, saved by attention)", 4 * t * dm.q),
              ("rotary", "k after rotary (fp32)" + (" repeated to H heads" if expand else ""),
               4 * t * kv),
              ("attention", "v (fp32)" + (" repeated to H heads" if expand else ""), 4 * t * kv)]
    for p, lab, x in _attention_core(impl, dm, _NoModel, False):
        if lab.startswith("attention output"):
            terms.append((p, "attention output (fp32), kept by the kernel", 2 * x))
        else:
            terms.append((p, lab, x))
    if impl == "triton" and keep and "o_proj" in tg:  # (B, H, s, d) made contiguous
        terms.append(("projections", "o_proj input (fp32 attention output made contiguous), "
                      "kept by its adapter", 4 * t * dm.q))
    terms += adapters(("o_proj",))
    terms += norm("post-attention norm")
    if keep and tg & {"gate_proj", "up_proj"}:
        terms.append(("projections", "gate, up adapters' input: the fp32 norm output", 4 * t * h))
    terms += adapters(("gate_proj", "up_proj"))
    terms += [("MLP", "gate(x) (fp32), kept by the activation", 4 * t * i),
              ("MLP", "act(gate(x)) (fp32), kept by the product", 4 * t * i),
              ("MLP", "up(x) (fp32), kept by the product", 4 * t * i)]
    if keep and "down_proj" in tg:
        terms.append(("MLP", "act(gate(x))·up(x) (fp32), kept by down_proj's adapter", 4 * t * i))
    terms += adapters(("down_proj",))
    return terms


class _NoModel:  # _attention_core reads model_type only for eager (Gemma 2 soft-capping)
    model_type = ""


def kbit_model_terms(dm: _Dims) -> list[tuple[str, str, int]]:
    """Model-level terms of a kbit-prepared model: the frozen fp32 final norm keeps its fp32
    input and rsqrt; lm_head (frozen, fp32) keeps no input; its fp32 logits are the loss's input
    (`logits.float()` is the tensor itself) and die after log_softmax, which keeps its output."""
    t, v = dm.t, dm.vocab
    return [("embeddings", "embedding output (fp32): kept as layer 0's checkpoint input", 0),
            ("residuals", "final norm: its fp32 input, kept by pow", 4 * t * dm.h),
            ("norms", "final norm: rsqrt of the mean square (fp32)", 4 * t),
            ("rotary", "cos and sin (fp32, shared by all layers)", 2 * 4 * dm.s * dm.d),
            ("logits and loss", "log-softmax output (fp32), kept by cross_entropy", 4 * t * v),
            ("logits and loss", "shifted labels (int64) and the loss", _labels_bytes(dm))]


def kbit_backward_extra(dm: _Dims, attn_extra_fp32: int, targets: tuple[str, ...], rank: int,
                        dropout: float) -> int:
    """The largest excess of a kbit-prepared layer's backward over its recomputed saved tensors
    and the incoming fp32 gradient, less the layer's input counted twice. Candidates:
    - the MLP product's backward: d(act) and d(up) beside the product's gradient (3·4TI) plus
      down's adapter gradients made by then; the product itself is freed by then when down's
      lora_A (no dropout) was its only holder (MatMul4Bit saves no input);
    - a 4-bit linear's input gradient (bitsandbytes/autograd/_functions.py MatMul4Bit.backward:
      `torch.matmul(grad_output, F.dequantize_4bit(B, ctx.state).to(grad_output.dtype))`, at
      T > 1536 rows the dequantized out×in bf16 weight is a full temporary, freed when the
      matmul returns; Linear4bit.forward's `.to(inp_dtype)` and `x.to(compute_dtype)` make the
      gradient bf16 and back fp32). peft adds the adapter's output after the base's, so autograd
      (later nodes first) runs the adapter's backward first: its fp32 input gradient (4T·in;
      down_proj's input freed with lora_A's saved tensors) is held while the base runs, and the
      base's fp32 gradient is then added into it in place (InputBuffer accumulates in place when
      it holds the last reference). Two moments: the matmul (bf16 output gradient 2T·out, the
      dequantized weight 2·out·in, the bf16 input gradient 2T·in) and the cast (2T·in and
      4T·in). A dequantized weight is alive at its matmul moment only, not added to the
      other candidates (as train_lora's bf16-base QLoRA adds the largest to every one);
    - the attention call's fp32 backward (attn_extra_fp32, attnmem.calc.peak at dtype fp32).
    Less 4Th: the input norm's fp32 input that kbit_layer_terms counts is the layer's input
    itself (`hidden_states.to(torch.float32)` returns an fp32 tensor as it is), which the
    checkpoint already keeps (the `inputs` term; kbit_prepare requires checkpointing).
    Replayed on the meta device at the issue-43 rows' shapes (tests/calc/test_kbit_replay.py):
    the layers' backward moment within 0.1 % (the replay's dispatch mode makes autograd add out
    of place, which the MLP product moment ties)."""
    t, h, i = dm.t, dm.h, dm.inter
    shapes = {"q_proj": (h, dm.q), "k_proj": (h, dm.k), "v_proj": (h, dm.k),
              "o_proj": (dm.q, h), "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    down = "down_proj" in targets
    # down's adapter gradients are made, and lora_B's saved input (lora_A's T×r output) freed
    mlp = 3 * 4 * t * i + (4 * rank * (i + h) - 4 * t * rank if down else 0)
    if down and dropout == 0:  # the saved product is freed by then
        mlp -= 4 * t * i

    def base(name: str) -> int:
        fan_in, fan_out = shapes[name]
        held = 0
        if name in targets:  # its adapter's input gradient; lora_A's T×r output freed
            held = 4 * t * fan_in - 4 * t * rank
            if dropout > 0:  # the dropped input and its mask, kept for lora_A only
                held -= 5 * t * fan_in
            elif name == "down_proj":  # the product, kept by lora_A only
                held -= 4 * t * fan_in
        matmul = 2 * t * fan_out + 2 * fan_in * fan_out + 2 * t * fan_in
        return held + max(matmul, 6 * t * fan_in)

    linears = max(base(n) for n in shapes)
    return max(mlp, linears, attn_extra_fp32) - 4 * t * h


def attention_backward_extra_fp32(impl: str, dm: _Dims) -> int:
    """The fp32 attention call's backward beyond what it saved (attnmem.calc.peak at fp32, as
    train_dense._attention_backward_extra at bf16)."""
    terms = attention_peak_terms(impl, dm.b, dm.heads, dm.s, dm.d, "fp32", causal=True,
                                 backward=True, kv_heads=dm.kv_heads)
    saved = ("output (saved", "log-sum-exp", "k, v expanded", "probabilities P kept")
    return sum(x for label, x in terms if not label.startswith(saved))


def check_offload(offload: object, lengths: tuple[int, ...], model: ModelConfig,
                  adapters: object, liger: bool) -> bool:
    check_bool("offload_activations", offload)
    if offload and adapters is not None:
        raise ValueError("offload_activations=True with adapters (LoRA/QLoRA): not counted yet; "
                         "counted for full training")
    if offload and liger:
        raise ValueError("offload_activations=True with liger=True: the fused loss's saved "
                         "gradients would be packed to the host too; not counted")
    if offload and lengths:
        raise ValueError("offload_activations=True with packed_lengths: not modelled")
    if offload and (model.num_experts > 1 or model.model_type in ("gpt2", "gpt_oss")):
        raise ValueError(f"offload_activations=True on {model.name!r} ({model.model_type}): "
                         "counted for dense Llama-family decoders only")
    return bool(offload)


def offload_phases(phases: dict[str, int], *, acts: int, kept_fwd: int, layers_kept: int,
                   after_loss: int, layer: int, first: int, layers_before_first: int,
                   lsm: int, lm_in: int, head_w: int, layer_w: int, ckpt_inputs: int,
                   stream_th: int) -> dict[str, int]:
    """The moments of a step under save_on_cpu (module docstring), from the same moments
    without it: every saved activation leaves the GPU; what comes back is the layer (or the
    loss, or lm_head) being differentiated, and the saved weight its node unpacks.
    kept_fwd: the saved bytes counted at the forward's last attention (earlier layers);
    layers_kept: at the final norm; after_loss: at the last layer's backward;
    layers_before_first: saved bytes of the layers still undone at layer 0's backward;
    ckpt_inputs: under checkpointing, the layer inputs the checkpoints keep (else 0)."""
    from attnmem.calc.train_common import PHASES
    out = dict(phases)
    out[PHASES[0]] -= kept_fwd
    out[PHASES[1]] -= layers_kept
    out[PHASES[2]] += lsm - acts
    if PHASES[3] in out:
        out[PHASES[3]] += lm_in + head_w - (acts - lsm)
    # A layer's backward: its own saved tensors come back (under checkpointing its input,
    # then the recomputation keeps them on the GPU as usual), with its largest weight.
    # (The recomputation runs outside save_on_cpu: its weights are saved as they are.)
    back, w = (stream_th, 0) if ckpt_inputs else (layer, layer_w)
    out[PHASES[4]] += back + w - after_loss
    out[PHASES[5]] += (stream_th if ckpt_inputs else first) + w - layers_before_first
    return out


def offload_host_bytes(acts: int) -> int:
    """Pinned host bytes that hold the saved activations (one copy of each saved tensor)."""
    return acts
