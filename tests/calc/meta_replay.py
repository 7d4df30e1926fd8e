"""What the meta-device replays of real training steps share (tests/calc/test_kbit_replay.py,
test_training_liger_lora.py, test_trl_fused_replay.py): transformers' Llama config of a calc
ModelConfig, and the warm-up step then the measured one, marked as the harness runs them."""

from __future__ import annotations

from typing import Any


def llama_config(m: Any, **kw: Any) -> Any:
    """transformers.LlamaConfig with calc ModelConfig `m`'s widths, SDPA attention (and `kw`)."""
    import transformers

    return transformers.LlamaConfig(
        hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads, head_dim=m.head_dim, vocab_size=m.vocab_size,
        attn_implementation="sdpa", **kw)


def warm_up_and_step(rec: Any, model: Any, opt: Any, b: int, s: int) -> None:
    """Two training steps of `model` on (b, s) meta token ids with labels, each phase marked
    in `rec` ("<step> forward", "<step> backward", "<step> optimizer"): the warm-up leaves the
    optimizer's state and the allocator's history the measured step starts from."""
    import torch

    ids = torch.zeros(b, s, dtype=torch.long, device="meta")
    for step in ("warm-up", "step"):
        rec.mark(f"{step} forward")
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        rec.mark(f"{step} backward")
        loss.backward()
        del loss
        rec.mark(f"{step} optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
    del ids
