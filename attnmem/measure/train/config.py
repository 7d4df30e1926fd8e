"""One training-step configuration (``TrainConfig``) and one row (``TrainResult``).

Attention names (``ATTENTIONS``, attnmem.measure.model_common): ``eager`` (transformers'
eager_attention_forward), ``sdpa_flash`` / ``sdpa_cudnn`` / ``sdpa_efficient`` / ``sdpa_math``
(attn_implementation="sdpa" under sdpa_kernel of that one backend), ``triton`` (ours,
``attnmem.kernels.hf``), ``fa4`` (attn_implementation="flash_attention_4" where installed).
Precisions (``PRECISIONS``): ``bf16``, ``amp_bf16``, ``fp32`` (attnmem.measure.train.procedure
says what each runs). Statuses: ``attnmem.measure.harness.STATUSES``.

Row schema (``TRAIN_COLUMNS``, the CSV's header, in this order; bytes are integers, empty
when not measured):

    model              name in attnmem.measure.train_models.MODELS (e.g. llama3-8b-2l)
    arch               config.model_type (llama, qwen2, qwen3, mistral, phi3, gemma2, gemma3_text)
    layers             num_hidden_layers as built
    hidden             hidden_size
    intermediate       intermediate_size (MLP width)
    heads              num_attention_heads
    kv_heads           num_key_value_heads
    head_dim           per-head width d
    vocab              vocab_size
    tied               tie_word_embeddings (True: one matrix for embedding and head)
    sliding_window     the config's sliding window (empty if none)
    batch              B
    seq_len            s (tokens per sequence)
    attention          one of ATTENTIONS
    precision          bf16 | amp_bf16 | fp32
    checkpointing      True | False
    params             parameters, tied ones counted once
    before_step_bytes  memory_allocated() after the warm-up step (procedure, step 4)
    peak_bytes         max_memory_allocated() over the measured steps (absolute)
    reserved_bytes     max_memory_reserved() over the measured steps
    step_ms            median of the measured steps (CUDA events), ms
    steps              how many steps were timed
    loss               the loss of the last measured step (a check that it ran: ~ln(vocab))
    status             attnmem.measure.harness.STATUSES (ok, oom, unavailable, skipped, error,
                       timeout, crashed)
    message            why (OOM text, refusal, notes)
    predicted_peak_bytes    attnmem.calc.training_step(...).peak_bytes, empty when calc lacks it
    predicted_before_bytes  attnmem.calc.training_step(...).before_step_bytes, likewise
    peak_rel_error     (predicted_peak - peak) / peak
    wall_s             seconds the whole configuration took (build, warm-up, steps)
    gpu                torch.cuda.get_device_name() or 'cpu'
    driver             NVIDIA driver version
    torch              torch.__version__
    triton             triton.__version__
    transformers       transformers.__version__
    timestamp          ISO 8601, UTC
    adapter            none (full training) | lora (peft LoRA on a frozen base; issue 34)
    lora_rank          LoRA r (empty without adapters)
    lora_alpha         LoRA alpha (scaling = alpha / r; no byte depends on it)
    lora_targets       attention (q, k, v, o) | all-linear (those and gate, up, down)
    lora_dropout       LoRA dropout probability
    adapter_dtype      fp32 (peft's default autocast_adapter_dtype=True) | bf16
    base_dtype         bf16 | nf4 | nf4_dq (QLoRA: bitsandbytes 4-bit base, with double
                       quantization for nf4_dq); bf16 for full training
    trainable_params   parameters that get gradients and AdamW state (all of them in full
                       training, the adapters' with LoRA)
    packed_lengths     padding-free rows: the lengths of the sequences packed into the one
                       row, joined by '+' (e.g. 1000+3000+96; batch 1, seq_len their sum,
                       position_ids restarting at each); empty for dense rows
    optimizer          the optimizer the step ran (OPTIMIZERS; issue 43): adamw (torch AdamW,
                       its default foreach path), adamw_fused (fused=True), adamw_8bit /
                       paged_adamw_8bit (bitsandbytes AdamW8bit / PagedAdamW8bit), adafactor
                       (transformers' Adafactor, its defaults), sgd (torch SGD, momentum 0)
    kbit_prepare       True: peft's prepare_model_for_kbit_training ran on the 4-bit base
                       before the adapters (the QLoRA recipe; it turns checkpointing on)
    liger              True: liger-kernel's apply_liger_kernel_to_<arch> patched the model
                       (RoPE, RMSNorm, SwiGLU, fused linear cross-entropy)
    offload_activations  True: forward and backward ran under
                       torch.autograd.graph.save_on_cpu(pin_memory=True)

The adapter, packing and recipe columns come last so that CSVs written before them still
read: a missing column is full training on dense rows with AdamW and no recipe lever
(``COLUMN_DEFAULTS``: adapter none, base_dtype bf16, optimizer adamw; ``LEVER_FLAGS`` read as
False; the rest empty).

No torch or transformers at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from attnmem.measure import train_models
from attnmem.measure.model_common import (
    ATTENTIONS,
    SDPA_BACKENDS,
    DictConfig,
    ModelRow,
    shape_fields,
    typed_columns,
    whole,
)

__all__ = ["ADAPTERS", "ADAPTER_DTYPES", "ATTENTIONS", "BASE_DTYPES", "BOOL_COLUMNS",
           "COLUMN_DEFAULTS", "FLOAT_COLUMNS", "INT_COLUMNS", "LEVER_FLAGS", "LORA_TARGETS",
           "OPTIMIZERS", "PRECISIONS", "SDPA_BACKENDS", "TRAIN_COLUMNS", "TrainConfig",
           "TrainResult", "check_adapter", "check_config", "check_levers", "shape_fields"]

PRECISIONS = ("bf16", "amp_bf16", "fp32")
#: Fine-tuning (issue 34): "none" is full training, "lora" peft LoRA adapters on a frozen base.
ADAPTERS = ("none", "lora")
#: peft target_modules: "attention" = q/k/v/o_proj (a list), "all-linear" = peft's shorthand
#: (every nn.Linear but the output layer). attnmem.calc.training_step.LORA_TARGET_SETS, same names.
LORA_TARGETS = ("attention", "all-linear")
#: The base's storage: bf16, or QLoRA's bitsandbytes NF4 without / with double quantization
#: (attnmem.calc.training_step.BASE_DTYPES).
BASE_DTYPES = ("bf16", "nf4", "nf4_dq")
#: The adapters' dtype: fp32 (get_peft_model's autocast_adapter_dtype=True, its default) or
#: bf16 (autocast_adapter_dtype=False) (attnmem.calc.training_step.ADAPTER_DTYPES).
ADAPTER_DTYPES = ("fp32", "bf16")
#: The optimizers a step runs (issue 43; attnmem.calc.training_step.OPTIMIZERS, same names;
#: attnmem.measure.train.recipes.make_optimizer builds each).
OPTIMIZERS = ("adamw", "adamw_fused", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd")
#: The recipe's on/off levers (issue 43): TrainConfig fields, row columns and
#: attnmem.calc.training_step keywords of the same names.
LEVER_FLAGS = ("kbit_prepare", "liger", "offload_activations")


@dataclass(frozen=True)
class TrainConfig(DictConfig):
    """One training-step configuration."""

    model: str  # attnmem.measure.train_models name
    seq_len: int
    attention: str  # ATTENTIONS
    precision: str  # PRECISIONS
    checkpointing: bool = False
    batch: int = 1
    layers: int | None = None  # None: the model's own (few) layers
    steps: int = 3  # measured steps (the median time is kept)
    # Fine-tuning (issue 34); ignored (and left empty in the row) when adapter is "none".
    adapter: str = "none"  # ADAPTERS
    rank: int = 16  # LoRA r
    alpha: float = 16.0  # LoRA alpha (attnmem.calc.training_step.LoRA's default)
    targets: str = "all-linear"  # LORA_TARGETS
    lora_dropout: float = 0.0
    adapter_dtype: str = "fp32"  # ADAPTER_DTYPES
    base_dtype: str = "bf16"  # BASE_DTYPES; nf4 / nf4_dq only with adapters (QLoRA)
    # Padding-free rows: the packed sequences' lengths joined by '+' ('' = dense rows).
    packed: str = ""
    # The recipe (issue 43): the optimizer and the levers (config.py's row schema says what
    # each runs; attnmem.measure.train.recipes runs them).
    optimizer: str = "adamw"  # OPTIMIZERS
    kbit_prepare: bool = False
    liger: bool = False
    offload_activations: bool = False

    @property
    def lora(self) -> bool:
        return self.adapter == "lora"

    def lever_kwargs(self) -> dict[str, Any]:
        """The recipe as attnmem.calc.training_step's keywords (optimizer and LEVER_FLAGS)."""
        return {"optimizer": self.optimizer, "kbit_prepare": bool(self.kbit_prepare),
                "liger": bool(self.liger), "offload_activations": bool(self.offload_activations)}

    def has_levers(self) -> bool:
        """Whether the recipe differs from the plain step (AdamW, no lever)."""
        return self.optimizer != "adamw" or any(getattr(self, f) for f in LEVER_FLAGS)

    def lever_label(self) -> str:
        """'' for the plain step, else e.g. 'paged_adamw_8bit kbit-prepare liger offload'."""
        words = [self.optimizer] if self.optimizer != "adamw" else []
        words += [w for f, w in (("kbit_prepare", "kbit-prepare"), ("liger", "liger"),
                                 ("offload_activations", "offload")) if getattr(self, f)]
        return " ".join(words)

    def packed_lengths(self) -> tuple[int, ...]:
        """The packed lengths as ints (() for dense rows); ValueError when malformed."""
        if not self.packed:
            return ()
        return parse_pack(self.packed)

    def adapter_label(self) -> str:
        """'' for full training, else e.g. 'lora r=16 a=16 all-linear nf4'."""
        if not self.lora:
            return ""
        extra = "".join([f" dropout={self.lora_dropout:g}" if self.lora_dropout else "",
                         f" {self.adapter_dtype}-adapters" if self.adapter_dtype != "fp32" else "",
                         f" {self.base_dtype}" if self.base_dtype != "bf16" else ""])
        return f"lora r={self.rank} a={self.alpha:g} {self.targets}{extra}"

    def label(self) -> str:
        layers = f" L={self.layers}" if self.layers else ""
        adapter = f" {self.adapter_label()}" if self.lora else ""
        pack = f" packed={self.packed}" if self.packed else ""
        levers = f" {self.lever_label()}" if self.has_levers() else ""
        return (f"{self.model}{layers}{adapter} {self.attention} {self.precision} "
                f"{'ckpt' if self.checkpointing else 'no-ckpt'} B={self.batch} s={self.seq_len}"
                f"{pack}{levers}")

    def series(self) -> tuple:
        """Everything but the length (an OOM skips the longer lengths of its series)."""
        return (self.model, self.layers, self.attention, self.precision, self.checkpointing,
                self.batch, bool(self.packed), *self.adapter_key(),
                *self.lever_kwargs().values())

    def adapter_key(self) -> tuple:
        """The fine-tuning fields that matter: () for full training."""
        if not self.lora:
            return ()
        return (self.adapter, self.rank, self.alpha, self.targets, self.lora_dropout,
                self.adapter_dtype, self.base_dtype)

    def row_identity(self) -> dict[str, Any]:
        """The row's columns that name this configuration (TrainResult's keywords): the same
        in measured, skipped, timed-out and crashed rows."""
        lora = self.lora
        return {"model": self.model, "layers": self.layers, "batch": self.batch,
                "seq_len": self.seq_len, "attention": self.attention,
                "precision": self.precision, "checkpointing": bool(self.checkpointing),
                "adapter": self.adapter, "lora_rank": self.rank if lora else None,
                "lora_alpha": float(self.alpha) if lora else None,
                "lora_targets": self.targets if lora else "",
                "lora_dropout": float(self.lora_dropout) if lora else None,
                "adapter_dtype": self.adapter_dtype if lora else "",
                "base_dtype": self.base_dtype, "packed_lengths": self.packed,
                **self.lever_kwargs()}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TrainConfig:
        """The configuration of a typed row (attnmem.measure.train.store.typed_row); a row
        without the adapter columns is full training, one without the recipe columns AdamW
        with no lever."""
        lora = row.get("adapter") == "lora"
        kw: dict[str, Any] = {}
        if lora:
            kw = {"adapter": "lora", "rank": row.get("lora_rank"),
                  "alpha": row.get("lora_alpha"), "targets": row.get("lora_targets"),
                  "lora_dropout": row.get("lora_dropout") or 0.0,
                  "adapter_dtype": row.get("adapter_dtype") or "fp32"}
        return cls(row["model"], row["seq_len"], row["attention"], row["precision"],
                   bool(row["checkpointing"]), row.get("batch") or 1, row.get("layers"),
                   base_dtype=row.get("base_dtype") or "bf16",
                   packed=row.get("packed_lengths") or "",
                   optimizer=row.get("optimizer") or "adamw",
                   **{f: bool(row.get(f)) for f in LEVER_FLAGS}, **kw)



@dataclass(frozen=True)
class TrainResult(ModelRow):
    """One row (module docstring: the schema): ModelRow's model and shape columns, then
    these."""

    batch: int = 1
    seq_len: int = 0
    attention: str = ""
    precision: str = ""
    checkpointing: bool = False
    params: int | None = None
    before_step_bytes: int | None = None
    peak_bytes: int | None = None
    reserved_bytes: int | None = None
    step_ms: float | None = None
    steps: int | None = None
    loss: float | None = None
    status: str = "error"
    message: str = ""
    predicted_peak_bytes: int | None = None
    predicted_before_bytes: int | None = None
    peak_rel_error: float | None = None
    wall_s: float | None = None
    gpu: str = ""
    driver: str = ""
    torch: str = ""
    triton: str = ""
    transformers: str = ""
    timestamp: str = ""
    adapter: str = "none"
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_targets: str = ""
    lora_dropout: float | None = None
    adapter_dtype: str = ""
    base_dtype: str = "bf16"
    trainable_params: int | None = None
    packed_lengths: str = ""
    optimizer: str = "adamw"
    kbit_prepare: bool = False
    liger: bool = False
    offload_activations: bool = False


#: Column order of training-step rows (CSV header).
TRAIN_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(TrainResult))


#: The columns parsed as whole numbers, decimals and booleans (TrainResult's field types; the
#: rest are text), so that a column added to TrainResult is typed where rows are read.
INT_COLUMNS, FLOAT_COLUMNS, BOOL_COLUMNS = typed_columns(TrainResult)
#: What an empty or missing text cell means (CSVs written before the adapter or recipe
#: columns); a missing LEVER_FLAGS cell is False (attnmem.measure.train.store.typed_row).
COLUMN_DEFAULTS: dict[str, str] = {"adapter": "none", "base_dtype": "bf16", "optimizer": "adamw"}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_adapter(cfg: TrainConfig) -> str | None:
    """What is wrong with cfg's fine-tuning fields (one line), or None. Mirrors the argument
    checks of attnmem.calc.training_step.LoRA and base_dtype; what calc refuses to model (autocast
    or a fused architecture with adapters) is the procedure's 'unavailable' row instead."""
    if cfg.adapter not in ADAPTERS:
        return f"unknown adapter {cfg.adapter!r}; known: {', '.join(ADAPTERS)}"
    if cfg.base_dtype not in BASE_DTYPES:
        return f"unknown base dtype {cfg.base_dtype!r}; known: {', '.join(BASE_DTYPES)}"
    if not cfg.lora:
        if cfg.base_dtype != "bf16":
            return (f"base dtype {cfg.base_dtype} without adapters: a 4-bit base has no "
                    "trainable weights; use adapter lora (QLoRA)")
        return None
    if not isinstance(cfg.rank, int) or isinstance(cfg.rank, bool) or not 1 <= cfg.rank <= 1 << 16:
        return f"LoRA rank must be a whole number in 1..65536, got {cfg.rank!r}"
    if not _number(cfg.alpha) or not 0 < cfg.alpha < float("inf"):
        return f"LoRA alpha must be a positive finite number, got {cfg.alpha!r}"
    if cfg.targets not in LORA_TARGETS:
        return f"unknown LoRA targets {cfg.targets!r}; known: {', '.join(LORA_TARGETS)}"
    if not _number(cfg.lora_dropout) or not 0 <= cfg.lora_dropout < 1:
        return f"LoRA dropout must be a number in [0, 1), got {cfg.lora_dropout!r}"
    if cfg.adapter_dtype not in ADAPTER_DTYPES:
        return (f"unknown adapter dtype {cfg.adapter_dtype!r}; known: "
                f"{', '.join(ADAPTER_DTYPES)}")
    return None


def check_config(cfg: TrainConfig) -> str | None:
    """What is wrong with cfg's arguments (a message), or None."""
    if cfg.model not in train_models.MODELS:
        return f"unknown model {cfg.model!r}; known: {', '.join(train_models.NAMES)}"
    if cfg.attention not in ATTENTIONS:
        return f"unknown attention {cfg.attention!r}; known: {', '.join(ATTENTIONS)}"
    if cfg.precision not in PRECISIONS:
        return f"unknown precision {cfg.precision!r}; known: {', '.join(PRECISIONS)}"
    for name, lo in (("seq_len", 2), ("batch", 1), ("steps", 1)):
        v = getattr(cfg, name)
        if not whole(v, lo):
            return f"{name} must be a whole number >= {lo}, got {v!r}"
    if cfg.layers is not None and not whole(cfg.layers, 1):
        return f"layers must be a whole number >= 1, got {cfg.layers!r}"
    return check_packed(cfg) or check_adapter(cfg) or check_levers(cfg)


def check_levers(cfg: TrainConfig) -> str | None:
    """What is wrong with cfg's recipe fields as values (one line), or None. Whether calc
    counts the combination is the prediction's business (attnmem.measure.train.predict: a
    refusal there is an 'unavailable' row with calc's reason, decided before any build)."""
    if cfg.optimizer not in OPTIMIZERS:
        return f"unknown optimizer {cfg.optimizer!r}; known: {', '.join(OPTIMIZERS)}"
    for f in LEVER_FLAGS:
        if not isinstance(getattr(cfg, f), bool):
            return f"{f} must be True or False, got {getattr(cfg, f)!r}"
    return None


def parse_pack(text: object) -> tuple[int, ...]:
    """'1000+3000+96' -> (1000, 3000, 96); ValueError unless whole numbers >= 1 joined by
    '+'."""
    if not isinstance(text, str):
        raise ValueError(f"packed must be lengths joined by '+', got {text!r}")
    parts = text.split("+")
    if not all(p.isascii() and p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"packed must be whole numbers >= 1 joined by '+' (e.g. "
                         f"1000+3000+96), got {text!r}")
    return tuple(int(p) for p in parts)


def check_packed(cfg: TrainConfig) -> str | None:
    """What is wrong with cfg's packed lengths (one line), or None: a packed row is batch 1
    and seq_len the lengths' sum (attnmem.calc.training_step's check_packed says the same)."""
    try:
        lengths = cfg.packed_lengths()
    except ValueError as exc:
        return str(exc)
    if not lengths:
        return None
    if cfg.batch != 1:
        return f"packed sequences are one row: batch must be 1, got {cfg.batch}"
    if sum(lengths) != cfg.seq_len:
        return f"seq_len must be the packed total {sum(lengths)}, got {cfg.seq_len}"
    return None
