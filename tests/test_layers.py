"""The rooms of the one package point one way, and the package is the repository's only name.

Inside ``attnmem``: calc <- kernels <- measure <- pages, calc <- trace <- pages, and calc <- cli
(``attnmem.cli``, ``attnmem.hub``, ``attnmem.__main__``):

- calc (the analytic model) imports none of the other rooms, nor app;
- trace (real models on the meta device, feeding calc) imports only calc;
- kernels (what runs attention) imports neither measure, pages, the command line nor app;
  its development probes (``kernels.dev``) are command lines and may use measure's timers;
- measure imports neither pages, the command line nor app;
- the command line imports neither pages, kernels, measure nor app;
- nothing but kernels.dev itself imports kernels.dev.

Imports are read from the source with ast, every one of them (module level, inside functions,
relative ones resolved), so a lazy import inside a function counts too. The installed command
line needs only what pyproject.toml declares: it runs here with torch, triton, streamlit,
plotly, transformers and the app's rooms made unimportable.
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
PKG = "attnmem"
CLI = ("attnmem.cli", "attnmem.hub", "attnmem.__main__")
DEV = "attnmem.kernels.dev"

#: room -> the rooms (dotted prefixes) it must not import
FORBIDDEN = {
    "attnmem.calc": ("attnmem.kernels", "attnmem.measure", "attnmem.pages", "attnmem.trace",
                     *CLI, "app"),
    "attnmem.trace": ("attnmem.kernels", "attnmem.measure", "attnmem.pages", *CLI, "app"),
    "attnmem.kernels": ("attnmem.measure", "attnmem.pages", *CLI, "app"),
    "attnmem.measure": ("attnmem.pages", *CLI, "app"),
    "attnmem.cli": ("attnmem.pages", "attnmem.kernels", "attnmem.measure", "app"),
}


def room(module: str) -> str | None:
    """The room of a dotted module name (None outside the rules: pages, app, tests)."""
    if module in CLI or module.startswith(tuple(m + "." for m in CLI)):
        return "attnmem.cli"
    for name in FORBIDDEN:
        if module == name or module.startswith(name + "."):
            return name
    return None


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


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
    """The imports of `module` that point against the layers (FORBIDDEN, and into kernels.dev
    from outside it), as 'line: name'."""
    own = room(module)
    banned = FORBIDDEN.get(own, ()) if own else ()
    if _under(module, DEV):
        banned = tuple(b for b in banned if b != "attnmem.measure")
    out = []
    for line, name in imported_modules(source, module):
        if any(_under(name, b) for b in banned) or (_under(name, DEV) and not _under(module, DEV)):
            out.append(f"{line}: {name}")
    return out


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _sources() -> list[Path]:
    return sorted((ROOT / PKG).rglob("*.py")) + [ROOT / "app.py"]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_points_back(package: str) -> None:
    files = [p for p in _sources() if room(_module_name(p)) == package]
    assert files, f"no Python files in {package}"
    bad = {}
    for path in files:
        found = wrong_way_imports(path.read_text(encoding="utf-8"), _module_name(path))
        if found:
            bad[str(path.relative_to(ROOT))] = found
    assert not bad, (f"{package} may not import {sorted(FORBIDDEN[package])} "
                     f"(calc <- kernels <- measure <- pages, calc <- cli): {bad}")


def test_nothing_outside_the_probes_imports_them() -> None:
    bad = {}
    for path in _sources():
        name = _module_name(path)
        if _under(name, DEV):
            continue
        found = [f"{ln}: {n}" for ln, n in imported_modules(path.read_text(encoding="utf-8"), name)
                 if _under(n, DEV)]
        if found:
            bad[str(path.relative_to(ROOT))] = found
    assert not bad, f"only their own command lines run the kernel probes: {bad}"


@pytest.mark.parametrize("source, module, found", [
    ("import pandas\nfrom attnmem.calc.units import GB\n", "attnmem.calc.peak", []),
    ("def f():\n    from attnmem.pages.ui import finetune\n", "attnmem.cli",
     ["2: attnmem.pages.ui"]),
    ("import attnmem.measure.store as s\n", "attnmem.calc.sweep", ["1: attnmem.measure.store"]),
    ("from ..measure import store\n", "attnmem.kernels.hf", ["1: attnmem.measure"]),
    ("from ...pages import x\n", "attnmem.measure.train.store", ["1: attnmem.pages"]),
    ("from . import hub\n", "attnmem.cli", []),
    ("if True:\n    import app\n", "attnmem.kernels.flash.api", ["2: app"]),
    ("from attnmem.measure.bench.speed import t\n", "attnmem.kernels.dev.host_sm90", []),
    ("from attnmem.kernels.dev import ab_bwd\n", "attnmem.measure.cli",
     ["1: attnmem.kernels.dev"]),
    ("from attnmem.pages.ui import labels\n", "attnmem.pages.scaling", []),  # pages: anything
    ("import attnmem.calculus\n", "attnmem.cli", []),  # a prefix is not a room
])
def test_the_checker_finds_what_points_back(source: str, module: str, found: list[str]) -> None:
    assert wrong_way_imports(source, module) == found


def test_relative_imports_are_resolved() -> None:
    assert imported_modules("from .store import x\nfrom . import y\n",
                            "attnmem.measure.child") == [(1, "attnmem.measure.store"),
                                                         (2, "attnmem.measure")]
    assert imported_modules("from .units import GB\n", "attnmem.calc.__init__") == [
        (1, "attnmem.calc.units")]


# --- what an installed attnmem needs --------------------------------------------------------

#: Not declared as attnmem's dependencies (pyproject.toml: extras, or not installed at all):
#: the CLI must run without them.
BLOCKED = ("torch", "triton", "streamlit", "plotly", "transformers", "attnmem.pages",
           "attnmem.kernels", "attnmem.measure", "app")

_BLOCKER = f"""
import json, sys, time
BLOCKED = {BLOCKED!r}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
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
loaded = sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED))
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
        "from attnmem.cli import main", "from attnmem.cli import main\nimport attnmem.pages.ui.labels"),
        json.dumps(["--help"])], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode != 0 and "attnmem.pages is blocked" in done.stderr, done.stderr


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
