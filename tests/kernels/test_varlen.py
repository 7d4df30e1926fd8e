"""Packed sequences (``flash_attention(..., cu_seqlens=...)``) and transformers' padding-free
and padded batches on them (``attnmem.kernels.hf``).

Oracle: each sequence run alone through the fp64 eager reference
(``attnmem.kernels.flash.reference.attention_reference``), with the same causal mask and window; the
packed call's output and gradients, row for row, must stay within twice plain eager's error in
the same dtype plus a small floor (as tests/kernels/test_flash_attention.py bounds the dense
kernel). A row that attended across a sequence boundary, or a tile that crossed one, fails it.

Without a GPU the kernels run under Triton's CPU interpreter, switched on before triton is
imported, so every kernel case runs in ONE child process started with TRITON_INTERPRET=1
(this file run as a script) and each test reads its case from that run. There every buffer
the kernels allocate (`attnmem.kernels.flash.common.empty`) is NaN-filled, so a row a packed launch
fails to write shows. The interpreter runs 32 x 32 tiles: the lengths below are chosen
against them (1, 5, 31, 33, 40, 64, 70: below, at and across tile edges). GPU tests are
marked ``gpu``.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
# tests/ holds the shared helpers; the interpreter child runs this file as a script
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _poison import poison_empty  # noqa: E402  (tests/_poison.py)
from _tolerance import within as _within  # noqa: E402  (tests/_tolerance.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_CUDA = torch.cuda.is_available()
FLOOR = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _starts(lens, device) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                        device=device)


def _per_sequence(fn, q, k, v, do, starts_q, starts_k):
    """fn run on each sequence alone (dense (1, H, s, d) slices), concatenated: out, grads."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    outs = []
    for i in range(len(starts_q) - 1):
        a, b = starts_q[i], starts_q[i + 1]
        c, e = starts_k[i], starts_k[i + 1]
        outs.append(fn(leaves[0][:, :, a:b], leaves[1][:, :, c:e], leaves[2][:, :, c:e]))
    out = torch.cat(outs, 2)
    out.backward(do.to(out.dtype))
    return out.detach(), [t.grad.detach() for t in leaves]


def check_packed(lens, H, H_kv, d, causal, window, dtype, device, lens_k=None, flat=False,
                 seed=0):
    """The packed call (forward and the three gradients) against each sequence alone."""
    from attnmem.kernels import flash_attention
    from attnmem.kernels.flash.reference import attention_reference

    lens_k = lens if lens_k is None else lens_k
    g = torch.Generator(device="cpu").manual_seed(seed)
    T, Tk = sum(lens), sum(lens_k)
    q = torch.randn(1, H, T, d, generator=g).to(device, dtype)
    k = torch.randn(1, H_kv, Tk, d, generator=g).to(device, dtype)
    v = torch.randn(1, H_kv, Tk, d, generator=g).to(device, dtype)
    do = torch.randn(1, H, T, d, generator=g).to(device, dtype)
    cu_q = _starts(lens, device)
    cu_k = None if lens_k is lens else _starts(lens_k, device)
    starts_q = cu_q.tolist()
    starts_k = starts_q if cu_k is None else cu_k.tolist()

    def packed(a, b, c):
        if flat:  # FlashAttention's varlen layout (total, H, d) in and out
            o = flash_attention(*(t[0].transpose(0, 1) for t in (a, b, c)), causal=causal,
                                window=window, cu_seqlens=cu_q, cu_seqlens_k=cu_k)
            assert o.shape == (T, H, d)
            return o.transpose(0, 1).unsqueeze(0)
        return flash_attention(a, b, c, causal=causal, window=window, cu_seqlens=cu_q,
                               cu_seqlens_k=cu_k)

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = packed(*leaves)
    out.backward(do)
    grads = [t.grad.detach() for t in leaves]
    hi = torch.float64 if device == "cpu" or dtype == torch.float32 else torch.float32
    ref, ref_grads = _per_sequence(lambda a, b, c: attention_reference(
        a.to(hi), b.to(hi), c.to(hi), causal, None, window), q, k, v, do, starts_q, starts_k)
    base, base_grads = _per_sequence(lambda a, b, c: attention_reference(
        a, b, c, causal, None, window), q, k, v, do, starts_q, starts_k)
    assert out.shape == (1, H, T, d) and out.dtype == dtype
    _within("out", out.detach(), ref, base, FLOOR[dtype])
    for name, gr, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads, strict=True):
        _within(name, gr, r, b, FLOOR[dtype])


# (lens, H, H_kv, d, causal, window, dtype, extra): lengths across the interpreter's 32-row tile
INTERP_CASES = {
    "full_mha_fp32": ([5, 40, 33, 1, 64], 2, 2, 16, False, None, torch.float32, {}),
    "causal_gqa_fp16": ([70, 3, 31, 33], 4, 2, 32, True, None, torch.float16, {}),
    "window_gqa_fp32": ([50, 17, 65], 4, 1, 16, True, 20, torch.float32, {}),
    "window1_d80_fp16": ([33, 1, 40], 2, 1, 80, True, 1, torch.float16, {}),
    "one_sequence": ([97], 2, 2, 16, True, None, torch.float32, {}),
    "flat_layout": ([31, 2, 40], 4, 2, 16, True, None, torch.float32, dict(flat=True)),
    "keys_differ_topleft": ([17, 40, 5], 4, 2, 16, True, None, torch.float32,
                            dict(lens_k=[40, 33, 70])),
    "keys_differ_full": ([17, 40], 2, 1, 16, False, None, torch.float16,
                         dict(lens_k=[3, 70])),
}


def _hf_model(impl: str, seed: int = 0):
    """A tiny random Llama (2 layers, 4 query heads over 2 key/value heads, d = 16), fp32."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    import attnmem.kernels.hf

    attnmem.kernels.hf.register()
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=256)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=impl)
    assert model.config._attn_implementation == impl
    return model


def _logits_and_grads(model, **inputs):
    """Logits, and the gradients of sum(logits * w) (w fixed) with respect to every weight."""
    model.zero_grad(set_to_none=True)
    logits = model(**inputs).logits
    w = torch.linspace(-1, 1, logits.shape[-1])
    (logits * w).sum().backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                             if p.grad is not None}


def _hf_reference(lens, ids, restart=True):
    """SDPA on each sequence alone: logits concatenated, gradients summed. Positions restart
    at 0 per sequence, or with ``restart=False`` run on over the row (as a packed row without
    position_ids has them)."""
    model = _hf_model("sdpa")
    logits, grads, start = [], {}, 0
    for n in lens:
        pos = torch.arange(n if restart else start + n)[-n:].unsqueeze(0)
        lg, gr = _logits_and_grads(model, input_ids=ids[:, start:start + n], position_ids=pos)
        logits.append(lg)
        for name, g in gr.items():
            grads[name] = grads.get(name, 0) + g
        start += n
    return torch.cat(logits, 1), grads


def _compare_hf(name, got, grads, ref, ref_grads) -> None:
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=2e-4, msg=lambda m: f"{name}: {m}")
    assert grads.keys() == ref_grads.keys()
    for p in grads:
        torch.testing.assert_close(grads[p], ref_grads[p], atol=5e-4, rtol=5e-4,
                                   msg=lambda m, p=p: f"{name} grad {p}: {m}")


def hf_padding_free():
    """DataCollatorWithFlattening's batch: one row, position_ids restarting per sequence;
    with use_cache=False transformers builds its packed-sequence mask (our mask function
    turns it into starts), with the default use_cache=True it builds none (the attention
    function reads the starts from position_ids, as transformers' flash-attention path)."""
    lens = [7, 33, 1, 20]
    ids = torch.randint(0, 97, (1, sum(lens)), generator=torch.Generator().manual_seed(1))
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    ref, ref_grads = _hf_reference(lens, ids)
    for use_cache in (False, True):
        got, grads = _logits_and_grads(_hf_model("triton"), input_ids=ids, position_ids=pos,
                                       use_cache=use_cache)
        _compare_hf(f"padding-free, use_cache={use_cache}", got, grads, ref, ref_grads)


def hf_cu_seq_lens_kwargs():
    """The collator's flash-attention kwargs alone (no position_ids, so no packed mask):
    cu_seq_lens_q/k separate the sequences; rotary positions run on over the row."""
    lens = [12, 30, 5]
    ids = torch.randint(0, 97, (1, sum(lens)), generator=torch.Generator().manual_seed(2))
    cu = _starts(lens, "cpu")
    got, grads = _logits_and_grads(_hf_model("triton"), input_ids=ids, cu_seq_lens_q=cu,
                                   cu_seq_lens_k=cu, max_length_q=30, max_length_k=30)
    ref, ref_grads = _hf_reference(lens, ids, restart=False)
    _compare_hf("cu_seq_lens", got, grads, ref, ref_grads)


def hf_padded_batch():
    """A right- and a left-padded row (a 2D attention mask): the real tokens equal SDPA on
    each sequence alone; padding positions are 0 in the attention output, not compared."""
    lens, s = [9, 21], 24
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 97, (2, s), generator=g)
    mask = torch.zeros(2, s, dtype=torch.long)
    mask[0, :lens[0]] = 1  # right padding
    mask[1, s - lens[1]:] = 1  # left padding
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    model = _hf_model("triton")
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    w = torch.linspace(-1, 1, logits.shape[-1])
    real = mask.bool()
    (logits[real] * w).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    packed_ids = ids[real].unsqueeze(0)
    ref, ref_grads = _hf_reference(lens, packed_ids)
    _compare_hf("padded", logits.detach()[real].unsqueeze(0), grads, ref, ref_grads)


HF_CASES = {"hf_padding_free": hf_padding_free, "hf_cu_seq_lens": hf_cu_seq_lens_kwargs,
            "hf_padded_batch": hf_padded_batch}


def _interp_worker() -> None:
    """Child process (TRITON_INTERPRET=1): run every case, print JSON results."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from _interp import quick_interpreter

    quick_interpreter()  # tests/_interp.py: the interpreter without two redundant costs
    fa = importlib.import_module("attnmem.kernels.flash.api")
    assert fa.interpreting(), "TRITON_INTERPRET=1 did not take effect"
    results = {}
    for name, (lens, H, H_kv, d, causal, window, dtype, extra) in INTERP_CASES.items():
        try:
            with poison_empty():
                check_packed(lens, H, H_kv, d, causal, window, dtype, "cpu", **extra)
            results[name] = "ok"
        except BaseException as exc:  # pytest.fail raises a BaseException subclass
            results[name] = f"{type(exc).__name__}: {exc}"
    for name, run in HF_CASES.items():
        try:
            with poison_empty():
                run()
            results[name] = "ok"
        except BaseException as exc:
            results[name] = f"{type(exc).__name__}: {exc}"
    print("VARLEN_RESULTS " + json.dumps(results))


@pytest.fixture(scope="module")
def interp_results() -> dict[str, str]:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--interp-worker"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    for line in res.stdout.splitlines():
        if line.startswith("VARLEN_RESULTS "):
            return json.loads(line[len("VARLEN_RESULTS "):])
    pytest.fail(f"interpreter worker failed (rc {res.returncode}):\n{res.stderr[-4000:]}")


@pytest.mark.skipif(HAS_CUDA, reason="interpreter subset: the GPU runs its own cases")
@pytest.mark.parametrize("case", [*INTERP_CASES, *HF_CASES])
def test_interpreter_packed_matches_each_sequence_alone(interp_results, case):
    """Mixed lengths across tile edges, causal and not, windows, GQA, both layouts, keys
    counted apart from queries; and transformers' padding-free, cu_seq_lens and padded
    batches of a tiny Llama on our kernel against SDPA on each sequence alone."""
    if interp_results[case] != "ok":
        pytest.fail(f"{case}: {interp_results[case]}")


# ---------------------------------------------------------------------------------------------
# checks that launch nothing (this process, CPU)
# ---------------------------------------------------------------------------------------------
def test_bad_cu_seqlens_are_refused_with_the_value(monkeypatch):
    """Every check happens before a launch; the message names the argument and the rule."""
    fa = importlib.import_module("attnmem.kernels.flash.api")
    monkeypatch.setattr(fa, "interpreting", lambda: True)  # accept CPU tensors up to the checks
    q = torch.zeros(1, 4, 10, 16)
    kv = torch.zeros(1, 2, 10, 16)
    i32 = torch.int32
    cases = [
        (torch.tensor([0, 4, 10]), "cu_seqlens must be int32.*got torch.int64"),
        (torch.tensor([0, 4, 4, 10], dtype=i32), r"strictly increasing.*cu_seqlens\[1\] = 4, "
                                                  r"cu_seqlens\[2\] = 4"),
        (torch.tensor([0, 6, 3, 10], dtype=i32), "strictly increasing"),
        (torch.tensor([0, 4, 9], dtype=i32), "must end at the packed total of rows, 10, got 9"),
        (torch.tensor([1, 4, 10], dtype=i32), "must start at 0, got 1"),
        (torch.tensor([10], dtype=i32), r"n \+ 1 >= 2 entries"),
        (torch.tensor([[0, 10]], dtype=i32), "1-d"),
        ([0, 4, 10], "torch.Tensor"),
    ]
    for cu, words in cases:
        with pytest.raises((ValueError, TypeError), match=words):
            fa.flash_attention(q, kv, kv, causal=True, cu_seqlens=cu)
    cu = torch.tensor([0, 4, 10], dtype=i32)
    with pytest.raises(ValueError, match="count the same sequences, got 2 and 1"):
        fa.flash_attention(q, kv, kv, cu_seqlens=cu,
                           cu_seqlens_k=torch.tensor([0, 10], dtype=i32))
    with pytest.raises(ValueError, match="cu_seqlens_k was given without cu_seqlens"):
        fa.flash_attention(q, kv, kv, cu_seqlens_k=cu)
    with pytest.raises(ValueError, match="batch 1"):
        fa.flash_attention(q.expand(2, -1, -1, -1), kv.expand(2, -1, -1, -1),
                           kv.expand(2, -1, -1, -1), cu_seqlens=cu)
    with pytest.raises(ValueError, match="pass cu_seqlens_k"):
        fa.flash_attention(q, kv[:, :, :8], kv[:, :, :8], cu_seqlens=cu)
    with pytest.raises(ValueError, match="window=3 was given with causal=False"):
        fa.flash_attention(q, kv, kv, window=3, cu_seqlens=cu)
    with pytest.raises(ValueError, match="all alike"):
        fa.flash_attention(q, kv[0].transpose(0, 1), kv[0].transpose(0, 1), cu_seqlens=cu)
    route = importlib.import_module("attnmem.kernels.flash.route")
    from attnmem.kernels.flash.common import Packed
    from attnmem.kernels.flash.config import KernelConfig

    packed = Packed(cu, cu, 6, 6)
    with pytest.raises(ValueError, match="sm90=True"):
        route.attention_forward(q, kv, kv, True, 0.25, KernelConfig(sm90=True), None, packed)
    with pytest.raises(ValueError, match="atomic_dq=True"):
        route.attention_backward(q, q, kv, kv, q, q[..., 0], True, 0.25,
                                 KernelConfig(atomic_dq=True), None, packed)
    with pytest.raises(ValueError, match="kv_split=2"):
        route.attention_backward(q, q, kv, kv, q, q[..., 0], True, 0.25,
                                 KernelConfig(kv_split=2), None, packed)


def test_host_starts_are_read_once_per_tensor_and_version():
    """cu_seqlens is copied to the host once while the tensor lives unmodified; an in-place
    change is seen; a freed tensor leaves no entry."""
    fa = importlib.import_module("attnmem.kernels.flash.api")
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    assert fa._host_starts(cu) == (0, 3, 7)
    calls = []
    real = torch.Tensor.tolist
    try:
        torch.Tensor.tolist = lambda self: calls.append(1) or real(self)
        assert fa._host_starts(cu) == (0, 3, 7) and not calls
        cu[2] = 9
        assert fa._host_starts(cu) == (0, 3, 9) and calls == [1]
    finally:
        torch.Tensor.tolist = real
    key = id(cu)
    del cu
    assert key not in fa._HOST_STARTS


def test_varlen_peak_model_terms():
    """attnmem.calc.varlen_peak_bytes: the packed total's O and lse (forward); + dq, dk, dv and, where
    attnmem.calc.dispatch.sm90_packed picks the Hopper backward, lse2 / delta copies and an fp32 dq
    buffer of P padded rows per head (P = T + n·BLOCK_M rounded up: the number of sequences
    counts), else delta only (a window shorter than the longest sequence, fp32, d = 80)."""
    import attnmem.calc
    from attnmem.calc.dispatch import sm90_packed_pad_rows
    from attnmem.calc.peak import attention_peak_bytes

    H, H_kv, d, T = 32, 8, 128, 8192
    fwd = H * T * (d * 2 + 4)
    assert attnmem.calc.varlen_peak_bytes(H, [1000, 3000, 4192], d, "bf16", kv_heads=H_kv) == fwd
    grads = 2 * H * T * d * 2 + 2 * H_kv * T * d * 2 + 4 * H * T
    portable = grads + 4 * H * T
    for lens in ([8192], [1000, 3000, 4192], [64] * 128):
        P = sm90_packed_pad_rows(T, len(lens), d)
        assert P == -(-(T + 64 * len(lens)) // 64) * 64
        hopper = grads + H * P * (d + 2) * 4
        terms = attnmem.calc.varlen_peak_breakdown(H, lens, d, "bf16", True, H_kv)
        assert sum(t.tensor_bytes for t in terms) == hopper  # before the allocator's rounding
        assert attnmem.calc.varlen_peak_bytes(H, lens, d, "bf16", True, H_kv) == sum(
            t.counted_bytes for t in terms)
        fa = importlib.import_module("attnmem.kernels.flash.api")
        assert fa.varlen_bytes(H, H_kv, T, T, d, 2, backward=True, pad_rows=P) == hopper
    assert attnmem.calc.varlen_peak_bytes(H, [1000, 3000, 4192], d, "bf16", True, H_kv,
                                  window=4191) == portable
    # sequences shorter than the query block on average (here 1 token): the portable backward
    assert attnmem.calc.varlen_peak_bytes(H, [1] * 8192, d, "bf16", True, H_kv) == portable
    assert attnmem.calc.varlen_peak_bytes(H, [63] * 2 + [66] * 1, d, "bf16", True, H_kv) > \
        attnmem.calc.varlen_peak_bytes(H, [63] * 3, d, "bf16", True, H_kv)  # 192 >= 3 x 64
    assert attnmem.calc.varlen_peak_bytes(H, [1000, 3000, 4192], d, "bf16", True, H_kv,
                                  window=4192) > portable  # a window of 4,192 hides nothing
    assert fa.varlen_bytes(H, H_kv, T, T, d, 2, backward=True) == portable
    assert fa.varlen_bytes(H, H_kv, T, T, d, 2) == fwd
    # the dense call on one batch of T rows is in the Hopper region: + its fp32 dq buffer
    assert attention_peak_bytes("triton", 1, H, T, d, "bf16", False, True, H_kv) == (
        portable + H * T * d * 4)
    terms = attnmem.calc.varlen_peak_breakdown(H, [100, 28], 80, "fp16", True)
    assert [t.label for t in terms] == ["output (saved for backward)",
                                        "log-sum-exp (fp32, one per packed row)",
                                        "row sums of dO·O (fp32, one per packed row)",
                                        "dk, dv", "dq"]
    terms = attnmem.calc.varlen_peak_breakdown(H, [100, 156], 64, "fp16", True)
    assert [t.label.split(" (")[0] for t in terms] == [
        "output", "log-sum-exp", "row sums of dO·O and log-sum-exp copied into padded rows",
        "dk, dv", "fp32 dq buffer of the Hopper backward", "dq"]
    for bad, words in (([], "at least one"), ([3, 0], "seq_lens"), ("128", "list"),
                       ([2.5], "seq_lens")):
        with pytest.raises(ValueError, match=words):
            attnmem.calc.varlen_peak_bytes(H, bad, d, "bf16")
    with pytest.raises(ValueError, match="does not run"):
        attnmem.calc.varlen_peak_bytes(H, [4], d, "fp8_e4m3")
    with pytest.raises(ValueError, match="window"):
        attnmem.calc.varlen_peak_bytes(H, [4], d, "bf16", window=0)


def test_mask_function_turns_packed_and_padding_masks_into_starts():
    """What our mask function gives transformers' mask builders (no kernel runs): the
    packed-sequence mask (with and without the sliding window) and a causal padding mask
    become `PackedSequences` with the right starts; padding with a window, or a custom
    and-mask on a packed row, still materialise (and are refused by the attention function)."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, MistralConfig
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    import attnmem.kernels.hf
    from attnmem.kernels.hf.attention import PackedSequences

    attnmem.kernels.hf.register()
    lens = [3, 5, 1, 4]
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    emb = torch.zeros(1, 13, 8)
    cfg = LlamaConfig(hidden_size=8, num_attention_heads=1)
    cfg._attn_implementation = "triton"
    m = create_causal_mask(config=cfg, inputs_embeds=emb, attention_mask=None, cache=None,
                           position_ids=pos)
    assert isinstance(m, PackedSequences) and m.window is None and m.indices is None
    assert m.cu_seqlens.tolist() == [0, 3, 8, 9, 13] and m.cu_seqlens.dtype == torch.int32
    wcfg = MistralConfig(hidden_size=8, num_attention_heads=1, sliding_window=2)
    wcfg._attn_implementation = "triton"
    m = create_sliding_window_causal_mask(config=wcfg, inputs_embeds=emb, attention_mask=None,
                                          cache=None, position_ids=pos)
    assert isinstance(m, PackedSequences) and m.window == 2
    assert m.cu_seqlens.tolist() == [0, 3, 8, 9, 13]
    m = create_causal_mask(config=cfg, inputs_embeds=emb, attention_mask=None, cache=None,
                           position_ids=pos, and_mask_function=lambda b, h, q, k: k >= 0)
    assert isinstance(m, torch.Tensor)  # something added: materialised
    pad = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1]])
    emb2 = torch.zeros(2, 6, 8)
    m = create_causal_mask(config=cfg, inputs_embeds=emb2, attention_mask=pad, cache=None)
    assert isinstance(m, PackedSequences)
    assert m.cu_seqlens.tolist() == [0, 3, 8] and m.indices.tolist() == [0, 1, 2, 7, 8, 9, 10, 11]
    m = create_sliding_window_causal_mask(config=wcfg, inputs_embeds=emb2, attention_mask=pad,
                                          cache=None)
    assert isinstance(m, torch.Tensor)  # padding with a window: materialised, refused later


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------
GPU_LENS = [1, 77, 128, 1000, 2049, 4095, 513]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 300)],
                         ids=["full", "causal", "window300"])
@pytest.mark.parametrize("d,H,H_kv", [(64, 8, 8), (128, 16, 4)], ids=["d64_mha", "d128_gqa4"])
def test_gpu_packed_bf16_matches_dense_per_sequence(d, H, H_kv, causal, window):
    """bf16 on CUDA: the packed call against the dense kernel called on each sequence alone,
    both against the fp32 reference: the packed error within twice the dense call's plus the
    floor (the dense calls may take other tiles or the Hopper kernels)."""
    from attnmem.kernels import flash_attention
    from attnmem.kernels.flash.reference import attention_reference

    lens = GPU_LENS
    cu = _starts(lens, "cuda")
    starts = cu.tolist()
    g = torch.Generator(device="cpu").manual_seed(0)
    T = sum(lens)
    q, do = (torch.randn(1, H, T, d, generator=g).cuda().bfloat16() for _ in range(2))
    k, v = (torch.randn(1, H_kv, T, d, generator=g).cuda().bfloat16() for _ in range(2))
    with poison_empty():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = flash_attention(*leaves, causal=causal, window=window, cu_seqlens=cu)
        out.backward(do)
    grads = [t.grad for t in leaves]
    dense, dense_grads = _per_sequence(lambda a, b, c: flash_attention(
        a, b, c, causal=causal, window=window), q, k, v, do, starts, starts)
    ref, ref_grads = _per_sequence(lambda a, b, c: attention_reference(
        a.float(), b.float(), c.float(), causal, None, window), q, k, v, do, starts, starts)
    _within("out", out.detach(), ref, dense, FLOOR[torch.bfloat16])
    for name, gr, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, dense_grads, strict=True):
        _within(name, gr, r, b, FLOOR[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd_bwd"])
@pytest.mark.parametrize("lens,H,H_kv,d", [([1000, 3000, 4192], 32, 8, 128),
                                           ([5, 777, 2048, 1], 16, 16, 64)])
def test_gpu_packed_peak_equals_calc(lens, H, H_kv, d, backward):
    """The measured extra peak of a packed call (q, k, v, dO and cu_seqlens allocated before,
    in an emptied cache: a fresh child process, tests/_packed_peak.py; the call warmed up once,
    so compilation and tuning are not counted) equals attnmem.calc.varlen_peak_bytes to the byte."""
    from _packed_peak import packed_peak

    import attnmem.calc

    got = packed_peak(lens, H, H_kv, d, backward)
    want = attnmem.calc.varlen_peak_bytes(H, lens, d, "bf16", backward, H_kv)
    assert got["measured"] == want, (got, want)


if __name__ == "__main__" and "--interp-worker" in sys.argv:
    sys.path.insert(0, ROOT)
    _interp_worker()
