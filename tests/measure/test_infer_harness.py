"""The inference harness (attnmem.measure.infer) and its model list.

On the CPU: the row schema, the configs (parameter counts in transformers against calc, built
on the meta device), the procedure on tiny models (generate() for real; memory counters read
nothing on the CPU, the cache's bytes do), refusals and OOM as rows, the worker protocol, the
store, the reference plan and its budget, the command line. The GPU test is marked ``gpu``.
"""

from __future__ import annotations

import io
import json
import queue
import subprocess
import sys
from pathlib import Path

import pytest

from attnmem.measure import infer_models as im
from attnmem.measure.harness import STATUSES
from attnmem.measure.infer import cli as icli
from attnmem.measure.infer import config as iconfig
from attnmem.measure.infer import plan as iplan
from attnmem.measure.infer import predict as ipredict
from attnmem.measure.infer import procedure, worker
from attnmem.measure.infer import store as istore
from attnmem.measure.infer.config import InferConfig, InferResult

UNRULED_INFER = iplan.UNRULED_MODELS

ROOT = Path(__file__).resolve().parents[2]

#: The columns the lead's calc tests and the page read (issue 29, item 4).
REQUIRED = ("model", "arch", "layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim",
            "vocab", "tied", "sliding_window", "experts", "batch", "prompt_len", "new_tokens",
            "attention", "cache", "prefill_chunk", "params", "weights_bytes", "before_bytes",
            "prefill_peak_bytes", "peak_bytes", "reserved_bytes", "after_bytes", "cache_bytes",
            "prefill_ms", "decode_ms_per_token", "status", "message", "predicted_peak_bytes",
            "predicted_prefill_peak_bytes", "predicted_cache_bytes", "peak_rel_error",
            "prefill_rel_error", "wall_s", "gpu", "driver", "torch", "triton", "transformers",
            "timestamp")
_CUDA_ONLY = ("before_bytes", "prefill_peak_bytes", "peak_bytes", "reserved_bytes",
              "after_bytes")


def test_schema_has_every_required_column_and_documents_it():
    assert set(REQUIRED) <= set(iconfig.INFER_COLUMNS)
    assert len(set(iconfig.INFER_COLUMNS)) == len(iconfig.INFER_COLUMNS)
    for col in iconfig.INFER_COLUMNS:
        assert f"\n    {col} " in iconfig.__doc__, (
            f"column {col} is not described in the docstring")
    for status in ("ok", "oom", "unavailable", "skipped", "error", "timeout", "crashed"):
        assert status in STATUSES


def test_import_is_light():
    code = ("import sys, attnmem.measure.infer.cli, attnmem.measure.infer.procedure, "
            "attnmem.measure.infer_models, attnmem.measure.cli\n"
            "bad = [m for m in ('torch', 'transformers', 'triton', 'streamlit') if m in sys.modules]\n"
            "assert not bad, bad\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr


def test_model_names_and_layers_are_checked():
    with pytest.raises(ValueError, match="unknown inference model 'gpt5'"):
        im.hf_config("gpt5")
    with pytest.raises(ValueError, match="layers must be a whole number >= 1, got 0"):
        im.hf_config("tiny-llama", layers=0)
    d = im.hf_config("llama3.1-8b", layers=3)
    assert d["num_hidden_layers"] == 3 and d["use_cache"] is True


# ---------------------------------------------------------------------------------------------
# The configs (transformers on the meta device: no memory, no download).
# ---------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_param_counts_match_calc_and_models_cover_the_issue():
    from transformers import AutoModelForCausalLM

    from attnmem.calc import ModelConfig, param_count

    shapes = {}
    for name in im.NAMES:
        d = im.hf_config(name)
        hf = im.build_config(d)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf)
        real = sum(p.numel() for p in model.parameters())
        shapes[name] = iconfig.shape_fields(hf)
        try:
            calc_model = ModelConfig.from_hf_config(d, name=name)
        except ValueError:  # a type without calc's rules (issue 42): predicted by the trace
            assert name in UNRULED_INFER, name
            continue
        assert real == param_count(calc_model), name
        assert shapes[name]["layers"] == im.MODELS[name][1]
    assert shapes["llama3.1-8b"]["layers"] == 32 and shapes["deepseek-v2-lite"]["layers"] == 27
    assert shapes["qwen2.5-7b"]["vocab"] >= 150_000
    assert shapes["mistral-7b"]["sliding_window"] == 4096
    assert shapes["qwen3-30b-a3b-8l"]["experts"] == 128 and shapes["llama3.1-8b"]["experts"] is None
    assert shapes["deepseek-v2-lite"]["experts"] == 64


def test_gemma3_cut_keeps_the_five_to_one_pattern():
    hf = im.build_config("gemma3-27b-12l")
    full = [i for i, t in enumerate(hf.layer_types) if t == "full_attention"]
    assert full == [5, 11] and len(hf.layer_types) == 12
    assert iconfig.shape_fields(hf)["sliding_window"] == 1024


# ---------------------------------------------------------------------------------------------
# The procedure on the CPU: generate() for real on tiny models (fp32 on the CPU).
# ---------------------------------------------------------------------------------------------
def _kv_bytes(name: str, batch: int, tokens: int, elem: int = 4) -> int:
    """2 (K, V) x layers x B x H_kv x tokens x d x bytes, from the model's own config."""
    hf = im.build_config(name)
    d = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return 2 * hf.num_hidden_layers * batch * hf.num_key_value_heads * tokens * d * elem


@pytest.mark.parametrize("attention, cache, chunk", [
    ("eager", "dynamic", None), ("sdpa_math", "static", None), ("sdpa_math", "dynamic", 8)])
def test_tiny_llama_generates_on_cpu(attention, cache, chunk):
    prompt, new, batch = 24, 3, 2
    r = procedure.measure_infer(InferConfig("tiny-llama", prompt, attention, batch, new, cache,
                                            chunk))
    assert r.status == "ok", r.message
    assert (r.attention, r.cache, r.prefill_chunk) == (attention, cache, chunk)
    assert r.params == 90432 and r.weights_bytes >= 4 * r.params and r.arch == "llama"
    # the cache holds prompt + new - 1 tokens (the last token is never fed back)
    kv = _kv_bytes("tiny-llama", batch, prompt + new - 1)
    if cache == "dynamic":
        assert r.cache_bytes == kv
    else:  # StaticLayer also holds a cumulative_length counter (one int64 per layer)
        assert 0 < r.cache_bytes - kv <= 64
    assert r.prefill_ms > 0 and r.decode_ms_per_token is not None
    for col in _CUDA_ONLY:
        assert getattr(r, col) is None, col
    assert r.gpu == "cpu" and r.transformers == transformers.__version__ and r.timestamp


def test_sliding_window_cache_holds_the_window_storage():
    """Mistral's DynamicSlidingWindowLayer keeps a view of the last W - 1 tokens of a W-token
    tensor (plus an int64 window tensor per layer): the storage is W tokens once decoding ran."""
    r = procedure.measure_infer(InferConfig("tiny-mistral", 40, "sdpa_math", 1, 3))
    assert r.status == "ok", r.message
    assert r.sliding_window == 16
    assert 0 <= r.cache_bytes - _kv_bytes("tiny-mistral", 1, 16) <= 64


def test_cache_walk_counts_each_storage_once():
    a = torch.zeros(4, 8)

    class Layer:  # module name below makes the walk enter it, as it enters transformers' layers
        pass

    Layer.__module__ = "transformers.cache_utils"
    layer = Layer()
    layer.keys, layer.values, layer.view = a, torch.ones(2, 8), a[1:]
    assert procedure.cache_storage_bytes([layer, {"x": a}]) == (32 + 16) * 4


def test_bad_configs_are_refused_naming_the_value():
    cases = [(InferConfig("nope", 16, "eager"), "unknown model 'nope'"),
             (InferConfig("tiny-llama", 16, "flashy"), "unknown attention 'flashy'"),
             (InferConfig("tiny-llama", 16, "eager", cache="paged"), "unknown cache 'paged'"),
             (InferConfig("tiny-llama", 0, "eager"), "prompt_len must be a whole number "
              ">= 1, got 0"),
             (InferConfig("tiny-llama", 16, "eager", new_tokens=0), "new_tokens"),
             (InferConfig("tiny-llama", 16, "eager", prefill_chunk=0), "prefill_chunk"),
             (InferConfig("tiny-llama", 16, "eager", layers=-1), "got -1")]
    for cfg, words in cases:
        r = procedure.measure_infer(cfg)
        assert r.status == "error" and words in r.message, (cfg, r.message)


@pytest.mark.parametrize("exc, status", [
    (lambda: torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
    (lambda: RuntimeError("No available kernel. Aborting execution."), "unavailable"),
    (lambda: RuntimeError("CUDA error: an illegal memory access"), "error")])
def test_failures_are_rows(monkeypatch, exc, status):
    def fail(*args, **kwargs):
        raise exc()

    monkeypatch.setattr(procedure, "model_from_config", fail)
    r = procedure.measure_infer(InferConfig("tiny-llama", 16, "eager"))
    assert r.status == status and r.message.startswith(type(exc()).__name__)
    assert r.peak_bytes is None and r.wall_s is not None


def test_missing_prefill_chunking_is_unavailable(monkeypatch):
    monkeypatch.setattr(procedure, "_has_prefill_chunking", lambda: False)
    r = procedure.measure_infer(InferConfig("tiny-llama", 16, "eager", prefill_chunk=8))
    assert r.status == "unavailable" and "prefill_chunk_size" in r.message


def test_fa4_is_unavailable_where_not_installed():
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here")
    r = procedure.measure_infer(InferConfig("tiny-llama", 16, "fa4", new_tokens=2))
    assert r.status == "unavailable" and "FlashAttention4" in r.message


def test_prediction_is_calc_inference_step_or_says_why(monkeypatch):
    cfg = InferConfig("llama3.1-8b", 32000, "sdpa_flash", cache="static", prefill_chunk=2048)
    d = im.hf_config(cfg.model)
    try:
        from attnmem.calc import ModelConfig

        fn = ipredict._inference_step()
    except (ImportError, AttributeError):
        fn = None
    got, why = ipredict.predict(cfg, d)
    if fn is not None:
        try:
            m = fn(ModelConfig.from_hf_config(d, name=cfg.model), 1, 32000, 8,
                   attention="sdpa_flash", weight_dtype="bf16", kv_dtype="bf16",
                   cache="static", prefill_chunk=2048)
        except ValueError as exc:
            assert got["predicted_peak_bytes"] is None and str(exc)[:40] in why
        else:
            assert why == "" and got["predicted_peak_bytes"] == m.peak_bytes
            assert got["predicted_cache_bytes"] == m.kv_cache_bytes
    def missing():
        raise ImportError("No module named 'attnmem.calc.inference_step'")

    monkeypatch.setattr(ipredict, "_inference_step", missing)
    got, why = ipredict.predict(cfg, d)
    assert got["predicted_peak_bytes"] is None and "no inference_step" in why


def test_worker_serves_rows_and_keeps_the_model():
    lines = "\n".join(json.dumps({"cfg": InferConfig("tiny-llama", s, "sdpa_math", 1, 2)
                                  .to_dict()}) for s in (16, 20)) + "\n"
    out = io.StringIO()
    try:
        worker.worker_main(io.StringIO(lines), out)
        assert procedure._HELD.get("key", ())[:3] == ("tiny-llama", None, "sdpa")  # kept
    finally:
        procedure.release_model()
    msgs = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [m["result"]["prompt_len"] for m in msgs] == [16, 20]
    assert all(m["result"]["status"] == "ok" and m["restart"] is False for m in msgs)
    assert not procedure._HELD


# ---------------------------------------------------------------------------------------------
# The store, the plan and its budget, the command line.
# ---------------------------------------------------------------------------------------------
def _row(**kw):
    base = dict(model="tiny-llama", prompt_len=16, new_tokens=2, attention="eager",
                cache="dynamic", status="ok", tied=False, peak_bytes=123, peak_rel_error=-0.25,
                message="=HYPERLINK(x)", prefill_chunk=None)
    base.update(kw)
    return InferResult(**base).to_row()


def test_store_and_csv_round_trip(tmp_path):
    rows = [_row(), _row(prompt_len=32, prefill_chunk=8, status="oom", peak_bytes=None)]
    st = istore.InferStore(tmp_path / "r.sqlite")
    run = st.new_run(gpu="cpu", label="t")
    for r in rows:
        st.add_row(run, r)
    back = st.rows(run)
    assert [b["prompt_len"] for b in back] == [16, 32] and back[1]["prefill_chunk"] == 8
    assert back[0]["tied"] is False and back[0]["peak_rel_error"] == -0.25
    assert st.runs()[0]["n"] == 2
    path = tmp_path / "r.csv"
    with open(path, "w", newline="") as fh:
        istore.write_rows(fh, rows)
    text = path.read_text()
    assert text.splitlines()[0] == ",".join(iconfig.INFER_COLUMNS)
    assert "'=HYPERLINK(x)" in text  # spreadsheet formulas neutralised
    got = istore.read_rows(path)
    assert got[0]["peak_bytes"] == 123 and got[1]["peak_bytes"] is None
    assert got[1]["prefill_chunk"] == 8 and got[0]["prefill_chunk"] is None
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not an inference CSV"):
        istore.read_rows(bad)


def test_reference_plan_covers_the_issue_and_builds_each_model_once_per_attention():
    plan = iplan.reference_plan()
    assert 100 <= len(plan) <= 150
    assert plan[0].model == "llama3.1-8b"  # the most important first: a budget cuts the rest
    assert {c.model for c in plan} >= {"llama3.1-8b", "qwen2.5-7b", "mistral-7b",
                                        "gemma3-27b-12l", "qwen3-30b-a3b-8l", "deepseek-v2-lite"}
    assert {c.attention for c in plan} >= {"eager", "sdpa_flash", "sdpa_efficient", "triton"}
    assert {c.cache for c in plan} == set(iconfig.CACHES)
    assert {c.prefill_chunk for c in plan} >= {None, 2048}
    assert {c.batch for c in plan} >= {1, 4, 8}
    lens = {c.prompt_len for c in plan}
    assert min(lens) <= 1000 and max(lens) >= 120_000
    assert any(s & (s - 1) for s in lens)  # non-powers of two
    assert all(iconfig.check_config(c) is None for c in plan)
    assert len({(c.label()) for c in plan}) == len(plan)  # no duplicates
    keys = [c.build_key() for c in plan]
    runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    assert len(runs) == len(set(runs)), "a model/attention build appears in two places"


class _FakeProc:
    returncode = 0

    def poll(self):
        return None


class _FakeChild:
    """Answers like the worker: OOM from prompt 64 on, ok below."""

    def __init__(self, env):
        self.proc = _FakeProc()
        self.messages = queue.Queue()
        self.done = 0

    def send(self, msg):
        cfg = InferConfig.from_dict(msg["cfg"])
        row = InferResult(model=cfg.model, prompt_len=cfg.prompt_len,
                          attention=cfg.attention, status="oom" if cfg.prompt_len >= 64
                          else "ok")
        self.messages.put({"result": row.to_row(), "restart": False})

    def close(self):
        pass

    def kill(self):
        pass


def test_runner_skips_longer_after_oom_and_after_the_budget(monkeypatch, tmp_path):
    monkeypatch.setattr(worker, "_InferChild", _FakeChild)
    cfgs = iplan.expand(["tiny-llama"], [32, 64, 128], ["eager", "sdpa_math"])
    s = worker.run_infer(cfgs, lock_dir=tmp_path)
    got = [(r.attention, r.prompt_len, r.status) for r in s.results]
    assert got == [("eager", 32, "ok"), ("eager", 64, "oom"), ("eager", 128, "skipped"),
                   ("sdpa_math", 32, "ok"), ("sdpa_math", 64, "oom"),
                   ("sdpa_math", 128, "skipped")]
    assert "prompt 64 of the same series" in s.results[2].message
    s = worker.run_infer(iplan.reference_plan(), lock_dir=tmp_path, budget_s=0)
    assert {r.status for r in s.results} == {"skipped"}
    assert "time budget of 0 s" in s.results[0].message


@pytest.mark.parametrize("argv, words", [
    (["--attention", "flashy"], "unknown attention(s) flashy"),
    (["--cache", "paged"], "unknown cache kind(s) paged"),
    (["--model", "gpt5"], "unknown model(s) gpt5"),
    (["--prefill-chunk", "0"], "--prefill-chunk takes 'none' or whole numbers >= 1, got '0'"),
    (["--prompt-len", "abc"], "--prompt-len must be whole numbers"),
    (["--batch", "0"], "--batch must be a whole number >= 1, got 0"),
    (["--new-tokens", "0"], "--new-tokens must be a whole number >= 1, got 0")])
def test_command_line_errors_are_one_line(argv, words):
    with pytest.raises(SystemExit) as e:
        icli.configs_from_args(icli.build_parser().parse_args(argv))
    msg = str(e.value)
    assert msg.startswith("error: ") and words in msg and "\n" not in msg


def test_command_line_lists_the_plan_and_cross_product(capsys):
    from attnmem.measure import cli

    assert cli.main(["--infer", "--plan", "h200", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith(f"{len(iplan.reference_plan())} configurations")
    args = icli.build_parser().parse_args(["--model", "tiny-llama", "--prompt-len", "16,32",
                                           "--attention", "eager", "--cache", "both",
                                           "--prefill-chunk", "none", "8"])
    cfgs = icli.configs_from_args(args)
    assert len(cfgs) == 2 * 2 * 2
    assert {(c.cache, c.prefill_chunk) for c in cfgs} == {("dynamic", None), ("dynamic", 8),
                                                          ("static", None), ("static", 8)}


# ---------------------------------------------------------------------------------------------
# On a GPU.
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_tiny_row_on_cuda_orders_its_bytes_and_caches_the_formula():
    from attnmem.calc import ModelConfig
    from attnmem.calc.kv import kv_cache_bytes

    prompt, new, batch = 64, 4, 2
    # torch's own SDPA choice: forcing the memory-efficient backend finds no kernel under
    # transformers' enable_gqa (H200, torch 2.11), so this row used to be 'unavailable'.
    r = procedure.measure_infer(InferConfig("tiny-llama", prompt, "sdpa", batch, new))
    assert r.status == "ok", r.message
    assert r.peak_bytes >= r.after_bytes >= r.before_bytes > 0
    assert r.prefill_peak_bytes >= r.before_bytes and r.reserved_bytes >= r.peak_bytes
    model = ModelConfig.from_hf_config(im.hf_config("tiny-llama"), name="tiny-llama")
    assert r.cache_bytes == kv_cache_bytes(model, batch, prompt + new - 1, "bf16")
