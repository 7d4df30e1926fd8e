#!/usr/bin/env bash
# Create the virtual environment (if missing) and install what the project needs.
#   scripts/bootstrap.sh app   -> requirements.txt
#   scripts/bootstrap.sh test  -> requirements.txt + requirements-dev.txt + Debian's chromium
# Re-running is cheap: a stamp file per requirement set skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-app}"
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

"$PYTHON" - <<'PY' || { echo "Python 3.10 or newer is required" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 10) else 1)
PY

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

# Without an NVIDIA GPU, a CPU build of torch is all the app and the tests need. Install one
# first so that "torch>=..." below is already satisfied and pip does not pull a multi-gigabyte
# CUDA build. TORCH_CPU_SPEC names it (on our CI machines torch 2.13.0 is a CPU wheel on disk).
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    "${pip[@]}" install "${TORCH_CPU_SPEC:-torch==2.13.0}"
  fi
fi

install_set() {  # install_set STAMP FILE...
  local stamp="$VENV/.$1.stamp"; shift
  local sum; sum=$(cat "$@" | sha256sum | cut -c1-16)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
    local args=(); for f in "$@"; do args+=(-r "$f"); done
    "${pip[@]}" install "${args[@]}"
    echo "$sum" > "$stamp"
  fi
}

install_set app requirements.txt
# The project itself, editable and without dependencies: puts the `attnmem` command in the venv.
# Re-installed when pyproject.toml changes, so the editable finder maps the package names it
# declares now (an old one could map a name that no longer is ours).
stamp="$VENV/.project.stamp"; sum=$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -x "$VENV/bin/attnmem" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
  iso=(); "$VENV/bin/python" -c "import setuptools" 2>/dev/null && iso=(--no-build-isolation)
  "${pip[@]}" install --no-deps "${iso[@]}" -e .
  echo "$sum" > "$stamp"
fi
if [ "$mode" = test ]; then
  install_set dev requirements.txt requirements-dev.txt
  # Browser tests drive Debian's chromium (no browser download). Install it when we can.
  if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "installing Debian's chromium for the browser tests" >&2
      apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
    else
      echo "chromium not found and cannot be installed here: browser tests will be skipped" >&2
    fi
  fi
fi
