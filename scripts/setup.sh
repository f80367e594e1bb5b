#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: Java + Maven (Debian packages, only if missing), a Python 3.11
# venv with the project installed, and Delta's JVM jars fetched from Maven Central into .jars/.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
# Node.js runs the type checker (pyright, pinned in pyproject.toml's dev extra, its JavaScript bundled in the wheel).
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} (Debian packages)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# Headless Chromium for the end-to-end test's real browser (Playwright drives it). Not needed by the demo's core:
# a failed install only warns here (the end-to-end test then fails and says why). PHASES_NO_BROWSER=1 skips.
if [ "${PHASES_NO_BROWSER:-0}" != 1 ] && ! command -v chromium >/dev/null 2>&1; then
  echo "setup: installing chromium (Debian package)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null) \
    || echo "setup: WARNING: could not install chromium; the UI screenshot test will fail" >&2
fi

# PostgreSQL (Debian's package) for the end-to-end test's production-like Dagster instance
# (scripts/local_postgres.py starts it on 127.0.0.1 with a fresh data directory). PHASES_NO_POSTGRES=1 skips.
if [ "${PHASES_NO_POSTGRES:-0}" != 1 ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "setup: installing postgresql (Debian package)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq postgresql >/dev/null) \
    || echo "setup: WARNING: could not install postgresql; the end-to-end test will fail and say why" >&2
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PY=$cand; break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "setup: Python 3.11 is required (python3.11 not found); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PY"
  "$PY" -m venv .venv
fi
UV_VERSION=0.13.8
stamp=.venv/.stamp-install
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  # uv resolves and installs the same pinned set as pip in under half the time (56 s against 134 s on a fresh
  # virtualenv with empty caches); it checks the registry's certificate against the system's trust store, as pip does.
  # --compile-bytecode writes the .pyc files at install time, as pip does: uv does not by default, and where
  # PYTHONDONTWRITEBYTECODE is set every new process (a Dagster run, a test's child) would compile its imports again.
  echo "setup: installing Python packages (uv)"
  if ! .venv/bin/python -m pip install -q "uv==$UV_VERSION"; then
    echo "setup: could not install uv $UV_VERSION from the package index (PyPI): check the network or the proxy" >&2
    exit 1
  fi
  if ! UV_NATIVE_TLS=1 .venv/bin/python -m uv pip install -q --compile-bytecode --python .venv/bin/python -e ".[dev]"; then
    echo "setup: installing the project's Python packages failed (see uv's message above)" >&2
    exit 1
  fi
  touch "$stamp"
fi
.venv/bin/python -m phases.setup
