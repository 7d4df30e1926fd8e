"""attnmem.calc.memory_parts (the Model memory page by part) sums to attnmem.calc.model_memory and
names each part's formula as it applies to the model; attnmem.calc.training_step.never_fits
says no GPU count fits only where the step at calc's largest count does not fit."""

from __future__ import annotations

from attnmem.calc import GPUS, MODELS, model_memory, training_step
from attnmem.calc.memory_parts import FLASH, NAIVE, STATE, kv_formula, memory_parts
from attnmem.calc.training_step import MANY_GPUS, never_fits


def test_parts_sum_to_model_memory() -> None:
    model = MODELS["Llama 3.1 8B"]
    parts, formulas = memory_parts(model, 1, 8192, "bf16", "bf16", "bf16")
    assert list(parts) == [NAIVE, FLASH]
    for impl, p in parts.items():
        assert sum(p.values()) == model_memory(model, 1, 8192, "bf16", "bf16", "bf16", impl).total_bytes
        assert STATE not in p
    assert formulas["KV cache"] == kv_formula(model) == "2·L·B·s·H_kv·d·e (all layers)"
    assert formulas["weights"] == "parameter count × bytes per parameter"
    only = memory_parts(model, 1, 8192, "bf16", "bf16", "fp32", (NAIVE,))[0]
    assert list(only) == [NAIVE]


def test_hybrid_has_a_state_part_and_mla_its_latent() -> None:
    hybrid = next(m for m in MODELS.values() if m.state_layers)
    parts, formulas = memory_parts(hybrid, 2, 4096, "bf16", "bf16", "bf16")
    assert parts[NAIVE][STATE] > 0 and "layers" in formulas[STATE]
    mla = next(m for m in MODELS.values() if m.is_mla)
    assert "MLA latent" in kv_formula(mla)


def test_never_fits_is_the_step_at_the_largest_count() -> None:
    model, gpu = MODELS["Llama 3.1 8B"], GPUS["NVIDIA T4 16GB"]
    kw = dict(attention="eager", sharding="zero3")
    assert never_fits(model, gpu, 1, 65536, kw)
    assert training_step(model, 1, 65536, gpus=MANY_GPUS, **kw).peak_bytes > gpu
    assert not never_fits(model, gpu, 1, 1024, {"attention": "sdpa_flash", "sharding": "zero3"})
