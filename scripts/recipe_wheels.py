"""Fetch the wheels the recipe rows (issue 43, ``--plan h200-recipes``) need on the GPU host,
which has torch, transformers and peft but no network, no bitsandbytes and no liger-kernel:

    python3 scripts/recipe_wheels.py            # into .whl/ (git-ignored)
    python3 scripts/recipe_wheels.py --cuda 130 # keep only the CUDA 13.0 build (about 4 MiB)

- bitsandbytes 0.50.2 (the version of the bundled QLoRA rows), binary for CPython 3.12 on
  manylinux x86_64, trimmed: its ROCm and Intel XPU libraries (libbitsandbytes_rocm*.so,
  libbitsandbytes_xpu*.so; bitsandbytes loads the one library that matches torch's CUDA, ROCm
  or XPU build) are removed and RECORD rewritten, so that the set stays under 40 MiB
  (41.1 MiB as published, 35.2 MiB trimmed). Every CUDA build is kept unless ``--cuda``
  names the ones to keep (torch.version.cuda without the dot: the GPU host's torch 2.11 is a
  cu130 build, so ``--cuda 130`` leaves room in the call's 64 MiB for other wheels).
- liger-kernel 0.8.2, pure Python: its kernel and patch files are those of the commit
  attnmem/calc/train_liger.py counts (Liger-Kernel ead96b6; 0.8.5 accumulates lm_head's
  gradient with addmm(out=) and makes no V x h temporaries, which calc does not count).

Both need only torch (and triton, numpy, packaging), which the host has; they are fetched
with --no-deps. On the host: ``python3 -m pip install -q --no-index --no-deps --no-compile
--no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site``.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHL = ROOT / ".whl"
PINS = {"bitsandbytes": "0.50.2", "liger-kernel": "0.8.2"}
BINARY = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
          *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                        "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                        "manylinux2014_x86_64", "manylinux1_x86_64") for a in ("--platform", p)]]
PURE = ["--only-binary=:all:", "--python-version", "3.12", "--platform", "any"]
#: Libraries of the bitsandbytes wheel that a CUDA host never loads.
DROP = ("bitsandbytes/libbitsandbytes_rocm", "bitsandbytes/libbitsandbytes_xpu")


def download(name: str, version: str, flags: list[str]) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *flags,
                    "-d", str(WHL), f"{name}=={version}"], check=True)
    stem = name.replace("-", "_")
    (path,) = sorted(WHL.glob(f"{stem}-{version}-*.whl"))
    return path


def trim(path: Path, drop: tuple[str, ...]) -> int:
    """Rewrite the wheel without the members starting with ``drop`` and with a RECORD that
    lists what is left (sha256 and size of each file, as the wheel format asks). Returns the
    members removed."""
    tmp = path.with_suffix(".tmp")
    removed = 0
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        record = next(i.filename for i in src.infolist()
                      if i.filename.endswith(".dist-info/RECORD"))
        rows = []
        for info in src.infolist():
            if info.filename.startswith(drop):
                removed += 1
                continue
            if info.filename == record:
                continue
            data = src.read(info)
            dst.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            rows.append(f"{info.filename},sha256={digest.decode()},{len(data)}")
        rows.append(f"{record},,")
        dst.writestr(record, "\n".join(rows) + "\n")
    tmp.replace(path)
    return removed


def cuda_builds(names: list[str]) -> tuple[str, ...]:
    """The bitsandbytes CUDA libraries of the wheel (``libbitsandbytes_cudaNNN.so``)."""
    return tuple(n for n in names if n.startswith("bitsandbytes/libbitsandbytes_cuda"))


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuda", nargs="+", default=None, metavar="NNN",
                    help="keep only these CUDA builds of bitsandbytes (e.g. 130 for torch's "
                         "cu130); default: all")
    args = ap.parse_args(argv)
    WHL.mkdir(exist_ok=True)
    bnb = download("bitsandbytes", PINS["bitsandbytes"], BINARY)
    with zipfile.ZipFile(bnb) as z:
        names = z.namelist()
    drop = DROP
    if args.cuda:
        builds = cuda_builds(names)
        keep = {f"bitsandbytes/libbitsandbytes_cuda{v}.so" for v in args.cuda}
        missing = keep - set(builds)
        if missing:
            have = ", ".join(b.rsplit("cuda", 1)[1].removesuffix(".so") for b in builds)
            print(f"--cuda {' '.join(args.cuda)}: this wheel has CUDA builds {have or 'none'}",
                  file=sys.stderr)
            return 2
        drop = DROP + tuple(b for b in builds if b not in keep)
    if any(n.startswith(drop) for n in names):
        print(f"{bnb.name}: {trim(bnb, drop)} libraries removed (ROCm/XPU"
              f"{', other CUDA builds' if args.cuda else ''})")
    liger = download("liger-kernel", PINS["liger-kernel"], PURE)
    total = sum(p.stat().st_size for p in (bnb, liger))
    print(f"{bnb.name} {bnb.stat().st_size / 2**20:.1f} MiB, {liger.name} "
          f"{liger.stat().st_size / 2**20:.1f} MiB: {total / 2**20:.1f} MiB in {WHL}")
    return 0 if total < 40 * 2**20 else 1


if __name__ == "__main__":
    raise SystemExit(main())
