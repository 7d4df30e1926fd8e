"""Measure one page's exact inputs on this machine's GPU ("Measure on this GPU" on the
Inference and Training step pages; issue 45, item 4).

The page hands its inputs over; this module turns them into one configuration of the bundled
whole-model harness, runs that harness in a child process and reads its row back:

- ``infer_request`` / ``train_request``: the page's inputs as a ``Request`` (the harness's
  model name, found by shape, and its command-line arguments), or the reason in words why the
  harness cannot measure them (a value it does not run, several GPUs, a model it has no
  config for). The arguments are checked by the harness's own parser and configuration rules
  (``attnmem.measure.infer.cli`` / ``attnmem.measure.train.cli``: ``build_parser``,
  ``configs_from_args``), which must give exactly one configuration, so that a lever the
  training harness does not take yet is refused by name instead of measured without it.
- ``start(request)``: ``python -m attnmem.measure --infer|--train ... --out <csv>`` in its own
  process group; the returned ``Job`` reports progress (``poll``: the phase, rows done, the
  elapsed time against ``estimate``), can be cancelled (``cancel``: SIGINT first, so that the
  harness kills its worker and releases the GPU lock itself; then SIGKILL to the child's
  process group and to every descendant found before, among them the worker, which runs in
  a session of its own), and on completion (``outcome``) keeps the row in the results store
  (``InferStore`` / ``TrainStore``: tables of the SQLite file of ``attnmem.measure.store``)
  and returns it with the measured peak and its parts beside the prediction
  (``comparison``).
- ``estimate``: the run's time from the bundled H200 rows' measured ``wall_s`` (the nearest
  row of the same model, scaled by tokens and layers) plus an assumed start-up; it says which
  row it came from. The harness has no estimate of its own.
- ``nearest_rows``: where there is no GPU, the bundled rows nearest to the inputs (same model
  first, then the nearest length and batch, then the same attention and settings).
- ``page_runs`` / ``run_csv``: the runs the pages kept, and one run as a CSV to download.

No torch at import time; ``gpu_reason`` imports it only where a GPU device node exists.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = {"infer": REPO_ROOT / "data" / "inference_steps_h200.csv",
        "train": REPO_ROOT / "data" / "training_steps_h200.csv"}
#: The label of every run a page keeps in the store ("page: Inference ..."), which page_runs
#: lists (the command line's runs are labelled by their user).
LABEL_PREFIX = {"infer": "page: Inference", "train": "page: Training step"}
#: Seconds the estimate adds for starting the harness: Python, torch, transformers, CUDA's
#: context and the cuBLAS workspaces. Assumed, not measured: the bundled rows' wall_s start
#: after it (a row's time is its configuration's, in a child already running).
STARTUP_S = 20.0
#: Seconds between SIGINT (the harness cleans up: its worker killed, the GPU lock released,
#: exit 130) and SIGKILL of whatever is left.
CANCEL_GRACE_S = 5.0
#: The harness's per-configuration time limit the pages use (the command line's --timeout).
TIMEOUT_S = 600.0
_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\s")
#: ModelConfig fields that name or describe a config without changing its memory (the same
#: list as attnmem/pages/ui/inference.py's shape_key, which the measurement room cannot import).
_NOT_SHAPE = ("name", "source", "read_as", "defaults_from", "max_position_embeddings",
              "torch_dtype")


# --------------------------------------------------------------------------------------------
# Is there a GPU here?
# --------------------------------------------------------------------------------------------


def _device_nodes() -> list[str]:
    """Signs of a GPU driver on this machine: NVIDIA's device nodes (/dev/nvidia0..,
    /dev/nvidiactl) or /proc/driver/nvidia, AMD's /dev/kfd, WSL's /dev/dxg."""
    try:
        names = os.listdir("/dev")
    except OSError:
        names = []
    found = [n for n in names if re.fullmatch(r"nvidia(\d+|ctl)|kfd|dxg", n)]
    return found + (["/proc/driver/nvidia"] if os.path.isdir("/proc/driver/nvidia") else [])


def gpu_reason() -> str | None:
    """None when torch sees a CUDA GPU here, else why not, in words. Cheap where there is no
    GPU: torch is imported (seconds) only when it is installed and a GPU device node exists;
    then torch.cuda.is_available() decides (attnmem.measure.registry.gpu_reason)."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed, so nothing can run on a GPU here"
    if not _device_nodes():
        return ("no GPU on this machine (no NVIDIA, AMD or WSL GPU device), so "
                "torch.cuda.is_available() is False")
    return _torch_reason()


@lru_cache(maxsize=1)
def _torch_reason() -> str | None:
    """torch's answer (attnmem.measure.registry.gpu_reason), once per process: the import
    costs seconds and the answer does not change while the app runs."""
    from attnmem.measure.registry import gpu_reason as torch_reason

    return torch_reason()


# --------------------------------------------------------------------------------------------
# The page's inputs as one harness configuration.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One harness configuration: which harness (``kind``: infer or train), the harness's model
    name, the command-line arguments after ``--infer`` / ``--train`` (without --out), a label
    and what the estimate reads (``tokens``: batch x length, ``layers``, ``attention``)."""

    kind: str
    model: str
    args: tuple[str, ...]
    label: str
    tokens: int
    layers: int
    attention: str


def _shape_key(model: Any) -> tuple:
    return tuple(sorted((f.name, repr(getattr(model, f.name)))
                        for f in dataclasses.fields(model) if f.name not in _NOT_SHAPE))


@lru_cache(maxsize=512)
def _harness_shape(kind: str, name: str, layers: int) -> tuple | None:
    """The shape key of a harness model built at ``layers`` layers (None where calc cannot
    read it)."""
    from attnmem.calc import ModelConfig

    models = _models(kind)
    try:
        cfg = models.hf_config(name, layers=layers)
        return _shape_key(ModelConfig.from_hf_config(cfg, name=name, with_transformers=False))
    except (ValueError, OSError, TypeError, KeyError):
        return None


def _models(kind: str) -> Any:
    if kind == "infer":
        from attnmem.measure import infer_models

        return infer_models
    from attnmem.measure import train_models

    return train_models


def harness_models(kind: str, model: Any) -> list[str]:
    """The harness's model names (attnmem.measure.infer_models / train_models) whose config,
    built at the page model's layer count, has the page model's shape (calc's ModelConfig,
    every field but its name and provenance): the first is what a run builds (``--layers``
    set to the page's count); all of them are "the same model" for the bundled rows."""
    key = _shape_key(model)
    layers = int(model.num_layers)
    return [n for n in _models(kind).NAMES if _harness_shape(kind, n, layers) == key]


def _no_model(kind: str, model: Any) -> str:
    names = [n for n in _models(kind).NAMES if not n.startswith("tiny")]
    return (f"the harness builds only the models it has a config for, and none has the shape "
            f"of {model.name} ({model.num_layers} layers, hidden {model.hidden_size:,}, "
            f"{model.num_heads}/{model.num_kv_heads} heads): {', '.join(names)} (any layer "
            "count); pick one of these on the page, or a preset with its widths")


def _checked(kind: str, args: list[str]) -> str | None:
    """None when the harness's own parser and rules make exactly one configuration of
    ``args``; else why not, in the harness's words."""
    if kind == "infer":
        from attnmem.measure.infer import cli
    else:
        from attnmem.measure.train import cli  # type: ignore[no-redef]
    parser = cli.build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parsed, unknown = parser.parse_known_args(args)
    except SystemExit:
        return f"the harness's command line refuses these inputs: {err.getvalue().strip()[-300:]}"
    if unknown:
        return (f"the bundled {'inference' if kind == 'infer' else 'training'} harness does not "
                f"take {' '.join(a for a in unknown if a.startswith('--'))} yet, so it cannot "
                "measure these inputs")
    try:
        configs = cli.configs_from_args(parsed)
    except SystemExit as exc:
        return f"the harness refuses these inputs: {str(exc.code).removeprefix('error: ')}"
    if len(configs) != 1:
        return f"the harness made {len(configs)} configurations of these inputs, not one"
    return None


def infer_request(model: Any, *, batch: int, prompt_len: int, new_tokens: int, attention: str,
                  cache: str, prefill_chunk: int | None, weight_dtype: str = "bf16",
                  kv_dtype: str = "bf16") -> Request | str:
    """The Inference page's inputs as one configuration of ``python -m attnmem.measure
    --infer``, or why the harness cannot measure them (a string naming the value)."""
    if weight_dtype != "bf16" or kv_dtype != "bf16":
        return (f"the harness runs bf16 weights and a bf16 KV cache (random weights, no "
                f"quantization); these inputs ask for {weight_dtype} weights and a {kv_dtype} "
                "cache: set both to bf16 to measure")
    names = harness_models("infer", model)
    if not names:
        return _no_model("infer", model)
    args = ["--model", names[0], "--layers", str(model.num_layers), "--batch", str(batch),
            "--prompt-len", str(prompt_len), "--new-tokens", str(new_tokens),
            "--attention", attention, "--cache", cache,
            "--prefill-chunk", str(prefill_chunk) if prefill_chunk else "none"]
    bad = _checked("infer", args)
    if bad:
        return bad
    label = (f"{names[0]} L={model.num_layers} {attention} {cache} B={batch} prompt={prompt_len} "
             f"new={new_tokens}" + (f" chunk={prefill_chunk}" if prefill_chunk else ""))
    return Request("infer", names[0], tuple(args), label, batch * (prompt_len + new_tokens),
                   int(model.num_layers), attention)


def train_request(model: Any, *, batch: int, seq_len: int, attention: str, precision: str,
                  checkpointing: bool, method: str = "full", rank: int = 16,
                  targets: str = "all-linear", adapter_dtype: str = "fp32",
                  double_quant: bool = False, optimizer: str = "adamw", kbit: bool = False,
                  liger: bool = False, offload: bool = False, padding_free: bool = False,
                  gpus: int = 1, tp: int = 1, sharding: str = "none", ep: int = 1
                  ) -> Request | str:
    """The Training step page's inputs as one configuration of ``python -m attnmem.measure
    --train``, or why the harness cannot measure them. ``method``: full, lora or qlora (the
    page's); a padding-free row is the batch's sequences packed into one row (``--packed``)."""
    if (gpus, tp, ep) != (1, 1, 1) or sharding != "none":
        return (f"the harness measures a step on one GPU; these inputs ask for {gpus} GPU(s), "
                f"tensor parallel {tp}, sharding {sharding}, expert parallel {ep} (sharded "
                "steps: python -m attnmem.measure.train_dist on a machine with several GPUs)")
    names = harness_models("train", model)
    if not names:
        return _no_model("train", model)
    args = ["--model", names[0], "--layers", str(model.num_layers), "--attention", attention,
            "--precision", precision, "--checkpointing", "on" if checkpointing else "off"]
    if padding_free:
        args += ["--batch", "1", "--packed", "+".join([str(seq_len)] * batch)]
    else:
        args += ["--batch", str(batch), "--seq-len", str(seq_len)]
    if method in ("lora", "qlora"):
        base = "bf16" if method == "lora" else ("nf4_dq" if double_quant else "nf4")
        args += ["--adapter", "lora", "--rank", str(rank), "--targets", targets,
                 "--adapter-dtype", adapter_dtype, "--base-dtype", base]
    elif method != "full":
        return f"unknown training method {method!r}; the harness measures full, lora, qlora"
    # The recipe levers go on the command line only when they are on, so that a harness that
    # does not take them yet still measures the plain step (and refuses a lever by name).
    if optimizer != "adamw":
        args += ["--optimizer", optimizer]
    for on, flag in ((kbit, "--kbit-prepare"), (liger, "--liger"),
                     (offload, "--offload-activations")):
        if on:
            args += [flag, "on"]
    bad = _checked("train", args)
    if bad:
        return bad
    levers = [w for on, w in ((optimizer != "adamw", optimizer), (kbit, "kbit-prepare"),
                              (liger, "liger"), (offload, "offload"),
                              (padding_free, "padding-free")) if on]
    label = (f"{names[0]} L={model.num_layers} {method} {attention} {precision} "
             f"{'ckpt' if checkpointing else 'no-ckpt'} B={batch} s={seq_len}"
             + (f" {' '.join(levers)}" if levers else ""))
    return Request("train", names[0], tuple(args), label, batch * seq_len,
                   int(model.num_layers), attention)


# --------------------------------------------------------------------------------------------
# The time estimate.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """A run's expected seconds and where the figure comes from (``source``, in words)."""

    seconds: float
    source: str


def _row_tokens(kind: str, r: Mapping[str, Any]) -> int:
    b = int(r.get("batch") or 1)
    if kind == "infer":
        return b * (int(r.get("prompt_len") or 1) + int(r.get("new_tokens") or 0))
    return b * int(r.get("seq_len") or 1)


@lru_cache(maxsize=2)
def bundled_rows(kind: str) -> tuple[dict[str, Any], ...]:
    """The bundled H200 rows of one harness, typed by its reader (empty when absent)."""
    path = DATA[kind]
    if not path.exists():
        return ()
    if kind == "infer":
        from attnmem.measure.infer.store import read_rows
    else:
        from attnmem.measure.train.store import read_rows  # type: ignore[no-redef]
    return tuple(read_rows(path))


def estimate(request: Request, rows: Iterable[Mapping[str, Any]] | None = None) -> Estimate:
    """The run's seconds: STARTUP_S (assumed) plus the measured wall_s of the nearest bundled
    row (status ok; the same model first, then the same attention, then the nearest tokens),
    scaled by tokens and layers (a step's work grows with both; attention's own cost grows
    faster, so long contexts run longer than this). Without such a row: STARTUP_S alone."""
    kind = request.kind
    names = set(harness_models_cached(kind, request.model))
    cands = [r for r in (bundled_rows(kind) if rows is None else rows)
             if r.get("status") == "ok" and r.get("wall_s")]
    if not cands:
        return Estimate(STARTUP_S, f"no bundled row to go by: {STARTUP_S:.0f} s assumed for "
                                   "the start-up alone")

    def rank(r: Mapping[str, Any]) -> tuple:
        return (r.get("model") not in names, r.get("attention") != request.attention,
                abs(math.log(_row_tokens(kind, r) / max(1, request.tokens))))

    best = min(cands, key=rank)
    scale = (request.tokens / _row_tokens(kind, best)) * \
        (request.layers / max(1, int(best.get("layers") or request.layers)))
    run_s = float(best["wall_s"]) * scale
    length = "prompt" if kind == "infer" else "s"
    length_v = best.get("prompt_len") if kind == "infer" else best.get("seq_len")
    return Estimate(STARTUP_S + run_s, (
        f"from the bundled H200 row of {best.get('model')} ({best.get('layers')} layers, "
        f"{best.get('attention')}, B={best.get('batch')}, {length}={length_v}): "
        f"{float(best['wall_s']):.1f} s measured, x{scale:.2g} for tokens and layers, plus "
        f"{STARTUP_S:.0f} s assumed for starting Python, torch and CUDA; another GPU, the "
        "model's build and long contexts change it"))


def harness_models_cached(kind: str, name: str) -> tuple[str, ...]:
    """The harness names whose config is the same as ``name``'s at its own layer count
    (llama3-8b-2l and llama3-8b-4l are one model for the estimate and nearest_rows)."""
    return _same_as(kind, name)


@lru_cache(maxsize=256)
def _same_as(kind: str, name: str) -> tuple[str, ...]:
    mods = _models(kind)
    try:
        base = mods.hf_config(name)
    except (ValueError, OSError, KeyError):
        return (name,)
    layers = base.get("num_hidden_layers")
    if layers is None:
        return (name,)
    own = _harness_shape(kind, name, int(layers))
    return tuple(n for n in mods.NAMES if n == name
                 or (own is not None and _harness_shape(kind, n, int(layers)) == own))


# --------------------------------------------------------------------------------------------
# The nearest bundled rows (no GPU).
# --------------------------------------------------------------------------------------------


def nearest_rows(df: Any, *, names: Sequence[str], length_col: str, length: int, batch: int,
                 attention: str | None = None, also: Mapping[str, Any] | None = None,
                 n: int = 8) -> Any:
    """The ``n`` rows of a DataFrame of measured rows (a ``model`` column, ``length_col``,
    ``batch``, ``attention``) nearest to the inputs: the same model (``names``) first, then
    the nearest length, then the nearest batch (by ratio: 4k is as far from 8k as 8k from
    16k), then the same attention, then the fewest other differences among ``also`` (column:
    value, e.g. the precision and checkpointing). Rows keep their columns, predictions and
    errors included."""
    if df is None or len(df) == 0:
        return df
    same = ~df["model"].isin(list(names))
    other_attn = (df["attention"] != attention) if attention is not None else same & False
    others = sum(((df[c] != v).astype(int) for c, v in (also or {}).items() if c in df),
                 start=same.astype(int) * 0)
    far_len = (df[length_col].astype(float).clip(lower=1) / max(1, length)).map(
        lambda x: abs(math.log(x)))
    far_b = (df["batch"].astype(float).clip(lower=1) / max(1, batch)).map(
        lambda x: abs(math.log(x)))
    order = sorted(range(len(df)), key=lambda i: (bool(same.iloc[i]), far_len.iloc[i],
                                                  far_b.iloc[i], bool(other_attn.iloc[i]),
                                                  int(others.iloc[i])))
    return df.iloc[order[:n]]


# --------------------------------------------------------------------------------------------
# The run: a child process, its progress, its cancel, its row.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """Where a run is: ``phase`` in words, rows done of ``rows_total``, seconds since the
    start, and ``fraction`` (rows done when it is over, else the elapsed time over the
    estimate, held below 1 while the child runs)."""

    phase: str
    rows_done: int
    rows_total: int
    elapsed_s: float
    fraction: float
    running: bool


@dataclass
class Outcome:
    """A finished run: ``status`` (the row's: ok, oom, unavailable, error, timeout, crashed,
    skipped; or 'cancelled', 'busy' (another measurement holds the GPU), 'failed' (no row)),
    ``message``, the row as the harness wrote it, the store's run id (None where it was not
    kept) and the measured parts beside the prediction (``comparison``)."""

    status: str
    message: str
    row: dict[str, Any] | None = None
    run_id: int | None = None
    store_error: str = ""
    parts: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux /proc; empty elsewhere)."""
    out: list[int] = []
    task = Path(f"/proc/{pid}/task")
    try:
        for t in task.iterdir():
            with contextlib.suppress(OSError, ValueError):
                out += [int(x) for x in (t / "children").read_text().split()]
    except OSError:
        return []
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), found through /proc."""
    seen: list[int] = []
    todo = [pid]
    while todo:
        for c in _children(todo.pop()):
            if c not in seen:
                seen.append(c)
                todo.append(c)
    return seen


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has ended: only its parent's wait is missing
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def default_command(kind: str) -> list[str]:
    """The harness's command line: this Python, ``-m attnmem.measure --infer|--train``."""
    return [sys.executable, "-m", "attnmem.measure", "--infer" if kind == "infer" else "--train"]


class Job:
    """One running measurement (``start`` makes it). Not thread-safe: one caller polls it."""

    def __init__(self, request: Request, *, command: Sequence[str] | None = None,
                 store_path: str | os.PathLike[str] | None = None,
                 env: Mapping[str, str] | None = None, timeout_s: float = TIMEOUT_S,
                 estimate_s: float | None = None) -> None:
        self.request = request
        self.estimate = Estimate(estimate_s, "given") if estimate_s is not None \
            else estimate(request)
        self.store_path = store_path
        self.dir = Path(tempfile.mkdtemp(prefix="attnmem-gpu-run-"))
        self.out = self.dir / "rows.csv"
        self.log_path = self.dir / "log.txt"
        cmd = [*(command or default_command(request.kind)), *request.args,
               "--out", str(self.out), "--timeout", f"{timeout_s:g}", "--lock-wait", "0"]
        child_env = dict(os.environ)
        child_env["PYTHONUNBUFFERED"] = "1"
        child_env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT)] + ([child_env["PYTHONPATH"]] if child_env.get("PYTHONPATH") else []))
        child_env.update(env or {})
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in _finish
        self.t0 = time.monotonic()
        # Its own session and process group: cancel signals the group, never the app's.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=str(REPO_ROOT), env=child_env,
                                     start_new_session=True)
        self.rows_done, self.rows_total = 0, 1
        self.worker_seen = False
        self.cancelled = False
        self._outcome: Outcome | None = None

    # -- progress ---------------------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def poll(self) -> Progress:
        """Where the run is now (reads the child's progress lines; finishes when it ended)."""
        for line in self.log_text().splitlines():
            m = _PROGRESS.match(line.strip())
            if m:
                self.rows_done, self.rows_total = int(m.group(1)), int(m.group(2))
        elapsed = time.monotonic() - self.t0
        if self.proc.poll() is None:
            if not self.worker_seen and descendants(self.proc.pid):
                self.worker_seen = True
            phase = ("measuring: the worker builds the model, warms up and runs the "
                     "configuration" if self.worker_seen else
                     "starting the harness (Python, torch, CUDA)")
            if self.rows_done:
                phase = f"measured {self.rows_done} of {self.rows_total}; finishing"
            frac = min(0.95, elapsed / max(1.0, self.estimate.seconds))
            return Progress(phase, self.rows_done, self.rows_total, elapsed, frac, True)
        out = self.outcome()
        return Progress(out.status, self.rows_done, self.rows_total, elapsed, 1.0, False)

    def done(self) -> bool:
        return self._outcome is not None or self.proc.poll() is not None

    def wait(self, timeout_s: float | None = None, poll_s: float = 0.2,
             on_progress: Callable[[Progress], None] | None = None) -> Outcome:
        """Poll until the run ends (``on_progress`` each time); past ``timeout_s`` cancel it."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            p = self.poll()
            if on_progress is not None:
                on_progress(p)
            if not p.running:
                return self.outcome()
            if end is not None and time.monotonic() > end:
                return self.cancel()
            time.sleep(poll_s)

    # -- cancel -----------------------------------------------------------------------------

    def cancel(self) -> Outcome:
        """Stop the run: SIGINT to the child's process group (the harness then kills its
        worker and releases the GPU lock), SIGKILL to the group and to every descendant still
        alive after CANCEL_GRACE_S. Rows finished before stay in the outcome and the store."""
        if self._outcome is not None:
            return self._outcome
        self.cancelled = True
        if self.proc.poll() is None:
            below = descendants(self.proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=CANCEL_GRACE_S)
            below += [p for p in descendants(self.proc.pid) if p not in below]
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            for pid in below:  # the worker runs in a session of its own
                if _alive(pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        return self.outcome()

    # -- the outcome ------------------------------------------------------------------------

    def outcome(self) -> Outcome:
        """The finished run's outcome (kept in the store once); the child must have ended."""
        if self._outcome is None:
            self._outcome = self._finish()
        return self._outcome

    def _finish(self) -> Outcome:
        code = self.proc.wait()
        wall = time.monotonic() - self.t0
        with contextlib.suppress(OSError):
            self._log.close()
        log = self.log_text()
        try:
            rows = _read_rows(self.request.kind, self.out) if self.out.exists() else []
        except (OSError, ValueError) as exc:
            rows, log = [], f"{log}\n(the rows could not be read: {exc})"
        shutil.rmtree(self.dir, ignore_errors=True)
        tail = " ".join(log.split())[-400:]
        if not rows:
            if self.cancelled:
                return Outcome("cancelled", "Cancelled before a row was measured: the child "
                               "process and its worker were stopped, the GPU lock released.",
                               wall_s=wall)
            if code == 2 and "busy" in log:
                return Outcome("busy", _error_line(log) or tail, wall_s=wall)
            return Outcome("failed", f"the harness ended (exit code {code}) without a row: "
                           f"{_error_line(log) or tail}", wall_s=wall)
        row = rows[-1]
        run_id, store_error = None, ""
        try:
            store = _store(self.request.kind, self.store_path)
            run_id = store.new_run(gpu=str(row.get("gpu") or ""),
                                   label=f"{LABEL_PREFIX[self.request.kind]}: "
                                         f"{self.request.label}")
            for r in rows:
                store.add_row(run_id, r)
        except Exception as exc:  # noqa: BLE001 - the row is still shown and downloadable
            store_error = f"{type(exc).__name__}: {exc}"
        status = str(row.get("status") or "error")
        return Outcome(status, str(row.get("message") or ""), row, run_id, store_error,
                       comparison(self.request.kind, row), wall)


def _error_line(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip().startswith("error:")]
    return lines[-1].removeprefix("error:").strip() if lines else ""


def start(request: Request, **kw: Any) -> Job:
    """Start measuring ``request`` in a child process (Job's keywords: ``command`` in place
    of the harness's, ``store_path``, ``env``, ``timeout_s``, ``estimate_s``)."""
    return Job(request, **kw)


# --------------------------------------------------------------------------------------------
# Rows: the store, the comparison, the CSV.
# --------------------------------------------------------------------------------------------


def _read_rows(kind: str, path: Path) -> list[dict[str, Any]]:
    if kind == "infer":
        from attnmem.measure.infer.store import read_rows
    else:
        from attnmem.measure.train.store import read_rows  # type: ignore[no-redef]
    return read_rows(path)


def _store(kind: str, path: str | os.PathLike[str] | None) -> Any:
    if kind == "infer":
        from attnmem.measure.infer.store import InferStore

        return InferStore(path)
    from attnmem.measure.train.store import TrainStore

    return TrainStore(path)


#: (part, measured column, predicted column or None) of each harness's row, the peak first.
PARTS = {
    "infer": (("peak", "peak_bytes", "predicted_peak_bytes"),
              ("prefill peak (1 new token)", "prefill_peak_bytes", "predicted_prefill_peak_bytes"),
              ("KV cache", "cache_bytes", "predicted_cache_bytes"),
              ("weights", "weights_bytes", None),
              ("before generate()", "before_bytes", None),
              ("reserved (allocator)", "reserved_bytes", None)),
    "train": (("peak", "peak_bytes", "predicted_peak_bytes"),
              ("before the step", "before_step_bytes", "predicted_before_bytes"),
              ("reserved (allocator)", "reserved_bytes", None)),
}


def comparison(kind: str, row: Mapping[str, Any],
               predicted: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """The measured peak and its parts beside the prediction: one dict per part (``part``,
    ``measured``, ``predicted``, ``error`` = (predicted - measured) / measured; None where a
    side is missing). The prediction is the row's (calc, or the meta-device trace, computed by
    the harness for exactly this configuration); ``predicted`` adds or replaces parts (the
    page's calc weights)."""
    out = []
    for part, mcol, pcol in PARTS[kind]:
        meas = row.get(mcol)
        pred = (predicted or {}).get(part, row.get(pcol) if pcol else None)
        err = (pred - meas) / meas if pred is not None and meas else None
        out.append({"part": part, "measured": meas, "predicted": pred, "error": err})
    return out


def page_runs(kind: str, store_path: str | os.PathLike[str] | None = None
              ) -> list[dict[str, Any]]:
    """The runs a page kept in the store (newest first): id, started, gpu, label, n (rows)."""
    return [r for r in _store(kind, store_path).runs()
            if str(r.get("label", "")).startswith(LABEL_PREFIX[kind])]


def rows_csv(kind: str, rows: Iterable[Mapping[str, Any]]) -> str:
    """Rows as one CSV in the harness's columns (formula-like text neutralised)."""
    from attnmem.measure import run_common

    columns = _store_columns(kind)
    buf = io.StringIO()
    w = run_common.csv_writer(buf)
    w.writerow(columns)
    for r in rows:
        run_common.write_cells(w, dict(r), columns)
    return buf.getvalue()


def _store_columns(kind: str) -> tuple[str, ...]:
    if kind == "infer":
        from attnmem.measure.infer.config import INFER_COLUMNS

        return INFER_COLUMNS
    from attnmem.measure.train.config import TRAIN_COLUMNS

    return TRAIN_COLUMNS


def run_csv(kind: str, run_ids: Iterable[int],
            store_path: str | os.PathLike[str] | None = None) -> str:
    """The rows of the given stored runs as one CSV in the harness's columns (formula-like
    text neutralised: attnmem.measure.run_common.write_cells)."""
    store = _store(kind, store_path)
    return rows_csv(kind, [r for rid in run_ids for r in store.rows(int(rid))])
