"""LoRA and QLoRA in the training-step measurement (issue 34, item 2): the command line's
options and refusals, the rows' adapter columns, CSVs and SQLite files from before them, the
peft set-up on a tiny Llama on the CPU (through the command line and its child process), QLoRA
without bitsandbytes, calc's refusals as 'unavailable' rows, and the h200-lora plan."""

from __future__ import annotations

import csv
import sqlite3
import sys

import pytest

from attnmem.calc import LoRA, ModelConfig, lora_adapter_params, training_step
from attnmem.calc.training_step import ADAPTER_DTYPES, BASE_DTYPES, LORA_TARGET_SETS
from attnmem.measure import train_models as tm
from attnmem.measure.train import cli as tcli
from attnmem.measure.train import config as tconfig
from attnmem.measure.train import plan as tplan
from attnmem.measure.train import predict, procedure
from attnmem.measure.train import store as tstore

NEW = ("adapter", "lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "adapter_dtype",
       "base_dtype", "trainable_params")


def _tiny_adapters(rank: int, targets: str) -> int:
    return lora_adapter_params(ModelConfig.from_hf_config(tm.hf_config("tiny-llama")),
                               LoRA(rank, targets=targets))


def test_new_columns_come_last_and_mirror_calc():
    # the adapter columns, then the packed rows' column (issue 31), after the older ones and
    # before the recipe columns (issue 43)
    cols = tconfig.TRAIN_COLUMNS
    at = cols.index("packed_lengths")
    assert cols[at - len(NEW):at + 1] == (*NEW, "packed_lengths")
    assert tconfig.BASE_DTYPES == BASE_DTYPES
    assert tconfig.ADAPTER_DTYPES == ADAPTER_DTYPES
    assert tconfig.LORA_TARGETS == tuple(LORA_TARGET_SETS)
    assert "lora_rank" in tconfig.INT_COLUMNS and "lora_alpha" in tconfig.FLOAT_COLUMNS


def test_lora_and_qlora_step_through_the_command_line(tmp_path, monkeypatch):
    """One child process: LoRA (bf16 base) and QLoRA (nf4_dq) on a tiny Llama, r 4,
    all-linear, checkpointing on; trainable parameters = calc's count. QLoRA runs where
    bitsandbytes imports (its CPU backend here), else its row says it is not installed."""
    pytest.importorskip("peft")
    from attnmem.measure import cli

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # the GPU lock file lives there
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "rows.csv"
    rc = cli.main(["--train", "--model", "tiny-llama", "--seq-len", "16", "--attention",
                   "sdpa_math", "--checkpointing", "on", "--adapter", "lora", "--rank", "4",
                   "--targets", "all-linear", "--base-dtype", "bf16,nf4_dq", "--out", str(out),
                   "--quiet"])
    assert rc == 0
    with open(out, newline="") as fh:
        assert next(csv.reader(fh)) == list(tconfig.TRAIN_COLUMNS)
    rows = tstore.read_rows(out)
    assert [r["base_dtype"] for r in rows] == ["bf16", "nf4_dq"]
    assert rows[0]["status"] == "ok", rows[0]["message"]
    for r in rows:
        assert r["adapter"] == "lora" and r["lora_rank"] == 4 and r["lora_alpha"] == 8.0
        assert r["lora_targets"] == "all-linear" and r["checkpointing"] is True
        assert r["lora_dropout"] == 0.0 and r["adapter_dtype"] == "fp32"
        assert r["predicted_peak_bytes"] and r["predicted_before_bytes"], r["message"]
        if r["status"] == "unavailable":
            assert r["base_dtype"] != "bf16" and "bitsandbytes not installed" in r["message"]
            continue
        assert r["status"] == "ok", r["message"]
        assert r["params"] == 90432  # the base's own count
        assert r["trainable_params"] == _tiny_adapters(4, "all-linear")
        assert 3.5 < r["loss"] < 6.5  # about ln(128)
        assert ("prepare_model_for_kbit_training" in r["message"]) == (r["base_dtype"] != "bf16")


def test_attention_adapters_in_this_process():
    """q, k, v, o only, eager, no checkpointing: only the adapters are trainable and the
    optimizer holds state for them alone (the row's trainable_params)."""
    pytest.importorskip("peft")
    cfg = tconfig.TrainConfig("tiny-llama", 16, "eager", "bf16", adapter="lora", rank=8,
                              targets="attention")
    r = procedure.measure_train_step(cfg)
    assert r.status == "ok", r.message
    assert r.trainable_params == _tiny_adapters(8, "attention") == 2 * 8 * (4 * 64 + 64 + 32
                                                                             + 32 + 64)
    assert r.adapter == "lora" and r.lora_targets == "attention" and r.base_dtype == "bf16"


def test_qlora_without_bitsandbytes_is_unavailable(monkeypatch):
    pytest.importorskip("peft")
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` fails
    cfg = tconfig.TrainConfig("tiny-llama", 16, "sdpa_math", "bf16", adapter="lora", rank=4,
                              base_dtype="nf4")
    r = procedure.measure_train_step(cfg)
    assert r.status == "unavailable"
    assert "bitsandbytes not installed" in r.message and "\n" not in r.message
    assert r.adapter == "lora" and r.base_dtype == "nf4" and r.lora_rank == 4
    assert r.predicted_peak_bytes  # calc still predicts it


@pytest.mark.parametrize("model, precision, word", [
    ("tiny-llama", "amp_bf16", "autocast"), ("tiny-llama", "fp32", "fp32"),
    ("phi3-mini-2l", "bf16", "fuses")])
def test_what_calc_refuses_is_unavailable_with_its_reason(model, precision, word):
    cfg = tconfig.TrainConfig(model, 16, "eager", precision, adapter="lora", rank=4)
    r = procedure.measure_train_step(cfg)
    assert r.status == "unavailable" and r.message.startswith("calc does not model this: ")
    assert word in r.message and r.params is None  # nothing was built
    assert r.predicted_peak_bytes is None


@pytest.mark.parametrize("kw, words", [
    (dict(base_dtype="nf4"), "without adapters"),
    (dict(adapter="qlora"), "unknown adapter"),
    (dict(adapter="lora", rank=0), "rank"),
    (dict(adapter="lora", rank=True), "rank"),
    (dict(adapter="lora", alpha=float("nan")), "alpha"),
    (dict(adapter="lora", targets="mlp"), "unknown LoRA targets"),
    (dict(adapter="lora", lora_dropout=1.0), "dropout"),
    (dict(adapter="lora", adapter_dtype="fp16"), "adapter dtype"),
    (dict(adapter="lora", base_dtype="int4"), "base dtype"),
])
def test_bad_adapter_fields_are_one_line_error_rows(kw, words):
    cfg = tconfig.TrainConfig("tiny-llama", 16, "eager", "bf16", **kw)
    why = tconfig.check_config(cfg)
    assert why and words in why and "\n" not in why
    r = procedure.measure_train_step(cfg)
    assert r.status == "error" and words in r.message


@pytest.mark.parametrize("argv, words", [
    (["--rank", "8"], "--rank need(s) --adapter lora"),
    (["--base-dtype", "nf4"], "needs --adapter lora"),
    (["--adapter", "lora", "--rank", "0"], "--rank must be whole numbers >= 1"),
    (["--adapter", "lora", "--rank", "eight"], "--rank must be whole numbers"),
    (["--adapter", "lora", "--targets", "mlp"], "unknown LoRA target(s) mlp"),
    (["--adapter", "lora", "--base-dtype", "int3"], "unknown base dtype(s) int3"),
    (["--adapter", "lora", "--lora-dropout", "1"], "--lora-dropout must be in [0, 1)"),
    (["--adapter", "lora", "--alpha", "-1"], "--alpha must be a positive"),
    (["--adapter", "lora", "--adapter-dtype", "fp8"], "unknown adapter dtype fp8"),
    (["--adapter", "qlora"], "unknown adapter(s) qlora"),
])
def test_command_line_refusals_are_one_line(argv, words):
    with pytest.raises(SystemExit) as info:
        tcli.main(argv + ["--list"])
    msg = str(info.value)
    assert words in msg and "\n" not in msg


def test_list_labels_name_the_adapters(capsys):
    assert tcli.main(["--model", "llama3-8b-2l", "--seq-len", "1000", "--attention",
                      "sdpa_flash", "--adapter", "none", "lora", "--rank", "8", "16",
                      "--targets", "attention", "all-linear", "--base-dtype", "bf16", "nf4",
                      "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "9 configurations"
    assert out[0] == "llama3-8b-2l sdpa_flash bf16 no-ckpt B=1 s=1000"
    assert "llama3-8b-2l lora r=8 a=16 attention sdpa_flash bf16 no-ckpt B=1 s=1000" in out
    assert "llama3-8b-2l lora r=16 a=32 all-linear nf4 sdpa_flash bf16 no-ckpt B=1 s=1000" in out


def test_series_keep_full_training_and_each_adapter_apart():
    full = tconfig.TrainConfig("llama3-8b-2l", 1000, "sdpa_flash", "bf16")
    lora = tconfig.TrainConfig("llama3-8b-2l", 1000, "sdpa_flash", "bf16", adapter="lora")
    qlora = tconfig.TrainConfig("llama3-8b-2l", 1000, "sdpa_flash", "bf16", adapter="lora",
                                base_dtype="nf4")
    assert len({full.series(), lora.series(), qlora.series()}) == 3
    assert full.row_identity()["lora_rank"] is None and lora.row_identity()["lora_rank"] == 16


def test_old_csv_and_database_read_as_full_training(tmp_path):
    """A CSV written before the adapter columns: every row is full training; repredict keeps
    it so; a SQLite file made before them gets the columns added."""
    old_cols = tconfig.TRAIN_COLUMNS[:tconfig.TRAIN_COLUMNS.index(NEW[0])]
    src = tmp_path / "old.csv"
    row = tconfig.TrainResult(model="llama3-8b-2l", layers=2, seq_len=1024,
                              attention="sdpa_flash", precision="bf16", status="ok",
                              peak_bytes=10**10).to_row()
    with open(src, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(old_cols)
        w.writerow(["" if row[c] is None else row[c] for c in old_cols])
    (r,) = tstore.read_rows(src)
    assert (r["adapter"], r["base_dtype"], r["lora_rank"], r["trainable_params"]) == (
        "none", "bf16", None, None)
    cfg = tconfig.TrainConfig.from_row(r)
    assert not cfg.lora and cfg.base_dtype == "bf16" and cfg.adapter_key() == ()
    dst = tmp_path / "new.csv"
    assert tstore.repredict(src, dst) == 1
    (n,) = tstore.read_rows(dst)
    assert n["predicted_peak_bytes"] == predict.predict(cfg, tm.hf_config(cfg.model))[0]

    db = tmp_path / "old.sqlite"
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE train_runs (id INTEGER PRIMARY KEY AUTOINCREMENT, started "
                      "TEXT NOT NULL, gpu TEXT NOT NULL DEFAULT '', label TEXT NOT NULL "
                      "DEFAULT ''); CREATE TABLE train_rows (id INTEGER PRIMARY KEY "
                      "AUTOINCREMENT, run_id INTEGER NOT NULL, "
                      + ", ".join(f"{c} TEXT" for c in old_cols) + ");")
    con.close()
    store = tstore.TrainStore(db)
    run = store.new_run(label="x")
    store.add_row(run, tconfig.TrainResult(**cfg.row_identity(), status="ok").to_row())
    (got,) = store.rows(run)
    assert got["adapter"] == "none" and got["base_dtype"] == "bf16"


def test_repredict_keeps_the_adapters(tmp_path):
    cfg = tconfig.TrainConfig("llama3-8b-2l", 4096, "sdpa_flash", "bf16", True, adapter="lora",
                              rank=64, alpha=128.0, targets="attention", base_dtype="nf4")
    row = tconfig.TrainResult(**cfg.row_identity(), status="ok", peak_bytes=10**10).to_row()
    src, dst = tmp_path / "a.csv", tmp_path / "b.csv"
    with open(src, "w", newline="") as fh:
        w = tstore.csv_writer(fh)
        w.writerow(tconfig.TRAIN_COLUMNS)
        tstore.write_row(w, row)
    tstore.repredict(src, dst)
    (r,) = tstore.read_rows(dst)
    assert tconfig.TrainConfig.from_row(r) == cfg
    want = training_step(ModelConfig.from_hf_config(tm.hf_config(cfg.model)), 1, 4096,
                                 attention="sdpa_flash", checkpointing=True,
                                 adapters=LoRA(64, 128.0, "attention"), base_dtype="nf4")
    assert r["predicted_peak_bytes"] == want.peak_bytes


def test_lora_plan_covers_item_3():
    plan = tplan.lora_plan()
    assert "h200-lora" in tplan.PLANS and all(c.lora for c in plan)
    assert len(plan) == len({(*c.series(), c.seq_len) for c in plan})
    assert {c.model for c in plan[:16]} == {"llama3-8b-2l", "qwen2.5-7b-2l"}
    assert {c.base_dtype for c in plan[:16]} == {"bf16", "nf4"}
    for model in ("llama3-8b-2l", "qwen2.5-7b-2l"):
        mine = [c for c in plan if c.model == model]
        assert {8, 64} <= {c.rank for c in mine}
        assert {c.targets for c in mine} == {"attention", "all-linear"}
        assert {c.checkpointing for c in mine} == {False, True}
        assert {"bf16", "nf4"} <= {c.base_dtype for c in mine}
    lengths = {c.seq_len for c in plan}
    assert min(lengths) == 1000 and max(lengths) == 16384
    assert {s for s in lengths if s & (s - 1)} >= {1000, 3000, 12000}
    assert tm.hf_config("qwen2.5-7b-2l")["vocab_size"] > 150_000
    for c in plan:  # valid, and predicted by calc (none refused)
        assert tconfig.check_config(c) is None, c
        p = predict.prediction(c, tm.hf_config(c.model, c.layers))
        assert p.peak and not p.refused, (c.label(), p.message)


@pytest.mark.parametrize("base", ["nf4", "nf4_dq"])
def test_qlora_base_bytes_match_calc(base):
    """The 4-bit base as quantize_base builds it (tiny Llama, on the CPU where bitsandbytes
    quantizes): packed weights, absmax and codes (and the nested state) against calc's
    weights_bytes less the adapters. NF4 is exact; double quantization keeps one more fp32
    scalar per matrix (QuantState.offset), not counted by calc: 4 bytes x 14 matrices."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    from attnmem.measure.model_common import model_from_config
    from attnmem.measure.train.finetune import quantize_base

    model = model_from_config(tm.build_config(tm.hf_config("tiny-llama")), torch.bfloat16,
                              "eager")
    try:
        assert quantize_base(model, base) == 14  # 7 linears x 2 layers, not lm_head
    except (RuntimeError, NotImplementedError) as exc:  # no CPU backend in this build
        pytest.skip(f"bitsandbytes cannot quantize on the CPU here: {exc}")
    seen: set[int] = set()
    total = 0

    def add(t: object) -> None:
        nonlocal total
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()

    for p in model.parameters():
        add(p)
    for m in model.modules():
        qs = getattr(getattr(m, "weight", None), "quant_state", None)
        if qs is not None:
            for t in (qs.absmax, qs.code, getattr(qs, "offset", None)):
                add(t)
            if qs.state2 is not None:
                add(qs.state2.absmax)
                add(qs.state2.code)
    mc = ModelConfig.from_hf_config(tm.hf_config("tiny-llama"))
    lora = LoRA(4)
    want = (training_step(mc, 1, 16, attention="eager", adapters=lora, base_dtype=base)
            .weights_bytes - 4 * lora_adapter_params(mc, lora))
    assert total - want == (0 if base == "nf4" else 4 * 14)
