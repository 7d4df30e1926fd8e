"""The bench's implementations: what each name calls and how one call is timed.

``impl_fn(name)`` is an implementation's call on (B, H, s, d) tensors: ours through
``flash_attention`` with the ``KernelConfig`` its name forces (``CONFIGS``, which the packed
calls pass too), the SDPA backends and FlashAttention-4 through the registry
(attnmem.measure.registry). ``measure`` times one
implementation on one shape (and checks its output against the reference first), ``combine``
joins the rounds of one implementation on one shape. The dense grid
(attnmem.measure.bench.speed) and the packed batches (attnmem.measure.bench.training) both
time through these.
"""

from __future__ import annotations

import math

from attnmem.kernels.flash.config import KernelConfig
from attnmem.measure import registry

__all__ = ["CONFIGS", "GENERIC", "IMPLS", "NATIVE_BSHD", "PORTABLE_BWD", "REL_ERR_MAX", "SM90",
           "SM90_3WG", "SM90_BWD", "combine", "impl_fn", "measure"]

# "triton" is what flash_attention runs by default (on Hopper: the Gluon forward at d = 128,
# and at d = 64 past 2,048/4,096 with three warpgroups; the Gluon backward where
# attnmem.kernels.flash.route.backward_route picks it, else the Triton backward);
# "triton_generic" is the portable Triton forward on the same GPU; "triton_sm90" the Gluon
# forward forced (with its own schedule; d = 80 and 96 run it only so); "triton_sm90_3wg" the
# three-warpgroup Gluon forward forced at every length (d = 64); "triton_sm90_bwd" the default
# forward with the Hopper Gluon backward forced (KernelConfig(sm90_bwd=True): where it cannot
# run, the row says why); "triton_portable_bwd" the default forward with the portable Triton
# backward (KernelConfig(sm90_bwd=False): beside "triton", it times the Hopper backward against
# the portable one, packed batches included). The SDPA backends and "fa4"
# (FlashAttention-4) are the registry's implementations (attnmem.measure.registry).
IMPLS = ("triton", "triton_generic", "triton_sm90", "triton_sm90_3wg", "triton_sm90_bwd", "triton_portable_bwd",
         "sdpa_cudnn", "sdpa_flash", "fa4", "sdpa_efficient", "sdpa_math")
#: "triton_sm90_3wg": the Hopper forward forced, with three consumer warpgroups and two stages.
SM90_3WG = KernelConfig(sm90=True, sm90_consumers=3, sm90_stages=2)
#: "triton_sm90": the Hopper forward forced, its schedule per head dim.
SM90 = KernelConfig(sm90=True)
#: "triton_generic": the portable Triton forward.
GENERIC = KernelConfig(sm90=False)
#: "triton_sm90_bwd": the Hopper backward forced; "triton_portable_bwd": the portable one.
SM90_BWD = KernelConfig(sm90_bwd=True)
PORTABLE_BWD = KernelConfig(sm90_bwd=False)
#: The KernelConfig each of our implementations passes (None: the route's own choices).
CONFIGS = {"triton": None, "triton_generic": GENERIC, "triton_sm90": SM90, "triton_sm90_3wg": SM90_3WG,
           "triton_sm90_bwd": SM90_BWD, "triton_portable_bwd": PORTABLE_BWD}
#: Implementations timed on their own (B, s, H, d) layout: speed.run_grid gives them q, k, v as
#: contiguous (B, s, H, d) leaves, so their gradients need no copy into a (B, H, s, d) layout
#: and the time is the kernels' (as the H200 anchor figures timed FA4).
NATIVE_BSHD = ("fa4",)
# Relative L2 error of an output against cuDNN's above which a timing is not reported: 16-bit
# rounding gives about 1e-3 (bf16) here; a kernel that skips keys gives O(1).
REL_ERR_MAX = 2e-2
GRAPHS = False  # --graphs: time calls as CUDA-graph replays (GPU time only)


def impl_fn(name: str):
    """fn(q, k, v, causal) -> out on (B, H, s, d) tensors for a bench implementation name."""
    if name in registry.SDPA_BACKENDS:
        # the registry's call: the backend forced through sdpa_kernel (enable_gqa for GQA)
        fn = registry.make_sdpa(name, gqa_native=True)
        return lambda q, k, v, causal: fn(q, k, v, causal, None)
    if name in NATIVE_BSHD:
        # FlashAttention-4 on its own (B, s, H, d) tensors (speed.run_grid passes them), the output
        # seen as (B, H, s, d) for the accuracy check against the reference (a view)
        return lambda q, k, v, causal: registry.fa4_native(q, k, v, causal).transpose(1, 2)
    if name == "triton":
        from attnmem.kernels.flash.api import flash_attention

        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal)
    if name == "triton_generic":
        from attnmem.kernels.flash.api import flash_attention

        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal, config=GENERIC)
    if name == "triton_sm90":
        from attnmem.kernels.flash.api import flash_attention
        from attnmem.kernels.flash.config import SETTINGS

        # a bench tool may turn on the forms not yet run on a GPU (d = 80, 96 in 128-wide
        # tiles): measuring them is how they get checked
        SETTINGS.sm90_padded_dims = True
        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal, config=SM90)
    if name == "triton_sm90_3wg":
        from attnmem.kernels.flash.api import flash_attention

        def three(q, k, v, causal):
            if q.shape[-1] != 64:
                raise RuntimeError("three consumer warpgroups: not supported at head dim "
                                   f"{q.shape[-1]} (d = 64 only)")
            return flash_attention(q, k, v, causal=causal, config=SM90_3WG)

        return three
    if name in ("triton_sm90_bwd", "triton_portable_bwd"):
        from attnmem.kernels.flash.api import flash_attention

        forced = SM90_BWD if name == "triton_sm90_bwd" else PORTABLE_BWD
        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal, config=forced)
    raise KeyError(f"unknown bench implementation {name!r}; known: {', '.join(IMPLS)}")


def measure(name, q, k, v, do, causal, mode, ref, fn=None):
    """(median_ms, rel_err, status) of one implementation on one shape; ``fn(q, k, v, causal)``
    instead of the implementation's dense call where given (the packed batches')."""
    import torch
    from triton.testing import do_bench

    fn = impl_fn(name) if fn is None else fn
    try:
        with torch.no_grad():
            out = fn(q, k, v, causal)
        rel = float((out.float() - ref).norm() / ref.norm()) if ref is not None else math.nan
        if mode == "fwd":
            def call():
                with torch.no_grad():
                    fn(q, k, v, causal)
        else:
            def call():
                fn(q, k, v, causal).backward(do)
        if GRAPHS:
            # Replay of a CUDA graph holding one call: the GPU time of the kernels without the
            # host's share (Python, autograd, argument checks, launches), for every
            # implementation alike. Warm-up on a side stream first (autograd's lazy state),
            # and the gradients start unset so that the captured backward writes them afresh.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    call()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            for t in (q, k, v):
                t.grad = None
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
            ms = do_bench(graph.replay, warmup=25, rep=100, return_mode="median")
        else:
            ms = do_bench(call, warmup=25, rep=100, grad_to_none=[q, k, v], return_mode="median")
        if ref is not None:  # the timed path must be right too, not only the first call
            with torch.no_grad():
                again = float((fn(q, k, v, causal).float() - ref).norm() / ref.norm())
            rel = max(rel, again)
            if not rel <= REL_ERR_MAX:
                return math.nan, rel, f"wrong: rel err {rel:.2g}"
        return ms, rel, "ok"
    except torch.OutOfMemoryError:
        return math.nan, math.nan, "oom"
    except ImportError:  # an optional implementation (fa4) that is not installed
        return math.nan, math.nan, "unavailable"
    except ValueError:  # a shape the implementation refuses by its rules (fa4_attention)
        return math.nan, math.nan, "unsupported"
    except (RuntimeError, AssertionError) as exc:  # FA4 checks its arguments with assert
        msg = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        status = "unsupported" if "No available kernel" in msg or "not support" in msg else msg
        return math.nan, math.nan, status
    finally:
        torch.cuda.empty_cache()


def combine(results: list[tuple[float, float, str]]) -> tuple[float, float, str]:
    """One (ms, rel_err, status) from the rounds of one implementation on one shape: the
    median of the rounds' times and the worst error; the first failing round's status (and
    no time) if any round failed."""
    for _ms, rel, status in results:
        if status != "ok":
            return math.nan, rel, status
    times = sorted(r[0] for r in results)
    mid = len(times) // 2
    ms = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
    rels = [r[1] for r in results if not math.isnan(r[1])]
    return ms, (max(rels) if rels else math.nan), "ok"
