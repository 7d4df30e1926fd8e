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
  on a bf16 checkpoint), attn_implementation for ``--attention`` (calc's name; an SDPA
  backend is forced with ``sdpa_kernel`` around ``trainer.train()``, as the harness's other
  rows run it: attnmem.measure.model_common.attention_context);
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
AdamW's fused flag) of calc's ``optimizer``.

No torch, transformers or trl at import time.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
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
FIELDS = ("model", "trl_args", "attention", "device", "steps", "batch", "seq_len",
          "packed_lengths", "input_shape", "checkpointing", "optimizer_class", "before_bytes",
          "fwd_bwd_peak_bytes", "peak_bytes", "after_bytes", "steady_before_bytes",
          "steady_peak_bytes", "calc_before_bytes", "calc_peak_bytes", "before_err_pct",
          "peak_err_pct", "mismatches", "calc_notes", "trl", "transformers", "torch", "gpu")


@dataclass
class Plan:
    """What one run asks for: the SFTConfig arguments (user's + harness's) and calc's
    mapping of the user's arguments (attnmem.calc.train_levers.TrlMapping)."""

    sft_args: dict[str, Any]
    mapping: Any
    max_length: int
    rows: int


def plan(text: str, steps: int, output_dir: str) -> Plan:
    """Parse the TRL text (parse_trl_args), map it (trl_kwargs: its ValueError names the value)
    and add the harness's SFTConfig settings; a harness key in the text is refused."""
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
    return Plan(sft, mapping, int(max_length), int(batch) * gas * steps)


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
    checkpointing: bool | None = None
    optimizer_class: str = ""
    optimizer_fused: bool | None = None
    before: int | None = None
    fwd_bwd_peak: int | None = None
    peak: int | None = None
    after: int | None = None


def _callback(seen: Seen, steps: int, cuda: bool, model: Any) -> Any:
    """A TrainerCallback recording Seen on step ``steps`` (1-based), and a forward pre-hook on
    ``model`` recording input_ids' shape during that step."""
    import torch
    from transformers import TrainerCallback

    state = {"on": False}

    def hook(_mod: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if state["on"] and ids is not None:
            seen.input_shapes.append(tuple(ids.shape))

    model.register_forward_pre_hook(hook, with_kwargs=True)

    class Measure(TrainerCallback):
        def on_step_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
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

    return Measure()


def mismatches(seen: Seen, mapping: Any) -> list[str]:
    """Where the trainer's step differs from what calc's mapping counted (module docstring)."""
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


def run(model_name: str, text: str, *, attention: str = "sdpa_flash", steps: int = 1,
        device: str = "cuda") -> dict[str, Any]:
    """Run the step (module docstring) and return the row (FIELDS)."""
    from attnmem.measure import train_models

    if device not in ("cuda", "cpu"):
        raise ValueError(f"device={device!r}: accepted: cuda, cpu")
    if model_name not in train_models.MODELS:
        raise ValueError(f"model {model_name!r}: accepted: {', '.join(train_models.NAMES)}")
    import torch
    import transformers
    import trl

    from attnmem.measure.model_common import (
        attention_context,
        attn_implementation,
        model_from_config,
    )
    with tempfile.TemporaryDirectory() as out_dir:
        p = plan(text, steps, out_dir)
        try:
            calc = predict(model_name, p.mapping, attention)
        except ValueError as exc:  # calc's reason for not counting it; the step still runs
            calc = None
            calc_refused = str(exc)
        else:
            calc_refused = ""
        ctx, why = attention_context(attention)
        if ctx is None:
            raise RuntimeError(why)
        hf = train_models.build_config(model_name)
        cuda = device == "cuda"
        if cuda:
            torch.cuda.empty_cache()
        model = model_from_config(hf, torch.bfloat16, attn_implementation(attention))
        model.to(device)
        model.train()
        seen = Seen()
        args = trl.SFTConfig(**p.sft_args, use_cpu=not cuda)
        data = dataset(p.rows, p.max_length, int(hf.vocab_size))
        trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data,
                                 processing_class=tokenizer(),
                                 callbacks=[_callback(seen, steps, cuda, model)])
        with ctx():
            trainer.train()
    state = (seen.after - seen.before) if cuda and seen.before is not None else None
    steady_before = seen.after if cuda else None
    steady_peak = max(seen.fwd_bwd_peak + state, seen.peak) if state is not None else None
    packed = p.mapping.kwargs.get("packed_lengths")
    gpu = torch.cuda.get_device_name() if cuda else ""
    return {
        "model": model_name, "trl_args": text, "attention": attention, "device": device,
        "steps": steps, "batch": p.mapping.batch, "seq_len": p.mapping.seq_len,
        "packed_lengths": " ".join(map(str, packed or ())),
        "input_shape": " ".join("x".join(map(str, s)) for s in dict.fromkeys(seen.input_shapes)),
        "checkpointing": seen.checkpointing,
        "optimizer_class": seen.optimizer_class + (
            f"(fused={seen.optimizer_fused})" if seen.optimizer_fused is not None else ""),
        "before_bytes": seen.before, "fwd_bwd_peak_bytes": seen.fwd_bwd_peak,
        "peak_bytes": seen.peak, "after_bytes": seen.after,
        "steady_before_bytes": steady_before, "steady_peak_bytes": steady_peak,
        "calc_before_bytes": calc.before_step_bytes if calc else None,
        "calc_peak_bytes": calc.peak_bytes if calc else None,
        "before_err_pct": _pct(calc.before_step_bytes if calc else None, steady_before),
        "peak_err_pct": _pct(calc.peak_bytes if calc else None, steady_peak),
        "mismatches": "; ".join(mismatches(seen, p.mapping)),
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
    ap.add_argument("--attention", default="sdpa_flash",
                    help="calc's attention name (attnmem.calc TRAIN_ATTENTIONS)")
    ap.add_argument("--steps", type=int, default=1, help="max_steps; the last one is measured")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--out", required=True, type=Path, help="CSV file (a row is appended)")
    a = ap.parse_args(argv)
    try:
        row = run(a.model, a.trl_args, attention=a.attention, steps=a.steps, device=a.device)
    except ValueError as exc:
        ap.error(str(exc))
    write_row(row, a.out)
    for k in FIELDS:
        print(f"{k}: {row[k]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
