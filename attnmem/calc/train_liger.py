"""Liger's kernels in a training step (`liger=True`), as liger-kernel's
apply_liger_kernel_to_llama patches a Llama-family model with its defaults (rope=True,
cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True, swiglu=True;
src/liger_kernel/transformers/monkey_patch.py) and as TRL/transformers' use_liger_kernel=True
applies it. Read from linkedin/Liger-Kernel at ead96b6 (2026-08-21). Notation:
attnmem/calc/train_common.py.

- RMSNorm (ops/rms_norm.py, LigerRMSNormFunction): `ctx.save_for_backward(X, W, RSTD)`: the
  bf16 input itself (2Th) and one fp32 rstd per row (casting_mode "llama": 4T), in place of
  transformers' fp32 copy (4Th) and bf16 normalized input (2Th); the backward writes dX into
  dY (in_place=True). Its fp32 (SMs × h) partial weight gradient `_dW` (made even for a frozen
  weight) is not counted: a norm's backward comes after its block's, never at a layer's
  highest moment.
- SwiGLU (ops/swiglu.py, LigerSiLUMulFunction): `ctx.save_for_backward(a, b)`: gate(x) and
  up(x) (2TI each), not act(gate(x)); the backward writes da, db into a, b.
- RoPE (ops/rope.py, rope_forward): rotates the projections' q and k in place (transposed back
  to their physical layout, `.contiguous()` a no-op) and saves cos and sin: the saved bytes are
  transformers' (the rotated q and k kept by attention), so nothing changes in the count.
- Fused linear cross-entropy (ops/fused_linear_cross_entropy.py,
  fused_linear_cross_entropy_forward; model/llama.py lce_forward with skip_logits in training):
  the logits are never built whole. The T rows are cut in chunks of
  `chunk_size = next_power_of_2(cdiv(T, cdiv(V, h)))` (`flce_chunk`); per chunk the bf16
  logits (chunk×V) are made, the cross-entropy kernel writes their gradient in place, and the
  gradients are accumulated in the forward: grad_input = zeros_like(input) (T×h, bf16),
  grad_weight = zeros_like(weight) (when lm_head is trained; accum_dtype None: the weight's
  dtype), loss_1d (fp32, T), and per chunk `grad_logits_chunk @ weight` (chunk×h) and
  `torch.mm(grad_logits_chunk.t(), input_chunk).float()` (V×h bf16 then its fp32 copy) added
  into grad_weight. `ctx.save_for_backward(grad_input, grad_weight, grad_bias)`: what the
  step keeps of the loss until the backward, where they are returned as they are (grad_output
  is 1.0) and grad_weight becomes lm_head's .grad. So no log-softmax (4TV), no logits'
  gradients (2·4TV) and no lm_head input are kept.
- LoRA (peft adapters on a frozen base): the last layer's MLP moments, step by step
  (lora_liger_moments; with checkpointing, lora_liger_ckpt_moments: each layer recomputed
  inside its backward by torch.utils.checkpoint's non-reentrant path). Checked against a
  meta-device replay of the real step with liger-kernel 0.8.2's Functions, their Triton kernel
  launches doing nothing (tests/calc/test_training_liger_lora.py).
Refused (not counted): amp_bf16 (amp_custom_fwd casts), kbit_prepare's fp32 stream, tied
embeddings (the forward's grad_weight meets the embedding's in one .grad), Gemma, qk-norm,
GPT-2, Phi-3, MoE, gpt-oss, tensor parallelism.
"""

from __future__ import annotations

from attnmem.calc.models import ModelConfig
from attnmem.calc.train_common import PHASES, _Dims
from attnmem.calc.train_dense import _GEMMA
from attnmem.calc.units import check_bool

#: Model types whose Liger patch is counted (apply_liger_kernel_to_llama / _mistral / _qwen2).
LIGER_MODEL_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2")
#: The step's moment that replaces the loss's and lm_head's backward under Liger.
LIGER_PHASE = "loss (Liger fused linear cross-entropy)"
PHASES_BACKWARD_LAST = PHASES[4]


def check_liger(model: ModelConfig, liger: object, precision: str, kbit: bool, tp: int) -> bool:
    check_bool("liger", liger)
    if not liger:
        return False
    if model.model_type not in LIGER_MODEL_TYPES or model.qk_norm or model.model_type in _GEMMA \
            or model.num_experts > 1:
        raise ValueError(f"liger=True on {model.name!r} ({model.model_type}): Liger's kernels "
                         "are counted for " + ", ".join(LIGER_MODEL_TYPES)
                         + " (dense, RMSNorm, SwiGLU, no qk-norm)")
    if model.tie_embeddings:
        raise ValueError(f"liger=True on {model.name!r}: tied embeddings (the fused loss's "
                         "lm_head gradient meets the embedding's) are not counted")
    if precision != "bf16":
        raise ValueError(f"liger=True with precision {precision!r}: only 'bf16' is counted")
    if kbit:
        raise ValueError("liger=True with kbit_prepare=True: Liger's kernels on the fp32 "
                         "stream of a kbit-prepared model are not counted")
    if tp != 1:
        raise ValueError(f"liger=True with tp={tp}: not counted (tp=1 only)")
    return True


def flce_chunk(t: int, vocab: int, h: int) -> int:
    """Rows per chunk of the fused linear cross-entropy: next_power_of_2(cdiv(T, cdiv(V, h)))."""
    inc = -(-vocab // h)
    rows = -(-t // inc)
    return 1 << (rows - 1).bit_length()


def liger_layer_terms(terms: list[tuple[str, str, int]], dm: _Dims,
                      ) -> list[tuple[str, str, int]]:
    """A layer's (or the final norm's) saved tensors with Liger's RMSNorm and SwiGLU in place of
    transformers' (module docstring)."""
    t, h, i = dm.t, dm.h, dm.inter
    out: list[tuple[str, str, int]] = []
    mlp = any(lab.startswith(("gate(x)", "act(gate(x)), kept", "up(x)")) for _, lab, _ in terms)
    for part, lab, x in terms:
        if lab.endswith("fp32 copy of the input (pow)"):
            where = lab.split(":")[0]
            out.append((part, f"{where}: its input X (bf16), kept by LigerRMSNorm", 2 * t * h))
            continue
        if lab.endswith("normalized input (weight ×)"):
            continue
        if lab.startswith(("gate(x)", "act(gate(x)), kept", "up(x)")):
            continue
        out.append((part, lab, x))
    if mlp:
        out += [("MLP", "gate(x), kept by LigerSiLUMulFunction", 2 * t * i),
                ("MLP", "up(x), kept by LigerSiLUMulFunction", 2 * t * i)]
    return out


def liger_model_terms(terms: list[tuple[str, str, int]], dm: _Dims, g_lm: int,
                      ) -> list[tuple[str, str, int]]:
    """The model-level terms with LigerRMSNorm as the final norm and the fused loss: lm_head's
    input, the log-softmax and (Gemma) tanh go; the loss saves grad_input (T×h bf16) and, when
    lm_head is trained, its weight gradient (g_lm bytes) made in the forward."""
    out = [x for x in liger_layer_terms(terms, dm)
           if not x[1].startswith(("lm_head input", "log-softmax", "tanh of the soft-capped"))]
    out.append(("logits and loss", "fused loss: lm_head input gradient (T×h bf16), made in the "
                "forward and saved", 2 * dm.t * dm.h))
    if g_lm:
        out.append(("logits and loss", "fused loss: lm_head weight gradient, made in the forward "
                    "and saved (becomes its .grad)", g_lm))
    return out


def flce_forward_extra(dm: _Dims, g_lm: int) -> int:
    """The fused loss's transient bytes at its largest moment, beyond what it saves and its
    input: loss_1d (fp32 T) and target_mask (bool T) beside the larger of
    - one chunk's bf16 logits (chunk×V) and `grad_logits_chunk @ weight` (chunk×h); when lm_head
      is trained, torch.mm's V×h bf16 product and its fp32 copy (`.float()`) before they are
      added into grad_weight;
    - two chunks' logits, from the second chunk on: `logits_chunk = _input_chunk @ weight.t()`
      is made while the previous chunk's logits are still held, by the old `logits_chunk` and by
      `grad_logits_chunk`, which is rebound only later in the loop (ops/fused_linear_cross_
      entropy.py, fused_linear_cross_entropy_forward; a meta-device replay of 0.8.2's step shows
      both alive). With a frozen lm_head this is the loss's moment."""
    c = min(flce_chunk(dm.t, dm.vocab, dm.h), dm.t)
    one = 2 * c * dm.vocab + 2 * c * dm.h
    if g_lm:
        one += (2 + 4) * dm.vocab * dm.h
    two = 2 * 2 * c * dm.vocab if dm.t > c else 0
    return 4 * dm.t + dm.t + max(one, two)


# --- LoRA with Liger: the last layer's MLP, step by step ------------------------------------
# With a frozen base and the fused loss, no T×V tensor exists, so the step's peak moves to the
# last decoder layer's MLP: in the forward, the fp32 adapter outputs of its linears; in the
# backward, the adapters' fp32 gradients. Both are counted as the ordered allocations and
# frees that the modules make (peft/tuners/lora/layer.py Linear.forward; liger-kernel 0.8.2
# ops/swiglu.py LigerSiLUMulFunction; torch's autograd engine runs a node's inputs' gradient
# functions newest first and frees a node's saved tensors and inputs when it returns).


class _Tape:
    """Bytes alive above a starting moment, and the most reached."""

    def __init__(self) -> None:
        self.now = 0
        self.top = 0

    def alloc(self, n: int) -> None:
        self.now += n
        self.top = max(self.top, self.now)

    def free(self, n: int) -> None:
        self.now -= n

    def split(self) -> tuple[int, int]:
        """(most so far, now), and the most is counted afresh from now on."""
        out = (self.top, self.now)
        self.top = self.now
        return out


def _adapter_forward(tp: _Tape, t: int, fin: int, fout: int, r: int, e: int, dropout: bool,
                     adapted: bool, saved: bool = True, stop: bool = False) -> int:
    """One linear's forward (peft lora.Linear.forward): `result = base_layer(x)` (bf16 T×out);
    `x = _cast_input_dtype(x, lora_A dtype)` (an fp32 copy with fp32 adapters, kept by lora_A
    without dropout; the local `x` keeps it to the end of forward); with dropout
    (native_dropout) a bool mask and the dropped input, both kept; lora_A's output (kept by
    lora_B); lora_B's output and `* scaling` (the first dies once the product exists);
    `result + ...` promotes to the adapter dtype (fp32 T×out) before the old result and the
    product die; `result.to(bf16)` (fp32 adapters) before the fp32 sum dies. Returns the bytes
    it leaves kept (its saved tensors); the bf16 output stays on the tape.
    saved=False: the forward of a checkpointed layer (torch.utils.checkpoint, non-reentrant:
    its pack hook keeps a holder, not the tensor), so nothing is kept: the mask dies as
    native_dropout returns, the dropped input once lora_A has returned, lora_A's output once
    lora_B has, the cast at return. stop: the recomputation of a checkpointed layer ends here
    (checkpoint's early stop: `_StopRecomputationError` is raised from the pack hook of the
    last saved tensor, lora_B's input; autograd saves an op's inputs before it runs, so lora_B's
    product is never made); the base result is left on the tape."""
    tp.alloc(2 * t * fout)  # base result (a frozen linear: its output, nothing kept)
    if not adapted:
        return 0
    if not saved:
        if e == 4:
            tp.alloc(4 * t * fin)  # the cast, a local until forward returns
        if dropout:
            tp.alloc(t * fin + e * t * fin)  # mask and dropped input
            tp.free(t * fin)  # the mask: nothing keeps it
        tp.alloc(e * t * r)  # lora_A's output
        if dropout:
            tp.free(e * t * fin)  # the dropped input, a temporary of the expression
        tp.alloc(e * t * fout)  # lora_B's output
        tp.free(e * t * r)  # lora_A's output, not kept
        tp.alloc(e * t * fout)  # × scaling
        tp.free(e * t * fout)  # lora_B's output
        tp.alloc(max(e, 2) * t * fout)  # result + ...
        tp.free(2 * t * fout + e * t * fout)
        if e == 4:
            tp.alloc(2 * t * fout)  # result.to(bf16)
            tp.free(4 * t * fout + 4 * t * fin)  # the fp32 sum; the cast at return
        return 0
    kept = e * t * r
    if dropout:
        if e == 4:
            tp.alloc(4 * t * fin)  # the cast, held by the local x until forward returns
        tp.alloc(t * fin + e * t * fin)  # mask and dropped input, kept
        kept += t * fin + e * t * fin
    elif e == 4:
        tp.alloc(4 * t * fin)  # the cast, kept by lora_A
        kept += 4 * t * fin
    tp.alloc(e * t * r)  # lora_A's output
    if stop:
        return kept
    tp.alloc(e * t * fout)  # lora_B's output
    tp.alloc(e * t * fout)  # × scaling
    tp.free(e * t * fout)  # lora_B's output dies
    tp.alloc(max(e, 2) * t * fout)  # result + ..., in the promoted dtype
    tp.free(2 * t * fout + e * t * fout)  # the old result and the scaled product
    if e == 4:
        tp.alloc(2 * t * fout)  # result.to(bf16)
        tp.free(4 * t * fout)
        if dropout:
            tp.free(4 * t * fin)  # the cast, at return
    return kept


def _adapter_backward(tp: _Tape, t: int, fin: int, fout: int, r: int, e: int, dropout: bool,
                      adapted: bool, grad_dies: bool, input_dies: int = 0,
                      split: list[tuple[int, int]] | None = None) -> int:
    """One linear's backward, its output gradient g (bf16 T×out) alive at the start; returns
    the adapter weight-gradient bytes it made (they stay, as .grad). grad_dies: g is freed
    once its first consumer returns (False where the residual stream shares it). fp32
    adapters: ToCopyBackward's fp32 g, AddBackward's bf16 cast of it for the base result,
    MulBackward's × scaling (then the fp32 g dies); lora_B: the T×r gradient and its weight
    gradient, then the scaled gradient and the saved T×r die; lora_A: the input gradient
    (adapter dtype, T×in) and its weight gradient, then the T×r gradient and the saved input
    die; ToCopyBackward of the cast: the bf16 input gradient, then the fp32 one dies; the base
    matmul: its bf16 input gradient, then its output gradient dies, then the two input
    gradients are summed (`accumulate`); the sum stays on the tape. bf16
    adapters: no casts (AddBackward hands g itself to both sides). A frozen, not adapted
    linear: its input gradient only. input_dies: bytes of the bf16 input that lora_A kept
    (bf16 adapters without dropout) and that die with it. split: where given, the tape is
    split (`_Tape.split`, appended to it) at the first node that reads a saved tensor (lora_B's
    MmBackward, or the frozen base's without an adapter): in a checkpointed layer that is where
    the recomputation runs (torch.utils.checkpoint's unpack hook); the nodes before it (the
    casts and `* scaling`'s MulBackward, which save no tensor) run first."""
    if not adapted:
        if split is not None:
            split.append(tp.split())
        tp.alloc(2 * t * fin)
        if grad_dies:
            tp.free(2 * t * fout)
        return 0
    if e == 4:
        tp.alloc(4 * t * fout)
        if grad_dies:
            tp.free(2 * t * fout)
        tp.alloc(2 * t * fout)
        tp.alloc(4 * t * fout)
        tp.free(4 * t * fout)
    else:
        tp.alloc(2 * t * fout)
    if split is not None:
        split.append(tp.split())
    grads = e * r * (fin + fout)
    tp.alloc(e * t * r + e * r * fout)
    tp.free(e * t * fout + e * t * r)
    tp.alloc(e * t * fin + e * r * fin)
    tp.free(e * t * r)
    if dropout:
        tp.free(t * fin + e * t * fin)  # mask and dropped input (the dropout's backward follows)
        tp.alloc(e * t * fin)  # native_dropout_backward: grad × mask
        tp.free(e * t * fin)
    elif e == 4:
        tp.free(4 * t * fin)  # the saved cast
    else:
        tp.free(input_dies)
    if e == 4:
        tp.alloc(2 * t * fin)
        tp.free(4 * t * fin)
    tp.alloc(2 * t * fin)  # the base's input gradient
    if e == 4 or grad_dies:
        tp.free(2 * t * fout)  # the base's output gradient (fp32 adapters: g's bf16 cast)
    accumulate(tp, 2 * t * fin)
    return grads


def accumulate(tp: _Tape, n: int) -> None:
    """Two gradients of one tensor meet in autograd's InputBuffer: `old_var + var` (a new
    tensor, as the CPU and meta replays of these steps show: no in-place add), then both die."""
    tp.alloc(n)
    tp.free(2 * n)


def _mlp_label(label: str) -> bool:
    """A layer term that the MLP block keeps (made after the post-attention norm)."""
    return label.startswith(("gate_proj:", "up_proj:", "down_proj:", "gate, up input",
                             "act(gate(x))·up(x)", "gate(x), kept by Liger",
                             "up(x), kept by Liger"))


def lora_mlp_saved(terms: list[tuple[str, str, int]]) -> int:
    """Bytes of a layer's terms that its MLP block keeps (`_mlp_label`)."""
    return sum(x for _, lab, x in terms if _mlp_label(lab))


#: How the MLP's forward runs: "forward" (no checkpointing: its saved tensors kept),
#: "checkpointed" (the first forward of a checkpointed layer: nothing kept), "recompute" (the
#: recomputation inside the layer's backward: kept, ended by checkpoint's early stop).
MLP_FORWARD_MODES = ("forward", "checkpointed", "recompute")


def lora_mlp_forward(dm: _Dims, rank: int, e: int, dropout: bool, targets: tuple[str, ...],
                     mode: str = "forward") -> tuple[int, int]:
    """(most bytes above the MLP's start, bytes it keeps) of a LoRA + Liger MLP forward
    (LigerSwiGLUMLP.forward: `down_proj(LigerSiLUMulFunction.apply(gate_proj(x), up_proj(x)))`):
    gate(x) and up(x) (bf16, both kept by the SiLU product), the product c (bf16 T×I,
    `torch.empty_like(a)` in swiglu_forward), down_proj(c); c dies after down_proj unless a bf16
    adapter keeps it. The start holds the MLP input x (the norm output).
    mode (MLP_FORWARD_MODES): "checkpointed" keeps nothing (`_adapter_forward` saved=False;
    gate(x) and up(x) die once the product is made); "recompute" keeps what "forward" keeps and
    ends at the layer's last saved tensor (torch.utils.checkpoint's early stop, on by default:
    `_recomputation_hook.pack_hook` raises _StopRecomputationError once as many tensors were
    packed as the forward saved): lora_B's input with an adapted down_proj, else the frozen
    down_proj's weight (saved for c's gradient), packed before its product is made."""
    if mode not in MLP_FORWARD_MODES:
        raise ValueError(f"unknown MLP forward mode {mode!r}; accepted: "
                         + ", ".join(MLP_FORWARD_MODES))
    t, h, i = dm.t, dm.h, dm.inter
    saved = mode != "checkpointed"
    tp = _Tape()
    kept = 0
    for name in ("gate_proj", "up_proj"):
        kept += _adapter_forward(tp, t, h, i, rank, e, dropout, name in targets, saved)
    tp.alloc(2 * t * i)  # c
    if saved:
        kept += 2 * 2 * t * i  # gate(x), up(x)
    else:
        tp.free(2 * 2 * t * i)  # gate(x), up(x): nothing keeps them
    if mode == "recompute" and "down_proj" not in targets:
        return tp.top, kept  # stopped before the frozen down_proj's product
    kept += _adapter_forward(tp, t, i, h, rank, e, dropout, "down_proj" in targets, saved,
                             stop=mode == "recompute")
    return tp.top, kept


def lora_mlp_backward(dm: _Dims, rank: int, e: int, dropout: bool, targets: tuple[str, ...],
                      split: list[tuple[int, int]] | None = None) -> tuple[int, int]:
    """(most bytes above the start, adapter gradient bytes made) of the same MLP's backward,
    the layer's output gradient (shared with the residual stream) and every kept tensor alive
    at the start: down_proj's backward (`_adapter_backward`) to c's gradient;
    LigerSiLUMulFunction's backward writes d(gate) and d(up) into the kept gate(x) and up(x)
    (swiglu_backward) and frees c's gradient; then up_proj's and gate_proj's backward (newest
    first), each freeing its output gradient (the kept tensor's storage) after its first
    node, their input gradients summed into one (bf16 T×h). split: as `_adapter_backward`'s,
    for down_proj, the layer's first node to read a saved tensor (then the returned top is the
    most after it)."""
    t, h, i = dm.t, dm.h, dm.inter
    bf16_kept = e == 2 and not dropout
    tp = _Tape()
    grads = _adapter_backward(tp, t, i, h, rank, e, dropout, "down_proj" in targets, False,
                              2 * t * i if bf16_kept else 0, split)
    tp.free(2 * t * i)  # c's gradient, consumed by the SiLU product's backward (in place)
    grads += _adapter_backward(tp, t, h, i, rank, e, dropout, "up_proj" in targets, True)
    # the norm output x, kept by both bf16 lora_A's: freed with the second
    both = bf16_kept and {"gate_proj", "up_proj"} <= set(targets)
    grads += _adapter_backward(tp, t, h, i, rank, e, dropout, "gate_proj" in targets, True,
                               2 * t * h if both else 0)
    accumulate(tp, 2 * t * h)  # x's gradients from up_proj and gate_proj
    return tp.top, grads


#: The forward moment that LoRA + Liger adds: the last layer's MLP (its adapters' fp32 outputs).
LIGER_MLP_PHASE = "forward: MLP of the last layer (LoRA + Liger)"


def lora_liger_moments(dm: _Dims, rank: int, e: int, dropout: bool, targets: tuple[str, ...],
                       last: list[tuple[str, str, int]], fwd_base: int,
                       bwd_base: int, attn_extra: int, first_terms: list[tuple[str, str, int]],
                       first_base: int, attn_first: int) -> dict[str, int]:
    """The last layer's MLP moments of a LoRA step with Liger's kernels (peft's adapters on a
    frozen base): {LIGER_MLP_PHASE: forward, "backward of the last layer": backward}.
    Without checkpointing (with it: lora_liger_ckpt_moments).
    fwd_base: every tensor kept by the layers (and shared) at the end of the forward, before the
    final norm; bwd_base: what the last layer's backward starts from (kept tensors less the
    loss's, the incoming gradient); attn_extra: the
    attention side of that backward (train_lora's, unchanged); first_terms, first_base,
    attn_first: layer 0's terms, the start of its backward (the later layers' gradients made)
    and its attention side.
    Forward (no checkpointing): the MLP block's own kept tensors are not yet all made, and
    beside them live the embedding output (LlamaModel.forward's `inputs_embeds`, a local to the
    end of the layer loop) and the MLP input (the post-attention norm output), each bf16 T×h,
    and the int64 position ids the model made (a packed row's are an input, counted before).
    Backward: the MLP's (lora_mlp_backward) or the attention side's excess, the larger."""
    th = 2 * dm.t * dm.h
    mlp_kept = lora_mlp_saved(last)
    top_f, _ = lora_mlp_forward(dm, rank, e, dropout, targets)
    top_b, _ = lora_mlp_backward(dm, rank, e, dropout, targets)
    back = bwd_base + max(top_b, attn_extra)
    first = first_base + max(top_b, attn_first)
    pos = 0 if dm.lengths else 8 * dm.s  # the int64 position ids the model made (a local)
    return {LIGER_MLP_PHASE: fwd_base - mlp_kept + th + th + pos + top_f,
            PHASES_BACKWARD_LAST: back, PHASES[5]: first}


#: The label of a layer's term that checkpointing keeps anyway: the input norm's X is the
#: layer's input, kept by the checkpoint (train_lora's "layer inputs kept by the checkpoints").
_CHECKPOINTED_INPUT = "input norm: its input X (bf16), kept by LigerRMSNorm"


def lora_liger_ckpt_moments(dm: _Dims, rank: int, e: int, dropout: bool,
                            targets: tuple[str, ...], last: list[tuple[str, str, int]],
                            first: list[tuple[str, str, int]], fwd_base: int, last_base: int,
                            first_base: int, core_last: int, core_first: int, attn_fwd: int,
                            attn_last: int, attn_first: int) -> dict[str, int]:
    """The moments of a checkpointed LoRA + Liger step's layers (peft adapters on a frozen base;
    checkpointing as transformers' gradient_checkpointing_enable runs it: torch.utils.checkpoint
    with use_reentrant=False around each decoder layer, early stop on).
    {LIGER_MLP_PHASE: the last layer's MLP in the forward, PHASES[4]: the last layer's
    backward, PHASES[5]: layer 0's}.

    Forward: a checkpointed layer keeps nothing (the non-reentrant checkpoint's pack hook
    stores a holder, torch/utils/checkpoint.py `_checkpoint_hook`), so beside the layers'
    inputs (fwd_base, which holds every tensor the step keeps until the loss, less the loss's)
    live the post-attention residual sum (Liger's RMSNorm would keep it, here only its local)
    and the MLP input, each bf16 T×h, and the MLP's transients (`lora_mlp_forward`,
    "checkpointed").

    A layer's backward starts (last_base, first_base) from the checkpointed inputs not yet
    consumed, the shared tensors, the later layers' adapter gradients and the incoming gradient
    (for the last layer: Liger's fused loss's saved grad_input, which LigerRMSNorm's backward
    overwrote in place with the final norm's input gradient). Its first autograd nodes save no
    tensor (down_proj's `result.to(bf16)`, `result + ...` and `* scaling`: with fp32 adapters
    the fp32 gradient, its bf16 cast for the base and the scaled copy, the fp32 one freed;
    with bf16 the scaled copy), so they run before anything is recomputed. The first node that
    unpacks a saved tensor (lora_B's MmBackward; the frozen base's without an adapter) runs the
    layer's forward again under `_recomputation_hook` (checkpoint.py unpack_hook), keeping what
    the layer saves, until the last of them is packed (early stop). Its moments:
    - the attention call, as a forward without checkpointing has it (train_lora's first phase:
      the layer's terms before the MLP side, the input norm output, the call's transients);
    - o_proj's adapter forward (`_adapter_forward`) beside the attention side's kept tensors
      and the input norm's output, which lives until self_attn returns;
    - the MLP (`lora_mlp_forward`, "recompute") beside the attention side's kept tensors, the
      residual sum and the MLP input.
    Then the backward proper: the layer's kept tensors and the adapters' backward
    (`lora_mlp_backward` after its split) or the attention side's (attn_last, attn_first:
    train_lora's `_lora_attention_extra`), the larger.
    The layer's kept tensors (last, first: its term lists with Liger's) hold the input norm's
    X: that is the checkpointed input, counted in the base, so it is not counted twice.
    core_last, core_first: the layers' MLP-side terms (train_dense's `_core_saved`); attn_fwd:
    the attention call's forward transients (`_attention_forward_extra`)."""
    t, h = dm.t, dm.h
    th = 2 * t * h

    def kept(terms: list[tuple[str, str, int]]) -> int:
        return sum(x for _, lab, x in terms if lab != _CHECKPOINTED_INPUT)

    o_tape = _Tape()
    _adapter_forward(o_tape, t, dm.q, h, rank, e, dropout, "o_proj" in targets)
    o_top = o_tape.top
    top_rc, _ = lora_mlp_forward(dm, rank, e, dropout, targets, "recompute")
    split: list[tuple[int, int]] = []
    top_b, _ = lora_mlp_backward(dm, rank, e, dropout, targets, split)
    (pre_top, pre_end), = split

    def layer(terms: list[tuple[str, str, int]], base: int, core: int, attn: int) -> int:
        k = kept(terms)
        attention_side = k - core  # the terms made before o_proj's
        recompute = max(attention_side + th + attn_fwd,
                        attention_side + th + o_top,
                        k - lora_mlp_saved(terms) + th + top_rc)
        return base + max(pre_top, pre_end + recompute, k + max(top_b, attn))

    top_f, _ = lora_mlp_forward(dm, rank, e, dropout, targets, "checkpointed")
    return {LIGER_MLP_PHASE: fwd_base + th + th + top_f,
            PHASES_BACKWARD_LAST: layer(last, last_base, core_last, attn_last),
            PHASES[5]: layer(first, first_base, core_first, attn_first)}
