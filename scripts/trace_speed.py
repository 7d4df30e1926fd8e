"""How long the meta-device trace of generate() takes (issue 42's speed targets: the first answer
for a model never seen before within 3 s on a 2-core machine, every later change within 100 ms).

For each config:

- fresh CLI: `attnmem memory` in a new process (imports, reading the config, building the model
  on meta, the trace; the imports alone are measured by --imports);
- warm first answer: in a process that has already traced another model (as the app has), the
  first answer for this one (attnmem.trace.lengths.trace_at, as the pages call it: building the
  model on meta, the layer shortcut's two short traces, and the length model where the answer
  was quick enough to build it at once);
- first move and later moves of a prompt-length slider (trace_at at other lengths: replays of
  the length model, which the first move builds where the first answer did not).

Configs are config.json paths or the model types of attnmem.measure.unruled_models
(olmo2, granite, smollm3, glm4_moe, minimax_m2, llama4_text: the class defaults). Prompt 4,096,
batch 1, one new token, SDPA, bf16. Run it on an idle machine.

    .venv/bin/python scripts/trace_speed.py olmo2 smollm3 granite glm4_moe llama4_text
    .venv/bin/python scripts/trace_speed.py --imports   # what `attnmem memory` imports, timed
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = 4096


def config(arg: str) -> dict:
    """A config dict from a path, or from attnmem.measure.unruled_models by model type."""
    from attnmem.measure.unruled_models import CLASS_DEFAULTS

    if arg in CLASS_DEFAULTS:
        return dict(CLASS_DEFAULTS[arg][0])
    p = Path(arg)
    if not p.is_file():
        raise SystemExit(f"{arg!r} is neither a config.json path nor one of "
                         f"{', '.join(CLASS_DEFAULTS)}")
    return json.loads(p.read_text())


def fresh_cli(d: dict) -> float:
    """Seconds of `attnmem memory` for the config in a new process."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(d, f)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "attnmem", "memory", "--model", f.name, "--seq-len",
                    str(PROMPT), "--gpu", "H100 80GB", "--json"], check=True,
                   capture_output=True)
    dt = time.perf_counter() - t0
    Path(f.name).unlink()
    return dt


def warm_up() -> None:
    """Trace a small model once: imports and torch's one-time setup, as in a running app."""
    import transformers

    from attnmem.trace.lengths import trace_at

    c = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 vocab_size=1000)
    trace_at({**c.to_dict(), "model_type": c.model_type}, 1, 256, 1)


def in_process(d: dict, changes: int = 8) -> tuple[float, float, list[float], str]:
    """(first answer, first move, later moves) in seconds, as a page calls the trace
    (attnmem.trace.lengths.trace_at), and how the answers came (shortcut, length model)."""
    from attnmem.trace import lengths

    try:
        from attnmem.trace import layer_blocks
    except ImportError:  # a checkout from before the layer shortcut (a baseline run)
        layer_blocks = None

    t0 = time.perf_counter()
    lengths.trace_at(d, 1, PROMPT, 1)
    first = time.perf_counter() - t0
    built = any(m is not None for m in lengths._MODELS[_key(d)].values())
    t0 = time.perf_counter()
    lengths.trace_at(d, 1, PROMPT + 404, 1)
    move = time.perf_counter() - t0
    later = []
    for i in range(changes):
        t0 = time.perf_counter()
        lengths.trace_at(d, 1, 2100 + 731 * i, 1)
        later.append(time.perf_counter() - t0)
    pl = layer_blocks.plan(json.dumps(d, sort_keys=True), "bf16", "sdpa") \
        if layer_blocks else "no layer shortcut in this checkout"
    models = [m for m in lengths._MODELS[_key(d)].values() if m is not None]
    how = (f"{pl.short_depth}+{pl.check_depth} of {pl.depth} layers" if not isinstance(pl, str)
           else f"full depth ({pl[:60]})")
    how += ("; length model " + ", ".join(f"{m.lo}-{m.hi}" for m in models)
            + (" with the first answer" if built else "") if models else "; no length model")
    return first, move, later, how


def _key(d: dict) -> tuple:
    return (json.dumps(d, sort_keys=True), 1, 1, "sdpa", "bf16")


def imports() -> None:
    """What `attnmem memory` imports for a traced answer, the slowest first (-X importtime)."""
    d = config("olmo2")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(d, f)
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "attnmem", "memory",
                        "--model", f.name, "--seq-len", str(PROMPT), "--gpu", "H100 80GB",
                        "--json"], capture_output=True, text=True, check=True)
    Path(f.name).unlink()
    top = []
    for line in r.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        own, cum, name = line[len("import time:"):].split("|")
        if name.startswith(" ") and not name.startswith("  "):  # imported at the top level
            top.append((int(cum), name.strip()))
    total = sum(us for us, _ in top)
    print(f"{'all imports':30s} {total / 1e6:6.2f} s")
    for us, name in sorted(top, reverse=True)[:15]:
        print(f"{name:30s} {us / 1e6:6.2f} s")


def main(args: list[str]) -> None:
    if args == ["--imports"]:
        imports()
        return
    configs = {a: config(a) for a in args}
    warm_up()
    print(f"{'config':16s} {'fresh CLI s':>11s} {'warm first s':>12s} {'first move s':>12s} "
          f"{'later moves s (median, max)':>28s}  how")
    for name, d in configs.items():
        cli = fresh_cli(d)
        first, move, later, how = in_process(d)
        print(f"{Path(name).stem[:16]:16s} {cli:11.2f} {first:12.2f} {move:12.3f} "
              f"{statistics.median(later):14.3f} {max(later):13.3f}  {how}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
