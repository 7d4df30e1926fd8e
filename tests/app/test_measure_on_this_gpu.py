""""Measure on this GPU" on the Inference and Training step pages (issue 45, item 4), through
AppTest:

- without a GPU (this CI machine): the section says so and shows the bundled H200 rows nearest
  to the inputs, this model's first, with their predictions and errors;
- with the GPU check patched to "present" and the harness replaced by
  tests/measure/_fake_harness.py: the button runs the page's exact inputs in a child process,
  the measured peak and parts sit beside the prediction with the error, the run is kept in the
  store; inputs the harness cannot measure get a reason instead of a button;
- `gpu`-marked: the button pressed for tiny-llama on a real GPU, through the real harness.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _frames import grids  # HTML tables and grids alike
from streamlit.testing.v1 import AppTest

from attnmem.measure import on_this_gpu as g

PAGES = Path(__file__).parents[2] / "attnmem" / "pages"
FAKE = str(Path(__file__).parents[1] / "measure" / "_fake_harness.py")
TITLE = "Measure on this GPU"


def page(name: str, params: dict[str, str], timeout: float = 120) -> AppTest:
    at = AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=timeout)
    for k, v in params.items():
        at.query_params[k] = v
    return at


def section(at: AppTest):
    (ex,) = [e for e in at.expander if e.label == TITLE]
    return ex


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(g, "gpu_reason", lambda: "no GPU on this machine (test)")


@pytest.mark.parametrize("name, params, model, length", [
    ("inference", {"model": "Llama 3.1 8B", "s": "4096", "b": "1", "attn": "sdpa"},
     "llama3.1-8b", "prompt"),
    ("training", {"model": "Qwen2.5 7B", "s": "8192", "attns": "sdpa_flash"},
     "qwen2.5-7b-2l", "s"),
])
def test_without_a_gpu_the_page_says_so_and_shows_the_nearest_rows(no_gpu, name, params, model,
                                                                     length) -> None:
    at = page(name, params).run()
    assert not at.exception, [e.value for e in at.exception]
    ex = section(at)
    assert any("No GPU here" in i.value for i in ex.info)
    assert not [b for b in ex.button if b.label == TITLE]  # nothing to press
    (df,) = grids(ex)
    rows = df.value
    assert len(rows) > 0 and rows.iloc[0]["model"] == model
    # each with its prediction and error, in the page's unit and as percentages
    assert rows.iloc[0][length] == int(params["s"])
    assert "predicted" in rows.columns and "error" in rows.columns
    assert str(rows.iloc[0]["error"]).endswith("%")


def test_the_real_check_on_this_machine_says_no_gpu() -> None:
    """No patch: this CI machine has no GPU device, and the section says why."""
    if g.gpu_reason() is None:
        pytest.skip("this machine has a GPU")
    at = page("inference", {"model": "Llama 3.2 1B", "s": "1000"}).run()
    assert not at.exception
    assert any("No GPU here" in i.value for i in section(at).info)


@pytest.fixture
def fake_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("ATTNMEM_DB", str(tmp_path / "results.sqlite"))
    monkeypatch.setenv("ATTNMEM_DISABLE_MEASURE", "0")
    monkeypatch.setenv("FAKE_HARNESS_MODE", "ok")
    monkeypatch.setattr(g, "gpu_reason", lambda: None)
    monkeypatch.setattr(g, "default_command",
                        lambda kind: [sys.executable, FAKE, f"--{kind}"])
    return tmp_path


@pytest.mark.parametrize("name, params, key, model", [
    ("inference", {"model": "Llama 3.1 8B", "s": "4096", "b": "2", "new": "16",
                   "attn": "sdpa", "unit": "GB"}, "gpu_infer", "llama3.1-8b"),
    ("training", {"model": "Llama 3.1 8B", "s": "4096", "attns": "sdpa_flash,eager",
                  "ckpt": "true", "unit": "GB"}, "gpu_train", "llama3-8b-2l"),
])
def test_the_button_measures_the_page_inputs_beside_the_prediction(fake_gpu, name, params, key,
                                                                     model) -> None:
    at = page(name, params).run()
    assert not at.exception, [e.value for e in at.exception]
    ex = section(at)
    cmd = " ".join(m.value for m in ex.markdown)
    assert "attnmem\\.measure \\-\\-" in cmd and model.replace("-", "\\-").replace(".", "\\.") in cmd
    assert "about" in cmd and "bundled H200 row" in cmd  # the estimate and where it comes from
    at.button(key=f"{key}_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    ex = section(at)
    metrics = {m.label: m.value for m in ex.metric}
    assert metrics["measured peak"] == "3.00 GB"  # the stand-in harness's row
    assert metrics["predicted peak"] == "3.03 GB" and metrics["error"] == "+1.00%"
    (parts,) = grids(ex)
    assert list(parts.value["part"])[0] == "peak"
    kind = "infer" if name == "inference" else "train"
    runs = g.page_runs(kind)
    assert len(runs) == 1 and runs[0]["label"].startswith(g.LABEL_PREFIX[kind])
    row = g._store(kind, None).rows(runs[0]["id"])[0]  # noqa: SLF001
    assert row["model"] == model and row["batch"] == int(params.get("b", "1"))
    # the result stays on a rerun with the same inputs, and goes when they change
    at.run()
    assert any(m.label == "measured peak" for m in section(at).metric)
    at.number_input(key="s").set_value(2048).run()
    assert not any(m.label == "measured peak" for m in section(at).metric)


def test_a_busy_gpu_is_said_on_the_page(fake_gpu, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_HARNESS_MODE", "busy")
    at = page("inference", {"model": "Llama 3.2 1B", "s": "1000"}).run()
    at.button(key="gpu_infer_go").click().run()
    assert not at.exception
    assert any("busy" in w.value for w in section(at).warning)


def test_inputs_the_harness_cannot_measure_get_a_reason(fake_gpu) -> None:
    at = page("training", {"model": "Llama 3.1 8B", "gpus": "8", "shard": "zero3",
                           "attns": "sdpa_flash"}).run()
    assert not at.exception
    ex = section(at)
    assert any("one GPU" in w.value for w in ex.warning)
    assert not [b for b in ex.button if b.label == TITLE]
    at = page("inference", {"model": "Llama 3.1 8B", "wdtype": "int8"}).run()
    assert any("int8" in w.value for w in section(at).warning)


# -- on a GPU --------------------------------------------------------------------------------


def _tiny(monkeypatch: pytest.MonkeyPatch) -> str:
    """tiny-llama (attnmem.measure.infer_models / train_models) offered by both pages as a
    measured shape, as the pages offer the harness's other models."""
    import streamlit as st

    from attnmem.calc import ModelConfig
    from attnmem.measure import infer_models
    from attnmem.pages.ui import inference as inf
    from attnmem.pages.ui import training as tr

    tiny = ModelConfig.from_hf_config(infer_models.hf_config("tiny-llama"), name="tiny-llama",
                                      with_transformers=False)
    shapes = inf.measured_shapes()
    monkeypatch.setattr(inf, "measured_shapes", lambda: {**shapes, "tiny-llama": tiny})
    monkeypatch.setitem(tr.CHOICES, tr.MEASURED_PREFIX + "tiny-llama", tiny)
    st.cache_resource.clear()
    return tr.MEASURED_PREFIX + "tiny-llama"


TINY_CASES = [
    ("inference", {"s": "256", "b": "2", "new": "8", "attn": "sdpa"}, "gpu_infer"),
    ("training", {"s": "256", "b": "2", "attns": "eager", "ckpt": "false"}, "gpu_train"),
]


def _press_for_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                    params: dict[str, str], key: str) -> tuple[dict, dict]:
    """Open the page on tiny-llama, press the button (the real harness, unreplaced), and
    return the section's metrics and the stored row."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("ATTNMEM_DB", str(tmp_path / "results.sqlite"))
    monkeypatch.setenv("ATTNMEM_DISABLE_MEASURE", "0")
    choice = _tiny(monkeypatch)
    at = page(name, {**params, "model": choice}, timeout=600).run()
    assert not at.exception, [e.value for e in at.exception]
    at.button(key=f"{key}_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    ex = section(at)
    assert not ex.error, [e.value for e in ex.error]
    kind = "infer" if name == "inference" else "train"
    (run,) = g.page_runs(kind)
    (row,) = g._store(kind, None).rows(run["id"])  # noqa: SLF001
    assert row["status"] == "ok", row["message"]
    assert row["model"] == "tiny-llama" and row["batch"] == int(params["b"])
    assert row["predicted_peak_bytes"] > 0
    return {m.label: m.value for m in ex.metric}, row


@pytest.mark.parametrize("name, params, key", TINY_CASES)
def test_the_real_harness_through_the_page_on_the_cpu(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch, name,
                                                      params, key) -> None:
    """The gpu test's path on this machine, the GPU check patched to "present": the real
    harness runs tiny-llama on the CPU (no allocator counters: no measured peak, said as a
    dash), so everything but the numbers is exercised here."""
    pytest.importorskip("transformers")
    monkeypatch.setattr(g, "gpu_reason", lambda: None)
    metrics, row = _press_for_tiny(tmp_path, monkeypatch, name, params, key)
    assert row["gpu"] == "cpu" and row["peak_bytes"] is None
    assert metrics["measured peak"] == "—" and metrics["predicted peak"] != "—"


@pytest.mark.gpu
@pytest.mark.parametrize("name, params, key", TINY_CASES)
def test_gpu_button_measures_tiny_llama(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name,
                                        params, key) -> None:
    """On a GPU: the page's button measures tiny-llama through the real harness; the measured
    peak, the prediction and the error are on the page and in the store."""
    assert g.gpu_reason() is None
    metrics, row = _press_for_tiny(tmp_path, monkeypatch, name, params, key)
    assert row["peak_bytes"] > 0 and row["gpu"] != "cpu"
    assert metrics["measured peak"] != "—" and metrics["error"].endswith("%"), metrics
    assert abs(row["peak_rel_error"]) < 0.5, row
    print(f"{name}: measured {row['peak_bytes']:,} B, predicted "
          f"{row['predicted_peak_bytes']:,} B, error {row['peak_rel_error']:+.3%} on "
          f"{row['gpu']} in {row['wall_s']} s")
