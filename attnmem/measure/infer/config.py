"""One inference configuration (``InferConfig``) and one row (``InferResult``).

Attention names (``ATTENTIONS``): the training harness's (attnmem.measure.model_common:
``eager``, ``sdpa_flash`` / ``sdpa_cudnn`` / ``sdpa_efficient`` / ``sdpa_math``, ``triton``,
``fa4``; attnmem.measure.infer.procedure says what each runs) plus ``sdpa``, torch's own SDPA
choice per call. Caches (``CACHES``): ``dynamic`` (generate's default ``DynamicCache``),
``static`` (transformers' ``StaticCache``). Statuses: ``attnmem.measure.harness.STATUSES``.

Row schema (``INFER_COLUMNS``, the CSV's header, in this order; bytes are integers, empty
when not measured; the steps are attnmem.measure.infer.procedure's):

    model                        name in attnmem.measure.infer_models.MODELS (e.g. llama3.1-8b)
    arch                         config.model_type (llama, qwen2, mistral, gemma3_text, ...)
    layers                       num_hidden_layers as built
    hidden                       hidden_size
    intermediate                 intermediate_size (the dense MLP width)
    heads                        num_attention_heads
    kv_heads                     num_key_value_heads
    head_dim                     per-head width d
    vocab                        vocab_size
    tied                         tie_word_embeddings (True: one matrix for embedding and head)
    sliding_window               the config's sliding window (empty if no layer has one)
    experts                      routed experts per MoE layer (empty for dense models)
    batch                        B
    prompt_len                   tokens per prompt
    new_tokens                   N, tokens generated per sequence
    attention                    one of ATTENTIONS
    cache                        dynamic | static
    prefill_chunk                C, prompt tokens per prefill forward (empty: the whole prompt)
    params                       parameters, tied ones counted once
    weights_bytes                bytes of the model's parameter and buffer storages, each once
    before_bytes                 memory_allocated() after the warm-up (step 3)
    prefill_peak_bytes           max_memory_allocated() over the prefill run (step 4)
    peak_bytes                   max_memory_allocated() over the full run (step 5, absolute)
    reserved_bytes               max_memory_reserved() over the full run
    after_bytes                  memory_allocated() after the full run, its output still held
    cache_bytes                  bytes of the returned cache's tensor storages (step 5)
    prefill_ms                   the prefill run (CUDA events), ms
    decode_ms_per_token          (full run - prefill run) / (N - 1), ms; empty when N = 1
    status                       attnmem.measure.harness.STATUSES (ok, oom, unavailable,
                                 skipped, error, timeout, crashed)
    message                      why (OOM text, refusal, notes)
    predicted_peak_bytes         attnmem.calc.inference_step(...).peak_bytes, empty when calc lacks it
    predicted_prefill_peak_bytes attnmem.calc.inference_step(...).prefill_peak_bytes, likewise
    predicted_cache_bytes        attnmem.calc.inference_step(...).kv_cache_bytes, likewise
    predicted_peak_phase         attnmem.calc.inference_step(...).peak_phase, likewise
    peak_rel_error               (predicted_peak - peak) / peak
    prefill_rel_error            (predicted_prefill_peak - prefill_peak) / prefill_peak
    wall_s                       seconds the configuration took (build when not kept, warm-up,
                                 both runs)
    gpu                          torch.cuda.get_device_name() or 'cpu'
    driver                       NVIDIA driver version
    torch                        torch.__version__
    triton                       triton.__version__
    transformers                 transformers.__version__
    timestamp                    ISO 8601, UTC

No torch or transformers at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from attnmem.measure import infer_models
from attnmem.measure import model_common as mc
from attnmem.measure.model_common import DictConfig, ModelRow, typed_columns, whole

__all__ = ["ATTENTIONS", "BOOL_COLUMNS", "CACHES", "FLOAT_COLUMNS", "INFER_COLUMNS",
           "INT_COLUMNS", "SDPA_BACKENDS", "InferConfig", "InferResult", "check_config",
           "shape_fields"]

#: The training harness's attentions plus ``sdpa``: attn_implementation="sdpa" with no backend
#: forced, torch's own choice per call (what a user of generate() runs; with a mask it cannot
#: be the flash backend).
ATTENTIONS = ("sdpa", *mc.ATTENTIONS)
SDPA_BACKENDS = mc.SDPA_BACKENDS
CACHES = ("dynamic", "static")


@dataclass(frozen=True)
class InferConfig(DictConfig):
    """One inference configuration."""

    model: str  # attnmem.measure.infer_models name
    prompt_len: int
    attention: str  # ATTENTIONS
    batch: int = 1
    new_tokens: int = 8
    cache: str = "dynamic"  # CACHES
    prefill_chunk: int | None = None  # None: the whole prompt in one forward
    layers: int | None = None  # None: the model's own layer count

    def label(self) -> str:
        layers = f" L={self.layers}" if self.layers else ""
        chunk = f" chunk={self.prefill_chunk}" if self.prefill_chunk else ""
        return (f"{self.model}{layers} {self.attention} {self.cache}{chunk} B={self.batch} "
                f"prompt={self.prompt_len} new={self.new_tokens}")

    def series(self) -> tuple:
        """Everything but the prompt length (an OOM skips the longer prompts of its series)."""
        return (self.model, self.layers, self.attention, self.cache, self.prefill_chunk,
                self.batch, self.new_tokens)

    def build_key(self) -> tuple:
        """What the built model depends on (the worker keeps it while this stays the same)."""
        impl = "sdpa" if self.attention in SDPA_BACKENDS or self.attention == "sdpa" \
            else self.attention
        return (self.model, self.layers, impl)

    def row_identity(self) -> dict[str, Any]:
        """The row's columns that name this configuration (InferResult's keywords): the same
        in measured, skipped, timed-out and crashed rows."""
        return {"model": self.model, "layers": self.layers, "batch": self.batch,
                "prompt_len": self.prompt_len, "new_tokens": self.new_tokens,
                "attention": self.attention, "cache": self.cache,
                "prefill_chunk": self.prefill_chunk}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> InferConfig:
        """The configuration of a typed row (attnmem.measure.infer.store.typed_row), at the
        model's own layer count (``repredict`` passes the row's layers to the model config)."""
        return cls(row["model"], row["prompt_len"], row["attention"], row["batch"] or 1,
                   row["new_tokens"] or 1, row["cache"] or "dynamic", row["prefill_chunk"])


@dataclass(frozen=True)
class InferResult(ModelRow):
    """One row (module docstring: the schema): ModelRow's model and shape columns, then
    these."""

    experts: int | None = None
    batch: int = 1
    prompt_len: int = 0
    new_tokens: int = 0
    attention: str = ""
    cache: str = ""
    prefill_chunk: int | None = None
    params: int | None = None
    weights_bytes: int | None = None
    before_bytes: int | None = None
    prefill_peak_bytes: int | None = None
    peak_bytes: int | None = None
    reserved_bytes: int | None = None
    after_bytes: int | None = None
    cache_bytes: int | None = None
    prefill_ms: float | None = None
    decode_ms_per_token: float | None = None
    status: str = "error"
    message: str = ""
    predicted_peak_bytes: int | None = None
    predicted_prefill_peak_bytes: int | None = None
    predicted_cache_bytes: int | None = None
    predicted_peak_phase: str = ""
    peak_rel_error: float | None = None
    prefill_rel_error: float | None = None
    wall_s: float | None = None
    gpu: str = ""
    driver: str = ""
    torch: str = ""
    triton: str = ""
    transformers: str = ""
    timestamp: str = ""


#: Column order of inference rows (CSV header).
INFER_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(InferResult))


#: The columns parsed as whole numbers, decimals and booleans (InferResult's field types; the
#: rest are text), so that a column added to InferResult is typed where rows are read.
INT_COLUMNS, FLOAT_COLUMNS, BOOL_COLUMNS = typed_columns(InferResult)


def check_config(cfg: InferConfig) -> str | None:
    """What is wrong with cfg's arguments (a message naming the value), or None."""
    if cfg.model not in infer_models.MODELS:
        return f"unknown model {cfg.model!r}; known: {', '.join(infer_models.NAMES)}"
    if cfg.attention not in ATTENTIONS:
        return f"unknown attention {cfg.attention!r}; known: {', '.join(ATTENTIONS)}"
    if cfg.cache not in CACHES:
        return f"unknown cache {cfg.cache!r}; known: {', '.join(CACHES)}"
    for name in ("prompt_len", "batch", "new_tokens"):
        v = getattr(cfg, name)
        if not whole(v, 1):
            return f"{name} must be a whole number >= 1, got {v!r}"
    if cfg.prefill_chunk is not None and not whole(cfg.prefill_chunk, 1):
        return f"prefill_chunk must be None or a whole number >= 1, got {cfg.prefill_chunk!r}"
    if cfg.layers is not None and not whole(cfg.layers, 1):
        return f"layers must be None or a whole number >= 1, got {cfg.layers!r}"
    return None


def shape_fields(hf: Any) -> dict[str, Any]:
    """The row's shape columns from a transformers config object (the training harness's,
    plus the routed experts: ``num_experts`` (Qwen-MoE), ``n_routed_experts`` (DeepSeek),
    ``num_local_experts`` (Mixtral))."""
    out = mc.shape_fields(hf)
    experts = None
    for key in ("num_experts", "n_routed_experts", "num_local_experts"):
        if getattr(hf, key, None):
            experts = int(getattr(hf, key))
            break
    out["experts"] = experts
    return out
