"""The fine-tuning recipes in the training-step measurement (issue 43, item 3): the optimizer
and the levers (kbit_prepare, liger, offload_activations) as configuration fields, row columns
and calc keywords; rows from before them; calc's refusals as 'unavailable' rows before any
build; missing libraries; the optimizers' real state against calc's count on a tiny Llama
(CPU); the ``h200-recipes`` plan; Liger's module patches undone. GPU-only pieces are marked
``gpu``."""

from __future__ import annotations

import csv
import math
import sqlite3
import sys
import types

import pytest

from attnmem.calc import LoRA, ModelConfig, training_step
from attnmem.calc.train_common import OPTIMIZERS as CALC_OPTIMIZERS
from attnmem.calc.train_liger import LIGER_MODEL_TYPES
from attnmem.calc.train_optimizer import optimizer_state, param_tensors
from attnmem.measure import train_models as tm
from attnmem.measure.train import cli as tcli
from attnmem.measure.train import config as tconfig
from attnmem.measure.train import plan as tplan
from attnmem.measure.train import predict, procedure, recipes
from attnmem.measure.train import store as tstore

LEVER_COLUMNS = ("optimizer", "kbit_prepare", "liger", "offload_activations")
GIB = 2**30
#: One 80 GB H100 with room for the CUDA context and the allocator's rounding.
PLAN_PEAK_LIMIT = 70 * GIB


def _calc(cfg: tconfig.TrainConfig):
    """training_step called directly with cfg's keywords (not through the harness)."""
    kw = cfg.lever_kwargs()
    if cfg.lora:
        kw |= {"adapters": LoRA(cfg.rank, cfg.alpha, cfg.targets, cfg.lora_dropout,
                                cfg.adapter_dtype), "base_dtype": cfg.base_dtype}
    return training_step(ModelConfig.from_hf_config(tm.hf_config(cfg.model, cfg.layers),
                                                    name=cfg.model), cfg.batch, cfg.seq_len, attention=cfg.attention,
                         precision=cfg.precision, checkpointing=cfg.checkpointing, **kw)


# ---------------------------------------------------------------------------------------------
# Schema.
# ---------------------------------------------------------------------------------------------
def test_lever_columns_come_last_and_mirror_calc():
    assert tconfig.TRAIN_COLUMNS[-len(LEVER_COLUMNS):] == LEVER_COLUMNS
    assert tconfig.OPTIMIZERS == CALC_OPTIMIZERS
    assert set(tconfig.LEVER_FLAGS) <= set(tconfig.BOOL_COLUMNS)
    assert set(recipes.LIGER_APPLY) == set(LIGER_MODEL_TYPES)
    for col in LEVER_COLUMNS:
        assert f"\n    {col} " in tconfig.__doc__


def test_row_identity_series_and_label_carry_the_recipe():
    plain = tconfig.TrainConfig("llama3-8b-2l", 4096, "sdpa_flash", "bf16")
    sgd = tconfig.TrainConfig("llama3-8b-2l", 4096, "sdpa_flash", "bf16", optimizer="sgd")
    off = tconfig.TrainConfig("llama3-8b-2l", 4096, "sdpa_flash", "bf16",
                              offload_activations=True)
    assert not plain.has_levers() and sgd.has_levers() and off.has_levers()
    assert len({plain.series(), sgd.series(), off.series()}) == 3  # an OOM skips its own only
    assert plain.label() == "llama3-8b-2l sdpa_flash bf16 no-ckpt B=1 s=4096"
    assert off.label().endswith(" offload") and sgd.label().endswith(" sgd")
    row = off.row_identity()
    assert row["optimizer"] == "adamw" and row["offload_activations"] is True
    assert tconfig.TrainConfig.from_row(row | {"layers": None}) == off


@pytest.mark.parametrize("kw, words", [
    (dict(optimizer="adam8"), "unknown optimizer 'adam8'"),
    (dict(liger=1), "liger must be True or False"),
    (dict(kbit_prepare="yes"), "kbit_prepare must be True or False"),
])
def test_bad_recipe_values_are_one_line_error_rows(kw, words):
    cfg = tconfig.TrainConfig("tiny-llama", 16, "eager", "bf16", **kw)
    why = tconfig.check_config(cfg)
    assert why and words in why and "\n" not in why
    r = procedure.measure_train_step(cfg)
    assert r.status == "error" and words in r.message


def test_old_csv_and_database_read_as_adamw_without_levers(tmp_path):
    """A CSV written before the recipe columns (today's bundled rows): every row is AdamW
    with no lever, in read_rows, from_row and repredict; a SQLite file made before them gets
    the columns, and its old rows read the same."""
    old_cols = tconfig.TRAIN_COLUMNS[:-len(LEVER_COLUMNS)]
    cfg = tconfig.TrainConfig("llama3-8b-2l", 4096, "sdpa_flash", "bf16", True)
    row = tconfig.TrainResult(**cfg.row_identity(), status="ok", peak_bytes=10**10).to_row()
    src = tmp_path / "old.csv"
    with open(src, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(old_cols)
        w.writerow(["" if row[c] is None else row[c] for c in old_cols])
    (r,) = tstore.read_rows(src)
    assert (r["optimizer"], r["kbit_prepare"], r["liger"], r["offload_activations"]) == (
        "adamw", False, False, False)
    assert tconfig.TrainConfig.from_row({**r, "layers": None}) == cfg
    dst = tmp_path / "new.csv"
    assert tstore.repredict(src, dst) == 1
    (n,) = tstore.read_rows(dst)
    assert n["predicted_peak_bytes"] == _calc(cfg).peak_bytes

    db = tmp_path / "old.sqlite"
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE train_runs (id INTEGER PRIMARY KEY AUTOINCREMENT, started "
                      "TEXT NOT NULL, gpu TEXT NOT NULL DEFAULT '', label TEXT NOT NULL "
                      "DEFAULT ''); CREATE TABLE train_rows (id INTEGER PRIMARY KEY "
                      "AUTOINCREMENT, run_id INTEGER NOT NULL, "
                      + ", ".join(f"{c} TEXT" for c in old_cols) + ");"
                      "INSERT INTO train_runs (started) VALUES ('then');"
                      "INSERT INTO train_rows (run_id, model, seq_len, attention, precision, "
                      "checkpointing, status) VALUES (1, 'llama3-8b-2l', 4096, 'sdpa_flash', "
                      "'bf16', 1, 'ok');")
    con.close()
    store = tstore.TrainStore(db)
    (old,) = store.rows(1)
    assert (old["optimizer"], old["liger"], old["kbit_prepare"]) == ("adamw", False, False)
    run = store.new_run(label="x")
    lever = tconfig.TrainConfig("llama3-8b-2l", 4096, "sdpa_flash", "bf16", liger=True,
                                optimizer="adamw_8bit")
    store.add_row(run, tconfig.TrainResult(**lever.row_identity(), status="ok").to_row())
    (got,) = store.rows(run)
    assert (got["optimizer"], got["liger"], got["offload_activations"]) == (
        "adamw_8bit", True, False)


def test_repredict_keeps_the_recipe(tmp_path):
    cfg = tconfig.TrainConfig("llama3-8b-2l", 4096, "triton", "bf16", True, **tplan.QLORA_RECIPE)
    row = tconfig.TrainResult(**cfg.row_identity(), status="ok", peak_bytes=10**10).to_row()
    src, dst = tmp_path / "a.csv", tmp_path / "b.csv"
    with open(src, "w", newline="") as fh:
        w = tstore.csv_writer(fh)
        w.writerow(tconfig.TRAIN_COLUMNS)
        tstore.write_row(w, row)
    tstore.repredict(src, dst)
    (r,) = tstore.read_rows(dst)
    assert tconfig.TrainConfig.from_row(r) == cfg
    want = _calc(cfg)
    assert (r["predicted_peak_bytes"], r["predicted_before_bytes"]) == (
        want.peak_bytes, want.before_step_bytes)


# ---------------------------------------------------------------------------------------------
# Prediction and refusals.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(optimizer="adamw_8bit"), dict(optimizer="paged_adamw_8bit"), dict(optimizer="adafactor"),
    dict(optimizer="sgd"), dict(optimizer="adamw_fused"), dict(liger=True),
    dict(offload_activations=True), dict(optimizer="adamw_8bit", offload_activations=True),
])
def test_prediction_passes_the_levers(kw):
    """The row's prediction is training_step with the same keywords, and the levers change it
    (so the error columns compare like with like)."""
    cfg = tconfig.TrainConfig("llama3-8b-2l", 4096, "sdpa_flash", "bf16", **kw)
    p = predict.prediction(cfg, tm.hf_config(cfg.model))
    want = _calc(cfg)
    assert (p.peak, p.before, p.refused) == (want.peak_bytes, want.before_step_bytes, None)
    plain = _calc(tconfig.TrainConfig("llama3-8b-2l", 4096, "sdpa_flash", "bf16"))
    if kw != {"optimizer": "adamw_fused"}:  # fused AdamW only drops the step's temporary
        assert (p.peak, p.before) != (plain.peak_bytes, plain.before_step_bytes)


def test_prediction_of_the_qlora_recipe():
    cfg = tconfig.TrainConfig("llama3-8b-2l", 4096, "triton", "bf16", True, **tplan.QLORA_RECIPE)
    p = predict.prediction(cfg, tm.hf_config(cfg.model))
    m = _calc(cfg)
    assert p.peak == m.peak_bytes and p.before == m.before_step_bytes
    assert m.optimizer_paged_bytes > 0  # the paged state is counted apart from the peak


@pytest.mark.parametrize("model, kw, words", [
    ("llama3.2-1b-2l", dict(liger=True), "tied embeddings"),
    ("mixtral-8x7b-2l", dict(optimizer="adamw_8bit"), "dense decoders"),
    ("llama3-8b-2l", dict(adapter="lora", offload_activations=True), "with adapters"),
    ("llama3-8b-2l", dict(adapter="lora", base_dtype="nf4", kbit_prepare=True),
     "attention 'sdpa_flash'"),
    ("llama3-8b-2l", dict(attention="triton", adapter="lora", base_dtype="nf4",
                          kbit_prepare=True), "checkpointing=False"),
    ("llama3-8b-2l", dict(kbit_prepare=True), "without adapters"),
    ("llama3-8b-2l", dict(liger=True, offload_activations=True), "liger=True"),
])
def test_what_calc_refuses_is_unavailable_before_any_build(model, kw, words, monkeypatch):
    """calc's reason, word for word, and nothing built or imported: the row comes back before
    the libraries are asked for (bitsandbytes and liger_kernel made unimportable here)."""
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    kw = {"attention": "sdpa_flash", **kw}
    cfg = tconfig.TrainConfig(model, 1024, kw.pop("attention"), "bf16", **kw)
    with pytest.raises(ValueError) as calc_says:
        _calc(cfg)
    r = procedure.measure_train_step(cfg)
    assert r.status == "unavailable" and words in r.message
    assert r.message.startswith("calc does not model this: ")
    assert " ".join(str(calc_says.value).split())[:120] in r.message
    assert r.params is None and r.predicted_peak_bytes is None


@pytest.mark.parametrize("kw, words", [
    (dict(optimizer="adamw_8bit"), "optimizer adamw_8bit needs it"),
    (dict(optimizer="paged_adamw_8bit"), "optimizer paged_adamw_8bit needs it"),
    (dict(liger=True), "liger_kernel not installed"),
])
def test_missing_library_is_unavailable_with_the_hint(kw, words, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    cfg = tconfig.TrainConfig("tiny-llama", 16, "sdpa_math", "bf16", **kw)
    r = procedure.measure_train_step(cfg)
    assert r.status == "unavailable" and words in r.message and "\n" not in r.message
    assert "carry its wheel" in r.message and r.params is None
    assert r.predicted_peak_bytes  # calc still predicts it


# ---------------------------------------------------------------------------------------------
# The optimizers (CPU, tiny Llama): the classes calc counts, their state against calc's count.
# ---------------------------------------------------------------------------------------------
def _tiny_step(optimizer: str):
    """A bf16 tiny Llama on the CPU after one step of ``optimizer``: (optimizer, model)."""
    torch = pytest.importorskip("torch")
    from attnmem.measure.model_common import model_from_config

    torch.manual_seed(0)
    model = model_from_config(tm.build_config("tiny-llama"), torch.bfloat16, "eager")
    opt = recipes.make_optimizer(optimizer, model.parameters())
    ids = torch.randint(0, 128, (1, 16))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    opt.step()
    return opt, model


def _state_bytes(opt) -> int:
    """Bytes of the distinct tensor storages in the optimizer's state (shared maps once)."""
    import torch

    seen, total = set(), 0
    for st in opt.state.values():
        for t in st.values():
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += t.untyped_storage().nbytes()
    return total


def _tiny_tensors():
    return param_tensors(ModelConfig.from_hf_config(tm.hf_config("tiny-llama")))


def test_torch_optimizers_are_the_ones_calc_counts():
    opt, model = _tiny_step("adamw")
    assert type(opt).__name__ == "AdamW" and not opt.defaults["fused"]
    n = sum(p.numel() for p in model.parameters())
    assert _state_bytes(opt) == 2 * 2 * n + 4 * len(list(model.parameters()))  # bf16 moments
    fused, _ = _tiny_step("adamw_fused")
    assert fused.defaults["fused"] is True
    sgd, _ = _tiny_step("sgd")
    assert type(sgd).__name__ == "SGD" and sgd.defaults["momentum"] == 0
    assert _state_bytes(sgd) == 0  # momentum 0 keeps no buffer: calc's "no state"


def test_adafactor_state_matches_calc():
    """transformers' Adafactor with its defaults (no first moment, factored second moment for
    every matrix, fp32): its state's bytes equal calc's count of it."""
    opt, _ = _tiny_step("adafactor")
    assert type(opt).__module__ == "transformers.optimization"
    assert opt.defaults["beta1"] is None and opt.defaults["relative_step"] is True
    assert _state_bytes(opt) == optimizer_state("adafactor", _tiny_tensors(), 2, 1).device


@pytest.mark.parametrize("name", ["adamw_8bit", "paged_adamw_8bit"])
def test_bitsandbytes_state_matches_calc(name):
    """bitsandbytes' 8-bit AdamW (its CPU backend): uint8 states with fp32 block maxima for
    tensors of >= 4,096 elements, fp32 states below, the two shared quantization maps; the
    bytes equal calc's count (on the CPU nothing is paged, so calc's device + paged)."""
    pytest.importorskip("bitsandbytes")
    try:
        opt, _ = _tiny_step(name)
    except (RuntimeError, NotImplementedError) as exc:  # no CPU kernel in this build
        pytest.skip(f"bitsandbytes cannot step on the CPU here: {exc}")
    assert type(opt).__name__ == {"adamw_8bit": "AdamW8bit",
                                  "paged_adamw_8bit": "PagedAdamW8bit"}[name]
    st = optimizer_state(name, _tiny_tensors(), 2, 1)
    assert _state_bytes(opt) == st.device + st.paged
    assert recipes.paged_state_bytes(opt) == 0  # CPU: bitsandbytes falls back to device buffers


# ---------------------------------------------------------------------------------------------
# The steps on the CPU, through the command line's child.
# ---------------------------------------------------------------------------------------------
def test_recipe_rows_through_the_command_line(tmp_path, monkeypatch):
    """One child process: SGD, Adafactor, offloading and the QLoRA recipe (where bitsandbytes
    imports: its CPU backend and our kernel under the Triton interpreter) on a tiny Llama in
    bf16; the CSV carries the recipe columns."""
    pytest.importorskip("peft")
    from attnmem.measure import cli

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "rows.csv"
    rc = cli.main(["--train", "--model", "tiny-llama", "--seq-len", "16", "--attention",
                   "sdpa_math", "--optimizer", "sgd,adafactor", "--offload-activations", "both",
                   "--out", str(out), "--quiet"])
    assert rc == 0
    rows = tstore.read_rows(out)
    assert [(r["optimizer"], r["offload_activations"]) for r in rows] == [
        ("sgd", False), ("sgd", True), ("adafactor", False), ("adafactor", True)]
    for r in rows:
        assert r["status"] == "ok", r["message"]
        assert r["predicted_peak_bytes"] and abs(r["loss"] - math.log(128)) < 1.5
        assert r["kbit_prepare"] is False and r["liger"] is False

    out2 = tmp_path / "qlora.csv"
    rc = cli.main(["--train", "--model", "tiny-llama", "--seq-len", "16", "--attention",
                   "triton", "--checkpointing", "on", "--adapter", "lora", "--rank", "4",
                   "--base-dtype", "nf4", "--kbit-prepare", "on", "--optimizer",
                   "paged_adamw_8bit", "--out", str(out2), "--quiet"])
    assert rc == 0
    (q,) = tstore.read_rows(out2)
    assert q["kbit_prepare"] is True and q["optimizer"] == "paged_adamw_8bit"
    assert q["predicted_peak_bytes"], q["message"]
    if q["status"] == "unavailable":
        assert "bitsandbytes not installed" in q["message"]
    else:
        assert q["status"] == "ok", q["message"]
        assert "prepare_model_for_kbit_training" in q["message"]
        assert "QLoRA without prepare_model_for_kbit_training" not in q["message"]
        # r 4 on q, k, v, o, gate, up, down: r × (in + out) each, two layers
        assert q["trainable_params"] == 2 * 4 * ((64 + 64) * 2 + (64 + 32) * 2 + (64 + 128) * 3)


def test_kbit_prepare_casts_as_calc_counts():
    """The prepare step on the 4-bit tiny Llama (bitsandbytes' CPU backend): the base frozen,
    every non-4-bit parameter fp32 (embeddings, lm_head, norms: calc's kbit_upcast_bytes),
    checkpointing on."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    from attnmem.calc.train_recipes import kbit_upcast_bytes
    from attnmem.measure.model_common import model_from_config
    from attnmem.measure.train.finetune import quantize_base

    model = model_from_config(tm.build_config("tiny-llama"), torch.bfloat16, "eager")
    try:
        quantize_base(model, "nf4")
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"bitsandbytes cannot quantize on the CPU here: {exc}")
    plain = [p for p in model.parameters() if type(p).__name__ != "Params4bit"]
    bf16_bytes = sum(p.numel() * p.element_size() for p in plain)
    model = recipes.kbit_prepare(model, procedure.USE_REENTRANT)
    assert not any(p.requires_grad for p in model.parameters())
    assert {p.dtype for p in plain} == {torch.float32}
    grew = sum(p.numel() * p.element_size() for p in plain) - bf16_bytes
    assert grew == kbit_upcast_bytes(ModelConfig.from_hf_config(tm.hf_config("tiny-llama")))
    assert model.is_gradient_checkpointing


# ---------------------------------------------------------------------------------------------
# Liger's patches undone.
# ---------------------------------------------------------------------------------------------
def test_module_patches_restore_names():
    mod = types.ModuleType("fake_modeling")
    mod.Norm, mod.rope = object(), object()
    norm, rope = mod.Norm, mod.rope
    p = recipes.ModulePatches()
    p.snapshot(mod)
    mod.Norm, mod.added = "liger", 1
    del mod.rope
    assert p.changed() == ["fake_modeling.Norm", "fake_modeling.added", "fake_modeling.rope"]
    p.restore()
    assert mod.Norm is norm and mod.rope is rope and not hasattr(mod, "added")
    assert p.changed() == []


def test_liger_patch_is_undone_after_the_row():
    """apply_liger_kernel_to_llama on a tiny Llama (the patch itself needs no GPU): the
    modeling module's names change, and after the harness's row they are the originals, so
    the worker's next row builds transformers' own modules."""
    pytest.importorskip("liger_kernel.transformers")
    torch = pytest.importorskip("torch")
    from transformers.models.llama import modeling_llama

    from attnmem.measure.model_common import model_from_config

    before = dict(vars(modeling_llama))
    model = model_from_config(tm.build_config("tiny-llama"), torch.bfloat16, "sdpa")
    p = recipes.ModulePatches()
    assert recipes.apply_liger(model, p) == "apply_liger_kernel_to_llama"
    assert {"LlamaRMSNorm", "LlamaMLP", "apply_rotary_pos_emb"} <= {
        n.rsplit(".", 1)[1] for n in p.changed()}
    assert type(model.model.norm).forward is not model.model.norm.forward.__func__
    p.restore()
    assert all(vars(modeling_llama).get(k) is v for k, v in before.items())
    cfg = tconfig.TrainConfig("tiny-llama", 16, "sdpa_math", "bf16", liger=True)
    procedure.measure_train_step(cfg)  # on the CPU the Liger kernels may not run: no matter
    assert all(vars(modeling_llama).get(k) is v for k, v in before.items())
    assert set(vars(modeling_llama)) == set(before)


# ---------------------------------------------------------------------------------------------
# The plan.
# ---------------------------------------------------------------------------------------------
def _recipe(c: tconfig.TrainConfig) -> str:
    if c.kbit_prepare and c.optimizer == "paged_adamw_8bit" and c.base_dtype == "nf4" \
            and c.checkpointing:
        return "qlora-recipe"
    if c.lora and c.liger and not c.kbit_prepare:
        return "lora+liger"
    if not c.lora and c.optimizer == "adamw_8bit" and c.offload_activations:
        return "full+8bit+offload"
    return ""


def test_recipes_plan_lists_its_rows(capsys):
    assert tcli.main(["--plan", "h200-recipes", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    plan = tplan.recipes_plan()
    assert out[-1] == f"{len(plan)} configurations" and len(plan) >= 24
    assert out[:-1] == [c.label() for c in plan]


def test_recipes_plan_covers_item_3_and_fits_an_h100():
    plan = tplan.recipes_plan()
    assert "h200-recipes" in tplan.PLANS
    assert len(plan) == len({(*c.series(), c.seq_len) for c in plan})
    dense = {c.model for c in plan if "mixtral" not in c.model and "30b" not in c.model}
    moe = {c.model for c in plan} - dense
    assert len(dense) >= 3 and moe == {"mixtral-8x7b-2l", "qwen3-30b-a3b-4l"}
    assert {c.batch for c in plan} >= {1, 2, 4, 8}
    assert min(c.seq_len for c in plan) == 1000 and max(c.seq_len for c in plan) == 16384
    first = plan[:24]  # what a short budget keeps: every lever alone and every combination
    for opt in tconfig.OPTIMIZERS:
        assert any(c.optimizer == opt and not c.lora and not c.liger
                   and not c.offload_activations for c in first), opt
    assert any(c.liger and not c.lora and c.optimizer == "adamw" for c in first)
    assert any(c.offload_activations and c.optimizer == "adamw" for c in first)
    assert any(c.kbit_prepare and c.optimizer == "adamw" for c in first)
    assert {_recipe(c) for c in first} >= {"qlora-recipe", "lora+liger", "full+8bit+offload"}
    assert {c.model for c in first} & moe == moe
    for c in plan:  # valid, predicted by calc (none refused), under an H100's 80 GB
        assert tconfig.check_config(c) is None, c
        p = predict.prediction(c, tm.hf_config(c.model, c.layers))
        assert p.peak and not p.refused and not p.message, (c.label(), p.message)
        assert p.peak < PLAN_PEAK_LIMIT, (c.label(), p.peak / GIB)
    for name in ("qlora-recipe", "lora+liger", "full+8bit+offload"):
        rows = [c for c in plan if _recipe(c) == name]
        assert len(rows) >= 3 and len({c.seq_len * c.batch for c in rows}) >= 3, name


# ---------------------------------------------------------------------------------------------
# GPU.
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("kw", [
    dict(optimizer="adamw_fused"), dict(optimizer="adafactor"), dict(optimizer="sgd"),
    dict(optimizer="adamw_8bit"), dict(optimizer="paged_adamw_8bit"), dict(liger=True),
    dict(offload_activations=True), dict(checkpointing=True, offload_activations=True),
    dict(checkpointing=True, adapter="lora", rank=4, **{k: v for k, v in
                                                         tplan.QLORA_RECIPE.items()
                                                         if k not in ("adapter", "rank")}),
])
def test_gpu_each_lever_runs_on_a_tiny_llama(kw):
    """Every lever's step runs on the GPU (a missing library skips, with the reason)."""
    if kw.get("optimizer", "").endswith("8bit") or kw.get("base_dtype") == "nf4":
        pytest.importorskip("bitsandbytes")
    if kw.get("liger"):
        pytest.importorskip("liger_kernel")
    attention = "triton" if kw.get("kbit_prepare") else "sdpa_flash"
    kw = dict(kw)
    ckpt = kw.pop("checkpointing", False)
    r = procedure.measure_train_step(tconfig.TrainConfig("tiny-llama", 256, attention, "bf16",
                                                         ckpt, **kw))
    assert r.status == "ok", r.message
    assert r.peak_bytes >= r.before_step_bytes > 0 and abs(r.loss - math.log(128)) < 1.5
    if kw.get("liger"):
        assert "apply_liger_kernel_to_llama" in r.message


@pytest.mark.gpu
@pytest.mark.parametrize("name, kw", [
    ("qlora-recipe", dict(attention="triton", checkpointing=True, **tplan.QLORA_RECIPE)),
    ("lora+liger", dict(liger=True, **tplan.RECIPE_LORA)),
    ("full+8bit+offload", dict(optimizer="adamw_8bit", offload_activations=True)),
    ("paged", dict(optimizer="paged_adamw_8bit")),
])
def test_gpu_recipes_within_the_issue_targets(name, kw):
    """Llama 3.1 8B widths (2 layers) at 1,000 tokens, each under 10 GiB: the peak within 2%
    and before-step within 1% of calc (issue 43's targets), the paged state as calc counts
    it."""
    if kw.get("optimizer", "").endswith("8bit") or kw.get("base_dtype") == "nf4":
        pytest.importorskip("bitsandbytes")
    if kw.get("liger"):
        pytest.importorskip("liger_kernel")
    kw = {"attention": "sdpa_flash", **kw}
    attention = kw.pop("attention")
    ckpt = kw.pop("checkpointing", False)
    cfg = tconfig.TrainConfig("llama3-8b-2l", 1000, attention, "bf16", ckpt, **kw)
    r = procedure.measure_train_step(cfg)
    assert r.status == "ok", r.message
    m = _calc(cfg)
    assert abs(r.peak_bytes - m.peak_bytes) <= 0.02 * r.peak_bytes, (r.peak_bytes, m.peak_bytes)
    assert abs(r.before_step_bytes - m.before_step_bytes) <= 0.01 * r.before_step_bytes
    if cfg.optimizer == "paged_adamw_8bit":
        assert f"paged optimizer state {m.optimizer_paged_bytes} bytes" in r.message


def test_skip_done_and_plan_attention_pick_the_unmeasured_part(tmp_path):
    """--skip-done leaves out the plan's rows a CSV holds as measured (a row records its layer
    count, the plan leaves it None), and --plan-attention keeps one attention's rows."""
    plan = tplan.PLANS["h200-recipes"]()
    first, second = plan[0], plan[1]
    path = tmp_path / "done.csv"
    rows = [{**first.row_identity(), "layers": tm.MODELS[first.model][1], "status": "ok",
             "peak_bytes": 1},
            {**second.row_identity(), "status": "oom", "peak_bytes": ""}]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    ap = tcli.build_parser()
    left = tcli.configs_from_args(ap.parse_args(["--plan", "h200-recipes",
                                                 "--skip-done", str(path)]))
    assert len(left) == len(plan) - 1 and first not in left and second in left
    triton = tcli.configs_from_args(ap.parse_args(["--plan", "h200-recipes",
                                                   "--plan-attention", "triton"]))
    assert triton and all(c.attention == "triton" for c in triton)
    assert len(triton) == sum(c.attention == "triton" for c in plan)
    with pytest.raises(SystemExit, match="nope.csv: file not found"):
        tcli.configs_from_args(ap.parse_args(["--plan", "h200-recipes",
                                              "--skip-done", str(tmp_path / "nope.csv")]))
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit, match="other.csv: not a training-step CSV"):
        tcli.configs_from_args(ap.parse_args(["--plan", "h200-recipes",
                                              "--skip-done", str(tmp_path / "other.csv")]))
    with pytest.raises(SystemExit, match="filters a --plan"):
        tcli.configs_from_args(ap.parse_args(["--plan-attention", "triton"]))
