"""One inference configuration measured in this process (``measure_infer``):
``model.generate()`` of a real transformers model, its weights, the prompt's prefill peak, the
whole generation's peak, the KV cache, prefill and decode time.

The procedure (``measure_infer``; ``attnmem.calc.inference_step`` predicts exactly this):

1. Build ``AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16,
   attn_implementation=...)`` under ``torch.device("cuda")`` (fp32 on the CPU, for the tests),
   random init, no download (``attnmem.measure.infer_models``), ``model.eval()``. Attention names
   are the training harness's ``ATTENTIONS``: ``eager``, ``sdpa_flash`` / ``sdpa_cudnn`` /
   ``sdpa_efficient`` / ``sdpa_math`` (attn_implementation="sdpa", the whole ``generate()``
   call inside ``torch.nn.attention.sdpa_kernel(<that backend>)``), ``triton`` (ours, through
   ``attnmem.kernels.hf.register()``), ``fa4`` (attn_implementation="flash_attention_4" where
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
   with the reason. Statuses: ``attnmem.measure.harness.STATUSES``.
7. Prediction: ``attnmem.calc.inference_step(ModelConfig.from_hf_config(config), batch, prompt_len,
   new_tokens, attention=..., weight_dtype="bf16", kv_dtype="bf16", cache=...,
   prefill_chunk=...)`` (attnmem.measure.infer.predict); when calc lacks it or refuses the
   case the predicted columns are empty and the message says why.

On a CPU (no CUDA) the procedure runs end to end (the tests) and the byte columns that come
from CUDA's allocator are empty.

The row: ``attnmem.measure.infer.config``. No torch or transformers at import time.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from attnmem.measure import infer_models
from attnmem.measure.infer.config import InferConfig, InferResult, check_config, shape_fields
from attnmem.measure.infer.predict import predict, rel_error
from attnmem.measure.model_common import (
    attention_context,
    attn_implementation,
    environment,
    kernels_hf_check,
    model_from_config,
    now_utc,
    short_error,
    unavailable_error,
)

#: The warm-up's prompt and new tokens (step 3), and its largest prefill chunk.
WARMUP_PROMPT, WARMUP_NEW, WARMUP_CHUNK = 32, 2, 16


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
    return replace(res, wall_s=round(time.perf_counter() - t0, 3), timestamp=now_utc())


def _measure(cfg: InferConfig, device: Any, keep_model: bool) -> InferResult:
    base = cfg.row_identity()
    bad = check_config(cfg)
    if bad:
        return InferResult(**base, status="error", message=bad)
    import torch

    from attnmem.measure.harness import default_device, is_oom

    device = device or default_device()
    env = environment(device)
    config_dict = infer_models.hf_config(cfg.model, cfg.layers)
    hf = infer_models.build_config(config_dict)
    predicted, pred_msg = predict(cfg, config_dict)
    row = {**base, **shape_fields(hf), **env, **predicted}
    notes = [pred_msg] if pred_msg else []

    def result(status: str, message: str = "", **values: Any) -> InferResult:
        msg = "; ".join(m for m in [message, *notes] if m)
        return InferResult(**row, status=status, message=msg, **values)

    if cfg.attention == "triton":
        why = kernels_hf_check(hf, cfg.prompt_len)
        if why:
            return result("unavailable", "our kernel cannot run this model: " + "; ".join(why))
    if cfg.prefill_chunk is not None and not _has_prefill_chunking():
        import transformers

        return result("unavailable", f"transformers {transformers.__version__}'s "
                      "GenerationConfig has no prefill_chunk_size (chunked prefill)")
    attn_ctx, why_not = attention_context(cfg.attention)
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
                  "unavailable" if unavailable_error(exc) else "error")
        message = short_error(exc)
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
    impl = "sdpa" if cfg.attention == "sdpa" else attn_implementation(cfg.attention)
    with torch.device(dev):
        model = model_from_config(hf, dtype, impl)
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
