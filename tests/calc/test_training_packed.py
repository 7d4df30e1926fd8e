"""attnmem.calc.training_step with packed sequences (packed_lengths: padding-free training, one row
whose position_ids restart at each sequence): what differs from the dense row of the same T
by hand, the refusals and their messages, and CPU replays of a tiny Llama through
transformers (our kernel under Triton's interpreter, eager, SDPA) whose live tensor bytes at
the end of the forward equal the predicted activations exactly."""

from __future__ import annotations

import ast
import dataclasses
import functools
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnmem.calc import MODELS
from attnmem.calc.training_step import LoRA, training_step
from tests.calc.test_training_step import TINY

ROOT = Path(__file__).resolve().parents[2]
LENGTHS = (100, 100, 56)
T = sum(LENGTHS)


def _pair(attention: str, **kw: object):
    dense = training_step(TINY, 1, T, attention=attention, **kw)
    packed = training_step(TINY, 1, T, attention=attention, packed_lengths=LENGTHS, **kw)
    return dense, packed


@pytest.mark.parametrize("ckpt", [False, True])
def test_triton_packed_is_the_dense_row_plus_inputs_and_starts(ckpt: bool) -> None:
    """Our kernel: the same saved tensors as one dense row of T (attnmem/kernels/hf/attention.py
    flattens q, k, v as views; the output is made contiguous for o_proj either way), plus the
    int32 cu_seqlens (n + 1) and, before the step, the position ids and labels (int64 T each);
    under checkpointing the model makes no position ids of its own (8·T fewer)."""
    dense, packed = _pair("triton", checkpointing=ckpt)
    starts = 4 * (len(LENGTHS) + 1)
    assert packed.before_step_bytes - dense.before_step_bytes == 2 * 8 * T
    assert packed.activations_bytes - dense.activations_bytes == starts - (8 * T if ckpt else 0)


def test_triton_packed_backward_terms_follow_the_hopper_rule() -> None:
    """The attention call's backward in a layer's backward moment: for a packed row the
    packed call's terms (attnmem.calc.peak.varlen_peak_breakdown). Without a window (Llama) the Hopper
    backward's: lse2 and delta copies and an fp32 dQ buffer of P padded rows per head (P = T
    + n·64 rounded up to 64 at d = 128: attnmem.calc.dispatch.sm90_packed_pad_rows), dk, dv, dq; when
    every layer has a window shorter than the longest sequence (Mistral 7B v0.1, 4,096) the
    portable two-kernel backward's delta, dk, dv, dq, no buffer; a dense row of T in the
    Hopper region adds its own fp32 buffer of T rows."""
    from attnmem.calc.peak import varlen_peak_breakdown
    from attnmem.calc.train_common import _dims
    from attnmem.calc.train_dense import _attention_backward_extra
    from attnmem.calc.train_packed import _packed_window

    lengths = (8192, 8192, 8192, 8192)
    total = sum(lengths)
    pad = -(-(total + 4 * 64) // 64) * 64
    assert pad == 33024
    kv = 2 * (2 * 8 * total * 128)  # dk, dv (bf16, 8 key/value heads)
    dq = 2 * 32 * total * 128
    for name, window, want in (
            ("Llama 3.1 8B", None, 2 * 32 * pad * 4 + kv + 32 * pad * 128 * 4 + dq),
            ("Mistral 7B v0.1", 4096, 4 * 32 * total + kv + dq)):
        m = MODELS[name]
        assert _packed_window(m, lengths) == window
        packed = dataclasses.replace(_dims(m, 1, total, 1), lengths=lengths, window=window)
        terms = varlen_peak_breakdown(32, list(lengths), 128, "bf16", True, 8, window=window)
        got = sum(t.counted_bytes for t in terms
                  if not t.label.startswith(("output", "log-sum-exp")))
        assert got == want, name
        assert _attention_backward_extra("triton", packed) == want, name
    # a window of the longest sequence or more hides nothing: the Hopper rule holds again
    assert _packed_window(MODELS["Mistral 7B v0.1"], ()) is None
    assert _packed_window(MODELS["Gemma 2 9B"], lengths) is None  # global layers too
    m = MODELS["Llama 3.1 8B"]
    dense = _dims(m, 1, total, 1)
    packed = dataclasses.replace(dense, lengths=lengths)
    gap = (_attention_backward_extra("triton", dense)
           - _attention_backward_extra("triton", packed))
    # the dense call's delta and T-row buffer against the packed call's padded copies
    assert gap == 32 * (total - pad) * 128 * 4 + 32 * (total - 2 * pad) * 4


def test_eager_packed_mask_is_the_dense_one() -> None:
    """Eager attention materializes a T×T additive mask either way (masking_utils builds the
    block-diagonal one from position_ids): only the inputs differ."""
    dense, packed = _pair("eager")
    assert packed.activations == dense.activations
    assert packed.before_step_bytes - dense.before_step_bytes == 2 * 8 * T


def test_sdpa_packed_gets_the_mask_and_repeated_kv() -> None:
    """SDPA gets transformers' bool block-diagonal mask: k, v repeated to H heads
    (use_gqa_in_sdpa is False with a mask) and the mask kept as a bf16 bias per layer."""
    dense, packed = _pair("sdpa_cudnn")
    per_layer = 2 * (2 * T * 64 - 2 * T * 32) + 2 * T * T
    assert packed.activations_bytes - dense.activations_bytes == 2 * per_layer


@pytest.mark.parametrize("kwargs, words", [
    (dict(attention="sdpa_flash"), "flash backend takes no mask"),
    (dict(attention="fa4"), "FlashAttention-4"),
    (dict(attention="naive"), "not a transformers attention"),
    (dict(attention="triton", use_cache=True), "use_cache=True"),
])
def test_refusals_say_why(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        training_step(TINY, 1, T, packed_lengths=LENGTHS, **kwargs)


@pytest.mark.parametrize("batch, seq_len, lengths, words", [
    (2, T, LENGTHS, "batch must be 1"),
    (1, T + 1, LENGTHS, "sum\\(packed_lengths\\) = 256"),
    (1, T, (), "at least one"),
    (1, T, "100,156", "tuple of sequence lengths"),
    (1, T, (100, 0, 156), "packed_lengths\\[1\\]"),
    (1, T, (100, 2.5, 153.5), "packed_lengths\\[1\\] must be a whole number"),
    (1, T, (100, True, 155), "packed_lengths\\[1\\]"),
])
def test_bad_lengths_name_the_value(batch: int, seq_len: int, lengths: object,
                                    words: str) -> None:
    with pytest.raises(ValueError, match=words):
        training_step(TINY, batch, seq_len, attention="triton", packed_lengths=lengths)


def test_gpt2_is_refused() -> None:
    with pytest.raises(ValueError, match="GPT-2"):
        training_step(MODELS["GPT-2 (124M)"], 1, 300, attention="eager",
                      packed_lengths=(100, 200))


def test_lora_packed() -> None:
    """LoRA on a packed row: the same input and cu_seqlens terms as full training."""
    lo = LoRA(8)
    dense = training_step(TINY, 1, T, attention="triton", adapters=lo)
    packed = training_step(TINY, 1, T, attention="triton", adapters=lo, packed_lengths=LENGTHS)
    assert packed.before_step_bytes - dense.before_step_bytes == 2 * 8 * T
    assert packed.activations_bytes - dense.activations_bytes == 4 * (len(LENGTHS) + 1)


# --- CPU replays -----------------------------------------------------------------------------

def _replay(attention: str, ckpt: bool, lengths: tuple[int, ...], lora: bool = False,
            ) -> tuple[int, int]:
    """(bytes of the tensor storages made by the forward and alive at its end, their peak
    over the step's forward and backward), for a tiny bf16
    Llama fed a packed row as DataCollatorWithFlattening makes it (position_ids restarting,
    labels -100 at each sequence's first token)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from attnmem.measure.live_bytes import LiveBytes

    if attention == "triton":
        from attnmem.kernels.flash.api import interpreting

        if not interpreting():
            if lengths == LENGTHS and not lora:
                return _triton_replays()[ckpt]
            return _replay_in_child(attention, ckpt, lengths, lora)
        import attnmem.kernels.hf

        attnmem.kernels.hf.register()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   vocab_size=1000, attn_implementation=attention)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16,
                                                           target_modules="all-linear"))
    total = sum(lengths)
    ids = torch.randint(0, 1000, (1, total))
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    labels = ids.clone()
    labels[0, [0, *itertools.accumulate(lengths[:-1])]] = -100

    def forward() -> object:
        return model(input_ids=ids, position_ids=pos, labels=labels, use_cache=False).loss

    forward().backward()  # warm-up (lazy caches, the kernel's compilation)
    live = LiveBytes()
    for t in (*model.parameters(), ids, pos, labels):  # made before: views of them are not new
        live.add(t)
    live.bytes = 0
    with live:
        loss = forward()
        fwd = live.bytes
        loss.backward()
    return fwd, live.peak


def _replays_in_child(calls: list[tuple[str, bool, tuple[int, ...], bool]]) -> list[tuple[int, int]]:
    """_replay(*call) for each call, in one child process with TRITON_INTERPRET=1 (read when
    triton is imported), so that our kernel runs on the CPU. Each replay builds its model and
    runs its own warm-up step before it measures, so one after another in one process they
    give what each gives alone; the child's imports (torch, transformers, triton) are paid
    once."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    code = ("import sys; sys.path.insert(0, 'tests'); from _interp import quick_interpreter; "
            "quick_interpreter(); from tests.calc.test_training_packed import _replay; "
            f"print('BYTES', [_replay(*call) for call in {calls!r}])")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = ast.literal_eval(res.stdout.split("BYTES")[-1].strip())
    assert len(got) == len(calls), got
    return [(int(fwd), int(peak)) for fwd, peak in got]


def _replay_in_child(attention: str, ckpt: bool, lengths: tuple[int, ...], lora: bool,
                     ) -> tuple[int, int]:
    return _replays_in_child([(attention, ckpt, lengths, lora)])[0]


@functools.cache
def _triton_replays() -> dict[bool, tuple[int, int]]:
    """Our kernel's replays at LENGTHS without and with checkpointing, both in one child (two
    tests read them)."""
    off, on = _replays_in_child([("triton", False, LENGTHS, False), ("triton", True, LENGTHS, False)])
    return {False: off, True: on}


@pytest.mark.parametrize("attention, ckpt", [
    ("eager", False), ("eager", True), ("sdpa", False), ("sdpa", True), ("triton", False)])
def test_cpu_replay_forward_exact(attention: str, ckpt: bool) -> None:
    """CPU SDPA with transformers' bool mask keeps what calc counts for cuDNN with a mask
    (q, k, v at H heads, the output, log-sum-exp, the bias)."""
    fwd, peak = _replay(attention, ckpt, LENGTHS)
    calc_attention = {"sdpa": "sdpa_cudnn"}.get(attention, attention)
    want = training_step(TINY, 1, T, attention=calc_attention, checkpointing=ckpt,
                         packed_lengths=LENGTHS)
    assert fwd == want.activations_bytes
    if attention != "eager":  # eager's CUDA softmax backward makes an fp32 tmp the CPU does not
        cpu = want.peak_bytes - want.before_step_bytes
        assert abs(cpu - peak) <= 0.01 * peak, (cpu, peak, want.peak_phase)


def test_cpu_replay_lora_forward_exact() -> None:
    fwd, _ = _replay("sdpa", False, LENGTHS, lora=True)
    want = training_step(TINY, 1, T, attention="sdpa_cudnn", packed_lengths=LENGTHS,
                         adapters=LoRA(8, alpha=16))
    assert fwd == want.activations_bytes


def test_cpu_replay_triton_checkpointing_keeps_one_layer_more() -> None:
    """Our kernel under non-reentrant checkpointing, replayed on the CPU (Triton's
    interpreter), dense or packed alike: at the end of the forward one layer's q, k, v, O and
    log-sum-exp are still alive beyond what calc counts (the checkpoints keep only the layer
    inputs). Not counted: the H200's dense checkpointed rows of our kernel
    (data/training_steps_h200.csv) are within 0.02 % of calc, where this layer would be about
    1.3 % at 32,768 tokens, so it belongs to the replay (Triton's interpreter). This test pins
    the gap so that a change on either side shows."""
    fwd, _ = _replay("triton", True, LENGTHS)
    want = training_step(TINY, 1, T, attention="triton", checkpointing=True,
                         packed_lengths=LENGTHS)
    one_layer = 2 * T * 64 + 2 * (2 * T * 32) + 2 * T * 64 + 4 * 4 * T  # q, k, v, O, lse
    assert fwd - want.activations_bytes == one_layer


# --- attnmem train --packed --------------------------------------------------------------------

def test_attnmem_train_packed(capsys: pytest.CaptureFixture[str]) -> None:
    """`attnmem train --packed 1000,3000,512`: batch 1, s the total, calc's numbers; a
    --seq-len or --batch that says otherwise and a refused attention are one line each."""
    import json

    from attnmem.cli import main

    assert main(["train", "--model", "Llama 3.1 8B", "--packed", "1000,3000,512", "--impl",
                 "triton", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    m = training_step(MODELS["Llama 3.1 8B"], 1, 4512, attention="triton",
                      packed_lengths=(1000, 3000, 512))
    assert r["peak_bytes"] == m.peak_bytes and r["packed_lengths"] == [1000, 3000, 512]
    assert r["longest_context"] is None
    assert main(["train", "--model", "Llama 3.1 8B", "--packed", "1k+3000", "--impl",
                 "triton"]) == 0
    assert "packed from 2 sequences (1,024, 3,000)" in capsys.readouterr().out
    for args, words in ((["--packed", "1000,3000", "--seq-len", "5"], "not the --packed total"),
                        (["--packed", "1000,3000", "--batch", "2"], "--batch must be 1"),
                        (["--packed", "1000,0"], "each --packed length"),
                        (["--packed", "1000,3000", "--impl", "sdpa_flash"], "no mask")):
        with pytest.raises(SystemExit) as e:
            raise SystemExit(main(["train", "--model", "Llama 3.1 8B", *args]))
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err
