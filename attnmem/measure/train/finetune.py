"""LoRA and QLoRA set-up for the training-step measurement (issue 34), as attnmem.calc.training_step's
LoRA model and its CPU replays (tests/calc/test_training_lora.py) assume:

1. The base is built in bf16 like a full-training row (``AutoModelForCausalLM.from_config``),
   and gradient checkpointing, when on, is enabled on it before the adapters (the replays'
   order).
2. QLoRA (base_dtype ``nf4`` / ``nf4_dq``; ``quantize_base``): ``from_config`` has no
   checkpoint to quantize while loading, so every ``nn.Linear`` of the built model but the
   output layer (``get_output_embeddings()``: transformers' get_keys_to_not_convert leaves
   lm_head out) is replaced by a ``bitsandbytes.nn.Linear4bit`` made with the arguments
   transformers' ``replace_with_bnb_linear`` passes for ``BitsAndBytesConfig(load_in_4bit=True,
   bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=<nf4_dq>,
   bnb_4bit_compute_dtype=torch.bfloat16)`` (compute dtype, compress_statistics, quant_type,
   quant_storage), and its weight is the bf16 weight as a ``Params4bit`` quantized on the
   device, as transformers' ``Bnb4bitQuantize`` does while loading (blocksize 64, the
   default). Biases stay bf16 parameters. The model is marked ``is_loaded_in_4bit`` as
   transformers' bnb quantizer marks it, so that peft dispatches its bnb ``Linear4bit``
   adapters. (peft then skips its own enable_input_require_grads, as for a loaded 4-bit
   model; with checkpointing on, transformers' checkpointing enable (5.24) has already made
   the input embeddings' output require grad for every causal LM, LoRA and QLoRA alike.)
   Embeddings, norms and lm_head stay bf16.
   ``peft.prepare_model_for_kbit_training`` is NOT called: it upcasts every non-quantized
   parameter (embeddings, norms, lm_head) to fp32 and makes the input embeddings' output
   require grad, which attnmem.calc.training_step does not model; a row here is the QLoRA set-up
   without it (recorded in the row's message).
   bitsandbytes is imported lazily: where it is not installed (the GPU image has no wheel
   unless one is carried) the row is 'unavailable: bitsandbytes not installed'.
3. Adapters (``add_lora``): ``peft.get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha,
   target_modules=..., lora_dropout=dropout), autocast_adapter_dtype=<adapter_dtype ==
   "fp32">)``, no task_type (as the replays); targets ``attention`` = ["q_proj", "k_proj",
   "v_proj", "o_proj"], ``all-linear`` = peft's shorthand (every linear but the output
   layer). get_peft_model freezes every base parameter.
4. The optimizer takes the trainable parameters only (the adapters').

No torch, transformers, peft or bitsandbytes at import time.
"""

from __future__ import annotations

from typing import Any

from attnmem.measure.train.config import TrainConfig

#: peft target_modules for each TrainConfig.targets.
PEFT_TARGETS: dict[str, Any] = {"attention": ["q_proj", "k_proj", "v_proj", "o_proj"],
                                "all-linear": "all-linear"}
NO_KBIT_PREPARE = ("QLoRA without prepare_model_for_kbit_training (its fp32 upcast of the "
                   "non-quantized parameters is not modelled)")


class Unavailable(RuntimeError):
    """A package the configuration needs is missing (the row is 'unavailable')."""


def import_peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise Unavailable(f"peft not installed ({exc}); pip install peft") from None
    return peft


def import_bitsandbytes(needed_by: str = "QLoRA's 4-bit base") -> Any:
    try:
        import bitsandbytes
    except ImportError as exc:
        raise Unavailable(f"bitsandbytes not installed ({exc}): {needed_by} needs it "
                          "(pip install bitsandbytes, or carry its wheel)") from None
    return bitsandbytes


def quantize_base(model: Any, base_dtype: str) -> int:
    """Replace model's linears (not the output layer) by bitsandbytes Linear4bit, quantized
    where their weights are (module docstring, 2). Returns how many were replaced."""
    import torch

    bnb = import_bitsandbytes()
    from transformers import BitsAndBytesConfig

    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                           bnb_4bit_use_double_quant=base_dtype == "nf4_dq",
                           bnb_4bit_compute_dtype=torch.bfloat16)
    out = model.get_output_embeddings()
    names = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear and m is not out]
    for name in names:
        old = model.get_submodule(name)
        new = bnb.nn.Linear4bit(old.in_features, old.out_features, old.bias is not None,
                                q.bnb_4bit_compute_dtype,
                                compress_statistics=q.bnb_4bit_use_double_quant,
                                quant_type=q.bnb_4bit_quant_type,
                                quant_storage=q.bnb_4bit_quant_storage, device="meta")
        w = old.weight.detach()
        new.weight = bnb.nn.Params4bit(w, requires_grad=False, blocksize=new.weight.blocksize,
                                       compress_statistics=new.weight.compress_statistics,
                                       quant_type=new.weight.quant_type,
                                       quant_storage=new.weight.quant_storage, module=new)
        new.weight = new.weight.to(w.device)  # Params4bit.to quantizes (Params4bit._quantize)
        if old.bias is not None:
            new.bias = torch.nn.Parameter(old.bias.detach(), requires_grad=False)
        new.source_cls = type(old)
        new.requires_grad_(False)
        model.set_submodule(name, new)
        del old, w
    model.is_loaded_in_4bit = True
    return len(names)


def add_lora(model: Any, cfg: TrainConfig) -> Any:
    """The peft model with cfg's adapters (module docstring, 3)."""
    peft = import_peft()
    config = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.lora_dropout,
                             target_modules=PEFT_TARGETS[cfg.targets])
    return peft.get_peft_model(model, config,
                               autocast_adapter_dtype=cfg.adapter_dtype == "fp32")


def adapter_dtype_note(params: list[Any], cfg: TrainConfig) -> str:
    """'' when the trainable parameters have cfg's adapter dtype, else what they have."""
    import torch

    want = torch.float32 if cfg.adapter_dtype == "fp32" else torch.bfloat16
    got = sorted({str(p.dtype).removeprefix("torch.") for p in params if p.dtype != want})
    return f"adapters in {', '.join(got)}, not {cfg.adapter_dtype}" if got else ""
