"""Optimizer state of training_step's optimizers (attnmem/calc/train_optimizer.py), by hand."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from attnmem.calc import MODELS
from attnmem.calc.models import ModelConfig
from attnmem.calc.parallel import layout_bytes, make_layout
from attnmem.calc.train_optimizer import optimizer_state
from attnmem.calc.training_step import OPTIMIZERS, LoRA, lora_adapter_params, training_step
from attnmem.calc.units import ceil_bytes

TINY = ModelConfig(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                   head_dim=16, intermediate_size=160, vocab_size=1000, model_type="llama")
QMAPS = 2 * 256 * 4


def step(model: ModelConfig = TINY, **kw):
    return training_step(model, 1, 64, attention="sdpa_flash", **kw)


def test_8bit_min_size_and_blocks_by_hand() -> None:
    # 4095 elements: fp32 states; 4096: uint8 + one absmax per 256; 4097: 17 blocks
    assert optimizer_state("adamw_8bit", [(1, (4095,))], 2, 1).device == 8 * 4095
    assert optimizer_state("adamw_8bit", [(1, (4096,))], 2, 1).device == 2 * 4096 + 8 * 16 + QMAPS
    assert optimizer_state("adamw_8bit", [(1, (4097,))], 2, 1).device == 2 * 4097 + 8 * 17 + QMAPS


def test_tiny_adamw_8bit_by_hand() -> None:
    embed = 2 * 64_000 + 8 * 250  # embed_tokens and lm_head, 250 blocks each
    q_o = 2 * 4096 + 8 * 16  # q_proj, o_proj: exactly min_8bit_size
    k_v = 8 * 2048  # below min_8bit_size: fp32 states
    mlp = 2 * 10_240 + 8 * 40
    norm = 8 * 64
    total = 2 * embed + 2 * (2 * q_o + 2 * k_v + 3 * mlp + 2 * norm) + norm + QMAPS
    assert total == 488_224
    s = step(optimizer="adamw_8bit")
    assert s.optimizer_bytes == total and s.optimizer_paged_bytes == 0
    assert s.phases["optimizer step"] == s.before_step_bytes + s.gradients_bytes  # in place
    odd = step(dataclasses.replace(TINY, vocab_size=1001), optimizer="adamw_8bit")
    assert odd.optimizer_bytes == total + 2 * (2 * 64 + 8 * (251 - 250))  # block rounding


def test_paged_state_is_not_in_the_allocator_peak() -> None:
    big = dataclasses.replace(TINY, vocab_size=2000)  # 128,000-element embeddings: paged
    plain, paged = step(big, optimizer="adamw_8bit"), step(big, optimizer="paged_adamw_8bit")
    assert paged.optimizer_bytes == plain.optimizer_bytes
    assert paged.optimizer_paged_bytes == 2 * 2 * 128_000  # state1 + state2 of both tables
    assert paged.before_step_bytes == plain.before_step_bytes - paged.optimizer_paged_bytes
    assert paged.peak_bytes <= plain.peak_bytes
    small = step(optimizer="paged_adamw_8bit")  # nothing of >= 1e5 elements: nothing paged
    assert small.optimizer_paged_bytes == 0


def test_tiny_adafactor_by_hand() -> None:
    embed = 4 * (1000 + 64)
    layer = 2 * 4 * 128 + 2 * 4 * 96 + 3 * 4 * 224 + 2 * 4 * 64
    rms = 4 * (2 + 1 + 2 * 9)  # state["RMS"], a 0-d fp32 tensor per parameter tensor
    assert step(optimizer="adafactor").optimizer_bytes == \
        2 * embed + 2 * layer + 4 * 64 + rms == 18_836


def test_sgd_has_no_state() -> None:
    assert step(optimizer="sgd").optimizer_bytes == 0


def test_8bit_below_adamw() -> None:
    for prec in ("bf16", "amp_bf16"):
        m = MODELS["llama3-8b"] if "llama3-8b" in MODELS else next(iter(MODELS.values()))
        full = step(m, precision=prec).optimizer_bytes
        assert step(m, precision=prec, optimizer="adamw_8bit").optimizer_bytes < full
        assert step(m, precision=prec, optimizer="adafactor").optimizer_bytes < full


def test_default_is_todays_adamw() -> None:
    """The default's state and step are today's formula (attnmem.calc.parallel) on every preset
    that training_step counts."""
    for m in MODELS.values():
        try:
            s = step(m)
        except ValueError:
            continue
        assert s == step(m, optimizer="adamw")
        opt = layout_bytes(m, make_layout(m, 1, 1, "none"), "bf16")["optimizer"]
        assert s.optimizer_bytes == opt and s.optimizer_paged_bytes == 0
        assert s.phases["optimizer step"] == \
            s.before_step_bytes + s.gradients_bytes + ceil_bytes(Fraction(opt, 2))


def test_lora_counts_only_the_adapters() -> None:
    lora = LoRA(8, targets="attention")
    n = lora_adapter_params(TINY, lora)
    assert n == 7_168
    # every adapter tensor has fewer than 4096 elements: fp32 states, no maps
    assert step(adapters=lora, optimizer="adamw_8bit").optimizer_bytes == 8 * n
    big = LoRA(64, targets="attention")  # lora_A of q: 64 × 64 = 4096 elements, 8-bit
    st = step(adapters=big, optimizer="adamw_8bit").optimizer_bytes
    assert st < 2 * 4 * lora_adapter_params(TINY, big)
    fac = step(adapters=lora, optimizer="adafactor").optimizer_bytes
    # per layer lora_A (8, 64) × 4, lora_B (64, 8) × 2 (q, o) and (32, 8) × 2 (k, v): rows + cols,
    # and each of the 8 tensors' 0-d fp32 RMS
    assert fac == 2 * 4 * ((8 + 64) * 4 + (64 + 8) * 2 + (32 + 8) * 2 + 8) == 4160


@pytest.mark.parametrize("sharding", ["zero1", "zero2", "zero3", "fsdp"])
def test_sharded_state_divided_like_adamw(sharding: str) -> None:
    one = step(optimizer="adamw_8bit").optimizer_bytes
    four = step(optimizer="adamw_8bit", gpus=4, sharding=sharding).optimizer_bytes
    assert four == ceil_bytes(Fraction(one - QMAPS, 4)) + QMAPS
    fac = step(optimizer="adafactor").optimizer_bytes
    assert step(optimizer="adafactor", gpus=4, sharding=sharding).optimizer_bytes == \
        ceil_bytes(Fraction(fac, 4))


def test_refusals() -> None:
    with pytest.raises(ValueError, match="accepted: adamw, adamw_fused, adamw_8bit"):
        step(optimizer="lion")
    tp = dataclasses.replace(TINY, num_heads=4, num_kv_heads=2)
    with pytest.raises(ValueError, match="tp=2.*accepted with tp > 1"):
        step(tp, optimizer="adamw_8bit", gpus=2, tp=2)
    moe = next((m for m in MODELS.values() if m.num_experts > 1 and not m.is_mla), None)
    if moe is not None:
        with pytest.raises(ValueError, match="accepted for it: adamw, adamw_fused, sgd"):
            training_step(moe, 1, 64, attention="sdpa_flash", optimizer="adafactor")
    assert set(OPTIMIZERS) >= {"adamw", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd"}
