#!/usr/bin/env bash
# Assemble a Hugging Face Space repository from this checkout: the package, the examples, space_app/, and at the
# top the Space's README (its front matter: sdk docker, app_port 7860) and the Dockerfile for the hardware.
#   space_app/stage.sh DEST [cpu|gpu]        then: cd DEST && git init && ... or `huggingface-cli upload`
# With INTERCEPTOR_TORCH_WHEEL=path/to/torch-*.whl the CPU image installs that wheel instead of downloading torch;
# with INTERCEPTOR_EXTRA_CA=path/to/ca.crt the image trusts that CA too (a build behind a TLS-intercepting proxy).
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:?usage: space_app/stage.sh DEST [cpu|gpu]}"
hardware="${2:-cpu}"
case "$hardware" in cpu) dockerfile=space_app/Dockerfile ;; gpu) dockerfile=space_app/Dockerfile.gpu ;;
    *) echo "hardware must be cpu or gpu, not '$hardware'" >&2; exit 2 ;; esac
mkdir -p "$dest"
git ls-files -z pyproject.toml interceptor agents trainer examples space_app | xargs -0 -I{} cp --parents {} "$dest"/
cp space_app/README.md "$dest/README.md"
cp "$dockerfile" "$dest/Dockerfile"
if [ -n "${INTERCEPTOR_EXTRA_CA:-}" ]; then
    cp "$INTERCEPTOR_EXTRA_CA" "$dest/space_app/certs/extra-ca.crt"
fi
if [ -n "${INTERCEPTOR_TORCH_WHEEL:-}" ]; then
    mkdir -p "$dest/space_app/wheels" && cp "$INTERCEPTOR_TORCH_WHEEL" "$dest/space_app/wheels/"
fi
echo "staged a $hardware Space in $dest"
