"""The two model lists (attnmem.measure.train_models, attnmem.measure.infer_models) make their
config dicts and transformers configs with one pair of functions (model_common.model_config,
config_object), so a rule holds for both: the layer count, the refused values, the keys
dropped; they differ only in the KV cache and the word in the unknown-name error."""

from __future__ import annotations

import pytest

from attnmem.measure import infer_models as im
from attnmem.measure import model_common as mc
from attnmem.measure import train_models as tm
from attnmem.measure.infer.config import InferConfig
from attnmem.measure.infer.config import check_config as infer_check
from attnmem.measure.train.config import TrainConfig
from attnmem.measure.train.config import check_config as train_check

LISTS = [(tm, "training", False), (im, "inference", True)]


@pytest.mark.parametrize("mod, what, cache", LISTS, ids=["train", "infer"])
def test_layers_are_a_whole_number_in_both_lists(mod, what, cache):
    d = mod.hf_config("tiny-llama", layers=3)
    assert d["num_hidden_layers"] == 3 and d["use_cache"] is cache
    assert mod.hf_config("tiny-llama")["num_hidden_layers"] == 2  # the list's own
    for bad in (0, -1, True, False, 2.0, "3"):
        with pytest.raises(ValueError, match=rf"layers must be a whole number >= 1, got {bad!r}"):
            mod.hf_config("tiny-llama", layers=bad)
    with pytest.raises(ValueError, match=rf"unknown {what} model 'gpt5'; known: .*tiny-llama"):
        mod.hf_config("gpt5")


def test_both_lists_build_the_same_tiny_llama_but_for_the_cache():
    t, i = tm.hf_config("tiny-llama"), im.hf_config("tiny-llama")
    assert {**t, "use_cache": True} == i
    assert t == mc.model_config(tm.MODELS, "tiny-llama", None, what="training",
                                use_cache=False)
    t["hidden_size"] = 7  # a copy: the list's base is untouched
    assert tm.hf_config("tiny-llama")["hidden_size"] == 64 == mc.TINY_LLAMA["hidden_size"]


def test_dropped_and_filled_keys():
    models = {"q": ({"model_type": "llama", "num_hidden_layers": 9, "layer_types": ["x"] * 9,
                     "quantization_config": {"quant_method": "mxfp4"}}, 2, "test")}
    for cache in (False, True):
        d = mc.model_config(models, "q", None, what="test", use_cache=cache)
        assert d == {"model_type": "llama", "num_hidden_layers": 2, "use_cache": cache}
    assert "quantization_config" not in tm.hf_config("gpt-oss-20b-2l")
    # the multimodal fixture gives its text config, with the text vocabulary written out
    for mod, name in ((tm, "gemma3-27b-2l"), (im, "gemma3-27b-12l")):
        d = mod.hf_config(name)
        assert d["model_type"] == "gemma3_text" and d["vocab_size"] == 262208


def test_the_configs_refuse_the_same_layers():
    for bad in (True, 0, 2.0):
        assert "layers must be a whole number >= 1" in train_check(
            TrainConfig("tiny-llama", 64, "eager", "fp32", layers=bad))
        assert "layers must be" in infer_check(InferConfig("tiny-llama", 8, "eager", layers=bad))
    assert train_check(TrainConfig("tiny-llama", 64, "eager", "fp32", layers=3)) is None
    assert infer_check(InferConfig("tiny-llama", 8, "eager", layers=3)) is None


def test_config_object_leaves_the_dict_alone():
    pytest.importorskip("transformers")
    d = im.hf_config("tiny-llama")
    before = dict(d)
    for mod in (tm, im):
        cfg = mod.build_config(d)
        assert cfg.model_type == "llama" and cfg.num_hidden_layers == 2
    assert d == before
    assert tm.build_config("tiny-llama").use_cache is False
    assert im.build_config("tiny-llama").use_cache is True
