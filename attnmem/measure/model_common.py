"""What the whole-model harnesses share: training steps (``attnmem.measure.train``), sharded
training steps (``attnmem.measure.train_dist``) and inference (``attnmem.measure.infer``).

- Attention names and how transformers is asked for them: ``ATTENTIONS``, ``SDPA_BACKENDS``,
  ``attn_implementation``, ``model_from_config``, ``attention_context`` (a forced SDPA
  backend's ``sdpa_kernel``), ``kernels_hf_check`` (our kernel's refusals),
  ``shape_fields`` (a row's shape columns from the model's config).
- The environment columns of a row: ``environment`` (gpu, driver, torch, triton,
  transformers), ``now_utc`` (the timestamp).
- Error classification: ``short_error`` (the message), ``unavailable_error`` (an attention that
  cannot run this call: a result, not a bug; OOM is ``attnmem.measure.harness.is_oom``).
- The worker protocol's two ends (JSON lines on stdin/stdout, ``attnmem.measure.child``'s
  ``WorkerProcess`` on the parent side): ``serve`` (the child's entry: the protocol owns the
  real stdout), ``next_message`` (the parent's read with a time limit), ``allocated_now`` and
  ``LEFTOVER_RESTART_BYTES`` (when a worker hands over to a fresh one).
- Configurations and rows: ``DictConfig`` (a configuration's ``to_dict`` / ``from_dict``, what
  the worker protocol carries), ``ModelRow`` (a row's first columns: the model and its shape,
  ``shape_fields``; ``to_row``).
- CSV cells and command-line lists: ``cell``, ``words``, ``choices``, ``ints``, ``whole``.
- Model configurations (``attnmem.measure.train_models``, ``attnmem.measure.infer_models``):
  ``model_config`` (a model list's config.json dict with its layer count), ``config_object``
  (the transformers config of such a dict), ``base_config`` (a fixture in ``FIXTURES`` or a
  dict), ``TINY_LLAMA`` (the CPU tests' tiny Llama), ``sliding_layers`` (a built config's
  windowed layers, which ``shape_fields`` reads).

No torch or transformers at import time.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

#: Attention names of the whole-model harnesses: ``eager`` (transformers'
#: eager_attention_forward), ``sdpa_flash`` / ``sdpa_cudnn`` / ``sdpa_efficient`` /
#: ``sdpa_math`` (attn_implementation="sdpa" under sdpa_kernel of that one backend), ``triton``
#: (ours, ``attnmem.kernels.hf``), ``fa4`` (attn_implementation="flash_attention_4" where installed).
ATTENTIONS = ("eager", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math", "triton", "fa4")
#: The SDPBackend member each forced SDPA attention runs under.
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION",
                 "sdpa_efficient": "EFFICIENT_ATTENTION", "sdpa_math": "MATH"}
#: A worker whose allocator still holds this much after a configuration was cleaned up exits
#: (the runner starts a fresh one), so one configuration's leftovers never count in the next.
LEFTOVER_RESTART_BYTES = 256 * 2**20


# --------------------------------------------------------------------------------------------
# Configurations and rows.
# --------------------------------------------------------------------------------------------


class DictConfig:
    """``to_dict`` / ``from_dict`` of a configuration dataclass (a dict's unknown keys are
    ignored)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class ModelRow:
    """A whole-model row's first columns: the model's name and its shape (``shape_fields``);
    a harness's row dataclass adds its own after these."""

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

    def to_row(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# Attentions in transformers.
# --------------------------------------------------------------------------------------------


def typed_columns(result_cls: type) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The (int, float, bool) columns of a row dataclass, from its fields' declared types (the
    rest are text), so that a column added to the row is typed where rows are read."""
    def of(kind: str) -> tuple[str, ...]:
        return tuple(f.name for f in fields(result_cls) if str(f.type).split(" | ")[0] == kind)

    return of("int"), of("float"), of("bool")


def attn_implementation(attention: str) -> str:
    """transformers' attn_implementation for one of ``ATTENTIONS`` (``triton`` registers ours)."""
    if attention == "eager":
        return "eager"
    if attention in SDPA_BACKENDS:
        return "sdpa"
    if attention == "triton":
        import attnmem.kernels.hf

        return attnmem.kernels.hf.register()
    if attention == "fa4":
        return "flash_attention_4"
    raise ValueError(f"unknown attention {attention!r}")


def model_from_config(hf: Any, dtype: Any, attn_implementation: str) -> Any:
    """AutoModelForCausalLM.from_config with our dtype and attention (random init)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(hf, dtype=dtype,
                                            attn_implementation=attn_implementation)


def shape_fields(hf: Any) -> dict[str, Any]:
    """A row's shape columns (arch, layers, hidden, intermediate, heads, kv_heads, head_dim,
    vocab, tied, sliding_window) from a transformers config object."""
    heads = int(hf.num_attention_heads)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    return {
        "arch": str(hf.model_type), "layers": int(hf.num_hidden_layers),
        "hidden": int(hf.hidden_size), "intermediate": int(hf.intermediate_size),
        "heads": heads, "kv_heads": int(getattr(hf, "num_key_value_heads", None) or heads),
        "head_dim": int(head_dim), "vocab": int(hf.vocab_size),
        "tied": bool(getattr(hf, "tie_word_embeddings", False)),
        "sliding_window": (int(hf.sliding_window) if sliding_layers(hf) else None),
    }


def attention_context(attention: str) -> tuple[Callable[[], Any] | None, str]:
    """The context every call of ``attention`` runs under: ``sdpa_kernel(<its backend>)`` for
    a forced SDPA backend (``SDPA_BACKENDS``), else a null context; ``(None, why)`` when this
    torch has no such SDPBackend member (the row is then ``unavailable``)."""
    if attention not in SDPA_BACKENDS:
        return contextlib.nullcontext, ""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, SDPA_BACKENDS[attention], None)
    if backend is None:
        return None, f"torch {torch.__version__} has no SDPBackend.{SDPA_BACKENDS[attention]}"

    def attn_ctx() -> Any:
        return sdpa_kernel(backend)

    return attn_ctx, ""


def kernels_hf_check(hf: Any, seq_len: int) -> list[str]:
    """Why our kernel cannot run this model at seq_len on the GPU: attnmem.kernels.hf's refusals
    (sliding windows it runs: the kernel's own window)."""
    from attnmem.kernels.hf.attention import check_config as hf_check

    return hf_check(hf, seq_len)


# --------------------------------------------------------------------------------------------
# A row's environment columns.
# --------------------------------------------------------------------------------------------


def now_utc() -> str:
    """ISO 8601, UTC, to the second (the rows' timestamp)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def versions() -> dict[str, str]:
    """torch, triton and transformers versions ('' where not installed)."""
    out = {"torch": "", "triton": "", "transformers": ""}
    for name in out:
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            pass
    return out


def environment(device: Any) -> dict[str, str]:
    """The gpu, driver, torch, triton and transformers columns for ``device``
    (attnmem.measure.harness's device)."""
    env = device.environment()
    v = versions()
    return {"gpu": env.gpu_name, "driver": env.driver, "torch": v["torch"],
            "triton": v["triton"], "transformers": v["transformers"]}


# --------------------------------------------------------------------------------------------
# Errors.
# --------------------------------------------------------------------------------------------


def short_error(exc: BaseException, limit: int = 400) -> str:
    """'<Type>: <message>' on one line, the message cut at ``limit`` characters."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}"


def unavailable_error(exc: BaseException) -> bool:
    """An attention that cannot run this call (not a bug, not OOM)."""
    text = str(exc)
    return ("No available kernel" in text  # sdpa_kernel forced onto a backend that cannot
            or text.startswith("triton attention (")  # attnmem.kernels.hf's refusals
            or "does not support `softcap`" in text  # transformers' sdpa integration
            or ("does not support an attention implementation" in text)  # e.g. Gemma 2 + sdpa
            or isinstance(exc, ImportError))


# --------------------------------------------------------------------------------------------
# The worker protocol.
# --------------------------------------------------------------------------------------------


def allocated_now() -> int:
    """torch.cuda.memory_allocated(), 0 without CUDA."""
    try:
        import torch

        return int(torch.cuda.memory_allocated()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no CUDA state to read
        return 0


def next_message(child: Any, timeout_s: float) -> dict[str, Any] | None | str:
    """The child's next message; None when it died; 'timeout' past ``timeout_s``."""
    import queue

    try:
        return child.messages.get(timeout=max(0.0, timeout_s))
    except queue.Empty:
        return "timeout"


def serve(worker_main: Callable[[IO[str], IO[str]], None]) -> None:
    """A worker process's entry: ``worker_main(stdin, protocol)``, where the protocol owns the
    real stdout and anything a library prints goes to stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker_main(sys.stdin, proto)


# --------------------------------------------------------------------------------------------
# CSV cells and command-line lists.
# --------------------------------------------------------------------------------------------


def cell(v: Any) -> Any:
    """A CSV cell: None empty, formula-like text neutralised (attnmem.measure.store)."""
    from attnmem.measure.store import neutralise

    return "" if v is None else neutralise(v)


def words(values: Sequence[str]) -> list[str]:
    """Space- or comma-separated words (both accepted: --seq-len 1024 4096 or 1024,4096)."""
    return [w.strip() for v in values for w in v.split(",") if w.strip()]


def _exit(message: str) -> SystemExit:
    return SystemExit(f"error: {message}")


def choices(values: Sequence[str], known: Sequence[str], what: str,
            refuse: Callable[[str], Exception] = _exit) -> list[str]:
    """The words of ``values``, each one of ``known``; else ``refuse(message)`` is raised, the
    message naming both ("unknown model(s) gpt5; accepted: ..."): by default a SystemExit
    that prints "error: " and the message (the single-GPU command lines); the sharded
    command line passes its Refusal, printed by rank 0 only."""
    got = words(values)
    bad = [w for w in got if w not in known]
    if bad or not got:
        raise refuse(f"unknown {what} {', '.join(bad) or '(none)'}; accepted: {', '.join(known)}")
    return got


def ints(values: Sequence[str], what: str, lo: int) -> list[int]:
    """The words of ``values`` as whole numbers >= lo (else SystemExit)."""
    try:
        out = [int(w) for w in words(values)]
    except ValueError:
        raise SystemExit(f"error: {what} must be whole numbers, got {' '.join(values)}") from None
    if not out or any(v < lo for v in out):
        raise SystemExit(f"error: {what} must be whole numbers >= {lo}, got {' '.join(values)}")
    return out


def whole(v: Any, lo: int) -> bool:
    """Whether ``v`` is a whole number >= lo: an int, not a bool (True is not a count)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


# --------------------------------------------------------------------------------------------
# Model configurations.
# --------------------------------------------------------------------------------------------

#: The fixture configs (the Hub model cards' config.json) the model lists are built from.
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "hf_configs"

#: Not a real model: the CPU tests' tiny Llama (2 layers, hidden 64), in both model lists.
TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "hidden_act": "silu",
}

#: A model list: name -> (base config: fixture file stem or a dict, layers, what it stands for).
Models = Mapping[str, tuple[Any, int, str]]


#: Keys a fixture leaves to its config class's defaults, written out so that calc reads the
#: same values transformers uses (Gemma 3's multimodal config.json has no text vocab_size:
#: Gemma3TextConfig's default, 262,208, is the real model's).
FIXTURE_DEFAULTS: dict[str, dict[str, Any]] = {"gemma-3-27b-it": {"vocab_size": 262208}}


def base_config(src: str | dict[str, Any]) -> dict[str, Any]:
    """A copy of the config dict ``src``, or the fixture ``FIXTURES/<src>.json`` with its
    ``FIXTURE_DEFAULTS``; a multimodal config (Gemma 3) gives its ``text_config``, the
    language model's own config."""
    if isinstance(src, dict):
        return copy.deepcopy(src)
    d = json.loads((FIXTURES / f"{src}.json").read_text())
    if "text_config" in d:
        d = dict(d["text_config"])
    for key, value in FIXTURE_DEFAULTS.get(src, {}).items():
        d.setdefault(key, value)
    return d


def model_config(models: Models, name: str, layers: int | None, *, what: str,
                 use_cache: bool) -> dict[str, Any]:
    """The config.json dict of ``name`` in ``models`` (``what`` names the list in the error:
    "training", "inference"; the base from `base_config`), with the list's layer count or
    ``layers`` (a whole number >= 1, else ValueError) and ``use_cache``. Dropped:
    ``layer_types`` (the config class re-derives it for the new depth) and
    ``quantization_config`` (the harnesses build bf16 weights from the config, so a
    checkpoint's quantization, gpt-oss's MXFP4 experts, does not apply)."""
    if name not in models:
        raise ValueError(f"unknown {what} model {name!r}; known: {', '.join(models)}")
    src, n_layers, _ = models[name]
    n = n_layers if layers is None else layers
    if not whole(n, 1):
        raise ValueError(f"layers must be a whole number >= 1, got {layers!r}")
    d = base_config(src)
    d["num_hidden_layers"] = n
    d["use_cache"] = use_cache
    d.pop("quantization_config", None)
    d.pop("layer_types", None)
    return d


def config_object(d: dict[str, Any]) -> Any:
    """The transformers config object (AutoConfig.for_model) of a config.json dict (imports
    transformers; ``d`` is not changed)."""
    from transformers import AutoConfig

    d = copy.deepcopy(d)
    model_type = d.pop("model_type")
    for key in ("architectures", "torch_dtype", "transformers_version"):
        d.pop(key, None)
    return AutoConfig.for_model(model_type, **d)


def sliding_layers(cfg: Any) -> list[tuple[int, int]]:
    """(layer index, window) of every layer that attends through a sliding window.

    ``cfg`` is a transformers config object (``config_object``: its class has derived
    ``layer_types`` where the architecture has them; a raw dict may not have, so none is taken).
    As transformers' modeling code decides it: a config with ``layer_types`` windows its
    ``"sliding_attention"`` layers, a config without it (Mistral, Phi-3) every layer when
    ``sliding_window`` is set (and ``use_sliding_window`` is not False).
    """
    if isinstance(cfg, dict):
        raise TypeError("sliding_layers needs a transformers config object (build_config)")
    window = getattr(cfg, "sliding_window", None)
    if window is None or getattr(cfg, "use_sliding_window", True) is False:
        return []
    n = int(cfg.num_hidden_layers)
    types = getattr(cfg, "layer_types", None)
    if types is None:
        return [(i, int(window)) for i in range(n)]
    return [(i, int(window)) for i, t in enumerate(types) if t == "sliding_attention"]
