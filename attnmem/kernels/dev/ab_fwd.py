# Measured: Hopper Gluon forward time, default vs stage/key-block/warpgroup variants (H200).
"""A/B timing of the Hopper (Gluon) forward: its default against settings of it, in one
process, on a GPU (the forward's twin of attnmem.kernels.dev.ab_bwd).

    python -m attnmem.kernels.dev.ab_fwd --variant NAME:KEY=VAL[,KEY=VAL...] [--variant ...]
        [--shapes B/H/H_KV/S/D/CAUSAL ...] [--rounds 3] [--fa4] [--skip-check]

    e.g.  --variant s3:stages=3 --variant wg2:consumers=2

KEY is a keyword of `attnmem.kernels.flash.fwd_sm90.attention_forward_sm90` (`SETTINGS`), VAL a whole
number. "base" is the forward as `attnmem.kernels.flash.route.attention_forward` runs it by default at
that shape's head dim in this kernel (`fwd_sm90.default_schedule`: at d = 64 three consumer
warpgroups, two stages), and each variant is that schedule with its settings on top.

1. Correctness of every candidate on a few shapes (ragged, causal and not, GQA, fp16 and bf16,
   d = 64 and 128): max |O - fp32 reference| and |lse2 - reference|; PASS where the output's
   error is at most twice plain PyTorch's low-precision one plus a floor (the rule of
   tests/kernels/test_flash_attention.py) and lse2's below 1e-3. Timing runs only if all pass.
2. Time of one forward call per candidate, triton.testing.do_bench's median with L2 flushed,
   ``--rounds`` interleaved rounds, the best kept; ``--fa4`` adds FlashAttention-4's forward.
   TFLOP/s count 4 B H s^2 d (halved when causal). Then each candidate against the base (and
   FA4) per shape, with the geometric mean (attnmem.kernels.dev.ab_bwd.summary).
"""

from __future__ import annotations

import argparse
import functools
import math

from attnmem.kernels.dev.ab_bwd import (
    add_timing_args,
    best_of_rounds,
    parse_variant,
    require_hopper,
    summary,
)

SETTINGS = {"stages": (2, 3), "consumers": (2, 3)}
# B/H/H_KV/S/D/CAUSAL, bf16: issue 18's forward shapes (d = 64 at 8,192, d = 128, B = 8 at 1,024)
DEFAULT_SHAPES = ["1/32/32/8192/64/1", "1/32/32/8192/64/0", "1/32/32/4096/128/0",
                  "1/32/32/4096/128/1", "1/32/32/16384/128/0", "8/32/32/1024/128/1",
                  "8/32/32/1024/128/0"]
CHECK_SHAPES = [  # B, H, H_kv, s, d, causal, dtype name
    (1, 4, 4, 1000, 128, False, "bf16"), (2, 8, 2, 780, 128, True, "fp16"),
    (1, 4, 4, 4100, 64, True, "bf16"), (1, 8, 2, 1536, 64, False, "fp16"),
    (1, 4, 4, 4096, 128, True, "bf16")]


def parse_shape(text: str) -> tuple[int, int, int, int, int, bool]:
    """B/H/H_KV/S/D/CAUSAL in whole numbers, H a multiple of H_KV, D 64 or 128, CAUSAL 0/1."""
    try:
        b, h, hk, s, d, c = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shape must be B/H/H_KV/S/D/CAUSAL in whole numbers, e.g. 1/32/32/8192/64/1; got "
            f"{text!r}") from None
    if min(b, h, hk, s) < 1 or d not in (64, 128) or c not in (0, 1) or h % hk:
        raise argparse.ArgumentTypeError(
            f"shape {text!r}: B, H, H_KV, S >= 1 with H a multiple of H_KV, D 64 or 128 (the "
            f"Hopper forward's head dims), CAUSAL 0 or 1")
    return b, h, hk, s, d, bool(c)


def _call(opts: dict):
    """f(q, k, v, causal) -> (O, lse2): the Gluon forward with its default schedule for the
    head dim (default_schedule's, else CONSUMERS and TILES) and ``opts`` on top."""
    from attnmem.kernels.flash import fwd_sm90

    def run(q, k, v, causal):
        d = q.shape[-1]
        sched = fwd_sm90.default_schedule(d, q.shape[2], k.shape[2], causal)
        consumers, stages = sched or (fwd_sm90.CONSUMERS[d], fwd_sm90.TILES[d][1])
        kw = {"consumers": consumers, "stages": stages, **opts}
        return fwd_sm90.attention_forward_sm90(q, k, v, causal, math.log2(math.e) / math.sqrt(d),
                                               **kw)
    return run


def candidates(variants: list[tuple[str, dict]]) -> dict:
    out = {"base": _call({})}
    for name, opts in variants:
        if name in out:
            raise SystemExit(f"variant name {name!r} given twice")
        out[name] = _call(opts)
    return out


def check(cands: dict) -> bool:
    import torch

    from attnmem.kernels.dev.grad_check import FLOOR
    from attnmem.kernels.flash.reference import attention_reference

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    ok = True
    print("== correctness: max |O - fp32 reference| / max |lse2 - reference| per candidate, "
          "eager low precision last", flush=True)
    for B, H, H_kv, s, d, causal, dn in CHECK_SHAPES:
        dt = dtypes[dn]
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, n, s, d, device="cuda", dtype=dt) for n in (H, H_kv, H_kv))
        scale = 1.0 / math.sqrt(d)
        ref = attention_reference(q.float(), k.float(), v.float(), causal, scale)
        low = attention_reference(q, k, v, causal, scale)
        kr = k.float().repeat_interleave(H // H_kv, 1)
        sc = (q.float() @ kr.transpose(-1, -2)) * scale
        if causal:
            sc = sc.masked_fill(torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1),
                                float("-inf"))
        lse_ref = torch.logsumexp(sc, -1) / math.log(2)  # lse2, in log2 units
        limit = 2 * (low.float() - ref).abs().max().item() + FLOOR[dt]
        parts = []
        for name, fn in cands.items():
            try:
                o, lse2 = fn(q, k, v, causal)
                eo = (o.float() - ref).abs().max().item()
                el = (lse2 - lse_ref).abs().max().item()
            except Exception as e:  # a variant that does not build or run fails the check
                eo = el = float("nan")
                print(f"  {name}: {type(e).__name__}: {str(e)[:300]}")
            good = math.isfinite(eo) and eo <= limit and math.isfinite(el) and el < 1e-3
            ok &= good
            parts.append(f"{name} {eo:.1e}/{el:.1e}" + ("" if good else " FAIL"))
        print(f"B={B} H={H}/{H_kv} s={s} d={d} {'causal' if causal else 'full'} {dn}: "
              + "  ".join(parts) + f"  eager {(low.float() - ref).abs().max().item():.1e}",
              flush=True)
    print("correctness:", "PASS" if ok else "FAIL", flush=True)
    return ok


def timing(cands: dict, shapes: list, rounds: int, fa4: bool) -> dict:
    import torch

    results = {}
    for B, h, hk, s, d, causal in shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, n, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for n in (h, hk, hk))
        calls = {name: functools.partial(fn, q, k, v, causal) for name, fn in cands.items()}
        if fa4:
            try:
                from flash_attn.cute import flash_attn_func
            except ImportError:
                print("(FA4 not importable: flash_attn.cute)", flush=True)
            else:
                qf, kf, vf = (t.transpose(1, 2).contiguous() for t in (q, k, v))
                calls["fa4"] = functools.partial(flash_attn_func, qf, kf, vf, causal=causal)
        best = best_of_rounds(calls, rounds)
        flop = 4 * B * h * s * s * d / (2 if causal else 1)
        key = f"{B}/{h}/{hk}/{s}/{d}/{int(causal)}"
        results[key] = best
        print(f"{key}: " + "  ".join(f"{n} {ms:.3f} ms ({flop / ms / 1e9:.0f} TF)"
                                     for n, ms in best.items()), flush=True)
        del q, k, v, calls
        torch.cuda.empty_cache()
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", type=functools.partial(parse_variant, settings=SETTINGS),
                    action="append", default=[], metavar="NAME:KEY=VAL[,KEY=VAL]")
    ap.add_argument("--shapes", type=parse_shape, nargs="+", metavar="B/H/H_KV/S/D/CAUSAL",
                    default=[parse_shape(x) for x in DEFAULT_SHAPES])
    add_timing_args(ap, "forward")
    args = ap.parse_args(argv)
    if not args.variant:
        ap.error("nothing to compare: give at least one --variant")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    require_hopper("forward")
    cands = candidates(args.variant)
    if not args.skip_check and not check(cands):
        return 1
    print(summary(timing(cands, args.shapes, args.rounds, args.fa4)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
