"""generate()'s peak for any causal LM transformers builds, traced on the meta device.

What is predicted is what the inference measurement records (attnmem/measure/infer/
procedure.py, the same as attnmem.calc.inference_step): `max_memory_allocated()` over
`generate(input_ids, attention_mask, max_new_tokens=N, min_new_tokens=N, do_sample=False)` of
the model in bf16 (or fp16/fp32) after a warm-up: the weights and buffers, cuBLAS's workspace,
the inputs, the cache and the transients of the highest moment.

How: the model's own code runs on the meta device (`AutoModelForCausalLM.from_config` under
`torch.device("meta")`: shapes, dtypes and storage sizes, no memory), under
attnmem.trace.recorder.Recorder, which lists every storage made and freed in program order.
The events go through attnmem.calc.allocator (the CUDA caching allocator's blocks), so every
tensor counts as the block it would get. The parts a CPU or meta run does not show are the
rules calc already has:

- fused SDPA backends: attnmem.trace.fake_attention stands in for the call (transformers' own
  `sdpa_attention_forward` still decides repeat_kv, enable_gqa and the mask);
- cuBLAS's workspace (attnmem.calc.inference_step.CUBLAS_WORKSPACE_BYTES), made by the
  warm-up's first matmul and held;
- MoE experts as CUDA runs them (generation/utils.py `_optimize_model_for_decode`):
  `grouped_mm` for the prefill, `batched_mm` for decode, where the model lets the experts'
  implementation be set.

generate() itself is driven by hand, as its loop does (generation/utils.py `_sample`): it stops
at data-dependent checks on meta tensors. Each forward gets `input_ids`, `position_ids` (B, c)
int64 and `logits_to_keep=1`, the cache the first forward makes, and generate's own tensors
are made as it makes them: the int64 attention mask (B, tokens), the fp32 copy of the last
logits, the argmax, the ids grown by `torch.cat` each step. No mask tensor is passed to the
model: an all-ones mask is what a tokenizer gives for unpadded text, and masking_utils treats
it as no mask (`_ignore_causal_mask_sdpa`), so the model's masks are the same.

Token values: the prompt is PROMPT_TOKEN at every position (the harness's are random ids).
Which token generate() picks next is the argmax of logits meta does not hold; the trace takes
it to be PROMPT_TOKEN too (`Uniform.choose`), the one value it chooses for generate(). Only a
forward that reads token values sees the choice: XLM counts the tokens that are not padding
(`lengths`) for an assertion that holds for any tokens; no shape depends on it.

Phases: "prefill" (the prompt's forward and its logits) and "decode": the last decode step,
whose cache is the longest. For N ≥ 3 the cache before that step is made by an unreported
prefill of s + N − 3 tokens and one unreported decode step, so that sliding-window layers hold
their window, as they do after the first real decode step.
"""

from __future__ import annotations

import inspect
import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from attnmem.calc.backends import NoKernel
from attnmem.calc.inference_step import CUBLAS_WORKSPACE_BYTES
from attnmem.trace.fake_attention import SDPA_BACKENDS, sdpa_as
from attnmem.trace.known import ValuesTooLarge
from attnmem.trace.loops import Limits
from attnmem.trace.masks import unpacked_rows
from attnmem.trace.recorder import PhasePeak, Recorder, ReplayTooLong, replay, replay_cost

#: What the trace runs: transformers' eager attention as it is, or SDPA with a backend.
TRACE_ATTENTIONS = ("eager", *SDPA_BACKENDS)
TRACE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: The token id at every position the trace feeds (module docstring: token values).
PROMPT_TOKEN = 0


@dataclass(frozen=True)
class TracedInference:
    """generate()'s memory traced on the meta device; bytes are absolute unless named."""

    model_class: str
    batch: int
    prompt_len: int
    new_tokens: int
    attention: str
    dtype: str
    weights_bytes: int  # parameters and buffers as the model holds them
    fixed_bytes: int  # cuBLAS workspace
    prefill_peak_bytes: int
    decode_peak_bytes: int | None  # None with one new token
    kv_cache_bytes: int  # every storage the cache holds after the last step
    at_peak: tuple[tuple[str, int, int], ...]  # (where|op, tensors, bytes) at the peak, largest first
    peak_phase: str
    seconds: float
    transformers_version: str

    @property
    def peak_bytes(self) -> int:
        return max(self.prefill_peak_bytes, self.decode_peak_bytes or 0)

    @property
    def activation_bytes(self) -> int:
        """The peak less weights, workspace and cache: inputs and transients."""
        return self.peak_bytes - self.weights_bytes - self.fixed_bytes - self.kv_cache_bytes


def _torch_dtype(dtype: str):
    import torch

    if dtype not in TRACE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: the trace runs {tuple(TRACE_DTYPES)}")
    return getattr(torch, TRACE_DTYPES[dtype])


@lru_cache(maxsize=8)
def _built(text: str, dtype: str, attn: str):
    """The model on meta (cached: building is most of a first answer's time)."""
    import torch
    from transformers import AutoModelForCausalLM

    from attnmem.trace.weights import TooManyModules, _config, module_limit

    cfg = _config(json.loads(text))
    try:
        with torch.device("meta"), module_limit():
            model = AutoModelForCausalLM.from_config(cfg, dtype=_torch_dtype(dtype),
                                                     attn_implementation=attn)
    except TooManyModules as e:
        raise ValueError(f"config.json: {e}") from None
    except Exception as e:
        raise ValueError(f"transformers cannot build a causal LM from this "
                         f"'{cfg.model_type}' config: {' '.join(str(e).split())[:300]}"
                         f"{_nones(cfg, e)}") from None
    if any(t.device.type != "meta" for t in [*model.parameters(), *model.buffers()]):
        # made by legacy constructors that ignore the device context (XLNet's
        # `nn.Parameter(torch.FloatTensor(...))` lands on the CPU); `.to(device)` moves them
        # with the rest on a GPU, so they are moved here
        model.to("meta")
    languages = getattr(model.config, "languages", None)
    if (hasattr(model, "set_default_language") and languages
            and getattr(model.config, "default_language", None) is None):
        # X-MOD refuses input without a language; every language's adapter has the same
        # shapes, so the memory is that of any of them: the first
        model.set_default_language(list(languages)[0])
    return model.eval()


#: How much work a trace may do before it is refused instead of run, as counts (so a refusal
#: depends on the model and its inputs, never on the host's load): tensor ops dispatched on
#: meta (Recorder.ops; a Python loop over the tokens that attnmem.trace.loops cannot fold is
#: refused once its projected ops pass the limit) and steps of the allocator replay
#: (recorder.replay_cost). Calibrated on the project's 2-core host at load 5 (NOTES.md,
#: "Reading any model (issue 42)"): an op ~100 µs, a replay step 2-3 µs at worst, so each
#: limit alone is about 30-40 s of work there; the old 30 s wall-clock limits refused less at
#: load 3.
LIMITS = Limits(ops=400_000, steps=6_000_000)


class CacheRefused(ValueError):
    """transformers cannot make the cache generate() gives the model from its config."""


class TraceTooSlow(ValueError):
    """A trace refused because running it would take more work than LIMITS allow."""


@contextmanager
def loop_guard(rec: Any, model: Any):
    """attnmem.trace.loops.fold_loops for one trace of `model`, its refusal of a loop too slow
    to run turned into a ValueError that says how long a prompt the trace answers."""
    from attnmem.trace.loops import LoopTooSlow, fold_loops

    try:
        with fold_loops(rec, LIMITS, model) as folder:
            yield folder
    except LoopTooSlow as e:
        raise TraceTooSlow(f"{type(model).__name__}: {e}") from None


def _held_bytes(model) -> int:
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        st = t.untyped_storage()
        seen[id(st)] = st.nbytes()
    return sum(seen.values())


def _experts(model, impl: str) -> None:
    """Run MoE experts as `impl` where the model lets it be set (transformers >= 5.2x)."""
    can = getattr(model, "_can_set_experts_implementation", None)
    if can is not None and can() and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(impl)


def _cache_kw(model) -> str:
    """The forward's name for the cache: `cache` (transformers 5.25) or `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _new_cache(model) -> Any:
    """The cache generate() makes before the first forward (`_prepare_cache_for_generation`):
    a DynamicCache of the text config where the model takes one, else None (the model makes
    its own, as Mamba-style models do). ValueError where transformers cannot make it."""
    from transformers import DynamicCache

    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if supports is not None and not supports():
        return None
    cfg = model.config.get_text_config(decoder=True)
    try:
        return DynamicCache(config=cfg)
    except Exception as e:  # generate() makes the same call, so it fails the same way
        raise CacheRefused(f"transformers' generate() cannot make the cache it gives "
                         f"{type(model).__name__} from this config ({type(cfg).__name__}: "
                         f"{type(e).__name__}: {' '.join(str(e).split())[:200]}); it fails "
                         f"the same way on a GPU") from None


def _cache_bytes(*roots: Any) -> int:
    """Bytes of the storages held by the cache objects `roots` (each storage once, keyed by
    its C++ StorageImpl, which outlives the Python wrapper `untyped_storage()` returns). The
    walk goes 6 levels deep: a hybrid's cache keeps its recurrent and convolution states in
    lists inside each layer object (transformers' LinearAttentionLayer), which 3 levels
    missed."""
    import torch

    seen: dict[int, int] = {}
    visited: set[int] = set()

    def walk(x: Any, depth: int) -> None:
        if isinstance(x, torch.Tensor):
            st = x.untyped_storage()
            seen[st._cdata] = st.nbytes()
            return
        if depth >= 6 or id(x) in visited:
            return
        visited.add(id(x))
        if isinstance(x, (list, tuple)):
            for y in x:
                walk(y, depth + 1)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y, depth + 1)
        elif hasattr(x, "__dict__") and not isinstance(x, (type, torch.nn.Module)):
            for y in vars(x).values():
                walk(y, depth + 1)

    for root in roots:
        walk(root, 0)
    return sum(seen.values())


@dataclass(frozen=True)
class Recorded:
    """One traced generate(): the storage events (attnmem.trace.recorder) and what the replay
    needs besides them."""

    events: tuple
    weights_bytes: int
    cache_bytes: int
    model_class: str


def result(rec: Recorded, b: int, s: int, n: int, attention: str, dtype: str,
           seconds: float) -> TracedInference:
    """TracedInference of recorded events: replayed through the caching allocator."""
    import transformers

    try:
        phases = replay(rec.events, limit=LIMITS.steps)
    except ReplayTooLong as e:
        cost = replay_cost(rec.events)
        raise TraceTooSlow(f"{rec.model_class}: {e}; a shorter prompt has fewer (a Python "
                           f"loop over the tokens makes events for every token): about "
                           f"{s * LIMITS.steps // cost:,} tokens at this batch") from None
    base = rec.weights_bytes + CUBLAS_WORKSPACE_BYTES
    pre = phases["prefill"]
    dec: PhasePeak | None = phases.get("decode")
    top = dec if dec is not None and dec.peak > pre.peak else pre
    at_peak = tuple(sorted(((k, c, by) for k, (c, by) in top.at_peak.items()),
                           key=lambda x: -x[2]))
    return TracedInference(
        model_class=rec.model_class, batch=b, prompt_len=s, new_tokens=n,
        attention=attention, dtype=dtype, weights_bytes=rec.weights_bytes,
        fixed_bytes=CUBLAS_WORKSPACE_BYTES, prefill_peak_bytes=base + pre.peak,
        decode_peak_bytes=None if dec is None else base + dec.peak,
        kv_cache_bytes=rec.cache_bytes, at_peak=at_peak, peak_phase=top.name,
        seconds=seconds, transformers_version=transformers.__version__)


class _OwnHooks(Exception):
    """The model keeps generate()'s state under a name of its own: run its own hooks."""


def _overrides_hooks(model: Any) -> bool:
    """Whether the model's class replaces generate()'s input preparation or its carrying of
    the state from one step to the next (GenerationMixin's prepare_inputs_for_generation,
    _update_model_kwargs_for_generation): XLNet's dummy token and mems, XLM's mask token,
    RWKV's `state`."""
    from transformers import GenerationMixin

    return any(getattr(type(model), h, None) is not getattr(GenerationMixin, h, None)
               for h in ("prepare_inputs_for_generation", "_update_model_kwargs_for_generation"))


def _returned_cache(out: Any, model: Any, passed: Any) -> Any:
    """The cache generate() carries to the next step after a forward that was given `passed`
    (generation/utils.py `_update_model_kwargs_for_generation`: the output's `cache`, else
    model_kwargs keeps the one it passed):

    - the output's `cache` (transformers 5.25) or `past_key_values` (5.17);
    - else the cache passed in, which the model filled in place (BERT-style decoders,
      RecurrentGemma, whose recurrent state is held in its layers: `_module_state`);
    - else None, for a forward that takes no cache at all (GPT-1): generate() then feeds the
      whole sequence each step, as the caller does.

    _OwnHooks where the state goes under another name (RWKV's `state`, XLNet's `mems`) or the
    class prepares its own inputs (XLM): those are run through the class's own hooks."""
    if "cache" in out:
        return out["cache"]
    if "past_key_values" in out:
        return out["past_key_values"]
    if _overrides_hooks(model):
        raise _OwnHooks
    if passed is not None:
        return passed
    takes = set(inspect.signature(model.forward).parameters) & {"cache", "past_key_values"}
    if takes:
        raise ValueError(f"{type(model).__name__} takes a cache (`{takes.pop()}`) but neither "
                         f"returns one nor is given one by generate(), so this trace cannot "
                         f"follow its decoding state")
    return None


def _module_state(model: Any) -> dict[tuple[int, str], Any]:
    """Tensors a model keeps as plain attributes of its modules, outside its parameters and
    buffers: the decoding state of models that hold it in their layers (RecurrentGemma's
    `recurrent_states` and `conv1d_state`). Keyed (module id, attribute)."""
    import torch

    held: dict[tuple[int, str], Any] = {}
    for m in model.modules():
        for name, v in vars(m).items():
            if isinstance(v, torch.Tensor) or (
                    isinstance(v, (list, tuple)) and v and all(isinstance(x, torch.Tensor)
                                                               for x in v)):
                held[(id(m), name)] = v
    return held


def _reset_module_state(model: Any, before: dict[tuple[int, str], Any]) -> None:
    """Put back the attributes `_module_state` found before a trace (None where there was
    none): each trace starts from the state the built model had, as a fresh model does."""
    now = _module_state(model)
    if now.keys() == before.keys() and all(now[k] is before[k] for k in now):
        return
    for m in model.modules():
        for name in list(vars(m)):
            key = (id(m), name)
            if key in now and now[key] is not before.get(key):
                setattr(m, name, before.get(key))


def past_positions(config: Any, tokens: int) -> str:
    """Where a failed run had more tokens than the config's position limit, the likely cause
    ("" otherwise): learned position embeddings (GPT-1, ProphetNet, BERT-style decoders) have
    no row past it, so the model cannot run such a prompt at all."""
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        limit = getattr(config, key, None)
        if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < tokens:
            return (f"; {tokens:,} tokens are past the model's {key} ({limit:,}): a model with "
                    f"learned position embeddings cannot run them; give a prompt of at most "
                    f"{limit:,} tokens with the new ones")
    return ""


#: One trace at a time per process: a trace hooks the cached model's modules and patches
#: F.scaled_dot_product_attention, so two at once (Streamlit sessions are threads; the length
#: model's background traces) would record each other's tensors.
TRACE_LOCK = threading.RLock()


def record(text: str, b: int, s: int, n: int, attention: str, dtype: str) -> Recorded:
    """Run generate()'s steps on the meta device (module docstring) and keep the events."""
    with TRACE_LOCK:
        model = _built(text, dtype, "eager" if attention == "eager" else "sdpa")
        if not getattr(model, "_attnmem_own_hooks", False):
            try:
                return _record(model, b, s, n, attention, own_hooks=False)
            except _OwnHooks:
                model._attnmem_own_hooks = True  # found at the first forward; kept per model
        return _record(model, b, s, n, attention, own_hooks=True)


def _record(model: Any, b: int, s: int, n: int, attention: str, own_hooks: bool) -> Recorded:
    """generate()'s steps driven by hand (module docstring); with `own_hooks`, each step's
    inputs come from the class's own prepare_inputs_for_generation and its state is carried by
    its own _update_model_kwargs_for_generation, as generate()'s loop does (`_sample`)."""
    import contextlib

    import torch

    cache_kw = _cache_kw(model)
    keeps = "logits_to_keep" in inspect.signature(model.forward).parameters
    rec = Recorder(values=True)
    rec.known(*model.parameters(), *model.buffers())
    before = _module_state(model)
    meta = torch.device("meta")
    fake = sdpa_as(attention) if attention != "eager" else contextlib.nullcontext()
    state: dict[str, Any] = {}

    def forward(ids: Any, cache: Any) -> Any:
        pos = torch.zeros(ids.shape, dtype=torch.long, device=meta)
        kw = {cache_kw: cache} if cache is not None else {}
        return model(input_ids=ids, position_ids=pos, use_cache=True, logits_to_keep=1, **kw)

    def sample(out: Any, ids: Any) -> Any:
        """generate()'s token choice: the fp32 copy of the last logits, argmax, cat."""
        logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
        del out
        nxt = logits.argmax(-1)
        rec.uniform.choose(nxt, PROMPT_TOKEN)  # which token comes is the weights' (docstring)
        del logits
        return torch.cat([ids, nxt[:, None]], dim=-1)

    def step(ids: Any, mask: Any, cache: Any, first: bool = False) -> tuple[Any, Any, Any]:
        """One generate() iteration: the forward (the whole prompt when `first`, else the
        last token), the fp32 last logits, argmax, cat."""
        if own_hooks:
            return hooks_step(ids, mask, cache, first)
        feed = ids if first or cache is None else ids[:, -1:]
        out = forward(feed, cache)
        cache = _returned_cache(out, model, cache)
        ids = sample(out, ids)
        del out
        mask = torch.cat([mask, torch.ones(b, 1, dtype=torch.long, device=meta)], dim=-1)
        return ids, mask, cache

    def hooks_step(ids: Any, mask: Any, kwargs: Any, first: bool) -> tuple[Any, Any, Any]:
        """One iteration of generate()'s loop through the class's own hooks; `kwargs` is
        generate()'s model_kwargs (the cache, or the class's own state, inside)."""
        if first:  # generate()'s model_kwargs before the prefill (_prepare_cache_for_generation)
            kwargs = {"use_cache": True, "attention_mask": mask}
            cache = _new_cache(model)
            if cache is not None:
                kwargs["cache"] = cache
            if keeps:
                kwargs["logits_to_keep"] = 1
        inputs = model.prepare_inputs_for_generation(
            ids, next_sequence_length=None if first else 1, is_first_iteration=first, **kwargs)
        out = model(**inputs, return_dict=True)
        del inputs
        kwargs = model._update_model_kwargs_for_generation(out, kwargs, is_encoder_decoder=False)
        ids = sample(out, ids)
        del out
        return ids, kwargs["attention_mask"], kwargs

    try:
        with torch.no_grad(), unpacked_rows(), rec.track_modules(model), fake, rec, \
                loop_guard(rec, model):
            _experts(model, "grouped_mm")
            rec.mark("prefill")
            ids = torch.full((b, s), PROMPT_TOKEN, dtype=torch.long, device=meta)
            mask = torch.ones(b, s, dtype=torch.long, device=meta)
            ids, mask, cache = step(ids, mask, _new_cache(model), first=True)
            if n >= 2:
                _experts(model, "batched_mm")
                if n >= 3:
                    rec.mark("setup")
                    del ids, mask, cache
                    ids = torch.full((b, s + n - 3), PROMPT_TOKEN, dtype=torch.long,
                                     device=meta)
                    mask = torch.ones(b, s + n - 3, dtype=torch.long, device=meta)
                    _experts(model, "grouped_mm")
                    ids, mask, cache = step(ids, mask, _new_cache(model), first=True)
                    _experts(model, "batched_mm")
                    ids, mask, cache = step(ids, mask, cache)
                rec.mark("decode")
                ids, mask, cache = step(ids, mask, cache)
            held = _held_state(model, before)
            roots = [v for k, v in cache.items() if k != "attention_mask"] if own_hooks \
                else [cache]
            state["cache"] = _cache_bytes(*roots) + held
            rec.mark("end")
            del ids, mask, cache
    except (NoKernel, _OwnHooks, TraceTooSlow, CacheRefused):
        raise
    except Exception as e:  # the model's own code refuses these inputs, or cannot run on meta
        raise _failed(model, e, s + n) from None
    finally:
        _experts(model, "grouped_mm")
    events = tuple(rec.events)
    _reset_module_state(model, before)
    return Recorded(events, _held_bytes(model), state["cache"], type(model).__name__)


def _failed(model: Any, e: BaseException, tokens: int) -> ValueError:
    """The refusal of a trace whose run of the model's own code failed, with the cause."""
    return ValueError(f"transformers' {type(model).__name__} could not run generate()'s forward "
                      f"on the meta device: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
                      f"{past_positions(model.config, tokens)}{_why(model, e)}")


def _held_state(model: Any, before: dict) -> int:
    """Bytes of the tensors the model's modules now hold as plain attributes that they did
    not hold before the trace (`_module_state`): state kept in the layers."""
    seen: dict[int, int] = {}
    for key, v in _module_state(model).items():
        if before.get(key) is v:
            continue
        for t in v if isinstance(v, (list, tuple)) else [v]:
            st = t.untyped_storage()
            seen[id(st)] = st.nbytes()
    return sum(seen.values())


#: Config keys that are None in most configs without harm (not worth naming in a refusal).
_NONE_OK = ("architectures", "dtype", "problem_type", "id2label", "label2id", "auto_map",
            "quantization_config", "finetuning_task", "tokenizer_class", "prefix")


def _nones(cfg: Any, err: BaseException) -> str:
    """Where the model's code failed on a None (a value its class leaves None by default),
    the config's None values, which a checkpoint's config.json would give ("" otherwise)."""
    if "NoneType" not in str(err):
        return ""
    try:
        d = cfg.to_dict()
    except Exception:
        return ""
    names = []
    for k, v in d.items():
        if isinstance(v, dict) and k not in _NONE_OK:
            names += [f"{k}.{k2}" for k2, v2 in v.items() if v2 is None]
        elif v is None and k not in _NONE_OK and not k.endswith("token_id"):
            names.append(k)
    if not names:
        return ""
    return (f"; the values this config leaves None (its class's defaults, which a "
            f"checkpoint's config.json sets): {', '.join(names[:8])}")


def _why(model: Any, err: BaseException) -> str:
    """Where a failure of the model's own code has a cause a user can act on, that cause
    ("" otherwise), after the error's own words."""
    text = str(err)
    if "NoneType" in text:
        return _nones(model.config, err)
    if "get_mask_sizes" in text and "LinearAttention" in text:
        return ("; every layer of this config is a state-space or linear-attention layer, and "
                "transformers' generate() cannot run a model without an attention layer (its "
                "mask code asks an attention layer for sizes; it fails the same way on a GPU)")
    if "item() cannot be called on meta tensors" in text or "Cannot copy out of meta" in text:
        return ("; its forward reads a value of a tensor computed from the input (a data-"
                "dependent branch or size), which the meta device does not hold: the trace "
                "follows only values it knows exactly (attnmem.trace.uniform, "
                "attnmem.trace.known), so this model is not traced")
    if isinstance(err, ValuesTooLarge):
        return "; a shorter prompt or a smaller batch makes that tensor smaller"
    if "with Meta tensors" in text or "torch.nonzero()" in text:
        return ("; its forward calls an op the meta device cannot run (one whose output size "
                "depends on the values, such as unique or nonzero, has no meta form), so this "
                "model is not traced")
    if isinstance(err, IndexError):
        cache = _new_cache(model)
        made = len(getattr(cache, "layers", ()) or ())
        attn = {getattr(m, "layer_idx", None) for m in model.modules()} - {None}
        if cache is not None and made and attn and max(attn) >= made:
            return (f"; transformers' generate() makes a cache of {made} layers from "
                    f"{type(model.config).__name__}.num_hidden_layers for a model whose "
                    f"layers count to {max(attn) + 1}, so generate() fails the same way on a "
                    f"GPU")
    if isinstance(err, RuntimeError) and ("expected scalar type" in text
                                           or "same dtype" in text):
        want = getattr(model.config, "dtype", None)  # what from_config was asked for
        odd = sorted({f"{n} ({p.dtype})".replace("torch.", "") for n, p in
                      model.named_parameters() if p.dtype != want})
        if odd:
            asked = str(want).replace("torch.", "")
            cast = _cast_failure(model)
            then = (f"cast whole (model.to(torch.{asked})), as a user would, it fails too "
                    f"({cast}), so transformers runs it in neither form in {asked}"
                    if cast else
                    f"cast whole (model.to(torch.{asked})) it runs, but the trace follows the "
                    f"model as transformers builds it")
            return (f"; transformers builds {len(odd)} of this model's parameters in another "
                    f"dtype than the {asked} asked (e.g. {', '.join(odd[:2])}) and its own "
                    f"forward then mixes the two; {then}; run it in fp32")
    return ""


def _cast_failure(model: Any) -> str:
    """Where transformers built some parameters in another dtype than asked (XLNet's
    `torch.FloatTensor` parameters stay fp32): the error of generate()'s steps on meta with the
    model cast whole to the asked dtype (a copy; `model.to(dtype)`), "" where they run. XLNet
    then fails in its two-stream attention, which generate() runs (`target_mapping`): the
    relative position encoding is made in fp32 (`relative_positional_encoding`) and meets the
    cast `r` weight uncast (modeling_xlnet.py XLNetRelativeAttention.forward); a CPU run
    fails the same way (tests/trace/test_refused_tail.py)."""
    import copy

    cast = copy.deepcopy(model).to(model.config.dtype)
    try:
        try:
            _record(cast, 1, 8, 2, "eager", own_hooks=False)
        except _OwnHooks:
            _record(cast, 1, 8, 2, "eager", own_hooks=True)
    except (ValueError, NoKernel) as e:
        return " ".join(str(e).split(": ", 1)[-1].split())[:200]
    return ""
