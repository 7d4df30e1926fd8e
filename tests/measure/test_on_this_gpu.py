"""attnmem.measure.on_this_gpu, everything but the GPU: the page's inputs become one harness
configuration (checked by the harness's own parser) or a reason; the time estimate says where
it comes from; the nearest bundled rows; and the run through a stand-in harness
(tests/measure/_fake_harness.py): progress, the row kept in the store and downloadable, the
comparison with the prediction, a busy GPU, a failure, and a cancel that leaves no process and
no GPU lock behind."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from attnmem.calc import MODELS
from attnmem.measure import on_this_gpu as g
from attnmem.measure.child import GpuBusy, gpu_lock

FAKE = str(Path(__file__).with_name("_fake_harness.py"))
LLAMA = MODELS["Llama 3.1 8B"]


@pytest.fixture
def where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The GPU lock and the results store in a folder of the test's own."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("ATTNMEM_DB", str(tmp_path / "results.sqlite"))
    return tmp_path


def fake(kind: str, mode: str = "ok", **env: str) -> dict:
    return {"command": [sys.executable, FAKE, f"--{kind}"],
            "env": {"FAKE_HARNESS_MODE": mode, **env}}


def infer_req() -> g.Request:
    r = g.infer_request(LLAMA, batch=2, prompt_len=4096, new_tokens=16, attention="sdpa",
                        cache="dynamic", prefill_chunk=None)
    assert isinstance(r, g.Request), r
    return r


def train_req(**kw) -> g.Request:
    args = dict(batch=1, seq_len=4096, attention="sdpa_flash", precision="bf16",
                checkpointing=True) | kw
    r = g.train_request(LLAMA, **args)
    assert isinstance(r, g.Request), r
    return r


# -- the request ---------------------------------------------------------------------------


def test_page_model_maps_to_the_harness_model_at_its_own_depth() -> None:
    r = infer_req()
    assert r.model == "llama3.1-8b"
    assert r.args[r.args.index("--layers") + 1] == "32"
    t = train_req()
    # the training harness has Llama 3.1 8B's widths at 2 and 4 layers; the page's 32 layers
    # are built by --layers
    assert t.model == "llama3-8b-2l" and t.args[t.args.index("--layers") + 1] == "32"
    assert g.harness_models("train", LLAMA) == ["llama3-8b-2l", "llama3-8b-4l"]


def test_lora_levers_and_padding_free_become_the_harness_arguments() -> None:
    t = train_req(method="qlora", double_quant=True, rank=8, targets="attention", kbit=True,
                  padding_free=True, batch=3, seq_len=1000)
    a = list(t.args)
    assert a[a.index("--base-dtype") + 1] == "nf4_dq"
    assert a[a.index("--rank") + 1] == "8" and a[a.index("--targets") + 1] == "attention"
    assert a[a.index("--packed") + 1] == "1000+1000+1000" and a[a.index("--batch") + 1] == "1"
    assert a[a.index("--kbit-prepare") + 1] == "on"


@pytest.mark.parametrize("kw, words", [
    (dict(gpus=8, sharding="fsdp"), "one GPU"),
    (dict(attention="naive"), "naive"),
    (dict(precision="fp16"), "fp16"),  # the harness's own list of precisions
])
def test_what_the_harness_cannot_measure_is_a_reason(kw, words) -> None:
    args = dict(batch=1, seq_len=4096, attention="sdpa_flash", precision="bf16",
                checkpointing=True) | kw
    r = g.train_request(LLAMA, **args)
    assert isinstance(r, str) and words in r, r


def test_inference_refusals_name_the_value() -> None:
    r = g.infer_request(LLAMA, batch=1, prompt_len=100, new_tokens=1, attention="sdpa",
                        cache="dynamic", prefill_chunk=None, weight_dtype="int8")
    assert isinstance(r, str) and "int8" in r
    gpt2 = MODELS["GPT-2 (124M)"]
    r = g.infer_request(gpt2, batch=1, prompt_len=100, new_tokens=1, attention="sdpa",
                        cache="dynamic", prefill_chunk=None)
    assert isinstance(r, str) and "none has the shape" in r and "llama3.1-8b" in r


def test_a_lever_the_harness_does_not_take_is_refused_by_name(monkeypatch) -> None:
    """A training harness without --liger (as before issue 43's columns) must refuse the lever,
    never measure the step without it."""
    from attnmem.measure.train import cli

    real = cli.build_parser

    def without_liger():
        ap = real()
        for action in list(ap._actions):  # noqa: SLF001 - the test removes one option
            if "--liger" in action.option_strings:
                ap._remove_action(action)  # noqa: SLF001
                for s in action.option_strings:
                    ap._option_string_actions.pop(s)  # noqa: SLF001
        return ap

    monkeypatch.setattr(cli, "build_parser", without_liger)
    r = g.train_request(LLAMA, batch=1, seq_len=4096, attention="sdpa_flash", precision="bf16",
                        checkpointing=False, liger=True)
    assert isinstance(r, str) and "--liger" in r and "does not take" in r


# -- estimate and nearest rows ---------------------------------------------------------------


def test_estimate_scales_the_nearest_bundled_row_and_says_so() -> None:
    r = infer_req()
    rows = [{"model": "llama3.1-8b", "layers": 32, "attention": "sdpa", "batch": 1,
             "prompt_len": 4096, "new_tokens": 16, "status": "ok", "wall_s": 3.0},
            {"model": "qwen2.5-7b", "layers": 28, "attention": "sdpa", "batch": 2,
             "prompt_len": 4096, "new_tokens": 16, "status": "ok", "wall_s": 50.0}]
    e = g.estimate(r, rows)
    assert e.seconds == pytest.approx(g.STARTUP_S + 3.0 * 2)  # twice the tokens
    assert "llama3.1-8b" in e.source and "assumed" in e.source
    assert g.estimate(r, []).seconds == g.STARTUP_S
    # the bundled file itself gives a finite estimate from a row of this model
    e = g.estimate(r)
    assert math.isfinite(e.seconds) and "llama3.1-8b" in e.source


def test_nearest_rows_same_model_then_length_then_batch_then_settings() -> None:
    df = pd.DataFrame([
        {"model": "other", "attention": "sdpa", "seq_len": 4096, "batch": 1, "precision": "bf16"},
        {"model": "m", "attention": "eager", "seq_len": 4096, "batch": 1, "precision": "bf16"},
        {"model": "m", "attention": "sdpa", "seq_len": 32768, "batch": 1, "precision": "bf16"},
        {"model": "m", "attention": "sdpa", "seq_len": 8192, "batch": 1, "precision": "amp_bf16"},
        {"model": "m", "attention": "sdpa", "seq_len": 2048, "batch": 4, "precision": "bf16"},
    ])
    got = g.nearest_rows(df, names=["m"], length_col="seq_len", length=4096, batch=1,
                         attention="sdpa", also={"precision": "bf16"}, n=5)
    assert list(got.index) == [1, 3, 4, 2, 0]
    # among rows at the same length and batch, the same attention and settings first
    df.loc[5] = {"model": "m", "attention": "sdpa", "seq_len": 4096, "batch": 1,
                 "precision": "amp_bf16"}
    df.loc[6] = {"model": "m", "attention": "sdpa", "seq_len": 4096, "batch": 1,
                 "precision": "bf16"}
    got = g.nearest_rows(df, names=["m"], length_col="seq_len", length=4096, batch=1,
                         attention="sdpa", also={"precision": "bf16"}, n=3)
    assert list(got.index) == [6, 5, 1]


# -- the run ---------------------------------------------------------------------------------


def test_a_run_reports_progress_keeps_its_row_and_compares_it(where: Path) -> None:
    job = g.start(infer_req(), **fake("infer", FAKE_HARNESS_SLEEP="1.5"), estimate_s=30)
    seen = []
    out = job.wait(on_progress=seen.append, poll_s=0.05)
    assert out.status == "ok", out.message
    phases = [p.phase for p in seen]
    assert any(ph.startswith("starting") for ph in phases)
    assert any(ph.startswith("measuring") for ph in phases), phases  # its worker was seen
    assert all(0 <= p.fraction <= 0.95 for p in seen if p.running)
    assert seen[-1].rows_done == 1 and not seen[-1].running and seen[-1].fraction == 1.0
    peak = out.parts[0]
    assert peak["part"] == "peak" and peak["measured"] == 3_000_000_000
    assert peak["error"] == pytest.approx(0.01)
    # kept in the store, under the page's label, and downloadable in the harness's columns
    runs = g.page_runs("infer")
    assert [r["id"] for r in runs] == [out.run_id] and runs[0]["n"] == 1
    assert runs[0]["gpu"] == "Fake GPU"
    text = g.run_csv("infer", [out.run_id])
    head, line = text.splitlines()[:2]
    assert head.startswith("model,arch,layers") and line.startswith("llama3.1-8b,")
    assert not job.dir.exists()  # its temporary folder is gone
    with gpu_lock(0, wait_s=0):  # and the GPU lock is free
        pass


def test_a_training_run_and_an_oom_row(where: Path) -> None:
    out = g.start(train_req(), **fake("train")).wait(poll_s=0.05)
    assert out.status == "ok" and out.row["model"] == "llama3-8b-2l" and out.row["layers"] == 32
    assert [p["part"] for p in out.parts] == ["peak", "before the step", "reserved (allocator)"]
    oom = g.start(train_req(), **fake("train", "oom")).wait(poll_s=0.05)
    assert oom.status == "oom" and "out of memory" in oom.message
    assert oom.parts[0]["measured"] is None and oom.parts[0]["error"] is None
    assert len(g.page_runs("train")) == 2
    assert g.page_runs("infer") == []


def test_busy_gpu_and_failure_are_said(where: Path) -> None:
    busy = g.start(infer_req(), **fake("infer", "busy")).wait(poll_s=0.05)
    assert busy.status == "busy" and "busy" in busy.message and busy.run_id is None
    fail = g.start(infer_req(), **fake("infer", "fail")).wait(poll_s=0.05)
    assert fail.status == "failed" and "exit code 1" in fail.message and "boom" in fail.message


@pytest.mark.parametrize("mode", ["hang", "stubborn"])
def test_cancel_kills_the_child_and_its_worker_and_frees_the_lock(where: Path, mode: str,
                                                                   monkeypatch) -> None:
    monkeypatch.setattr(g, "CANCEL_GRACE_S", 1.0)
    pids = where / "pids"
    job = g.start(infer_req(), **fake("infer", mode, FAKE_HARNESS_PIDS=str(pids)))
    deadline = time.monotonic() + 60
    while not pids.exists() or len(pids.read_text().split()) < 2:
        assert time.monotonic() < deadline and job.poll().running
        time.sleep(0.05)
    with pytest.raises(GpuBusy):  # the fake holds the lock now
        with gpu_lock(0, wait_s=0):
            pass
    child, worker = (int(x) for x in pids.read_text().split())
    out = job.cancel()
    assert out.status == "cancelled" and out.run_id is None
    for pid in (child, worker):
        deadline = time.monotonic() + 10
        while g._alive(pid) and time.monotonic() < deadline:  # noqa: SLF001
            time.sleep(0.05)
        assert not g._alive(pid), f"{pid} outlived the cancel"  # noqa: SLF001
    with gpu_lock(0, wait_s=0):  # no lock held
        pass
    assert not job.poll().running and g.page_runs("infer") == []


def test_gpu_reason_without_device_nodes_does_not_import_torch(monkeypatch) -> None:
    monkeypatch.setattr(g, "_device_nodes", lambda: [])
    before = "torch" in sys.modules
    reason = g.gpu_reason()
    if g.importlib.util.find_spec("torch") is None:
        assert "not installed" in reason
    else:
        assert "no GPU" in reason and "is_available() is False" in reason
    assert ("torch" in sys.modules) == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_descendants_are_found_through_proc(where: Path) -> None:
    pids = where / "pids"
    job = g.start(infer_req(), **fake("infer", "hang", FAKE_HARNESS_PIDS=str(pids)))
    try:
        deadline = time.monotonic() + 60
        while not pids.exists() or len(pids.read_text().split()) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child, worker = (int(x) for x in pids.read_text().split())
        assert child == job.proc.pid and worker in g.descendants(job.proc.pid)
    finally:
        job.cancel()


# -- the real harness, on the CPU --------------------------------------------------------------


def _tiny():
    from attnmem.calc import ModelConfig
    from attnmem.measure import infer_models

    return ModelConfig.from_hf_config(infer_models.hf_config("tiny-llama"), name="tiny-llama",
                                      with_transformers=False)


@pytest.mark.parametrize("kind", ["infer", "train"])
def test_the_real_harness_runs_the_request_on_the_cpu(where: Path, kind: str) -> None:
    """The command the pages start, unreplaced: `python -m attnmem.measure --infer|--train`
    takes the arguments, its worker runs tiny-llama (on the CPU: no allocator counters, so no
    measured peak) and the row comes back with the harness's prediction, kept in the store."""
    pytest.importorskip("transformers")
    tiny = _tiny()
    if kind == "infer":
        r = g.infer_request(tiny, batch=2, prompt_len=32, new_tokens=4, attention="sdpa",
                            cache="dynamic", prefill_chunk=None)
    else:
        r = g.train_request(tiny, batch=1, seq_len=32, attention="eager", precision="bf16",
                            checkpointing=False)
    assert isinstance(r, g.Request), r
    out = g.start(r).wait(timeout_s=300)
    assert out.status == "ok", out.message
    assert out.row["model"] == "tiny-llama" and out.row["layers"] == tiny.num_layers
    assert out.row["gpu"] == "cpu" and out.row["peak_bytes"] is None
    assert out.row["predicted_peak_bytes"] > 0
    assert [r_["id"] for r_ in g.page_runs(kind)] == [out.run_id]


def test_cancelling_the_real_harness_leaves_no_worker_and_no_lock(where: Path) -> None:
    pytest.importorskip("transformers")
    r = g.infer_request(_tiny(), batch=1, prompt_len=32, new_tokens=4, attention="sdpa",
                        cache="dynamic", prefill_chunk=None)
    job = g.start(r)
    deadline = time.monotonic() + 120
    while not job.worker_seen:  # the harness has started its worker
        assert job.poll().running and time.monotonic() < deadline
        time.sleep(0.05)
    below = g.descendants(job.proc.pid)
    assert below
    out = job.cancel()
    assert out.status in ("cancelled", "ok")  # a fast worker may finish first
    for pid in [job.proc.pid, *below]:
        deadline = time.monotonic() + 10
        while g._alive(pid) and time.monotonic() < deadline:  # noqa: SLF001
            time.sleep(0.05)
        assert not g._alive(pid), f"{pid} outlived the cancel"  # noqa: SLF001
    with gpu_lock(0, wait_s=0):
        pass
