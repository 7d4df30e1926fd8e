"""The layers point one way: calc <- kernels <- pages, and calc <- attnmem.

- calc (the analytic model) imports none of kernels, pages, attnmem or app;
- kernels (the kernel and the measurement side) import neither pages, attnmem nor app;
- attnmem (the command line) imports neither pages, kernels nor app.

Imports are read from the source with ast, every one of them (module level, inside functions,
relative ones resolved), so a lazy import inside a function counts too. The installed command
line needs only what pyproject.toml declares: it runs here with torch, triton, streamlit,
plotly, transformers and the app's packages made unimportable.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("calc", "kernels", "pages", "attnmem", "app")

#: package -> the top-level packages of this repository it must not import
FORBIDDEN = {
    "calc": {"kernels", "pages", "attnmem", "app"},
    "kernels": {"pages", "attnmem", "app"},
    "attnmem": {"pages", "kernels", "app"},
}


def imported_modules(source: str, module: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in `source`, the code of `module` (a dotted name:
    relative imports are resolved against it)."""
    out = []
    package = module.rsplit(".", 1)[0] if not module.endswith("__init__") else module
    package = package.removesuffix(".__init__")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            out.append((node.lineno, name))
    return out


def wrong_way_imports(source: str, module: str) -> list[str]:
    """The imports of `module` that point against the layers (FORBIDDEN), as 'line: name'."""
    top = module.split(".")[0]
    banned = FORBIDDEN.get(top, set())
    return [f"{line}: {name}" for line, name in imported_modules(source, module)
            if name.split(".")[0] in banned]


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_points_back(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    bad = {}
    for path in files:
        found = wrong_way_imports(path.read_text(encoding="utf-8"), _module_name(path))
        if found:
            bad[str(path.relative_to(ROOT))] = found
    assert not bad, (f"{package} may not import {sorted(FORBIDDEN[package])} "
                     f"(calc <- kernels <- pages, calc <- attnmem): {bad}")


@pytest.mark.parametrize("source, module, found", [
    ("import pandas\nfrom calc.units import GB\n", "calc.peak", []),
    ("def f():\n    from pages.ui import finetune\n", "attnmem.cli", ["2: pages.ui"]),
    ("import kernels.measure.store as s\n", "calc.sweep", ["1: kernels.measure.store"]),
    ("from ..pages import x\n", "kernels.measure.store", []),  # kernels.pages: not the app's
    ("from ... import pages\n", "kernels.measure.train.store", []),
    ("from .. import hub\n", "attnmem.cli", []),
    ("if True:\n    import app\n", "kernels.flash.api", ["2: app"]),
    ("from pages.ui import labels\n", "pages.scaling", []),  # pages may import anything
])
def test_the_checker_finds_what_points_back(source: str, module: str, found: list[str]) -> None:
    assert wrong_way_imports(source, module) == found


def test_relative_imports_are_resolved() -> None:
    assert imported_modules("from .store import x\nfrom . import y\n",
                            "kernels.measure.child") == [(1, "kernels.measure.store"),
                                                         (2, "kernels.measure")]
    assert imported_modules("from .units import GB\n", "calc.__init__") == [(1, "calc.units")]


# --- what an installed attnmem needs --------------------------------------------------------

#: Not declared as attnmem's dependencies (pyproject.toml: extras, or not installed at all):
#: the CLI must run without them.
BLOCKED = ("torch", "triton", "streamlit", "plotly", "transformers", "pages", "kernels", "app")

_BLOCKER = f"""
import json, sys, time
BLOCKED = {BLOCKED!r}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked: attnmem must not need it")
        return None
sys.meta_path.insert(0, Blocker())
from attnmem.cli import main
args = json.loads(sys.argv[1])
t0 = time.perf_counter()
try:
    code = main(args)
except SystemExit as e:
    code = e.code
took = time.perf_counter() - t0
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps({{"code": code, "took": took, "loaded": loaded}}), file=sys.stderr)
"""


def _run_cli(args: list[str]) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", _BLOCKER, json.dumps(args)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1]), done.stdout


def test_help_needs_no_gpu_or_app_package_and_answers_within_a_second() -> None:
    info, out = _run_cli(["--help"])
    assert info["code"] == 0 and info["loaded"] == [], info
    assert "usage: attnmem" in out
    assert info["took"] < 1.0, f"attnmem --help took {info['took']:.2f} s"


@pytest.mark.parametrize("args, key, want", [
    (["memory", "--model", "GPT-2 (124M)", "--seq-len", "1024"], "seq_len", 1024),
    (["train", "--model", "Llama 3.1 8B", "--seq-len", "1k", "--adapter", "lora"],
     "adapter", "lora"),
])
def test_a_calc_command_needs_only_the_declared_dependencies(args: list[str], key: str,
                                                            want: object) -> None:
    info, out = _run_cli([*args, "--json"])
    assert info["code"] == 0 and info["loaded"] == [], info
    assert json.loads(out)[key] == want


def test_the_blocker_blocks() -> None:
    """The test above would pass vacuously if blocking did nothing: a command that needs a
    blocked package must fail under it."""
    done = subprocess.run([sys.executable, "-c", _BLOCKER.replace(
        "from attnmem.cli import main", "from attnmem.cli import main\nimport pages.ui.labels"),
        json.dumps(["--help"])], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode != 0 and "pages is blocked" in done.stderr, done.stderr


# --- declared dependencies ------------------------------------------------------------------

def _requirement_lines(path: Path) -> set[str]:
    lines = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("  #")[0].strip()
        if line and not line.startswith("#"):
            lines.add(re.sub(r"\s+", " ", line))
    return lines


def test_pyproject_declares_what_requirements_txt_installs() -> None:
    """requirements.txt (the app with the GPU side) = attnmem's dependencies + the app and gpu
    extras, with the same lower bounds."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {*project["dependencies"], *project["optional-dependencies"]["app"],
                *project["optional-dependencies"]["gpu"]}
    declared = {re.sub(r"\s+", " ", d.replace('"', "'")) for d in declared}
    wanted = {r.replace('"', "'") for r in _requirement_lines(ROOT / "requirements.txt")}
    assert declared == wanted, (f"only in pyproject.toml: {sorted(declared - wanted)}; "
                                f"only in requirements.txt: {sorted(wanted - declared)}")
    assert not any(re.match(r"(torch|triton|streamlit|plotly|transformers)\b", d)
                   for d in project["dependencies"]), project["dependencies"]
