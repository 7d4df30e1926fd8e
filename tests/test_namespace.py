"""The project's import names are its own, so no dependency's can be shadowed.

transformers 5.25 imports Hugging Face's package named ``kernels``; a top-level ``kernels/``
folder of ours, first on ``sys.path`` from the repository root (pytest, Streamlit,
``python -m``), used to hide it and broke every transformers path. Everything importable of
the project now lives under ``attnmem``. These tests run in a fresh process started from the
repository root, where the shadowing happened.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OWN = "attnmem"

_PROBE = r"""
import importlib.metadata as md, json, sys
from pathlib import Path
root = Path.cwd().resolve()
assert sys.path[0] in ("", str(root)), sys.path[:2]  # the repository root comes first

import torch
import transformers
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

calls = []
def probe(module, query, key, value, attention_mask, **kw):
    calls.append(tuple(query.shape))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

AttentionInterface.register("namespace_probe", probe)
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
model = LlamaForCausalLM(cfg).eval()
model.config._attn_implementation = "namespace_probe"
with torch.no_grad():
    out = model(torch.randint(0, 64, (1, 7)))

import attnmem.kernels.hf
names = {
    "transformers": transformers.__version__,
    "logits": list(out.logits.shape),
    "calls": len(calls),
    "attnmem.kernels.hf": attnmem.kernels.hf.__file__,
    "ours": sorted(k for k, v in md.packages_distributions().items() if "attention-memory" in v),
    "others": sorted(k for k, v in md.packages_distributions().items()
                     if "attention-memory" not in v),
}
try:
    import kernels  # Hugging Face's, when transformers requires it
    names["kernels"] = kernels.__file__
except ImportError:
    names["kernels"] = None
print(json.dumps(names))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_transformers_runs_a_model_through_attention_interface_from_the_root(probe: dict) -> None:
    """From the repository root, transformers imports, builds a tiny Llama and runs it through
    a function registered with AttentionInterface (once per layer)."""
    assert probe["logits"] == [1, 7, 64]
    assert probe["calls"] == 2


def test_every_name_the_project_installs_is_its_own(probe: dict) -> None:
    """The distribution installs one top-level name, ``attnmem``, that no other installed
    distribution provides; ``attnmem`` resolves to this checkout."""
    assert probe["ours"] == [OWN]
    assert OWN not in probe["others"]
    assert Path(probe["attnmem.kernels.hf"]).resolve().is_relative_to(ROOT / OWN)


def test_no_dependency_is_shadowed_from_the_root(probe: dict) -> None:
    """Hugging Face's ``kernels`` (where installed) is the one imported, not a folder here."""
    if probe["kernels"] is not None:
        where = Path(probe["kernels"]).resolve()
        assert "site-packages" in where.parts, where
        assert not where.is_relative_to(ROOT / "kernels"), where


def test_the_repository_root_holds_one_package() -> None:
    """The only importable names at the root are the package and app.py, the app's entry
    script; no installed distribution provides either."""
    packages = sorted(p.name for p in ROOT.iterdir()
                      if p.is_dir() and (p / "__init__.py").exists())
    modules = sorted(p.stem for p in ROOT.glob("*.py"))
    assert packages == [OWN]
    assert modules == ["app"]
    import importlib.metadata as md

    taken = md.packages_distributions()
    assert "app" not in taken, f"'app' is installed by {taken.get('app')}"
