"""The architectures outside calc's rules (issue 42, item 6) in both model lists: their configs
are the installed transformers classes' defaults (or fixtures), each builds on the meta device
at its listed depth within an 80 GB card's budget, calc refuses each, and the meta-device
trace fills the predicted columns instead (on the CPU: layers cut, short prompts; the harness
is not run at full width). The ``h200-unruled`` plans list only known models and attentions."""

from __future__ import annotations

import pytest

from attnmem.measure import infer_models as im
from attnmem.measure import train_models as tm
from attnmem.measure import unruled_models as um
from attnmem.measure.infer import plan as iplan
from attnmem.measure.infer import predict as ipredict
from attnmem.measure.infer.config import ATTENTIONS as INFER_ATTENTIONS
from attnmem.measure.infer.config import InferConfig
from attnmem.measure.infer.config import check_config as infer_check
from attnmem.measure.train import plan as tplan
from attnmem.measure.train import predict as tpredict
from attnmem.measure.train.config import TrainConfig
from attnmem.measure.train.config import check_config as train_check

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

INFER = iplan.UNRULED_MODELS
TRAIN = tplan.UNRULED_MODELS
TRACE_MSG = "predicted by the meta-device trace (calc: "
#: The cut for the CPU predictions: 1 layer, but Qwen3-Next's first full-attention layer is
#: its 4th (a cache of linear-attention layers alone has no mask sizes).
CPU_LAYERS = {"qwen3-next-80b-4l": 4}
GiB = 2**30


def test_class_default_configs_are_the_installed_classes_defaults():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    for model_type, (d, added) in um.CLASS_DEFAULTS.items():
        assert d["model_type"] == model_type
        assert d["architectures"] == [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
        defaults = CONFIG_MAPPING[model_type]().to_dict()
        for key, value in d.items():
            if key in ("architectures", *added):
                continue
            assert key in defaults and defaults[key] == value, (model_type, key)
        doc = CONFIG_MAPPING[model_type].__doc__ or ""
        assert "huggingface.co/" in doc  # the checkpoint the descriptions quote
    # the one value added: the class has no head_dim, its model would take 4096 // 96
    assert um.GLM4_MOE["head_dim"] == 128 and not hasattr(
        CONFIG_MAPPING["glm4_moe"](), "head_dim")


def test_descriptions_name_the_class_and_the_docstrings_checkpoint():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    by_dict = {id(d): t for t, (d, _) in um.CLASS_DEFAULTS.items()}
    for mod, names in ((im, INFER), (tm, TRAIN)):
        for name in names:
            src, _, what = mod.MODELS[name]
            if isinstance(src, str):  # a fixture
                assert "fixture config.json" in what
                continue
            cls = CONFIG_MAPPING[by_dict[id(src)]]
            assert what.startswith(f"{cls.__name__} defaults, which describe ")
            checkpoint = what.split("which describe ")[1].split(" per its docstring")[0]
            assert f"huggingface.co/{checkpoint})" in " ".join(cls.__doc__.split())


@pytest.mark.parametrize("mod, name, budget", [
    *((im, n, 40 * GiB) for n in INFER), *((tm, n, 8 * 8 * GiB) for n in TRAIN)])
def test_each_entry_builds_on_meta_within_an_80gb_card(mod, name, budget):
    """bf16 weights under 40 GiB for inference; weights, gradients and AdamW's two moments (8
    bytes a parameter) under 64 GiB for a training step."""
    from transformers import AutoModelForCausalLM

    cfg = mod.build_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    per = 2 if mod is im else 8
    assert 0 < n * per < budget, f"{name}: {n * per / GiB:.1f} GiB"
    assert model.config.num_hidden_layers == mod.MODELS[name][1]


@pytest.mark.parametrize("name", INFER)
def test_inference_prediction_comes_from_the_trace(name):
    layers = CPU_LAYERS.get(name, 1)
    attentions = ("eager",) if name in iplan.EAGER_ONLY else ("sdpa", "eager")
    for attention in attentions:
        cfg = InferConfig(name, 24, attention, 1, 3, layers=layers)
        predicted, msg = ipredict.predict(cfg, im.hf_config(name, layers))
        assert msg.startswith(TRACE_MSG), msg
        assert predicted["predicted_peak_bytes"] >= predicted["predicted_prefill_peak_bytes"] > 0
        assert 0 < predicted["predicted_cache_bytes"] < predicted["predicted_peak_bytes"]
        assert predicted["predicted_peak_phase"] in ("prefill", "decode")


def test_the_prefill_phase_is_the_one_token_runs_peak():
    """One trace fills both peaks: its prefill phase is what generate() of one token peaks at."""
    d = im.hf_config("olmo2-7b", 1)
    many, _ = ipredict.predict(InferConfig("olmo2-7b", 20, "sdpa", 1, 5, layers=1), d)
    one, _ = ipredict.predict(InferConfig("olmo2-7b", 20, "sdpa", 1, 1, layers=1), d)
    assert many["predicted_prefill_peak_bytes"] == one["predicted_peak_bytes"]


def test_cases_the_trace_does_not_run_say_why():
    d = im.hf_config("olmo2-7b", 1)
    for cfg, why in ((InferConfig("olmo2-7b", 24, "sdpa", cache="static", layers=1),
                      "dynamic cache only"),
                     (InferConfig("olmo2-7b", 24, "sdpa", prefill_chunk=8, layers=1),
                      "one prefill"),
                     (InferConfig("olmo2-7b", 24, "triton", layers=1), "not 'triton'")):
        predicted, msg = ipredict.predict(cfg, d)
        assert msg.startswith("no prediction: ") and why in msg and "olmo2" in msg
        assert predicted["predicted_peak_bytes"] is None
    t = tm.hf_config("olmo2-7b-2l", 1)
    for cfg, why in ((TrainConfig("olmo2-7b-2l", 32, "eager", "amp_bf16", layers=1),
                      "bf16 precision only"),
                     (TrainConfig("olmo2-7b-2l", 32, "eager", "bf16", layers=1, adapter="lora"),
                      "full training only"),
                     (TrainConfig("olmo2-7b-2l", 32, "triton", "bf16", layers=1),
                      "not 'triton'")):
        p = tpredict.prediction(cfg, t)
        assert p.peak is None and why in p.message and p.refused is None, p


@pytest.mark.parametrize("name", TRAIN)
def test_training_prediction_comes_from_the_trace(name):
    layers = CPU_LAYERS.get(name, 1)
    for attention, ckpt in (("sdpa_flash", False), ("eager", True)):
        cfg = TrainConfig(name, 32, attention, "bf16", ckpt, layers=layers)
        peak, before, msg = tpredict.predict(cfg, tm.hf_config(name, layers))
        assert msg.startswith(TRACE_MSG), msg
        assert peak > before > 0


def test_trace_attentions_are_the_traces():
    from attnmem.trace.inference import TRACE_ATTENTIONS

    assert ipredict.TRACE_ATTENTIONS == tpredict.TRACE_ATTENTIONS == TRACE_ATTENTIONS


def test_plans_list_only_known_models_and_attentions():
    from attnmem.measure.infer.plan import PLANS as IPLANS
    from attnmem.measure.train.plan import PLANS as TPLANS

    rows = IPLANS["h200-unruled"]()
    assert len(rows) == len({c.label() for c in rows}) == 38
    assert {c.model for c in rows} == set(INFER)
    for c in rows:
        assert infer_check(c) is None and c.attention in INFER_ATTENTIONS
        assert c.attention in ipredict.TRACE_ATTENTIONS and ipredict.trace_case(c) == ""
        assert c.cache == "dynamic" and c.new_tokens == 8 and c.prefill_chunk is None
    for name in INFER:
        got = {(c.attention, c.batch, c.prompt_len) for c in rows if c.model == name}
        attns = ("eager",) if name in iplan.EAGER_ONLY else ("sdpa", "eager")
        assert {(a, 1, s) for a in attns for s in (1000, 8192)} <= got
        assert any(b == 4 for _, b, _ in got)
    # each model's rows together (one build per attention)
    order = [c.model for c in rows]
    assert order == sorted(order, key=INFER.index)

    steps = TPLANS["h200-unruled"]()
    assert len(steps) == len({c.label() for c in steps}) == 56
    assert {c.model for c in steps} == set(TRAIN)
    for c in steps:
        assert train_check(c) is None and tpredict.trace_case(c) == ""
    for name in TRAIN:
        got = {(c.attention, c.checkpointing, c.seq_len) for c in steps if c.model == name}
        assert got == {(a, k, s) for a in ("sdpa_flash", "eager") for k in (False, True)
                       for s in (1000, 4096)}
    # coverage first: every model's SDPA step without checkpointing before any other row
    first = steps[:2 * len(TRAIN)]
    assert {(c.model, c.attention, c.checkpointing) for c in first} == {
        (m, "sdpa_flash", False) for m in TRAIN}


def test_calc_has_no_rules_for_the_new_entries():
    """Each entry is outside calc's rules (why it is measured): calc refuses the model or the
    inference/training case."""
    from attnmem.calc import ModelConfig, inference_step, training_step

    for mod, names in ((im, INFER), (tm, TRAIN)):
        for name in names:
            with pytest.raises(ValueError):
                model = ModelConfig.from_hf_config(mod.hf_config(name), name=name)
                if mod is im:
                    inference_step(model, 1, 1000, 8, attention="eager")
                else:
                    training_step(model, 1, 1000, attention="eager", precision="bf16")
