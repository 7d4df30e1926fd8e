"""One training-step configuration (``TrainConfig``) and one row (``TrainResult``).

Attention names (``ATTENTIONS``, kernels.measure.model_common): ``eager`` (transformers'
eager_attention_forward), ``sdpa_flash`` / ``sdpa_cudnn`` / ``sdpa_efficient`` / ``sdpa_math``
(attn_implementation="sdpa" under sdpa_kernel of that one backend), ``triton`` (ours,
``kernels.hf``), ``fa4`` (attn_implementation="flash_attention_4" where installed).
Precisions (``PRECISIONS``): ``bf16``, ``amp_bf16``, ``fp32`` (kernels.measure.train.procedure
says what each runs). Statuses: ``kernels.measure.harness.STATUSES``.

Row schema (``TRAIN_COLUMNS``, the CSV's header, in this order; bytes are integers, empty
when not measured):

    model              name in kernels.measure.train_models.MODELS (e.g. llama3-8b-2l)
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
    status             kernels.measure.harness.STATUSES (ok, oom, unavailable, skipped, error,
                       timeout, crashed)
    message            why (OOM text, refusal, notes)
    predicted_peak_bytes    calc.training_step(...).peak_bytes, empty when calc lacks it
    predicted_before_bytes  calc.training_step(...).before_step_bytes, likewise
    peak_rel_error     (predicted_peak - peak) / peak
    wall_s             seconds the whole configuration took (build, warm-up, steps)
    gpu                torch.cuda.get_device_name() or 'cpu'
    driver             NVIDIA driver version
    torch              torch.__version__
    triton             triton.__version__
    transformers       transformers.__version__
    timestamp          ISO 8601, UTC

No torch or transformers at import time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from kernels.measure import train_models
from kernels.measure.model_common import ATTENTIONS, SDPA_BACKENDS, shape_fields

__all__ = ["ATTENTIONS", "BOOL_COLUMNS", "FLOAT_COLUMNS", "INT_COLUMNS", "PRECISIONS",
           "SDPA_BACKENDS", "TRAIN_COLUMNS", "TrainConfig", "TrainResult", "check_config",
           "shape_fields"]

PRECISIONS = ("bf16", "amp_bf16", "fp32")


@dataclass(frozen=True)
class TrainConfig:
    """One training-step configuration."""

    model: str  # kernels.measure.train_models name
    seq_len: int
    attention: str  # ATTENTIONS
    precision: str  # PRECISIONS
    checkpointing: bool = False
    batch: int = 1
    layers: int | None = None  # None: the model's own (few) layers
    steps: int = 3  # measured steps (the median time is kept)

    def label(self) -> str:
        layers = f" L={self.layers}" if self.layers else ""
        return (f"{self.model}{layers} {self.attention} {self.precision} "
                f"{'ckpt' if self.checkpointing else 'no-ckpt'} B={self.batch} s={self.seq_len}")

    def series(self) -> tuple:
        """Everything but the length (an OOM skips the longer lengths of its series)."""
        return (self.model, self.layers, self.attention, self.precision, self.checkpointing,
                self.batch)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class TrainResult:
    """One row (module docstring: the schema)."""

    model: str
    arch: str = ""
    layers: int | None = None
    hidden: int | None = None
    intermediate: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    vocab: int | None = None
    tied: bool | None = None
    sliding_window: int | None = None
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

    def to_row(self) -> dict[str, Any]:
        return asdict(self)


#: Column order of training-step rows (CSV header).
TRAIN_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(TrainResult))


def _columns_of(kind: str) -> tuple[str, ...]:
    return tuple(f.name for f in fields(TrainResult)
                 if str(f.type).split(" | ")[0] == kind)


#: The columns parsed as whole numbers, decimals and booleans (TrainResult's field types; the
#: rest are text), so that a column added to TrainResult is typed where rows are read.
INT_COLUMNS, FLOAT_COLUMNS, BOOL_COLUMNS = (_columns_of("int"), _columns_of("float"),
                                            _columns_of("bool"))


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
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            return f"{name} must be a whole number >= {lo}, got {v!r}"
    if cfg.layers is not None and (not isinstance(cfg.layers, int) or cfg.layers < 1):
        return f"layers must be a whole number >= 1, got {cfg.layers!r}"
    return None
