"""Measure one training step of a real transformers model: memory before and at the peak, time.

The procedure (shared/DESIGN.md, "Measurement", training step), ``measure_train_step``:

1. Build the model from its config (``kernels.measure.train_models``: real widths, a few
   layers), random init, no download: ``AutoModelForCausalLM.from_config(cfg, dtype=...,
   attn_implementation=...)`` on the GPU; ``model.train()``; checkpointing on:
   ``gradient_checkpointing_enable`` with ``use_reentrant=False`` (transformers' own default
   in 5.x, passed explicitly so the row does not depend on it). AdamW
   (``torch.optim.AdamW(model.parameters(), lr=1e-5)``, foreach: torch's default, i.e. on for
   CUDA parameters). input_ids (B, s) uniform random token ids; labels = input_ids (the
   model shifts them inside its loss: ``ForCausalLMLoss``, logits upcast to fp32).
2. One step = forward + loss, ``loss.backward()``, ``optimizer.step()``,
   ``optimizer.zero_grad(set_to_none=True)``. Precision ``bf16``: parameters (and so AdamW's
   two moments) in bf16, no autocast. ``amp_bf16``: fp32 parameters and moments, forward and
   loss under ``torch.autocast("cuda", dtype=torch.bfloat16)``, backward and step outside it.
   ``fp32``: everything fp32 (CPU tests; the Triton interpreter has no bf16).
   The SDPA backends run the whole step (backward and checkpoint recomputation included)
   inside ``torch.nn.attention.sdpa_kernel(<that backend>)``.
3. Warm-up: one step (cuBLAS/cuDNN handles, Triton compilation, AdamW's state allocated).
4. ``gc.collect()``, ``empty_cache()``; ``before_step_bytes = memory_allocated()``: weights,
   AdamW's moments (and step counters), the inputs; no gradients (set to None).
5. ``steps`` measured steps (default 3), each between two CUDA events, with
   ``reset_peak_memory_stats()`` before the first: ``peak_bytes = max_memory_allocated()``
   over them (absolute, not minus before), ``reserved_bytes = max_memory_reserved()``,
   ``step_ms`` = median. Allocated memory after each step must come back to before (else the
   message says by how much).
6. Prediction: ``calc.training_step(ModelConfig.from_hf_config(config), batch, seq_len,
   attention=..., precision=..., checkpointing=...)`` when calc has it (else empty, and the
   message says why).

Out of memory is a result (status ``oom``). An attention that cannot run this model (our
kernel refusing soft-capping or dropout: ``kernels.hf.check_config``; an SDPA backend
that has no kernel for the call; FlashAttention-4 not installed) is ``unavailable`` with the
reason. Statuses: ``kernels.measure.harness.STATUSES``.

Attention names (``ATTENTIONS``): ``eager`` (transformers' eager_attention_forward),
``sdpa_flash`` / ``sdpa_cudnn`` / ``sdpa_efficient`` / ``sdpa_math``
(attn_implementation="sdpa" under sdpa_kernel of that one backend), ``triton`` (ours,
``kernels.hf``), ``fa4`` (attn_implementation="flash_attention_4" where installed).

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
    before_step_bytes  memory_allocated() after the warm-up step (step 4)
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

The runner (``run_train``) measures a list of configurations in one child process (this
module with ``--worker``; JSON lines on stdin/stdout like kernels.measure.child) under the
same GPU lock; a configuration past its time limit kills the child (``timeout``), a dead child
is ``crashed``, and a fresh child takes the next one. A time budget skips whatever has not
started when it is spent (rows with status ``skipped``). Command line: ``python -m
kernels.measure --train ...`` (``main`` here; ``--plan h200`` is the bundled reference sweep,
``reference_plan``). No torch or transformers at import time.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import json
import os
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import IO, Any

from kernels.measure import train_models
from kernels.measure.child import WorkerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
ATTENTIONS = ("eager", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math", "triton", "fa4")
PRECISIONS = ("bf16", "amp_bf16", "fp32")
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION",
                 "sdpa_efficient": "EFFICIENT_ATTENTION", "sdpa_math": "MATH"}
USE_REENTRANT = False  # what gradient checkpointing is enabled with (transformers' default)


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


def _now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _short(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}"


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


def shape_fields(hf: Any) -> dict[str, Any]:
    """The row's shape columns from a transformers config object."""
    heads = int(hf.num_attention_heads)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    return {
        "arch": str(hf.model_type), "layers": int(hf.num_hidden_layers),
        "hidden": int(hf.hidden_size), "intermediate": int(hf.intermediate_size),
        "heads": heads, "kv_heads": int(getattr(hf, "num_key_value_heads", None) or heads),
        "head_dim": int(head_dim), "vocab": int(hf.vocab_size),
        "tied": bool(getattr(hf, "tie_word_embeddings", False)),
        "sliding_window": (int(hf.sliding_window) if train_models.sliding_layers(hf) else None),
    }


def predict(cfg: TrainConfig, config_dict: dict[str, Any]) -> tuple[int | None, int | None, str]:
    """calc.training_step's (peak, before-step) bytes for cfg, or (None, None, why)."""
    try:
        from calc import ModelConfig, training_step
    except ImportError as exc:
        return None, None, f"no prediction: calc did not import ({exc})"
    try:
        model = ModelConfig.from_hf_config(config_dict, name=cfg.model)
        m = training_step(model, cfg.batch, cfg.seq_len, attention=cfg.attention,
                          precision=cfg.precision, checkpointing=cfg.checkpointing)
        return int(m.peak_bytes), int(m.before_step_bytes), ""
    except Exception as exc:  # noqa: BLE001 - a failed prediction never costs the measurement
        return None, None, f"no prediction: {_short(exc, 200)}"


def _versions() -> dict[str, str]:
    out = {"torch": "", "triton": "", "transformers": ""}
    for name in out:
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            pass
    return out


def _environment(device: Any) -> dict[str, str]:
    env = device.environment()
    v = _versions()
    return {"gpu": env.gpu_name, "driver": env.driver, "torch": v["torch"],
            "triton": v["triton"], "transformers": v["transformers"]}


def _unavailable_error(exc: BaseException) -> bool:
    """An attention that cannot run this call (not a bug, not OOM)."""
    text = str(exc)
    return ("No available kernel" in text  # sdpa_kernel forced onto a backend that cannot
            or text.startswith("triton attention (")  # kernels.hf's refusals
            or "does not support `softcap`" in text  # transformers' sdpa integration
            or ("does not support an attention implementation" in text)  # e.g. Gemma 2 + sdpa
            or isinstance(exc, ImportError))


def _attn_implementation(attention: str) -> str:
    if attention == "eager":
        return "eager"
    if attention in SDPA_BACKENDS:
        return "sdpa"
    if attention == "triton":
        import kernels.hf

        return kernels.hf.register()
    if attention == "fa4":
        return "flash_attention_4"
    raise ValueError(f"unknown attention {attention!r}")


def _enable_checkpointing(model: Any) -> None:
    kwargs = {"use_reentrant": USE_REENTRANT}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x: the new name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def measure_train_step(cfg: TrainConfig, *, device: Any = None) -> TrainResult:
    """Measure cfg in this process (module docstring). Never raises for OOM or a refusal."""
    t0 = time.perf_counter()
    res = _measure(cfg, device)
    return replace(res, wall_s=round(time.perf_counter() - t0, 3), timestamp=_now())


def _measure(cfg: TrainConfig, device: Any) -> TrainResult:
    base = {"model": cfg.model, "batch": cfg.batch, "seq_len": cfg.seq_len,
            "attention": cfg.attention, "precision": cfg.precision,
            "checkpointing": bool(cfg.checkpointing)}
    bad = check_config(cfg)
    if bad:
        return TrainResult(**base, status="error", message=bad)
    import torch

    from kernels.measure.harness import default_device, is_oom

    device = device or default_device()
    env = _environment(device)
    config_dict = train_models.hf_config(cfg.model, cfg.layers)
    hf = train_models.build_config(config_dict)
    shape = shape_fields(hf)
    pred_peak, pred_before, pred_msg = predict(cfg, config_dict)
    row = {**base, **shape, **env, "predicted_peak_bytes": pred_peak,
           "predicted_before_bytes": pred_before}
    notes = [pred_msg] if pred_msg else []
    if cfg.checkpointing:
        notes.append(f"checkpointing: use_reentrant={USE_REENTRANT}")

    def result(status: str, message: str = "", **values: Any) -> TrainResult:
        msg = "; ".join(m for m in [message, *notes] if m)
        return TrainResult(**row, status=status, message=msg, **values)

    if cfg.attention == "triton":
        why = _kernels_hf_check(hf, cfg.seq_len)
        if why:
            return result("unavailable", "our kernel cannot run this model: " + "; ".join(why))
    if cfg.precision == "amp_bf16" and device.name != "cuda":
        notes.append("autocast on the CPU")
    if cfg.attention in SDPA_BACKENDS:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, SDPA_BACKENDS[cfg.attention], None)
        if backend is None:
            return result("unavailable", f"torch {torch.__version__} has no SDPBackend."
                          f"{SDPA_BACKENDS[cfg.attention]}")

        def attn_ctx() -> Any:
            return sdpa_kernel(backend)
    else:
        attn_ctx = contextlib.nullcontext
    dev = "cuda" if device.name == "cuda" else "cpu"
    param_dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    autocast = cfg.precision == "amp_bf16"
    state: dict[str, Any] = {}
    params: int | None = None
    try:
        impl = _attn_implementation(cfg.attention)
        gc.collect()
        device.empty_cache()
        # Only ``state`` holds the model, optimizer and inputs (no local names), so that
        # clearing it frees them, also after an OOM.
        with torch.device(dev):
            state["model"] = train_models_from_config(hf, param_dtype, impl)
        if next(state["model"].parameters()).device.type != dev:
            state["model"].to(dev)
        state["model"].train()
        if cfg.checkpointing:
            _enable_checkpointing(state["model"])
        params = sum(p.numel() for p in state["model"].parameters())
        state["opt"] = torch.optim.AdamW(state["model"].parameters(), lr=1e-5)
        state["ids"] = torch.randint(0, shape["vocab"], (cfg.batch, cfg.seq_len), device=dev)
        s = state

        def step() -> float:
            with attn_ctx():
                with torch.autocast(dev, dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
                    loss = s["model"](input_ids=s["ids"], labels=s["ids"], use_cache=False).loss
                loss.backward()
                s["opt"].step()
                s["opt"].zero_grad(set_to_none=True)
            return float(loss.detach())

        # Warm-up.
        losses = [step()]
        device.sync()
        gc.collect()
        device.empty_cache()
        device.sync()
        before = device.allocated()
        device.reset_peak()
        times: list[float] = []
        leftover = 0
        for _ in range(cfg.steps):
            box: list[float] = []
            times.append(device.elapsed(lambda box=box: box.append(step())))
            losses.append(box[0])
            leftover = max(leftover, device.allocated() - before)
        peak = device.max_allocated()
        reserved = device.max_reserved()
    except Exception as exc:  # noqa: BLE001 - OOM and refusals are results; the rest 'error'
        status = ("oom" if is_oom(exc) else
                  "unavailable" if _unavailable_error(exc) else "error")
        message = _short(exc)
        del exc
        state.clear()
        gc.collect()
        device.empty_cache()
        return result(status, message, params=params)
    state.clear()
    gc.collect()
    device.empty_cache()
    if leftover > 0:
        notes.append(f"allocated memory grew by {leftover} bytes over a measured step")
    measured = device.name == "cuda"
    rel = ((pred_peak - peak) / peak) if (measured and pred_peak is not None and peak) else None
    return result(
        "ok", params=params, before_step_bytes=before if measured else None,
        peak_bytes=peak if measured else None, reserved_bytes=reserved if measured else None,
        step_ms=round(statistics.median(times), 3), steps=len(times), loss=round(losses[-1], 4),
        peak_rel_error=rel)


def _kernels_hf_check(hf: Any, seq_len: int) -> list[str]:
    """Why our kernel cannot run this model at seq_len on the GPU: kernels.hf's refusals
    (sliding windows it runs: the kernel's own window)."""
    from kernels.hf.attention import check_config as hf_check

    return hf_check(hf, seq_len)


def train_models_from_config(hf: Any, dtype: Any, attn_implementation: str) -> Any:
    """AutoModelForCausalLM.from_config with our dtype and attention (random init)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(hf, dtype=dtype,
                                            attn_implementation=attn_implementation)


# --------------------------------------------------------------------------------------------
# The child process and the runner.
# --------------------------------------------------------------------------------------------


def worker_main(stdin: IO[str], proto: IO[str]) -> None:
    """Serve {"cfg": {...}} lines until EOF or {"cmd": "exit"}; answer {"result": row}."""
    for line in stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        if msg.get("cmd") == "exit":
            break
        cfg = TrainConfig.from_dict(msg["cfg"])
        try:
            res = measure_train_step(cfg)
        except Exception as exc:  # noqa: BLE001 - keep serving; the row says what broke
            res = TrainResult(model=cfg.model, batch=cfg.batch, seq_len=cfg.seq_len,
                              attention=cfg.attention, precision=cfg.precision,
                              checkpointing=bool(cfg.checkpointing), status="error",
                              message=_short(exc), timestamp=_now())
        left = _allocated_now()
        restart = left > LEFTOVER_RESTART_BYTES
        proto.write(json.dumps({"result": res.to_row(), "restart": restart}) + "\n")
        proto.flush()
        if restart:  # something kept GPU memory alive: the next configuration gets a fresh child
            print(f"train worker: {left} bytes still allocated after {cfg.label()}; exiting",
                  file=sys.stderr, flush=True)
            break


#: A worker whose allocator still holds this much after a configuration was cleaned up exits
#: (the runner starts a fresh one), so one configuration's leftovers never count in the next.
LEFTOVER_RESTART_BYTES = 256 * 2**20


def _allocated_now() -> int:
    try:
        import torch

        return int(torch.cuda.memory_allocated()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no CUDA state to read
        return 0


class _TrainChild(WorkerProcess):
    """One ``python -m kernels.measure.train_harness --worker`` process."""

    def __init__(self, env: dict[str, str] | None) -> None:
        super().__init__(["kernels.measure.train_harness", "--worker"], env)
        self.done = 0


def _next_message(child: Any, timeout_s: float) -> dict[str, Any] | None | str:
    """The child's next message; None when it died; 'timeout' past ``timeout_s``."""
    import queue

    try:
        return child.messages.get(timeout=max(0.0, timeout_s))
    except queue.Empty:
        return "timeout"


def _row_for(cfg: TrainConfig, status: str, message: str) -> TrainResult:
    return TrainResult(model=cfg.model, layers=cfg.layers, batch=cfg.batch, seq_len=cfg.seq_len,
                       attention=cfg.attention, precision=cfg.precision,
                       checkpointing=bool(cfg.checkpointing), status=status, message=message,
                       timestamp=_now())


@dataclass
class TrainRunSummary:
    results: list[TrainResult] = field(default_factory=list)
    wall_s: float = 0.0
    children_started: int = 0


def run_train(configs: Sequence[TrainConfig], *,
              on_result: Callable[[TrainResult, int, int], None] | None = None,
              timeout_s: float = 180.0, startup_s: float = 90.0,
              budget_s: float | None = None, skip_longer_after_oom: bool = True,
              gpu_index: int = 0, lock_wait_s: float = 0.0,
              lock_dir: str | os.PathLike[str] | None = None,
              env: dict[str, str] | None = None) -> TrainRunSummary:
    """Measure ``configs`` one by one in a child process, holding the GPU lock.

    ``budget_s``: configurations not started within that many seconds of the start are
    recorded as ``skipped`` (the run finishes at most one configuration's time later).
    ``timeout_s`` limits each configuration (plus ``startup_s`` for a fresh child's first).
    """
    from kernels.measure.child import gpu_lock

    summary = TrainRunSummary()
    t0 = time.monotonic()
    oom_at: dict[tuple, int] = {}
    with gpu_lock(gpu_index, wait_s=lock_wait_s, lock_dir=lock_dir):
        child: _TrainChild | None = None
        try:
            for i, cfg in enumerate(configs):
                series = cfg.series()
                if budget_s is not None and time.monotonic() - t0 > budget_s:
                    res = _row_for(cfg, "skipped",
                                   f"not run: the run's time budget of {budget_s:g} s was spent")
                elif skip_longer_after_oom and series in oom_at and cfg.seq_len >= oom_at[series]:
                    res = _row_for(cfg, "skipped", f"not run: s={oom_at[series]} of the same "
                                   "series already ran out of memory")
                else:
                    if child is None or child.proc.poll() is not None:
                        if child is not None:
                            child.kill()
                        child = _TrainChild(env)
                        summary.children_started += 1
                    limit = timeout_s + (startup_s if child.done == 0 else 0.0)
                    child.send({"cfg": cfg.to_dict()})
                    msg = _next_message(child, limit)
                    if msg == "timeout":
                        child.kill()
                        child = None
                        res = _row_for(cfg, "timeout", f"no result within {limit:.0f} s: the "
                                       "child was killed and a fresh one takes the next")
                    elif not isinstance(msg, dict) or "result" not in msg:
                        code = child.proc.wait(timeout=10) if child.proc.poll() is None else child.proc.returncode
                        tail = child.stderr_tail()
                        child.kill()
                        child = None
                        res = _row_for(cfg, "crashed", f"the child process died (exit code "
                                       f"{code}); stderr ends: {tail[-300:]}")
                    else:
                        res = TrainResult(**msg["result"])
                        child.done += 1
                        if msg.get("restart"):
                            child.close()
                            child = None
                if res.status == "oom":
                    oom_at[series] = min(cfg.seq_len, oom_at.get(series, cfg.seq_len))
                summary.results.append(res)
                if on_result is not None:
                    on_result(res, i, len(configs))
        finally:
            if child is not None:
                if sys.exc_info()[0] is not None:
                    child.kill()
                else:
                    child.close()
    summary.wall_s = time.monotonic() - t0
    return summary


# --------------------------------------------------------------------------------------------
# Results that last: typed CSV rows, and the SQLite store (the attention points' file).
# --------------------------------------------------------------------------------------------

_INT = ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab",
        "sliding_window", "batch", "seq_len", "params", "before_step_bytes", "peak_bytes",
        "reserved_bytes", "steps", "predicted_peak_bytes", "predicted_before_bytes")
_FLOAT = ("step_ms", "loss", "peak_rel_error", "wall_s")
_BOOL = ("tied", "checkpointing")


def typed_row(raw: dict[str, Any]) -> dict[str, Any]:
    """A CSV or database row with its numbers and booleans parsed (empty cells: None)."""
    out: dict[str, Any] = {}
    for c in TRAIN_COLUMNS:
        v = raw.get(c)
        if v is None or v == "":
            out[c] = None if c in _INT + _FLOAT + _BOOL else ""
        elif c in _INT:
            out[c] = int(float(v))
        elif c in _FLOAT:
            out[c] = float(v)
        elif c in _BOOL:
            out[c] = v if isinstance(v, bool) else str(v).strip().lower() in ("true", "1")
        else:
            out[c] = str(v)
    return out


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a training-step CSV (this module's TRAIN_COLUMNS), typed. A file without the
    columns raises ValueError naming the missing ones."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in ("model", "seq_len", "attention", "precision", "checkpointing",
                               "status", "peak_bytes") if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: not a training-step CSV (missing columns "
                             f"{', '.join(missing)})")
        return [typed_row(r) for r in reader]


class TrainStore:
    """Training-step runs in the attention points' SQLite file (kernels.measure.store's
    default_db_path), in tables of their own: ``train_runs`` and ``train_rows``."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        from kernels.measure.store import default_db_path

        self.path = Path(path) if path is not None else default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kinds = {c: "INTEGER" if c in _INT + _BOOL else "REAL" if c in _FLOAT else "TEXT"
                 for c in TRAIN_COLUMNS}
        with self._connect() as con:
            con.executescript(
                "CREATE TABLE IF NOT EXISTS train_runs (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                "started TEXT NOT NULL, gpu TEXT NOT NULL DEFAULT '', label TEXT NOT NULL "
                "DEFAULT '');\n"
                "CREATE TABLE IF NOT EXISTS train_rows (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                "run_id INTEGER NOT NULL REFERENCES train_runs(id) ON DELETE CASCADE, "
                + ", ".join(f"{c} {k}" for c, k in kinds.items()) + ");")

    @contextlib.contextmanager
    def _connect(self) -> Any:
        con = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA foreign_keys=ON")
            con.row_factory = sqlite3.Row
            yield con
        finally:
            con.close()

    def new_run(self, *, gpu: str = "", label: str = "") -> int:
        with self._connect() as con:
            cur = con.execute("INSERT INTO train_runs (started, gpu, label) VALUES (?, ?, ?)",
                              (_now(), gpu, label[:200]))
            return int(cur.lastrowid)

    def add_row(self, run_id: int, row: dict[str, Any]) -> None:
        t = typed_row(row)
        vals = [int(t[c]) if c in _BOOL and t[c] is not None else t[c] for c in TRAIN_COLUMNS]
        with self._connect() as con:
            con.execute(f"INSERT INTO train_rows (run_id, {', '.join(TRAIN_COLUMNS)}) VALUES "
                        f"(?, {', '.join('?' * len(TRAIN_COLUMNS))})", [run_id, *vals])

    def runs(self) -> list[dict[str, Any]]:
        with self._connect() as con:
            cur = con.execute("SELECT train_runs.*, (SELECT COUNT(*) FROM train_rows WHERE "
                              "run_id = train_runs.id) AS n FROM train_runs ORDER BY id DESC")
            return [dict(r) for r in cur]

    def rows(self, run_id: int) -> list[dict[str, Any]]:
        with self._connect() as con:
            cur = con.execute(f"SELECT {', '.join(TRAIN_COLUMNS)} FROM train_rows WHERE "
                              "run_id = ? ORDER BY id", (run_id,))
            return [typed_row(dict(r)) for r in cur]


# --------------------------------------------------------------------------------------------
# Plans: the cross product of the command line, and the bundled H200 reference sweep.
# --------------------------------------------------------------------------------------------


def expand(models: Iterable[str], seq_lens: Iterable[int], attentions: Iterable[str],
           precisions: Iterable[str], checkpointings: Iterable[bool], *, batch: int = 1,
           layers: int | None = None, steps: int = 3) -> list[TrainConfig]:
    """The cross product; each series runs short to long (so an OOM skips the longer ones)."""
    seq = sorted(set(int(s) for s in seq_lens))
    return [TrainConfig(m, s, a, p, bool(c), batch, layers, steps)
            for m in models for p in precisions for c in checkpointings for a in attentions
            for s in seq]


#: Lengths of the reference sweep: non-powers of two among them (1,000, 3,000, 12,000).
REF_LENGTHS = (1000, 3000, 8192, 12000, 32768)


def reference_plan() -> list[TrainConfig]:
    """The H200 reference sweep (item 5 of issue 17), most important first, so that a time
    budget cuts the least important rows.

    0. Coverage first: every architecture with sdpa_flash and triton in bf16 at 1,000 and
       8,192 tokens without checkpointing, so that even a short run measures GQA and MHA,
       tied and untied embeddings, 100k+ vocabularies and sliding windows. Then:
    1. llama3-8b-2l (GQA, 128k vocab, untied): eager, sdpa_flash, sdpa_cudnn, triton x bf16,
       amp_bf16 x checkpointing off/on x s = 1,000 ... 32,768; FlashAttention-4 in bf16 at
       1,000, 8,192, 32,768 (unavailable rows where it is not installed).
    2. llama3-8b-4l, the same model with 4 layers, bf16 and amp_bf16, checkpointing off/on, at
       1,000, 3,000, 8,192 (per-layer cost = 4l - 2l; linear in L).
    3. Every other architecture (MHA: llama2-7b, phi3-mini; tied: llama3.2-1b, qwen3-4b,
       gemma 2/3; sliding window: mistral, phi3, gemma 2/3): sdpa_flash and triton in bf16
       with checkpointing off/on at 1,000, 3,000, 8,192 (triton runs a window shorter than s
       with its causal sliding window; it refuses Gemma 2's soft-capping: an unavailable row,
       no time spent), eager in bf16 at 1,000 and 8,192.
    4. The same architectures in amp_bf16 (checkpointing off) with sdpa_flash and triton, and
       sdpa_cudnn in bf16.
    5. The long end: 12,000 and 32,768 for every other architecture, sdpa_flash and triton,
       bf16, checkpointing on and off.
    """
    plan: list[TrainConfig] = []
    main4 = ("sdpa_flash", "triton", "sdpa_cudnn", "eager")
    plan += expand(["llama3-8b-2l"], REF_LENGTHS, main4, ["bf16", "amp_bf16"], [False, True])
    plan += expand(["llama3-8b-2l"], (1000, 8192, 32768), ("fa4",), ["bf16"], [False, True])
    plan += expand(["llama3-8b-4l"], (1000, 3000, 8192), ("sdpa_flash", "triton", "eager"),
                   ["bf16", "amp_bf16"], [False, True])
    others = ("llama2-7b-2l", "qwen2.5-7b-2l", "qwen3-4b-2l", "llama3.2-1b-2l", "mistral-7b-2l",
              "gemma3-27b-2l", "gemma2-9b-2l", "phi3-mini-2l")
    plan += expand(others, (1000, 3000, 8192), ("sdpa_flash", "triton"), ["bf16"],
                   [False, True])
    plan += expand(others, (1000, 8192), ("eager",), ["bf16"], [False])
    plan += expand(others, (1000, 8192), ("sdpa_flash", "triton"), ["amp_bf16"], [False])
    plan += expand(others, (1000, 8192), ("sdpa_cudnn",), ["bf16"], [False])
    plan += expand(others, (12000, 32768), ("sdpa_flash", "triton"), ["bf16"], [False, True])
    first = expand(["llama3-8b-2l", *others], (1000, 8192), ("sdpa_flash", "triton"), ["bf16"],
                   [False])
    def key(c: TrainConfig) -> tuple:
        return (c.model, c.seq_len, c.attention, c.precision, c.checkpointing)

    seen = {key(c) for c in first}
    return first + [c for c in plan if key(c) not in seen]


PLANS: dict[str, Callable[[], list[TrainConfig]]] = {"h200": reference_plan}


# --------------------------------------------------------------------------------------------
# Command line: python -m kernels.measure --train ...
# --------------------------------------------------------------------------------------------


def _words(values: Sequence[str]) -> list[str]:
    """Space- or comma-separated words (both accepted: --seq-len 1024 4096 or 1024,4096)."""
    return [w.strip() for v in values for w in v.split(",") if w.strip()]


def _choices(values: Sequence[str], known: Sequence[str], what: str) -> list[str]:
    words = _words(values)
    bad = [w for w in words if w not in known]
    if bad or not words:
        raise SystemExit(f"error: unknown {what} {', '.join(bad) or '(none)'}; known: "
                         f"{', '.join(known)}")
    return words


def _ints(values: Sequence[str], what: str, lo: int) -> list[int]:
    try:
        out = [int(w) for w in _words(values)]
    except ValueError:
        raise SystemExit(f"error: {what} must be whole numbers, got {' '.join(values)}") from None
    if not out or any(v < lo for v in out):
        raise SystemExit(f"error: {what} must be whole numbers >= {lo}, got {' '.join(values)}")
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m kernels.measure --train",
        description="Measure training steps of real transformers models (random init, no "
                    "download): memory before the step, peak, reserved, median step time. "
                    "Lists take spaces or commas.")
    ap.add_argument("--model", nargs="+", default=["llama3-8b-2l"],
                    help=f"model names ({', '.join(train_models.NAMES)})")
    ap.add_argument("--layers", type=int, default=None,
                    help="override the models' layer count")
    ap.add_argument("--seq-len", nargs="+", default=["1024", "4096"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--attention", nargs="+", default=["sdpa_flash", "triton"],
                    help=f"attentions ({', '.join(ATTENTIONS)})")
    ap.add_argument("--precision", nargs="+", default=["bf16"],
                    help=f"precisions ({', '.join(PRECISIONS)})")
    ap.add_argument("--checkpointing", nargs="+", default=["off"], help="off, on (or both)")
    ap.add_argument("--steps", type=int, default=3, help="measured steps (median time), >= 3")
    ap.add_argument("--plan", choices=sorted(PLANS), default=None,
                    help="a bundled sweep instead of the cross product (h200: the reference)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds: configurations not started by then are recorded as skipped")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per configuration")
    ap.add_argument("--lock-wait", type=float, default=0.0,
                    help="seconds to wait for a busy GPU")
    ap.add_argument("--out", type=Path, default=Path("training_steps.csv"), help="CSV to write")
    ap.add_argument("--db", type=Path, default=None,
                    help="also store the run in this SQLite file (tables train_runs, train_rows)")
    ap.add_argument("--label", default="", help="label of the stored run")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    ap.add_argument("--repredict", type=Path, default=None, metavar="CSV",
                    help="measure nothing: recompute the predicted_* columns and "
                         "peak_rel_error of CSV's rows from the current calc and write --out")
    ap.add_argument("--quiet", action="store_true")
    return ap


def configs_from_args(args: argparse.Namespace) -> list[TrainConfig]:
    if args.plan:
        return PLANS[args.plan]()
    if args.steps < 3:
        raise SystemExit(f"error: --steps must be at least 3 (a median of >= 3), got {args.steps}")
    if args.batch < 1:
        raise SystemExit(f"error: --batch must be >= 1, got {args.batch}")
    if args.layers is not None and args.layers < 1:
        raise SystemExit(f"error: --layers must be >= 1, got {args.layers}")
    models = _choices(args.model, train_models.NAMES, "model(s)")
    attentions = _choices(args.attention, ATTENTIONS, "attention(s)")
    precisions = _choices(args.precision, PRECISIONS, "precision(s)")
    ck = _choices(args.checkpointing, ("off", "on", "both"), "checkpointing value(s)")
    checkpointings = sorted({c for w in ck for c in {"off": [False], "on": [True],
                                                      "both": [False, True]}[w]})
    seq = _ints(args.seq_len, "--seq-len", 2)
    return expand(models, seq, attentions, precisions, checkpointings, batch=args.batch,
                  layers=args.layers, steps=args.steps)


def _cell(v: Any) -> Any:
    from kernels.measure.store import neutralise

    return "" if v is None else neutralise(v)


def repredict(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> int:
    """Rewrite a training-step CSV's predictions from the current calc; returns the rows."""
    rows = read_rows(src)
    for r in rows:
        cfg = TrainConfig(r["model"], r["seq_len"], r["attention"], r["precision"],
                          bool(r["checkpointing"]), r["batch"] or 1, None)
        if cfg.model not in train_models.MODELS:
            continue
        d = train_models.hf_config(cfg.model, r["layers"])
        peak, before, _ = predict(cfg, d)
        r["predicted_peak_bytes"], r["predicted_before_bytes"] = peak, before
        r["peak_rel_error"] = ((peak - r["peak_bytes"]) / r["peak_bytes"]
                               if peak is not None and r["peak_bytes"] else None)
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\r\n")
        w.writerow(TRAIN_COLUMNS)
        for r in rows:
            w.writerow([_cell(r[c]) for c in TRAIN_COLUMNS])
    return len(rows)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repredict is not None:
        n = repredict(args.repredict, args.out)
        print(f"{n} training-step rows re-predicted from calc into {args.out}")
        return 0
    configs = configs_from_args(args)
    if args.list:
        for c in configs:
            print(c.label())
        print(f"{len(configs)} configurations")
        return 0
    from kernels.measure.child import GpuBusy

    args.out.parent.mkdir(parents=True, exist_ok=True)
    fh = open(args.out, "w", newline="")  # noqa: SIM115 - closed in finally
    writer = csv.writer(fh, lineterminator="\r\n")
    writer.writerow(TRAIN_COLUMNS)
    fh.flush()
    t0 = time.monotonic()
    store = TrainStore(args.db) if args.db else None
    run_id: int | None = None

    def on_result(res: TrainResult, i: int, n: int) -> None:
        nonlocal run_id
        row = res.to_row()
        writer.writerow([_cell(row[c]) for c in TRAIN_COLUMNS])
        fh.flush()
        if store is not None:
            if run_id is None:
                run_id = store.new_run(gpu=res.gpu, label=args.label or "command line")
            store.add_row(run_id, row)
        if not args.quiet:
            peak = f"peak {res.peak_bytes / 2**30:.2f} GiB" if res.peak_bytes else ""
            ms = f"{res.step_ms:.1f} ms" if res.step_ms else ""
            print(f"[{i + 1}/{n} {time.monotonic() - t0:6.1f}s] {res.model} {res.attention} "
                  f"{res.precision} ckpt={'on' if res.checkpointing else 'off'} s={res.seq_len}: "
                  f"{res.status} {peak} {ms} {res.message[:120] if res.status != 'ok' else ''}",
                  file=sys.stderr, flush=True)

    try:
        summary = run_train(configs, on_result=on_result, timeout_s=args.timeout,
                            budget_s=args.budget, lock_wait_s=args.lock_wait)
    except GpuBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: the rows measured so far are in {args.out}", file=sys.stderr)
        return 130
    except (sqlite3.Error, OSError) as exc:  # database locked or full, disk full, ...
        where = f"{args.db} (database)" if isinstance(exc, sqlite3.Error) else str(args.out)
        print(f"error: could not save a result to {where}: {exc}. The run stopped; the rows "
              f"saved before it are in {args.out}", file=sys.stderr)
        return 3
    finally:
        with contextlib.suppress(OSError):
            fh.close()
    counts: dict[str, int] = {}
    for r in summary.results:
        counts[r.status] = counts.get(r.status, 0) + 1
    print(f"{len(summary.results)} configurations in {summary.wall_s:.1f} s "
          f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}; "
          f"{summary.children_started} child process(es)); rows in {args.out}"
          + (f"; run {run_id} in {args.db}" if run_id is not None else ""))
    return 0


#: Public names of the helpers the inference harness (kernels.measure.infer_harness) shares
#: with this one: the same refusal rules, attention names, environment columns, child protocol
#: and command-line list parsing.
unavailable_error = _unavailable_error
attn_implementation = _attn_implementation
environment = _environment
short_error = _short
now_utc = _now
next_message = _next_message
words = _words
choices = _choices
ints = _ints


def _worker_entry() -> None:
    # The protocol owns the real stdout; anything a library prints goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker_main(sys.stdin, proto)


if __name__ == "__main__":
    if "--worker" in sys.argv[1:]:
        _worker_entry()
    else:
        sys.exit(main())
