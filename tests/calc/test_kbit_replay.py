"""The QLoRA recipe of issue 43 (peft's prepare_model_for_kbit_training, LoRA r=16 all-linear on
an NF4 base, checkpointing, SDPA's memory-efficient backend in fp32, paged 8-bit AdamW) at the
two bundled H100 rows' shapes (data/training_recipes_h100.csv, llama2-7b-2l: B=1 s=4096 and
B=4 s=2048):

- calc's peak is pinned to the measured peak (within 0.05 %; the target is 1 %), and is the
  loss moment, where the GPU's is;
- a replay of the whole step on the meta device (attnmem.trace.recorder: real transformers
  modules, peft's real prepare_model_for_kbit_training and get_peft_model, checkpointing,
  SDPA's efficient backend as attnmem.trace.fake_attention allocates it) puts its peak at the
  loss moment with the measured bytes, and its layers' backward moments equal calc's to the
  allocator's rounding. bitsandbytes needs CUDA, so the 4-bit linear is a stand-in that
  allocates what bitsandbytes 0.50.2's Linear4bit does on CUDA at more than 1,536 rows
  (nn/modules.py Linear4bit.forward; autograd/_functions.py MatMul4Bit;
  backends/cuda/ops.py gemm_4bit's dequantize-then-linear fallback): the input cast to bf16,
  the dequantized out×in bf16 weight for the forward's linear and again for the backward's
  matmul, no saved input, the output cast back to the input's dtype; its weight's class is
  named Params4bit, which peft's fp32 cast skips. Without bitsandbytes peft wraps it in its
  plain lora.Linear, whose forward differs from lora/bnb.py's Linear4bit only by a clone of
  the base output (a forward transient; the backward is the same).

The replay's dispatch mode keeps a reference to every storage, so autograd's InputBuffer adds
gradients out of place there (on the GPU it adds in place); the MLP product's backward, the
layers' largest moment here, is the same either way.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from attnmem.calc.models import ModelConfig
from attnmem.calc.training_step import PHASES, LoRA, training_step
from tests.calc.meta_replay import llama_config, warm_up_and_step

ROWS = Path(__file__).resolve().parents[2] / "data" / "training_recipes_h100.csv"
MODEL = ModelConfig(name="llama2-7b-2l", num_layers=2, hidden_size=4096, num_heads=32,
                    num_kv_heads=32, head_dim=128, intermediate_size=11008, vocab_size=32000,
                    model_type="llama")
RECIPE = dict(attention="sdpa_efficient", kbit_prepare=True, base_dtype="nf4",
              adapters=LoRA(16, alpha=32, targets="all-linear"), checkpointing=True,
              optimizer="paged_adamw_8bit")
SHAPES = [(1, 4096), (4, 2048)]


def _measured(b: int, s: int) -> dict:
    with ROWS.open() as f:
        rows = [r for r in csv.DictReader(f) if r["model"] == MODEL.name
                and r["kbit_prepare"] == "True" and int(r["batch"]) == b
                and int(r["seq_len"]) == s and r["status"] == "ok"]
    assert len(rows) == 1, (b, s, len(rows))
    r = rows[0]
    # the row is the configuration RECIPE describes
    assert (r["attention"], r["base_dtype"], r["optimizer"], r["lora_targets"]) == \
        ("sdpa_efficient", "nf4", "paged_adamw_8bit", "all-linear")
    assert (float(r["lora_rank"]), float(r["lora_dropout"]), r["checkpointing"]) == \
        (16.0, 0.0, "True")
    assert (int(float(r["hidden"])), int(float(r["intermediate"])), int(float(r["vocab"])),
            int(float(r["layers"]))) == (4096, 11008, 32000, 2)
    return {"peak": int(float(r["peak_bytes"])), "before": int(float(r["before_step_bytes"]))}


@pytest.mark.parametrize("b, s", SHAPES)
def test_qlora_recipe_rows_peak(b: int, s: int) -> None:
    """Both rows: peak within 0.05 % of the H100's (it was 7.3 % and 7.5 % over when the layers'
    backward was counted with the checkpointed input twice and a dequantized weight beside every
    candidate), before-step within 0.01 %, and the peak at the loss moment."""
    m = _measured(b, s)
    st = training_step(MODEL, b, s, **RECIPE)
    assert abs(st.peak_bytes / m["peak"] - 1) < 5e-4, (st.peak_bytes, m["peak"])
    assert abs(st.before_step_bytes / m["before"] - 1) < 1e-4
    assert st.peak_phase == PHASES[2]
    # the layers' backward stays under the loss moment, by the MLP product's backward
    assert st.phases[PHASES[4]] < st.phases[PHASES[2]]


def _replay(b: int, s: int) -> dict[str, int]:
    """Peaks above the memory before the step, per region of the measured step, on meta."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    import warnings

    from attnmem.trace.fake_attention import sdpa_as
    from attnmem.trace.masks import unpacked_rows
    from attnmem.trace.recorder import Recorder, _run

    class Params4bit(torch.nn.Parameter):  # the class name is what peft's cast skips
        pass

    class MatMul4Bit(torch.autograd.Function):
        """bitsandbytes' MatMul4Bit on CUDA at more than 1,536 rows (module docstring)."""

        @staticmethod
        def forward(ctx, a, w):
            ctx.shape = w.shape
            dq = torch.empty(w.shape, dtype=a.dtype, device=a.device)  # dequantized weight
            return torch.nn.functional.linear(a, dq)

        @staticmethod
        def backward(ctx, grad):
            dq = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)
            return torch.matmul(grad, dq), None

    class Linear4bit(torch.nn.Linear):
        def forward(self, x):
            return MatMul4Bit.apply(x.to(torch.bfloat16), self.weight).to(x.dtype)

    cfg = llama_config(MODEL)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
        for layer in model.model.layers:
            for parent in (layer.self_attn, layer.mlp):
                for name, mod in list(parent.named_children()):
                    if isinstance(mod, torch.nn.Linear):
                        new = Linear4bit(mod.in_features, mod.out_features, bias=False,
                                         dtype=torch.bfloat16)
                        new.weight = Params4bit(new.weight.data, requires_grad=False)
                        setattr(parent, name, new)
    model.is_loaded_in_4bit = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = peft.prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=True,
            gradient_checkpointing_kwargs={"use_reentrant": False})
    model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32,
                                                       target_modules="all-linear")).train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == 2_498_560  # the rows' trainable_params
    rec = Recorder(devices=("meta",))
    rec.known(*model.parameters(), *model.buffers())
    opt = torch.optim.AdamW(trainable, lr=1e-5, foreach=True)  # state: 20 MB, not the peak
    with sdpa_as("sdpa_efficient"), unpacked_rows(), rec, rec.track_modules(model):
        warm_up_and_step(rec, model, opt, b, s)
    ev = rec.events
    mark = {e[1]: i for i, e in enumerate(ev) if e[0] == "m"}
    start, bwd, end = mark["step forward"], mark["step backward"], mark["step optimizer"]

    def first(prefix: str, after: int) -> int:  # the recomputation of a layer starts the region
        return next(i for i in range(after, end) if ev[i][0] == "a" and prefix in ev[i][3])

    l1 = first("layers.1.input_layernorm", bwd)
    l0 = first("layers.0.input_layernorm", l1)
    out = dict.fromkeys(("forward", "loss", "last layer", "layer 0"), 0)
    base = 0
    for i, a, _ in _run(ev, False):
        if i == start:
            base = a.allocated
        if start <= i < end:
            k = ("forward" if i < bwd else "loss" if i < l1 else
                 "last layer" if i < l0 else "layer 0")
            out[k] = max(out[k], a.allocated - base)
    return out


@pytest.mark.parametrize("b, s", SHAPES)
def test_qlora_recipe_meta_replay(b: int, s: int) -> None:
    """The replay's peak is the loss moment with the measured bytes above before-step (the
    rows' allocator history can add one block's rounding: 512 KiB was seen at B=1); calc's
    loss, last-layer and layer-0 moments equal the replay's to within 64 KiB (512-byte
    rounding and the replay's tiny tensors)."""
    m = _measured(b, s)
    got = _replay(b, s)
    st = training_step(MODEL, b, s, **RECIPE)
    assert max(got, key=got.get) == "loss"
    assert abs(got["loss"] - (m["peak"] - m["before"])) <= 1 << 19, got
    calc = {"loss": PHASES[2], "last layer": PHASES[4], "layer 0": PHASES[5]}
    for region, phase in calc.items():
        above = st.phases[phase] - st.before_step_bytes
        assert abs(above - got[region]) <= 1 << 16, (region, above, got[region])
