"""Inputs and numbers never disagree, even when a user navigates while a page is still running
(issue 32, item 1).

The race: open a page (a fresh session, so its first run is slow), click another page in the
sidebar about two seconds later while the first is still running, then edit an input right
after the new page appears. Every target page is checked twice, after the navigation and after
the edit: its inputs are read off the widgets on screen and at least one headline number is
recomputed from attnmem.calc with exactly those inputs; the number shown must equal it. A page whose
verdict names a GPU must name the GPU shown in its GPU box.

Every page of the app is a target (all have inputs and numbers): Will it fit?, Score matrix,
Model memory, Inference, Serving, Training step, Scaling, How FlashAttention works, Many GPUs
(computed: the number is recomputed with calc), Kernel speed and GPU measurement (measured: the
number is recomputed from the bundled CSV the page reads, filtered by the choices on screen).
In the suite each is reached once, from the page after it in SOURCES, so every page is also
a source once (its own values are the stale ones that must not leak), four tries at a time
(race_many: each in a browser context of its own, a session of its own on the server; the
tries mostly wait, for their click and for their runs); the reproduction run below reaches
each target from the page before it and the page after it, many times, one try at a time.

Run: .venv/bin/python -m pytest -m browser tests/browser/test_state_race.py
Reproduction rate (tries per target, report only, no assertion):
    .venv/bin/python tests/browser/test_state_race.py --tries 10
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
for _p in (str(ROOT), str(ROOT / "scripts")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import load_test  # noqa: E402  (server start-up and Chromium flags shared with the load test)
import settle_times  # noqa: E402  (WATCH_JS: when the page last changed)

from attnmem.calc import (  # noqa: E402
    CP_IMPL_LABELS,
    GPUS,
    IMPL_LABELS,
    MODELS,
    SHARDING_LABELS,
    TRAIN_ATTENTION_LABELS,
    format_bytes,
    max_seq_len,
    model_memory,
    score_matrix_bytes,
    training_step,
)
from attnmem.calc.context_parallel import context_parallel_memory  # noqa: E402
from attnmem.calc.inference_step import INFER_ATTENTION_LABELS, inference_step  # noqa: E402
from attnmem.calc.io_model import standard_io  # noqa: E402
from attnmem.calc.kv import state_bytes  # noqa: E402
from attnmem.calc.serving import serving_capacity  # noqa: E402
from attnmem.calc.units import dtype_bytes  # noqa: E402
from attnmem.measure.speed_results import OURS, read_rows  # noqa: E402
from attnmem.pages.ui.fit import TASK_LABELS  # noqa: E402  (display labels only; the numbers are calc's)
from attnmem.pages.ui.labels import IMPL_LABELS as SERIES_LABELS  # noqa: E402

pytestmark = pytest.mark.browser

CHROMIUM, LAUNCH_ARGS = load_test.CHROMIUM, load_test.LAUNCH_ARGS
TIMEOUT_MS = 90_000
NAV_AFTER_S = 2.0  # the click lands while the first page's first run is still going
MIB = 1 << 20

try:
    from playwright.sync_api import Page, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

# Every widget on screen, by its label: the value the user sees (number box text, the chosen
# option's text, the checked radio option, a checkbox's state, a multiselect's chips).
_READ_INPUTS = """() => {
  const out = {};
  const kinds = ['stNumberInput', 'stSelectbox', 'stRadio', 'stCheckbox', 'stMultiSelect'];
  for (const w of document.querySelectorAll(kinds.map(k => `[data-testid="${k}"]`).join(','))) {
    const label = ((w.querySelector('label') || {}).innerText || '').trim();
    const kind = w.dataset.testid, input = w.querySelector('input');
    let v = null;
    if (kind === 'stRadio') {
      const on = w.querySelector('[data-testid="stRadioOption"][data-selected="true"]');
      v = on ? on.innerText.trim() : null;
    } else if (kind === 'stCheckbox') v = input.checked;
    else if (kind === 'stMultiSelect')
      v = [...w.querySelectorAll('[data-tag-index]')].map(t => t.getAttribute('aria-label'));
    else v = input ? input.value : null;
    out[label] = v;
  }
  return out;
}"""
_READ_METRICS = """() => Object.fromEntries([...document.querySelectorAll('[data-testid="stMetric"]')]
  .map(m => [(m.querySelector('[data-testid="stMetricLabel"]') || {}).innerText?.trim(),
             (m.querySelector('[data-testid="stMetricValue"]') || {}).innerText?.trim()]))"""


def _skip_reason() -> str | None:
    if sync_playwright is None:
        return "the playwright Python package is not installed (pip install -r requirements-dev.txt)"
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    return None


# --- what each page must show for the inputs on screen ---------------------------------------

def _int(v: str) -> int:
    return int(str(v).replace(",", ""))


def _gpu(v: str) -> str:
    """'NVIDIA H100 80GB (85.52 GB)' -> the GPU's name."""
    return v.rsplit(" (", 1)[0]


def _reverse(table: dict[str, str], shown: str) -> str:
    return next(k for k, v in table.items() if v == shown)


Expect = dict[str, str]  # metric label -> the value calc gives


def expect_score(i: dict[str, Any], unit: str, page: Page) -> Expect:
    n = score_matrix_bytes(_int(i["Batch size B"]), _int(i["Attention heads H"]), _int(i["exact"]),
                           i["Score dtype (bytes per element e)"].split(" ")[0])
    return {f"Score matrix, one layer ({unit})": format_bytes(n, unit)}


def expect_model(i: dict[str, Any], unit: str, page: Page) -> Expect:
    model, gpu = MODELS[i["Model"]], _gpu(i["GPU"])
    b, s, ad = _int(i["Batch size"]), _int(i["exact"]), i["Attention (activation) dtype"]
    alerts = " ".join(page.locator('[data-testid="stAlert"]').all_inner_texts())
    assert f"one {gpu}" in alerts, f"the verdict is not about the GPU shown ({gpu}): {alerts[:300]}"
    mm = model_memory(model, b, s, i["Weights dtype / quantization"], i["KV cache dtype"], ad, "naive")
    state = state_bytes(model, b, ad)
    # the headline is calc's total (generate()'s peak) or, on the page before issue 29 moved
    # it there, the sum of the parts it draws; either is computed from the inputs on screen
    parts = mm.weights_bytes + mm.kv_cache_bytes + mm.attention_bytes + state
    shown = page.evaluate(_READ_METRICS).get("Standard (eager): total")
    totals = [format_bytes(n, unit) for n in (mm.total_bytes + state, mm.total_bytes, parts)]
    return {"Standard (eager): total": shown if shown in totals else totals[0]}


def expect_serving(i: dict[str, Any], unit: str, page: Page) -> Expect:
    cap = serving_capacity(
        MODELS[i["Model"]], _gpu(i["GPU"]), _int(i["exact"]), weight_dtype=i["Weights dtype"],
        kv_dtype=i["KV cache dtype (fp8 halves it)"],
        gpu_memory_utilization=float(i["gpu_memory_utilization"]),
        block_size=_int(i["Block size (tokens)"]),
        max_num_batched_tokens=_int(i["max_num_batched_tokens"]), max_num_seqs=_int(i["max_num_seqs"]),
        cuda_graph_bytes=_int(i["CUDA graphs (MiB)"]) * MIB,
        non_torch_bytes=_int(i["Non-torch memory (MiB)"]) * MIB,
        cuda_graphs_in_budget=bool(i["CUDA graphs taken from the budget (vLLM ≥ 0.21)"]))
    return {"KV blocks available": f"{cap.num_blocks:,}"}


def expect_training(i: dict[str, Any], unit: str, page: Page) -> Expect:
    attn = _reverse(TRAIN_ATTENTION_LABELS, i["Attention implementations"][0])
    m = training_step(
        MODELS[i["Model"]], _int(i["Batch size"]), _int(i["exact"]), attention=attn,
        precision=i["Precision"].split(":")[0], checkpointing=bool(i["Activation checkpointing (every layer)"]),
        optimizer=i["Optimizer"], gpus=_int(i["GPUs N (= tensor parallel × data parallel)"]),
        tp=_int(i["Tensor-parallel degree t"]),
        sharding=_reverse(SHARDING_LABELS, i["Sharding over data-parallel replicas"]))
    return {f"{TRAIN_ATTENTION_LABELS[attn]}: peak": format_bytes(m.peak_bytes, unit)}


def expect_scaling(i: dict[str, Any], unit: str, page: Page) -> Expect:
    heading = page.get_by_text("On one ").first.inner_text()  # "On one <largest selected GPU> ..."
    gpu = next(g for g in sorted(GPUS, key=len, reverse=True) if f"On one {g}" in heading)
    metrics = page.evaluate(_READ_METRICS)
    label = next(k for k in metrics if k.endswith(": longest s"))
    impl = _reverse(IMPL_LABELS, label.removesuffix(": longest s"))
    n = max_seq_len(impl, GPUS[gpu], _int(i["Batch B"]), _int(i["Heads H"]), _int(i["Head dim d"]),
                    i["dtype"], bool(i["Causal mask"]), bool(i["Forward + backward"]))
    return {label: f"{n:,}"}


def expect_flash(i: dict[str, Any], unit: str, page: Page) -> Expect:
    io = standard_io(_int(i["batch B"]), _int(i["heads H"]), _int(i["sequence s"]),
                     _int(i["head dim d"]), dtype_bytes(i["dtype"]))
    return {f"Standard attention moves ({unit})": format_bytes(io.total_bytes, unit)}


def expect_many(i: dict[str, Any], unit: str, page: Page) -> Expect:
    model, world = MODELS[i["Model"]], _int(i["GPUs in the ring (c)"])
    s = _int(i["exact"])
    s -= s % (2 * world if world > 1 else 1)  # the page's zigzag rounding (it says so)
    heads, kv, d = ((model.num_heads, model.num_kv_heads, model.head_dim)
                    if i["Attention shape"] == "model" else (32, 32, 128))
    mem = context_parallel_memory(_reverse(CP_IMPL_LABELS, i["Ring"]), 1, heads, s, d, i["dtype"], True,
                                  i["Pass"] == "fwd+bwd", world, kv)
    return {"Per GPU: one attention call": format_bytes(mem.total_bytes, unit)}


def _verdict_names(page: Page, gpu: str) -> None:
    alerts = " ".join(page.locator('[data-testid="stAlert"]').all_inner_texts())
    assert f"one {gpu}" in alerts, f"the verdict is not about the GPU shown ({gpu}): {alerts[:300]}"


def expect_fit(i: dict[str, Any], unit: str, page: Page) -> Expect:
    """Will it fit?: the peak of attnmem.calc.inference_step or attnmem.calc.training_step (serving is not
    reached here: every try starts a fresh session, whose task is the default, inference)."""
    model, gpu, s = MODELS[i["Model"]], _gpu(i["GPU"]), _int(i["exact"])
    task = _reverse(TASK_LABELS, i["Task"])
    _verdict_names(page, gpu)
    if task == "inference":
        peak = inference_step(model, _int(i["Batch (sequences)"]), s, _int(i["New tokens"]),
                              attention="sdpa",
                              weight_dtype=i["Weights dtype / quantization"]).peak_bytes
    elif task == "training":
        peak = training_step(model, _int(i["Batch (sequences per step)"]), s,
                             attention="sdpa_flash").peak_bytes
    else:
        raise AssertionError(f"the oracle covers inference and training, the page shows {task}")
    return {"Peak": format_bytes(peak, unit)}


def expect_inference(i: dict[str, Any], unit: str, page: Page) -> Expect:
    attn = _reverse(INFER_ATTENTION_LABELS, i["Attention"])
    _verdict_names(page, _gpu(i["GPU"]))
    m = inference_step(MODELS[i["Model"]], _int(i["Batch size"]), _int(i["exact"]),
                       _int(i["New tokens"]), attention=attn,
                       weight_dtype=i["Weights dtype / quantization"], kv_dtype=i["KV cache dtype"],
                       cache=i["Cache"],
                       prefill_chunk=_int(i["Prefill chunk (tokens; 0 = the whole prompt in one forward)"]) or None)
    return {f"{INFER_ATTENTION_LABELS[attn]}: peak": format_bytes(m.peak_bytes, unit)}


def expect_kernel(i: dict[str, Any], unit: str, page: Page) -> Expect:
    """Kernel speed (measured): our default's TFLOP/s at the longest s it ran, read from the
    bundled CSV the page names as its source, filtered by the choices on screen."""
    code = page.locator('[data-testid="stCaptionContainer"] code').all_inner_texts()
    source = next(t for t in code if t.endswith(".csv"))
    mode = "fwd_bwd" if i["pass"] == "fwd+bwd" else "fwd"
    kv = int(i["key/value heads"].split(" ")[0])
    ours = [r for r in read_rows(str(ROOT / source)) if r.impl == OURS and r.status == "ok"
            and r.dtype == i["dtype"] and r.head_dim == _int(i["head dim d"]) and r.mode == mode
            and r.causal == bool(i["Causal mask"]) and r.kv_heads == kv]
    top = max(r.seq_len for r in ours)
    at_top = [r.tflops for r in ours if r.seq_len == top]
    return {f"default at s = {top:,} (measured)": f"{sum(at_top) / len(at_top):.0f} TFLOP/s"}


def expect_measure(i: dict[str, Any], unit: str, page: Page) -> Expect:
    """GPU measurement (no GPU here): the bundled H200 rows for the choices on screen."""
    import pandas as pd

    assert i["Results to show"].startswith("Bundled reference"), i["Results to show"]
    df = pd.read_csv(ROOT / "data" / "attention_calls_h200.csv")
    impls = {_reverse(SERIES_LABELS, x) if x in SERIES_LABELS.values() else x
             for x in i["Implementations"]}
    h, hkv = _int(i["Heads H"]), _int(i["KV heads (0 = H)"])
    kv = hkv if hkv and hkv != h and h % hkv == 0 else h
    backward = {"fwd": (False,), "fwd+bwd": (True,), "both": (False, True)}[i["Pass"]]
    sel = df[df["impl"].isin(impls) & (df["batch"] == _int(i["Batch B"])) & (df["heads"] == h)
             & (df["kv_heads"].fillna(df["heads"]) == kv) & (df["head_dim"] == _int(i["Head dim d"]))
             & (df["dtype"] == i["dtype"]) & (df["causal"] == bool(i["Causal mask"]))
             & df["backward"].isin(backward)]
    measured = sel[(sel["status"] == "ok") & sel["peak_extra_bytes"].notna()]
    return {"points shown": f"{len(sel):,}", "measured peaks": f"{len(measured):,}"}


# target: (sidebar title, url path, oracle, the input changed right after arriving, values):
# a number box's label and two numbers, or "radio:" and a radio's label and two of its options.
TARGETS: dict[str, tuple[str, str, Callable[..., Expect], str, tuple[int | str, int | str]]] = {
    "fit": ("Will it fit?", "", expect_fit, "Batch (sequences)", (2, 3)),
    "score": ("Score matrix", "score_matrix", expect_score, "Attention heads H", (16, 48)),
    "model": ("Model memory", "model_memory", expect_model, "Batch size", (2, 3)),
    "inference": ("Inference", "inference", expect_inference, "Batch size", (3, 5)),
    "serving": ("Serving", "serving", expect_serving, "max_num_seqs", (64, 128)),
    "training": ("Training step", "training", expect_training, "Batch size", (2, 3)),
    "scaling": ("Scaling", "scaling", expect_scaling, "Heads H", (16, 48)),
    "flash": ("How FlashAttention works", "flash_explainer", expect_flash, "heads H", (16, 48)),
    "many": ("Many GPUs", "many_gpus", expect_many, "GPUs in the ring (c)", (4, 2)),
    "kernel": ("Kernel speed", "kernel_speed", expect_kernel, "radio:head dim d", ("64", "128")),
    "measure": ("GPU measurement", "measure", expect_measure, "KV heads (0 = H)", (8, 8)),
}
# Where the user comes from, with values that differ from every page's defaults (a stale
# value that leaked across would show), for the inputs pages share by name (b, s, gpu, ...).
SOURCES = {
    "fit": "/?model=Qwen2.5%207B&gpu=NVIDIA%20A100%2040GB&task=training&b=2&s=2048",
    "score": "/score_matrix?b=2&h=8&s=1024&dtype=fp32",
    "model": "/model_memory?gpu=NVIDIA%20T4%2016GB&adtype=fp32&s=1&b=2",
    "inference": "/inference?gpu=NVIDIA%20L4%2024GB&b=2&s=1024&new=32&attn=eager&cache=static",
    "serving": "/serving?gpu=NVIDIA%20A100%2040GB&s=4096&seqs=32",
    "training": "/training?b=2&s=2048&gpu=NVIDIA%20H200%20141GB",
    "scaling": "/scaling?b=4&h=16&d=64&dtype=bf16",
    "flash": "/flash_explainer?b=2&h=8&s=2048&d=64&dtype=fp32",
    "many": "/many_gpus?c=2&s=65536&gpu=NVIDIA%20B200%20180GB&dtype=fp16",
    "kernel": "/kernel_speed?kdtype=fp16&kd=64",
    "measure": "/measure?b=2&h=16&dtype=bf16",
}
# each target is reached from two other pages (the one before it and the one after it)
ORDER = list(SOURCES)


SETTLE_GAP_S = 0.7  # a run started by the last step shows its 'running' indicator by then
QUIET_MS = 500  # and no change to the page for this long (settle_times.WATCH_JS records them)
_IDLE_JS = """(quiet) => !document.querySelector('[data-testid="stStatusWidget"]')
                     && performance.now() - window.__settle.last >= quiet"""


def _settle_round(page: Page, since: float) -> float:
    """SETTLE_GAP_S after `since` (time.monotonic(): a click, an edit, the previous round),
    wait until no 'running' indicator is shown and nothing on the page has changed for
    QUIET_MS (the page's context carries settle_times.WATCH_JS); the moment that held. A
    page has settled after two rounds (a page switch can run twice: the new page, then its
    URL write) with its numbers drawn. Without the quiet period, a check on a loaded machine
    read GPU measurement half drawn (its multiselect not yet there) with no indicator shown."""
    page.wait_for_timeout(max(0.0, SETTLE_GAP_S - (time.monotonic() - since)) * 1000)
    page.wait_for_function(_IDLE_JS, arg=QUIET_MS, timeout=TIMEOUT_MS)
    return time.monotonic()


def _mismatches(page: Page, target: str, unit: str = "GB") -> list[str]:
    """What the page shows against calc on the inputs on screen; [] when they agree."""
    _, _, oracle, _, _ = TARGETS[target]
    inputs = page.evaluate(_READ_INPUTS)
    try:
        want = oracle(inputs, unit, page)
    except AssertionError as err:
        return [str(err)]
    except (KeyError, StopIteration, IndexError) as err:
        return [f"{target}: an input or number is missing from the page ({err!r}); inputs {inputs}"]
    shown = page.evaluate(_READ_METRICS)
    return [f"{target}: {label} shows {shown.get(label)!r}, calc on the inputs on screen gives "
            f"{value!r} (inputs {inputs})" for label, value in want.items() if shown.get(label) != value]


@dataclass
class _Race:
    """One try in progress: open `source` fresh, click `target` NAV_AFTER_S after the load
    started, check; edit, check. Its steps, in order, are the methods named in STEPS; each
    settle is split into its two rounds (_settle_round), each SETTLE_GAP_S after the try's
    own previous step (as one try alone waited them), so tries stepped through in turn wait
    for their gaps together."""

    source: str
    target: str
    edit: int | str
    context: Any = None
    page: Any = None
    start: float = 0.0
    last: float = 0.0  # when the previous step ended (time.monotonic())
    found: dict[str, list[str]] = field(default_factory=lambda: {"navigation": [], "edit": []})
    error: BaseException | None = None

    def open_source(self, browser: Any, url: str) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.context.add_init_script(settle_times.WATCH_JS)
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.start = time.monotonic()
        # "commit": back as soon as the load has begun, so the next try's load begins too;
        # the click below waits for the sidebar's link itself
        self.page.goto(url + SOURCES[self.source], wait_until="commit")

    def click_target(self) -> None:
        self.page.wait_for_timeout(max(0.0, NAV_AFTER_S - (time.monotonic() - self.start)) * 1000)
        title = TARGETS[self.target][0]
        self.page.locator('[data-testid="stSidebarNav"]').get_by_text(title, exact=True).click()
        self.last = time.monotonic()

    def arrived(self) -> None:  # the target's page, its numbers drawn, first round
        path = TARGETS[self.target][1]
        self.page.wait_for_url(lambda u: urlsplit(u).path == f"/{path}", timeout=TIMEOUT_MS)
        self.page.wait_for_selector('[data-testid="stMetricValue"]', timeout=TIMEOUT_MS)
        self.last = _settle_round(self.page, self.last)

    def check_then_edit(self) -> None:  # second round, the check, the edit
        page, box = self.page, TARGETS[self.target][3]
        _settle_round(page, self.last)
        self.found["navigation"] = _mismatches(page, self.target)
        if box.startswith("radio:"):
            radio = page.locator('[data-testid="stRadio"]').filter(
                has=page.get_by_text(box.removeprefix("radio:"), exact=True))
            radio.get_by_text(str(self.edit), exact=True).first.click()
        else:
            box_input = page.get_by_label(box, exact=True).first
            box_input.fill(str(self.edit))
            box_input.press("Enter")
        self.last = time.monotonic()

    def edited(self) -> None:  # the numbers drawn, first round after the edit
        self.page.wait_for_selector('[data-testid="stMetricValue"]', timeout=TIMEOUT_MS)
        self.last = _settle_round(self.page, self.last)

    def check_after_edit(self) -> None:  # second round, the check
        _settle_round(self.page, self.last)
        self.found["edit"] = _mismatches(self.page, self.target)
        if self.page.locator('[data-testid="stException"]').count():
            self.found["edit"].append(f"{self.target}: an exception box is shown")


STEPS = ("click_target", "arrived", "check_then_edit", "edited", "check_after_edit")


def race_many(browser: Any, url: str, tries: list[tuple[str, str, int | str]]
              ) -> list[dict[str, list[str]] | BaseException]:
    """Several tries (source, target, edit) at once, each in a context of its own (a session
    of its own on the server): every try's source is opened, then every try takes its next
    step (_Race, STEPS) in turn: its click NAV_AFTER_S after its own load started, its
    checks each after its own settle. Only this process steps through them one at a time;
    the browser and the server run all of them meanwhile, and a try mostly waits (for its
    click, for its runs to end), so N tries take about the time of one, not N. Each try gets
    its mismatches ({"navigation": [...], "edit": [...]}) or the exception that stopped it."""
    races = [_Race(source, target, edit) for source, target, edit in tries]
    try:
        for race in races:
            try:
                race.open_source(browser, url)
            except Exception as err:  # noqa: BLE001  (reported by the try's own test)
                race.error = err
        for step in STEPS:
            for race in races:
                if race.error is None:
                    try:
                        getattr(race, step)()
                    except Exception as err:  # noqa: BLE001  (reported by the try's own test)
                        race.error = err
    finally:
        for race in races:
            if race.context is not None:
                race.context.close()
    return [race.error if race.error is not None else race.found for race in races]


def race_once(browser: Any, url: str, source: str, target: str, edit: int | str) -> dict[str, list[str]]:
    """One try: open `source` fresh, click `target` after NAV_AFTER_S, check; edit, check."""
    (found,) = race_many(browser, url, [(source, target, edit)])
    if isinstance(found, BaseException):
        raise found
    return found


def _pairs() -> list[tuple[str, str]]:
    """(source, target): every page a target once, reached from the page after it, so every
    page is a source once too; the sources alternate in parity, so both edit values are used."""
    return [(ORDER[(ORDER.index(target) + 1) % len(ORDER)], target) for target in TARGETS]


@contextlib.contextmanager
def _browser() -> Iterator[tuple[Any, str]]:
    with load_test.app_server(None) as (url, _pid), sync_playwright() as p:
        exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
        browser = p.chromium.launch(executable_path=exe, args=LAUNCH_ARGS)
        try:
            yield browser, url
        finally:
            browser.close()


@pytest.fixture(scope="module")
def app_browser() -> Iterator[tuple[Any, str]]:
    if (reason := _skip_reason()) is not None:
        pytest.skip(f"browser test skipped: {reason}")
    try:
        with _browser() as pair:
            yield pair
    except RuntimeError as err:  # the server did not start: a failure, not an error
        pytest.fail(str(err))


def _edit(source: str, target: str) -> int | str:
    return TARGETS[target][4][ORDER.index(source) % 2]


#: Tries run at once in the suite (race_many). Each holds a Chromium context and a server
#: session; on the 2-core machine 4 at a time took about as long as one.
RACES_AT_ONCE = 4


@pytest.fixture(scope="module")
def race_results(app_browser: tuple[Any, str]) -> dict[tuple[str, str], dict[str, list[str]] | BaseException]:
    """Every (source, target) of _pairs() raced, RACES_AT_ONCE at a time."""
    browser, url = app_browser
    pairs = _pairs()
    results: dict[tuple[str, str], dict[str, list[str]] | BaseException] = {}
    for at in range(0, len(pairs), RACES_AT_ONCE):
        batch = pairs[at:at + RACES_AT_ONCE]
        found = race_many(browser, url, [(s, t, _edit(s, t)) for s, t in batch])
        results.update(zip(batch, found, strict=True))
    return results


@pytest.mark.parametrize("source,target", _pairs())
def test_navigating_mid_run_then_editing_shows_numbers_of_the_inputs_on_screen(
        race_results: dict[tuple[str, str], Any], source: str, target: str) -> None:
    found = race_results[(source, target)]
    if isinstance(found, BaseException):
        raise found
    assert not found["navigation"], found["navigation"]
    assert not found["edit"], found["edit"]


def main(argv: list[str]) -> int:
    """Reproduction rate: every (source, target) pair `--tries` times; prints each failure."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tries", type=int, default=10, help="tries per target page (default 10)")
    parser.add_argument("--targets", nargs="*", default=list(TARGETS), choices=list(TARGETS),
                        help="pages to navigate to (default: all)")
    args = parser.parse_args(argv)
    if (reason := _skip_reason()) is not None:
        print(reason)
        return 2
    bad = total = 0
    with _browser() as (browser, url):
        for target in args.targets:
            at = ORDER.index(target)
            sources = [ORDER[at - 1], ORDER[(at + 1) % len(ORDER)]]
            fails = 0
            for k in range(args.tries):
                source = sources[k % 2]
                found = race_once(browser, url, source, target, TARGETS[target][4][k % 2])
                problems = found["navigation"] + found["edit"]
                fails += bool(problems)
                for p in problems:
                    print(f"  {source} -> {target}: {p[:400]}")
            print(f"{target}: {fails} of {args.tries} tries showed numbers that disagree with the inputs",
                  flush=True)
            bad, total = bad + fails, total + args.tries
    print(f"all: {bad} of {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
