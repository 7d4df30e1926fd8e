"""training_step(loss="trl_fused") (attnmem/calc/train_trl_loss.py) against trl 1.16's real fused
LM head, replayed on the meta device: a tiny Llama (2 layers, h = 256, V = 70,000: three
vocabulary tiles, the last one partial) through trl's own add_fused_lm_head and
ChunkedLogProbFunction, SFTTrainer.compute_loss's loss lines ("nll" and "dft"), checkpointing,
one warm-up step then the measured one (torch AdamW, foreach), every storage followed by
attnmem.trace.recorder and fed through calc's model of the CUDA caching allocator.

Meta has no Triton, so trl takes its torch path there (`_use_triton` is False): every position
scored, tile-sized fp32 temporaries. The GPU path is replayed by putting back what CUDA runs:
`_use_triton` True where the head picks the scored rows (hidden_states[mask]), and the Triton
kernels and CUDA's `torch.addmm(..., out_dtype=float32, out=acc)` as what they allocate, nothing
(they write in place). `torch.is_autocast_enabled("meta")` is answered False (torch has no
autocast for meta; on a bf16 model autocast's dtype is the hidden states' own).

Without trl (tests/measure runs install it with --target) the replays are skipped; the hand
counts need nothing.
"""

from __future__ import annotations

import contextlib
import functools

import pytest

from attnmem.calc.models import ModelConfig
from attnmem.calc.train_trl_loss import (
    TRL_HEAD_BACKWARD,
    TRL_HEAD_FORWARD,
    TRL_TOKEN_CHUNK,
    TRL_VOCAB_CHUNK,
    trl_head_moments,
    trl_positions,
)
from attnmem.calc.training_step import PHASES, LoRA, training_step
from tests.calc.meta_replay import llama_config

TINY = ModelConfig(name="tiny-trl", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=4,
                   head_dim=64, intermediate_size=512, vocab_size=70_000, model_type="llama")
STEP = dict(attention="sdpa_flash", checkpointing=True, optimizer="adamw")


# --- hand counts (no torch) -------------------------------------------------------------------

def test_positions_dense_and_packed() -> None:
    """Dense rows lose each row's first label to the shift; a packed row also each sequence's
    first label (TRL's collator sets it to -100): M = T − sequences either way."""
    assert trl_positions(2, 2300, None) == (2 * 2299, 2 * 2299)
    assert trl_positions(1, 3 * 1000, (1000, 1000, 1000)) == (2999, 2997)


def test_head_moments_by_hand() -> None:
    """B = 2, s = 2300 (M = 4,598 > one 4,096-row tile), h = 256, V = 70,000, lm_head trained."""
    m, h, v, t = 4598, 256, 70_000, 4600
    buf = 2 * 4096 * 32768
    fwd, bwd = trl_head_moments(2, 2300, h, v, None, True)
    assert fwd == 2 * t * h + buf + 36 * m - 12
    assert bwd == 4 * m + buf + 6 * m * h + 6 * v * h
    _, frozen = trl_head_moments(2, 2300, h, v, None, False)
    assert bwd - frozen == 6 * v * h
    # a short step: the tile has only M rows, still 32,768 columns wide
    assert trl_head_moments(1, 101, h, 1000, None, False)[1] == \
        4 * 100 + 2 * 100 * TRL_VOCAB_CHUNK + 6 * 100 * h
    assert TRL_TOKEN_CHUNK == 4096


def test_default_loss_is_unchanged_and_refusals_name_the_value() -> None:
    st = training_step(TINY, 1, 512, **STEP)
    assert st == training_step(TINY, 1, 512, loss="full", **STEP)
    assert PHASES[2] in st.phases and TRL_HEAD_BACKWARD not in st.phases
    refused = [(dict(loss="chunked"), "chunked"),
               (dict(loss="trl_fused", precision="amp_bf16"), "amp_bf16"),
               (dict(loss="trl_fused", use_cache=True, checkpointing=False), "use_cache"),
               (dict(loss="trl_fused", offload_activations=True), "offload_activations"),
               (dict(loss="trl_fused", gpus=2, sharding="fsdp"), "fsdp")]
    for kw, word in refused:
        with pytest.raises(ValueError, match=word):
            training_step(TINY, 1, 512, **{**STEP, **kw})


def test_fused_head_replaces_the_loss_terms_and_moments() -> None:
    """No log-softmax (4TV) and no lm_head input kept; the head's saved copy and vectors
    instead; the loss's two moments replaced by the head's; the layers' moments unchanged."""
    full = training_step(TINY, 2, 2300, **STEP)
    trl = training_step(TINY, 2, 2300, loss="trl_fused", **STEP)
    m, t, h, v = 4598, 4600, 256, 70_000
    assert full.activations_bytes - trl.activations_bytes == \
        (4 * t * v + 2 * t * h + 8 * 2 * 2300 + 8) - (2 * m * h + 16 * m + m + 12)
    assert PHASES[2] not in trl.phases and PHASES[3] not in trl.phases
    for k in (PHASES[0], PHASES[1], PHASES[4], PHASES[5], PHASES[7]):
        assert trl.phases[k] == full.phases[k], k
    assert trl.before_step_bytes == full.before_step_bytes


# --- the replay ----------------------------------------------------------------------------------

@contextlib.contextmanager
def _cuda_path(tu, cl):
    """trl's CUDA path on meta (module docstring)."""
    saved = (tu._use_triton, cl._forward_tile, cl._backward_tile, cl._addmm_fp32)
    tu._use_triton = lambda device: True
    cl._forward_tile = lambda *a, **k: None  # _forward_kernel: in place, no tensor made
    cl._backward_tile = lambda *a, **k: None  # _backward_kernel: writes the tile in place
    cl._addmm_fp32 = lambda acc, a, b: None  # addmm(out_dtype=float32, out=acc): in place
    try:
        yield
    finally:
        tu._use_triton, cl._forward_tile, cl._backward_tile, cl._addmm_fp32 = saved


@functools.cache
def _replay(b: int, s: int, cuda: bool = True, lora: bool = False, dft: bool = False,
            ) -> dict[str, int]:
    """Peaks above the memory at the start of the measured step: the head's forward (inside
    ChunkedLogProbFunction.forward), its backward, and from its end to the last layer's
    recomputation (the index's and slice's backward, the final norm's)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("trl")
    import warnings

    import trl.kernels.chunked_logprob as cl
    import trl.trainer.utils as tu

    from attnmem.trace.fake_attention import sdpa_as
    from attnmem.trace.masks import unpacked_rows
    from attnmem.trace.recorder import Recorder, _run

    cfg = llama_config(TINY)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # SFTTrainer.__init__: the head goes on the base model, before any PEFT wrapping
    tu.add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    if lora:
        peft = pytest.importorskip("peft")
        model.enable_input_require_grads()
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16,
                                                           target_modules="all-linear"))
    model.train()
    rec = Recorder(devices=("meta",))
    rec.known(*model.parameters(), *model.buffers())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5,
                            foreach=True)

    class Marked(cl.ChunkedLogProbFunction):
        @staticmethod
        def forward(ctx, *args):
            rec.mark("head forward")
            out = cl.ChunkedLogProbFunction.forward(ctx, *args)
            rec.mark("after head forward")
            return out

        @staticmethod
        def backward(ctx, *grads):
            rec.mark("head backward")
            out = cl.ChunkedLogProbFunction.backward(ctx, *grads)
            rec.mark("after head backward")
            return out

    real_fn, real_autocast = tu._ChunkedLogProbFunction, torch.is_autocast_enabled
    tu._ChunkedLogProbFunction = Marked
    torch.is_autocast_enabled = lambda *a: False if a and a[0] == "meta" else real_autocast(*a)
    try:
        with (_cuda_path(tu, cl) if cuda else contextlib.nullcontext()), \
                sdpa_as("sdpa_flash"), unpacked_rows(), rec, rec.track_modules(model):
            ids = torch.full((b, s), 5, dtype=torch.long, device="meta")
            labels = torch.full((b, s), 5, dtype=torch.long, device="meta")
            for step in ("warm-up", "step"):
                rec.mark(f"{step} forward")
                # SFTTrainer.compute_loss (trl 1.16), the fused branch
                outputs = model(input_ids=ids, labels=labels, use_cache=False, fused_lm_head=True)
                per_token_loss = -outputs.log_probs
                if dft:
                    per_token_loss = per_token_loss * outputs.log_probs.exp().detach()
                num_tokens = outputs.label_mask.sum()
                loss = per_token_loss.sum() / torch.as_tensor(num_tokens).clamp(min=1)
                # the metrics' reductions (their .item() left out: meta has no values)
                metrics = (outputs.label_mask.sum(), outputs.entropy.detach().sum(),
                           outputs.is_top1.sum())
                del outputs, per_token_loss, num_tokens, metrics
                rec.mark(f"{step} backward")
                loss.backward()
                del loss
                rec.mark(f"{step} optimizer")
                opt.step()
                opt.zero_grad(set_to_none=True)
            del ids, labels
    finally:
        tu._ChunkedLogProbFunction, torch.is_autocast_enabled = real_fn, real_autocast
    ev = rec.events
    start = max(i for i, e in enumerate(ev) if e == ("m", "step forward"))
    end = max(i for i, e in enumerate(ev) if e == ("m", "step optimizer"))
    region, base, out = None, 0, {}
    for i, a, _ in _run(ev, False):
        if i == start:
            base = a.allocated
        if not start <= i < end:
            continue
        e = ev[i]
        if e[0] == "m":
            region = {"head forward": "forward", "head backward": "backward",
                      "after head backward": "after"}.get(e[1])
        elif region == "after" and e[0] == "a" and ".layers.1." in e[3]:
            region = None  # the last layer's recomputation starts
        if region is not None:
            out[region] = max(out.get(region, 0), a.allocated - base)
    return out


def _calc(b: int, s: int, lora: bool = False) -> dict[str, int]:
    kw = dict(adapters=LoRA(8, alpha=16, targets="all-linear")) if lora else {}
    st = training_step(TINY, b, s, loss="trl_fused", **STEP, **kw)
    return {"forward": st.phases[TRL_HEAD_FORWARD] - st.before_step_bytes,
            "backward": st.phases[TRL_HEAD_BACKWARD] - st.before_step_bytes,
            "last layer": st.phases[PHASES[4]] - st.before_step_bytes}


@pytest.mark.parametrize("b, s, lora, tol", [(2, 2300, False, 8 << 10), (2, 2300, True, 8 << 10),
                                             (1, 1500, False, 1 << 20), (1, 5000, False, 1 << 20)])
def test_replay_of_the_cuda_path(b: int, s: int, lora: bool, tol: int) -> None:
    """The head's forward and backward moments equal the replay's within `tol` above: 512-byte
    rounding (under 5 KiB seen) where every large tensor fills its blocks exactly (B = 2); at
    B = 1 the allocator keeps whole blocks: a large-pool block is split only when more than
    1 MiB would remain (e.g. the 98,238,464-byte tile buffer of s = 1,500 takes a fresh
    98,566,144-byte segment), 0.5 to 0.7 MiB over calc's tensor bytes, as the GPU's
    max_memory_allocated would count. What follows the head's backward (the index's and the
    slice's gradients, the final norm's backward) stays under the last layer's backward."""
    got = _replay(b, s, True, lora)
    want = _calc(b, s, lora)
    for k in ("forward", "backward"):
        assert 0 <= got[k] - want[k] <= tol, (k, got[k], want[k])
    assert got["after"] < want["last layer"]


def test_dft_changes_no_moment() -> None:
    """dft's exp(log_probs), saved until its product's backward, is gone before the head's."""
    nll, dft = _replay(2, 2300), _replay(2, 2300, dft=True)
    for k in ("forward", "backward"):
        assert abs(nll[k] - dft[k]) <= 4 << 10, (k, nll[k], dft[k])


def test_torch_path_holds_gigabytes_more() -> None:
    """Devices without Triton: fp32 copies of the (4,096 × 32,768) tile and its temporaries,
    far above the CUDA path's moments (the numbers are in NOTES.md)."""
    gpu, cpu = _replay(2, 2300), _replay(2, 2300, cuda=False)
    tile_fp32 = 4 * 4096 * 32768
    assert cpu["forward"] - gpu["forward"] > 2 * tile_fp32
    assert cpu["backward"] - gpu["backward"] > 4 * tile_fp32
