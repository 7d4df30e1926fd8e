"""attnmem.calc.training_step: exact tensor counts for a tiny hand-computed model, linearity in the
number of layers, what sharding and tensor parallelism divide, refusals, the longest context.

The tiny model's figures were also replayed on a CPU with transformers 5.24's LlamaForCausalLM
under a dispatch mode that adds up the bytes of every live tensor storage (NOTES.md, "The
training step model"); `test_cpu_replay_matches` repeats that replay where transformers is
installed and is skipped elsewhere."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmem.calc import GPUS, MODELS
from attnmem.calc.models import ModelConfig
from attnmem.calc.parallel import layout_bytes, make_layout
from attnmem.calc.training_step import (
    CUBLAS_WORKSPACE_BYTES,
    PHASES,
    TRAIN_ATTENTIONS,
    max_train_seq_len,
    train_gpus_needed,
    training_step,
)

TINY = ModelConfig(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                   head_dim=16, intermediate_size=160, vocab_size=1000, model_type="llama")
B, S = 2, 128
T = B * S


def tiny_layer_by_hand(eager: bool) -> int:
    """One Llama layer's saved tensors, bf16, written out term by term (module docstring)."""
    h, q, kv, i, n = 64, 64, 32, 160, B * 4 * S * S
    norm = 4 * T * h + 4 * T + 2 * T * h  # fp32 copy, rsqrt, bf16 normalized input
    total = 2 * norm + 2 * (2 * T * h)  # two norms and their outputs (linear inputs)
    total += 2 * T * q  # rotated q
    if eager:  # repeat_kv copies of k and v, fp32 softmax + bf16 P, o_proj's contiguous input
        total += 2 * (2 * T * q) + 6 * n + 2 * T * q
    else:  # SDPA flash: k, v at H_kv heads, output (shared with o_proj) and log-sum-exp
        total += 2 * (2 * T * kv) + 2 * T * q + 4 * B * 4 * S
    return total + 4 * (2 * T * i)  # gate, act, up, product


def tiny_model_level() -> int:
    """Final norm, lm_head input, cos/sin, log-softmax, labels + loss."""
    return (4 * T * 64 + 4 * T + 2 * T * 64) + 2 * T * 64 + 2 * 2 * S * 16 \
        + 4 * T * 1000 + 8 * T + 8


@pytest.mark.parametrize("attention", ["eager", "sdpa_flash"])
def test_tiny_activations_exact(attention: str) -> None:
    step = training_step(TINY, B, S, attention=attention, precision="bf16")
    want = 2 * tiny_layer_by_hand(attention == "eager") + tiny_model_level()
    assert step.activations_bytes == want
    # The same figures the CPU replay of transformers' LlamaForCausalLM gave (to the byte).
    assert want == {"eager": 4_185_096, "sdpa_flash": 2_554_888}[attention]


def test_tiny_checkpointing_keeps_layer_inputs_only() -> None:
    step = training_step(TINY, B, S, attention="sdpa_flash", checkpointing=True)
    inputs = 2 * (2 * T * 64) + 8 * S  # two layer inputs and the position ids
    assert step.activations_bytes == inputs + tiny_model_level() == 1_232_904
    eager = training_step(TINY, B, S, attention="eager", checkpointing=True)
    assert eager.activations_bytes - step.activations_bytes == 2 * B * S * S  # the bf16 mask


def test_tiny_weights_state_before_and_peak() -> None:
    step = training_step(TINY, B, S, attention="sdpa_flash")
    params = 214_336  # transformers' LlamaForCausalLM of this config: sum of numel()
    assert step.weights_bytes == 2 * params
    assert step.gradients_bytes == 2 * params
    assert step.optimizer_bytes == 4 * params  # exp_avg + exp_avg_sq in bf16
    assert step.before_step_bytes == 6 * params + CUBLAS_WORKSPACE_BYTES + 8 * T
    # The loss backward: every saved tensor + nll_loss's and log_softmax's fp32 gradients.
    assert step.peak_phase == "loss backward (log-softmax)"
    assert step.peak_bytes - step.before_step_bytes == step.activations_bytes + 8 * T * 1000
    amp = training_step(TINY, B, S, attention="sdpa_flash", precision="amp_bf16")
    assert amp.weights_bytes == 4 * params and amp.optimizer_bytes == 8 * params
    opt = amp.phases["optimizer step"]
    assert opt == amp.before_step_bytes + 4 * params + 4 * params  # grads + foreach sqrt temp


def _with_layers(model: ModelConfig, n: int) -> ModelConfig:
    return dataclasses.replace(model, num_layers=n)


@pytest.mark.parametrize("attention", ["eager", "sdpa_flash", "sdpa_cudnn", "triton"])
@pytest.mark.parametrize("precision", ["bf16", "amp_bf16"])
@pytest.mark.parametrize("ckpt", [False, True])
def test_linear_in_layers(attention: str, precision: str, ckpt: bool) -> None:
    base = MODELS["Llama 3.1 8B"]
    rows = [training_step(_with_layers(base, n), 1, 2048, attention=attention,
                          precision=precision, checkpointing=ckpt) for n in (2, 3, 4, 8)]
    for field in ("activations_bytes", "weights_bytes", "optimizer_bytes", "before_step_bytes"):
        v = [getattr(r, field) for r in rows]
        per = v[1] - v[0]
        assert per > 0
        assert v[2] - v[1] == per, field  # one layer more costs the same
        assert abs(v[3] - v[2] - 4 * per) <= 4, field  # parameter bytes round per total
    for phase in ("backward of layer 0", "optimizer step"):
        v = [r.phases[phase] for r in rows]
        assert abs((v[2] - v[1]) - (v[1] - v[0])) <= 4, phase


def test_sharding_divides_by_n() -> None:
    m = MODELS["Llama 3.1 8B"]
    one = training_step(m, 1, 4096, attention="sdpa_flash")
    for n in (2, 8, 64):
        z1 = training_step(m, 1, 4096, attention="sdpa_flash", gpus=n, sharding="zero1")
        z2 = training_step(m, 1, 4096, attention="sdpa_flash", gpus=n, sharding="zero2")
        z3 = training_step(m, 1, 4096, attention="sdpa_flash", gpus=n, sharding="zero3")
        assert abs(z1.optimizer_bytes * n - one.optimizer_bytes) <= n
        assert z1.gradients_bytes == one.gradients_bytes and z1.weights_bytes == one.weights_bytes
        assert abs(z2.gradients_bytes * n - one.gradients_bytes) <= n
        assert abs(z3.weights_bytes * n - one.weights_bytes) <= n
        for z in (z1, z2, z3):  # activations are per replica, unchanged by sharding
            assert z.activations == one.activations
    ddp = training_step(m, 1, 4096, attention="sdpa_flash", gpus=8)
    # DDP's buckets are a second copy of the gradients (gradient_as_bucket_view=False).
    assert ddp.before_step_bytes - one.before_step_bytes == one.gradients_bytes


def test_tensor_parallel_divides_heads_columns_vocab() -> None:
    m = MODELS["Llama 3.1 8B"]
    one = training_step(m, 1, 4096, attention="sdpa_flash")
    tp = training_step(m, 1, 4096, attention="sdpa_flash", gpus=8, tp=8)
    assert tp.part("MLP") * 8 == one.part("MLP")
    assert tp.part("attention") * 8 == one.part("attention")
    assert tp.part("norms") == one.part("norms")  # replicated (no sequence parallelism)
    lay = make_layout(m, 8, 8, "none")
    assert layout_bytes(m, lay, "bf16")["weights"] < one.weights_bytes / 7


@pytest.mark.parametrize("kwargs, word", [
    (dict(attention="flash"), "attention"),
    (dict(attention="eager", precision="fp8"), "precision"),
    (dict(attention="eager", optimizer="adam8bit"), "optimizer"),
    (dict(attention="eager", gpus=6, tp=4), "multiple"),
    (dict(attention="eager", sharding="zero4"), "sharding"),
    (dict(attention="eager", gpus=0), "gpus"),
])
def test_bad_input_names_the_value(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        training_step(MODELS["Llama 3.1 8B"], 1, 1024, **kwargs)


def test_refuses_models_it_does_not_count() -> None:
    with pytest.raises(ValueError, match="latent"):  # MoE is counted (test_training_moe.py)
        training_step(MODELS["DeepSeek-V3 (MLA, MoE)"], 1, 1024, attention="sdpa_flash")
    with pytest.raises(ValueError, match="seq_len"):
        training_step(TINY, 1, 0, attention="sdpa_flash")


def test_every_attention_and_phase_named() -> None:
    from attnmem.calc.backends import NoKernel

    assert TINY.num_kv_heads < TINY.num_heads  # grouped-query: forced memory-efficient refused
    with pytest.raises(NoKernel, match="no grouped-query kernel"):
        training_step(TINY, 1, 1024, attention="sdpa_efficient")
    for attention in (a for a in TRAIN_ATTENTIONS if a != "sdpa_efficient"):
        step = training_step(TINY, 1, 1024, attention=attention)
        assert step.peak_phase in PHASES
        assert step.peak_bytes == max(step.phases.values()) >= step.before_step_bytes


def test_eager_grows_with_s_squared_flash_does_not() -> None:
    m = MODELS["Llama 3.1 8B"]
    e1, e2 = (training_step(m, 1, s, attention="eager").part("attention") for s in (8192, 16384))
    f1, f2 = (training_step(m, 1, s, attention="sdpa_flash").part("attention")
              for s in (8192, 16384))
    assert 3.9 < e2 / e1 < 4.0 and 1.9 < f2 / f1 <= 2.0


def test_max_train_seq_len_is_exact() -> None:
    m = _with_layers(MODELS["Llama 3.1 8B"], 4)
    gpu = GPUS["NVIDIA H100 80GB"]
    kw = dict(attention="sdpa_flash", precision="bf16")
    s = max_train_seq_len(m, gpu, 1, **kw)
    assert s > 0
    assert training_step(m, 1, s, **kw).peak_bytes <= gpu < training_step(m, 1, s + 1, **kw).peak_bytes


def test_gpus_needed_for_a_70b() -> None:
    m = MODELS["Llama 3.1 70B"]
    gpu = GPUS["NVIDIA H100 80GB"]
    n = train_gpus_needed(m, gpu, 1, 4096, attention="sdpa_flash", checkpointing=True)
    assert n > 1
    assert training_step(m, 1, 4096, attention="sdpa_flash", checkpointing=True, gpus=n,
                         sharding="zero3").peak_bytes <= gpu
    assert training_step(m, 1, 4096, attention="sdpa_flash", checkpointing=True, gpus=n - 1,
                         sharding="zero3").peak_bytes > gpu


@pytest.mark.parametrize("attention, precision, ckpt", [
    ("eager", "bf16", False), ("sdpa", "amp_bf16", False), ("eager", "amp_bf16", True),
    ("sdpa", "bf16", True)])
def test_cpu_replay_matches(attention: str, precision: str, ckpt: bool) -> None:
    """Replay a tiny Llama's training step on the CPU (transformers + torch): the bytes of the
    tensor storages alive at the end of the forward equal the predicted activations exactly.
    (CPU SDPA keeps what the fused CUDA kernels keep: q, k, v, the output, the log-sum-exp.)"""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.weak import WeakIdKeyDictionary

    class Live(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen = WeakIdKeyDictionary()
            self.bytes = 0

        def add(self, t: object) -> None:
            if isinstance(t, torch.Tensor) and t.untyped_storage() not in self.seen:
                st = t.untyped_storage()
                self.seen[st] = n = st.nbytes()
                self.bytes += n
                weakref.finalize(st, self.drop, n)

        def drop(self, n: int) -> None:
            self.bytes -= n

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else [out]:
                self.add(o)
            return out

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   vocab_size=1000, attn_implementation=attention)
    model = transformers.LlamaForCausalLM(cfg).train()
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 1000, (B, S))
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "amp_bf16")

    def forward() -> object:
        with amp:
            return model(input_ids=ids, labels=ids, use_cache=False).loss

    forward().backward()  # warm-up (lazy caches)
    live = Live()
    for p in model.parameters():  # views of weights (weight.t()) are not new memory
        live.add(p)
    live.bytes = 0
    with live:
        start = live.bytes
        loss = forward()
        want = training_step(TINY, B, S, attention="eager" if attention == "eager" else
                             "sdpa_flash", precision=precision, checkpointing=ckpt)
        assert live.bytes - start == want.activations_bytes
        loss.backward()


def test_gpt2_block_by_hand() -> None:
    """GPT-2 (LayerNorm, fused c_attn, gelu_new in torch ops, dropout 0.1 everywhere): one
    block's saved bytes, bf16, eager, term by term (attnmem.calc.train_dense._gpt2_layer_terms)."""
    gpt2 = MODELS["GPT-2 (124M)"]
    b, s, h, heads, i = 1, 1024, 768, 12, 3072
    t, n = b * s, b * heads * s * s
    by_hand = (2 * (2 * t * h + 8 * t + 2 * t * h)  # ln_1, ln_2: input, mean/rstd, output
               + 3 * 2 * t * h  # q, k, v copied by the matmuls
               + 2 * n + n + 2 * n  # softmax output, dropout mask (bool), dropped P
               + 2 * t * h  # c_proj input
               + 2 * t * h  # two residual dropout masks (bool)
               + 5 * 2 * t * i)  # gelu_new: x, tanh, 0.5·x, 1 + tanh, output
    one = training_step(dataclasses.replace(gpt2, num_layers=1), b, s, attention="eager")
    two = training_step(dataclasses.replace(gpt2, num_layers=2), b, s, attention="eager")
    assert two.activations_bytes - one.activations_bytes == by_hand
    with pytest.raises(ValueError, match="not counted yet"):
        training_step(dataclasses.replace(gpt2, model_type="gpt_neox"), 1, 1024,
                      attention="eager")


HOSTILE = [None, True, -1, 0, 2.5, float("nan"), float("inf"), 10**30, "abc", "", [1], {}]


@pytest.mark.parametrize("name", ["batch", "seq_len", "attention", "precision", "checkpointing",
                                  "optimizer", "gpus", "tp", "sharding", "use_cache"])
@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_hostile_arguments_raise_value_error(name: str, value: object) -> None:
    kw = dict(batch=1, seq_len=1024, attention="sdpa_flash", precision="bf16",
              checkpointing=False, optimizer="adamw", gpus=1, tp=1, sharding="none",
              use_cache=False)
    kw[name] = value
    b, s = kw.pop("batch"), kw.pop("seq_len")
    try:
        step = training_step(TINY, b, s, **kw)
    except ValueError as err:
        assert str(err)
    else:  # accepted values are the valid ones only (bools for flags)
        assert name in ("checkpointing", "use_cache", "tp", "gpus", "batch") and step.peak_bytes > 0


SUPPORTED = [name for name in ("Llama 3.1 8B", "Llama 3.2 1B", "Mistral 7B v0.1", "Qwen2.5 7B",
                               "Gemma 2 9B", "Gemma 3 27B (text)", "Phi-3 mini (3.8B)",
                               "GPT-2 (124M)") if name in MODELS]


@settings(max_examples=120, deadline=None, derandomize=True)
@given(name=st.sampled_from(SUPPORTED), batch=st.integers(1, 4), s=st.integers(1, 70_000),
       attention=st.sampled_from(TRAIN_ATTENTIONS), precision=st.sampled_from(["bf16", "amp_bf16"]),
       ckpt=st.booleans())
def test_properties(name: str, batch: int, s: int, attention: str, precision: str,
                    ckpt: bool) -> None:
    """Whole non-negative bytes; the peak is the largest moment and at least before-step; the
    peak never falls as s grows (max_train_seq_len's search needs that); doubling the batch at
    most doubles what the step adds to before-step."""
    from attnmem.calc.backends import NoKernel

    kw = dict(attention=attention, precision=precision, checkpointing=ckpt)
    m = MODELS[name]
    try:
        one = training_step(m, batch, s, **kw)
    except NoKernel:  # a forced backend without a kernel stays without one as s grows
        with pytest.raises(NoKernel):
            training_step(m, batch, s + 1, **kw)
        return
    try:
        more = training_step(m, batch, s + 1, **kw)
    except NoKernel:  # e.g. flash from the window's length on: the search counts it as no fit
        more = None
    for v in (one.weights_bytes, one.gradients_bytes, one.optimizer_bytes, one.peak_bytes,
              one.before_step_bytes, *one.activations.values()):
        assert isinstance(v, int) and v >= 0
    assert one.peak_bytes == max(one.phases.values()) >= one.before_step_bytes
    assert more is None or more.peak_bytes >= one.peak_bytes
    two = training_step(m, 2 * batch, s, **kw)
    assert two.peak_bytes - two.before_step_bytes <= 2 * (one.peak_bytes - one.before_step_bytes) + 8 * batch * s


def test_sliding_window_shorter_than_s_materializes_the_mask_under_sdpa() -> None:
    """Mistral-style window 64 < s = 128: transformers passes a mask, so SDPA gets k, v
    repeated to H heads and keeps the mask as a bf16 bias (the CPU replay: 2,751,496 B, and
    1,249,288 B under checkpointing). Flash takes no mask: refused (the H200's rows said "No
    available kernel"). A window as long as s still masks (masking_utils: kv_length >=
    window); one key longer does not."""
    from attnmem.calc.backends import NoKernel

    win = dataclasses.replace(TINY, sliding_window=64, sliding_window_layers=2,
                              model_type="mistral")
    plain = training_step(TINY, B, S, attention="sdpa_cudnn")
    step = training_step(win, B, S, attention="sdpa_cudnn")
    assert step.activations_bytes == 2_751_496
    per_layer = 2 * (2 * T * 64 - 2 * T * 32) + 2 * B * S * S  # k, v at H heads; the bias
    assert step.activations_bytes - plain.activations_bytes == 2 * per_layer
    ckpt = training_step(win, B, S, attention="sdpa_cudnn", checkpointing=True)
    assert ckpt.activations_bytes == 1_249_288
    for w in (64, S):
        with pytest.raises(NoKernel, match="flash backend takes no mask"):
            training_step(dataclasses.replace(win, sliding_window=w), B, S,
                          attention="sdpa_flash")
    as_long = dataclasses.replace(win, sliding_window=S)
    assert training_step(as_long, B, S, attention="sdpa_cudnn").activations == step.activations
    longer = dataclasses.replace(win, sliding_window=S + 1)  # covers every key: no mask
    assert training_step(longer, B, S, attention="sdpa_flash").activations == \
        training_step(TINY, B, S, attention="sdpa_flash").activations


@pytest.mark.parametrize("precision", ["bf16", "amp_bf16"])
def test_tied_embedding_backward_holds_two_or_three_vocab_gradients(precision: str) -> None:
    """A tied model's last backward moment: every gradient plus lm_head's V×h gradient waiting
    in autograd's input buffer, the embedding's own, and (bf16) their out-of-place sum; an
    untied model has no such moment. At a short context with a large vocabulary this is the
    step's peak (measured: data/training_steps_h200.csv, the tied models at 1,000 tokens)."""
    tied = dataclasses.replace(TINY, vocab_size=50_000, tie_embeddings=True)
    m = training_step(tied, 1, 16, attention="sdpa_flash", precision=precision)
    g_emb = (2 if precision == "bf16" else 4) * 50_000 * 64
    base = m.before_step_bytes + layout_bytes(tied, m.layout, precision)["step_buffers"]
    extra = g_emb if precision == "amp_bf16" else 2 * g_emb
    assert m.phases["backward of the tied embedding"] == base + m.gradients_bytes + extra
    if precision == "bf16":
        assert m.peak_phase == "backward of the tied embedding"
    untied = training_step(dataclasses.replace(tied, tie_embeddings=False), 1, 16,
                           attention="sdpa_flash", precision=precision)
    assert "backward of the tied embedding" not in untied.phases


def test_fused_projections_make_one_autocast_copy_each() -> None:
    """Under amp each linear saves a bf16 cast of its own input: q, k, v and gate, up make
    three and two in the Llama family; Phi-3's fused qkv_proj and gate_up_proj one each
    (measured: data/training_steps_h200.csv, Phi-3 mini under amp at 8,192 tokens, 301 MB, three
    bf16 (s, h) tensors per layer, below the Llama count). In bf16 nothing changes."""
    phi3 = dataclasses.replace(TINY, model_type="phi3")
    T, h, L = 2 * 16, 64, 2
    amp = {m.model_type: training_step(m, 2, 16, attention="sdpa_flash", precision="amp_bf16")
           for m in (TINY, phi3)}
    bf16 = {m.model_type: training_step(m, 2, 16, attention="sdpa_flash", precision="bf16")
            for m in (TINY, phi3)}
    gap = amp[TINY.model_type].part("projections") - amp["phi3"].part("projections")
    bf16_gap = bf16[TINY.model_type].part("projections") - bf16["phi3"].part("projections")
    assert gap - bf16_gap == L * 3 * 2 * T * h


def test_forced_flash_is_refused_exactly_where_the_h200_training_rows_found_no_kernel() -> None:
    """Every bundled training row with an SDPA backend forced (data/training_steps_h200.csv):
    calc refuses (NoKernel) exactly the rows that said "No available kernel" (flash under a
    sliding-window mask: Mistral, Gemma 2/3 and Phi-3 past their windows) and sizes every
    row that ran."""
    from pathlib import Path

    import pandas as pd

    from attnmem.calc.backends import NoKernel
    from attnmem.measure import train_models

    rows = pd.read_csv(Path(__file__).resolve().parents[2] / "data" / "training_steps_h200.csv")
    rows = rows[rows.attention.str.startswith("sdpa") & rows.status.isin(["ok", "unavailable"])
                & rows.packed_lengths.isna()]
    assert len(rows) >= 300 and (rows.status == "unavailable").sum() >= 5
    for r in rows.itertuples():
        model = ModelConfig.from_hf_config(train_models.hf_config(r.model))
        try:
            training_step(model, int(r.batch), int(r.seq_len), attention=r.attention,
                          checkpointing=bool(r.checkpointing))
            refused = False
        except NoKernel:
            refused = True
        no_kernel = r.status == "unavailable" and "No available kernel" in str(r.message)
        assert refused == no_kernel, (r.model, r.attention, r.seq_len, r.status)
