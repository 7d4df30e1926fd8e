# Measured: Hopper Gluon backward gradients and time vs reference and Triton (H200).
"""GPU check of the Hopper (Gluon) backward, attnmem.kernels.flash.bwd_sm90: correctness, then speed.

    python -m attnmem.kernels.dev.bwd_sm90_check [--quick] [--skip-check] [--reps N]

1. Correctness on a handful of shapes (ragged lengths, causal and not, GQA, fp16 and bf16,
   d = 64 and 128): the max abs error of dQ, dK, dV against the fp32 eager reference
   (attnmem.kernels.flash.reference), next to the errors of the current Triton backward
   (attnmem.kernels.flash.bwd) and of plain PyTorch in the low precision on the same inputs. PASS
   where the new error is at most twice the eager low-precision one plus a floor.
2. Speed of forward + backward (bf16, B = 1, H = 32, eager, issue 18's shapes), all in this
   process with CUDA events (warm-up first, median of --reps): our forward with the current
   backward (attnmem.kernels.flash.api.flash_attention), our forward with the new backward (a small
   autograd wrapper, `SM90Attention`), cuDNN (SDPA, CUDNN_ATTENTION), FA2 (SDPA,
   FLASH_ATTENTION) and FA4 (flash_attn.cute.flash_attn_func) where it imports. TFLOP/s count
   3.5 x 4 B H s^2 d (halved when causal); ratios are the new backward's against each. The
   backward alone (new and current) is timed too, and at every timing shape the new
   gradients are compared with the current backward's (max abs difference), as a sanity
   check where the reference is too large to run. A second line per shape splits ours
   (new, current) into milliseconds: the autograd forward, autograd's backward of a saved
   graph, their sum against the measured fwd+bwd, the backward called directly, and the host
   time of one backward call (kernels queued, not waited for). An alternative schedule of the
   new backward (`ALTERNATIVE`: three stages at d = 128; run through attnmem.kernels.dev.ab_bwd.variant) is
   checked and timed beside its default.

--quick: four correctness shapes (bf16, H = 32: the kernels compiled there serve the timing
too), and d = 128 s = 4096 full and causal, d = 64 s = 8192 causal timed with only
`ALTERNATIVE` as a variant (aimed at under 90 s with compiles, FA4's included; each phase
prints its seconds).
Without it: under 3 minutes on one H200 (torch 2.11, triton 3.6).
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from attnmem.calc import attention_flops
from attnmem.kernels.dev.ab_bwd import variant
from attnmem.kernels.dev.grad_check import CHECK_SHAPES, FLOOR, reference_grads

# ---- the new backward behind autograd ---------------------------------------------------------


class SM90Attention(torch.autograd.Function):
    """Our forward (attnmem.kernels.flash.route.attention_forward) and the Gluon backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float):
        from attnmem.kernels.flash.route import attention_forward

        o, lse2 = attention_forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        from attnmem.kernels.flash.bwd_sm90 import attention_backward_sm90

        q, k, v, o, lse2 = ctx.saved_tensors
        dq, dk, dv = attention_backward_sm90(do, q, k, v, o, lse2, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None


def ours_new(q, k, v, causal):
    return SM90Attention.apply(q, k, v, causal, 1.0 / math.sqrt(q.shape[-1]))


def ours_current(q, k, v, causal):
    from attnmem.kernels.flash.api import flash_attention

    return flash_attention(q, k, v, causal=causal)


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                  enable_gqa=k.shape[1] != q.shape[1])
    return run


def _fa4():
    """FA4's function on (B, H, s, d) inputs (it takes (B, s, H, d)), or None."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # not installed, or no build for this GPU
        print(f"FA4: not importable ({type(e).__name__}: {str(e)[:120]})")
        return None

    def run(q, k, v, causal):
        out = flash_attn_func(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out
    return run


# ---- correctness --------------------------------------------------------------------------------

# The check runs grad_check.CHECK_SHAPES; --quick checks these instead: bf16, B = 1, H = 32 (the timing shapes' heads, so that the
# timing reuses the kernels compiled here: Triton specializes the head counts, not s), ragged
# lengths; d = 64 above 4,096 (the length where the forward turns to fwd_sm90 when causal).
QUICK_CHECK_SHAPES = [
    (1, 32, 32, 1000, 128, False, torch.bfloat16),
    (1, 32, 32, 780, 128, True, torch.bfloat16),
    (1, 32, 32, 4100, 64, True, torch.bfloat16),
    (1, 32, 8, 780, 128, True, torch.bfloat16),  # GQA 4:1
]

# Another schedule of the new backward by head dim, checked and timed beside its default
# (attnmem.kernels.dev.ab_bwd.schedule; the flat dQ staging takes only the 64 x 64 partial of the default
# block_m and dq_split_d). None at d = 64: a third stage does not fit in shared memory there.
ALTERNATIVE = {128: {"stages": 3}}


def check(quick: bool = False) -> bool:
    """Max errors against the fp32 reference: the new backward's (its default, then
    `ALTERNATIVE`, tagged as the timing's variants are), the current backward's, and plain PyTorch's in the low precision
    ("eager"). PASS where the new error is at most twice the eager one plus a floor (the rule
    of tests/kernels/test_flash_attention.py)."""
    from attnmem.kernels.flash import bwd_sm90
    from attnmem.kernels.flash.route import attention_forward

    try:
        from attnmem.kernels.flash.route import attention_backward
    except Exception as e:  # the current backward is only a point of comparison here
        print(f"(current backward unavailable: {type(e).__name__}: {e})")
        attention_backward = None
    ok = True
    print("== correctness: max |grad - fp32 reference|  new [its alternative] / "
          "current / eager low precision", flush=True)
    shapes = QUICK_CHECK_SHAPES if quick else CHECK_SHAPES
    for B, H, H_kv, s, d, causal, dtype in shapes:
        torch.manual_seed(0)
        q = torch.randn(B, H, s, d, device="cuda", dtype=dtype)
        k = torch.randn(B, H_kv, s, d, device="cuda", dtype=dtype)
        v = torch.randn(B, H_kv, s, d, device="cuda", dtype=dtype)
        do = torch.randn(B, H, s, d, device="cuda", dtype=dtype)
        scale = 1.0 / math.sqrt(d)
        name = (f"B={B} H={H} H_kv={H_kv} s={s} d={d} {'causal' if causal else 'full'} "
                f"{str(dtype)[6:]}")
        try:
            if not bwd_sm90.usable(q, k, v):
                print(f"{name}: NOT USABLE")
                ok = False
                continue
            o, lse2 = attention_forward(q, k, v, causal, scale)
            new = bwd_sm90.attention_backward_sm90(do, q, k, v, o, lse2, causal, scale)
            alt = variant(bwd_sm90, ALTERNATIVE.get(d, {}))(do, q, k, v, o, lse2, causal,
                                                             scale)
            torch.cuda.synchronize()
        except Exception as e:
            print(f"{name}: ERROR {type(e).__name__}: {str(e)[:1500]}")
            traceback.print_exc()
            ok = False
            continue
        cur = None
        if attention_backward is not None:
            try:
                cur = attention_backward(do, q, k, v, o, lse2, causal, scale)
            except Exception as e:
                print(f"  (current backward failed: {type(e).__name__}: {str(e)[:200]})")
        ref = reference_grads(q.float(), k.float(), v.float(), do.float(), causal, scale)
        low = reference_grads(q, k, v, do, causal, scale)
        parts = []
        tag = "/".join(f"{TAGS[key]}{int(val)}" for key, val in ALTERNATIVE.get(d, {}).items())
        for i, gname in enumerate(("dq", "dk", "dv")):
            ea = (new[i].float() - ref[i]).abs().max().item()
            eb = (alt[i].float() - ref[i]).abs().max().item()
            ec = float("nan") if cur is None else (cur[i].float() - ref[i]).abs().max().item()
            el = (low[i].float() - ref[i]).abs().max().item()
            good = all(math.isfinite(e) and e <= 2 * el + FLOOR[dtype] for e in (ea, eb))
            ok &= good
            parts.append(f"{gname} {ea:.2e} [{tag} {eb:.2e}]/{ec:.2e}/{el:.2e}"
                         f"{'' if good else ' FAIL'}")
        print(f"{name}: " + ", ".join(parts), flush=True)
    print("correctness:", "PASS" if ok else "FAIL", flush=True)
    return ok


# ---- timing -----------------------------------------------------------------------------------

TIME_SHAPES = [
    # H, H_kv, s, d, causal  (B = 1, bf16)
    (32, 32, 4096, 128, False),
    (32, 32, 4096, 128, True),
    (32, 32, 16384, 128, False),
    (32, 32, 16384, 128, True),
    (32, 32, 8192, 64, True),
    (32, 32, 8192, 64, False),
    (32, 8, 8192, 128, True),
]
QUICK_TIME = (0, 1, 4)  # --quick: d = 128 s = 4096 full and causal, d = 64 s = 8192 causal
# Further settings of the new backward timed alone at each shape, by head dim (the defaults
# are bwd_sm90.TILES and bwd_sm90.DQ_SPLIT_D).
# Tags in the output: b = block_m, s = stages, x = dq_split_d.
# `ALTERNATIVE` is timed at every shape, --quick included; these only without --quick.
# All compile for sm_90 within the shared-memory limit.
EXTRA_VARIANTS = {64: [], 128: []}
TAGS = {"block_m": "b", "stages": "s", "dq_split_d": "x"}
# The issue's numbers (TFLOP/s, fwd+bwd) for the first five shapes and the GQA one, for the eye.
ISSUE = {"ours": [400, 329, 425, 421, 334, None, 379], "cuDNN": [530, 448, 545, 544, 407, None,
         499], "FA4": [588, 509, 632, 607, 493, None, 564]}


def _median_ms(fn, reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _fwd_bwd(impl, q, k, v, do, causal):
    def run():
        out = impl(q, k, v, causal)
        torch.autograd.grad(out, (q, k, v), do)
    return run


def _split_ms(impl, q, k, v, do, causal, reps: int) -> dict:
    """The parts of one implementation's fwd+bwd, each timed on its own with CUDA events
    (GPU time from an idle GPU, so a part's host time before its first kernel counts):
    fwd (the autograd forward, saving for the backward), bwd (autograd's backward of one
    saved graph, retain_graph), and host ms of one backward call (the time until the call
    returns, kernels queued but not waited for: where it approaches the forward's GPU time,
    fwd+bwd stalls on the host)."""
    fwd = _median_ms(lambda: impl(q, k, v, causal), reps)
    out = impl(q, k, v, causal)
    bwd = _median_ms(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), reps)
    hosts = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        hosts.append((time.perf_counter() - t) * 1e3)
    torch.cuda.synchronize()
    return {"fwd": fwd, "bwd": bwd, "host": statistics.median(hosts)}


def _time_shape(impls: dict, H: int, H_kv: int, s: int, d: int, causal: bool, reps: int,
                quick: bool = False) -> str:
    """Two lines of the timing table: TFLOP/s and ratios; the milliseconds of each part."""
    from attnmem.kernels.flash import bwd_sm90
    from attnmem.kernels.flash.route import attention_forward

    try:
        from attnmem.kernels.flash.route import attention_backward
    except Exception:  # reported below, where it is called
        attention_backward = None
    B, dt = 1, torch.bfloat16
    torch.manual_seed(0)
    q = torch.randn(B, H, s, d, device="cuda", dtype=dt, requires_grad=True)
    k = torch.randn(B, H_kv, s, d, device="cuda", dtype=dt, requires_grad=True)
    v = torch.randn(B, H_kv, s, d, device="cuda", dtype=dt, requires_grad=True)
    do = torch.randn(B, H, s, d, device="cuda", dtype=dt)
    flops = attention_flops(B, H, s, d, causal, backward=True)
    bwd_flops = flops - attention_flops(B, H, s, d, causal)  # the backward alone: 2.5 x forward
    name = f"H={H}/{H_kv} s={s} d={d} {'causal' if causal else 'full'}"
    tf, ms = {}, {}
    for n, impl in impls.items():
        try:
            if n == "FA4":  # (B, s, H, d) inputs
                qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_(True)
                              for t in (q, k, v))
                fn = _fwd_bwd(impl, qt, kt, vt, do.transpose(1, 2).contiguous(), causal)
            else:
                fn = _fwd_bwd(impl, q, k, v, do, causal)
            ms[n] = _median_ms(fn, reps)
            tf[n] = flops / (ms[n] * 1e-3) / 1e12
        except Exception as e:
            print(f"  {n} at {name}: {type(e).__name__}: {str(e)[:300]}")
            tf[n], ms[n] = float("nan"), float("nan")
    # where fwd+bwd goes, for ours (new, current): fwd, bwd through autograd, host of the bwd
    split = {}
    for n in ("new", "current"):
        try:
            split[n] = _split_ms(impls[n], q, k, v, do, causal, reps)
        except Exception as e:
            print(f"  {n} split at {name}: {type(e).__name__}: {str(e)[:300]}")
            split[n] = {"fwd": float("nan"), "bwd": float("nan"), "host": float("nan")}
    # the backward alone, and the new gradients against the current backward's
    scale = 1.0 / math.sqrt(d)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    o, lse2 = attention_forward(qd, kd, vd, causal, scale)
    args = (do, qd, kd, vd, o, lse2, causal, scale)
    try:
        ms_new = _median_ms(lambda: bwd_sm90.attention_backward_sm90(*args), reps)
        new = bwd_sm90.attention_backward_sm90(*args)
    except Exception as e:
        print(f"  new backward at {name}: {type(e).__name__}: {str(e)[:300]}")
        ms_new, new = float("nan"), None
    try:
        ms_cur = _median_ms(lambda: attention_backward(*args), reps)
        cur = attention_backward(*args)
    except Exception as e:
        print(f"  current backward at {name}: {type(e).__name__}: {str(e)[:300]}")
        ms_cur, cur = float("nan"), None
    diff = float("nan") if new is None or cur is None else max(
        (a.float() - c.float()).abs().max().item() for a, c in zip(new, cur, strict=True))

    # other (BLOCK_M, stages) of the new backward, the backward alone (they compile on first use)
    others = []
    variants = [ALTERNATIVE[d]] if d in ALTERNATIVE else []
    if not quick:
        variants += EXTRA_VARIANTS.get(d, [])
    for kw in variants:
        tag = "/".join(f"{TAGS[key]}{int(val)}" for key, val in kw.items())
        try:
            t = _median_ms(lambda kw=kw: variant(bwd_sm90, kw)(*args), reps)
            others.append(f"{tag} {t:.2f}")
        except Exception as e:
            others.append(f"{tag} {type(e).__name__}")

    def ratio(a, b):
        ok = b in tf and tf[b] == tf[b] and tf[b] > 0
        return f"{tf[a] / tf[b]:.2f}" if ok else "n/a"
    line = name.ljust(34) + "".join(f"{tf[n]:9.0f}" for n in impls)
    line += (f"  {ratio('new', 'current'):>7} {ratio('new', 'cuDNN'):>9} "
             f"{ratio('new', 'FA4'):>7}  {ms_new:6.2f}/{ms_cur:6.2f}"
             f" ({bwd_flops / ms_new / 1e9:.0f}/{bwd_flops / ms_cur / 1e9:.0f} TF)"
             f"  {diff:.2e}")
    if others:
        line += "  | bwd ms " + ", ".join(others)
    parts = []
    for n in ("new", "current"):
        sp = split[n]
        parts.append(f"{n}: fwd {sp['fwd']:.2f} + bwd {sp['bwd']:.2f} = "
                     f"{sp['fwd'] + sp['bwd']:.2f} vs fwd+bwd {ms[n]:.2f} "
                     f"(bwd direct {ms_new if n == 'new' else ms_cur:.2f}, "
                     f"bwd host {sp['host']:.2f})")
    line += "\n    ms " + "; ".join(parts)
    return line


def timing(reps: int, quick: bool) -> None:
    from torch.nn.attention import SDPBackend

    impls = {"new": ours_new, "current": ours_current,
             "cuDNN": _sdpa(SDPBackend.CUDNN_ATTENTION), "FA2": _sdpa(SDPBackend.FLASH_ATTENTION)}
    fa4 = _fa4()
    if fa4 is not None:
        impls["FA4"] = fa4
    shapes = [TIME_SHAPES[i] for i in QUICK_TIME] if quick else TIME_SHAPES
    print("\n== fwd+bwd TFLOP/s (bf16, B=1), 3.5 x 4 B H s^2 d, halved when causal; "
          f"median of {reps}")
    head = "shape".ljust(34) + "".join(n.rjust(9) for n in impls)
    head += ("  new/cur new/cuDNN new/FA4  bwd ms new/cur (bwd TFLOP/s, 2.5 x 4 B H s^2 d)"
             "  max|new-cur|  | other settings, bwd ms\n    ms (new, current): autograd fwd"
             " + autograd bwd = sum vs measured fwd+bwd (bwd called directly, host ms of a bwd)")
    print(head)
    for shape in shapes:
        t0 = time.time()
        print(_time_shape(impls, *shape, reps, quick), f"  [{time.time() - t0:.0f} s]",
              flush=True)
        torch.cuda.empty_cache()
    print("issue 18 (H200, for the eye): ours", ISSUE["ours"], "cuDNN", ISSUE["cuDNN"],
          "FA4", ISSUE["FA4"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="four correctness shapes (bf16), three timing shapes, one variant")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--watchdog", type=int, default=420,
                    help="seconds after which the run dumps its stacks and exits (a hung kernel)")
    args = ap.parse_args()
    # A kernel that deadlocks on its barriers would hold the GPU until killed from outside:
    # give up with a stack dump instead.
    faulthandler.dump_traceback_later(args.watchdog, exit=True)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    import triton

    print(f"torch {torch.__version__}, triton {triton.__version__}, "
          f"{torch.cuda.get_device_name()}")
    t0 = time.time()
    ok = True
    if not args.skip_check:
        ok = check(args.quick)
        print(f"(correctness took {time.time() - t0:.0f} s)")
    timing(args.reps, args.quick)
    print(f"total {time.time() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
