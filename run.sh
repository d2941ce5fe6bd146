#!/usr/bin/env bash
# The two set-up commands of the README:
#   bash run.sh demo   install into .venv and run the main job
#   bash run.sh test   install into .venv (with test tools) and run the test suite
set -euo pipefail
cd "$(dirname "$0")"
mode="${1:-}"
shift || true
if [[ "$mode" != "demo" && "$mode" != "test" ]]; then
  echo "usage: bash run.sh demo|test" >&2; exit 2
fi
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "cues_platform needs Python 3.11+ (found: $("$PY" --version 2>&1 || echo none)); set PYTHON=/path/to/python3.11" >&2; exit 2
fi
java_major="$( (java -version 2>&1 || true) | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)"
if [[ -z "$java_major" || "$java_major" -lt 17 ]]; then
  echo "Spark needs Java 17+ but found ${java_major:-no java}: install it (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or put it on PATH" >&2; exit 2
fi
if [[ ! -x .venv/bin/python ]]; then "$PY" -m venv .venv; fi
# Install (again) only when pyproject.toml changed since the last install of this mode; the
# installer's output goes to .venv/install.log and is shown only when it fails.
target='.'; [[ "$mode" == "test" ]] && target='.[dev]'
stamp=".venv/.cues-installed-$mode"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "installing cues_platform into .venv ($target) ..." >&2
  if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e "$target"; } \
      >.venv/install.log 2>&1; then
    cat .venv/install.log >&2; echo "installation failed (log above, also in .venv/install.log)" >&2; exit 2
  fi
  echo "$want" > "$stamp"
fi
if [[ "$mode" == "demo" ]]; then
  exec .venv/bin/cues demo "$@"
fi
exec .venv/bin/python -m pytest "$@"
