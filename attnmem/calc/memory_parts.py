"""The Model memory page's answer by part: weights, KV cache, the prefill's peak beyond them
and, for hybrids, the constant state of the non-attention layers, for each attention
implementation, each part with the formula it was computed by, as it applies to the model.

Every number is attnmem.calc.model_memory's (generate()'s prefill peak, attnmem.calc.inference_step,
or one attention call where that is not modelled) and attnmem.calc.kv.state_bytes'; this module
only splits and names them.
"""

from __future__ import annotations

from attnmem.calc.kv import state_bytes
from attnmem.calc.memory import model_memory
from attnmem.calc.models import ModelConfig
from attnmem.calc.params import CHECKPOINT

NAIVE, FLASH = "naive", "sdpa_flash"
#: The part a hybrid's non-attention layers hold (constant in s).
STATE = "recurrent state"
#: The weights' formula, by whether they are counted as the checkpoint stores them.
WEIGHTS_FORMULA = {False: "parameter count × bytes per parameter",
                   True: "as the checkpoint stores them: quantized modules in their format with "
                         "scales and zeros, the rest at torch_dtype (attnmem.calc.weight_bytes, 'checkpoint')"}


def kv_formula(model: ModelConfig) -> str:
    """The KV cache formula as it applies to this model (attnmem.calc.kv.kv_cache_bytes)."""
    if model.is_mla:
        return ("L·B·s·(kv_lora_rank + qk_rope_head_dim)·e: the MLA latent, all heads together "
                "(DeepSeek-V2, arXiv 2405.04434, sec. 2.1.2)")
    if model.kv_layers != model.num_layers:
        return f"2·L·B·s·H_kv·d·e over the {model.kv_layers} attention layers of {model.num_layers}"
    return "2·L·B·s·H_kv·d·e (all layers)"


def state_formula(model: ModelConfig) -> str:
    """The recurrent state's formula as it applies to this hybrid (attnmem.calc.kv.state_bytes)."""
    kind = model.state_mixer.kind if model.state_mixer else "state"
    return (f"{model.state_layers} {kind} layers × (conv + recurrent state elements) × B × e, "
            "the same for any s (attnmem.calc.kv.state_bytes; shapes from vLLM's "
            "MambaStateShapeCalculator), at the attention dtype")


def memory_parts(model: ModelConfig, batch: int, seq_len: int, wd: str, kvd: str, ad: str,
                 runs: tuple[str, ...] = (NAIVE, FLASH)
                 ) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """Bytes of each part for each implementation of ``runs`` (naive first), and the formula
    of each part."""
    parts: dict[str, dict[str, int]] = {}
    state = state_bytes(model, batch, ad)
    lower = counted = ""
    for impl in runs:
        mm = model_memory(model, batch, seq_len, wd, kvd, ad, impl)
        counted = counted or mm.counted_as
        # generate()'s prefill peak beyond weights and cache (attnmem.calc.inference_step), or, where
        # that is not modelled, one attention call (the total is then a lower bound).
        parts[impl] = {"weights": mm.weights_bytes, "KV cache": mm.kv_cache_bytes,
                       "attention": mm.total_bytes - mm.weights_bytes - mm.kv_cache_bytes}
        lower = lower or mm.not_modelled
        if state:
            parts[impl][STATE] = state
    return parts, {
        "weights": WEIGHTS_FORMULA[wd == CHECKPOINT],
        "KV cache": kv_formula(model),
        "attention": ("extra peak of one layer's attention call (attnmem.calc.attention_peak_bytes); "
                      f"a lower bound: {lower}") if lower else
        ("the prompt's prefill peak beyond weights and cache: MLP intermediates, hidden "
         "states, masks, one attention call, cuBLAS workspace (attnmem.calc.inference_step, "
         "generate() measured within 1% on an H200)" + (f"; {counted}" if counted else "")),
        STATE: state_formula(model),
    }
