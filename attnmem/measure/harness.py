"""Measure one attention call: peak extra memory, median time, TFLOP/s, and the model's error.

The procedure, step by step (``measure_point``); calc's peak model predicts what it measures:

1. Allocate the inputs first, fresh random normal (never zeros): q (B, H, s, d),
   k and v (B, H_kv, s, d); for forward+backward with requires_grad, and the upstream
   gradient dO (B, H, s, d) too.
2. Warm up: one full call (forward, or forward + backward) so that compilation, autotuning,
   cuBLAS/cuDNN handle and plan creation happen before anything is measured; free its outputs.
3. ``empty_cache()``, ``reset_peak_memory_stats()``, ``before = memory_allocated()``.
4. The call: forward under ``torch.no_grad()``; or forward and ``out.backward(dO)``, whose
   q.grad, k.grad, v.grad count in the peak.
5. ``peak_extra = max_memory_allocated() - before``; reserved bytes read too. Everything the
   call made is freed.
6. Time: ``triton.testing.do_bench`` median (CUDA events, after warm-up; grads set to None
   between repetitions), TFLOP/s from ``attnmem.calc.attention_flops``.
7. Prediction: ``attnmem.calc.attention_peak_bytes`` and the relative error
   (predicted - measured) / measured.

Out of memory (``torch.cuda.OutOfMemoryError``) is a result (status ``oom``), not a crash.
The statuses and the result row (``PointResult``, ``COLUMNS``) are defined once, in
``attnmem.measure.schema``, and re-exported here.

The device is an object (``CudaDevice``, or ``CpuDevice``/a fake for tests): memory counters,
synchronisation and timing live there, so the procedure itself runs on a CPU in the tests.
Like attention-gym's benchmark, configs and results are frozen dataclasses.
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from typing import Any

from attnmem.measure import registry
from attnmem.measure.schema import COLUMNS, STATUSES, PointResult

__all__ = ["COLUMNS", "STATUSES", "BenchOptions", "CpuDevice", "CudaDevice", "Environment",
           "PointConfig", "PointResult", "expand_points", "flops", "measure_point",
           "predict_bytes", "rel_error", "result_for"]


@dataclass(frozen=True)
class PointConfig:
    """One measurement point."""

    impl: str  # implementation name (attnmem.measure.registry.NAMES)
    batch: int  # B
    heads: int  # H, query heads
    seq_len: int  # s, queries = keys
    head_dim: int  # d
    dtype: str  # 'fp16' | 'bf16' | 'fp32'
    causal: bool = False  # top-left aligned causal mask
    backward: bool = False  # False: forward under no_grad; True: forward + backward(dO)
    kv_heads: int | None = None  # H_kv (GQA when < heads); None means heads

    @property
    def h_kv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def mode(self) -> str:
        return "fwd+bwd" if self.backward else "fwd"

    def label(self) -> str:
        gqa = f"/{self.h_kv}" if self.h_kv != self.heads else ""
        return (f"{self.impl} {self.mode} s={self.seq_len} B={self.batch} H={self.heads}{gqa} "
                f"d={self.head_dim} {self.dtype}{' causal' if self.causal else ''}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PointConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class Environment:
    """Where a result was measured."""

    gpu_name: str = ""  # torch.cuda.get_device_name(), or 'cpu'
    driver: str = ""  # NVIDIA driver version ('' if unknown)
    torch_version: str = ""
    triton_version: str = ""


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def result_for(cfg: PointConfig, status: str, env: Environment | None = None,
               **values: Any) -> PointResult:
    """A result row for cfg with the given status and values (shape fields filled in)."""
    env = env or Environment()
    return PointResult(
        impl=cfg.impl, batch=cfg.batch, heads=cfg.heads, kv_heads=cfg.h_kv,
        seq_len=cfg.seq_len, head_dim=cfg.head_dim, dtype=cfg.dtype, causal=bool(cfg.causal),
        backward=bool(cfg.backward), status=status, gpu_name=env.gpu_name, driver=env.driver,
        torch_version=env.torch_version, triton_version=env.triton_version,
        timestamp=now_utc(), **values,
    )


# --------------------------------------------------------------------------------------------
# The analytic side (calc): prediction and FLOPs. calc is pure; a missing name is a message.
# --------------------------------------------------------------------------------------------


def predict_bytes(cfg: PointConfig) -> tuple[int | None, str]:
    """attnmem.calc.attention_peak_bytes for cfg, or (None, why)."""
    try:
        from attnmem.calc import attention_peak_bytes
    except ImportError as exc:
        return None, f"no prediction: attnmem.calc.attention_peak_bytes missing ({exc})"
    try:
        return attention_peak_bytes(cfg.impl, cfg.batch, cfg.heads, cfg.seq_len, cfg.head_dim,
                                    cfg.dtype, causal=bool(cfg.causal),
                                    backward=bool(cfg.backward), kv_heads=cfg.kv_heads), ""
    except (ValueError, KeyError) as exc:
        return None, f"no prediction: {exc}"


def flops(cfg: PointConfig) -> int:
    """FLOPs of the point's call: attnmem.calc.attention_flops (forward 4·B·H·s²·d, half when causal;
    forward+backward 3.5×), the one copy of the convention."""
    from attnmem.calc import attention_flops

    return attention_flops(cfg.batch, cfg.heads, cfg.seq_len, cfg.head_dim,
                           causal=bool(cfg.causal), backward=bool(cfg.backward))


def rel_error(predicted: int | None, measured: int | None) -> float | None:
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


# --------------------------------------------------------------------------------------------
# Devices.
# --------------------------------------------------------------------------------------------


def _driver_version() -> str:
    try:
        import pynvml  # nvidia-ml-py, on the GPU image

        pynvml.nvmlInit()
        ver = pynvml.nvmlSystemGetDriverVersion()
        return ver.decode() if isinstance(ver, bytes) else str(ver)
    except Exception:  # noqa: BLE001 - fall back to nvidia-smi
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else ""
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def _versions() -> tuple[str, str]:
    import torch

    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = ""
    return torch.__version__, tv


class CudaDevice:
    """The real thing: torch.cuda's caching-allocator counters and triton's do_bench."""

    name = "cuda"

    def __init__(self, index: int = 0) -> None:
        import torch

        self.torch = torch
        self.index = index
        self._env: Environment | None = None

    def environment(self) -> Environment:
        if self._env is None:
            tv, trv = _versions()
            self._env = Environment(self.torch.cuda.get_device_name(self.index),
                                    _driver_version(), tv, trv)
        return self._env

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def empty_cache(self) -> None:
        self.torch.cuda.empty_cache()

    def reset_peak(self) -> None:
        self.torch.cuda.reset_peak_memory_stats()

    def allocated(self) -> int:
        return self.torch.cuda.memory_allocated()

    def max_allocated(self) -> int:
        return self.torch.cuda.max_memory_allocated()

    def reserved(self) -> int:
        return self.torch.cuda.memory_reserved()

    def max_reserved(self) -> int:
        return self.torch.cuda.max_memory_reserved()

    def total_bytes(self) -> int:
        return self.torch.cuda.get_device_properties(self.index).total_memory

    def elapsed(self, fn: Callable[[], Any]) -> float:
        """Milliseconds of one call of fn, between two CUDA events (synchronised)."""
        start = self.torch.cuda.Event(enable_timing=True)
        stop = self.torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        self.torch.cuda.synchronize()
        return float(start.elapsed_time(stop))

    def bench(self, fn: Callable[[], Any], grad_to_none: Sequence[Any] | None,
              warmup_ms: float, rep_ms: float) -> float:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none,
                              return_mode="median"))


class CpuDevice:
    """For tests and GPU-less machines: no allocator counters (reads 0), wall-clock timing."""

    name = "cpu"

    def environment(self) -> Environment:
        tv, trv = _versions()
        return Environment("cpu", "", tv, trv)

    def sync(self) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def reset_peak(self) -> None:
        pass

    def allocated(self) -> int:
        return 0

    def max_allocated(self) -> int:
        return 0

    def reserved(self) -> int:
        return 0

    def max_reserved(self) -> int:
        return 0

    def total_bytes(self) -> int:
        return 0

    def elapsed(self, fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def bench(self, fn: Callable[[], Any], grad_to_none: Sequence[Any] | None,
              warmup_ms: float, rep_ms: float) -> float:
        fn()
        times: list[float] = []
        deadline = time.perf_counter() + rep_ms / 1e3
        while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 1000):
            for t in grad_to_none or ():
                t.grad = None
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def default_device() -> CudaDevice | CpuDevice:
    import torch

    return CudaDevice() if torch.cuda.is_available() else CpuDevice()


def is_oom(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, or a library's allocation failure reported as RuntimeError."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text.lower() or "CUBLAS_STATUS_ALLOC_FAILED" in text
        or "CUDNN_STATUS_ALLOC_FAILED" in text)


def _short(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}"


# --------------------------------------------------------------------------------------------
# The procedure.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchOptions:
    """How hard to time (do_bench arguments are milliseconds of GPU time)."""

    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    time_it: bool = True  # False: memory only
    slow_call_ms: float = 25.0  # a call at least this long is timed by 3 event-timed calls
    max_predicted_bytes: int | None = None  # skip points predicted above this (status 'skipped')


def measure_point(cfg: PointConfig, *, device: Any = None,
                  impl: registry.Implementation | None = None,
                  options: BenchOptions | None = None) -> PointResult:
    """Measure one point (see the module docstring). Never raises for OOM or a refusal.

    ``impl`` injects an implementation (tests); otherwise the registry's, after its
    availability check. ``device`` defaults to CUDA when there is a GPU, else the CPU.
    """
    t0 = time.perf_counter()
    res = _measure_point(cfg, device, impl, options)
    return replace(res, wall_s=round(time.perf_counter() - t0, 4))


def _measure_point(cfg: PointConfig, device: Any, impl: registry.Implementation | None,
                   options: BenchOptions | None) -> PointResult:
    import torch

    options = options or BenchOptions()
    device = device or default_device()
    env = device.environment()
    predicted, pred_msg = predict_bytes(cfg)
    try:
        dtype = registry.canonical_dtype(cfg.dtype)
    except ValueError as exc:
        return result_for(cfg, "error", env, message=str(exc), predicted_bytes=predicted)
    if cfg.heads % cfg.h_kv:
        return result_for(cfg, "error", env, predicted_bytes=predicted,
                          message=f"heads ({cfg.heads}) must be a multiple of kv_heads ({cfg.h_kv})")
    notes = [pred_msg] if pred_msg else []
    if impl is None:
        ok, why = registry.available(cfg.impl, dtype, cfg.head_dim, causal=cfg.causal,
                                     backward=cfg.backward, heads=cfg.heads,
                                     kv_heads=cfg.h_kv, device=device.name)
        if not ok:
            return result_for(cfg, "unavailable", env, message=why, predicted_bytes=predicted)
        if why:
            notes.append(why)
        impl = registry.get(cfg.impl, dtype=dtype, head_dim=cfg.head_dim, causal=cfg.causal,
                            backward=cfg.backward, gqa=cfg.h_kv != cfg.heads, device=device.name)
    limit = options.max_predicted_bytes
    if limit is not None and predicted is not None and predicted > limit:
        return result_for(cfg, "skipped", env, predicted_bytes=predicted,
                          message=f"predicted peak {predicted / 1e9:,.1f} GB exceeds the "
                                  f"sweep's limit of {limit / 1e9:,.1f} GB: not run")
    tdt = registry.torch_dtype(dtype)
    dev = "cuda" if device.name == "cuda" else "cpu"
    b, h, hkv, s, d = cfg.batch, cfg.heads, cfg.h_kv, cfg.seq_len, cfg.head_dim
    fn = impl.fn
    causal = bool(cfg.causal)
    state: dict[str, Any] = {}
    try:
        # 1. Inputs first, fresh random normal.
        state["q"] = torch.randn(b, h, s, d, device=dev, dtype=tdt)  # (B, H, s, d)
        state["k"] = torch.randn(b, hkv, s, d, device=dev, dtype=tdt)  # (B, H_kv, s, d)
        state["v"] = torch.randn(b, hkv, s, d, device=dev, dtype=tdt)  # (B, H_kv, s, d)
        if cfg.backward:
            for name in ("q", "k", "v"):
                state[name].requires_grad_(True)
            state["do"] = torch.randn(b, h, s, d, device=dev, dtype=tdt)  # (B, H, s, d)
        t = state  # the closures read the tensors from here, so clearing it frees them

        if cfg.backward:

            def call() -> None:
                out = fn(t["q"], t["k"], t["v"], causal, None)
                out.backward(t["do"])
        else:

            def call() -> None:
                with torch.no_grad():
                    fn(t["q"], t["k"], t["v"], causal, None)

        def clear_grads() -> None:
            for name in ("q", "k", "v"):
                if name in t:
                    t[name].grad = None

        # 2. Warm-up (compile, autotune, handles), then free what it made.
        call()
        device.sync()
        clear_grads()
        # 3. Clean allocator, reset peak, read 'before'.
        gc.collect()
        device.empty_cache()
        device.sync()
        device.reset_peak()
        before = device.allocated()
        reserved_before = device.reserved()
        # 4. The call (timed with device events: one sample of its time, for free).
        first_ms = device.elapsed(call)
        # 5. Read the peak; the grads (still alive) are part of it.
        peak_extra = device.max_allocated() - before
        reserved = device.max_reserved()
        clear_grads()
    except Exception as exc:  # noqa: BLE001 - OOM is a result; anything else is an 'error' row
        status = "oom" if is_oom(exc) else "error"
        message = _short(exc)
        del exc
        state.clear()
        gc.collect()
        device.empty_cache()
        return result_for(cfg, status, env, predicted_bytes=predicted,
                          message="; ".join([message] + notes))

    median_ms = tflops = None
    if options.time_it:
        try:
            if first_ms >= options.slow_call_ms:
                # A slow call needs no statistics from do_bench's many repetitions (it would
                # run at least 8): the median of three event-timed calls is within noise.
                samples = [first_ms]
                for _ in range(2):
                    samples.append(device.elapsed(call))
                    clear_grads()
                median_ms = statistics.median(samples)
                notes.append(f"time: median of 3 calls (one call >= {options.slow_call_ms:g} ms)")
            else:
                median_ms = device.bench(call, [t["q"], t["k"], t["v"]] if cfg.backward else None,
                                         options.warmup_ms, options.rep_ms)
            tflops = flops(cfg) / (median_ms * 1e-3) / 1e12 if median_ms > 0 else None
        except Exception as exc:  # noqa: BLE001 - memory stands; the time is missing, say why
            notes.append(f"timing failed ({'oom' if is_oom(exc) else 'error'}): {_short(exc, 200)}")
            del exc
        clear_grads()
    state.clear()
    device.empty_cache()
    measured = peak_extra if device.name == "cuda" or peak_extra else None
    return result_for(
        cfg, "ok", env, median_ms=median_ms, tflops=tflops, peak_extra_bytes=measured,
        reserved_bytes=reserved if measured is not None else None,
        reserved_extra_bytes=(reserved - reserved_before) if measured is not None else None,
        before_bytes=before if measured is not None else None, predicted_bytes=predicted,
        rel_error=rel_error(predicted, measured), message="; ".join(n for n in notes if n),
    )


def expand_points(impls: Sequence[str], seq_lens: Sequence[int], *, batch: int = 1,
                  heads: int = 32, head_dim: int = 128, dtypes: Sequence[str] = ("fp16",),
                  causals: Sequence[bool] = (False,), backwards: Sequence[bool] = (False,),
                  kv_heads: int | None = None, head_dims: Sequence[int] | None = None,
                  ) -> list[PointConfig]:
    """The cross product, ordered so that each implementation's lengths run short to long."""
    points = []
    for dt in dtypes:
        for hd in (head_dims or (head_dim,)):
            for bwd in backwards:
                for causal in causals:
                    for name in impls:
                        for s in seq_lens:
                            points.append(PointConfig(name, batch, heads, int(s), hd, dt,
                                                      bool(causal), bool(bwd), kv_heads))
    return points
