"""Memory of one training step of a whole model: weights, gradients, AdamW state, activations.

What is predicted is what the training-step measurement records (`python -m attnmem.measure
--train`): a `transformers` *ForCausalLM built from a config, one warm-up step, then one
measured step (forward, loss, backward, optimizer step, zero_grad(set_to_none=True)).
before-step = `memory_allocated()` after the warm-up; peak = `max_memory_allocated()` over the
measured step.

`training_step` composes the parts of the model, each in its own module with the sources of its
terms: attnmem/calc/train_dense.py (what a dense decoder's layers and head keep for the
backward; RMSNorm, gated MLP, attention per implementation, GPT-2, amp_bf16),
attnmem/calc/train_packed.py (packed sequences and attention masks), attnmem/calc/train_lora.py
(LoRA and QLoRA on a frozen base), attnmem/calc/train_moe.py (mixture-of-experts blocks and
expert parallelism), attnmem/calc/train_gpt_oss.py (gpt-oss), attnmem/calc/parallel.py
(weights, gradients, optimizer state and buffers per GPU under DDP, ZeRO, FSDP and tensor
parallelism), and attnmem/calc/train_common.py (accepted values, phases, parts, the result
and the notation).

The step (`training_step`): before-step = weights + optimizer state (+ the buffers a parallel
layout keeps); the peak is the largest of the moments listed in `PHASES`, each a sum of the
tensors alive then:
- "forward: attention of the last layer": activations of L−1 layers + the last layer's up to its
  attention + that call's forward transient;
- "loss backward (log-softmax)": every activation, the bf16 logits, the saved log-softmax, the
  gradient of nll_loss and log_softmax's gradient (4TV each);
- "backward of the last layer" / "backward of layer 0": activations of the layers not yet
  done, the gradients already made, and the larger of the attention call's backward extra peak
  and the MLP's backward (three 2TI gradients);
- "backward of the tied embedding" (tied models only): every gradient, lm_head's weight gradient
  still waiting in autograd's input buffer of the shared parameter, the embedding's own weight
  gradient (embedding_dense_backward's zeroed V×h), and, in bf16, their sum made out of place
  (torch/csrc/autograd/input_buffer.cpp, InputBuffer::accumulate: in place only when one side
  is a plain tensor it holds the last reference to; under amp lm_head's gradient is the fresh
  fp32 cast of the weight copy's, and the sum goes into it). Measured on the H200 (tied Gemma 2,
  Gemma 3, Qwen3, Llama 3.2, bf16, 1,000 tokens): the step peaks here, at before-step +
  gradients + 2 × the V×h gradient, within 0.2 %;
- "optimizer step": weights, gradients, both moments and one temporary of the parameter size:
  torch.optim.AdamW's default foreach path (torch/optim/adam.py _multi_tensor_adam) allocates
  `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)` for all parameters at once.
AdamW state (Loshchilov & Hutter, arXiv 1711.05101): exp_avg and exp_avg_sq in the parameter
dtype (torch keeps state like the parameter: bf16 under "bf16", fp32 under "amp_bf16").
Parallel layouts: attnmem.calc.parallel.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction

from attnmem.calc.backends import no_fit_without_kernel
from attnmem.calc.fit import largest_fitting
from attnmem.calc.models import ModelConfig, check_model
from attnmem.calc.parallel import Layout, expert_params, layout_bytes, make_layout
from attnmem.calc.params import param_breakdown

# The `X as X` names are re-exported: the rest of calc, the pages, the command line, the
# measurement and the tests import the training model's public names from here.
from attnmem.calc.train_common import CUBLAS_WORKSPACE_BYTES as CUBLAS_WORKSPACE_BYTES
from attnmem.calc.train_common import HEAD_LABELS, PARTS, _check_args, _Dims, _dims
from attnmem.calc.train_common import OPTIMIZERS as OPTIMIZERS
from attnmem.calc.train_common import PHASES as PHASES
from attnmem.calc.train_common import PRECISIONS as PRECISIONS
from attnmem.calc.train_common import TRAIN_ATTENTION_LABELS as TRAIN_ATTENTION_LABELS
from attnmem.calc.train_common import TRAIN_ATTENTIONS as TRAIN_ATTENTIONS
from attnmem.calc.train_common import TrainingStepMemory as TrainingStepMemory
from attnmem.calc.train_dense import (
    _attention_forward_extra,
    _check_supported,
    _core_saved,
    _labels_bytes,
    _layer_backward_extra,
    _layer_terms,
    _model_terms,
)
from attnmem.calc.train_gpt_oss import GPT_OSS_ATTENTIONS as GPT_OSS_ATTENTIONS
from attnmem.calc.train_gpt_oss import _check_gpt_oss_args, _gpt_oss_attention_forward_extra
from attnmem.calc.train_liger import LIGER_PHASE as LIGER_PHASE
from attnmem.calc.train_liger import (
    check_liger,
    flce_forward_extra,
    liger_layer_terms,
    liger_model_terms,
)
from attnmem.calc.train_lora import ADAPTER_DTYPES as ADAPTER_DTYPES
from attnmem.calc.train_lora import BASE_DTYPES as BASE_DTYPES
from attnmem.calc.train_lora import LORA_PART as LORA_PART
from attnmem.calc.train_lora import LORA_TARGET_SETS as LORA_TARGET_SETS
from attnmem.calc.train_lora import LoRA as LoRA
from attnmem.calc.train_lora import _check_lora, _check_lora_model, _lora_step
from attnmem.calc.train_lora import lora_adapter_params as lora_adapter_params
from attnmem.calc.train_moe import MOE_MODEL_TYPES as MOE_MODEL_TYPES
from attnmem.calc.train_moe import NORM_TOPK_DEFAULT as NORM_TOPK_DEFAULT
from attnmem.calc.train_moe import SENTINEL_LABEL as SENTINEL_LABEL
from attnmem.calc.train_moe import _aux_loss_terms, _check_moe_args
from attnmem.calc.train_optimizer import LIBRARY_OPTIMIZERS, optimizer_state, param_tensors
from attnmem.calc.train_packed import PACKED_ATTENTIONS as PACKED_ATTENTIONS
from attnmem.calc.train_packed import PACKED_REFUSED as PACKED_REFUSED
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
from attnmem.calc.train_packed import check_packed as check_packed
from attnmem.calc.train_recipes import check_kbit, check_offload, offload_phases
from attnmem.calc.train_trl_loss import LOSSES as LOSSES
from attnmem.calc.train_trl_loss import TRL_HEAD_BACKWARD as TRL_HEAD_BACKWARD
from attnmem.calc.train_trl_loss import TRL_HEAD_FORWARD as TRL_HEAD_FORWARD
from attnmem.calc.train_trl_loss import check_loss, trl_fused_step
from attnmem.calc.units import MAX_BATCH, MAX_SEQ_LEN, ceil_bytes, check_bool, check_int


def training_step(
    model: ModelConfig,
    batch: int,
    seq_len: int,
    *,
    attention: str,
    precision: str = "bf16",
    checkpointing: bool = False,
    optimizer: str = "adamw",
    gpus: int = 1,
    tp: int = 1,
    sharding: str = "none",
    use_cache: bool = False,
    adapters: LoRA | None = None,
    base_dtype: str = "bf16",
    ep: int = 1,
    norm_topk_prob: bool | None = None,
    router_aux_loss: bool = False,
    packed_lengths: tuple[int, ...] | None = None,
    kbit_prepare: bool = False,
    liger: bool = False,
    offload_activations: bool = False,
    loss: str = "full",
) -> TrainingStepMemory:
    """Per-GPU memory of one training step (module docstring: every term and its source).

    attention: TRAIN_ATTENTIONS; precision: "bf16" | "amp_bf16"; checkpointing: full per-layer
    activation checkpointing as gradient_checkpointing_enable() sets it; optimizer: "adamw"
    (torch's default foreach path), "adamw_fused" (no temporaries), "sgd" (torch.optim.SGD
    with its default momentum 0: no state), or, counted per tensor in
    attnmem/calc/train_optimizer.py, "adamw_8bit" (bitsandbytes AdamW8bit), "paged_adamw_8bit"
    (PagedAdamW8bit: optimizer_bytes counts all its state, optimizer_paged_bytes the part in
    CUDA unified memory, which before_step_bytes, the phases and peak_bytes leave out, as
    max_memory_allocated does) and "adafactor" (transformers Adafactor, defaults);
    gpus, tp, sharding: the parallel layout (attnmem.calc.parallel: "none" = DDP replicas when
    gpus > tp, "zero1", "zero2", "zero3", "fsdp"); use_cache: whether the forward builds a
    KV cache (the measured step passes use_cache=False; transformers' own default is on).
    adapters: None (full training) or LoRA(rank, alpha, targets, dropout, adapter_dtype): a
    frozen base with peft LoRA adapters (attnmem/calc/train_lora.py); base_dtype:
    BASE_DTYPES, "nf4"/"nf4_dq" (QLoRA) only with adapters.
    MoE (Mixtral, Qwen2/3-MoE, gpt-oss; attnmem/calc/train_moe.py): ep, the
    expert-parallel degree (a divisor of gpus / tp and of the experts per layer: each rank
    holds E/ep experts, tokens go to them by all-to-all); norm_topk_prob (None: NORM_TOPK_DEFAULT of the model type);
    router_aux_loss: output_router_logits=True (the load-balancing loss; transformers' configs
    default it to False).
    packed_lengths: None (dense rows) or the lengths of the sequences packed into one row
    (padding-free training: batch 1, seq_len = their sum, position_ids restarting at each;
    attnmem/calc/train_packed.py; PACKED_ATTENTIONS say which attentions, and why the
    others are refused).
    Recipe levers (issue 43): kbit_prepare: peft's prepare_model_for_kbit_training before
    get_peft_model (QLoRA; attnmem/calc/train_recipes.py); liger: Liger's kernels as
    apply_liger_kernel_to_llama patches them (attnmem/calc/train_liger.py);
    offload_activations: saved tensors in pinned host memory (torch.autograd.graph.save_on_cpu;
    with checkpointing, transformers' offload=True; attnmem/calc/train_recipes.py).
    loss: "full" (transformers' own loss: the logits and cross_entropy's log-softmax) or
    "trl_fused" (TRL's fused LM head, trl >= 1.16's SFTTrainer: no (B, s, V) tensor;
    attnmem/calc/train_trl_loss.py), with liger=True Liger's layer kernels beside it (TRL turns
    Liger's fused cross-entropy off).
    Raises ValueError naming the bad value and what is accepted.
    """
    check_model(model)
    _check_supported(model)
    b = check_int("batch", batch, 1, MAX_BATCH)
    s = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
    _check_args(attention, precision, optimizer)
    check_bool("checkpointing", checkpointing)
    norm_topk, aux = _check_moe_args(model, ep, norm_topk_prob, router_aux_loss, precision,
                                     tp, adapters)
    lay = make_layout(model, gpus, tp, sharding, ep)
    if optimizer in LIBRARY_OPTIMIZERS and lay.tp > 1:
        raise ValueError(f"optimizer {optimizer!r} with tp={lay.tp}: per-tensor state is counted "
                         "for whole tensors only; accepted with tp > 1: adamw, adamw_fused, sgd")
    cache = check_bool("use_cache", use_cache)
    lengths = check_packed(model, packed_lengths, b, s, attention, cache)
    if not isinstance(base_dtype, str) or base_dtype not in BASE_DTYPES:
        raise ValueError(f"unknown base_dtype {base_dtype!r}; accepted: {', '.join(BASE_DTYPES)}")
    kbit = check_kbit(model, kbit_prepare, adapters, base_dtype, attention, checkpointing,
                      lengths)
    lig = check_liger(model, liger, precision, kbit, lay.tp)
    off = check_offload(offload_activations, lengths, model, adapters, lig)
    trl = check_loss(loss, precision=precision, kbit=kbit, offload=off, tp=lay.tp,
                     sharding=lay.sharding, use_cache=cache)
    if adapters is not None:
        lo = _check_lora(adapters)
        _check_lora_model(model, precision, gpus, tp, sharding)
        st = _lora_step(model, b, s, attention, checkpointing, optimizer, cache, lo, base_dtype,
                        lengths, kbit, lig, off)
        # a frozen lm_head: no weight gradient in the head's backward; no step buffers
        return trl_fused_step(st, model, b, s, lengths, st.before_step_bytes, False) if trl \
            else st
    if base_dtype != "bf16":
        raise ValueError(f"base_dtype {base_dtype!r} without adapters: a 4-bit base has no "
                         "trainable weights; pass adapters=LoRA(...) (QLoRA)")
    amp = precision == "amp_bf16"
    if model.model_type == "gpt_oss":
        _check_gpt_oss_args(attention, cache)
    dm = dataclasses.replace(_dims(model, b, s, lay.tp), ep=lay.ep, lengths=lengths,
                             window=_packed_window(model, lengths))
    pb = param_breakdown(model)
    fwd = _forward(model, dm, attention, amp, cache, checkpointing, norm_topk, aux, lay.tp, pb,
                   lig)
    st = _full_step(model, dm, attention, precision, checkpointing, optimizer, lay, pb, fwd,
                    lig, off)
    if not trl:
        return st
    base = st.before_step_bytes + layout_bytes(model, lay, precision)["step_buffers"]
    return trl_fused_step(st, model, b, s, lengths, base, True)


@dataclass(frozen=True)
class _Forward:
    """What the forward of a full-training step leaves for the moments (`_forward`)."""

    terms: list[tuple[str, str, int]]  # every tensor alive at the end of the forward
    layer: list[tuple[str, str, int]]  # the larger kind of layer (masked or not)
    a_layer: int  # that layer's bytes
    layers_total: int  # every layer's bytes, each kind counted exactly
    layer_copies: int  # one layer's bf16 copies of its linear weights (amp_bf16), else 0


def _forward(model: ModelConfig, dm: _Dims, attention: str, amp: bool, cache: bool,
             checkpointing: bool, norm_topk: bool, aux: bool, tp: int, pb: dict[str, int],
             liger: bool = False) -> _Forward:
    """The tensors a full-training step keeps at the end of its forward: the layers' (or the
    checkpoints'), the model's, a packed row's, the auxiliary loss's and autocast's copies."""
    L = model.num_layers
    masked = _masked_layers(model, attention, dm)
    _check_kernel(model, attention, dm.s, masked, dm.lengths)
    kinds = [(n, mk, _layer_terms(model, dm, attention, amp, cache and not checkpointing, mk,
                                  norm_topk))
             for n, mk in ((masked, True), (L - masked, False)) if n]
    if liger:
        kinds = [(n, mk, liger_layer_terms(k, dm)) for n, mk, k in kinds]
    # The moments take the larger kind of layer; the layers' total is exact.
    layer = max((k for _, _, k in kinds), key=lambda k: sum(x for _, _, x in k))
    a_layer = sum(x for _, _, x in layer)
    layers_total = sum(n * sum(x for _, _, x in k) for n, _, k in kinds)
    terms: list[tuple[str, str, int]] = []
    stream = 4 if amp else 2  # bytes of one residual-stream element
    if checkpointing:
        terms.append(("residuals", f"layer inputs kept by the checkpoints ({L} × T·h)",
                      L * stream * dm.t * dm.h))
        terms += _checkpoint_terms(model, dm, attention, masked, stream)
    else:
        for n, mk, kind in kinds:
            what = "" if not mk else " with a packed-sequence mask" if dm.lengths else \
                " with a sliding-window mask"
            terms += [(p, f"{lab} (× {n} layers{what})", n * x) for p, lab, x in kind]
    model_terms = _model_terms(model, dm, amp, attention)
    if liger:  # the fused loss saves lm_head's weight gradient (bf16 full training, tp = 1)
        model_terms = liger_model_terms(model_terms, dm, 2 * pb["lm_head"])
    terms += model_terms
    terms += _packed_terms(dm, attention)
    if aux:
        terms += _aux_loss_terms(model, dm)
    layer_copies = 0
    if amp:  # autocast's bf16 copies of every linear weight, kept by the matrix products
        head = pb["lm_head"] + (pb["embeddings"] if model.tie_embeddings else 0)
        layer_copies = ceil_bytes(Fraction(2 * (pb["attention"] + pb["mlp"]), tp * L))
        # Under checkpointing the layers' copies die with autocast's cache at the end of the
        # forward (nothing saved them) and are made again by each layer's recomputation.
        terms.append(("weight copies (autocast)", "bf16 copy of lm_head's weight",
                      ceil_bytes(Fraction(2 * head, tp))))
        if not checkpointing:
            terms.append(("weight copies (autocast)",
                          f"bf16 copies of the layers' linear weights (× {L} layers)",
                          L * layer_copies))
        # (Under checkpointing the recomputed layer's copies were not seen in the peak of the
        # CPU replay of the step (NOTES.md): not added.)
    return _Forward(terms, layer, a_layer, layers_total, layer_copies)


def _full_step(model: ModelConfig, dm: _Dims, attention: str, precision: str,
               checkpointing: bool, optimizer: str, lay: Layout, pb: dict[str, int],
               fwd: _Forward, liger: bool = False, offload: bool = False,
               ) -> TrainingStepMemory:
    """The moments of a full-training step (dense or MoE; module docstring) from what its
    forward keeps and what the layout holds per GPU (attnmem.calc.parallel)."""
    L = model.num_layers
    amp = precision == "amp_bf16"
    stream = 4 if amp else 2  # bytes of one residual-stream element
    terms, layer, a_layer = fwd.terms, fwd.layer, fwd.a_layer
    layers_total, layer_copies = fwd.layers_total, fwd.layer_copies
    w = layout_bytes(model, lay, precision)
    parts = dict.fromkeys(PARTS, 0)
    for p, _, x in terms:
        parts[p] += x
    acts = sum(parts.values())

    weights, grads = w["weights"], w["gradients"]
    opt = 0 if optimizer == "sgd" else w["optimizer"]
    paged = tmp = 0
    if optimizer in LIBRARY_OPTIMIZERS:
        st = optimizer_state(optimizer, param_tensors(model), 4 if amp else 2,
                             lay.dp if lay.sharding != "none" else 1)
        opt, paged, tmp = st.device, st.paged, st.step_temporary
    fixed = CUBLAS_WORKSPACE_BYTES + _input_bytes(dm)
    before = weights + opt + w["persistent_buffers"] + fixed
    base = before + w["step_buffers"]
    g_per_param = Fraction(grads, sum(pb.values()))
    g_expert = g_per_param  # per-GPU gradient bytes per parameter of the routed experts
    px = expert_params(model)
    if lay.ep > 1:  # the experts' gradients follow their own group (attnmem.calc.parallel)
        g_per_param = Fraction(grads - w["expert_gradients"], sum(pb.values()) - px)
        g_expert = Fraction(w["expert_gradients"], px)
    g_layer = ceil_bytes((g_per_param * (pb["attention"] + pb["mlp"] - px
                                         + pb["norms"] - model.hidden_size)
                          + g_expert * px) / L)
    # lm_head's weight gradient (tied: the embedding's .grad, made by lm_head's backward).
    head_params = pb["embeddings"] if model.tie_embeddings else pb["lm_head"]
    g_head = ceil_bytes(g_per_param * (head_params + model.hidden_size))
    tv = dm.t * dm.vocab
    lsm = 4 * tv  # the saved log-softmax output
    tanh_logits = 2 * tv if model.model_type == "gemma2" else 0

    phases: dict[str, int] = {}
    head_saved = sum(x for p, lab, x in terms if lab.startswith(HEAD_LABELS)
                     or p == "logits and loss")
    shared = sum(x for _, lab, x in terms if lab.startswith("cos and sin"))
    masks = _mask_count(model) * stream * dm.b * dm.s * dm.s if attention == "eager" else 0
    masks += _packed_bool_masks(model, dm, attention)
    oss = model.model_type == "gpt_oss"
    # Forward, the last layer's attention call: L - 1 layers saved, the last one up to its
    # attention, the residual input, the model's masks (eager), and the call's transient
    # (eager: the masked scores (2N), softmax(dtype=float32)'s fp32 copy of them (4N) and its
    # output (4N, saved) before P exists).
    kept = (L - 1) * a_layer if not checkpointing else L * stream * dm.t * dm.h
    partial = a_layer - _core_saved(layer)
    fwd = _gpt_oss_attention_forward_extra(dm) if oss else _attention_forward_extra(attention, dm)
    phases[PHASES[0]] = base + shared + masks + kept + partial + fwd + stream * dm.t * dm.h
    # Forward, the final norm: every layer saved, the norm's input, its fp32 copy (saved), the
    # fp32 x·rsqrt product and its bf16 cast alive at once.
    layers_kept = L * a_layer if not checkpointing else L * stream * dm.t * dm.h
    final_norm = stream * dm.t * dm.h + (4 + 4 + 2) * dm.t * dm.h + 4 * dm.t
    if amp:  # x is fp32 already (saved as it is): x, x·rsqrt (saved), the weight product
        final_norm = (4 + 4 + 4) * dm.t * dm.h + 4 * dm.t
    if oss:  # the fp32 weight product and its bf16 cast beside the two saved fp32 copies
        final_norm = (2 + 4 + 4 + 4 + 2) * dm.t * dm.h + 4 * dm.t
    if liger:  # LigerRMSNorm: its input and output, one fp32 rstd per row
        final_norm = (2 + 2) * dm.t * dm.h + 4 * dm.t
    phases[PHASES[1]] = base + shared + masks + layers_kept + final_norm
    # Loss backward: nll_loss's gradient and log_softmax's gradient (fp32, T×V each) beside
    # every saved tensor (the bf16 logits died with the model output: `.loss` is all the
    # step keeps).
    phases[PHASES[2]] = base + acts + 2 * 4 * tv
    # lm_head backward: its bf16 output gradient (2TV), its input gradient and its weight
    # gradient (amp: the bf16 gradient of the weight copy, then its fp32 cast).
    g_lm = ceil_bytes(g_per_param * pb["lm_head"]) if not model.tie_embeddings else \
        ceil_bytes(g_per_param * pb["embeddings"])
    lm_w = 2 * ceil_bytes(Fraction(pb["lm_head"] or pb["embeddings"], lay.tp))
    before_lm = acts - lsm - tanh_logits - _labels_bytes(dm)
    if amp:
        lm = before_lm + 2 * dm.t * dm.h + max(2 * tv + lm_w, lm_w + g_lm)
    else:
        lm = before_lm + 2 * tv + 2 * dm.t * dm.h + g_lm
    phases[PHASES[3]] = base + lm
    if liger:  # the fused loss: no log-softmax, no logits' gradients, lm_head's done in it
        del phases[PHASES[2]], phases[PHASES[3]]
        phases[LIGER_PHASE] = base + acts + 2 * dm.t * dm.h + flce_forward_extra(
            dm, 2 * pb["lm_head"])    # Backward of a layer: what it saved (recomputed under checkpointing), the gradient of the
    # residual stream, the gradients already made, and the larger of its MLP backward and its
    # attention call's backward. By then the loss, lm_head and final norm have freed theirs.
    extra = _layer_backward_extra(layer, attention, dm, model, g_per_param, lay.tp, g_expert)
    after_loss = acts - head_saved
    dh = stream * dm.t * dm.h
    top = base + after_loss + g_head + dh + extra + (a_layer if checkpointing else 0)
    step_down = Fraction(stream * dm.t * dm.h) if checkpointing else \
        Fraction(layers_total - a_layer, max(L - 1, 1)) + layer_copies
    phases[PHASES[4]] = top
    phases[PHASES[5]] = ceil_bytes(top - (L - 1) * step_down + (L - 1) * g_layer)
    if model.tie_embeddings:
        # The embedding's backward, last in the step: every other gradient is made; the shared
        # weight's two gradients meet in autograd's input buffer (module docstring).
        g_emb = ceil_bytes(g_per_param * pb["embeddings"])
        phases[PHASES[6]] = base + grads + (g_emb if amp else 2 * g_emb)
    # Optimizer step: weights + gradients + state + the foreach temporary (AdamW).
    if optimizer == "adamw":
        tmp = ceil_bytes(Fraction(opt, 2))
    phases[PHASES[7]] = before + grads + tmp
    if offload:
        ckpt_in = L * stream * dm.t * dm.h if checkpointing else 0
        phases = offload_phases(
            phases, acts=acts, kept_fwd=kept,
            layers_kept=layers_kept, after_loss=after_loss, layer=a_layer,
            first=a_layer, layers_before_first=ceil_bytes(after_loss - (L - 1) * step_down),
            lsm=lsm, lm_in=2 * dm.t * dm.h,
            head_w=2 * ceil_bytes(Fraction(pb["lm_head"] or pb["embeddings"], lay.tp)),
            layer_w=2 * max(dm.inter, dm.q) * dm.h, ckpt_inputs=ckpt_in, stream_th=dh)
    phase = max(phases, key=phases.__getitem__)
    return TrainingStepMemory(
        weights_bytes=weights, gradients_bytes=grads, optimizer_bytes=opt + paged,
        optimizer_paged_bytes=paged, activations=parts,
        buffers_bytes=w["persistent_buffers"] + w["step_buffers"], before_step_bytes=before,
        peak_bytes=phases[phase], peak_phase=phase, phases=phases, activation_terms=tuple(terms),
        layout=lay, attention=attention, precision=precision, checkpointing=checkpointing)


def max_train_seq_len(model: ModelConfig, gpu_bytes: int, batch: int = 1, **kwargs) -> int:
    """Longest s whose training-step peak fits gpu_bytes (0 if none): exact integer search
    (attnmem.calc.fit.largest_fitting; the peak is non-decreasing in s)."""
    training_step(model, batch, 1, **kwargs)  # validates
    return largest_fitting(no_fit_without_kernel(
        lambda s: training_step(model, batch, s, **kwargs).peak_bytes), gpu_bytes)


def train_gpus_needed(model: ModelConfig, gpu_bytes: int, batch: int, seq_len: int, *,
                      sharding: str = "zero3", tp: int = 1, max_gpus: int = 4096,
                      **kwargs) -> int:
    """Fewest GPUs (a multiple of tp × ep, at most max_gpus) whose per-GPU peak fits
    gpu_bytes under `sharding`; 0 if none does (one replica's activations alone do not fit).
    kwargs may carry ep (MoE expert parallelism), which must divide the data-parallel ranks:
    the search steps in units of tp × ep GPUs.

    The per-GPU peak falls with N (every sharded term is a total over N; the FSDP gather term
    grows by less than one layer's parameters), so the search doubles, then bisects, then
    steps down while one fewer replica still fits: a handful of evaluations, not N."""
    check_int("max_gpus", max_gpus, 1, 1 << 20)
    t = check_int("tp", tp, 1, max_gpus)
    ep = check_int("ep", kwargs.get("ep", 1), 1, max_gpus)
    unit = t * ep

    def fits(replicas: int) -> bool:
        return training_step(model, batch, seq_len, gpus=replicas * unit, tp=t,
                             sharding=sharding, **kwargs).peak_bytes <= gpu_bytes

    top = max_gpus // unit
    if top < 1 or (sharding == "none" and not fits(1)):
        return 0
    if sharding == "none":
        return unit
    if not fits(top):
        return 0
    hi = 1
    while hi < top and not fits(hi):
        hi = min(2 * hi, top)
    lo = hi // 2  # does not fit (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    while hi > 1 and fits(hi - 1):
        hi -= 1
    return hi * unit


#: calc's largest GPU count (train_gpus_needed's bound, training_step accepts it): every
#: sharded term is next to nothing there.
MANY_GPUS = 1 << 20


def never_fits(model: ModelConfig, gpu_bytes: int, batch: int, seq_len: int,
               kw: dict) -> bool:
    """True when no number of GPUs fits this step (kw: training_step's keywords but gpus): at
    2^20 GPUs the sharded states are next to nothing, so what is left is one replica's
    activations, which more GPUs of this layout never split."""
    unit = kw.get("tp", 1) * kw.get("ep", 1)  # the GPU count must be a multiple of tp × ep
    return training_step(model, batch, seq_len, gpus=MANY_GPUS // unit * unit,
                         **kw).peak_bytes > gpu_bytes
