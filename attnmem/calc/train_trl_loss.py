"""TRL's fused LM head in a training step (`training_step(loss="trl_fused")`): the loss of TRL's
SFTTrainer from trl 1.16.0 on, which never builds the (B, s, V) logits. Read from the trl 1.16.0
wheel (PyPI, trl-1.16.0-py3-none-any.whl). Notation: attnmem/calc/train_common.py; P = B·(s − 1)
label positions after the shift, M of them scored (label not -100).

What runs (trl/trainer/sft_trainer.py, SFTTrainer.__init__ and compute_loss; trl/trainer/
utils.py, add_fused_lm_head; trl/kernels/chunked_logprob.py, ChunkedLogProbFunction):
- SFTTrainer.__init__ calls `add_fused_lm_head(model, outputs=("log_probs", "entropy",
  "is_top1"))` whatever loss_type ("nll", "dft"; "chunked_nll" is SFTConfig's deprecated alias
  of "nll"); with use_liger_kernel it forces Liger's fused_linear_cross_entropy off, so Liger's
  layer kernels run with this head. compute_loss calls `model(**inputs, fused_lm_head=True)`.
- The patched forward runs the backbone (use_cache=False), takes `last_hidden_state[:, :-1]`
  and `labels[:, 1:]` (views), `mask = labels != -100` (P bools) and, on Triton devices (CUDA),
  only the scored rows: `hidden_states[mask]` (a copy, M×h bf16) and `labels[mask]` (M int64),
  each through `mask.nonzero()` (16·M bytes, freed with the op).
- ChunkedLogProbFunction.forward: seven fp32 vectors of M (running max, sums, target logit...)
  and `mm_buf`, one bf16 tile of min(M, TOKEN_CHUNK_SIZE = 4096) × chunk_size
  (_CHUNKED_LOGPROB_CHUNK_SIZE = 32768, whatever V is); per (4096 rows, 32768 columns) tile,
  `torch.mm(..., out=tile)` and a Triton kernel that folds it into the vectors in place. Then
  log_z, the log-probabilities, x_sum_exp / sum_exp, the entropy (fp32 M each) and is_top1 (three
  bool M). It saves the M×h hidden copy, the weight, the targets, log_z and the entropy.
  Largest moment: the vectors, the tile, log_z, log-probabilities, the quotient and the entropy
  (36·M beyond what is saved) beside the backbone's output (T×h, alive until the patched
  forward returns).
- The outputs are scattered back to (B, s − 1) (`new_zeros(...).masked_scatter(mask, x)`, which
  saves the mask); the loss is `-log_probs.sum() / n` ("dft" multiplies the per-token loss by
  `log_probs.exp().detach()`, one fp32 P tensor saved until its product's backward, before the
  head's backward: no moment counted here changes). Nothing else of the head outlives the forward.
- The backward (autograd reaches the head after the loss's elementwise nodes: the gradient of the
  log-probabilities is `masked_select`'s fp32 M): `grad_hidden = zeros(M×h fp32)`,
  `grad_weight = zeros(V×h fp32)` when lm_head trains (full training; TRL refuses an adapter on
  lm_head), a second bf16 tile buffer, then per tile the recomputed product, the Triton kernel
  writing its gradient in place, and `torch.addmm(acc, tile, w, out_dtype=float32, out=acc)`
  (CUDA, torch >= 2.8: no temporaries); it returns `grad_hidden.to(bf16)` and
  `grad_weight.to(bf16)`, made while both fp32 accumulators and the buffer are alive: the
  largest moment. lm_head's bf16 gradient then becomes its .grad (g_lm, as in the plain step).
- After it, the index's backward scatters the M×h gradient into zeros (B, s − 1, h) and the
  slice's into zeros (B, s, h): under 2·P·h + 2·T·h beside the final norm's saved tensors, less
  than the last layer's backward already counted (the residual gradient and the MLP's
  backward), so no moment is added for it.

Devices without Triton (CPU, meta: `_use_triton` is False) take the torch path: every position
scored (`reshape`, not the mask), and `_forward_tile` / `_backward_tile` make fp32 copies of the
whole tile and several tile-sized temporaries, `_addmm_fp32` fp32 copies of the tile and the
weight chunk: gigabytes more at TRL's tile sizes (tests/calc/test_trl_fused_replay.py replays
both). calc counts the CUDA path.

Counted for precision "bf16" (TRL's bf16=True on a bf16 model: the tile's dtype is autocast's,
bf16, and no weight copy is made), tp = 1, sharding none / zero1 / zero2. Refused (not counted):
amp_bf16 (fp32 hidden states and per-chunk bf16 weight copies), kbit_prepare (fp32 stream and
lm_head), offload_activations (the head's saved tensors would go to the host), use_cache=True
(the patched forward sets it False), tensor parallelism, zero3 / fsdp (the head's weight is
gathered whole).
"""

from __future__ import annotations

import dataclasses

from attnmem.calc.models import ModelConfig
from attnmem.calc.train_common import PHASES, TrainingStepMemory

#: training_step's `loss`: "full" = transformers' own loss (the logits, cross_entropy's
#: log-softmax; today's default), "trl_fused" = TRL's fused LM head (module docstring).
LOSSES: tuple[str, ...] = ("full", "trl_fused")
#: trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE: the tile's columns (vocabulary slice).
TRL_VOCAB_CHUNK = 32768
#: trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE: the tile's rows.
TRL_TOKEN_CHUNK = 4096
#: The step's moments that replace the loss's and lm_head's backward under the fused head.
TRL_HEAD_FORWARD = "forward: TRL fused LM head"
TRL_HEAD_BACKWARD = "loss backward (TRL fused LM head)"
#: The loss's terms of the other losses (train_dense._model_terms, train_liger), replaced.
_REPLACED = ("lm_head input", "log-softmax output", "tanh of the soft-capped",
             "shifted labels (int64) and the loss", "fused loss:")
#: Phases of the other losses (train_common.PHASES[2:4], train_liger.LIGER_PHASE), replaced.
_REPLACED_PHASES = (PHASES[2], PHASES[3], "loss (Liger fused linear cross-entropy)")


def check_loss(loss: object, *, precision: str, kbit: bool, offload: bool, tp: int,
               sharding: str, use_cache: bool) -> bool:
    """True for "trl_fused", False for "full"; ValueError naming what is refused and why
    (module docstring)."""
    if not isinstance(loss, str) or loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; accepted: {', '.join(LOSSES)}")
    if loss == "full":
        return False
    why = None
    if precision != "bf16":
        why = (f"precision {precision!r} (fp32 hidden states and per-chunk bf16 weight copies "
               "not counted); accepted: bf16")
    elif kbit:
        why = "kbit_prepare=True (an fp32 stream and lm_head not counted); accepted: False"
    elif offload:
        why = ("offload_activations=True (the head's saved tensors on the host not counted); "
               "accepted: False")
    elif use_cache:
        why = "use_cache=True: the fused forward runs the backbone with use_cache=False"
    elif tp != 1:
        why = f"tp={tp} (the vocabulary split not counted); accepted: tp=1"
    elif sharding in ("zero3", "fsdp"):
        why = (f"sharding {sharding!r} (lm_head gathered whole not counted); accepted: none, "
               "zero1, zero2")
    if why:
        raise ValueError(f"loss='trl_fused' with {why}")
    return True


def trl_positions(batch: int, seq_len: int, lengths: tuple[int, ...] | None) -> tuple[int, int]:
    """(P, M): the label positions after the shift, B·(s − 1), and the scored ones, M, in the
    worst case (every label kept): one per token but each sequence's first, since the shift
    drops a row's first label and TRL's padding-free collator sets each packed sequence's first
    label to -100 (sft_trainer.py DataCollatorForLanguageModeling: `labels[position_ids == 0] =
    -100`)."""
    sequences = len(lengths) if lengths else batch
    return batch * (seq_len - 1), batch * seq_len - sequences


def trl_head_terms(batch: int, seq_len: int, h: int, lengths: tuple[int, ...] | None,
                   ) -> list[tuple[str, str, int]]:
    """What the fused head keeps from the forward to its backward (module docstring)."""
    p, m = trl_positions(batch, seq_len, lengths)
    return [
        ("logits and loss", "TRL fused head: hidden_states[mask], the scored rows' final hidden "
         "states (M×h bf16), saved", 2 * m * h),
        ("logits and loss", "TRL fused head: labels[mask] (int64), log_z and entropy (fp32), "
         "M each, saved", (8 + 4 + 4) * m),
        ("logits and loss", "TRL fused head: the label mask (bool, B×(s−1)), saved by the "
         "index and masked_scatter", p),
        ("logits and loss", "the loss and the token count (0-d)", 4 + 8),
    ]


def trl_head_moments(batch: int, seq_len: int, h: int, vocab: int,
                     lengths: tuple[int, ...] | None, lm_trains: bool,
                     vocab_chunk: int = TRL_VOCAB_CHUNK, token_chunk: int = TRL_TOKEN_CHUNK,
                     ) -> tuple[int, int]:
    """Bytes beyond (before-step + the activations with `trl_head_terms`) at the head's forward
    and backward moments (module docstring); lm_trains: lm_head's weight gets a gradient."""
    t = batch * seq_len
    _, m = trl_positions(batch, seq_len, lengths)
    buf = 2 * min(m, token_chunk) * vocab_chunk  # mm_buf, bf16
    loss = 4 + 8  # made after the head's forward
    forward = 2 * t * h + buf + (7 * 4 + 4 + 4) * m - loss
    backward = 4 * m + buf + (4 + 2) * m * h + ((4 + 2) * vocab * h if lm_trains else 0)
    return forward, backward


def trl_fused_step(st: TrainingStepMemory, model: ModelConfig, batch: int, seq_len: int,
                   lengths: tuple[int, ...] | None, base: int, lm_trains: bool,
                   ) -> TrainingStepMemory:
    """The step `st` (counted with transformers' loss or Liger's) with TRL's fused head in place
    of its loss: the loss's saved terms and moments replaced (module docstring), every other
    moment kept (they do not hold the loss's tensors). base: before-step + the layout's step
    buffers."""
    h, v = model.hidden_size, model.vocab_size
    terms = [x for x in st.activation_terms if not x[1].startswith(_REPLACED)]
    terms += trl_head_terms(batch, seq_len, h, lengths)
    parts = dict.fromkeys(st.activations, 0)
    for p, _, x in terms:
        parts[p] = parts.get(p, 0) + x
    acts = sum(parts.values())
    fwd, bwd = trl_head_moments(batch, seq_len, h, v, lengths, lm_trains)
    phases = {k: x for k, x in st.phases.items() if k not in _REPLACED_PHASES}
    phases[TRL_HEAD_FORWARD] = base + acts + fwd
    phases[TRL_HEAD_BACKWARD] = base + acts + bwd
    phase = max(phases, key=phases.__getitem__)
    return dataclasses.replace(st, activations=parts, activation_terms=tuple(terms),
                               phases=phases, peak_bytes=phases[phase], peak_phase=phase)

