"""attnmem/pages/will_it_fit.py: each task's verdict is the number of the one calc function that answers
the task elsewhere (issue 32, item 8); the URL round-trips; hostile URL values are named and
replaced; a model calc refuses for a task shows calc's reason; the explaining pages are linked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attnmem.calc import (
    MAX_SEQ_LEN,
    MODELS,
    ModelConfig,
    format_bytes,
    gpus_needed,
    inference_step,
    max_inference_seq_len,
    max_train_seq_len,
    train_gpus_needed,
    training_step,
)
from attnmem.calc.gpus import torch_total_bytes
from attnmem.calc.serving import serving_capacity

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "attnmem" / "pages" / "will_it_fit.py")
H100 = "NVIDIA H100 80GB"
LLAMA = MODELS["Llama 3.1 8B"]


def run(**query: str) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def url(at: AppTest) -> dict[str, str]:
    return {k: (v[0] if isinstance(v, list) else v) for k, v in at.query_params.items()}


def test_inference_default_is_calc_inference_step() -> None:
    at = run()
    gpu = torch_total_bytes(H100)
    m = inference_step(LLAMA, 1, 8192, 128, attention="sdpa")
    got = metrics(at)
    assert got["Peak"] == format_bytes(m.peak_bytes)
    assert got["Longest context that fits (tokens)"] == \
        f"{max_inference_seq_len(LLAMA, gpu, 1, 128, attention='sdpa'):,}"
    assert got["H100 80GB GPUs needed at s = 8,192"] == f"{gpus_needed(m.peak_bytes, gpu):,}"
    assert at.success and "Fits" in at.success[0].value and "attnmem.calc.inference_step" in at.success[0].value
    assert any(m.peak_phase.replace(":", "\\:") in c.value for c in at.caption)  # where it peaks
    # 277k tokens fit, past the 131,072 the model was trained for: flagged
    assert any("131,072 tokens this model was trained for" in i.value for i in at.info)
    assert any("Computed" in c.value for c in at.caption)
    assert not any("not modelled yet" in c.value for c in at.caption)  # LoRA/QLoRA are tasks


def test_serving_is_calc_serving_capacity_and_batch_is_concurrent_requests() -> None:
    at = run(task="serving", s="32768", b="20", gpu="NVIDIA H200 141GB")
    gpu = torch_total_bytes("NVIDIA H200 141GB")
    cap = serving_capacity(LLAMA, gpu, 32768)
    assert cap.max_concurrency >= 20
    got = metrics(at)
    used = cap.budget_bytes - cap.kv_pool_bytes + 20 * cap.bytes_per_sequence
    assert got["Peak"] == format_bytes(used)
    assert at.success and "attnmem.calc.serving_capacity" in at.success[0].value
    # one request: the longest is serving_capacity's own max_context
    at = run(task="serving", s="32768", gpu="NVIDIA H200 141GB")
    assert metrics(at)["Longest context that fits (tokens)"] == f"{cap.max_context:,}"


def test_training_is_calc_training_step_and_says_it_does_not_fit() -> None:
    """The 8k Llama step of issue 32: 113.78 GB, which does not fit one H100 (the old Model
    memory training view said 18.75 GB and 'Fits')."""
    at = run(task="training")
    gpu = torch_total_bytes(H100)
    m = training_step(LLAMA, 1, 8192, attention="sdpa_flash")
    got = metrics(at)
    assert got["Peak"] == format_bytes(m.peak_bytes) == "113.78 GB"
    assert got["Longest context that fits (tokens)"] == \
        f"{max_train_seq_len(LLAMA, gpu, 1, attention='sdpa_flash'):,}"
    n = train_gpus_needed(LLAMA, gpu, 1, 8192, sharding="zero3", max_gpus=1 << 20,
                          attention="sdpa_flash")
    assert got["H100 80GB GPUs needed at s = 8,192"] == f"{n:,}" and n > 1
    assert at.error and "Does not fit" in at.error[0].value
    assert "wdtype" not in at.query_params and "new" not in at.query_params


@pytest.mark.parametrize("task,method,base", [("lora", "lora", "bf16"), ("qlora", "qlora", "NF4")])
def test_lora_and_qlora_are_calc_training_step_with_the_training_pages_adapters(
        task: str, method: str, base: str) -> None:
    """LoRA and QLoRA (issue 32 item 8, "once they exist"): the Training page's default
    adapters (attnmem.calc.finetune.calc_kwargs), one GPU, no GPU count (calc refuses adapters over
    several GPUs), and a link that opens the Training page on the same method."""
    from attnmem.calc.finetune import calc_kwargs

    at = run(task=task)
    gpu = torch_total_bytes(H100)
    kw = dict(attention="sdpa_flash", **calc_kwargs(method))
    m = training_step(LLAMA, 1, 8192, **kw)
    full = training_step(LLAMA, 1, 8192, attention="sdpa_flash")
    got = metrics(at)
    assert got["Peak"] == format_bytes(m.peak_bytes) and m.peak_bytes < full.peak_bytes
    assert got["Longest context that fits (tokens)"] == \
        f"{max_train_seq_len(LLAMA, gpu, 1, **kw):,}"
    assert got["H100 80GB GPUs needed at s = 8,192"] == "not modelled"
    verdict = (at.success or at.error)[0].value
    assert ("Fits" in verdict) == (m.peak_bytes <= gpu) and "attnmem.calc.training_step" in verdict
    from attnmem.pages.ui import fit

    v = fit.training(LLAMA, gpu, 1, 8192, task)
    assert v.peak_bytes == m.peak_bytes and sum(v.parts.values()) == m.peak_bytes
    assert f"frozen base weights ({base}) and adapters" in v.parts and v.gpus is None


def test_fine_tuning_links_open_the_training_page_on_the_same_method() -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    at.switch_page("attnmem/pages/will_it_fit.py").run()
    at.selectbox(key="task").set_value("qlora").run()
    assert not at.exception, [e.value for e in at.exception]
    links = [x.proto for x in at.get("page_link") if x.proto.page.endswith("training")]
    assert links and "ft=qlora" in links[0].query_string, links


def test_url_round_trip() -> None:
    """Every shown input is in the URL; the URL it writes gives the same view again."""
    q = dict(model="Qwen2.5 7B", gpu="NVIDIA A100 40GB", task="inference", s="4096", b="2",
             new="64", wdtype="fp8_e4m3")
    at = run(**q)
    assert {k: v for k, v in url(at).items() if k != "unit"} == q
    again = run(**url(at))
    assert metrics(again) == metrics(at)
    m = inference_step(MODELS["Qwen2.5 7B"], 2, 4096, 64, attention="sdpa", weight_dtype="fp8_e4m3")
    assert metrics(at)["Peak"] == format_bytes(m.peak_bytes)
    at.selectbox(key="task").set_value("training").run()
    assert url(at)["task"] == "training" and "new" not in at.query_params


@pytest.mark.parametrize("key,value,accepted", [
    ("s", "abc", "whole number"), ("b", "-1", "whole number"), ("task", "dora", "inference, serving, training, lora, qlora"),
    ("gpu", "<b>x</b>", "one of"), ("new", "1e999", "whole number"), ("model", "[x](javascript:1)", "one of"),
])
def test_hostile_url_values_are_named_and_replaced(key: str, value: str, accepted: str) -> None:
    at = run(**{key: value})
    warned = [w.value for w in at.warning]
    assert len(warned) == 1 and f"'{key}'" in warned[0].replace("\\", "") and accepted in warned[0].replace("\\", "")
    assert metrics(at)["Peak"] == format_bytes(inference_step(LLAMA, 1, 8192, 128, attention="sdpa").peak_bytes)
    assert "javascript" not in "".join(x.value for x in at.markdown)


@pytest.mark.parametrize("task,model,says", [
    ("training", "DeepSeek-V3 (MLA, MoE)", "latent"),
    ("inference", "Jamba v0.1 (hybrid)", "hybrids"),
])
def test_a_model_calc_refuses_shows_the_reason(task: str, model: str, says: str) -> None:
    at = run(task=task, model=model)
    assert not at.metric
    assert at.error and "not modelled" in at.error[0].value and says in at.error[0].value


def test_gemma2_inference_falls_back_to_eager_and_says_so() -> None:
    at = run(model="Gemma 2 9B", s="4096")
    m = inference_step(MODELS["Gemma 2 9B"], 1, 4096, 128, attention="eager")
    assert metrics(at)["Peak"] == format_bytes(m.peak_bytes)
    assert any("eager attention is used instead" in c.value for c in at.caption)


def test_nothing_fits_says_why_and_never_fits_is_not_a_bound() -> None:
    at = run(model="Llama 3.1 405B", gpu="NVIDIA T4 16GB")
    assert metrics(at)["Longest context that fits (tokens)"] == "none"
    assert any("Nothing fits" in e.value and "weights alone" in e.value for e in at.error)
    at = run(task="training", s="2000000")  # activations of one replica exceed any GPU count
    assert metrics(at)["H100 80GB GPUs needed at s = 2,000,000"] == "never fits"
    assert any("Never fits at any number" in e.value for e in at.error)
    assert not any("more than" in v for v in metrics(at).values())
    at = run(task="serving", s="1000000")  # not one request's KV cache fits the pool
    assert metrics(at)["H100 80GB GPUs needed at s = 1,000,000"] == "never fits"


def test_a_length_past_the_trained_context_is_flagged() -> None:
    at = run(model="Phi-3 mini (3.8B)", s="8192", new="1")
    assert any("longer than the 4,096 tokens" in i.value for i in at.info)
    assert MAX_SEQ_LEN > 8192


def test_links_to_the_explaining_pages_through_the_router() -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    at.switch_page("attnmem/pages/will_it_fit.py").run()
    assert not at.exception, [e.value for e in at.exception]
    links = {x.proto.label.split(":")[0]: x.proto.page for x in at.get("page_link")}
    assert links == {"Inference": "inference", "Model memory": "model_memory",
                     "Score matrix": "score_matrix", "How FlashAttention works": "flash_explainer"}, links
    at.selectbox(key="task").set_value("training").run()
    assert any(x.proto.page.endswith("training") for x in at.get("page_link"))
    at.selectbox(key="task").set_value("serving").run()
    assert any(x.proto.page.endswith("serving") for x in at.get("page_link"))


def test_first_in_the_sidebar() -> None:
    text = (ROOT / "app.py").read_text()
    assert text.index("attnmem/pages/will_it_fit.py") < text.index("attnmem/pages/score_matrix.py")


# --- the model from an uploaded / pasted config.json or a Hub id (issue 32, item 8) ----------

FIXTURES = ROOT / "tests" / "fixtures" / "hf_configs"
CUSTOM = "Custom config.json"


def _fixture(file: str, name: str) -> ModelConfig:
    return ModelConfig.from_hf_config(json.loads((FIXTURES / file).read_text()), name=name)


def test_uploaded_config_is_sized_by_calc_and_not_put_in_the_url() -> None:
    at = run(model=CUSTOM, s="4096")
    assert any("Upload or paste a config.json" in i.value for i in at.info)  # nothing given yet
    at.file_uploader(key="cfg_file").set_value(
        ("Llama-3.2-1B.json", (FIXTURES / "Llama-3.2-1B.json").read_bytes(), "application/json")).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    model = _fixture("Llama-3.2-1B.json", "Llama-3.2-1B")
    m = inference_step(model, 1, 4096, 128, attention="sdpa")
    assert metrics(at)["Peak"] == format_bytes(m.peak_bytes)
    assert m.peak_bytes != inference_step(LLAMA, 1, 4096, 128, attention="sdpa").peak_bytes
    assert any("Llama-3.2-1B" in v and "config.json given here" in v
               for v in (cap.value.replace("\\", "") for cap in at.caption))
    assert url(at)["model"] == CUSTOM and set(url(at)) <= {"model", "gpu", "task", "b", "s", "new",
                                                           "wdtype", "unit"}
    at.selectbox(key="task").set_value("training").run()  # the same config for another task
    t = training_step(model, 1, 4096, attention="sdpa_flash")
    assert metrics(at)["Peak"] == format_bytes(t.peak_bytes)
    # only Model memory and Inference take the config: the other pages' links do not name it
    links = {x.proto.label.split(":")[0]: x.proto.query_string for x in at.get("page_link")}
    assert all("model=" not in q for t, q in links.items()
               if t not in ("Model memory", "Inference")), links


def test_pasted_bad_config_is_refused_and_the_last_good_one_stays() -> None:
    at = run(model=CUSTOM)
    at.text_area(key="cfg_text").input((FIXTURES / "Mistral-7B-v0.1.json").read_text()).run()
    good = metrics(at)["Peak"]
    m = inference_step(_fixture("Mistral-7B-v0.1.json", "custom model"), 1, 8192, 128, attention="sdpa")
    assert good == format_bytes(m.peak_bytes)
    at.text_area(key="cfg_text").input('{"num_hidden_layers": 2, "num_hidden_layers": 3}').run()
    assert not at.exception
    assert any("Could not use this config" in e.value and "twice" in e.value for e in at.error)
    assert any("last config that was valid" in i.value for i in at.info)
    assert metrics(at)["Peak"] == good


def test_hub_id_without_a_network_says_so_without_a_traceback(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    at = run(model="Hugging Face Hub id", hub="deepseek-ai/DeepSeek-V3")
    shown = " ".join(e.value for e in at.error).replace("\\", "")
    assert "cannot reach http://127.0.0.1:9" in shown and "Traceback" not in shown
    assert any("default model is shown" in i.value for i in at.info)
    assert metrics(at)["Peak"] == format_bytes(inference_step(LLAMA, 1, 8192, 128, attention="sdpa").peak_bytes)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline mode with an empty cache
    at = run(model="Hugging Face Hub id", hub="Qwen/Qwen2.5-7B")
    shown = " ".join(e.value for e in at.error).replace("\\", "")
    assert "HF_HUB_OFFLINE" in shown and not at.exception
