"""attnmem.calc.training_step with LoRA adapters (issue 34): hand counts of the adapters' parameters,
gradients and AdamW state, the 4-bit base, refusals, hostile arguments, and CPU replays of a
tiny Llama's step through peft (skipped where torch, transformers or peft are missing).

The replays count live tensor storages (attnmem.measure.live_bytes.LiveBytes) over one step
after a warm-up: the bytes alive at the end of the forward equal calc's activations exactly;
the step's peak is within 1% (CPU has no cuBLAS workspace and no CUDA softmax `tmp`, which are
taken out of the prediction: attnmem.calc.train_common.CUBLAS_WORKSPACE_BYTES and
attnmem.calc.train_dense._attention_backward_extra)."""

from __future__ import annotations

import dataclasses

import pytest

from attnmem.calc import MODELS
from attnmem.calc.models import ModelConfig
from attnmem.calc.training_step import (
    CUBLAS_WORKSPACE_BYTES,
    LORA_PART,
    LoRA,
    lora_adapter_params,
    training_step,
)

TINY = ModelConfig(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                   head_dim=16, intermediate_size=160, vocab_size=1000, model_type="llama")
ATT = ("q_proj", "k_proj", "v_proj", "o_proj")
PARAMS = 214_336  # LlamaForCausalLM(TINY): sum of numel()


def test_adapter_parameters_by_hand() -> None:
    h, q, k, i, r = 64, 64, 32, 160, 8
    attn = r * ((h + q) + (h + k) + (h + k) + (q + h))  # A: r×in, B: out×r
    mlp = r * (2 * (h + i) + (i + h))
    assert lora_adapter_params(TINY, LoRA(r, targets="attention")) == 2 * attn == 7_168
    assert lora_adapter_params(TINY, LoRA(r, targets="all-linear")) == 2 * (attn + mlp)
    assert lora_adapter_params(TINY, LoRA(r, targets=("q_proj", "v_proj"))) == \
        2 * r * ((h + q) + (h + k))


@pytest.mark.parametrize("dtype, e", [("fp32", 4), ("bf16", 2)])
def test_weights_gradients_state_adapters_only(dtype: str, e: int) -> None:
    lora = LoRA(16, targets="all-linear", adapter_dtype=dtype)
    n = lora_adapter_params(TINY, lora)
    step = training_step(TINY, 2, 128, attention="sdpa_flash", adapters=lora)
    assert step.weights_bytes == 2 * PARAMS + e * n  # frozen bf16 base + adapters
    assert step.gradients_bytes == e * n  # no gradient for the base
    assert step.optimizer_bytes == 2 * e * n  # exp_avg, exp_avg_sq like the adapters
    assert step.before_step_bytes == 2 * PARAMS + 3 * e * n + CUBLAS_WORKSPACE_BYTES + 8 * 256
    # AdamW's foreach step: weights, gradients, state and one adapter-sized sqrt temporary
    assert step.phases["optimizer step"] == step.before_step_bytes + e * n + e * n
    sgd = training_step(TINY, 2, 128, attention="sdpa_flash", adapters=lora, optimizer="sgd")
    assert sgd.optimizer_bytes == 0
    full = training_step(TINY, 2, 128, attention="sdpa_flash")
    assert step.activations_bytes < full.activations_bytes + step.part(LORA_PART)


def test_frozen_layer_keeps_no_linear_input_by_hand() -> None:
    """Layer 1 of TINY with q, k, v, o adapters (fp32), SDPA: the input norm keeps its fp32
    copy and rsqrt but not its output; each adapted linear keeps an fp32 cast of its input and
    lora_A's output; the frozen MLP keeps gate(x), act and up(x) but not the product."""
    T, h, q, k, i, r = 256, 64, 64, 32, 160, 8
    norm = 4 * T * h + 4 * T
    layer1 = (2 * norm + 3 * (4 * T * h + 4 * T * r) + 2 * T * q + 2 * 2 * T * k
              + 2 * T * q + 4 * 2 * 4 * 128 + (4 * T * q + 4 * T * r) + 3 * 2 * T * i)
    layer0 = layer1 - norm  # the embedding's output does not require grad
    model = 4 * T * h + 4 * T + 2 * 2 * 128 * 16 + 4 * T * 1000 + 8 * T + 8
    step = training_step(TINY, 2, 128, attention="sdpa_flash", adapters=LoRA(8, targets="attention"))
    assert step.activations_bytes == layer0 + layer1 + model == 2_586_632


def test_qlora_base_bytes() -> None:
    """NF4: ceil(n/2) + fp32 absmax per 64 + the 16-entry code, per decoder matrix; double
    quantization: uint8 absmax + fp32 per 256 blocks + the 256-entry nested code."""
    m = MODELS["Llama 3.1 8B"]
    lora = LoRA(16, targets="all-linear")
    bf16 = training_step(m, 1, 1024, attention="sdpa_flash", adapters=lora)
    nf4 = training_step(m, 1, 1024, attention="sdpa_flash", adapters=lora, base_dtype="nf4")
    dq = training_step(m, 1, 1024, attention="sdpa_flash", adapters=lora, base_dtype="nf4_dq")
    h, q, k, i = 4096, 4096, 1024, 14336
    mats = [(q, h), (k, h), (k, h), (h, q), (i, h), (i, h), (h, i)]

    def nf4_bytes(n: int, double: bool) -> int:
        blocks = -(-n // 64)
        absmax = blocks + 4 * -(-blocks // 256) + 1024 if double else 4 * blocks
        return -(-n // 2) + absmax + 64

    linear = 32 * sum(o * c for o, c in mats)
    adapters = 4 * lora_adapter_params(m, lora)
    for step, double in ((nf4, False), (dq, True)):
        want = (32 * sum(nf4_bytes(o * c, double) for o, c in mats)
                + 2 * (m_params(m) - linear) + adapters)
        assert step.weights_bytes == want
    assert dq.weights_bytes < nf4.weights_bytes < bf16.weights_bytes / 2.5
    assert nf4.activations == bf16.activations
    # the dequantized bf16 copy of the largest matrix (gate/up/down) in a layer's backward
    assert nf4.phases["backward of the last layer"] - bf16.phases["backward of the last layer"] \
        == 2 * i * h - (bf16.weights_bytes - nf4.weights_bytes)


def m_params(m: ModelConfig) -> int:
    from attnmem.calc.params import param_count
    return param_count(m)


@pytest.mark.parametrize("kwargs, word", [
    (dict(adapters=LoRA(8, targets=("lm_head",))), "lm_head"),
    (dict(adapters=LoRA(8, targets=("embed_tokens",))), "embeddings"),
    (dict(adapters=LoRA(8, targets=("experts",))), "experts"),
    (dict(adapters=LoRA(8, use_dora=True)), "DoRA"),
    (dict(adapters=LoRA(8), precision="amp_bf16"), "autocast"),
    (dict(adapters=LoRA(8), gpus=2), "one GPU"),
    (dict(base_dtype="nf4"), "adapters"),
    (dict(base_dtype="int3", adapters=LoRA(8)), "int3"),
])
def test_refusals_name_the_reason(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        training_step(TINY, 1, 64, attention="sdpa_flash", **kwargs)


def test_refuses_moe_and_fused_models() -> None:
    with pytest.raises(ValueError, match="experts"):
        training_step(MODELS["Mixtral 8x7B"], 1, 64, attention="sdpa_flash", adapters=LoRA(8))
    with pytest.raises(ValueError, match="fuses"):
        training_step(dataclasses.replace(TINY, model_type="phi3"), 1, 64,
                      attention="sdpa_flash", adapters=LoRA(8))


HOSTILE = [None, True, -1, 0, 2.5, float("nan"), float("inf"), 10**30, "abc", "", [1], {}]


@pytest.mark.parametrize("field", ["rank", "alpha", "targets", "dropout", "adapter_dtype",
                                   "use_dora", "adapters", "base_dtype"])
@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_hostile_arguments_raise_value_error(field: str, value: object) -> None:
    kw: dict = dict(rank=8, alpha=16.0, targets="all-linear", dropout=0.0, adapter_dtype="fp32",
                    use_dora=False)
    outer: dict = {}
    if field in ("adapters", "base_dtype"):
        outer[field] = value
    else:
        kw[field] = value
    outer.setdefault("adapters", LoRA(**kw))
    try:
        step = training_step(TINY, 1, 64, attention="sdpa_flash", **outer)
    except ValueError as err:
        assert repr(value)[:20] in str(err) or str(value) in str(err), err
    else:  # only valid values get through
        assert (field, value) in (("alpha", 2.5), ("alpha", 10**30), ("dropout", 0),
                                  ("adapters", None)) and step.peak_bytes > 0, \
            (field, value)


# --- CPU replays through peft ------------------------------------------------------------------

def _replay(targets: object, r: int, ckpt: bool, attention: str, vocab: int, s: int,
            dropout: float = 0.0) -> tuple[int, int]:
    """(bytes alive at the end of the forward, peak over the step) of a tiny bf16 Llama with
    peft LoRA adapters, relative to the weights and optimizer state after a warm-up step."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from attnmem.measure.live_bytes import LiveBytes

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   vocab_size=vocab, attn_implementation=attention)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    config = peft.LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=dropout,
                             target_modules=list(targets) if isinstance(targets, tuple) else
                             targets if targets == "all-linear" else list(ATT))
    model = peft.get_peft_model(model, config)  # autocast_adapter_dtype=True: fp32 adapters
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, vocab, (2, s))

    def step(live: LiveBytes | None = None) -> int:
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        at_end = live.bytes if live else 0
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return at_end

    step()
    live = LiveBytes()
    for p in model.parameters():
        live.add(p)
    for state in opt.state.values():
        for v in state.values():
            live.add(v)
    live.bytes = live.peak = 0
    with live:
        fwd = step(live)
    return fwd, live.peak


@pytest.mark.parametrize("targets, ckpt, attention, r", [
    ("attention", False, "sdpa", 8), ("attention", True, "sdpa", 16),
    ("all-linear", False, "sdpa", 16), ("all-linear", True, "eager", 8),
    ("all-linear", False, "eager", 8), (("q_proj", "v_proj"), False, "eager", 8),
    (("gate_proj", "up_proj", "down_proj"), False, "sdpa", 8)])
def test_cpu_replay_forward_exact(targets: object, ckpt: bool, attention: str, r: int) -> None:
    fwd, _ = _replay(targets, r, ckpt, attention, 1000, 128)
    m = dataclasses.replace(TINY, vocab_size=1000)
    want = training_step(m, 2, 128, attention="eager" if attention == "eager" else "sdpa_flash",
                         checkpointing=ckpt, adapters=LoRA(r, targets=targets))
    assert fwd == want.activations_bytes


def test_cpu_replay_dropout_masks() -> None:
    """With lora_dropout, CUDA's native_dropout keeps a bool mask (counted); CPU's dropout keeps
    its fp32 noise instead (`input * noise`): 3 more bytes per mask element in the replay."""
    fwd, _ = _replay("all-linear", 8, False, "sdpa", 1000, 128, dropout=0.1)
    want = training_step(TINY, 2, 128, attention="sdpa_flash",
                         adapters=LoRA(8, targets="all-linear", dropout=0.1))
    masks = sum(x for _, lab, x in want.activation_terms if "dropout mask" in lab)
    assert masks == (5 * 64 + 64 + 160) * 256 + (64 + 2 * 64 + 160) * 256  # layer 0: no q, k, v
    assert fwd == want.activations_bytes + 3 * masks


@pytest.mark.parametrize("targets, ckpt, attention", [
    ("attention", True, "sdpa"), ("all-linear", True, "sdpa"), ("all-linear", False, "eager"),
    ("attention", False, "sdpa")])
def test_cpu_replay_peak_within_one_percent(targets: str, ckpt: bool, attention: str) -> None:
    """A short vocabulary (128) and s = 256 so that the layers' backward, not the loss, peaks
    when checkpointing or eager attention is on."""
    _, peak = _replay(targets, 16, ckpt, attention, 128, 256)
    m = dataclasses.replace(TINY, vocab_size=128)
    want = training_step(m, 2, 256, attention="eager" if attention == "eager" else "sdpa_flash",
                         checkpointing=ckpt, adapters=LoRA(16, targets=targets))
    cpu = want.peak_bytes - want.before_step_bytes
    if attention == "eager" and want.peak_phase.startswith("backward of"):
        cpu -= 4 * 2 * 4 * 256 * 256  # CUDA softmax backward's fp32 tmp, not made on CPU
    assert abs(cpu - peak) <= 0.01 * peak, (cpu, peak, want.peak_phase)
