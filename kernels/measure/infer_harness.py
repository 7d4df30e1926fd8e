"""Measure inference (``model.generate()``) of a real transformers model: weights, the prompt's
prefill peak, the whole generation's peak, the KV cache, prefill and decode time.

The procedure (``measure_infer``; ``calc.inference_step`` predicts exactly this):

1. Build ``AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16,
   attn_implementation=...)`` under ``torch.device("cuda")`` (fp32 on the CPU, for the tests),
   random init, no download (``kernels.measure.infer_models``), ``model.eval()``. Attention names
   are the training harness's ``ATTENTIONS``: ``eager``, ``sdpa_flash`` / ``sdpa_cudnn`` /
   ``sdpa_efficient`` / ``sdpa_math`` (attn_implementation="sdpa", the whole ``generate()``
   call inside ``torch.nn.attention.sdpa_kernel(<that backend>)``), ``triton`` (ours, through
   ``kernels.hf.register()``), ``fa4`` (attn_implementation="flash_attention_4" where
   installed). The worker keeps the built model for the next configuration of the same model,
   layers and attn_implementation (the SDPA backends share one build); step 3 re-measures
   ``before_bytes`` for every configuration, and a worker that holds more than 256 MiB beyond
   the kept model after cleaning up is replaced.
2. Inputs: ``input_ids`` (B, prompt_len), uniform random token ids in [0, vocab);
   ``attention_mask = torch.ones_like(input_ids)`` (what a tokenizer gives for unpadded text).
3. Warm-up: one ``generate()`` of the same attention, cache kind and chunking on a short
   prompt (min(32, prompt_len) tokens, 2 new tokens; a chunk of min(C, 16) tokens, so that the
   chunked path runs), which creates cuBLAS handles, compiles Triton kernels, etc. Then
   ``gc.collect(); torch.cuda.empty_cache()``; ``before_bytes = memory_allocated()`` (weights,
   buffers and workspaces).
4. Prefill run: ``reset_peak_memory_stats()``; ``generate(..., max_new_tokens=1,
   min_new_tokens=1)`` between two CUDA events: ``prefill_ms``, ``prefill_peak_bytes =
   max_memory_allocated()``. Its output is freed, ``gc.collect()``, ``empty_cache()``.
5. Full run: ``reset_peak_memory_stats()``; ``generate(..., max_new_tokens=N,
   min_new_tokens=N, return_dict_in_generate=True)`` between two CUDA events: ``peak_bytes =
   max_memory_allocated()``, ``reserved_bytes = max_memory_reserved()``,
   ``decode_ms_per_token = (t_full - t_prefill) / (N - 1)`` when N > 1; ``after_bytes =
   memory_allocated()`` while the output (ids and cache) is still held; ``cache_bytes``: the
   bytes of every tensor storage the returned cache holds (``cache_storage_bytes``: the
   cache's layers' keys and values and anything else they hold, such as hybrid conv/ssm states
   and sliding layers' counters; a storage counted once; a view counts its whole storage: a
   sliding layer's cache right after prefill is a view of the whole prompt's keys,
   ``DynamicSlidingWindowLayer.update``). The output must be prompt_len + N tokens long.
   Every ``generate()`` call gets ``do_sample=False, use_cache=True, pad_token_id=0`` (random
   configs may lack one), ``output_scores=False, output_logits=False`` (nothing but ids and
   cache is kept), ``disable_compile=True`` (transformers compiles the forward with CUDA
   graphs when the cache is static, ``GenerationMixin._valid_auto_compile_criteria``; this
   measures eager PyTorch), ``cache_implementation="static"`` when cache is "static"
   (transformers' ``StaticCache``, preallocated to prompt_len + N - 1 positions; dynamic:
   generate's default ``DynamicCache``), ``prefill_chunk_size=C`` when prefill_chunk is set
   (``GenerationMixin._prefill`` then feeds the prompt C tokens at a time; where the installed
   ``GenerationConfig`` has no such option the row is unavailable). min_new_tokens keeps EOS
   from ending generation early. The model's ``_previous_max_cache_length`` (generate grows a
   static cache to the longest length asked before, ``_prepare_static_cache``) is cleared
   before every call, so one configuration's length never sizes the next one's cache.
6. Out of memory is a result (status ``oom``). An attention that cannot run the call (an SDPA
   backend with no kernel for it, e.g. flash with the mask a static cache or a later prefill
   chunk materialises; our kernel's refusals, which include any materialised mask and causal
   attention with fewer queries than keys; FlashAttention-4 not installed) is ``unavailable``
   with the reason. Statuses: ``kernels.measure.harness.STATUSES``.
7. Prediction: ``calc.inference_step(ModelConfig.from_hf_config(config), batch, prompt_len,
   new_tokens, attention=..., weight_dtype="bf16", kv_dtype="bf16", cache=...,
   prefill_chunk=...)`` (``predict``); when calc lacks it or refuses the case the predicted
   columns are empty and the message says why.

On a CPU (no CUDA) the procedure runs end to end (the tests) and the byte columns that come
from CUDA's allocator are empty.

Row schema (``INFER_COLUMNS``, the CSV's header, in this order; bytes are integers, empty
when not measured):

    model                        name in kernels.measure.infer_models.MODELS (e.g. llama3.1-8b)
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
    status                       kernels.measure.harness.STATUSES (ok, oom, unavailable,
                                 skipped, error, timeout, crashed)
    message                      why (OOM text, refusal, notes)
    predicted_peak_bytes         calc.inference_step(...).peak_bytes, empty when calc lacks it
    predicted_prefill_peak_bytes calc.inference_step(...).prefill_peak_bytes, likewise
    predicted_cache_bytes        calc.inference_step(...).kv_cache_bytes, likewise
    predicted_peak_phase         calc.inference_step(...).peak_phase, likewise
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

The runner (``run_infer``) measures a list of configurations in one child process (this
module with ``--worker``; JSON lines on stdin/stdout, ``kernels.measure.child.WorkerProcess``)
under the GPU lock; a configuration past its time limit kills the child (``timeout``), a
dead child is ``crashed``, and a fresh child takes the next one; an OOM skips the longer
prompts of its series; a time budget skips whatever has not started when it is spent (rows
with status ``skipped``). Command line: ``python -m kernels.measure --infer ...`` (``main``;
``--plan h200`` is the bundled reference sweep, ``reference_plan``). No torch or transformers
at import time.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import IO, Any

from kernels.measure import infer_models
from kernels.measure import model_common as mc
from kernels.measure import run_common as rc
from kernels.measure.model_common import DictConfig, ModelRow

#: The training harness's attentions plus ``sdpa``: attn_implementation="sdpa" with no backend
#: forced, torch's own choice per call (what a user of generate() runs; with a mask it cannot
#: be the flash backend).
ATTENTIONS = ("sdpa", *mc.ATTENTIONS)
SDPA_BACKENDS = mc.SDPA_BACKENDS
CACHES = ("dynamic", "static")
#: The warm-up's prompt and new tokens (step 3), and its largest prefill chunk.
WARMUP_PROMPT, WARMUP_NEW, WARMUP_CHUNK = 32, 2, 16
#: A worker whose allocator holds this much beyond the kept model after cleaning up exits (the
#: runner starts a fresh one), so one configuration's leftovers never count in the next.
LEFTOVER_RESTART_BYTES = mc.LEFTOVER_RESTART_BYTES


@dataclass(frozen=True)
class InferConfig(DictConfig):
    """One inference configuration."""

    model: str  # kernels.measure.infer_models name
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


def _whole(v: Any, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


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
        if not _whole(v, 1):
            return f"{name} must be a whole number >= 1, got {v!r}"
    if cfg.prefill_chunk is not None and not _whole(cfg.prefill_chunk, 1):
        return f"prefill_chunk must be None or a whole number >= 1, got {cfg.prefill_chunk!r}"
    if cfg.layers is not None and not _whole(cfg.layers, 1):
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


# --------------------------------------------------------------------------------------------
# The prediction: calc.inference_step, when calc has it.
# --------------------------------------------------------------------------------------------

_PREDICTED = ("predicted_peak_bytes", "predicted_prefill_peak_bytes", "predicted_cache_bytes",
              "predicted_peak_phase")


def _inference_step() -> Callable[..., Any]:
    """calc's inference_step function (raises ImportError or AttributeError when missing)."""
    import importlib
    import types

    import calc

    fn = getattr(calc, "inference_step", None)
    if fn is None or isinstance(fn, types.ModuleType):
        fn = importlib.import_module("calc.inference_step").inference_step
    return fn


def predict(cfg: InferConfig, config_dict: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The predicted_* columns for cfg from calc.inference_step (empty and a reason when calc
    lacks it or refuses the case)."""
    empty = {k: ("" if k == "predicted_peak_phase" else None) for k in _PREDICTED}
    try:
        from calc import ModelConfig

        fn = _inference_step()
    except (ImportError, AttributeError) as exc:
        return empty, f"no prediction: calc has no inference_step ({mc.short_error(exc, 200)})"
    try:
        model = ModelConfig.from_hf_config(config_dict, name=cfg.model)
        m = fn(model, cfg.batch, cfg.prompt_len, cfg.new_tokens, attention=cfg.attention,
               weight_dtype="bf16", kv_dtype="bf16", cache=cfg.cache,
               prefill_chunk=cfg.prefill_chunk)
        # The prefill run (step 4) makes one token: its own prediction (a static cache is
        # sized by the tokens asked for, so N matters even before the first decode step).
        one = m if cfg.new_tokens == 1 else fn(
            model, cfg.batch, cfg.prompt_len, 1, attention=cfg.attention, weight_dtype="bf16",
            kv_dtype="bf16", cache=cfg.cache, prefill_chunk=cfg.prefill_chunk)
        return {"predicted_peak_bytes": int(m.peak_bytes),
                "predicted_prefill_peak_bytes": int(one.peak_bytes),
                "predicted_cache_bytes": int(m.kv_cache_bytes),
                "predicted_peak_phase": str(m.peak_phase)}, ""
    except Exception as exc:  # noqa: BLE001 - a failed prediction never costs the measurement
        return empty, f"no prediction: {mc.short_error(exc, 200)}"


def rel_error(predicted: int | None, measured: int | None) -> float | None:
    """(predicted - measured) / measured, or None when either is missing."""
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


# --------------------------------------------------------------------------------------------
# The procedure.
# --------------------------------------------------------------------------------------------

#: The model the worker keeps between configurations (``keep_model=True``): its build key,
#: the model, and memory_allocated() right after it was built (the leftover rule's baseline).
_HELD: dict[str, Any] = {}


def release_model() -> None:
    """Drop the kept model (if any) and return its memory to the device."""
    if not _HELD:
        return
    _HELD.clear()
    gc.collect()
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def held_baseline() -> int:
    """memory_allocated() right after the kept model was built (0 when none is kept)."""
    return int(_HELD.get("baseline", 0))


def storage_bytes(tensors: Iterable[Any], seen: set | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a storage counted once, by device and
    data pointer; ``torch.Tensor.untyped_storage().nbytes()``)."""
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        st = t.untyped_storage()
        key = (str(t.device), st.data_ptr())
        if st.nbytes() and key not in seen:
            seen.add(key)
            total += int(st.nbytes())
    return total


def cache_tensors(cache: Any) -> list[Any]:
    """Every tensor a transformers cache object holds: its layers' ``keys``/``values`` and any
    other tensor attribute (hybrid conv/recurrent states, sliding layers' counters), walked
    through lists, tuples, dicts and the cache's own objects (transformers.cache_utils)."""
    import torch

    found: list[Any] = []
    visited: set[int] = set()

    def walk(obj: Any, depth: int) -> None:
        if depth > 6 or id(obj) in visited:
            return
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
        elif isinstance(obj, (list, tuple, set)):
            for x in obj:
                walk(x, depth + 1)
        elif isinstance(obj, dict):
            for x in obj.values():
                walk(x, depth + 1)
        elif type(obj).__module__.startswith("transformers") and hasattr(obj, "__dict__") \
                and not isinstance(obj, torch.nn.Module) and "Config" not in type(obj).__name__:
            for x in vars(obj).values():
                walk(x, depth + 1)

    walk(cache, 0)
    return found


def cache_storage_bytes(cache: Any) -> int:
    """Bytes of the storages a generate() cache holds (``cache_tensors``, each storage once)."""
    return storage_bytes(cache_tensors(cache))


def _output_cache(out: Any) -> Any:
    """The cache of a generate() output: ``cache`` (GenerateDecoderOnlyOutput in recent
    releases; asked first, since reading the old name there warns) or ``past_key_values``
    (transformers 5.17)."""
    for name in ("cache", "past_key_values"):
        value = getattr(out, name, None)
        if value is not None:
            return value
    return None


def _has_prefill_chunking() -> bool:
    """Whether the installed transformers' GenerationConfig takes ``prefill_chunk_size``."""
    from transformers import GenerationConfig

    return hasattr(GenerationConfig(), "prefill_chunk_size")


def _experts_note(model: Any, experts: int | None) -> str:
    """How transformers runs an MoE model's experts (PreTrainedModel.
    get_correct_experts_implementation: grouped_mm where it can dispatch, else eager)."""
    impl = getattr(model.config, "_experts_implementation", None)
    return f"experts_implementation={impl}" if impl and experts else ""


def measure_infer(cfg: InferConfig, *, device: Any = None, keep_model: bool = False) -> InferResult:
    """Measure cfg in this process (module docstring). Never raises for OOM or a refusal.

    ``keep_model``: keep the built model for the next configuration with the same
    ``build_key`` (the worker does); otherwise it is released at the end.
    """
    t0 = time.perf_counter()
    try:
        res = _measure(cfg, device, keep_model)
    finally:
        if not keep_model:
            release_model()
    return replace(res, wall_s=round(time.perf_counter() - t0, 3), timestamp=mc.now_utc())


def _measure(cfg: InferConfig, device: Any, keep_model: bool) -> InferResult:
    base = {"model": cfg.model, "layers": cfg.layers, "batch": cfg.batch,
            "prompt_len": cfg.prompt_len, "new_tokens": cfg.new_tokens,
            "attention": cfg.attention, "cache": cfg.cache, "prefill_chunk": cfg.prefill_chunk}
    bad = check_config(cfg)
    if bad:
        return InferResult(**base, status="error", message=bad)
    import torch

    from kernels.measure.harness import default_device, is_oom

    device = device or default_device()
    env = mc.environment(device)
    config_dict = infer_models.hf_config(cfg.model, cfg.layers)
    hf = infer_models.build_config(config_dict)
    predicted, pred_msg = predict(cfg, config_dict)
    row = {**base, **shape_fields(hf), **env, **predicted}
    notes = [pred_msg] if pred_msg else []

    def result(status: str, message: str = "", **values: Any) -> InferResult:
        msg = "; ".join(m for m in [message, *notes] if m)
        return InferResult(**row, status=status, message=msg, **values)

    if cfg.attention == "triton":
        why = mc.kernels_hf_check(hf, cfg.prompt_len)
        if why:
            return result("unavailable", "our kernel cannot run this model: " + "; ".join(why))
    if cfg.prefill_chunk is not None and not _has_prefill_chunking():
        import transformers

        return result("unavailable", f"transformers {transformers.__version__}'s "
                      "GenerationConfig has no prefill_chunk_size (chunked prefill)")
    attn_ctx, why_not = mc.attention_context(cfg.attention)
    if attn_ctx is None:
        return result("unavailable", why_not)
    on_gpu = device.name == "cuda"
    dev = "cuda" if on_gpu else "cpu"
    dtype = torch.bfloat16 if on_gpu else torch.float32  # the CPU tests: fp32
    vocab = int(hf.vocab_size)
    # Only ``state`` holds this configuration's tensors (no local names), so that clearing it
    # frees them, also after an OOM; the model lives in _HELD.
    state: dict[str, Any] = {}
    info: dict[str, Any] = {}

    def cleanup() -> None:
        state.clear()
        gc.collect()
        device.empty_cache()

    try:
        model = _model_for(cfg, hf, dev, dtype, device)
        info["params"] = _HELD["params"]
        info["weights_bytes"] = _HELD["weights_bytes"]
        note = _experts_note(model, row["experts"])
        if note:
            notes.append(note)
        del model  # _HELD keeps it; no other name may

        def generate(ids: Any, new: int, chunk: int | None, as_dict: bool) -> Any:
            m = _HELD["model"]
            m.__dict__.pop("_previous_max_cache_length", None)  # _prepare_static_cache
            kwargs: dict[str, Any] = dict(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                min_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0,
                output_scores=False, output_logits=False, return_dict_in_generate=as_dict,
                disable_compile=True)
            if cfg.cache == "static":
                kwargs["cache_implementation"] = "static"
            if chunk is not None:
                kwargs["prefill_chunk_size"] = chunk
            with attn_ctx():
                return m.generate(**kwargs)

        # Step 3: warm-up on a short prompt, same attention, cache and chunking. Our kernel
        # warms up on the whole prompt: Triton's autotuner benchmarks each new shape on its
        # first call, with buffers of its own (measured: +194 MB at 1,000 tokens on Llama 3.2
        # 1B), which a steady-state figure should not hold.
        warm_len = cfg.prompt_len if cfg.attention == "triton" else min(WARMUP_PROMPT,
                                                                         cfg.prompt_len)
        warm_chunk = None if cfg.prefill_chunk is None else min(cfg.prefill_chunk, WARMUP_CHUNK)
        state["warm"] = torch.randint(0, vocab, (cfg.batch, warm_len), device=dev)
        state["out"] = generate(state["warm"], WARMUP_NEW, warm_chunk, False)
        device.sync()
        state.clear()
        state["ids"] = torch.randint(0, vocab, (cfg.batch, cfg.prompt_len), device=dev)
        gc.collect()
        device.empty_cache()
        device.sync()
        info["before_bytes"] = device.allocated()
        # Step 4: the prefill run (one new token).
        device.reset_peak()
        prefill_ms = device.elapsed(
            lambda: state.__setitem__("out", generate(state["ids"], 1, cfg.prefill_chunk, False)))
        info["prefill_peak_bytes"] = device.max_allocated()
        info["prefill_ms"] = round(prefill_ms, 3)
        del state["out"]
        gc.collect()
        device.empty_cache()
        device.sync()
        # Step 5: the full run (N new tokens), output and cache kept for after_bytes.
        device.reset_peak()
        full_ms = device.elapsed(
            lambda: state.__setitem__("out", generate(state["ids"], cfg.new_tokens,
                                                      cfg.prefill_chunk, True)))
        info["peak_bytes"] = device.max_allocated()
        info["reserved_bytes"] = device.max_reserved()
        info["after_bytes"] = device.allocated()
        seq = state["out"].sequences
        got = tuple(seq.shape)
        cache = _output_cache(state["out"])
        info["cache_bytes"] = cache_storage_bytes(cache) if cache is not None else None
        del cache, seq
        if cfg.new_tokens > 1:
            info["decode_ms_per_token"] = round((full_ms - prefill_ms) / (cfg.new_tokens - 1), 4)
    except Exception as exc:  # noqa: BLE001 - OOM and refusals are results; the rest 'error'
        status = ("oom" if is_oom(exc) else
                  "unavailable" if mc.unavailable_error(exc) else "error")
        message = mc.short_error(exc)
        del exc
        cleanup()
        if status == "error":  # a broken model is not kept for the next configuration
            release_model()
        return result(status, message, params=info.get("params"),
                      weights_bytes=info.get("weights_bytes"))
    cleanup()
    if not keep_model:
        release_model()
    want = (cfg.batch, cfg.prompt_len + cfg.new_tokens)
    if got != want:
        return result("error", f"generate returned ids of shape {got}, expected {want}",
                      params=info.get("params"), weights_bytes=info.get("weights_bytes"))
    if not on_gpu:  # no allocator counters on the CPU
        for k in ("before_bytes", "prefill_peak_bytes", "peak_bytes", "reserved_bytes",
                  "after_bytes"):
            info[k] = None
    return result("ok", peak_rel_error=rel_error(row["predicted_peak_bytes"],
                                                 info.get("peak_bytes")),
                  prefill_rel_error=rel_error(row["predicted_prefill_peak_bytes"],
                                              info.get("prefill_peak_bytes")), **info)


def _model_for(cfg: InferConfig, hf: Any, dev: str, dtype: Any, device: Any) -> Any:
    """The model for cfg: the kept one when its build key matches, else a fresh build (step 1;
    the previous model is released first, so two never share the device)."""
    import torch

    key = (*cfg.build_key(), dev, str(dtype))
    if _HELD.get("key") == key:
        return _HELD["model"]
    release_model()
    impl = "sdpa" if cfg.attention == "sdpa" else mc.attn_implementation(cfg.attention)
    with torch.device(dev):
        model = mc.model_from_config(hf, dtype, impl)
    if next(model.parameters()).device.type != dev:
        model.to(dev)
    model.eval()
    tensors = [*model.parameters(), *model.buffers()]
    _HELD.update(key=key, model=model,
                 params=sum(p.numel() for p in model.parameters()),
                 weights_bytes=storage_bytes(tensors))
    del tensors
    gc.collect()
    device.sync()
    _HELD["baseline"] = device.allocated()
    return model


# --------------------------------------------------------------------------------------------
# The child process and the runner.
# --------------------------------------------------------------------------------------------


def _row_for(cfg: InferConfig, status: str, message: str) -> InferResult:
    return InferResult(model=cfg.model, layers=cfg.layers, batch=cfg.batch,
                       prompt_len=cfg.prompt_len, new_tokens=cfg.new_tokens,
                       attention=cfg.attention, cache=cfg.cache, prefill_chunk=cfg.prefill_chunk,
                       status=status, message=message, timestamp=mc.now_utc())


def worker_main(stdin: IO[str], proto: IO[str]) -> None:
    """Serve {"cfg": {...}} lines until EOF or {"cmd": "exit"}; answer {"result": row,
    "restart": bool}. The built model is kept for the next configuration of the same build
    key; memory held beyond it after cleanup (> LEFTOVER_RESTART_BYTES) ends this worker."""
    rc.serve_configs(stdin, proto, parse=InferConfig.from_dict,
                     measure=lambda cfg: measure_infer(cfg, keep_model=True),
                     error_row=lambda cfg, message: _row_for(cfg, "error", message),
                     name="infer", held="allocated beyond the kept model",
                     baseline=held_baseline, on_error=release_model)


class _InferChild(rc.ConfigChild):
    """One ``python -m kernels.measure.infer_harness --worker`` process."""

    def __init__(self, env: dict[str, str] | None) -> None:
        super().__init__(["kernels.measure.infer_harness", "--worker"], env)


#: A run's rows, its time and the child processes it started (run_common.RunSummary).
InferRunSummary = rc.RunSummary


def run_infer(configs: Sequence[InferConfig], *,
              on_result: Callable[[InferResult, int, int], None] | None = None,
              timeout_s: float = 300.0, startup_s: float = 90.0,
              budget_s: float | None = None, skip_longer_after_oom: bool = True,
              gpu_index: int = 0, lock_wait_s: float = 0.0,
              lock_dir: str | os.PathLike[str] | None = None,
              env: dict[str, str] | None = None) -> InferRunSummary:
    """Measure ``configs`` one by one in a child process, holding the GPU lock.

    ``budget_s``: configurations not started within that many seconds of the start are
    recorded as ``skipped``. ``timeout_s`` limits each configuration (plus ``startup_s`` for a
    fresh child's first). An OOM skips the longer prompts of the same series.
    """
    return rc.run_configs(configs, new_child=lambda e: _InferChild(e), result=InferResult,
                          row_for=_row_for, length="prompt_len", length_label="prompt ",
                          on_result=on_result, timeout_s=timeout_s, startup_s=startup_s,
                          budget_s=budget_s, skip_longer_after_oom=skip_longer_after_oom,
                          gpu_index=gpu_index, lock_wait_s=lock_wait_s, lock_dir=lock_dir,
                          env=env)


# --------------------------------------------------------------------------------------------
# Results that last: typed CSV rows, and the SQLite store (the attention points' file).
# --------------------------------------------------------------------------------------------

_INT = ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab",
        "sliding_window", "experts", "batch", "prompt_len", "new_tokens", "prefill_chunk",
        "params", "weights_bytes", "before_bytes", "prefill_peak_bytes", "peak_bytes",
        "reserved_bytes", "after_bytes", "cache_bytes", "predicted_peak_bytes",
        "predicted_prefill_peak_bytes", "predicted_cache_bytes")
_FLOAT = ("prefill_ms", "decode_ms_per_token", "peak_rel_error", "prefill_rel_error", "wall_s")
_BOOL = ("tied",)


def typed_row(raw: dict[str, Any]) -> dict[str, Any]:
    """A CSV or database row with its numbers and booleans parsed (empty cells: None)."""
    return rc.typed_row(raw, INFER_COLUMNS, _INT, _FLOAT, _BOOL)


def write_rows(fh: IO[str], rows: Iterable[dict[str, Any]], *, header: bool = True) -> None:
    """CSV rows in INFER_COLUMNS order, formula-like text neutralised (store.neutralise)."""
    w = rc.csv_writer(fh)
    if header:
        w.writerow(INFER_COLUMNS)
    for r in rows:
        rc.write_cells(w, r, INFER_COLUMNS)


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of an inference CSV (INFER_COLUMNS), typed. A file without the key columns raises
    ValueError naming the missing ones."""
    return rc.read_typed_csv(path, ("model", "prompt_len", "new_tokens", "attention", "cache",
                                    "status", "peak_bytes"), "an inference CSV", typed_row)


class InferStore(rc.RowStore):
    """Inference runs in the attention points' SQLite file (kernels.measure.store's
    default_db_path), in tables of their own: ``infer_runs`` and ``infer_rows``."""

    prefix, columns, ints, floats, bools = "infer", INFER_COLUMNS, _INT, _FLOAT, _BOOL

    def typed(self, raw: dict[str, Any]) -> dict[str, Any]:
        return typed_row(raw)


# --------------------------------------------------------------------------------------------
# Plans: the cross product of the command line, and the bundled H200 reference sweep.
# --------------------------------------------------------------------------------------------


def expand(models: Iterable[str], prompt_lens: Iterable[int], attentions: Iterable[str], *,
           caches: Iterable[str] = ("dynamic",), prefill_chunks: Iterable[int | None] = (None,),
           batch: int = 1, new_tokens: int = 8, layers: int | None = None) -> list[InferConfig]:
    """The cross product, grouped by model and attention (one build each) and each series
    short to long (so an OOM skips the longer prompts)."""
    lens = sorted(set(int(s) for s in prompt_lens))
    return [InferConfig(m, s, a, batch, new_tokens, c, p, layers)
            for m in models for a in attentions for c in caches for p in prefill_chunks
            for s in lens]


#: The reference sweep, one block a line, most important first (a --budget cuts from the
#: bottom): (model, attentions, prompt lengths, batch, new tokens, cache, prefill chunk).
#: Trim it by deleting lines. Rows of one model and attn_implementation are kept together so
#: that each is built once (the SDPA backends share a build).
_SDPA3 = ("sdpa_flash", "sdpa_efficient")
REFERENCE_BLOCKS: tuple[tuple[str, tuple[str, ...], tuple[int, ...], int, int, str, int | None],
                        ...] = (
    # Llama 3.1 8B, full depth: GQA, 128k vocab; the core grid.
    ("llama3.1-8b", _SDPA3, (1000, 4096, 16384, 32000, 65536), 1, 8, "dynamic", None),
    ("llama3.1-8b", ("sdpa_flash",), (3000, 12000, 100000, 120000), 1, 8, "dynamic", None),
    ("llama3.1-8b", ("sdpa_flash",), (16384,), 1, 64, "dynamic", None),  # decode growth
    ("llama3.1-8b", ("sdpa_flash",), (16384,), 1, 1, "dynamic", None),  # prefill only
    ("llama3.1-8b", _SDPA3, (8192,), 4, 8, "dynamic", None),
    ("llama3.1-8b", _SDPA3, (2048,), 8, 8, "dynamic", None),
    ("llama3.1-8b", ("sdpa_efficient",), (4096, 16384), 1, 8, "static", None),
    ("llama3.1-8b", ("sdpa_flash",), (4096,), 1, 8, "static", None),  # flash: mask refused?
    ("llama3.1-8b", ("sdpa_efficient",), (8192, 32000), 1, 8, "dynamic", 2048),
    ("llama3.1-8b", ("sdpa_efficient",), (32000,), 1, 8, "static", 2048),
    ("llama3.1-8b", ("triton",), (1000, 4096, 16384, 32000, 65536), 1, 8, "dynamic", None),
    ("llama3.1-8b", ("triton",), (8192,), 4, 8, "dynamic", None),
    ("llama3.1-8b", ("triton",), (2048,), 8, 8, "dynamic", None),
    ("llama3.1-8b", ("triton",), (4096,), 1, 8, "static", None),  # refused: a mask
    ("llama3.1-8b", ("triton",), (8192,), 1, 8, "dynamic", 2048),  # refused: s_q != s_k
    ("llama3.1-8b", ("eager",), (1000, 4096, 16384, 32000), 1, 8, "dynamic", None),
    ("llama3.1-8b", ("eager",), (8192,), 4, 8, "dynamic", None),
    ("llama3.1-8b", ("eager",), (2048,), 8, 8, "dynamic", None),
    ("llama3.1-8b", ("eager",), (4096, 16384), 1, 8, "static", None),
    ("llama3.1-8b", ("eager",), (8192, 32000), 1, 8, "dynamic", 2048),
    # Qwen2.5 7B, full depth: 152k vocabulary, q/k/v bias.
    ("qwen2.5-7b", ("sdpa_flash",), (1000, 8192, 32000), 1, 8, "dynamic", None),
    ("qwen2.5-7b", ("triton",), (1000, 8192, 32000), 1, 8, "dynamic", None),
    ("qwen2.5-7b", ("eager",), (1000, 8192), 1, 8, "dynamic", None),
    # Mistral 7B, full depth: sliding window 4,096 (12,000 is past it).
    ("mistral-7b", _SDPA3, (3000, 12000), 1, 8, "dynamic", None),
    ("mistral-7b", ("sdpa_efficient",), (12000,), 1, 8, "static", None),
    ("mistral-7b", ("sdpa_efficient",), (12000,), 1, 8, "dynamic", 2048),
    ("mistral-7b", ("triton",), (3000, 12000), 1, 8, "dynamic", None),
    ("mistral-7b", ("eager",), (3000, 12000), 1, 8, "dynamic", None),
    # Gemma 3 27B, 12 layers: 10 local (window 1,024) + 2 global, 262k vocabulary, tied.
    ("gemma3-27b-12l", _SDPA3, (1000, 4096, 16384), 1, 8, "dynamic", None),
    ("gemma3-27b-12l", ("sdpa_efficient",), (4096,), 1, 8, "static", None),
    ("gemma3-27b-12l", ("sdpa_efficient",), (16384,), 1, 8, "dynamic", 2048),
    ("gemma3-27b-12l", ("triton",), (1000, 4096, 16384), 1, 8, "dynamic", None),
    ("gemma3-27b-12l", ("eager",), (1000, 4096), 1, 8, "dynamic", None),
    # Qwen3-30B-A3B, 8 layers: MoE (128 experts, 8 active).
    ("qwen3-30b-a3b-8l", ("sdpa_flash",), (1000, 8192, 32000), 1, 8, "dynamic", None),
    ("qwen3-30b-a3b-8l", ("sdpa_flash",), (4096,), 4, 8, "dynamic", None),
    ("qwen3-30b-a3b-8l", ("triton",), (1000, 8192, 32000), 1, 8, "dynamic", None),
    ("qwen3-30b-a3b-8l", ("eager",), (1000, 8192), 1, 8, "dynamic", None),
    # DeepSeek-V2-Lite, full depth: MLA (q/k head 192, v head 128), MoE.
    ("deepseek-v2-lite", ("sdpa_efficient", "sdpa_flash"), (1000, 8192, 32000), 1, 8,
     "dynamic", None),
    ("deepseek-v2-lite", ("sdpa_efficient",), (8192,), 1, 8, "static", None),
    ("deepseek-v2-lite", ("sdpa_efficient",), (32000,), 1, 8, "dynamic", 2048),
    ("deepseek-v2-lite", ("triton",), (1000,), 1, 8, "dynamic", None),  # v head 128 != 192
    ("deepseek-v2-lite", ("eager",), (1000, 8192), 1, 8, "dynamic", None),
    # Llama 3.2 1B, full depth: tied embeddings, d = 64.
    ("llama3.2-1b", ("sdpa_flash",), (1000, 16384, 65536), 1, 8, "dynamic", None),
    ("llama3.2-1b", ("sdpa_flash",), (4096,), 8, 8, "dynamic", None),
    ("llama3.2-1b", ("triton",), (1000, 16384, 65536), 1, 8, "dynamic", None),
    ("llama3.2-1b", ("eager",), (1000, 16384), 1, 8, "dynamic", None),
)


#: Added after the first H200 run (session of 2026-12-01): torch's own SDPA choice where a
#: forced backend found no kernel (every mask: static caches, prefill chunks after the first,
#: windows shorter than the prompt; the memory-efficient backend under enable_gqa), the
#: decode-dominated shapes, and our kernel's first row again with its full-shape warm-up.
SDPA_BLOCKS: tuple[tuple[str, tuple[str, ...], tuple[int, ...], int, int, str, int | None],
                   ...] = (
    ("llama3.1-8b", ("sdpa",), (4096, 16384), 1, 8, "static", None),
    ("llama3.1-8b", ("sdpa",), (8192, 32000), 1, 8, "dynamic", 2048),
    ("llama3.1-8b", ("sdpa",), (32000,), 1, 8, "static", 2048),
    ("llama3.1-8b", ("sdpa",), (5000,), 2, 32, "dynamic", None),
    ("mistral-7b", ("sdpa",), (12000,), 1, 8, "dynamic", None),
    ("mistral-7b", ("sdpa",), (12000,), 1, 8, "static", None),
    ("mistral-7b", ("sdpa",), (12000,), 1, 8, "dynamic", 2048),
    ("gemma3-27b-12l", ("sdpa",), (4096, 16384), 1, 8, "dynamic", None),
    ("gemma3-27b-12l", ("sdpa",), (3000,), 2, 8, "dynamic", None),
    ("gemma3-27b-12l", ("sdpa",), (4096,), 1, 8, "static", None),
    ("gemma3-27b-12l", ("sdpa",), (16384,), 1, 8, "dynamic", 2048),
    ("qwen3-30b-a3b-8l", ("sdpa",), (6000,), 2, 16, "dynamic", None),
    ("deepseek-v2-lite", ("sdpa",), (8192,), 1, 8, "dynamic", None),
    ("qwen2.5-7b", ("sdpa",), (7777,), 3, 8, "dynamic", None),
    ("llama3.2-1b", ("triton",), (1000,), 1, 8, "dynamic", None),
    ("llama3.2-1b", ("sdpa", "eager"), (128,), 64, 512, "dynamic", None),
    ("llama3.2-1b", ("sdpa",), (128,), 64, 512, "static", None),
)


def sdpa_plan() -> list[InferConfig]:
    """``SDPA_BLOCKS`` alone (about 3 minutes of an H200)."""
    plan: list[InferConfig] = []
    for model, attentions, lens, batch, new, cache, chunk in SDPA_BLOCKS:
        plan += expand([model], lens, attentions, caches=[cache], prefill_chunks=[chunk],
                       batch=batch, new_tokens=new)
    return plan


def reference_plan() -> list[InferConfig]:
    """The H200 reference sweep (issue 29, item 5): ``REFERENCE_BLOCKS`` in order, each block's
    prompts short to long; about 7 minutes of an H200 (estimated: two prefills per row at about
    the model's 2 x params x tokens FLOPs plus attention, 21 model builds of a few seconds,
    the first triton rows' compilation). Expected refusals, recorded as unavailable rows at
    the cost of a warm-up: SDPA's flash backend wherever transformers materialises a mask (a
    static cache, a later prefill chunk, a sliding window shorter than the prompt) or the
    value head differs from the query head (MLA), and our kernel with any materialised mask or
    fewer queries than keys (static cache, chunked prefill)."""
    plan: list[InferConfig] = []
    for model, attentions, lens, batch, new, cache, chunk in REFERENCE_BLOCKS:
        plan += expand([model], lens, attentions, caches=[cache], prefill_chunks=[chunk],
                       batch=batch, new_tokens=new)
    # SDPA_BLOCKS' rows join their model's build (each model built once per attention, in the
    # order of first appearance); a row in both lists runs once.
    rows = {c.label(): c for c in plan + sdpa_plan()}
    order = {k: i for i, k in reversed(list(enumerate(c.build_key() for c in rows.values())))}
    return sorted(rows.values(), key=lambda c: order[c.build_key()])


PLANS: dict[str, Callable[[], list[InferConfig]]] = {"h200": reference_plan,
                                                      "h200-sdpa": sdpa_plan}


# --------------------------------------------------------------------------------------------
# Command line: python -m kernels.measure --infer ...
# --------------------------------------------------------------------------------------------


def _chunks(values: Sequence[str]) -> list[int | None]:
    words = mc.words(values)
    out: list[int | None] = []
    for w in words:
        if w.lower() == "none":
            out.append(None)
            continue
        try:
            v = int(w)
        except ValueError:
            v = 0
        if v < 1:
            raise SystemExit(f"error: --prefill-chunk takes 'none' or whole numbers >= 1, got "
                             f"{w!r}")
        out.append(v)
    if not out:
        raise SystemExit("error: --prefill-chunk needs a value ('none' or whole numbers >= 1)")
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m kernels.measure --infer",
        description="Measure generate() of real transformers models (random init, no "
                    "download): weights, prefill peak, peak, reserved, KV cache, prefill and "
                    "decode time. Lists take spaces or commas.")
    ap.add_argument("--model", nargs="+", default=["llama3.2-1b"],
                    help=f"model names ({', '.join(infer_models.NAMES)})")
    ap.add_argument("--layers", type=int, default=None, help="override the models' layer count")
    ap.add_argument("--prompt-len", nargs="+", default=["1000", "4096"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=8, help="tokens generated (>= 1)")
    ap.add_argument("--attention", nargs="+", default=["sdpa_flash", "triton"],
                    help=f"attentions ({', '.join(ATTENTIONS)})")
    ap.add_argument("--cache", nargs="+", default=["dynamic"], help="dynamic, static (or both)")
    ap.add_argument("--prefill-chunk", nargs="+", default=["none"],
                    help="prompt tokens per prefill forward: 'none' (whole prompt) or numbers")
    ap.add_argument("--plan", choices=sorted(PLANS), default=None,
                    help="a bundled sweep instead of the cross product (h200: the reference)")
    rc.add_run_options(ap, timeout=300.0, out="inference.csv", prefix="infer",
                       repredict_help="measure nothing: recompute the predicted_* columns and "
                                      "errors of CSV's rows from the current calc and write "
                                      "--out")
    return ap


def configs_from_args(args: argparse.Namespace) -> list[InferConfig]:
    if args.plan:
        return PLANS[args.plan]()
    for name, value in (("--batch", args.batch), ("--new-tokens", args.new_tokens)):
        if value < 1:
            raise SystemExit(f"error: {name} must be a whole number >= 1, got {value}")
    if args.layers is not None and args.layers < 1:
        raise SystemExit(f"error: --layers must be a whole number >= 1, got {args.layers}")
    models = mc.choices(args.model, infer_models.NAMES, "model(s)")
    attentions = mc.choices(args.attention, ATTENTIONS, "attention(s)")
    cache_words = mc.choices(args.cache, (*CACHES, "both"), "cache kind(s)")
    caches = [c for c in CACHES if c in cache_words or "both" in cache_words]
    lens = mc.ints(args.prompt_len, "--prompt-len", 1)
    return expand(models, lens, attentions, caches=caches,
                  prefill_chunks=_chunks(args.prefill_chunk), batch=args.batch,
                  new_tokens=args.new_tokens, layers=args.layers)


def repredict(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> int:
    """Rewrite an inference CSV's predictions from the current calc; returns the rows."""
    rows = read_rows(src)
    for r in rows:
        if r["model"] not in infer_models.MODELS:
            continue
        cfg = InferConfig(r["model"], r["prompt_len"], r["attention"], r["batch"] or 1,
                          r["new_tokens"] or 1, r["cache"] or "dynamic", r["prefill_chunk"])
        predicted, _ = predict(cfg, infer_models.hf_config(cfg.model, r["layers"]))
        r.update(predicted)
        r["peak_rel_error"] = rel_error(r["predicted_peak_bytes"], r["peak_bytes"])
        r["prefill_rel_error"] = rel_error(r["predicted_prefill_peak_bytes"],
                                           r["prefill_peak_bytes"])
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "w", newline="") as fh:
        write_rows(fh, rows)
    return len(rows)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repredict is not None:
        try:
            n = repredict(args.repredict, args.out)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{n} inference rows re-predicted from calc into {args.out}")
        return 0
    return rc.measure_to_csv(args, configs_from_args(args), run=run_infer,
                             columns=INFER_COLUMNS, store=InferStore, describe=_describe)


def _describe(res: InferResult) -> str:
    """A progress line (after its count and time)."""
    peak = f"peak {res.peak_bytes / 2**30:.2f} GiB" if res.peak_bytes else ""
    err = f"err {100 * res.peak_rel_error:+.1f}%" if res.peak_rel_error is not None else ""
    return (f"{res.model} {res.attention} {res.cache} B={res.batch} prompt={res.prompt_len}"
            f"{f' chunk={res.prefill_chunk}' if res.prefill_chunk else ''}: "
            f"{res.status} {peak} {err} {rc.status_note(res)}")

if __name__ == "__main__":
    if "--worker" in sys.argv[1:]:
        mc.serve(worker_main)
    else:
        sys.exit(main())
