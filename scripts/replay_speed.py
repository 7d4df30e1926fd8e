"""How fast a trace's storage events replay through attnmem.calc.allocator (issue 42).

Records generate()'s events for a model (as attnmem.trace.generate.trace_inference does:
attnmem.trace.layer_blocks.record) once, keeps them in a JSON file (flat tuples of str and int), and times
attnmem.trace.recorder.replay over them with no limit, so two versions of the allocator can be
timed on the same events. Prints events, seconds, events/s and the peaks (which must not change
between versions).

    python scripts/replay_speed.py mamba-130m --events /tmp/mamba.json      # record (or load)
    python scripts/replay_speed.py zamba-7b --seq-len 1024 --events /tmp/zamba.json
    python scripts/replay_speed.py mamba-130m --events /tmp/mamba.json --trace   # + a full trace
    python scripts/replay_speed.py mamba-130m --events /tmp/mamba.json --baseline 15aff2e

`--baseline COMMIT` also times the allocator as it was at that commit (read with git show,
loaded as a module of its own) on the same events, alternating with the current one, so both
see the same load on a shared machine. The replay gives the allocator only large-pool requests
(recorder._bypass), so that is what such a comparison times; the replay as a whole is compared
by running this script from the two checkouts (the digest must not change).

Models (nothing is downloaded; configs come from the installed transformers classes):
mamba-130m: MambaConfig with the hub checkpoint's shape (hidden 768, 24 layers, vocab 50,280);
mamba-class: MambaConfig's class defaults (the same widths, 32 layers);
zamba-7b: ZambaConfig's class defaults (its docstring's Zamba-v1 7B).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def config(name: str) -> dict:
    """The config.json dict of one of the models in the module docstring."""
    import transformers

    if name == "mamba-class":
        cfg = transformers.MambaConfig()
        arch = "MambaForCausalLM"
    elif name == "mamba-130m":
        cfg = transformers.MambaConfig(hidden_size=768, num_hidden_layers=24, vocab_size=50280)
        arch = "MambaForCausalLM"
    elif name == "zamba-7b":
        cfg = transformers.ZambaConfig()
        arch = "ZambaForCausalLM"
    else:
        raise SystemExit(f"model {name!r}: choose mamba-130m, mamba-class or zamba-7b")
    d = cfg.to_dict()
    d["architectures"] = [arch]
    return d


def baseline_allocator(commit: str) -> type:
    """CachingAllocator of attnmem/calc/allocator.py at `commit`, as a module of its own."""
    import importlib.util
    import subprocess
    import tempfile

    root = os.path.join(os.path.dirname(__file__), "..")
    src = subprocess.run(["git", "show", f"{commit}:attnmem/calc/allocator.py"], cwd=root,
                         capture_output=True, text=True)
    if src.returncode:
        raise SystemExit(f"--baseline {commit!r}: git show failed: {src.stderr.strip()}")
    # the project's own file at that commit, imported from a temporary copy
    folder = tempfile.mkdtemp(prefix="allocator_at_")
    path = os.path.join(folder, "allocator_baseline.py")
    with open(path, "w") as f:
        f.write(src.stdout)
    spec = importlib.util.spec_from_file_location(f"allocator_at_{commit}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CachingAllocator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=["mamba-130m", "mamba-class", "zamba-7b"])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--new-tokens", type=int, default=1)
    ap.add_argument("--attention", default=None,
                    help="eager or an SDPA backend (default: eager for Mamba, which has "
                         "no SDPA path, else sdpa)")
    ap.add_argument("--events", help="JSON file of the events: read if it exists, else written")
    ap.add_argument("--baseline", metavar="COMMIT",
                    help="also time attnmem/calc/allocator.py as it was at this commit")
    ap.add_argument("--rounds", type=int, default=1, help="timings of each allocator")
    ap.add_argument("--trace", action="store_true",
                    help="also time trace_inference end to end (its limits apply)")
    args = ap.parse_args()
    d = config(args.model)
    attention = args.attention or ("eager" if args.model.startswith("mamba") else "sdpa")
    if args.events and os.path.exists(args.events):
        with open(args.events) as f:
            events = [tuple(e) for e in json.load(f)]
        print(f"events loaded from {args.events}")
    else:
        from attnmem.trace.layer_blocks import record

        t0 = time.perf_counter()
        rec = record(json.dumps(d, sort_keys=True), 1, args.seq_len, args.new_tokens, attention,
                     "bf16")
        events = list(rec.events)
        print(f"recorded in {time.perf_counter() - t0:.1f} s")
        if args.events:
            with open(args.events, "w") as f:
                json.dump(events, f)
    import attnmem.trace.recorder as recorder

    versions = {"current": recorder.CachingAllocator}
    if args.baseline:
        versions[args.baseline] = baseline_allocator(args.baseline)
    for _ in range(args.rounds):
        for label, cls in versions.items():
            recorder.CachingAllocator = cls  # what recorder._run builds
            t0 = time.perf_counter()
            phases = recorder.replay(events)
            dt = time.perf_counter() - t0
            print(f"{args.model} s={args.seq_len}, allocator {label}: {len(events):,} events "
                  f"replayed in {dt:.2f} s ({len(events) / dt:,.0f} events/s)")
            for p in phases.values():
                print(f"  {p.name}: peak {p.peak:,} B, start {p.start:,} B, "
                      f"{len(p.at_peak)} labels alive at the peak")
            # one digest of every phase's peak, start and what is alive there
            whole = repr([(p.name, p.peak, p.start, sorted(p.at_peak.items()))
                          for p in phases.values()])
            print(f"  digest {hashlib.sha256(whole.encode()).hexdigest()[:16]}")
    recorder.CachingAllocator = versions["current"]
    if args.trace:
        from attnmem.trace.generate import trace_inference

        t0 = time.perf_counter()
        try:
            t = trace_inference(d, 1, args.seq_len, args.new_tokens, attention)
            print(f"trace_inference: peak {t.peak_bytes:,} B in "
                  f"{time.perf_counter() - t0:.1f} s")
        except ValueError as e:
            print(f"trace_inference refused after {time.perf_counter() - t0:.1f} s: {e}")


if __name__ == "__main__":
    main()
