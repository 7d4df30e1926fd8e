"""calc's TRL mapping names the attention the run uses (attnmem.calc.train_levers:
TrlMapping.attention, attn_implementation) and refuses what calc cannot count.

TRL sets no attention: transformers' default is "sdpa" with torch choosing the backend per call.
Full rows reach SDPA with no mask (flash); TRL's padding-free rows (packing, bfd) reach it with
a block-diagonal bool mask, which SDPA's flash backend refuses ("No available kernel" when it is
forced, as the first H100 run of the TRL harness did), so torch picks the memory-efficient one.
tests/measure/test_trl_step.py checks those masks in a real SFTTrainer step on the CPU."""

from __future__ import annotations

import pytest

from attnmem.calc import MODELS
from attnmem.calc.train_levers import (
    TRL_ATTENTIONS,
    TRL_ATTENTIONS_REFUSED,
    parse_trl_args,
    trl_kwargs,
)
from attnmem.calc.train_packed import PACKED_REFUSED
from attnmem.calc.training_step import training_step

LLAMA = MODELS["Llama 3.1 8B"]


def test_sdpa_as_torch_picks_it():
    dense = trl_kwargs({"per_device_train_batch_size": 2, "max_length": 4096})
    assert (dense.attention, dense.attn_implementation) == ("sdpa_flash", "sdpa")
    assert any("no mask, so flash" in n for n in dense.notes)
    assert any("padding mask" in n for n in dense.notes)  # what is not counted, said
    packed = trl_kwargs(parse_trl_args("per_device_train_batch_size=2 max_length=4096 "
                                       "packing=true"))
    assert (packed.attention, packed.attn_implementation) == ("sdpa_efficient", "sdpa")
    assert any("rules out flash" in n for n in packed.notes)
    # wrapped packing is not padding-free (dense rows): flash; with padding_free it is
    wrapped = trl_kwargs({"packing": True, "packing_strategy": "wrapped"})
    assert wrapped.attention == "sdpa_flash"
    both = trl_kwargs({"packing": True, "packing_strategy": "wrapped", "padding_free": True})
    assert both.attention == "sdpa_efficient"
    # the page and `attnmem train` keep their own attention: it is not among the keywords
    assert "attention" not in packed.kwargs


def test_the_mapped_attention_is_counted_and_flash_is_not():
    """The packed step the first H100 run tried: calc counts the backend torch picks, and
    refuses the forced flash backend with the reason the GPU gave ("No available kernel")."""
    m = trl_kwargs({"per_device_train_batch_size": 2, "max_length": 4096, "packing": True})
    st = training_step(LLAMA, m.batch, m.seq_len, attention=m.attention, loss=m.loss,
                       **m.kwargs)
    assert st.peak_bytes > st.before_step_bytes > 0
    with pytest.raises(ValueError) as err:
        training_step(LLAMA, m.batch, m.seq_len, attention="sdpa_flash", loss=m.loss,
                      **m.kwargs)
    assert "takes no mask" in str(err.value) and "no kernel" in str(err.value)
    dense = trl_kwargs({"per_device_train_batch_size": 1, "max_length": 4096})
    assert training_step(LLAMA, dense.batch, dense.seq_len, attention=dense.attention,
                         loss=dense.loss, **dense.kwargs).peak_bytes > 0


def test_model_init_kwargs_attn_implementation():
    eager = trl_kwargs({"packing": True, "model_init_kwargs": {"attn_implementation": "eager"}})
    assert (eager.attention, eager.attn_implementation) == ("eager", "eager")
    fa4 = trl_kwargs({"model_init_kwargs": {"attn_implementation": "flash_attention_4"}})
    assert (fa4.attention, fa4.attn_implementation) == ("fa4", "flash_attention_4")
    default = trl_kwargs({"model_init_kwargs": {"attn_implementation": None, "dtype": "auto"}})
    assert default.attention == "sdpa_flash"
    assert default.ignored == ("model_init_kwargs.dtype",)
    assert set(TRL_ATTENTIONS) == {"sdpa", "eager", "flash_attention_4"}


@pytest.mark.parametrize("args, words", [
    ({"model_init_kwargs": {"attn_implementation": "flash_attention_2"}},
     TRL_ATTENTIONS_REFUSED["flash_attention_2"]),
    ({"model_init_kwargs": {"attn_implementation": "flash_attention_3"}},
     "flash_attention_3"),
    ({"model_init_kwargs": {"attn_implementation": "flex_attention"}}, "flex_attention"),
    ({"model_init_kwargs": {"attn_implementation": "kernels-community/flash-attn2"}},
     "a Hub kernel is not counted"),
    ({"model_init_kwargs": {"attn_implementation": 3}}, "attn_implementation=3"),
    ({"model_init_kwargs": "eager"}, "model_init_kwargs='eager'"),
    ({"packing": True, "model_init_kwargs": {"attn_implementation": "flash_attention_4"}},
     PACKED_REFUSED["fa4"]),
])
def test_attention_refusals_name_the_value(args, words):
    with pytest.raises(ValueError) as err:
        trl_kwargs(args)
    assert words in str(err.value) and "accepted:" in str(err.value)
