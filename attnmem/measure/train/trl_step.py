"""One optimizer step of TRL's real ``SFTTrainer`` on a random-init model of the training
harness, measured against calc's prediction for the same TRL arguments (issue 43, item 3).

    python -m attnmem.measure.train.trl_step --model llama3-8b-2l \\
        --trl-args "per_device_train_batch_size=2 max_length=4096" --out trl.csv

The TRL text is what ``attnmem train --trl-args`` takes (attnmem.calc.train_levers.
parse_trl_args). It goes to ``trl.SFTConfig`` whole, with the harness's own settings added:
``max_steps`` (``--steps``, default 1), ``save_strategy="no"`` (no checkpoint),
``report_to="none"``, ``output_dir`` a temporary folder, ``logging_strategy="no"``; a user
value for any of those is refused, since it would change what is measured.

What runs (no download):
- the model: ``attnmem.measure.train_models`` (real widths, few layers), built by
  ``AutoModelForCausalLM.from_config`` in bf16 (calc's precision "bf16": TRL's dtype "auto"
  on a bf16 checkpoint) under ``torch.device(device)``, so its random init runs on the GPU, as
  the harness's other rows build theirs (attnmem/measure/train/procedure.py). Built on the
  CPU first (the first GPU runs), llama3-8b-2l's 1.49 G parameters took 16 s of CPU time to
  initialise (nn.Linear's uniform_ at construction, then transformers' normal_, both serial),
  the largest stage of the harness on the CPU; the same module construction on the meta
  device takes 0.7 s;
- the attention: by default as a TRL user gets it (calc's ``TrlMapping.attention``): the
  attn_implementation of the text's ``model_init_kwargs`` (transformers' default "sdpa"), with
  no SDPA backend forced, so torch picks it per call: flash for full rows, the memory-efficient
  backend for packed (padding-free) rows, whose block-diagonal bool mask flash refuses (forcing
  flash there stopped the first GPU run with torch's "No available kernel"). ``--attention``
  (calc's name) forces a backend with ``sdpa_kernel`` as the harness's other rows do
  (attnmem.measure.model_common.attention_context); one that has no kernel for a packed row
  (attnmem.calc.train_packed.PACKED_REFUSED) is refused before anything is built;
- the tokenizer: TRL's SFTTrainer needs a ``PreTrainedTokenizerBase`` whose pad token is in its
  vocabulary (trl 1.16 sft_trainer.py, SFTTrainer.__init__: "Handle pad token"); a two-word
  ``tokenizers`` WordLevel vocabulary (``<pad>`` 0, ``<eos>`` 1) wrapped in
  ``PreTrainedTokenizerFast``; it never tokenizes anything, since
- the dataset is pre-tokenized: ``input_ids`` rows of exactly max_length random ids in
  [2, vocab) (SFTTrainer._prepare_dataset skips tokenizing when ``input_ids`` is a column,
  builds labels = input_ids, truncates to max_length, which keeps every row; packing "bfd"
  puts one row in each bin). So every batch has the shape calc's mapping assumes:
  batch × max_length, or padding-free one row of batch × max_length tokens.

Measured (a ``TrainerCallback`` on the last of the ``--steps`` steps; CUDA only):
``before_bytes`` = memory_allocated at on_step_begin (weights, the optimizer's state from
earlier steps, the prefetched batch), then reset_peak_memory_stats; ``fwd_bwd_peak_bytes`` =
max_memory_allocated at on_pre_optimizer_step (forward, loss, backward, gradient clipping);
``peak_bytes`` = max_memory_allocated at on_step_end (the optimizer step included);
``after_bytes`` = memory_allocated at on_step_end (after zero_grad).
calc's figures (``TrainingStepMemory.before_step_bytes`` and ``peak_bytes``) are for a step
whose optimizer state already exists. On a first step (--steps 1) the state is allocated
inside optimizer.step(), so the row also gives the same step with the state there from the
start: ``steady_before_bytes`` = after_bytes (before + the state the step made),
``steady_peak_bytes`` = max(fwd_bwd_peak + state, peak); with --steps 2 or more the measured
step already is one (state ~ 0) and the steady columns equal the measured ones. The errors
compare calc with the steady columns: (calc − measured) / measured.

Checked on every device (``mismatches``, empty when the trainer ran what calc assumed): the
model's input_ids shape in the measured step's forward (batch × seq_len of
``trl_kwargs``), gradient checkpointing on or off as mapped, the optimizer class (and
AdamW's fused flag) of calc's ``optimizer``, and the SDPA calls of the measured step
(``sdpa_calls``: each distinct mask, is_causal and enable_gqa; ``sdpa_backend``: on CUDA the
backend torch's dispatcher picks for that call under the run's context, torch.
_fused_sdp_choice) against calc's attention: on CUDA the backend itself, on the CPU (whose
dispatcher differs) the premise calc's choice rests on: no mask for sdpa_flash, a mask for
sdpa_efficient.

Progress: a line on stderr (flushed) at each stage, with the seconds since the harness
started, so a run stopped by a timeout shows where it was. The command line sets
HF_HUB_OFFLINE and HF_HUB_DISABLE_TELEMETRY (nothing is downloaded; SFTTrainer.__init__ would
otherwise send telemetry from a thread: trl/trainer/base_trainer.py _send_telemetry).

No torch, transformers or trl at import time.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: SFTConfig keys this harness sets (module docstring): a user value is refused.
HARNESS_KEYS = ("max_steps", "num_train_epochs", "save_strategy", "save_steps", "report_to",
                "output_dir", "logging_strategy", "push_to_hub", "resume_from_checkpoint")
#: calc's optimizer -> the class TRL's Trainer must build, and AdamW's `fused` default.
#: transformers' TrainingArguments OptimizerNames: adamw_torch -> torch.optim.AdamW,
#: adamw_torch_fused -> AdamW(fused=True), adamw_bnb_8bit / adamw_8bit -> bitsandbytes
#: AdamW (optim_bits 8; class AdamW8bit's base), paged_adamw_8bit -> bitsandbytes AdamW
#: (is_paged), adafactor -> transformers Adafactor, sgd -> torch.optim.SGD.
EXPECTED_OPTIM: dict[str, tuple[tuple[str, ...], bool | None]] = {
    "adamw": (("AdamW",), False), "adamw_fused": (("AdamW",), True),
    "adamw_8bit": (("AdamW", "AdamW8bit"), None),
    "paged_adamw_8bit": (("AdamW", "PagedAdamW", "PagedAdamW8bit"), None),
    "adafactor": (("Adafactor",), None), "sgd": (("SGD",), None),
}
FIELDS = ("model", "trl_args", "attention", "attn_implementation", "sdpa_forced", "device",
          "steps", "batch", "seq_len", "packed_lengths", "input_shape", "checkpointing",
          "optimizer_class", "sdpa_calls", "sdpa_backend", "before_bytes",
          "fwd_bwd_peak_bytes", "peak_bytes", "after_bytes", "steady_before_bytes",
          "steady_peak_bytes", "calc_before_bytes", "calc_peak_bytes", "before_err_pct",
          "peak_err_pct", "mismatches", "calc_notes", "trl", "transformers", "torch", "gpu")


_T0 = time.monotonic()


def say(what: str) -> None:
    """One progress line on stderr, flushed, with the seconds since the harness started."""
    print(f"[trl_step {time.monotonic() - _T0:6.1f} s] {what}", file=sys.stderr, flush=True)


@dataclass
class Plan:
    """What one run asks for: the SFTConfig arguments (user's + harness's) and calc's
    mapping of the user's arguments (attnmem.calc.train_levers.TrlMapping)."""

    sft_args: dict[str, Any]
    mapping: Any
    max_length: int
    rows: int
    #: calc's attention counted, transformers' attn_implementation built, the SDPA backend
    #: forced around the step (None: torch picks per call, as a TRL user gets it)
    attention: str = "sdpa_flash"
    attn_implementation: str = "sdpa"
    forced: str | None = None


def choose_attention(mapping: Any, attention: str | None) -> tuple[str, str, str | None]:
    """(calc's attention, attn_implementation, forced calc backend or None) for the run.
    None: as TRL runs it (module docstring); a name: that attention, an SDPA backend forced,
    refused where it has no kernel for the run's rows (a packed row under flash: torch stops
    with "No available kernel")."""
    from attnmem.calc.train_packed import PACKED_REFUSED
    from attnmem.measure.model_common import ATTENTIONS, SDPA_BACKENDS

    if attention is None:
        return mapping.attention, mapping.attn_implementation, None
    if attention not in ATTENTIONS:
        raise ValueError(f"attention {attention!r}: accepted: {', '.join(ATTENTIONS)}, or "
                         "leave --attention out to run SDPA as TRL does")
    if "packed_lengths" in mapping.kwargs and attention in PACKED_REFUSED:
        stop = (" (torch stops with \"No available kernel\")" if attention == "sdpa_flash"
                else "")
        raise ValueError(f"attention {attention!r} with TRL's padding-free rows{stop}: "
                         f"{PACKED_REFUSED[attention]}; or leave --attention out: TRL's "
                         f"default SDPA, where torch picks {mapping.attention}")
    # transformers' name for ours ("triton") is the one its registration returns (run)
    impl = {"eager": "eager", "fa4": "flash_attention_4"}.get(attention, "sdpa")
    return attention, impl, attention if attention in SDPA_BACKENDS else None


def plan(text: str, steps: int, output_dir: str, attention: str | None = None) -> Plan:
    """Parse the TRL text (parse_trl_args), map it (trl_kwargs: its ValueError names the value),
    choose the attention (choose_attention) and add the harness's SFTConfig settings; a harness
    key in the text is refused, and so is model_init_kwargs beyond attn_implementation (the
    harness builds the model: TRL ignores model_init_kwargs for a built one)."""
    from attnmem.calc.train_levers import TRL_DEFAULTS, parse_trl_args, trl_kwargs

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r}: accepted: a whole number >= 1")
    user = parse_trl_args(text)
    taken = [k for k in user if k in HARNESS_KEYS]
    if taken:
        raise ValueError(f"TRL arguments {', '.join(taken)}: set by this harness (one "
                         f"measured step, no checkpoint, no report); accepted: any other "
                         f"SFTConfig argument, without {', '.join(HARNESS_KEYS)}")
    mapping = trl_kwargs(user)
    mik = user.pop("model_init_kwargs", None) or {}
    extra = sorted(k for k in mik if k != "attn_implementation")
    if extra:
        raise ValueError(f"TRL model_init_kwargs {', '.join(extra)}: this harness builds the "
                         "model (bf16, random init); accepted: attn_implementation only")
    if attention is not None and "attn_implementation" in mik:
        raise ValueError(f"--attention {attention!r} and model_init_kwargs' attn_implementation "
                         f"{mik['attn_implementation']!r}: give one")
    calc_att, impl, forced = choose_attention(mapping, attention)
    gas = user.get("gradient_accumulation_steps", 1)
    if isinstance(gas, bool) or not isinstance(gas, int) or gas < 1:
        raise ValueError(f"TRL gradient_accumulation_steps={gas!r}: accepted: a whole number "
                         ">= 1")
    max_length = {**TRL_DEFAULTS, **user}["max_length"]
    batch = {**TRL_DEFAULTS, **user}["per_device_train_batch_size"]
    sft = {**user, "max_steps": steps, "save_strategy": "no", "report_to": "none",
           "output_dir": output_dir, "logging_strategy": "no", "push_to_hub": False,
           "dataloader_num_workers": user.get("dataloader_num_workers", 0)}
    # every micro-batch of every step is full: batch × accumulation × steps rows
    return Plan(sft, mapping, int(max_length), int(batch) * gas * steps, calc_att, impl, forced)


def tokenizer() -> Any:
    """A two-word tokenizer TRL accepts (module docstring): pad 0, eos 1."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1}, unk_token="<eos>"))
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")


def dataset(rows: int, length: int, vocab: int, seed: int = 0) -> Any:
    """``rows`` pre-tokenized rows of exactly ``length`` ids in [2, vocab) (no pad, no eos)."""
    import datasets
    import torch

    if vocab <= 2:
        raise ValueError(f"vocab={vocab}: need more than the two special ids")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (rows, length), generator=g)
    return datasets.Dataset.from_dict({"input_ids": ids.tolist()})


@dataclass
class Seen:
    """What the trainer ran in the measured (last) step."""

    input_shapes: list = field(default_factory=list)
    #: per SDPA call of the measured step: (mask, is_causal, enable_gqa), and the backend
    #: torch's CUDA dispatcher picks for it ("" on the CPU)
    sdpa_calls: list = field(default_factory=list)
    sdpa_backends: list = field(default_factory=list)
    checkpointing: bool | None = None
    optimizer_class: str = ""
    optimizer_fused: bool | None = None
    before: int | None = None
    fwd_bwd_peak: int | None = None
    peak: int | None = None
    after: int | None = None


def _mask_text(mask: Any) -> str:
    """An SDPA mask as the row shows it: "none", or dtype and shape ("bool 1x1x48x48")."""
    if mask is None:
        return "none"
    return f"{str(mask.dtype).removeprefix('torch.')} {'x'.join(map(str, mask.shape))}"


@contextlib.contextmanager
def sdpa_recorder(seen: Seen, state: dict, cuda: bool) -> Any:
    """Wrap torch.nn.functional.scaled_dot_product_attention (transformers' sdpa_attention
    looks it up at each call) while ``state["on"]``: record each call's mask, is_causal and
    enable_gqa and, on CUDA, the backend torch picks for it (torch._fused_sdp_choice, under the
    active sdpa_kernel context; "no kernel" where it has none). Arguments pass unchanged; only
    strings are kept, so no tensor lives longer."""
    import torch
    from torch.nn.attention import SDPBackend

    real = torch.nn.functional.scaled_dot_product_attention

    def wrapped(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:
        if state["on"]:
            seen.sdpa_calls.append((_mask_text(attn_mask), bool(is_causal), bool(enable_gqa)))
            if cuda:
                try:
                    pick = torch._fused_sdp_choice(query, key, value, attn_mask, dropout_p,
                                                   is_causal, scale=scale,
                                                   enable_gqa=enable_gqa)
                    seen.sdpa_backends.append(SDPBackend(pick).name)
                except RuntimeError as exc:  # torch's "No available kernel" (the call fails too)
                    seen.sdpa_backends.append("no kernel" if "kernel" in str(exc)
                                              else f"choice failed: {exc}"[:80])
                except TypeError as exc:  # a torch whose _fused_sdp_choice differs
                    seen.sdpa_backends.append(f"choice failed: {exc}"[:80])
        return real(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                    is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    torch.nn.functional.scaled_dot_product_attention = wrapped
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = real


def _callback(seen: Seen, steps: int, cuda: bool, model: Any, state: dict) -> Any:
    """A TrainerCallback recording Seen on step ``steps`` (1-based) and saying each step's
    stages (say), and a forward pre-hook on ``model`` recording input_ids' shape during that
    step; ``state["on"]`` is True during it (sdpa_recorder reads it)."""
    import torch
    from transformers import TrainerCallback

    def hook(_mod: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if state["on"] and ids is not None:
            seen.input_shapes.append(tuple(ids.shape))

    model.register_forward_pre_hook(hook, with_kwargs=True)

    def gib(n: int) -> str:
        return f"{n / 2**30:.2f} GiB"

    class Measure(TrainerCallback):
        def on_train_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
            say("training loop started (optimizer and data loader built)")

        def on_step_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
            mem = f", {gib(torch.cuda.memory_allocated())} allocated" if cuda else ""
            say(f"step {st.global_step + 1} of {steps} begins{mem}")
            if st.global_step + 1 != steps:
                return
            state["on"] = True
            m = kw["model"]
            # transformers >= 5.2x renamed it is_activation_checkpointing (the old name warns)
            flag = ("is_activation_checkpointing" if hasattr(m, "is_activation_checkpointing")
                    else "is_gradient_checkpointing")
            seen.checkpointing = bool(getattr(m, flag, False))
            if cuda:
                torch.cuda.synchronize()
                seen.before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()

        def on_pre_optimizer_step(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
            if state["on"] and cuda:
                torch.cuda.synchronize()
                seen.fwd_bwd_peak = torch.cuda.max_memory_allocated()
            peak = f", peak {gib(seen.fwd_bwd_peak)}" if state["on"] and cuda else ""
            say(f"step {st.global_step + 1}: forward and backward done{peak}")

        def on_step_end(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
            if not state["on"]:
                return
            state["on"] = False
            opt = kw["optimizer"]
            inner = getattr(opt, "optimizer", opt)  # accelerate's AcceleratedOptimizer wraps it
            seen.optimizer_class = type(inner).__name__
            seen.optimizer_fused = getattr(inner, "defaults", {}).get("fused")
            if cuda:
                torch.cuda.synchronize()
                seen.peak = torch.cuda.max_memory_allocated()
                seen.after = torch.cuda.memory_allocated()
            say(f"step {st.global_step} measured"
                + (f": peak {gib(seen.peak)}, after {gib(seen.after)}" if cuda else ""))

    return Measure()


#: calc's SDPA attention -> the mask its choice needs on the CPU check (module docstring):
#: flash takes no mask (torch's sdp_utils check_for_attn_mask), memory-efficient is picked
#: because there is one.
SDPA_MASK_PREMISE = {"sdpa_flash": False, "sdpa_efficient": True}


def sdpa_mismatches(seen: Seen, attention: str, cuda: bool) -> list[str]:
    """Where the measured step's SDPA calls differ from calc's attention (module docstring)."""
    from attnmem.measure.model_common import SDPA_BACKENDS

    if attention not in SDPA_BACKENDS:
        return [f"SDPA called under attention {attention!r}"] if seen.sdpa_calls else []
    if not seen.sdpa_calls:
        return [f"no SDPA call seen in the measured step, calc counted {attention}"]
    out = []
    if cuda:
        want = SDPA_BACKENDS[attention]
        for got in dict.fromkeys(seen.sdpa_backends):
            if got != want:
                out.append(f"SDPA backend {got}, calc counted {attention} ({want})")
        return out
    masked = SDPA_MASK_PREMISE.get(attention)
    for mask, causal, _gqa in dict.fromkeys(seen.sdpa_calls):
        if masked is not None and (mask != "none") != masked:
            out.append(f"SDPA mask {mask} (is_causal={causal}): calc counted {attention}, "
                       f"which {'needs' if masked else 'takes no'} mask")
    return out


def mismatches(seen: Seen, mapping: Any) -> list[str]:
    """Where the trainer's step differs from what calc's mapping counted (module docstring;
    the SDPA calls: sdpa_mismatches)."""
    out = []
    want = (mapping.batch, mapping.seq_len)
    if not seen.input_shapes:
        out.append("no forward seen in the measured step")
    for shape in dict.fromkeys(seen.input_shapes):
        if shape != want:
            out.append(f"input_ids {shape}, calc counted {want}")
    if seen.checkpointing != mapping.kwargs["checkpointing"]:
        out.append(f"gradient checkpointing {seen.checkpointing}, calc counted "
                   f"{mapping.kwargs['checkpointing']}")
    names, fused = EXPECTED_OPTIM[mapping.kwargs["optimizer"]]
    if seen.optimizer_class not in names:
        out.append(f"optimizer {seen.optimizer_class}, calc counted {names[0]} "
                   f"({mapping.kwargs['optimizer']})")
    elif fused is not None and bool(seen.optimizer_fused) != fused:
        out.append(f"AdamW fused={seen.optimizer_fused}, calc counted fused={fused}")
    return out


def predict(model_name: str, mapping: Any, attention: str) -> Any:
    """attnmem.calc.training_step for the mapping's keywords and its loss (TRL's fused LM head,
    `TrlMapping.loss`)."""
    from attnmem.calc import ModelConfig, training_step
    from attnmem.measure.train_models import hf_config

    model = ModelConfig.from_hf_config(hf_config(model_name), name=model_name)
    return training_step(model, mapping.batch, mapping.seq_len, attention=attention,
                         loss=mapping.loss, **mapping.kwargs)


def _pct(calc: int | None, measured: int | None) -> float | None:
    return None if not calc or not measured else round(100 * (calc - measured) / measured, 3)


def run(model_name: str, text: str, *, attention: str | None = None, steps: int = 1,
        device: str = "cuda") -> dict[str, Any]:
    """Run the step (module docstring) and return the row (FIELDS). ``attention`` None: as
    TRL runs it (choose_attention)."""
    from attnmem.measure import train_models

    if device not in ("cuda", "cpu"):
        raise ValueError(f"device={device!r}: accepted: cuda, cpu")
    if model_name not in train_models.MODELS:
        raise ValueError(f"model {model_name!r}: accepted: {', '.join(train_models.NAMES)}")
    plan(text, steps, "/nonexistent", attention)  # refuse bad text before the slow imports
    say(f"{model_name}, TRL arguments {text!r}, {device}: importing torch")
    import torch

    say(f"torch {torch.__version__} imported; importing transformers")
    import transformers

    say(f"transformers {transformers.__version__} imported; importing trl")
    import trl

    say(f"trl {trl.__version__} imported")
    from attnmem.measure.model_common import (
        attention_context,
        attn_implementation,
        model_from_config,
    )

    with tempfile.TemporaryDirectory() as out_dir:
        p = plan(text, steps, out_dir, attention)
        try:
            calc = predict(model_name, p.mapping, p.attention)
        except ValueError as exc:  # calc's reason for not counting it; the step still runs
            calc = None
            calc_refused = str(exc)
        else:
            calc_refused = ""
        say(f"calc ({p.attention}, {p.mapping.batch} x {p.mapping.seq_len:,}): "
            + (f"peak {calc.peak_bytes:,} B, before {calc.before_step_bytes:,} B" if calc
               else f"not counted: {calc_refused}"))
        ctx, why = attention_context(p.forced) if p.forced else (contextlib.nullcontext, "")
        if ctx is None:
            raise RuntimeError(why)
        hf = train_models.build_config(model_name)
        cuda = device == "cuda"
        if cuda:
            torch.cuda.init()
            torch.cuda.empty_cache()
        impl = (attn_implementation("triton") if p.attention == "triton"
                else p.attn_implementation)
        say((f"CUDA ready ({torch.cuda.get_device_name()}); " if cuda else "")
            + f"building the model on {device} (attn_implementation {impl}"
            + (f", SDPA backend forced: {p.forced})" if p.forced else ", no backend forced)"))
        with torch.device(device):  # random init where the model runs (module docstring)
            model = model_from_config(hf, torch.bfloat16, impl)
        if next(model.parameters()).device.type != device:
            model.to(device)
        model.train()
        n = sum(x.numel() for x in model.parameters())
        say(f"model built: {n:,} parameters"
            + (f", {torch.cuda.memory_allocated():,} B allocated" if cuda else ""))
        seen = Seen()
        state = {"on": False}
        args = trl.SFTConfig(**p.sft_args, use_cpu=not cuda)
        data = dataset(p.rows, p.max_length, int(hf.vocab_size))
        say(f"dataset: {p.rows} rows of {p.max_length:,} ids; building SFTTrainer "
            "(dataset preparation)")
        trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data,
                                 processing_class=tokenizer(),
                                 callbacks=[_callback(seen, steps, cuda, model, state)])
        say("SFTTrainer built; trainer.train()")
        with ctx(), sdpa_recorder(seen, state, cuda):
            trainer.train()
    state_bytes = (seen.after - seen.before) if cuda and seen.before is not None else None
    steady_before = seen.after if cuda else None
    steady_peak = (max(seen.fwd_bwd_peak + state_bytes, seen.peak) if state_bytes is not None
                   else None)
    packed = p.mapping.kwargs.get("packed_lengths")
    gpu = torch.cuda.get_device_name() if cuda else ""
    found = mismatches(seen, p.mapping) + sdpa_mismatches(seen, p.attention, cuda)
    return {
        "model": model_name, "trl_args": text, "attention": p.attention,
        "attn_implementation": impl, "sdpa_forced": p.forced or "",
        "device": device,
        "steps": steps, "batch": p.mapping.batch, "seq_len": p.mapping.seq_len,
        "packed_lengths": " ".join(map(str, packed or ())),
        "input_shape": " ".join("x".join(map(str, s)) for s in dict.fromkeys(seen.input_shapes)),
        "checkpointing": seen.checkpointing,
        "optimizer_class": seen.optimizer_class + (
            f"(fused={seen.optimizer_fused})" if seen.optimizer_fused is not None else ""),
        "sdpa_calls": "; ".join(f"mask {m}, is_causal={c}, enable_gqa={g}"
                                for m, c, g in dict.fromkeys(seen.sdpa_calls)),
        "sdpa_backend": " ".join(dict.fromkeys(seen.sdpa_backends)),
        "before_bytes": seen.before, "fwd_bwd_peak_bytes": seen.fwd_bwd_peak,
        "peak_bytes": seen.peak, "after_bytes": seen.after,
        "steady_before_bytes": steady_before, "steady_peak_bytes": steady_peak,
        "calc_before_bytes": calc.before_step_bytes if calc else None,
        "calc_peak_bytes": calc.peak_bytes if calc else None,
        "before_err_pct": _pct(calc.before_step_bytes if calc else None, steady_before),
        "peak_err_pct": _pct(calc.peak_bytes if calc else None, steady_peak),
        "mismatches": "; ".join(found),
        "calc_notes": calc_refused or "; ".join(p.mapping.notes),
        "trl": trl.__version__, "transformers": transformers.__version__,
        "torch": torch.__version__, "gpu": gpu,
    }


def write_row(row: dict[str, Any], out: Path) -> None:
    """Append the row to the CSV ``out`` (the header written when the file is new)."""
    new = not out.exists() or out.stat().st_size == 0
    with out.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            w.writeheader()
        w.writerow({k: ("" if row.get(k) is None else row[k]) for k in FIELDS})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnmem.measure.train.trl_step",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="attnmem.measure.train_models name")
    ap.add_argument("--trl-args", required=True,
                    help="TRL SFTConfig arguments, as `attnmem train --trl-args` takes them")
    ap.add_argument("--attention", default=None,
                    help="calc's attention name, an SDPA backend forced (default: as TRL runs "
                         "it: model_init_kwargs' attn_implementation or SDPA, torch picking the "
                         "backend; calc counts the one it picks)")
    ap.add_argument("--steps", type=int, default=1, help="max_steps; the last one is measured")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--out", required=True, type=Path, help="CSV file (a row is appended)")
    a = ap.parse_args(argv)
    # No download and no network (the GPU host has none): TRL's trainer sends telemetry from
    # a thread (trl/trainer/base_trainer.py _send_telemetry; huggingface_hub honours these).
    keys = ("HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY")
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(dict.fromkeys(keys, "1"))
    try:
        row = run(a.model, a.trl_args, attention=a.attention, steps=a.steps, device=a.device)
    except ValueError as exc:
        ap.error(str(exc))
    finally:  # put back for a caller in the same process (the tests)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    write_row(row, a.out)
    say(f"row appended to {a.out}")
    for k in FIELDS:
        print(f"{k}: {row[k]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
