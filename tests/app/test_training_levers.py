"""The Training page answers "what makes it fit" (issue 43, item 4): the recipe levers are
URL-kept inputs whose numbers are attnmem.calc.training_step's, the cheapest fitting combination
is calc's cheapest_fit with each lever's saving, the TRL box maps pasted SFTConfig arguments
through calc's mapping onto the page's inputs, and every refusal is a warning, never a
traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _frames import grids  # HTML tables and grids alike
from streamlit.testing.v1 import AppTest

import attnmem.calc
from attnmem.calc.train_levers import cheapest_fit, parse_trl_args, trl_kwargs
from attnmem.calc.training_step import LoRA

PAGE = str(Path(__file__).parents[2] / "attnmem" / "pages" / "training.py")
LLAMA = attnmem.calc.MODELS["Llama 3.1 8B"]
H100 = "NVIDIA H100 80GB"


def run(params: dict[str, str]) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    for k, v in params.items():
        at.query_params[k] = v
    return at.run()


def peak(at: AppTest, attention: str) -> str:
    return {x.label: x.value for x in at.metric}[
        attnmem.calc.TRAIN_ATTENTION_LABELS[attention] + ": peak"]


def gb(n: int) -> str:
    return attnmem.calc.format_bytes(n, "GB")


def unescaped(texts) -> list[str]:
    return [re.sub(r"\\(.)", r"\1", t.value) for t in texts]


QLORA = dict(adapters=LoRA(16), base_dtype="nf4")

# (URL inputs with the lever on, the same lever off, training_step's batch, s and keywords on)
LEVERS = {
    "liger": ({"liger": "true"}, {}, (1, 4096), dict(liger=True)),
    "offload": ({"offload": "true"}, {}, (1, 4096), dict(offload_activations=True)),
    "opt 8-bit": ({"opt": "adamw_8bit"}, {}, (1, 4096), dict(optimizer="adamw_8bit")),
    "opt paged": ({"opt": "paged_adamw_8bit"}, {}, (1, 4096), dict(optimizer="paged_adamw_8bit")),
    "opt adafactor": ({"opt": "adafactor"}, {}, (1, 4096), dict(optimizer="adafactor")),
    "ckpt": ({"ckpt": "true"}, {}, (1, 4096), dict(checkpointing=True)),
    "kbit": ({"ft": "qlora", "ckpt": "true", "kbit": "true"}, {"ft": "qlora", "ckpt": "true"},
             (1, 4096), dict(checkpointing=True, kbit_prepare=True, **QLORA)),
    "padding-free": ({"b": "4", "s": "2048", "pf": "true"}, {"b": "4", "s": "2048"},
                     (1, 8192), dict(packed_lengths=(2048,) * 4)),
}


@pytest.mark.parametrize("name", list(LEVERS))
def test_each_lever_changes_the_answer_to_calcs(name: str) -> None:
    on, off, (b, s), kw = LEVERS[name]
    base = {"model": "Llama 3.1 8B", "attns": "triton", "gpu": H100}
    at_on, at_off = run({**base, "s": "4096", **on}), run({**base, "s": "4096", **off})
    for at in (at_on, at_off):
        assert not at.exception, [e.value for e in at.exception]
        assert not at.warning, [w.value for w in at.warning]
        assert not [e for e in at.error if "cannot be computed" in e.value]
    m = attnmem.calc.training_step(LLAMA, b, s, attention="triton", **kw)
    assert peak(at_on, "triton") == gb(m.peak_bytes)
    assert peak(at_on, "triton") != peak(at_off, "triton")
    # the answer's own verdict follows the lever's peak
    gpu = attnmem.calc.torch_total_bytes(H100)
    said = at_on.success if m.peak_bytes <= gpu else at_on.error
    assert any("Fits one" in x.value or "Does not fit" in x.value for x in said)
    if name == "opt paged":  # what the peak leaves out is said beside it
        assert any("unified memory" in c.value for c in at_on.caption)


def test_the_url_keeps_the_levers() -> None:
    params = {"ft": "qlora", "ckpt": "true", "kbit": "true", "liger": "false",
              "offload": "false", "pf": "false", "opt": "paged_adamw_8bit", "attns": "triton"}
    at = run(params)
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    for key, value in params.items():
        assert at.query_params[key] == value, (key, at.query_params[key])
    boxes = {c.label: c.value for c in at.checkbox}
    assert boxes["peft prepare_model_for_kbit_training (QLoRA)"] is True
    m = attnmem.calc.training_step(LLAMA, 1, 4096, attention="triton", checkpointing=True,
                                   optimizer="paged_adamw_8bit", kbit_prepare=True, **QLORA)
    assert peak(at, "triton") == gb(m.peak_bytes)
    at = run({"liger": "true", "offload": "true", "pf": "true", "attns": "triton"})
    assert not at.exception
    for key in ("liger", "offload", "pf"):
        assert at.query_params[key] == "true"
    at = run({"liger": "perhaps"})  # a bad value: the default and a warning naming it
    assert not at.exception
    assert at.query_params["liger"] == "false"
    assert any("liger" in w for w in unescaped(at.warning))


def test_the_cheapest_table_is_calcs_cheapest_fit() -> None:
    at = run({"model": "Llama 3.1 8B", "s": "16384", "attns": "sdpa_flash", "gpu": H100})
    assert not at.exception, [e.value for e in at.exception]
    gpu = attnmem.calc.torch_total_bytes(H100)

    def step(**kw):
        return attnmem.calc.training_step(LLAMA, 1, 16384, **kw)

    base = dict(attention="sdpa_flash", precision="bf16", checkpointing=False, optimizer="adamw",
                gpus=1, tp=1, sharding="none", ep=1)
    levers, p, rows = cheapest_fit(step, gpu, base)
    assert levers and rows  # 16k does not fit an H100 as it is; some levers make it fit
    assert any(f"Fits with {' + '.join(levers)}: peak {gb(p)}" in x
               for x in unescaped(at.success))
    combo = next(d.value for d in grids(at) if "saving (computed)" in d.value.columns)
    assert list(combo["lever"]) == [r.lever for r in rows]
    assert list(combo["saving (computed)"]) == [gb(r.saving_bytes) for r in rows]
    alone = next(d.value for d in grids(at) if "peak with it" in d.value.columns)
    p0 = step(**base).peak_bytes
    liger = step(**base, liger=True).peak_bytes
    row = alone[alone["lever"] == "liger"].iloc[0]
    assert row["peak with it"] == gb(liger) and row["saving"] == gb(p0 - liger)
    assert any("cheapest_fit" in c.value for c in at.caption)  # said to be computed, and how
    # the answer's one line at the top (seen at 1280 x 800 without scrolling) says it too
    top = next(x for x in unescaped(at.markdown) if x.startswith("**Answer on one"))
    assert f"**{gb(p0)}, does not fit**" in top and f"**{' + '.join(levers)}**" in top
    # a step that fits as it is needs no lever
    at = run({"model": "Llama 3.1 8B", "s": "1024", "attns": "sdpa_flash", "ft": "lora"})
    assert any("no lever needed" in x.value for x in at.success)


def test_the_trl_box_sets_the_pages_inputs() -> None:
    at = run({"model": "Llama 3.1 8B", "attns": "triton"})
    text = ('{"per_device_train_batch_size": 2, "max_length": 8192, "optim": "paged_adamw_8bit",'
            ' "use_liger_kernel": true, "loss_type": "nll", "report_to": "none"}')
    at.text_area[0].input(text)
    at.button[0].click().run()
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    m = trl_kwargs(parse_trl_args(text))
    q = at.query_params
    assert (q["b"], q["s"], q["opt"], q["liger"], q["ckpt"], q["prec"], q["trlhead"]) == \
        ("2", "8192", "paged_adamw_8bit", "true", "true", "bf16", "true")
    assert m.loss == "trl_fused"  # trl 1.16: loss_type nll is the fused LM head
    step = attnmem.calc.training_step(LLAMA, m.batch, m.seq_len, attention="triton",
                                      loss=m.loss, **m.kwargs)
    assert peak(at, "triton") == gb(step.peak_bytes)
    said = " ".join(unescaped(at.caption))
    assert "TRL arguments applied" in said and "report_to" in said  # its notes and ignored keys
    # key=value lines, packing (bfd: padding-free): one row of b sequences of max_length
    at.text_area[0].input("per_device_train_batch_size=4\nmax_length=2048\npacking=true")
    at.button[0].click().run()
    assert not at.exception
    assert (at.query_params["b"], at.query_params["s"], at.query_params["pf"]) == ("4", "2048", "true")
    m = trl_kwargs({"per_device_train_batch_size": 4, "max_length": 2048, "packing": True})
    step = attnmem.calc.training_step(LLAMA, m.batch, m.seq_len, attention="triton",
                                      loss=m.loss, **m.kwargs)
    assert peak(at, "triton") == gb(step.peak_bytes)


@pytest.mark.parametrize("text, named", [
    ("optim=adam_foo", "adam_foo"),
    ('{"max_length": 4096,', "not valid JSON"),
    ("fp16=true", "fp16"),
    ("per_device_train_batch_size=0", "per_device_train_batch_size=0"),
    ("max_length=100000000000", "max_length"),  # TRL takes it; the page's range does not
])
def test_bad_trl_arguments_are_a_warning_naming_the_value(text: str, named: str) -> None:
    at = run({"model": "Llama 3.1 8B", "attns": "triton", "s": "4096", "b": "1"})
    before = peak(at, "triton")
    at.text_area[0].input(text)
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    warnings = unescaped(at.warning)
    assert any("TRL arguments not applied" in w and named in w for w in warnings), warnings
    assert peak(at, "triton") == before and at.query_params["s"] == "4096"  # nothing changed


def test_refused_levers_are_warnings_with_calcs_reason() -> None:
    # Liger with offloading: calc refuses the pair; the page says why and still answers what
    # makes it fit (from the step without them)
    at = run({"liger": "true", "offload": "true", "attns": "sdpa_flash"})
    assert not at.exception and not at.metric
    warnings = unescaped(at.warning)
    assert any("cannot be computed" in w and "offload_activations=True with liger=True" in w
               for w in warnings), warnings
    assert any("peak with it" in d.value.columns for d in grids(at))
    # Liger on a model with tied embeddings
    at = run({"model": "Llama 3.2 1B", "liger": "true", "attns": "sdpa_flash"})
    assert not at.exception
    assert any("tied embeddings" in w for w in unescaped(at.warning))
    # kbit prepare refuses SDPA's flash backend (fp32 q, k, v): that attention is named, the
    # one it accepts is still computed
    at = run({"ft": "qlora", "ckpt": "true", "kbit": "true", "attns": "sdpa_flash,triton"})
    assert not at.exception
    assert any("Not computed with these levers" in w and "sdpa_flash" in w
               for w in unescaped(at.warning))
    m = attnmem.calc.training_step(LLAMA, 1, 4096, attention="triton", checkpointing=True,
                                   kbit_prepare=True, **QLORA)
    assert peak(at, "triton") == gb(m.peak_bytes)
