"""Packed sequences (padding-free rows) in a training step, and the attention masks a step
keeps: which layers get a materialized mask, what the checkpoints keep of them, and whether the
forced SDPA backend has a kernel for the masked call. Notation: attnmem/calc/train_common.py.

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
"""

from __future__ import annotations

from attnmem.calc.backends import NoKernel, training_refusal
from attnmem.calc.models import ModelConfig
from attnmem.calc.train_common import _Dims, _is_gpt2
from attnmem.calc.units import MAX_SEQ_LEN, check_int

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


def _packed_window(model: ModelConfig, lengths: tuple[int, ...]) -> int | None:
    """The sliding window of a packed row's attention calls when every attention layer has
    one (each call then gets it: attnmem/kernels/hf/attention.py), else None: a global layer's call
    is the larger (attnmem.calc.peak.varlen_peak_bytes counts the Hopper backward's fp32 dQ buffer
    only without a window shorter than the longest sequence), and the step takes the largest."""
    layers = model.attention_layers or model.num_layers
    if lengths and model.sliding_window and model.sliding_window_layers >= layers:
        return model.sliding_window
    return None


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


def _masked_layers(model: ModelConfig, impl: str, dm: _Dims) -> int:
    """How many layers get a materialized mask under SDPA: every layer of a packed row (the
    block-diagonal mask), else the sliding-window rule (_sliding_masked)."""
    if dm.lengths:
        return model.num_layers if impl.startswith("sdpa") else 0
    return _sliding_masked(model, impl, dm.s)


def _check_kernel(model: ModelConfig, attention: str, s: int, masked: int,
                  lengths: tuple[int, ...]) -> None:
    """NoKernel where the forced SDPA backend has no kernel for this step (attnmem.calc.backends)."""
    why = training_refusal(model, attention, s, masked, packed=bool(lengths))
    if why:
        raise NoKernel(f"{attention!r} cannot run this training step: {why}")


def _mask_count(model: ModelConfig) -> int:
    """Distinct additive masks eager attention gets: one per layer type in use (full,
    sliding; masking_utils builds one of each). GptOssModel.forward builds both whatever the
    layer types."""
    if model.model_type == "gpt_oss":
        return 2
    sliding = model.sliding_window_layers if model.sliding_window else 0
    return (sliding > 0) + (sliding < model.num_layers)


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
