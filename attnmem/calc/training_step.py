"""Memory of one training step of a whole model: weights, gradients, AdamW state, activations.

What is predicted is what the training-step measurement records (`python -m attnmem.measure
--train`): a `transformers` *ForCausalLM built from a config, one warm-up step, then one
measured step (forward, loss, backward, optimizer step, zero_grad(set_to_none=True)).
before-step = `memory_allocated()` after the warm-up; peak = `max_memory_allocated()` over the
measured step.

Every activation term is a count of the tensors that autograd saves, read from the modules of
`transformers` 5 (models/llama/modeling_llama.py and the files built from it:
modeling_mistral.py, modeling_qwen2.py, modeling_qwen3.py, modeling_gemma2.py,
modeling_gemma3.py; loss_utils.py ForCausalLMLoss) and from the backward formulas of PyTorch
(attnmem/kernels/dev/autograd/derivatives.yaml: which inputs or outputs each op saves). Notation: T = B·s
tokens, h hidden size, q = H·d and k = H_kv·d the query and key/value widths, I the MLP width,
V the vocabulary, N = B·H·s² score elements, e bytes of an activation element (2 in both
precisions: bf16, or the bf16 outputs of autocast's matrix products).

Per layer (bf16 parameters; `_layer_terms` lists every tensor with its label):
- RMSNorm (Llama: `x.to(float32)`, `x.pow(2)`, `x * rsqrt(var + eps)`, `weight * x.to(bf16)`):
  pow saves the fp32 copy (4Th), mul saves rsqrt (4T), the last mul saves the bf16 normalized
  input (2Th). Gemma's `output * (1 + weight.float())` saves the fp32 normalized input instead
  (4Th) and the fp32 (1 + w) (4h).
- q/k/v and gate/up projections save their input, the norm's output (2Th, once per norm);
  o_proj saves the attention output (2Tq), down_proj the gated product (2TI).
- Rotary (apply_rotary_pos_emb: `q * cos + rotate_half(q) * sin`) saves only cos and sin
  (computed once per forward, shared by all layers); the rotated q and k (2Tq, 2Tk) are the
  attention's saved inputs. With qk-norm (Qwen3, Gemma 3) q_norm/k_norm save an fp32 copy of q
  and k, a rsqrt per head and their normalized input.
- SiLU/GELU-gated MLP (`down(act(gate(x)) * up(x))`): act saves gate(x), the product saves
  act(gate(x)) and up(x), down saves the product: 4 tensors of 2TI.
- Attention per implementation: eager (transformers' eager_attention_forward) saves the fp32
  softmax output (4N, softmax(dtype=float32)), the bf16 probabilities (2N, kept by P·V), and
  key/value repeated to H heads (repeat_kv) in place of the originals; Gemma 2 adds tanh of the
  soft-capped scores (2N). Fused kernels (SDPA flash/efficient/cuDNN, ours, FA4) save the output
  and an fp32 log-sum-exp per row (Dao et al. 2022, arXiv 2205.14135, sec. 3.1); SDPA's
  memory-efficient backend repeats k, v to H heads (no enable_gqa path). The backward's extra
  peak of one call is attnmem.calc.attention_peak_bytes (measured exact on an H200).
- Residual adds save nothing. Under checkpointing (torch.utils.checkpoint, use_reentrant=False
  as transformers 5 sets it in PreTrainedModel._activation_checkpointing_enable) a layer keeps
  only its input hidden state (2Th) and recomputes the rest in its backward (Chen et al. 2016,
  arXiv 1604.06174).

These are Korthikanti et al. 2022 (arXiv 2205.05198, sec. 4.1) counts redone for what these
modules really allocate: their 34·s·b·h + 5·a·s²·b per layer assumes a LayerNorm, a GELU MLP
of 4h and dropout masks; an RMSNorm that upcasts, a gated MLP of I, no dropout and an fp32
softmax give the terms above.

Model level: the embedding output is not saved (its backward needs the ids only); the final norm
as above; lm_head saves its input; the logits (2TV, bf16) are held by the model output; the loss
upcasts them (`logits.float()`, 4TV, loss_utils.ForCausalLMLoss) and cross_entropy =
log_softmax (saves its 4TV output) + nll_loss. Gemma 2's final soft-capping saves tanh (2TV).

amp_bf16 (fp32 parameters under torch.autocast(bfloat16)): the residual stream is fp32, so each
RMSNorm saves its fp32 input itself and its fp32 normalized output; every linear casts its input
to a bf16 copy of its own (autocast caches only leaf weights), so q, k, v save three copies
(Phi-3's fused qkv_proj one: `_input_casts`);
rotary runs on fp32 cos/sin and makes fp32 q, k that SDPA casts back; autocast caches one bf16
copy of every linear weight for the forward, which the matrix products keep until their backward
(torch/csrc/autograd/autocast_mode.cpp, cached_cast).

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
prepare_model_for_kbit_training's fp32 upcast, which is not modelled), and the bf16 out×in copy
that MatMul4Bit dequantizes in its forward and backward, one matrix at a time, added to the
layers' backward moments. Checked: the CPU replays through peft 0.21
(tests/calc/test_training_lora.py) for the bf16 base; the 4-bit terms are counted from
bitsandbytes' source and not replayed.

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
gpt-oss in bf16 (`_gpt_oss_layer_terms`, `_gpt_oss_moe_backward_extra`): the released
checkpoints store the experts in MXFP4; training needs them dequantized to bf16, which is what
from_config builds, so weights, gradients and AdamW state are bf16 here. GptOssRMSNorm keeps
an fp32 normalized input (its `weight * x` is promoted to fp32); eager attention only
(GPT_OSS_ATTENTIONS: 5.17 refuses SDPA for gpt-oss) with the sink column in the saved bf16
probabilities (B·H·s·(s+1)) and max's int64 indices; the router's softmax over the top-k
(bf16, T·k); the experts' biases (the sorted expert ids kept by the bias gathers) and the
clamped SwiGLU's four S·I tensors; alternating sliding/full layers change only the additive
masks (one per type, alive through the forward, kept by the checkpoints). Checked: CPU replays
of a tiny gpt-oss (2 layers, one sliding), forward within 8 bytes per layer, peak within 3%
(the CPU makes no softmax `tmp`, counted on CUDA as for Llama's eager attention: not measured
for this bf16 softmax over s + 1 columns).
Refused with the reason: amp_bf16, tp > 1, LoRA on MoE, gpt-oss with another attention or a
KV cache or the auxiliary loss, MLA (DeepSeek), dense layers between MoE layers.

Packed sequences (`packed_lengths`; padding-free training, transformers'
DataCollatorWithFlattening): one row (B = 1) of T tokens made of sequences of the given lengths,
position_ids restarting at 0 in each, labels with -100 at each sequence's first token. The
layers run on the T tokens as on a dense row of T; what differs (check_packed, _masked_layers,
_checkpoint_terms, _packed_terms, _input_bytes):
- the inputs: position_ids and labels are int64 (1, T) tensors of their own, alive from before
  the step (a dense row passes its ids as the labels and the model makes its position ids,
  which the checkpoints keep; a packed row's are the input itself);
- ours ("triton"): transformers' create_causal_mask finds the sequences
  (masking_utils.find_packed_sequence_indices: a diff, a comparison and a cumsum of T each,
  dead once the mask is built) and our mask function returns them as int32 starts (n + 1,
  attnmem/kernels/hf/attention.py PackedSequences), kept by every attention call for its backward;
  q, k, v are flattened as views, the kernel keeps q, k, v, O and the log-sum-exp as for a
  dense row, O is made contiguous for o_proj as for a dense row, and the call's backward is
  the packed one (attnmem.calc.peak.varlen_peak_bytes: no GQA split; the Hopper backward's fp32 dQ
  buffer of padded rows unless every attention layer has a window shorter than the longest
  sequence, _packed_window);
- eager: the T×T additive mask is the block-diagonal one, the same size as the dense causal
  mask: nothing else changes;
- SDPA: transformers passes the bool block-diagonal mask (1×1×T×T, sdpa_mask with the causal
  skip off), so every layer is a masked SDPA layer (k, v repeated to H heads, the mask kept
  as a bf16 bias: as for a sliding window shorter than s), and the bool mask lives through
  the forward (and in the checkpoints). SDPA's flash backend takes no mask (no kernel for the
  call), FA4's varlen buffers are not counted, GPT-2 (learned positions) and use_cache are
  refused (PACKED_REFUSED, check_packed).
Checked: CPU replays of a tiny Llama (tests/calc/test_training_packed.py; our kernel under
Triton's interpreter) equal the activations at the end of the forward to the byte, eager,
SDPA and LoRA, checkpointing on and off, and ours without checkpointing. Ours under
checkpointing keeps one layer's q, k, v, O and log-sum-exp more in the replay, dense rows as
well; not counted, as a replay artefact: on the H200 the dense checkpointed rows of our kernel
(data/training_steps_h200.csv, llama3-8b-2l) are within 0.02 % of this count, where that layer
would be about 1.3 % at 32,768 tokens.

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

import dataclasses
from dataclasses import dataclass, field
from fractions import Fraction

from attnmem.calc.backends import NoKernel, no_fit_without_kernel, training_refusal
from attnmem.calc.fit import largest_fitting
from attnmem.calc.models import ModelConfig, check_model
from attnmem.calc.parallel import Layout, expert_params, layout_bytes, make_layout
from attnmem.calc.params import param_breakdown
from attnmem.calc.peak import (
    IMPL_LABELS,
    IMPLEMENTATIONS,
    attention_peak_terms,
    varlen_peak_breakdown,
)
from attnmem.calc.units import MAX_BATCH, MAX_SEQ_LEN, ceil_bytes, check_bool, check_int

#: Attention implementations a training step accepts: the registry names plus "eager"
#: (transformers' eager_attention_forward).
TRAIN_ATTENTIONS: tuple[str, ...] = ("eager", *IMPLEMENTATIONS)
TRAIN_ATTENTION_LABELS: dict[str, str] = {"eager": "transformers eager", **IMPL_LABELS,
                                          "fa4": "FlashAttention-4"}
PRECISIONS: tuple[str, ...] = ("bf16", "amp_bf16")
OPTIMIZERS: tuple[str, ...] = ("adamw", "adamw_fused", "sgd")
#: Activation parts, in the order the breakdown lists them.
PARTS: tuple[str, ...] = (
    "attention", "projections", "MLP", "norms", "residuals", "rotary", "embeddings",
    "logits and loss", "weight copies (autocast)", "MoE",
)
PHASES: tuple[str, ...] = (
    "forward: attention of the last layer",
    "forward: final norm",
    "loss backward (log-softmax)",
    "backward of lm_head",
    "backward of the last layer",
    "backward of layer 0",
    "backward of the tied embedding",
    "optimizer step",
)
#: cuBLAS workspaces that torch allocates through the caching allocator, kept after the warm-up:
#: one per (handle, stream); the forward runs on the main thread and the backward on autograd's
#: device thread, each with its own handle. 32 MiB each on Hopper (aten/src/ATen/cuda/
#: CublasHandlePool.cpp, getChosenWorkspaceSize: 4096 KiB x 8 for sm90).
CUBLAS_WORKSPACE_BYTES = 2 * 32 * 2**20
#: Labels of the model-level terms freed by the backward of the loss, lm_head and final norm.
HEAD_LABELS = ("final norm", "lm_head input", "bf16 copy of lm_head")
#: The model types whose layers this model has read (dense decoders with RMSNorm).
_GEMMA = {"gemma", "gemma2", "gemma3", "gemma3_text"}


@dataclass(frozen=True)
class TrainingStepMemory:
    """Bytes per GPU of one steady-state training step (module docstring for every term)."""

    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations: dict[str, int]  # every part of PARTS -> bytes alive at the end of the forward
    buffers_bytes: int  # what the parallel layout adds (DDP buckets, FSDP all-gathers, ...)
    before_step_bytes: int
    peak_bytes: int
    peak_phase: str  # where in the step the peak occurs (one of PHASES)
    phases: dict[str, int] = field(default_factory=dict)  # each candidate moment's bytes
    activation_terms: tuple[tuple[str, str, int], ...] = ()  # (part, tensor, bytes)
    layout: Layout | None = None
    attention: str = ""
    precision: str = ""
    checkpointing: bool = False

    @property
    def activations_bytes(self) -> int:
        return sum(self.activations.values())

    def part(self, name: str) -> int:
        return self.activations.get(name, 0)

    @property
    def attention_bytes(self) -> int:
        return self.part("attention")

    @property
    def logits_bytes(self) -> int:
        return self.part("logits and loss")


@dataclass(frozen=True)
class _Dims:
    """Per-GPU shapes (tensor parallelism divides heads, MLP columns and the vocabulary)."""

    b: int
    s: int
    h: int
    heads: int
    kv_heads: int
    d: int
    inter: int
    vocab: int
    ep: int = 1  # expert-parallel degree (MoE)
    lengths: tuple[int, ...] = ()  # packed sequences of the one row (padding-free); () dense
    # a packed row's window when every attention layer has one (`_packed_window`), else None
    window: int | None = None

    @property
    def t(self) -> int:
        return self.b * self.s

    @property
    def q(self) -> int:
        return self.heads * self.d

    @property
    def k(self) -> int:
        return self.kv_heads * self.d

    @property
    def n(self) -> int:
        return self.b * self.heads * self.s * self.s


def _check_supported(model: ModelConfig) -> None:
    if model.num_experts > 1 and not model.is_mla and model.state_mixer is None:
        _check_moe_model(model)
        return
    if model.is_mla or model.state_mixer is not None or model.num_experts > 1:
        raise ValueError(
            f"training_step models dense decoders (Llama, Mistral, Qwen2/3, Gemma 2/3 and their "
            f"relatives); {model.name!r} has "
            + ("latent (MLA) attention" if model.is_mla else
               "non-attention mixer layers" if model.state_mixer is not None else
               f"{model.num_experts} experts per layer")
            + ", which it does not count yet")
    if (not model.gated_mlp or model.norm_bias or model.learned_positions) and not _is_gpt2(model):
        raise ValueError(
            f"training_step models RMSNorm decoders with a gated MLP and GPT-2; {model.name!r} "
            f"(model_type {model.model_type!r}) has LayerNorm, a non-gated MLP or learned "
            "positions in another layout (GPT-NeoX, Phi-2), not counted yet")


def _is_gpt2(model: ModelConfig) -> bool:
    return model.model_type == "gpt2"


#: GPT2Config's dropout probabilities (attn_pdrop, resid_pdrop, embd_pdrop), 0.1 each in the
#: released configs: in training every dropout keeps a bool mask of its input's shape.
GPT2_DROPOUT = 0.1


def _gpt2_layer_terms(model: ModelConfig, dm: _Dims, impl: str, amp: bool,
                      ) -> list[tuple[str, str, int]]:
    """One GPT-2 block (modeling_gpt2.py GPT2Block, GPT2Attention, GPT2MLP):
    - ln_1, ln_2 (native_layer_norm) keep their input and an fp32 mean and rstd per row;
    - c_attn (Conv1D = addmm) keeps its input; q, k, v are views of its fused output: a fused
      kernel keeps the whole output through them; eager attention's matmuls copy them
      (matmul reshapes the (B, H, s, d) views into batches);
    - eager: softmax (in the input dtype, no upcast) keeps its output, attention dropout keeps
      a bool mask and the dropped probabilities (kept by P·V); c_proj keeps its contiguous
      input;
    - both residual dropouts keep a bool mask of T·h;
    - gelu_new (NewGELUActivation, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))) written in
      torch ops keeps x (pow), tanh's output, 0.5·x and 1 + tanh; c_proj keeps the result.
    amp_bf16: the residual stream and LayerNorms are fp32 (layer_norm is on autocast's fp32
    list) and each Conv1D keeps a bf16 cast of its input; softmax runs in fp32 (on the list:
    its fp32 output is kept, P is cast back); pow is on the list too, so gelu_new keeps an
    fp32 x, fp32 tanh and 1 + tanh, the bf16 0.5·x and c_proj's bf16 cast of the fp32 result.
    """
    t, h, i, n = dm.t, dm.h, dm.inter, dm.n
    x_e = 4 if amp else 2  # the residual stream
    cast = " (bf16 cast)" if amp else ""
    terms: list[tuple[str, str, int]] = [
        ("residuals", "ln_1: its input (the residual stream), kept by layer_norm", x_e * t * h),
        ("norms", "ln_1: mean and rstd (fp32)", 8 * t),
        ("projections", "ln_1 output, kept by c_attn" + cast, 2 * t * h)]
    if impl == "eager":
        terms += [("attention", "q, k, v copies made by the matmuls", 3 * 2 * t * h),
                  ("attention", "softmax output (N" + (", fp32)" if amp else ")"),
                   (4 if amp else 2) * n),
                  ("attention", "attention-dropout mask (bool N)", n),
                  ("attention", "dropped probabilities (N), kept by P·V", 2 * n),
                  ("projections", "c_proj input (attention output made contiguous)", 2 * t * h)]
    else:
        terms.append(("attention", "c_attn output (q|k|v), kept through the views", 6 * t * h))
        terms += _attention_core(impl, dm, model, amp)
        if impl in ("naive", "naive_inplace", "sdpa_math", "triton"):
            terms.append(("projections", "c_proj input (attention output made contiguous)",
                          2 * t * h))
    terms += [("residuals", "attention residual dropout mask (bool)", t * h),
              ("residuals", "ln_2: its input (the residual stream), kept by layer_norm",
               x_e * t * h),
              ("norms", "ln_2: mean and rstd (fp32)", 8 * t),
              ("projections", "ln_2 output, kept by c_fc" + cast, 2 * t * h)]
    if amp:
        terms += [("MLP", "c_fc output cast to fp32 by pow, kept", 4 * t * i),
                  ("MLP", "tanh output (fp32)", 4 * t * i),
                  ("MLP", "0.5·x (bf16), kept by the product", 2 * t * i),
                  ("MLP", "1 + tanh (fp32), kept by the product", 4 * t * i),
                  ("MLP", "gelu output cast to bf16 by c_proj", 2 * t * i)]
    else:
        terms += [("MLP", "c_fc output, kept by pow", 2 * t * i),
                  ("MLP", "tanh output, kept by tanh", 2 * t * i),
                  ("MLP", "0.5·x, kept by the product", 2 * t * i),
                  ("MLP", "1 + tanh, kept by the product", 2 * t * i),
                  ("MLP", "gelu output, c_proj input", 2 * t * i)]
    terms.append(("residuals", "MLP residual dropout mask (bool)", t * h))
    return terms


def _norm_terms(where: str, width: int, rows: int, fp32_stream: bool, gemma: bool,
                ) -> list[tuple[str, str, int]]:
    """What one RMSNorm over `rows` vectors of `width` saves (module docstring)."""
    part = "norms"
    out = []
    if fp32_stream:  # amp: x is fp32 already, .to(float32)/.float() is x itself: pow keeps it
        out.append(("residuals", f"{where}: its fp32 input, kept by pow", 4 * rows * width))
    else:
        out.append((part, f"{where}: fp32 copy of the input (pow)", 4 * rows * width))
    out.append((part, f"{where}: rsqrt of the mean square (fp32)", 4 * rows))
    if gemma:
        out.append((part, f"{where}: fp32 normalized input (× (1 + w))", 4 * rows * width))
        out.append((part, f"{where}: 1 + w (fp32)", 4 * width))
    else:
        e = 4 if fp32_stream else 2
        out.append((part, f"{where}: normalized input (weight ×)", e * rows * width))
    return out


def _attention_core(impl: str, dm: _Dims, model: ModelConfig, amp: bool,
                    ) -> list[tuple[str, str, int]]:
    """The attention call's saved tensors beyond its rotated q, k and v."""
    p = "attention"
    if impl == "eager":
        terms = []
        if model.model_type == "gemma2":  # attn_logit_softcapping: tanh keeps its output
            terms.append((p, "tanh of the soft-capped scores (bf16, N)", 2 * dm.n))
        terms += [(p, "softmax output (fp32, N), kept by softmax", 4 * dm.n),
                  (p, "probabilities P (bf16, N), kept by P·V", 2 * dm.n)]
        return terms
    if impl in ("naive", "naive_inplace"):
        return [(p, "softmax probabilities P (input dtype, N)", 2 * dm.n),
                (p, "causal mask (bool s×s)", dm.s * dm.s)]
    if impl == "sdpa_math":
        return [(p, "fp32 softmax probabilities (N) of the math backend", 4 * dm.n),
                (p, "fp32 copies of q, k, v", 4 * dm.t * (dm.q + 2 * dm.q))]
    lse_rows = dm.b * dm.heads * dm.s
    if impl == "sdpa_efficient":  # log-sum-exp rows padded to 32 (mem-eff kernel)
        lse_rows = dm.b * dm.heads * (-(-dm.s // 32) * 32)
    return [(p, "attention output (bf16), kept by the kernel and o_proj", 2 * dm.t * dm.q),
            (p, "log-sum-exp (fp32, one per row)", 4 * lse_rows)]


def _expands_kv(impl: str, dm: _Dims) -> bool:
    """Whether k and v are repeated to H heads before the call (and those copies saved)."""
    if dm.kv_heads == dm.heads:
        return False
    # transformers' eager attention always repeats (repeat_kv); SDPA gets enable_gqa=True when
    # there is no mask (sdpa_attention.use_gqa_in_sdpa), but the memory-efficient and math
    # backends of torch 2.11 expand k, v themselves; our kernel, FA2/cuDNN and FA4 take GQA.
    return impl in ("eager", "naive", "naive_inplace", "sdpa_efficient", "sdpa_math")


def _input_casts(model: ModelConfig) -> tuple[int, int]:
    """How many linear modules read the attention's and the MLP's norm output: under autocast
    each makes (and saves) a bf16 cast of its own. q_proj, k_proj, v_proj and gate_proj,
    up_proj in the Llama family (3, 2); Phi-3 fuses them into qkv_proj and gate_up_proj
    (transformers modeling_phi3.py, Phi3Attention and Phi3MLP): (1, 1). Measured on the H200:
    Phi-3 mini (2 layers) under amp at 8,192 tokens peaked 301 MB below the (3, 2) count, three
    bf16 (s, h) tensors per layer (data/training_steps_h200.csv)."""
    return (1, 1) if model.model_type == "phi3" else (3, 2)


def _layer_terms(model: ModelConfig, dm: _Dims, impl: str, amp: bool, cache: bool,
                 masked: bool = False, norm_topk: bool = False) -> list[tuple[str, str, int]]:
    """Every tensor one decoder layer keeps for its backward (no checkpointing). masked: an
    SDPA layer whose sliding window is shorter than s, so transformers passes a mask (module
    docstring of _sliding_masked)."""
    if _is_gpt2(model):
        return _gpt2_layer_terms(model, dm, impl, amp)
    if model.model_type == "gpt_oss":
        return _gpt_oss_layer_terms(model, dm)
    gemma = model.model_type in _GEMMA
    t, h = dm.t, dm.h
    terms = _norm_terms("input norm", h, t, amp, gemma)
    qkv_casts, mlp_casts = _input_casts(model)
    if amp:
        terms.append(("projections", f"q, k, v inputs: {qkv_casts} bf16 cast(s) of the norm output",
                      qkv_casts * 2 * t * h))
    else:
        terms.append(("projections", "q, k, v input (the norm output)", 2 * t * h))
    if model.qk_norm:
        for name, width in (("q", dm.q), ("k", dm.k)):
            terms += _norm_terms(f"{name}_norm", dm.d, t * width // dm.d, False, gemma)
    qk_e = 4 if amp else 2  # amp: q·cos with fp32 cos makes fp32 q, k
    expand = _expands_kv(impl, dm) or (masked and dm.kv_heads != dm.heads)
    if amp:  # SDPA / matmul under autocast cast the fp32 rotated q, k to bf16 copies
        terms.append(("attention", "q (bf16 cast of the rotated fp32 q)", 2 * t * dm.q))
        terms.append(("attention", "k (bf16 cast)" + (" repeated to H heads" if expand else ""),
                      2 * t * (dm.q if expand else dm.k)))
    else:
        terms.append(("rotary", "q after rotary (saved by attention)", 2 * t * dm.q))
        terms.append(("rotary", "k after rotary" + (" repeated to H heads" if expand else ""),
                      2 * t * (dm.q if expand else dm.k)))
    terms.append(("attention", "v" + (" repeated to H heads" if expand else ""),
                  2 * t * (dm.q if expand else dm.k)))
    if model.model_type == "phi3" and not expand and impl != "eager":
        # Phi-3's fused qkv_proj: v is a slice (a view) of its output, so a kernel that keeps
        # v keeps the whole q|k|v storage (modeling_phi3.py Phi3Attention); eager's P·V
        # matmul copies v instead. (Phi-3 is approximate: NOTES.md.)
        terms.append(("projections", "rest of the fused qkv_proj output, kept through v's view",
                      2 * t * (dm.q + dm.k)))
    if cache:  # use_cache: the DynamicCache keeps the rotated k and v of every layer
        if expand or amp:
            terms.append(("attention", "k in the KV cache (use_cache)", qk_e * t * dm.k))
        if expand:
            terms.append(("attention", "v in the KV cache (use_cache)", 2 * t * dm.k))
    terms += _attention_core(impl, dm, model, amp)
    if masked:  # SDPA turns the bool mask into an additive bias of the query dtype and keeps it
        cols = -(-dm.s // 16) * 16 if impl == "sdpa_efficient" else dm.s  # mem-eff pads to 16
        what = "packed-sequence" if dm.lengths else "sliding-window"
        terms.append(("attention", f"{what} mask as an additive bias (B×1×s×s, bf16), "
                      "kept by the kernel", 2 * dm.b * dm.s * cols))
    if impl in ("eager", "naive", "naive_inplace", "sdpa_math", "triton"):
        # eager's P·V output is (B, H, s, d); so is our kernel's (new_empty): transpose(1, 2)
        # .contiguous() copies it. SDPA's fused kernels write (B, s, H, d) already.
        terms.append(("projections", "o_proj input (attention output made contiguous)",
                      2 * t * dm.q))
    norms = ("post-attention norm", "post-MLP norm") if gemma and model.norms_per_layer >= 4 \
        else ()
    for where in norms[:1]:  # Gemma 2/3 norm the attention output before the residual add
        terms += _norm_terms(where, h, t, False, gemma)
    mlp_norm = "pre-MLP norm" if norms else "post-attention norm"
    terms += _norm_terms(mlp_norm, h, t, amp, gemma)
    if amp:
        terms.append(("projections", f"gate, up inputs: {mlp_casts} bf16 cast(s) of the norm output",
                      mlp_casts * 2 * t * h))
    else:
        terms.append(("projections", "gate, up input (the norm output)", 2 * t * h))
    i = dm.inter
    if model.num_experts > 1:
        return terms + _moe_terms(model, dm, norm_topk)
    terms += [("MLP", "gate(x), kept by the activation", 2 * t * i),
              ("MLP", "act(gate(x)), kept by the product", 2 * t * i),
              ("MLP", "up(x), kept by the product", 2 * t * i),
              ("MLP", "act(gate(x))·up(x), down_proj input", 2 * t * i)]
    for where in norms[1:]:
        terms += _norm_terms(where, h, t, False, gemma)
    return terms


def _model_terms(model: ModelConfig, dm: _Dims, amp: bool, impl: str,
                 ) -> list[tuple[str, str, int]]:
    """Tensors alive at the end of the forward outside the layers (module docstring)."""
    gemma = model.model_type in _GEMMA
    t, v = dm.t, dm.vocab
    terms = [("embeddings", "embedding output: not kept (its backward needs the ids only; "
              "Gemma's × sqrt(h) keeps a 0-d scale)", 0)]
    if model.model_type == "gpt_oss":
        terms += _gpt_oss_norm_terms("final norm", t, dm.h)
    elif _is_gpt2(model):
        terms += [("embeddings", "embedding dropout mask (bool)", t * dm.h),
                  ("norms", "final norm (ln_f): its input, kept by layer_norm",
                   (4 if amp else 2) * t * dm.h),
                  ("norms", "final norm (ln_f): mean and rstd (fp32)", 8 * t)]
    else:
        terms += _norm_terms("final norm", dm.h, t, amp, gemma)
    terms.append(("logits and loss", "lm_head input" + (" (bf16 cast)" if amp else ""),
                  2 * t * dm.h))
    cs = 4 if amp else 2  # cos, sin of shape (1, s, d) in the hidden states' dtype
    if model.model_type == "gpt_oss":  # GptOssRotaryEmbedding: emb = freqs, (1, s, d/2)
        terms.append(("rotary", "cos and sin of d/2 columns (shared by all layers)",
                      2 * cs * dm.s * (dm.d // 2)))
    elif not _is_gpt2(model):  # GPT-2: learned positions, no rotary
        terms.append(("rotary", "cos and sin (shared by all layers)", 2 * cs * dm.s * dm.d))
    if model.model_type == "gemma2":  # final_logit_softcapping: tanh keeps its output
        terms.append(("logits and loss", "tanh of the soft-capped logits (bf16)", 2 * t * v))
    terms.append(("logits and loss", "log-softmax output (fp32), kept by cross_entropy",
                  4 * t * v))
    terms.append(("logits and loss", "shifted labels (int64) and the loss", _labels_bytes(dm)))
    return terms


def _labels_bytes(dm: _Dims) -> int:
    """What the loss keeps of the labels, and the loss: loss_utils.ForCausalLMLoss pads the
    labels to (B, s + 1) and takes `labels[..., 1:].contiguous()`, a copy of B·s int64 for
    B > 1 but for B = 1 a view that keeps the padded (s + 1) tensor; nll_loss's fp32 loss and
    total weight (8 bytes)."""
    return 8 * dm.b * (dm.s + (dm.b == 1)) + 8


def _dims(model: ModelConfig, batch: int, seq_len: int, tp: int) -> _Dims:
    kv = max(1, model.num_kv_heads // tp)  # Megatron replicates KV heads when tp > H_kv
    return _Dims(batch, seq_len, model.hidden_size, model.num_heads // tp, kv, model.head_dim,
                 model.intermediate_size // tp, -(-model.vocab_size // tp))


def _check_args(attention: str, precision: str, optimizer: str) -> None:
    if attention not in TRAIN_ATTENTIONS:
        raise ValueError(f"unknown attention {attention!r}; accepted: {', '.join(TRAIN_ATTENTIONS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; accepted: {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; accepted: {', '.join(OPTIMIZERS)}")


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
) -> TrainingStepMemory:
    """Per-GPU memory of one training step (module docstring: every term and its source).

    attention: TRAIN_ATTENTIONS; precision: "bf16" | "amp_bf16"; checkpointing: full per-layer
    activation checkpointing as gradient_checkpointing_enable() sets it; optimizer: "adamw"
    (torch's default foreach path), "adamw_fused" (no temporaries) or "sgd" (no state);
    gpus, tp, sharding: the parallel layout (attnmem.calc.parallel: "none" = DDP replicas when
    gpus > tp, "zero1", "zero2", "zero3", "fsdp"); use_cache: whether the forward builds a
    KV cache (the measured step passes use_cache=False; transformers' own default is on).
    adapters: None (full training) or LoRA(rank, alpha, targets, dropout, adapter_dtype): a
    frozen base with peft LoRA adapters (module docstring, "LoRA and QLoRA"); base_dtype:
    BASE_DTYPES, "nf4"/"nf4_dq" (QLoRA) only with adapters.
    MoE (Mixtral, Qwen2/3-MoE, gpt-oss; module docstring "Mixture of experts"): ep, the
    expert-parallel degree (a divisor of gpus / tp and of the experts per layer: each rank
    holds E/ep experts, tokens go to them by all-to-all; module docstring "Expert
    parallelism"); norm_topk_prob (None: NORM_TOPK_DEFAULT of the model type);
    router_aux_loss: output_router_logits=True (the load-balancing loss; transformers' configs
    default it to False).
    packed_lengths: None (dense rows) or the lengths of the sequences packed into one row
    (padding-free training: batch 1, seq_len = their sum, position_ids restarting at each;
    module docstring "Packed sequences"; PACKED_ATTENTIONS say which attentions, and why the
    others are refused).
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
    cache = check_bool("use_cache", use_cache)
    lengths = check_packed(model, packed_lengths, b, s, attention, cache)
    if not isinstance(base_dtype, str) or base_dtype not in BASE_DTYPES:
        raise ValueError(f"unknown base_dtype {base_dtype!r}; accepted: {', '.join(BASE_DTYPES)}")
    if adapters is not None:
        lo = _check_lora(adapters)
        _check_lora_model(model, precision, gpus, tp, sharding)
        return _training_step_lora(model, b, s, attention, checkpointing, optimizer, cache, lo,
                                   base_dtype, lengths)
    if base_dtype != "bf16":
        raise ValueError(f"base_dtype {base_dtype!r} without adapters: a 4-bit base has no "
                         "trainable weights; pass adapters=LoRA(...) (QLoRA)")
    amp = precision == "amp_bf16"
    if model.model_type == "gpt_oss":
        _check_gpt_oss_args(attention, cache)
    dm = dataclasses.replace(_dims(model, b, s, lay.tp), ep=lay.ep, lengths=lengths,
                             window=_packed_window(model, lengths))
    L = model.num_layers

    masked = _masked_layers(model, attention, dm)
    _check_kernel(model, attention, s, masked, lengths)
    kinds = [(n, mk, _layer_terms(model, dm, attention, amp, cache and not checkpointing, mk,
                                  norm_topk))
             for n, mk in ((masked, True), (L - masked, False)) if n]
    # The moments take the larger kind of layer; the layers' total is exact.
    layer = max((k for _, _, k in kinds), key=lambda k: sum(x for _, _, x in k))
    a_layer = sum(x for _, _, x in layer)
    layers_total = sum(n * sum(x for _, _, x in k) for n, _, k in kinds)
    parts = dict.fromkeys(PARTS, 0)
    terms: list[tuple[str, str, int]] = []
    stream = 4 if amp else 2  # bytes of one residual-stream element
    if checkpointing:
        terms.append(("residuals", f"layer inputs kept by the checkpoints ({L} × T·h)",
                      L * stream * dm.t * dm.h))
        terms += _checkpoint_terms(model, dm, attention, masked, stream)
    else:
        for n, mk, kind in kinds:
            what = "" if not mk else " with a packed-sequence mask" if lengths else \
                " with a sliding-window mask"
            terms += [(p, f"{lab} (× {n} layers{what})", n * x) for p, lab, x in kind]
    terms += _model_terms(model, dm, amp, attention)
    terms += _packed_terms(dm, attention)
    if aux:
        terms += _aux_loss_terms(model, dm)

    pb = param_breakdown(model)
    w = layout_bytes(model, lay, precision)
    layer_copies = 0
    if amp:  # autocast's bf16 copies of every linear weight, kept by the matrix products
        head = pb["lm_head"] + (pb["embeddings"] if model.tie_embeddings else 0)
        layer_copies = ceil_bytes(Fraction(2 * (pb["attention"] + pb["mlp"]), lay.tp * L))
        # Under checkpointing the layers' copies die with autocast's cache at the end of the
        # forward (nothing saved them) and are made again by each layer's recomputation.
        terms.append(("weight copies (autocast)", "bf16 copy of lm_head's weight",
                      ceil_bytes(Fraction(2 * head, lay.tp))))
        if not checkpointing:
            terms.append(("weight copies (autocast)",
                          f"bf16 copies of the layers' linear weights (× {L} layers)",
                          L * layer_copies))
        # (Under checkpointing the recomputed layer's copies were not seen in the peak of the
        # CPU replay of the step (NOTES.md): not added.)
    for p, _, x in terms:
        parts[p] += x
    acts = sum(parts.values())

    weights, grads = w["weights"], w["gradients"]
    opt = 0 if optimizer == "sgd" else w["optimizer"]
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
    # Backward of a layer: what it saved (recomputed under checkpointing), the gradient of the
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
    tmp = ceil_bytes(Fraction(opt, 2)) if optimizer == "adamw" else 0
    phases[PHASES[7]] = before + grads + tmp
    phase = max(phases, key=phases.__getitem__)
    return TrainingStepMemory(
        weights_bytes=weights, gradients_bytes=grads, optimizer_bytes=opt, activations=parts,
        buffers_bytes=w["persistent_buffers"] + w["step_buffers"], before_step_bytes=before,
        peak_bytes=phases[phase], peak_phase=phase, phases=phases, activation_terms=tuple(terms),
        layout=lay, attention=attention, precision=precision, checkpointing=checkpointing)


def _sliding_masked(model: ModelConfig, impl: str, seq_len: int) -> int:
    """How many layers get a materialized mask under SDPA: the sliding-window layers whose
    window is shorter than s. transformers (masking_utils.sdpa_mask) skips the mask, and SDPA
    runs is_causal, when the window covers every key; otherwise it passes a bool mask, and then
    sdpa_attention.use_gqa_in_sdpa is False, so k and v are repeated to H heads (repeat_kv).
    Flash has no mask input (such a call has no kernel); cuDNN and memory-efficient keep the
    mask as an additive bias."""
    if not impl.startswith("sdpa") or not model.sliding_window or seq_len < model.sliding_window:
        return 0  # masking_utils._ignore_causal_mask_sdpa: a window as long as the keys masks
    return model.sliding_window_layers


#: Attention implementations whose packed (padding-free) step is modelled: ours (transformers
#: calls it with a PackedSequences marker: attnmem/kernels/hf/attention.py), eager and the SDPA
#: backends that take a mask (transformers gives them the block-diagonal mask it builds).
PACKED_ATTENTIONS: tuple[str, ...] = ("triton", "eager", "sdpa_efficient", "sdpa_cudnn",
                                      "sdpa_math")
#: Why the others are refused with packed sequences.
PACKED_REFUSED: dict[str, str] = {
    "sdpa_flash": "transformers gives SDPA a materialized block-diagonal bool mask for packed "
                  "sequences (masking_utils.find_packed_sequence_indices, sdpa_mask with the "
                  "causal skip off) and SDPA's flash backend takes no mask, so the call has no "
                  "kernel; use sdpa_efficient, sdpa_cudnn, triton or eager",
    "fa4": "FlashAttention-4's varlen path (transformers' flash_attention_4 with cu_seq_lens "
           "from position_ids) pads its backward buffers per sequence, which is not counted "
           "here; use triton",
    "naive": "'naive' is not a transformers attention with a packed-sequence path",
    "naive_inplace": "'naive_inplace' is not a transformers attention with a packed-sequence "
                     "path",
}


def check_packed(model: ModelConfig, packed_lengths: object, batch: int, seq_len: int,
                 attention: str, cache: bool) -> tuple[int, ...]:
    """The checked lengths of a packed row, () for dense rows (packed_lengths None).
    A packed row is what transformers' DataCollatorWithFlattening makes: batch 1, the
    sequences concatenated (seq_len their sum), position_ids restarting at 0 for each."""
    if packed_lengths is None:
        return ()
    if isinstance(packed_lengths, (str, bytes)) or not isinstance(packed_lengths, (tuple, list)):
        raise ValueError(f"packed_lengths must be None or a tuple of sequence lengths (whole "
                         f"numbers >= 1), got {packed_lengths!r}")
    if not packed_lengths:
        raise ValueError("packed_lengths must hold at least one sequence length, got none "
                         "(pass None for a dense row)")
    lengths = tuple(check_int(f"packed_lengths[{i}]", n, 1, MAX_SEQ_LEN)
                    for i, n in enumerate(packed_lengths))
    if batch != 1:
        raise ValueError(f"packed sequences are one row of tokens: batch must be 1, got "
                         f"{batch} (pack every sequence into the one row)")
    if sum(lengths) != seq_len:
        raise ValueError(f"seq_len must be the packed total, sum(packed_lengths) = "
                         f"{sum(lengths):,}, got {seq_len:,}")
    if attention in PACKED_REFUSED:
        raise ValueError(f"attention {attention!r} with packed sequences: "
                         f"{PACKED_REFUSED[attention]}")
    if cache:
        raise ValueError("use_cache=True with packed sequences: transformers looks for packed "
                         "position_ids only without a cache (masking_utils."
                         "_preprocess_mask_arguments), so eager and SDPA would attend across "
                         "sequences; pass use_cache=False, as the training step does")
    if _is_gpt2(model):
        raise ValueError(f"packed sequences with {model.name!r} (GPT-2, learned positions): "
                         "not modelled; rotary-position decoders only")
    return lengths


def _check_kernel(model: ModelConfig, attention: str, s: int, masked: int,
                  lengths: tuple[int, ...]) -> None:
    """NoKernel where the forced SDPA backend has no kernel for this step (attnmem.calc.backends)."""
    why = training_refusal(model, attention, s, masked, packed=bool(lengths))
    if why:
        raise NoKernel(f"{attention!r} cannot run this training step: {why}")


def _masked_layers(model: ModelConfig, impl: str, dm: _Dims) -> int:
    """How many layers get a materialized mask under SDPA: every layer of a packed row (the
    block-diagonal mask), else the sliding-window rule (_sliding_masked)."""
    if dm.lengths:
        return model.num_layers if impl.startswith("sdpa") else 0
    return _sliding_masked(model, impl, dm.s)


def _checkpoint_terms(model: ModelConfig, dm: _Dims, impl: str, masked: int, stream: int,
                      ) -> list[tuple[str, str, int]]:
    """What the checkpoints keep besides the layer inputs: the position ids the model made
    (a packed row's are an input, counted before the step), eager's additive masks, SDPA's
    bool mask(s)."""
    out = []
    if not dm.lengths:
        out.append(("rotary", "position ids kept by the checkpoints", 8 * dm.s))
    if impl == "eager":  # the model's additive masks are checkpoint inputs too
        masks = _mask_count(model)
        out.append(("attention", f"{masks} additive mask(s) (B×1×s×s, in the hidden states' "
                    "dtype) kept by the checkpoints", masks * stream * dm.b * dm.s * dm.s))
    if masked and dm.lengths:
        n = _mask_count(model)
        out.append(("attention", f"{n} packed-sequence mask(s) (bool T×T, block-diagonal "
                    "causal) kept by the checkpoints", n * dm.b * dm.s * dm.s))
    elif masked:  # the bool sliding-window mask (a B-expanded view of 1×1×s×s)
        out.append(("attention", "sliding-window mask (bool s×s) kept by the checkpoints",
                    dm.s * dm.s))
    return out


def _packed_terms(dm: _Dims, impl: str) -> list[tuple[str, str, int]]:
    """Our kernel on a packed row: the int32 starts of the sequences (n + 1), which the mask
    function returns in its PackedSequences marker (attnmem/kernels/hf/attention.py, _starts) and the
    attention calls keep for their backward. transformers' own tensors made from position_ids
    (find_packed_sequence_indices: the diff, its comparison and the cumsum, T each) die with
    the mask's construction, before the first layer runs."""
    if not dm.lengths or impl != "triton":
        return []
    n = len(dm.lengths)
    return [("attention", f"cu_seqlens of the {n} packed sequences (int32, n + 1), kept by the "
             "mask marker", 4 * (n + 1))]


def _input_bytes(dm: _Dims) -> int:
    """The step's int64 inputs, alive from before the step: input ids (dense rows pass them as
    the labels too); a packed row adds its position ids and its labels, a tensor of its own
    (DataCollatorWithFlattening puts -100 at each sequence's first label)."""
    return (3 if dm.lengths else 1) * 8 * dm.t


def _packed_bool_masks(model: ModelConfig, dm: _Dims, impl: str) -> int:
    """SDPA on a packed row: the bool block-diagonal mask(s) (B×1×T×T, one per layer type),
    alive through the forward (and kept by the checkpoints)."""
    if not dm.lengths or not impl.startswith("sdpa"):
        return 0
    return _mask_count(model) * dm.b * dm.s * dm.s


def _mask_count(model: ModelConfig) -> int:
    """Distinct additive masks eager attention gets: one per layer type in use (full,
    sliding; masking_utils builds one of each). GptOssModel.forward builds both whatever the
    layer types."""
    if model.model_type == "gpt_oss":
        return 2
    sliding = model.sliding_window_layers if model.sliding_window else 0
    return (sliding > 0) + (sliding < model.num_layers)


def _core_saved(layer: list[tuple[str, str, int]]) -> int:
    """Bytes of a layer's terms saved after its attention call (MLP side), which do not exist
    yet while the call runs."""
    after = False
    total = 0
    for _part, label, x in layer:
        if label.startswith(("post-attention norm", "pre-MLP norm", "gate, up",
                             "attention residual dropout", "ln_2")):
            after = True
        if after or label.startswith(("o_proj input",)):
            total += x
    return total


def _attention_forward_extra(impl: str, dm: _Dims) -> int:
    """Transient bytes of one attention call's forward beyond what it saves, at its largest
    moment (eager: P (2N) not made yet, masked scores (2N) and their fp32 copy (4N) alive)."""
    if impl == "eager":
        return -2 * dm.n + 2 * dm.n + 4 * dm.n
    if impl in ("naive", "naive_inplace"):
        return 2 * dm.n + dm.s * dm.s
    if impl == "sdpa_math":
        return 5 * dm.n
    return 0


def _layer_backward_extra(layer: list[tuple[str, str, int]], impl: str, dm: _Dims,
                          model: ModelConfig, g_per_param: Fraction, tp: int,
                          g_expert: Fraction | None = None) -> int:
    """Largest excess over (the layer's saved tensors + the incoming gradient) during its
    backward: the MLP's product backward or the attention call's backward. g_expert: gradient
    bytes per routed-expert parameter (default g_per_param; differs under expert
    parallelism)."""
    g_x = g_per_param if g_expert is None else g_expert
    t, h, i = dm.t, dm.h, dm.inter
    g_mat = ceil_bytes(g_per_param * h * model.intermediate_size / tp)
    # MLP: d(prod), d(act), d(up) alive, prod freed, down's weight gradient made.
    mlp = 3 * 2 * t * i - 2 * t * i + g_mat
    g_mlp = 3 * g_mat
    if model.num_experts > 1:  # the MoE block instead (tp = 1)
        mlp = _moe_backward_extra(model, dm, g_x, g_per_param)
        g_mlp = sum(_moe_block_grads(model, g_x, g_per_param))
    # Attention: the MLP side is freed and its gradients (3 matrices + o_proj) exist; the
    # gradient of the attention output (2Tq) reaches the call.
    freed = _core_saved(layer)
    g_attn_side = g_mlp + ceil_bytes(g_per_param * h * model.num_heads * model.head_dim / tp)
    core = _gpt_oss_attention_backward_extra(dm) if model.model_type == "gpt_oss" else \
        _attention_backward_extra(impl, dm)
    attn = -freed + g_attn_side + core
    return max(mlp, attn)


def _attention_backward_extra(impl: str, dm: _Dims) -> int:
    """The attention call's backward beyond the tensors it saved (its peak, attnmem.calc.peak, less
    the output and log-sum-exp already counted as saved). Eager, at softmax's backward: the
    fp32 output (saved), the fp32 gradient of P, CUDA's `tmp = grad * output` (fp32,
    aten/src/ATen/native/cuda/SoftMax.cu softmax_backward_cuda_out) and the fp32 result; P
    freed; dV made (H heads of repeated values)."""
    if impl == "eager":
        return -2 * dm.n + 3 * 4 * dm.n + 2 * dm.t * dm.q
    terms = _peak_terms(impl, dm)
    saved = ("output (saved", "log-sum-exp", "k, v expanded", "probabilities P kept")
    return sum(x for label, x in terms if not label.startswith(saved))


def _packed_window(model: ModelConfig, lengths: tuple[int, ...]) -> int | None:
    """The sliding window of a packed row's attention calls when every attention layer has
    one (each call then gets it: attnmem/kernels/hf/attention.py), else None: a global layer's call
    is the larger (attnmem.calc.peak.varlen_peak_bytes counts the Hopper backward's fp32 dQ buffer
    only without a window shorter than the longest sequence), and the step takes the largest."""
    layers = model.attention_layers or model.num_layers
    if lengths and model.sliding_window and model.sliding_window_layers >= layers:
        return model.sliding_window
    return None


def _peak_terms(impl: str, dm: _Dims) -> list[tuple[str, int]]:
    if dm.lengths and impl == "triton":  # the packed call (attnmem.calc.peak.varlen_peak_bytes)
        return [(t.label, t.counted_bytes) for t in varlen_peak_breakdown(
            dm.heads, list(dm.lengths), dm.d, "bf16", backward=True, kv_heads=dm.kv_heads,
            window=dm.window)]
    return attention_peak_terms(impl, dm.b, dm.heads, dm.s, dm.d, "bf16", causal=True,
                                backward=True, kv_heads=dm.kv_heads)


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


# ---------------------------------------------------------------------------------------------
# LoRA and QLoRA (issue 34): a frozen base, trainable low-rank adapters through peft.
# ---------------------------------------------------------------------------------------------

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
    from attnmem.calc.params import param_count
    from attnmem.calc.quant import quantized_matrix_bytes

    total = param_count(model)
    if base_dtype == "bf16":
        return 2 * total, 0
    from attnmem.calc.models import QuantConfig
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
    attn = (-_core_saved(layer) + grads(("o_proj", *LORA_MLP_TARGETS))
            + _attention_backward_extra(impl, dm))
    return max(mlp, lora, attn) + deq


def _training_step_lora(model: ModelConfig, b: int, s: int, attention: str, checkpointing: bool,
                        optimizer: str, cache: bool, lo: _Lora, base_dtype: str,
                        lengths: tuple[int, ...] = ()) -> TrainingStepMemory:
    """training_step with a frozen base and LoRA adapters (module docstring, "LoRA")."""
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
    a_first, a_rest = (sum(x for _, _, x in k) for k in (first, rest))
    stream = 2
    terms: list[tuple[str, str, int]] = []
    inputs = L * stream * dm.t * dm.h
    if checkpointing:
        terms.append(("residuals", f"layer inputs kept by the checkpoints ({L} × T·h)", inputs))
        terms += _checkpoint_terms(model, dm, attention, masked, stream)
    else:
        terms += [(p, f"{lab} (layer 0)", x) for p, lab, x in first]
        if L > 1:
            terms += [(p, f"{lab} (× {L - 1} layers)", (L - 1) * x) for p, lab, x in rest]
    terms += _lora_model_terms(model, dm, attention)
    terms += _packed_terms(dm, attention)
    parts = dict.fromkeys((*PARTS, LORA_PART), 0)
    for p, _, x in terms:
        parts[p] += x
    acts = sum(parts.values())

    adapter = _adapter_params(model, lo)
    weights, deq = _base_weight_bytes(model, base_dtype)
    weights += lo.e * adapter
    grads = lo.e * adapter  # torch makes .grad in the parameter's dtype
    opt = 0 if optimizer == "sgd" else 2 * lo.e * adapter  # exp_avg, exp_avg_sq like the param
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
    phases[PHASES[1]] = (base + shared + masks + kept_all
                         + stream * dm.t * dm.h + (4 + 4 + 2) * dm.t * dm.h + 4 * dm.t)
    phases[PHASES[2]] = base + acts + 2 * 4 * tv
    # lm_head backward: the bf16 gradient of the logits and of lm_head's input; no weight
    # gradient (frozen: mm's mat2 gradient is not computed).
    phases[PHASES[3]] = base + acts - lsm - tanh_logits - _labels_bytes(dm) + 2 * tv + 2 * dm.t * dm.h
    after_loss = acts - head_saved
    dh = stream * dm.t * dm.h
    extra_last = _lora_backward_extra(model, dm, attention, last, lo, g_layer, deq)
    extra_first = _lora_backward_extra(model, dm, attention, first, lo, g_layer, deq)
    phases[PHASES[4]] = base + after_loss + dh + extra_last + (a_last if checkpointing else 0)
    if checkpointing:  # the later layers' inputs are freed, layer 0 is recomputed
        at_first = after_loss - (L - 1) * stream * dm.t * dm.h + a_first
    else:
        at_first = after_loss - (L - 1) * a_rest
    phases[PHASES[5]] = base + at_first + (L - 1) * g_layer + dh + extra_first
    tmp = ceil_bytes(Fraction(opt, 2)) if optimizer == "adamw" else 0
    phases[PHASES[7]] = before + grads + tmp
    phase = max(phases, key=phases.__getitem__)
    return TrainingStepMemory(
        weights_bytes=weights, gradients_bytes=grads, optimizer_bytes=opt, activations=parts,
        buffers_bytes=0, before_step_bytes=before, peak_bytes=phases[phase], peak_phase=phase,
        phases=phases, activation_terms=tuple(terms), layout=lay, attention=attention,
        precision="bf16", checkpointing=checkpointing)


def _adapter_params(model: ModelConfig, lo: _Lora) -> int:
    """lora_adapter_params for a validated LoRA."""
    shapes = _lora_shapes(model)
    return model.num_layers * sum(lo.rank * (shapes[n][0] + shapes[n][1]) for n in lo.targets)


# ---------------------------------------------------------------------------------------------
# Mixture of experts (issue 34): Mixtral, Qwen2-MoE, Qwen3-MoE through transformers 5's
# grouped_mm experts (integrations/moe.py grouped_mm_experts_forward).
# ---------------------------------------------------------------------------------------------

#: MoE model types whose blocks are counted: router (MixtralTopKRouter / Qwen*MoeTopKRouter),
#: experts decorated with @use_experts_implementation (default "grouped_mm",
#: modeling_utils.get_correct_experts_implementation), Qwen2-MoE's gated shared expert.
MOE_MODEL_TYPES: tuple[str, ...] = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")
#: Released configs' norm_topk_prob where the model type does not fix it: Mixtral's router
#: always divides by the top-k sum (modeling_mixtral.py MixtralTopKRouter); Qwen3-MoE's
#: released configs set norm_topk_prob=true, Qwen2-MoE's (Qwen1.5-MoE, Qwen2-57B-A14B) false.
NORM_TOPK_DEFAULT: dict[str, bool] = {"mixtral": True, "qwen3_moe": True, "qwen2_moe": False,
                                      "gpt_oss": False}
#: Attention implementations a gpt-oss training step accepts. transformers 5.17's
#: GptOssPreTrainedModel sets _supports_sdpa = False (an explicit "sdpa" raises, the default
#: falls back to eager: modeling_utils.get_correct_attn_implementation), and its flash entries
#: are hub kernels with sinks (_compatible_flash_implementations: vllm-flash-attn3, FA4) or
#: flex_attention, none of whose saved tensors is counted here: eager only.
GPT_OSS_ATTENTIONS: tuple[str, ...] = ("eager",)


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
    if model.model_type == "gpt_oss":
        return _gpt_oss_moe_terms(model, dm)
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
    if model.model_type == "gpt_oss":
        return _gpt_oss_moe_backward_extra(model, dm, g_per_param, g_rest)
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


# ---------------------------------------------------------------------------------------------
# gpt-oss in bf16 (transformers 5.17 models/gpt_oss/modeling_gpt_oss.py, the grouped_mm experts
# of integrations/moe.py). The released checkpoints store the experts in MXFP4; training needs
# them dequantized to bf16, which is what from_config (and a bf16 load) builds.
# ---------------------------------------------------------------------------------------------

#: Label of the sentinel mask term (module docstring of _moe_terms); tests find it by label.
SENTINEL_LABEL = "expert-parallel sentinel mask (bool, S), kept by the masked_fills"


def _gpt_oss_norm_terms(where: str, rows: int, width: int) -> list[tuple[str, str, int]]:
    """GptOssRMSNorm: `x.to(float32)`, `x.pow(2).mean`, `x * rsqrt(var + eps)`, then
    `(self.weight * x).to(input_dtype)`: unlike Llama's `weight * x.to(bf16)`, the bf16 weight
    times the fp32 normalized input is fp32 (type promotion), so that mul keeps the fp32
    normalized input (4 bytes per element) for the weight's gradient; pow keeps the fp32
    copy, the rsqrt product keeps the fp32 rsqrt."""
    return [("norms", f"{where}: fp32 copy of the input (pow)", 4 * rows * width),
            ("norms", f"{where}: rsqrt of the mean square (fp32)", 4 * rows),
            ("norms", f"{where}: fp32 normalized input (weight ×, promoted to fp32)",
             4 * rows * width)]


def _gpt_oss_attention_sizes(dm: _Dims) -> tuple[int, int]:
    """(N, N'): score elements B·H·s² and, with the sink column, B·H·s·(s + 1)."""
    return dm.n, dm.b * dm.heads * dm.s * (dm.s + 1)


def _gpt_oss_layer_terms(model: ModelConfig, dm: _Dims) -> list[tuple[str, str, int]]:
    """One GptOssDecoderLayer under eager attention (modeling_gpt_oss.py
    eager_attention_forward), bf16:
    - input and post-attention norms: _gpt_oss_norm_terms;
    - q, k, v linears (with bias: addmm keeps the input, the norm output, 2·T·h);
    - rotary (`_apply_rotary_emb`: chunk, `first * cos - second * sin`, cat): the muls keep
      cos and sin only (model level); the cat makes the rotated q and k;
    - `matmul(q, repeat_kv(k)ᵀ)` keeps q and the repeated k (H heads; repeat_kv copies when
      H_kv < H); `* scaling` and `+ mask` keep nothing; `cat([scores, sinks])` keeps sizes;
      `combined - combined.max(-1, keepdim).values`: max keeps its int64 indices (B·H·s);
      `softmax(dtype=bf16)` keeps its bf16 output over s + 1 columns; `probs[..., :-1]` is a
      view and dropout(p=0) returns it, so P·V keeps the same storage and the repeated v;
    - o_proj keeps the attention output made contiguous (2·T·q);
    - the MoE block: _gpt_oss_moe_terms."""
    t, h = dm.t, dm.h
    _, n_sink = _gpt_oss_attention_sizes(dm)
    kv = dm.q if dm.kv_heads != dm.heads else dm.k
    rep = " repeated to H heads (repeat_kv)" if dm.kv_heads != dm.heads else ""
    terms = _gpt_oss_norm_terms("input norm", t, h)
    terms += [
        ("projections", "q, k, v input (the norm output)", 2 * t * h),
        ("rotary", "q after rotary (saved by q·kᵀ)", 2 * t * dm.q),
        ("rotary", "k after rotary" + rep + ", saved by q·kᵀ", 2 * t * kv),
        ("attention", "v" + rep + ", saved by P·V", 2 * t * kv),
        ("attention", "row-max indices of the scores with the sink column (int64, B·H·s), "
         "kept by max", 8 * dm.b * dm.heads * dm.s),
        ("attention", "probabilities with the sink column (bf16, B·H·s·(s+1)), kept by softmax "
         "and P·V", 2 * n_sink),
        ("projections", "o_proj input (attention output made contiguous)", 2 * t * dm.q)]
    terms += _gpt_oss_norm_terms("post-attention norm", t, h)
    terms.append(("projections", "gate, up input (the norm output), kept by the router's "
                  "linear", 2 * t * h))
    return terms + _gpt_oss_moe_terms(model, dm)


def _gpt_oss_moe_terms(model: ModelConfig, dm: _Dims) -> list[tuple[str, str, int]]:
    """What GptOssMLP keeps for its backward, bf16, S = T·k pairs:
    - GptOssTopKRouter: `F.linear(x, W, b)` keeps x (the caller's term); topk over the bf16
      logits keeps its int64 indices (T·k); `softmax(top_values, dtype=bf16)` keeps its output
      (T·k), the routing weights;
    - grouped_mm_experts_forward (has_bias, is_transposed, interleaved gate_up): the token
      gather keeps `perm // k` (int64, S), the weights' gather `perm` (S), the two bias
      gathers `gate_up_proj_bias[expert_ids_g]` and `down_proj_bias[expert_ids_g]` keep the
      sorted expert ids (int64, S; the biased gathers themselves are added in place and die);
      the sentinel mask (bool, S); the offsets (int32, E); the gate_up grouped_mm keeps the
      gathered states (S·h); the masked gate_up output (S·2I) is kept through its strided
      gate/up views by the two clamps;
    - GptOssExperts._apply_gate: `gate.clamp(max=limit)` and `up.clamp(±limit)` keep the
      views; `gate * alpha` keeps nothing; sigmoid keeps its output; `gate * sigmoid` keeps
      the clamped gate and the sigmoid; `(up + 1) * glu` keeps up + 1 and glu: 4 × S·I; the
      down grouped_mm keeps the gated product (S·I);
    - the routing-weight product keeps the masked expert outputs (S·h) and the sorted weights
      (bf16, S); the un-permuting gather keeps inv_perm (int64, S)."""
    t, h, i = dm.t, dm.h, dm.inter
    ne, k = model.num_experts, model.experts_per_token
    s = t * k
    p = "MoE"
    return [
        (p, "top-k expert indices (int64, T×k), kept by topk", 8 * t * k),
        (p, "routing weights: softmax of the top-k logits (bf16, T×k), kept by softmax",
         2 * t * k),
        (p, "pair-to-token index perm // k (int64, S), kept by the gather", 8 * s),
        (p, "sort permutation (int64, S), kept by the routing weights' gather", 8 * s),
        (p, "sorted expert ids (int64, S), kept by the two bias gathers", 8 * s),
        (p, SENTINEL_LABEL, s),
        (p, "tokens-per-expert offsets (int32, E), kept by grouped_mm", 4 * ne),
        (p, "gathered hidden states (S×h), kept by the gate_up grouped_mm", 2 * s * h),
        (p, "gate_up output + bias, masked (S×2I), kept by the clamps through its views",
         2 * s * 2 * i),
        (p, "clamped gate, sigmoid(alpha·gate), glu, up + 1 (4 × S×I)", 4 * 2 * s * i),
        (p, "(up + 1)·glu (S×I), kept by the down grouped_mm", 2 * s * i),
        (p, "expert outputs + bias, masked (S×h), kept by the routing-weight product",
         2 * s * h),
        (p, "routing weights sorted by expert (bf16, S)", 2 * s),
        (p, "inverse permutation (int64, S), kept by the un-permuting gather", 8 * s),
        *_ep_terms(model, dm)]


def _gpt_oss_moe_backward_extra(model: ModelConfig, dm: _Dims, g_per_param: Fraction,
                                g_rest: Fraction | None = None) -> int:
    """Largest excess over (the block's saved tensors + the incoming T·h gradient) during
    GptOssMLP's backward, op by op in autograd's order (the later-made node first among those
    ready): the un-permuting gather (zeros S·h + index_put); the routing-weight product (the
    outputs' gradient S·h, the weights' through an S·h product summed to S); the sentinel
    masked_fill's copy (S·h); the down grouped_mm (S·I and every expert's down gradient);
    `(up + 1)·glu` (two S·I); up's clamp (S·I); `gate·sigmoid` (two S·I); sigmoid (S·I);
    `·alpha` (S·I, summed in place into the clamped gate's gradient); gate's clamp (S·I); the
    strided views' backward (slice_backward: zeros S·2I + copy, one per view, summed in
    place); the masked_fill's copy (S·2I); the gate_up grouped_mm (S·h and every expert's
    gate_up gradient); the in-place masked_fill_'s copy (S·h); the token gather (zeros T·h);
    the router (topk's zeros T·E, bf16, and the linear's input gradient T·h)."""
    t, h, i = dm.t, dm.h, dm.inter
    ne, k = model.num_experts, model.experts_per_token
    s = t * k
    g_up, g_down, _ = _moe_block_grads(model, g_per_param, g_rest)
    a2a = dm.ep > 1
    walk = _Walk()
    alloc, free = walk.alloc, walk.free

    si = 2 * s * i  # one S×I bf16 tensor
    alloc(2 * s * h)  # index backward: zeros + index_put
    free(8 * s)  # inv_perm
    alloc(2 * s * h)  # d(expert outputs) = g · w
    alloc(2 * s * h)  # g · outputs, summed to the weights' gradient
    alloc(2 * s)
    free(2 * s * h)
    free(2 * s * h + 2 * s * h + 2 * s)  # the gather's gradient, expert outputs, weights
    if a2a:
        _ep_combine_backward(alloc, free, s, h)
    alloc(2 * s * h)  # sentinel masked_fill backward: a copy
    free(2 * s * h)
    alloc(si)  # down grouped_mm: input gradient
    alloc(g_down)
    free(2 * s * h + si)  # d(outputs), the gated product
    alloc(2 * si)  # (up + 1)·glu: d(up + 1), d(glu)
    free(si + 2 * si)  # d(gated), up + 1, glu
    alloc(si)  # up's clamp backward
    free(si)  # d(up + 1)
    alloc(2 * si)  # gate·sigmoid: d(gate), d(sigmoid)
    free(si + si)  # d(glu), the clamped gate
    alloc(si)  # sigmoid backward
    free(2 * si)  # d(sigmoid), the sigmoid output
    alloc(si)  # ·alpha backward
    free(si)  # d(·alpha) input
    free(si)  # summed in place into the clamped gate's gradient
    alloc(si)  # gate's clamp backward
    free(si + 2 * s * 2 * i)  # d(clamped gate); the gate_up output, its last saver done
    alloc(2 * s * 2 * i)  # up view: slice_backward zeros + copy
    free(si)
    alloc(2 * s * 2 * i)  # gate view
    free(si)
    free(2 * s * 2 * i)  # summed in place
    alloc(2 * s * 2 * i)  # sentinel masked_fill backward: a copy
    free(2 * s * 2 * i)
    alloc(2 * s * h)  # gate_up grouped_mm: input gradient
    alloc(g_up)
    free(2 * s * 2 * i + 2 * s * h)  # its gradient, the gathered states
    alloc(2 * s * h)  # in-place masked_fill_ backward: a copy
    free(2 * s * h)
    if a2a:
        _ep_dispatch_backward(alloc, free, s, h)
    alloc(2 * t * h)  # the token gather's zeros
    free(2 * s * h + 8 * s)
    alloc(2 * t * ne)  # topk backward: zeros (bf16 logits)
    alloc(2 * t * h)  # the router linear's input gradient
    return walk.peak


def _gpt_oss_attention_backward_extra(dm: _Dims) -> int:
    """Eager attention with sinks, backward beyond its saved tensors, at softmax's backward:
    the gradient of the probabilities widened back to s + 1 columns (slice_backward: zeros +
    copy, N'), softmax's bf16 result (N'), CUDA's `tmp = grad * output` (N', the grad dtype:
    aten/src/ATen/native/cuda/SoftMax.cu softmax_backward_cuda_out) and dV (repeated, 2·T·q),
    waiting for repeat_kv's backward. The later max backward (zeros N' + scatter) runs after
    the probabilities are freed and is smaller."""
    _, n_sink = _gpt_oss_attention_sizes(dm)
    return 3 * 2 * n_sink + 2 * dm.t * dm.q


def _gpt_oss_attention_forward_extra(dm: _Dims) -> int:
    """The forward's largest moment beyond the saved tensors: at the subtraction of the row
    maxima, the masked scores (N, still bound to `attn_weights` until dropout rebinds it), the
    concatenated logits (N') and their shifted copy (N') are alive, the probabilities (saved,
    N') not yet; at softmax the shifted copy and the probabilities: 2·N + 2·N' either way."""
    n, n_sink = _gpt_oss_attention_sizes(dm)
    return 2 * n + 2 * n_sink


def _check_gpt_oss_args(attention: str, cache: bool) -> None:
    if attention not in GPT_OSS_ATTENTIONS:
        raise ValueError(
            f"attention {attention!r} with gpt-oss: only {', '.join(GPT_OSS_ATTENTIONS)} is "
            "modelled. transformers 5.17 refuses 'sdpa' for gpt-oss (_supports_sdpa = False: "
            "SDPA has no sink logits); its flash paths are hub kernels with sinks "
            "(vllm-flash-attn3, flash_attention_4) and flex_attention, not counted here")
    if cache:
        raise ValueError("use_cache=True with gpt-oss is not modelled (the DynamicCache's "
                         "sliding-window layers keep only the window; the training step "
                         "passes use_cache=False)")


# ---------------------------------------------------------------------------------------------
# Expert parallelism (ep > 1): all-to-all token dispatch around the local experts.
# ---------------------------------------------------------------------------------------------

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
