"""TRL's SFTTrainer arguments as training_step keywords (`trl_kwargs`), and the cheapest
combination of memory levers that fits a GPU (`cheapest_fit`). Pure: stdlib only.

TRL defaults (trl 1.16.0, the PyPI wheel: trl/trainer/sft_config.py SFTConfig and
trl/trainer/base_config.py, TRL's overrides of transformers' TrainingArguments): max_length
1024, packing False (packing_strategy "bfd"), padding_free False, gradient_checkpointing True,
bf16 None (True unless fp16), use_liger_kernel False (deprecated), activation_offloading False,
loss_type "nll" ("dft"; "chunked_nll" a deprecated alias that __post_init__ turns into "nll").
transformers' TrainingArguments (5.25): per_device_train_batch_size 8, optim
"adamw_torch_fused", gradient_checkpointing_kwargs None, label_smoothing_factor 0. What the
mapping assumes, and what TRL's SFTTrainer.__init__ (trl/trainer/sft_trainer.py) checks:
- The loss: SFTTrainer always adds TRL's fused LM head (add_fused_lm_head) and compute_loss
  runs it for "nll" and "dft": `TrlMapping.loss` is "trl_fused" (attnmem/calc/
  train_trl_loss.py), training_step's `loss`. It is kept out of `kwargs`, the keywords the
  Training page and `attnmem train` set from TRL's arguments, which have no loss input yet;
  trl_step passes it. label_smoothing_factor > 0 with "nll" computes the loss from the full
  logits and runs the fused head again under no_grad: refused (not counted).
- bf16=True runs the forward under autocast; a model loaded in bf16 (TRL's dtype "auto" on a
  bf16 checkpoint) keeps bf16 weights, whose matmuls autocast leaves as they are: precision
  "bf16". fp16 is refused.
- Rows: without packing or padding-free, every row padded to max_length (the worst case of
  padding to the longest): batch × max_length. Packing "bfd"/"bfd_split" turns padding-free on
  (`self.padding_free = args.padding_free or (args.packing and args.packing_strategy in
  {"bfd", "bfd_split"})`): the batch flattened into one row of sequences of max_length each
  (the worst case): packed_lengths = (max_length,) × batch. padding_free=True without packing
  and with max_length set is refused, with TRL's reason (SFTTrainer raises: max_length is not
  enforced); max_length None is refused here (the longest row is not known).
- use_liger_kernel=True: transformers applies Liger's layer kernels (RMSNorm, SwiGLU, RoPE);
  SFTTrainer sets liger_kernel_config's fused_linear_cross_entropy to False (True is refused)
  and keeps its fused head: liger=True with loss "trl_fused".
- activation_offloading (TRL's OffloadActivations) with the fused head is not counted: refused.
- TRL's SFTTrainer does not call peft's prepare_model_for_kbit_training: kbit_prepare stays
  False unless the user's script calls it.
- The attention (`TrlMapping.attention`, calc's name, and `attn_implementation`,
  transformers'): TRL sets none; a model loaded by name takes `model_init_kwargs`'
  attn_implementation, and transformers' default is "sdpa" (modeling_utils.
  get_correct_attn_implementation: None -> "sdpa"), with torch choosing the backend per call
  (no backend forced). Dense rows: TRL's collator gives an all-ones attention_mask, which
  transformers drops (masking_utils._ignore_causal_mask_sdpa), so SDPA runs is_causal with no
  mask and torch picks flash (first in its priority order): "sdpa_flash". Padding-free rows:
  transformers finds the sequences from position_ids and passes the block-diagonal bool mask
  (masking_utils.find_packed_sequence_indices; attnmem/calc/train_packed.py), flash refuses
  any mask (torch's sdp_utils check_for_attn_mask: a forced flash backend stops with "No
  available kernel"), and torch picks the memory-efficient backend, next in its order:
  "sdpa_efficient". "eager" is eager. flash_attention_2/3, flex_attention and Hub kernels are
  refused (calc has no count for them), flash_attention_4 ("fa4") with packing too
  (train_packed.PACKED_REFUSED). TRL's docs recommend FlashAttention 2/3 for padding_free
  (sft_config.py), but SFTTrainer checks nothing: with sdpa it runs the masked SDPA counted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from attnmem.calc.train_packed import PACKED_REFUSED

#: TRL / transformers optim names -> training_step's optimizer.
TRL_OPTIMS: dict[str, str] = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw_fused", "adamw_bnb_8bit": "adamw_8bit",
    "adamw_8bit": "adamw_8bit", "paged_adamw_8bit": "paged_adamw_8bit",
    "adafactor": "adafactor", "sgd": "sgd",
}
TRL_DEFAULTS: dict[str, object] = {
    "gradient_checkpointing": True, "gradient_checkpointing_kwargs": None, "bf16": True,
    "fp16": False, "optim": "adamw_torch_fused", "padding_free": False, "packing": False,
    "packing_strategy": "bfd", "use_liger_kernel": False, "per_device_train_batch_size": 8,
    "max_length": 1024, "loss_type": "nll", "activation_offloading": False,
    "label_smoothing_factor": 0.0, "liger_kernel_config": None,
}
_BOOLS = ("gradient_checkpointing", "fp16", "padding_free", "packing",
          "use_liger_kernel", "activation_offloading")
#: SFTConfig's loss_type choices (trl 1.16 sft_config.py).
TRL_LOSS_TYPES = ("nll", "dft", "chunked_nll")
#: transformers' attn_implementation (model_init_kwargs) -> calc's attention; "sdpa" is
#: torch's choice (module docstring): flash for dense rows, memory-efficient for padding-free.
TRL_ATTENTIONS: dict[str, str | None] = {"sdpa": None, "eager": "eager",
                                         "flash_attention_4": "fa4"}
#: Why the other attn_implementation values are refused.
TRL_ATTENTIONS_REFUSED: dict[str, str] = {
    "flash_attention_2": "FlashAttention-2 (flash-attn's varlen kernels) is not one of calc's "
                         "attentions",
    "flash_attention_3": "FlashAttention-3 is not one of calc's attentions",
    "flex_attention": "transformers' flex_attention (a compiled block mask) is not counted",
}


@dataclass(frozen=True)
class TrlMapping:
    """training_step's arguments (batch, seq_len and keywords) and the notes on what was
    assumed; `ignored`: keys that change no memory here."""

    batch: int
    seq_len: int
    kwargs: dict
    notes: tuple[str, ...]
    ignored: tuple[str, ...]
    #: training_step's `loss` for TRL's step (module docstring: not in kwargs)
    loss: str = "trl_fused"
    #: training_step's `attention`: the backend the run uses (module docstring: not in kwargs,
    #: the page and `attnmem train` keep their own attention input)
    attention: str = "sdpa_flash"
    #: transformers' attn_implementation the model is built with ("sdpa": no backend forced)
    attn_implementation: str = "sdpa"


def parse_trl_args(text: str) -> dict:
    """A JSON object, or key=value pairs separated by commas, spaces or new lines (values read
    as JSON where they parse: true, 4, "x"; Python's True/False/None too; else strings)."""
    if not isinstance(text, str):
        raise ValueError(f"TRL arguments must be text, not {text!r}")
    t = text.strip()
    if not t:
        return {}
    if t.startswith("{"):
        try:
            out = json.loads(t)
        except json.JSONDecodeError as err:
            raise ValueError(f"TRL arguments: not valid JSON ({err.msg} at {err.pos})") from None
        if not isinstance(out, dict):
            raise ValueError("TRL arguments: the JSON must be an object of name: value")
        return out
    out = {}
    for item in t.replace("\n", ",").replace(" ", ",").split(","):
        item = item.strip().removeprefix("--")
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"TRL arguments: {item!r} is not key=value")
        k, v = (x.strip() for x in item.split("=", 1))
        lit = {"True": True, "False": False, "None": None}
        try:
            out[k] = lit[v] if v in lit else json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def trl_kwargs(args: dict) -> TrlMapping:
    """Map SFTConfig arguments (module docstring) to training_step's: `kwargs` and `loss`;
    ValueError names the value refused and what is accepted."""
    if not isinstance(args, dict):
        raise ValueError(f"TRL arguments must be a mapping, not {args!r}")
    a = {**TRL_DEFAULTS, **args}
    notes = []
    for k in _BOOLS:
        if not isinstance(a[k], bool):
            raise ValueError(f"TRL {k}={a[k]!r}: accepted: true or false")
    if a["bf16"] is None:  # TRL's base_config: bf16 = not fp16
        a["bf16"] = not a["fp16"]
    if not isinstance(a["bf16"], bool):
        raise ValueError(f"TRL bf16={a['bf16']!r}: accepted: true, false or null")
    if a["fp16"]:
        raise ValueError("TRL fp16=True: not counted; accepted: bf16=true or false (fp16 false)")
    b, s = a["per_device_train_batch_size"], a["max_length"]
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        raise ValueError(f"TRL per_device_train_batch_size={b!r}: accepted: a whole number >= 1")
    if s is None:
        raise ValueError("TRL max_length=None (no truncation): the longest row is not known; "
                         "accepted: a whole number >= 1")
    if isinstance(s, bool) or not isinstance(s, int) or s < 1:
        raise ValueError(f"TRL max_length={s!r}: accepted: a whole number >= 1")
    optim = a["optim"]
    if not isinstance(optim, str) or optim not in TRL_OPTIMS:
        raise ValueError(f"TRL optim={optim!r}: accepted: {', '.join(TRL_OPTIMS)}")
    gk = a["gradient_checkpointing_kwargs"]
    if gk not in (None, {}) and not (isinstance(gk, dict) and set(gk) <= {"use_reentrant"}
                                      and isinstance(gk.get("use_reentrant"), bool)):
        raise ValueError(f"TRL gradient_checkpointing_kwargs={gk!r}: accepted: null, {{}} or "
                         '{"use_reentrant": true|false}')
    if isinstance(gk, dict) and gk.get("use_reentrant"):
        notes.append("use_reentrant=True keeps the same layer inputs as the non-reentrant "
                     "checkpointing counted")
    loss = a["loss_type"]
    if not isinstance(loss, str) or loss not in TRL_LOSS_TYPES:
        raise ValueError(f"TRL loss_type={loss!r}: accepted: {', '.join(TRL_LOSS_TYPES)}")
    if loss == "chunked_nll":
        notes.append("loss_type chunked_nll: TRL 1.16 maps it to nll (deprecated alias)")
        loss = "nll"
    ls = a["label_smoothing_factor"]
    if isinstance(ls, bool) or not isinstance(ls, (int, float)) or not 0 <= ls < 1:
        raise ValueError(f"TRL label_smoothing_factor={ls!r}: accepted: a number in [0, 1)")
    if ls > 0 and loss == "nll":
        raise ValueError(f"TRL label_smoothing_factor={ls!r} with loss_type nll: TRL computes the "
                         "loss from the full logits and runs its fused head again under no_grad "
                         "(not counted); accepted: label_smoothing_factor 0")
    notes.append("TRL's fused LM head (trl 1.16 add_fused_lm_head): counted with "
                 "loss='trl_fused', no (B, s, V) logits")
    if loss == "dft":
        notes.append("loss_type dft: exp(log_probs) (fp32, one per label) kept until its "
                     "product's backward, before the head's: no moment changes")
    lkc = a["liger_kernel_config"]
    if lkc is not None and not isinstance(lkc, dict):
        raise ValueError(f"TRL liger_kernel_config={lkc!r}: accepted: null or an object")
    if a["use_liger_kernel"] and (lkc or {}).get("fused_linear_cross_entropy"):
        raise ValueError('TRL liger_kernel_config={"fused_linear_cross_entropy": true}: TRL '
                         "refuses it (it replaces the forward TRL patches with its fused head); "
                         "accepted: leave it out")
    if a["use_liger_kernel"]:
        notes.append("use_liger_kernel: Liger's RMSNorm, SwiGLU and RoPE; TRL turns Liger's "
                     "fused cross-entropy off and keeps its own fused head")
    if a["activation_offloading"]:
        raise ValueError("TRL activation_offloading=True: its offloading of the fused head's "
                         "saved tensors is not counted; accepted: false")
    strategy = a["packing_strategy"]
    if strategy not in ("bfd", "bfd_split", "wrapped"):
        raise ValueError(f"TRL packing_strategy={strategy!r}: accepted: bfd, bfd_split, wrapped")
    if a["padding_free"] and not a["packing"]:
        raise ValueError("TRL padding_free=True without packing, with max_length set: TRL "
                         "refuses it (\"When `padding_free=True` without packing, `max_length` "
                         "is not enforced\"); accepted: packing=true (packing_strategy bfd or "
                         "bfd_split: padding-free rows of max_length)")
    free = a["packing"] and (a["padding_free"] or strategy != "wrapped")
    kw: dict = {"checkpointing": a["gradient_checkpointing"], "precision": "bf16",
                "optimizer": TRL_OPTIMS[optim], "liger": a["use_liger_kernel"],
                "offload_activations": False}
    if a["bf16"]:
        notes.append("bf16=True: autocast over a bf16 model, counted as precision bf16")
    if free:
        kw["packed_lengths"] = (s,) * b
        notes.append(f"padding-free: {b} sequence(s) of max_length {s:,} flattened into one row")
        batch, seq = 1, b * s
    else:
        notes.append(f"rows padded to max_length: {b} × {s:,} tokens")
        batch, seq = b, s
    impl, attention = _trl_attention(a.get("model_init_kwargs"), free, notes)
    ignored = tuple(k for k in args if k not in TRL_DEFAULTS and k != "model_init_kwargs")
    mik = a.get("model_init_kwargs") or {}
    ignored += tuple(f"model_init_kwargs.{k}" for k in mik if k != "attn_implementation")
    return TrlMapping(batch, seq, kw, tuple(notes), ignored, attention=attention,
                      attn_implementation=impl)


def _trl_attention(mik: object, padding_free: bool, notes: list) -> tuple[str, str]:
    """(attn_implementation, calc's attention) for model_init_kwargs (module docstring);
    ValueError names a value calc cannot count."""
    if mik is not None and not isinstance(mik, dict):
        raise ValueError(f"TRL model_init_kwargs={mik!r}: accepted: null or an object")
    impl = (mik or {}).get("attn_implementation") or "sdpa"
    accepted = ", ".join(TRL_ATTENTIONS)
    if not isinstance(impl, str) or impl not in TRL_ATTENTIONS:
        why = TRL_ATTENTIONS_REFUSED.get(impl) if isinstance(impl, str) else None
        if why is None and isinstance(impl, str) and "/" in impl:
            why = "a Hub kernel is not counted"
        raise ValueError(f"TRL model_init_kwargs attn_implementation={impl!r}: "
                         f"{why or 'not counted'}; accepted: {accepted}")
    attention = TRL_ATTENTIONS[impl]
    if attention is None:  # torch's choice (module docstring)
        if padding_free:
            attention = "sdpa_efficient"
            notes.append("attention: SDPA as torch picks it; the padding-free row's "
                         "block-diagonal mask rules out flash, so the memory-efficient backend "
                         "(sdpa_efficient)")
        else:
            attention = "sdpa_flash"
            notes.append("attention: SDPA as torch picks it; full rows have no mask, so flash "
                         "(sdpa_flash); a batch padded to its longest row gets a padding mask "
                         "and the memory-efficient backend instead, not counted")
    elif padding_free and attention in PACKED_REFUSED:
        raise ValueError(f"TRL model_init_kwargs attn_implementation={impl!r} with a "
                         f"padding-free row: {PACKED_REFUSED[attention]}; accepted: sdpa, eager")
    return impl, attention


#: The levers `cheapest_fit` tries, cheapest first within each (what each costs: checkpointing
#: recomputes the forward, offloading copies to the host, 8-bit states lose precision).
LEVERS: tuple[tuple[str, dict], ...] = (
    ("liger", {"liger": True}),
    ("8-bit AdamW", {"optimizer": "adamw_8bit"}),
    ("paged 8-bit AdamW", {"optimizer": "paged_adamw_8bit"}),
    ("checkpointing", {"checkpointing": True}),
    ("offload activations", {"offload_activations": True}),
)


@dataclass(frozen=True)
class LeverRow:
    lever: str
    peak_bytes: int
    saving_bytes: int  # peak without this lever (the rest of the combination kept) − with it
    fits: bool


def cheapest_fit(step: Callable[..., object], gpu_bytes: int, base: dict,
                 ) -> tuple[list[str], int, list[LeverRow]]:
    """Fewest levers (then the lowest peak) on top of `base` whose peak fits gpu_bytes, trying
    every subset of LEVERS that training_step accepts (refused ones are skipped; one optimizer
    at a time). `step(**kwargs)` returns a TrainingStepMemory. Returns (the levers, the peak,
    one row per lever of the choice: its saving against the choice without it); ([], peak of
    the smallest peak tried, []) with no fit."""
    from itertools import combinations

    def peak(kw: dict) -> int | None:
        try:
            return step(**kw).peak_bytes
        except ValueError:
            return None

    names = [n for n, _ in LEVERS]
    table = dict(LEVERS)
    best_miss = None
    for k in range(len(names) + 1):
        found = []
        for combo in combinations(names, k):
            if sum("optimizer" in table[n] for n in combo) > 1:
                continue
            kw = dict(base)
            for n in combo:
                kw.update(table[n])
            p = peak(kw)
            if p is None:
                continue
            if p <= gpu_bytes:
                found.append((p, combo, kw))
            elif best_miss is None or p < best_miss:
                best_miss = p
        if found:
            p, combo, kw = min(found, key=lambda x: x[0])
            rows = []
            for n in combo:
                without = {**base, **{k2: v for m in combo if m != n for k2, v in table[m].items()}}
                pw = peak(without)
                rows.append(LeverRow(n, p, (pw - p) if pw is not None else 0, True))
            return list(combo), p, rows
    return [], best_miss or 0, []


def lever_savings(step: Callable[..., object], base: dict) -> list[tuple[str, int | None]]:
    """Each lever alone on top of `base`: its saving in peak bytes (None where refused)."""
    try:
        p0 = step(**base).peak_bytes
    except ValueError:
        return [(n, None) for n, _ in LEVERS]
    out: list[tuple[str, int | None]] = []
    for n, kw in LEVERS:
        try:
            out.append((n, p0 - step(**{**base, **kw}).peak_bytes))
        except ValueError:
            out.append((n, None))
    return out
