"""Packed (padding-free) rows in the training-step harness: the configuration and its column,
the inputs as transformers' DataCollatorWithFlattening makes them, the bundled
``--plan h200-packed``, a real child on the CPU (our kernel under Triton's interpreter), and a
CPU replay of the harness's own packed inputs whose live bytes equal calc's prediction."""

from __future__ import annotations

import csv
import math

import pytest

from attnmem.measure import train_models as tm
from attnmem.measure.train import cli as tcli
from attnmem.measure.train import config as tconfig
from attnmem.measure.train import plan as tplan
from attnmem.measure.train import predict
from attnmem.measure.train import store as tstore


def _cfg(**kw):
    base = dict(model="tiny-llama", seq_len=32, attention="triton", precision="bf16",
                packed="10+16+6")
    return tconfig.TrainConfig(**{**base, **kw})


def test_config_column_and_label():
    cfg = _cfg()
    assert cfg.packed_lengths() == (10, 16, 6)
    assert "packed=10+16+6" in cfg.label()
    assert cfg.row_identity()["packed_lengths"] == "10+16+6"
    assert "packed_lengths" in tconfig.TRAIN_COLUMNS
    assert "\n    packed_lengths " in tconfig.__doc__
    assert tconfig.TrainConfig.from_row({**cfg.row_identity(), "layers": None}) == cfg
    assert cfg.series() != _cfg(packed="").series()  # packed and dense rows: two series
    assert tconfig.check_config(cfg) is None


@pytest.mark.parametrize("kw, words", [
    (dict(seq_len=33), "packed total 32"),
    (dict(batch=2), "batch must be 1"),
    (dict(packed="10+0+22"), "whole numbers >= 1"),
    (dict(packed="10,22"), "joined by '+'"),
])
def test_bad_packs_are_error_messages(kw, words):
    assert words in tconfig.check_config(_cfg(**kw))


def test_old_csv_without_the_column_reads_as_dense(tmp_path):
    cols = [c for c in tconfig.TRAIN_COLUMNS if c != "packed_lengths"]
    p = tmp_path / "old.csv"
    with open(p, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        w.writerow(["tiny-llama" if c == "model" else "32" if c == "seq_len" else
                    "ok" if c == "status" else "" for c in cols])
    (row,) = tstore.read_rows(p)
    assert row["packed_lengths"] == ""
    assert tconfig.TrainConfig.from_row(row).packed == ""


def test_prediction_passes_the_lengths_and_refuses_what_calc_refuses():
    import attnmem.calc

    d = tm.hf_config("llama3-8b-2l")
    cfg = tconfig.TrainConfig("llama3-8b-2l", 4096, "triton", "bf16", packed="1000+3000+96")
    p = predict.prediction(cfg, d)
    m = attnmem.calc.training_step(attnmem.calc.ModelConfig.from_hf_config(d, name=cfg.model), 1, 4096,
                           attention="triton", packed_lengths=(1000, 3000, 96))
    assert (p.peak, p.before, p.message, p.refused) == (m.peak_bytes, m.before_step_bytes, "",
                                                        None)
    flash = predict.prediction(tconfig.TrainConfig("llama3-8b-2l", 4096, "sdpa_flash", "bf16",
                                                   packed="1000+3000+96"), d)
    assert flash.peak is None and "flash backend takes no mask" in flash.refused
    # what calc lacks for other reasons (fp32) is no prediction, and the row is still measured
    fp32 = predict.prediction(_cfg(precision="fp32"), tm.hf_config("tiny-llama"))
    assert fp32.peak is None and fp32.refused is None


def test_packed_plan():
    plan = tplan.packed_plan()
    assert len(plan) == len({(*c.series(), c.seq_len, c.packed) for c in plan})
    assert {c.attention for c in plan} == {"triton"} and {c.precision for c in plan} == {"bf16"}
    assert {c.model for c in plan} == {"llama3-8b-2l", "qwen2.5-7b-2l"}
    assert {c.checkpointing for c in plan} == {False, True}
    assert {c.adapter for c in plan} == {"none", "lora"}
    packs = {c.seq_len: c.packed_lengths() for c in plan if c.packed}
    assert packs[4096] == (1000, 3000, 96)
    assert len(packs[8192]) == 5 and len(packs[16384]) == 9
    assert all(sum(v) == k for k, v in packs.items())
    # every packed row has its dense twin (batch 1, same T) right after it
    for a, b in zip(plan[::2], plan[1::2], strict=True):
        assert a.packed and not b.packed and a.series()[:6] == b.series()[:6]
        assert (a.seq_len, b.batch) == (b.seq_len, 1)
    assert not plan[0].checkpointing and plan[0].model == "llama3-8b-2l" and not plan[0].lora
    assert all(tconfig.check_config(c) is None for c in plan)


def test_command_line_packs(capsys):
    assert tcli.main(["--model", "tiny-llama", "--packed", "10+16+6", "100+28,5+5",
                      "--attention", "triton", "eager", "--list"]) == 0
    assert "6 configurations" in capsys.readouterr().out
    for argv, words in ((["--packed", "10+x"], "joined by '+'"),
                        (["--packed", "10+6", "--batch", "2"], "--batch must be 1")):
        with pytest.raises(SystemExit) as info:
            tcli.main(["--model", "tiny-llama", *argv, "--list"])
        assert words in str(info.value)


# ---------------------------------------------------------------------------------------------
# torch and transformers from here on.
# ---------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_packed_inputs_are_the_collators():
    from attnmem.measure.train.procedure import packed_inputs

    ids = torch.arange(100, 132).unsqueeze(0)
    got = packed_inputs(ids, (10, 16, 6))
    assert got["position_ids"].tolist() == [[*range(10), *range(16), *range(6)]]
    labels = got["labels"][0].tolist()
    assert [i for i, v in enumerate(labels) if v == -100] == [0, 10, 26]
    assert all(labels[i] == 100 + i for i in range(32) if i not in (0, 10, 26))
    assert got["labels"].dtype == got["position_ids"].dtype == torch.int64


def test_packed_rows_run_on_the_cpu(tmp_path, monkeypatch):
    """python -m attnmem.measure --train --packed ...: one real child (under the Triton
    interpreter, so our kernel runs on the CPU), our kernel and eager on a tiny Llama."""
    from attnmem.measure import cli

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "rows.csv"
    rc = cli.main(["--train", "--model", "tiny-llama", "--packed", "10+16+6", "--attention",
                   "triton", "eager", "--precision", "fp32", "--checkpointing", "both",
                   "--out", str(out), "--quiet"])
    assert rc == 0
    rows = tstore.read_rows(out)
    assert len(rows) == 4
    for r in rows:
        assert r["status"] == "ok", r["message"]
        assert r["packed_lengths"] == "10+16+6" and r["seq_len"] == 32 and r["batch"] == 1
        assert abs(r["loss"] - math.log(128)) < 0.5


def _replay(attention: str, ckpt: bool) -> tuple[int, int]:
    """(bytes made by the forward and alive at its end, bytes of the packed inputs) for the
    harness's tiny Llama in bf16 fed procedure.packed_inputs."""
    from attnmem.measure.live_bytes import LiveBytes
    from attnmem.measure.model_common import model_from_config
    from attnmem.measure.train.procedure import packed_inputs

    hf = tm.build_config("tiny-llama")
    torch.manual_seed(0)
    model = model_from_config(hf, torch.bfloat16, attention).train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 128, (1, 32))
    inputs = packed_inputs(ids, (10, 16, 6))

    def forward():
        return model(input_ids=ids, use_cache=False, **inputs).loss

    forward().backward()
    live = LiveBytes()
    for t in (*model.parameters(), ids, *inputs.values()):
        live.add(t)
    live.bytes = 0
    with live:
        loss = forward()
        fwd = live.bytes
        loss.backward()
    return fwd, sum(t.untyped_storage().nbytes() for t in (ids, *inputs.values()))


@pytest.mark.parametrize("attention, ckpt", [("eager", False), ("sdpa", True)])
def test_cpu_replay_of_the_harness_inputs_matches_calc(attention, ckpt):
    """What the harness feeds (procedure.packed_inputs) is what calc counts: the forward's
    live bytes equal the predicted activations, and the inputs calc's before-step share."""
    import attnmem.calc
    from attnmem.calc.training_step import CUBLAS_WORKSPACE_BYTES

    fwd, inputs = _replay(attention, ckpt)
    model = attnmem.calc.ModelConfig.from_hf_config(tm.hf_config("tiny-llama"), name="tiny-llama")
    m = attnmem.calc.training_step(model, 1, 32, attention="sdpa_cudnn" if attention == "sdpa" else
                           attention, checkpointing=ckpt, packed_lengths=(10, 16, 6))
    assert fwd == m.activations_bytes
    assert m.before_step_bytes - m.weights_bytes - m.optimizer_bytes \
        - CUBLAS_WORKSPACE_BYTES == inputs
