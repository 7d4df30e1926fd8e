# Measured: the causal Hopper backward's time by grid order (heads launched together), H200.
"""Time the Hopper (Gluon) backward alone under each causal grid order, in one process, with
cuDNN's backward beside it (autograd on SDPA's cuDNN forward).

    python -m attnmem.kernels.dev.bwd_order [--shapes B/H/H_KV/S/D ...] [--groups 1 2 4 8 16 all]
        [--rounds 2]

The causal backward launches its programs in groups of ``HEADS_PER_GROUP`` (batch, key/value
head)s, longest key block first inside each group (attnmem.kernels.flash.bwd_sm90, `head_group`);
"all" is one group of every head, the order before groups existed. Each group value is a
candidate; a value that does not divide B * H_kv is skipped for that shape. bf16, causal.

1. Correctness: every candidate's dK and dV equal the "all" order's bit for bit (each program
   writes its own rows, so the order cannot change them), and dQ within 1e-2 of it (fp32
   adds in another order).
2. triton.testing.do_bench medians (L2 flushed) in ``--rounds`` interleaved rounds, best kept;
   TFLOP/s count 2.5 x 4 B H s^2 d / 2. The last table is each candidate's speed against
   "all" and against cuDNN, with the rule's choice (`head_group`) marked.
"""

from __future__ import annotations

import argparse
import functools
import math

DEFAULT_SHAPES = [
    "8/32/32/8192/128", "16/32/8/4096/128", "8/32/32/1536/128", "32/32/8/1536/128",
    "8/32/32/1024/128", "16/32/32/3000/64", "64/32/32/2048/64", "16/32/8/6000/64",
    "128/32/32/1024/64", "1/32/32/16384/128", "1/32/32/4096/128", "1/32/8/8192/128",
    "1/32/32/32768/128", "1/32/32/8192/64",
]


def parse_shape(text: str) -> tuple[int, int, int, int, int]:
    """B/H/H_KV/S/D -> a tuple of five positive whole numbers, H a multiple of H_KV."""
    parts = text.split("/")
    try:
        vals = tuple(int(p) for p in parts)
    except ValueError:
        vals = ()
    if len(vals) != 5 or min(vals) < 1 or vals[1] % vals[2] or vals[4] not in (64, 128):
        raise argparse.ArgumentTypeError(
            f"shape must be B/H/H_KV/S/D with H a multiple of H_KV and D 64 or 128; got {text!r}")
    return vals  # type: ignore[return-value]


def one_shape(B: int, H: int, H_kv: int, s: int, d: int, groups, rounds: int):
    """(line, rule's choice, {group: label}, {label: best ms}) for one shape."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnmem.kernels.dev.ab_bwd import best_of_rounds
    from attnmem.kernels.flash import bwd_sm90
    from attnmem.kernels.flash.route import attention_forward

    rule = bwd_sm90.head_group
    bh = B * H_kv
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, n, s, d, device="cuda", dtype=torch.bfloat16,
                               generator=gen) for n in (H, H_kv, H_kv, H))
    scale = 1.0 / math.sqrt(d)
    o, lse2 = attention_forward(q, k, v, True, scale)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    chosen = rule(bh, H // H_kv, s, s, d, sms)
    vals = {}
    for g in groups:
        n = bh if g == "all" else int(g)
        if n <= bh and bh % n == 0:
            vals.setdefault(n, "all" if n == bh else str(n))

    def call(n):
        bwd_sm90.head_group = lambda *a: n
        try:
            return bwd_sm90.attention_backward_sm90(do, q, k, v, o, lse2, True, scale)
        finally:
            bwd_sm90.head_group = rule

    ref = call(bh)
    bad = []
    for n in vals:
        dq, dk, dv = call(n)
        if not (torch.equal(dk, ref[1]) and torch.equal(dv, ref[2])
                and (dq.float() - ref[0].float()).abs().max().item() <= 1e-2):
            bad.append(vals[n])
    calls = {vals[n]: functools.partial(call, n) for n in vals}
    qc, kc, vc = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        oc = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, enable_gqa=H != H_kv)
    calls["cudnn"] = lambda: torch.autograd.grad(oc, (qc, kc, vc), do, retain_graph=True)
    best = best_of_rounds(calls, rounds)
    flop = 2.5 * 4 * B * H * s * s * d / 2
    line = (f"{B}/{H}/{H_kv}/{s}/{d} rule={chosen} "
            f"check={'FAIL ' + ','.join(bad) if bad else 'ok'}: "
            + "  ".join(f"{n} {ms:.3f} ms ({flop / ms / 1e9:.0f} TF)" for n, ms in best.items()))
    return line, chosen, vals, best


def run(shapes, groups, rounds: int) -> list[str]:
    import torch

    lines, table = [], []
    for B, H, H_kv, s, d in shapes:
        try:
            line, chosen, vals, best = one_shape(B, H, H_kv, s, d, groups, rounds)
        except Exception as e:  # report and go on: one shape's failure must not hide the rest
            line, best = f"{B}/{H}/{H_kv}/{s}/{d}: {type(e).__name__}: {str(e)[:300]}", None
        print(line, flush=True)
        lines.append(line)
        if best:
            table.append((f"{B}/{H}/{H_kv}/{s}/{d}", chosen, vals, best))
        torch.cuda.empty_cache()
    lines.append("speed against the all-heads order (all ms / candidate ms); * = the rule's "
                 "choice; last column: the rule's choice against cuDNN's backward")
    for key, chosen, vals, best in table:
        cells = [f"{vals[n]}{'*' if n == chosen else ''} {best['all'] / best[vals[n]]:.3f}"
                 for n in vals]
        pick = vals.get(chosen)
        vs = f"{best['cudnn'] / best[pick]:.3f}" if pick else "-"
        lines.append(f"{key}: " + "  ".join(cells) + f"  | rule/cudnn {vs} "
                     f"all/cudnn {best['cudnn'] / best['all']:.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    from attnmem.kernels.dev.ab_bwd import require_hopper

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=parse_shape, nargs="+", metavar="B/H/H_KV/S/D",
                    default=[parse_shape(x) for x in DEFAULT_SHAPES])
    ap.add_argument("--groups", nargs="+", default=["1", "2", "4", "8", "16", "all"])
    ap.add_argument("--rounds", type=int, choices=range(1, 6), default=2, metavar="1..5")
    args = ap.parse_args(argv)
    for g in args.groups:
        if g != "all" and not (g.isdigit() and int(g) >= 1):
            ap.error(f"--groups takes whole numbers >= 1 or 'all'; got {g!r}")
    require_hopper("backward")
    print("\n".join(run(args.shapes, args.groups, args.rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
