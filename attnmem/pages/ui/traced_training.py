"""The Training step page's answer for a model outside calc's rules (issue 42, item 5): one
training step traced on the meta device (attnmem.trace.training.trace_training: forward and
loss, backward, foreach AdamW step, zero_grad; full training or LoRA through peft, bf16).
Pure: no Streamlit; torch and transformers are imported only by the trace.

- `unsupported`: the page's inputs the trace does not run, each said in words (the page shows
  them as a warning and answers without them only where none is left);
- `training`: one trace per chosen attention the trace runs, the first always, each further one
  begun only while the wall time so far plus the last trace's time fits traced.SEARCH_BUDGET_S
  (a trace of an 8B model takes about 9 s on the CPU); cached per inputs, so a re-run shows the
  same answer;
- `parts`: a traced step in parts (weights, what else is held before the step, the rest of
  the peak);
- what is shared with the Inference page's trace comes from attnmem.pages.ui.traced: the
  one-at-a-time lock, the hostile-config guard, `missing`, `where_rows` and `counted_from`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from attnmem.calc.backends import NoKernel
from attnmem.calc.train_lora import LORA_TARGET_SETS
from attnmem.pages.ui import traced

#: calc's training attentions that the trace runs (transformers' eager attention and SDPA with
#: one backend forced; attnmem.trace.training's "sdpa", torch's choice, is not a page choice).
TRACE_TRAIN_ATTENTIONS = ("eager", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
#: What the trace runs, said once (the warnings end with it).
RUNS = ("the trace runs full training or LoRA (peft, fp32 adapters) on a bf16 model with torch's "
        "AdamW (foreach), with or without checkpointing, on one GPU, with transformers' eager "
        "attention or SDPA's flash, memory-efficient or cuDNN backend")


def unsupported(precision: str = "bf16", method: str = "full", adapter_dtype: str = "fp32",
                optimizer: str = "adamw", kbit: bool = False, liger: bool = False,
                offload: bool = False, padding_free: bool = False, gpus: int = 1, tp: int = 1,
                sharding: str = "none", ep: int = 1) -> list[str]:
    """The Training page's inputs the trace does not run, each said in words (empty: all
    traceable). The attentions are `attentions`' business (some may be traced, some not)."""
    out = []
    if precision != "bf16":
        out.append(f"precision '{precision}' (the trace runs bf16 parameters and AdamW state, "
                   "no autocast)")
    if method == "qlora":
        out.append("QLoRA (bitsandbytes' 4-bit base is not traced; LoRA on the bf16 base is)")
    elif method == "lora" and adapter_dtype != "fp32":
        out.append(f"{adapter_dtype} adapters (the trace runs peft's default fp32 adapters)")
    if optimizer != "adamw":
        out.append(f"the optimizer '{optimizer}' (the trace runs torch's AdamW, foreach)")
    out += [f"{what} (not traced)" for what, on in (
        ("peft's kbit prepare", kbit), ("Liger's kernels", liger),
        ("offloaded activations", offload)) if on]
    if padding_free:
        out.append("padding-free rows (the trace runs dense rows of s tokens)")
    layout = [f"{what} {v:,}" if isinstance(v, int) else f"{what} {v}" for what, v, off in (
        ("GPUs", gpus, 1), ("tensor parallel", tp, 1), ("sharding", sharding, "none"),
        ("expert parallel", ep, 1)) if v != off]
    if layout:
        out.append(f"{', '.join(layout)} (the trace runs one GPU)")
    return out


def lora_targets(targets: str) -> tuple[str, ...]:
    """The module names peft adapts for the page's LoRA targets (calc's sets)."""
    return LORA_TARGET_SETS[targets]


@dataclass(frozen=True)
class TrainAnswers:
    """The traced steps for the page's inputs, or why there are none.

    steps: attention -> attnmem.trace.training.TracedTraining, in the order chosen;
    refused: attention -> why it has no answer (an attention the trace does not run, NoKernel,
    transformers' or peft's refusal, a failure of the model's code on meta);
    skipped: chosen attentions not traced within the time budget (choose one alone to trace
    it); refused_all: why nothing could be traced (torch missing, a config too large)."""

    model: traced.Unruled
    steps: dict[str, Any] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()
    refused_all: str = ""
    seconds: float = 0.0


def _trace(model: traced.Unruled, batch: int, seq_len: int, attention: str,
           checkpointing: bool, lora_rank: int | None, targets: tuple[str, ...]) -> Any:
    from attnmem.trace.training import trace_training

    kw = {"lora_targets": targets} if lora_rank is not None else {}
    with traced._LOCK:  # the trace hooks the shared cached meta model: one at a time
        return trace_training(model.config, batch, seq_len, attention=attention, dtype="bf16",
                              checkpointing=checkpointing, lora_rank=lora_rank, **kw)


@lru_cache(maxsize=64)
def training(model: traced.Unruled, batch: int, seq_len: int, attentions: tuple[str, ...],
             checkpointing: bool = False, lora_rank: int | None = None,
             targets: str = "all-linear", budget_s: float | None = None) -> TrainAnswers:
    """A traced step per chosen attention (module docstring: the first always, the rest
    within `budget_s` wall seconds, traced.SEARCH_BUDGET_S by default). Cached by its inputs."""
    why = traced.missing() or traced.too_large(model.config)
    if why is not None:
        return TrainAnswers(model, refused_all=why)
    budget_s = traced.SEARCH_BUDGET_S if budget_s is None else budget_s
    names = lora_targets(targets) if lora_rank is not None else ()
    steps: dict[str, Any] = {}
    refused: dict[str, str] = {}
    skipped: list[str] = []
    t0 = time.perf_counter()
    last = 0.0
    began = False
    for a in attentions:
        if a not in TRACE_TRAIN_ATTENTIONS:
            refused[a] = (f"the trace does not run attention '{a}' (it runs transformers' eager "
                          "attention and SDPA's flash, memory-efficient and cuDNN backends)")
            continue
        if began and time.perf_counter() - t0 + last > budget_s:
            skipped.append(a)
            continue
        began = True
        t = time.perf_counter()
        try:
            steps[a] = _trace(model, batch, seq_len, a, checkpointing, lora_rank, names)
        except (NoKernel, ValueError) as err:
            refused[a] = str(err)
        except Exception as err:  # the model's own code failed on meta: said, never a traceback
            refused[a] = (f"the trace failed in the model's code ({type(err).__name__}: "
                          f"{' '.join(str(err).split())[:300]})")
        last = time.perf_counter() - t
    return TrainAnswers(model, steps, refused, tuple(skipped),
                        seconds=time.perf_counter() - t0)


def parts(t: Any) -> dict[str, int]:
    """A traced step's peak in parts (sum = peak)."""
    return {"weights and buffers" + (" (adapters included)" if t.lora_rank else ""):
                t.weights_bytes,
            "AdamW state, inputs and cuBLAS workspaces (before the step)":
                t.before_step_bytes - t.weights_bytes,
            "activations, gradients and transients at the peak":
                t.peak_bytes - t.before_step_bytes}


def headline(ans: TrainAnswers, gpu_bytes: int, where: str, fmt: Any, label: Any = str) -> str:
    """The page's answer in one line (Markdown; `fmt` formats bytes, `label` names an attention,
    `where` is already escaped)."""
    if not ans.steps:
        return "**Not traced**: the reason is just below."
    said = [f"{label(a)} {fmt(t.peak_bytes)}, "
            + ("fits" if t.peak_bytes <= gpu_bytes else "does not fit")
            for a, t in ans.steps.items()]
    return f"**On {where}** (traced, not calc's rules): " + "; ".join(said) + "."
