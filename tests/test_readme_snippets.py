"""The README's Python snippets run as written, from the repository root, in a fresh process
(where a top-level package named like a dependency's would shadow it). Without a GPU the
snippet builds the model with our kernel registered; with one it also runs a forward."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"),
                      flags=re.S)


def test_the_readme_has_python_snippets() -> None:
    assert SNIPPETS, "no ```python block in README.md"


@pytest.mark.parametrize("code", SNIPPETS, ids=[f"snippet{i}" for i in range(len(SNIPPETS))])
def test_readme_snippet_runs_as_written(code: str) -> None:
    pytest.importorskip("transformers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
