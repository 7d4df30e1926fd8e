"""One training step's peak for any causal LM transformers builds, traced on the meta device.

What is predicted is what the training measurement records (attnmem/measure/train/
procedure.py; attnmem.calc.training_step predicts the same for the families it has rules for):
the model in bf16 (or fp32), `model.train()`, optional checkpointing
(`gradient_checkpointing_enable(use_reentrant=False)`), optional LoRA adapters through peft
(`get_peft_model`, its default fp32 adapters), `torch.optim.AdamW(trainable, lr=1e-5)` with
foreach (torch's default for CUDA parameters); one warm-up step, then
`max_memory_allocated()` over a step: forward with `labels = input_ids` (transformers'
ForCausalLMLoss: the logits upcast to fp32), `loss.backward()`, `optimizer.step()`,
`optimizer.zero_grad(set_to_none=True)`. Memory before the step: weights, AdamW's two moments,
the inputs and cuBLAS's workspaces.

How: as attnmem.trace.inference: the model's own modules on the meta device under
attnmem.trace.recorder.Recorder, replayed through attnmem.calc.allocator; autograd, peft,
checkpointing and AdamW's foreach kernels run as they are (AdamW's step counters live on the
CPU and are not counted, as on CUDA). Fused SDPA backends are attnmem.trace.fake_attention's
autograd function (forward and backward allocations from attnmem.calc.attention_steps); eager
attention runs as it is. cuBLAS's two workspaces (forward and autograd's backward stream:
attnmem.calc.train_common.CUBLAS_WORKSPACE_BYTES) are added.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from functools import lru_cache

from attnmem.calc.backends import NoKernel
from attnmem.calc.train_common import CUBLAS_WORKSPACE_BYTES
from attnmem.calc.units import MAX_BATCH, MAX_SEQ_LEN, check_int
from attnmem.trace.fake_attention import sdpa_as
from attnmem.trace.inference import (
    TRACE_ATTENTIONS,
    TRACE_LOCK,
    TraceTooSlow,
    _built,
    _held_bytes,
    loop_guard,
)
from attnmem.trace.masks import unpacked_rows
from attnmem.trace.recorder import Recorder, replay

#: The dtypes a training trace runs: the harness's bf16 (parameters and moments in bf16, no
#: autocast) and fp32.
TRAIN_TRACE_DTYPES = ("bf16", "fp32")


@dataclass(frozen=True)
class TracedTraining:
    """A training step's memory traced on the meta device; bytes are absolute."""

    model_class: str
    batch: int
    seq_len: int
    attention: str
    dtype: str
    checkpointing: bool
    lora_rank: int | None
    weights_bytes: int  # parameters and buffers (adapters included)
    trainable_params: int
    before_step_bytes: int  # weights, AdamW's state, inputs, workspaces
    peak_bytes: int
    at_peak: tuple[tuple[str, int, int], ...]  # (where|op, tensors, bytes), largest first
    seconds: float
    transformers_version: str


def trace_training(d: dict, batch: int, seq_len: int, attention: str = "sdpa",
                   dtype: str = "bf16", checkpointing: bool = False,
                   lora_rank: int | None = None,
                   lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
                   ) -> TracedTraining:
    """A training step's peak for the causal LM config dict `d` describes (module docstring).
    ValueError names a bad input or why the model cannot be built or run; NoKernel why a
    forced SDPA backend has none."""
    b = check_int("batch", batch, 1, MAX_BATCH)
    s = check_int("seq_len", seq_len, 2, MAX_SEQ_LEN)
    if attention not in TRACE_ATTENTIONS:
        raise ValueError(f"attention {attention!r}: the trace runs {TRACE_ATTENTIONS}")
    if dtype not in TRAIN_TRACE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: the training trace runs {TRAIN_TRACE_DTYPES}")
    if not isinstance(checkpointing, bool):
        raise ValueError(f"checkpointing must be True or False, got {checkpointing!r}")
    if lora_rank is not None:
        lora_rank = check_int("lora_rank", lora_rank, 1, 4096)
        if not lora_targets or not all(isinstance(t, str) and t for t in lora_targets):
            raise ValueError(f"lora_targets must name modules, got {lora_targets!r}")
    return _trace(json.dumps(d, sort_keys=True), b, s, attention, dtype, checkpointing,
                  lora_rank, tuple(lora_targets))


@lru_cache(maxsize=64)
def _trace(text: str, b: int, s: int, attention: str, dtype: str, checkpointing: bool,
           lora_rank: int | None, targets: tuple[str, ...]) -> TracedTraining:
    with TRACE_LOCK:
        return _locked(text, b, s, attention, dtype, checkpointing, lora_rank, targets)


def _locked(text: str, b: int, s: int, attention: str, dtype: str, checkpointing: bool,
            lora_rank: int | None, targets: tuple[str, ...]) -> TracedTraining:
    import copy

    import torch
    import transformers

    t0 = time.perf_counter()
    # a private copy: training mode, checkpointing and adapters change the module tree
    built = _built(text, dtype, "eager" if attention == "eager" else "sdpa")
    model = copy.deepcopy(built)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora_rank is not None:
        try:
            import peft
        except ImportError as err:
            raise ValueError(f"LoRA needs peft installed ({err})") from None
        try:
            model = peft.get_peft_model(model, peft.LoraConfig(
                r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0,
                target_modules=list(targets)))
        except Exception as e:
            raise ValueError(f"peft cannot add LoRA adapters to {targets}: "
                             f"{' '.join(str(e).split())[:300]}") from None
    trainable = [p for p in model.parameters() if p.requires_grad]
    rec = Recorder(devices=("meta",), values=True)
    rec.known(*model.parameters(), *model.buffers())
    meta = torch.device("meta")
    fake = sdpa_as(attention) if attention != "eager" else contextlib.nullcontext()
    opt = torch.optim.AdamW(trainable, lr=1e-5, foreach=True)
    try:
        # Python loops over the tokens are not folded here (autograd records each iteration),
        # only refused where they would take the trace past its limit
        with fake, unpacked_rows(), rec, rec.track_modules(model), loop_guard(rec, model):
            ids = torch.zeros(b, s, dtype=torch.long, device=meta)
            labels = torch.zeros(b, s, dtype=torch.long, device=meta)
            for step in ("warm-up", "step"):
                rec.mark(step)
                loss = model(input_ids=ids, labels=labels).loss
                loss.backward()
                del loss
                opt.step()
                opt.zero_grad(set_to_none=True)
            rec.mark("end")
            del ids, labels
    except (NoKernel, TraceTooSlow):
        raise
    except Exception as e:
        raise ValueError(f"transformers' {type(model).__name__} could not run a training step "
                         f"on the meta device: {type(e).__name__}: "
                         f"{' '.join(str(e).split())[:300]}") from None
    phases = replay(rec.events)
    weights = _held_bytes(model)
    base = weights + CUBLAS_WORKSPACE_BYTES
    step = phases["step"]
    before = base + phases["step"].start
    at_peak = tuple(sorted(((k, c, by) for k, (c, by) in step.at_peak.items()),
                           key=lambda x: -x[2]))
    return TracedTraining(
        model_class=type(built).__name__, batch=b, seq_len=s, attention=attention, dtype=dtype,
        checkpointing=checkpointing, lora_rank=lora_rank, weights_bytes=weights,
        trainable_params=sum(p.numel() for p in trainable), before_step_bytes=before,
        peak_bytes=base + step.peak, at_peak=at_peak, seconds=time.perf_counter() - t0,
        transformers_version=transformers.__version__)
