#!/usr/bin/env bash
# Installs what building and testing kiln needs on Debian: the libraries, and the Python packages the test harness
# compares against (gguf's numpy dequantizers, jinja2, the openai client). Skips whatever is already there.
set -euo pipefail

DEBS=(build-essential cmake pkg-config python3 python3-pip unzip clang libclang-rt-14-dev
      libpcre2-dev libutf8proc-dev libjansson-dev libmicrohttpd-dev libcmocka-dev)
[ "${KILN_WITH_BROWSER:-0}" = 1 ] && DEBS+=(chromium)
PIPS=(numpy gguf jinja2 openai pytest)
PIPS+=(tokenizers)  # Hugging Face's tokenizers: test_tokenizer_hf.py compares kiln's token ids with theirs

missing=()
for p in "${DEBS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    echo "kiln: installing Debian packages: ${missing[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

pymissing=()
for p in "${PIPS[@]}"; do python3 -c "import $p" >/dev/null 2>&1 || pymissing+=("$p"); done
if [ ${#pymissing[@]} -gt 0 ]; then
    echo "kiln: installing Python packages: ${pymissing[*]}" >&2
    python3 -m pip install -q "${pymissing[@]}" 2>/dev/null ||
        python3 -m pip install -q --break-system-packages "${pymissing[@]}"
fi

# test_web_chromium.py drives Chromium over its DevTools websocket with PyPI's websocket-client (imported as websocket)
if [ "${KILN_WITH_BROWSER:-0}" = 1 ] && ! python3 -c "import websocket" >/dev/null 2>&1; then
    echo "kiln: installing Python packages: websocket-client" >&2
    python3 -m pip install -q websocket-client 2>/dev/null ||
        python3 -m pip install -q --break-system-packages websocket-client
fi
