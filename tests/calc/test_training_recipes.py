"""The recipe levers of issue 43 in attnmem.calc.training_step: kbit_prepare (peft's
prepare_model_for_kbit_training), liger (Liger's kernels), offload_activations (save_on_cpu),
the TRL SFTConfig mapping and the cheapest fitting combination. Hand counts from the sources
cited in attnmem/calc/train_recipes.py and train_liger.py, refusals, and a CPU replay of a tiny
QLoRA-shaped step through peft's real prepare_model_for_kbit_training (bitsandbytes needs CUDA:
a stand-in 4-bit linear does what Linear4bit.forward does to dtypes, and its weight's class is
named Params4bit, which is what peft's cast skips)."""

from __future__ import annotations

import pytest

from attnmem.calc import MODELS
from attnmem.calc.models import ModelConfig
from attnmem.calc.params import param_breakdown
from attnmem.calc.train_levers import cheapest_fit, parse_trl_args, trl_kwargs
from attnmem.calc.train_liger import LIGER_PHASE, flce_chunk
from attnmem.calc.training_step import PHASES, LoRA, training_step

LLAMA = MODELS["Llama 3.1 8B"]
QLORA = dict(adapters=LoRA(16, targets="all-linear"), base_dtype="nf4", checkpointing=True)
TINY = ModelConfig(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4,
                   head_dim=16, intermediate_size=160, vocab_size=1000, model_type="llama")


# --- kbit_prepare ---------------------------------------------------------------------------

def test_kbit_before_step_is_the_fp32_copies_exactly() -> None:
    """peft casts embeddings, lm_head and every norm weight (not Params4bit) to fp32: +2 bytes
    per such parameter before the step, nothing else."""
    plain = training_step(LLAMA, 1, 4096, attention="triton", **QLORA)
    prep = training_step(LLAMA, 1, 4096, attention="triton", kbit_prepare=True, **QLORA)
    pb = param_breakdown(LLAMA)
    h, v, L = 4096, 128256, 32
    assert pb["embeddings"] == pb["lm_head"] == v * h and pb["norms"] == (2 * L + 1) * h
    assert prep.before_step_bytes - plain.before_step_bytes == 2 * (2 * v * h + (2 * L + 1) * h)
    assert prep.peak_bytes > plain.peak_bytes  # the fp32 stream and fp32 logits' gradient


def test_kbit_layer_by_hand() -> None:
    """One layer of TINY (T = 256, MHA, sdpa_efficient), all-linear r = 8, no dropout: the two
    fp32 norm inputs and rsqrt, one shared fp32 norm output per norm (no cast per adapter),
    fp32 q, k, v, output, log-sum-exp, fp32 gate/act/up/product, seven lora_A outputs."""
    T, h, q, i, r = 256, 64, 64, 160, 8
    layer = (2 * (4 * T * h + 4 * T) + 2 * 4 * T * h + 3 * 4 * T * q + 4 * T * q
             + 4 * 2 * 4 * 128 + 4 * 4 * T * i + 7 * 4 * T * r)
    model = 4 * T * h + 4 * T + 2 * 4 * 128 * 16 + 4 * T * 1000 + 8 * T + 8
    ckpt = 2 * 4 * T * h + 8 * 128  # fp32 layer inputs and the position ids
    st = training_step(TINY, 2, 128, attention="sdpa_efficient", kbit_prepare=True,
                       adapters=LoRA(8, targets="all-linear"), base_dtype="nf4",
                       checkpointing=True)
    assert st.activations_bytes == ckpt + model
    from attnmem.calc.train_common import _dims
    from attnmem.calc.train_recipes import kbit_layer_terms
    terms = kbit_layer_terms(_dims(TINY, 2, 128, 1), "sdpa_efficient",
                             ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                              "down_proj"), 8, 0.0)
    assert sum(x for _, _, x in terms) == layer


@pytest.mark.parametrize("kwargs, word", [
    (dict(kbit_prepare=True), "adapters"),
    (dict(kbit_prepare=True, adapters=LoRA(8), checkpointing=True), "base_dtype"),
    (dict(kbit_prepare=True, adapters=LoRA(8), base_dtype="nf4"), "checkpointing"),
    (dict(kbit_prepare=True, adapters=LoRA(8), base_dtype="nf4", checkpointing=True,
          attention="sdpa_flash"), "sdpa_efficient"),
    (dict(kbit_prepare="yes"), "True or False"),
])
def test_kbit_refusals(kwargs: dict, word: str) -> None:
    kw = {"attention": "sdpa_efficient", **kwargs}
    with pytest.raises(ValueError, match=word):
        training_step(TINY, 1, 64, **kw)


def test_kbit_refuses_models_not_counted() -> None:
    with pytest.raises(ValueError, match="counted for"):
        training_step(MODELS["Gemma 2 9B"], 1, 64, attention="triton", kbit_prepare=True,
                      **QLORA)


def _kbit_replay(s: int, vocab: int) -> tuple[int, int, int]:
    """(before-step growth from the prepare step, bytes alive at the end of the forward, peak)
    of TINY with stand-in 4-bit linears through peft's prepare_model_for_kbit_training."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    import torch.nn.functional as F

    from attnmem.measure.live_bytes import LiveBytes

    class Params4bit(torch.nn.Parameter):  # the class name is what peft's cast skips
        pass

    class Fake4bit(torch.nn.Linear):  # bitsandbytes Linear4bit.forward's dtypes
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.linear(x.to(torch.bfloat16), self.weight).to(x.dtype)

    def build(prepare: bool):
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=160,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=4, head_dim=16, vocab_size=vocab,
                                       attn_implementation="sdpa")
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).train()
        for layer in model.model.layers:
            for parent in (layer.self_attn, layer.mlp):
                for name, mod in list(parent.named_children()):
                    if isinstance(mod, torch.nn.Linear):
                        new = Fake4bit(mod.in_features, mod.out_features, bias=False,
                                       dtype=torch.bfloat16)
                        new.weight = Params4bit(mod.weight.data, requires_grad=False)
                        setattr(parent, name, new)
        model.is_loaded_in_4bit = True
        if prepare:
            model = peft.prepare_model_for_kbit_training(model)
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16,
                                                           target_modules="all-linear"))
        return model.train()

    def run(model):
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        ids = torch.randint(0, vocab, (2, s))

        def step(live=None) -> int:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            at = live.bytes if live else 0
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return at

        step()
        live = LiveBytes()
        for p in model.parameters():
            live.add(p)
        for st in opt.state.values():
            for v in st.values():
                live.add(v)
        before = live.bytes
        live.bytes = live.peak = 0
        with live:
            fwd = step(live)
        return before, fwd, live.peak

    b0, _, _ = run(build(False))
    b1, fwd, peak = run(build(True))
    return b1 - b0, fwd, peak


def test_kbit_cpu_replay() -> None:
    """Before-step growth exact (2 bytes per embedding, lm_head and norm parameter), activations
    at the end of the forward exact, the peak (at the loss) within 0.1 %."""
    grow, fwd, peak = _kbit_replay(128, 1000)
    m = TINY
    st = training_step(m, 2, 128, attention="sdpa_efficient", kbit_prepare=True,
                       adapters=LoRA(8, targets="all-linear"), base_dtype="nf4",
                       checkpointing=True)
    assert grow == 2 * (2 * 1000 * 64 + 5 * 64) == 256_640
    assert fwd == st.activations_bytes
    assert st.peak_phase == PHASES[2]
    cpu = st.peak_bytes - st.before_step_bytes
    assert abs(cpu - peak) <= 0.001 * peak, (cpu, peak)


# --- Liger -----------------------------------------------------------------------------------

def test_flce_chunk_formula() -> None:
    """next_power_of_2(cdiv(T, cdiv(V, h))): Llama 3 (V 128,256, h 4,096): inc 32."""
    assert flce_chunk(4096, 128256, 4096) == 128
    assert flce_chunk(4096 * 4, 32000, 4096) == 2048  # Liger's own comment's example
    assert flce_chunk(1, 128256, 4096) == 1


def test_liger_layer_saving_by_hand() -> None:
    """Full bf16 training, per layer: each of the two RMSNorms keeps X (2Th) instead of the fp32
    copy and the normalized input (6Th); SwiGLU keeps gate and up, not act (2TI)."""
    T, h, i, L = 4096, 4096, 14336, 32
    plain = training_step(LLAMA, 1, T, attention="sdpa_flash")
    lig = training_step(LLAMA, 1, T, attention="sdpa_flash", liger=True)
    layers = L * (2 * 4 * T * h + 2 * T * i)
    final = 4 * T * h  # the final norm likewise
    v = 128256
    loss = 4 * T * v + 2 * T * h - 2 * T * h - 2 * v * h  # log-softmax, lm_head input out; grads in
    assert plain.activations_bytes - lig.activations_bytes == layers + final + loss
    assert LIGER_PHASE in lig.phases and PHASES[2] not in lig.phases
    assert lig.before_step_bytes == plain.before_step_bytes


def test_liger_lora_keeps_no_logits() -> None:
    st = training_step(LLAMA, 1, 16384, attention="sdpa_flash", liger=True, **QLORA)
    assert not any("log-softmax" in lab for _, lab, _ in st.activation_terms)
    plain = training_step(LLAMA, 1, 16384, attention="sdpa_flash", **QLORA)
    assert st.peak_bytes < plain.peak_bytes - 4 * 16384 * 128256


@pytest.mark.parametrize("model, kwargs, word", [
    (LLAMA, dict(precision="amp_bf16"), "bf16"),
    (MODELS["Llama 3.2 1B"], {}, "tied"),
    (MODELS["Gemma 2 9B"], {}, "counted for"),
    (LLAMA, dict(kbit_prepare=True, attention="triton", **QLORA), "kbit"),
    (LLAMA, dict(liger="true"), "True or False"),
])
def test_liger_refusals(model: ModelConfig, kwargs: dict, word: str) -> None:
    kw = {"attention": "sdpa_flash", "liger": True, **kwargs}
    with pytest.raises(ValueError, match=word):
        training_step(model, 1, 64, **kw)


# --- offload_activations ----------------------------------------------------------------------

def test_offload_takes_the_saved_activations_off_the_gpu() -> None:
    """Without checkpointing the layers' backward holds one layer (and its largest weight) back
    on the GPU, not all of them; the optimizer step does not change."""
    plain = training_step(LLAMA, 1, 16384, attention="sdpa_flash", optimizer="adamw_8bit")
    off = training_step(LLAMA, 1, 16384, attention="sdpa_flash", optimizer="adamw_8bit",
                        offload_activations=True)
    last = PHASES[4]
    assert plain.phases[last] - off.phases[last] > 0.9 * 31 / 32 * plain.activations_bytes \
        - 4 * 16384 * 128256
    assert off.phases[PHASES[7]] == plain.phases[PHASES[7]]
    assert off.before_step_bytes == plain.before_step_bytes


@pytest.mark.parametrize("kwargs, word", [
    (dict(adapters=LoRA(8)), "adapters"),
    (dict(liger=True), "liger"),
    (dict(packed_lengths=(32, 32), batch=1), "packed"),
    (dict(offload_activations=1), "True or False"),
])
def test_offload_refusals(kwargs: dict, word: str) -> None:
    kw = {"attention": "sdpa_flash", "offload_activations": True, **kwargs}
    b = kw.pop("batch", 1)
    with pytest.raises(ValueError, match=word):
        training_step(LLAMA, b, 64, **kw)


# --- TRL -------------------------------------------------------------------------------------

def test_trl_defaults() -> None:
    """trl 1.16: loss_type nll, which (like every loss_type) runs TRL's fused LM head."""
    m = trl_kwargs({})
    assert (m.batch, m.seq_len) == (8, 1024)
    assert m.kwargs == {"checkpointing": True, "precision": "bf16", "optimizer": "adamw_fused",
                        "liger": False, "offload_activations": False}
    assert m.loss == "trl_fused" and any("fused LM head" in n for n in m.notes)
    chunked = trl_kwargs({"loss_type": "chunked_nll"})
    assert chunked.loss == "trl_fused" and any("maps it to nll" in n for n in chunked.notes)
    dft = trl_kwargs({"loss_type": "dft"})
    assert dft.loss == "trl_fused" and any("dft" in n for n in dft.notes)


def test_trl_padding_free_and_levers() -> None:
    m = trl_kwargs(parse_trl_args("--per_device_train_batch_size=2, max_length=4096 "
                                  "packing=True use_liger_kernel=true optim=paged_adamw_8bit "
                                  "gradient_checkpointing=False learning_rate=1e-4"))
    assert (m.batch, m.seq_len) == (1, 8192)
    assert m.kwargs["packed_lengths"] == (4096, 4096)
    assert m.kwargs["liger"] and m.kwargs["optimizer"] == "paged_adamw_8bit"
    assert m.kwargs["checkpointing"] is False and m.ignored == ("learning_rate",)
    st = training_step(LLAMA, m.batch, m.seq_len, attention="triton", loss=m.loss, **m.kwargs)
    assert st.peak_bytes > 0 and LIGER_PHASE not in st.phases  # Liger's layers, TRL's head
    wrapped = trl_kwargs(parse_trl_args('{"packing": true, "packing_strategy": "wrapped"}'))
    assert "packed_lengths" not in wrapped.kwargs and wrapped.batch == 8
    # padding_free=True makes wrapped packing padding-free too (SFTTrainer.__init__)
    both = trl_kwargs({"packing": True, "packing_strategy": "wrapped", "padding_free": True})
    assert both.kwargs["packed_lengths"] == (1024,) * 8


@pytest.mark.parametrize("args, word", [
    ({"optim": "lion_32bit"}, "lion_32bit"),
    ({"fp16": True}, "fp16"),
    ({"max_length": None}, "max_length"),
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size"),
    ({"gradient_checkpointing_kwargs": {"preserve_rng_state": False}}, "use_reentrant"),
    ({"loss_type": "focal"}, "focal"),
    ({"bf16": "yes"}, "bf16"),
    ({"packing_strategy": "ffd"}, "ffd"),
    ({"padding_free": True}, "max_length` is not enforced"),  # TRL's own refusal
    ({"label_smoothing_factor": 0.1}, "label_smoothing_factor"),
    ({"activation_offloading": True}, "activation_offloading"),
    ({"use_liger_kernel": True, "liger_kernel_config": {"fused_linear_cross_entropy": True}},
     "fused_linear_cross_entropy"),
])
def test_trl_refusals_name_the_value(args: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        trl_kwargs(args)


@pytest.mark.parametrize("text, word", [("{not json", "JSON"), ("[1, 2]", "key=value"),
                                        ("max_length", "key=value"), (None, "text")])
def test_trl_parse_refusals(text: object, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        parse_trl_args(text)  # type: ignore[arg-type]


# --- the cheapest combination ----------------------------------------------------------------

def test_cheapest_fit_is_the_fewest_levers_that_fit() -> None:
    gpu = 80 * 10**9

    def step(**kw):
        return training_step(LLAMA, 1, 16384, **kw)

    base = {"attention": "sdpa_flash"}
    assert step(**base).peak_bytes > gpu
    combo, peak, rows = cheapest_fit(step, gpu, base)
    assert combo and peak <= gpu and len(rows) == len(combo)
    assert all(r.saving_bytes > 0 for r in rows)
    # no single lever fewer fits
    if len(combo) > 1:
        from attnmem.calc.train_levers import LEVERS
        for _, kw in LEVERS:
            try:
                assert step(**{**base, **kw}).peak_bytes > gpu
            except ValueError:
                pass
    nothing, p, r = cheapest_fit(step, 10**9, base)
    assert nothing == [] and r == [] and p > 10**9


def test_cheapest_fit_needs_nothing_when_it_fits() -> None:
    combo, peak, rows = cheapest_fit(lambda **kw: training_step(TINY, 1, 64, **kw), 10**12,
                                     {"attention": "sdpa_flash"})
    assert combo == [] and rows == [] and peak == training_step(
        TINY, 1, 64, attention="sdpa_flash").peak_bytes

