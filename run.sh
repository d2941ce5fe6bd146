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
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if [[ "$mode" == "demo" ]]; then
  .venv/bin/python -m pip install -q -e .
  exec .venv/bin/cues demo "$@"
fi
.venv/bin/python -m pip install -q -e '.[dev]'
exec .venv/bin/python -m pytest "$@"
