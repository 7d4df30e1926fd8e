"""Breadth check: every causal LM type the installed transformers builds, through `attnmem memory`.

For each model type in transformers' causal-LM auto mapping this writes the config class's
default config.json (the class defaults describe the checkpoint named in its docstring), cut to
`--layers` layers (2 by default) so the trace stays quick (widths kept), and runs `attnmem memory --model <file>
--seq-len 1024 --json` in a child process with a time limit. Each type ends as one of:

- answered: exit 0, with where the figures came from (calc's rules or the trace);
- refused: exit 1 or 2 with attnmem's one-line reason (the reason is printed);
- crashed: a Python traceback, or no answer in the time limit.

The prompt is 1,024 tokens, or, for a model with learned positions ending before that
(GPT-1, BERT-style decoders: `max_position_embeddings`, `n_positions`), 8 fewer than its
limit: past it the model cannot run at all (attnmem says so); the row's `seq_len` says which.

Cutting a config's layers can make a config its class would not make (XLSTM's num_blocks,
HRM's num_layers_per_stack and per-layer dicts keyed by layer index keep the old count): a type
refused or crashed at the cut is run again at its class's own layer count, and the row says
which config gave the outcome (`layers`: the cut, or "default").

    python scripts/any_model_sweep.py [--types llama,olmo2] [--timeout 120] [--out sweep.csv]
    python scripts/any_model_sweep.py --from sweep.csv --outcome refused,crashed   # the rest

Nothing here is downloaded; the configs are the installed classes' own defaults.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def default_config(model_type: str, layers: int | None = 2) -> dict:
    """The class-default config of model_type as a config.json dict, cut to `layers` layers
    (None: as the class makes it)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    d = CONFIG_MAPPING[model_type]().to_dict()
    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    d["architectures"] = [arch if isinstance(arch, str) else arch[0]]
    if layers is None:
        return d
    for sub in (d, d.get("text_config") or {}):
        n = [sub[k] for k in LAYER_KEYS if isinstance(sub.get(k), int)]
        for k in LAYER_KEYS:
            if isinstance(sub.get(k), int) and sub[k] > layers:
                sub[k] = layers
        # per-layer lists (layer_types, mlp_layer_types, ...) are cut with the layers
        for k, v in list(sub.items()):
            if isinstance(v, list) and n and len(v) == n[0] and n[0] > layers:
                sub[k] = v[:layers]
    return d


SEQ_LEN = 1024
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len")


def seq_len_for(d: dict) -> int:
    """SEQ_LEN, or 8 tokens short of a position limit below it (module docstring)."""
    limits = [v for scope in (d, d.get("text_config") or {}) for k, v in scope.items()
              if k in _POSITION_KEYS and isinstance(v, int) and not isinstance(v, bool)]
    short = [v for v in limits if 8 < v < SEQ_LEN + 8]
    return min(short) - 8 if short else SEQ_LEN


def run_one(model_type: str, timeout: float, layers: int = 2) -> dict:
    """One type's outcome at `layers` layers, and where that is refused or crashes, at the
    class's own layer count (the module docstring)."""
    row = _run(model_type, timeout, layers)
    if row["outcome"] in ("refused", "crashed", "class"):
        full = _run(model_type, timeout, None)
        if full["outcome"] == "answered" or row["outcome"] == "class":
            return full
        row["detail"] = f"{row['detail']} | at the class's own layer count: {full['detail']}"
    return row


def _run(model_type: str, timeout: float, layers: int | None) -> dict:
    cut = "default" if layers is None else str(layers)
    seq = ""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        try:
            d = default_config(model_type, layers)
            seq = str(seq_len_for(d))
            path.write_text(json.dumps(d, default=str))
        except Exception as exc:  # the class itself refuses its defaults
            return {"type": model_type, "outcome": "class", "seconds": 0.0, "layers": cut,
                    "seq_len": seq,
                    "detail": " ".join(f"{type(exc).__name__}: {exc}".split())[:300]}
        t0 = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, "-c", "import sys; from attnmem.cli import main; sys.exit(main(sys.argv[1:]))", "memory", "--model", str(path),
                                "--seq-len", seq, "--json"],
                               capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"type": model_type, "outcome": "crashed", "seconds": timeout,
                    "layers": cut, "seq_len": seq, "detail": f"no answer in {timeout:.0f} s"}
        secs = time.perf_counter() - t0
    err = p.stderr.strip()
    if "Traceback (most recent call last)" in err:
        outcome, detail = "crashed", err.splitlines()[-1][:300]
    elif p.returncode == 0:
        try:
            ans = json.loads(p.stdout)
        except json.JSONDecodeError:
            return {"type": model_type, "outcome": "crashed", "seconds": round(secs, 1),
                    "layers": cut, "seq_len": seq,
                    "detail": "exit 0 but no JSON: " + p.stdout[:200]}
        outcome = "answered"
        detail = str(ans.get("counted_from") or ans.get("source") or "rules")[:300]
    elif p.returncode in (1, 2):  # attnmem's refusal: a usage error or a reason
        last = (err.splitlines() or [""])[-1]
        # calc's refusal first, then the trace's reason: keep the trace's
        outcome, detail = "refused", last.split("; and the trace: ")[-1][:700]
    else:  # the process died (a signal, a library that would not load)
        outcome = "crashed"
        detail = f"exit {p.returncode}: " + (err.splitlines() or [""])[-1][:300]
    return {"type": model_type, "outcome": outcome, "seconds": round(secs, 1), "layers": cut,
            "seq_len": seq,
            "detail": detail}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", help="comma-separated model types (default: all causal LMs)")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--out", help="CSV of type, outcome, seconds, detail")
    ap.add_argument("--layers", type=int, default=2,
                    help="layers kept (hybrids need enough to hold an attention layer)")
    ap.add_argument("--from", dest="from_csv",
                    help="run only the types of this earlier --out CSV (with --outcome)")
    ap.add_argument("--outcome", default="refused,crashed,class",
                    help="with --from: the outcomes whose types run again")
    a = ap.parse_args(argv)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = a.types.split(",") if a.types else sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if a.from_csv:
        wanted = set(a.outcome.split(","))
        with open(a.from_csv, newline="") as fh:
            types = [r["type"] for r in csv.DictReader(fh) if r["outcome"] in wanted]
    rows = []
    for t in types:
        r = run_one(t, a.timeout, a.layers)
        rows.append(r)
        print(f"{r['type']:28s} {r['outcome']:9s} {r['seconds']:6.1f}s {r['layers']:>7s} "
              f"{r['seq_len']:>5s}  "
              f"{r['detail']}", flush=True)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print(f"{len(rows)} types: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if a.out:
        with open(a.out, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["type", "outcome", "seconds", "layers", "seq_len",
                                                    "detail"])
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
