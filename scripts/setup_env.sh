#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install tfos_nb with what the
# quickstart needs (TFOS_NB_TEST_DEPS=1, as test.sh sets it: everything the tests need). Idempotent: skips
# the install while the requirement files are unchanged. Needs python3 (>= 3.10) and Java 17 on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
command -v java >/dev/null || { echo "tfos_nb: Java 17 is needed by Spark and was not found on PATH" >&2; exit 1; }
# System packages only the test suite needs (test.sh sets TFOS_NB_TEST_DEPS=1; the quickstart does not).
# The real-browser tests drive Debian's chromium (tests/test_browser.py fails, never skips, without it).
if [ "${TFOS_NB_TEST_DEPS:-0}" = 1 ] && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "tfos_nb: installing chromium for the browser tests (apt-get)" >&2
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
      || echo "tfos_nb: could not install chromium; tests/test_browser.py will fail" >&2
  else
    echo "tfos_nb: /usr/bin/chromium is missing (as root: apt-get install -y chromium); tests/test_browser.py will fail" >&2
  fi
fi
# The multi-host tier (tests/test_multihost.py) makes network namespaces with iproute2's `ip`.
if [ "${TFOS_NB_TEST_DEPS:-0}" = 1 ] && ! command -v ip >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "tfos_nb: installing iproute2 for the multi-host tests (apt-get)" >&2
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 >/dev/null \
    || echo "tfos_nb: could not install iproute2; tests/test_multihost.py will skip" >&2
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# The JupyterHub tier (tests/test_jupyterhub.py) runs JupyterHub's real proxy, configurable-http-proxy, from the npm
# registry: pinned, into .venv/chp (never at test time). Needs node and npm on PATH.
CHP_VERSION=5.3.0
if [ "${TFOS_NB_TEST_DEPS:-0}" = 1 ] \
    && [ "$(cat .venv/chp/.version 2>/dev/null || true)" != "$CHP_VERSION" ]; then
  if command -v npm >/dev/null; then
    echo "tfos_nb: installing configurable-http-proxy $CHP_VERSION into .venv/chp (npm)" >&2
    npm install --prefix .venv/chp --no-audit --no-fund --loglevel=error "configurable-http-proxy@$CHP_VERSION" >/dev/null \
      && echo "$CHP_VERSION" > .venv/chp/.version \
      || echo "tfos_nb: could not install configurable-http-proxy; tests/test_jupyterhub.py will fail" >&2
  else
    echo "tfos_nb: npm is missing (node 18+ and npm); tests/test_jupyterhub.py will fail" >&2
  fi
fi
# Two levels: the quickstart's (requirements-quickstart.txt: the runtime and a headless notebook runner) and the
# test suite's (requirements-test.txt, a superset). The stamp says which is installed, for which requirement files.
level=quickstart reqs=requirements-quickstart.txt
if [ "${TFOS_NB_TEST_DEPS:-0}" = 1 ]; then level=test reqs=requirements-test.txt; fi
stamp=.venv/.tfos_nb-stamp
files=$(cat requirements.txt requirements-quickstart.txt requirements-test.txt requirements-docs.txt setup.py \
  scripts/setup_env.sh | sha256sum | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" != "test $files" ] && [ "$have" != "$level $files" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r "$reqs"
  # (setuptools warns on every editable install that a folder named like the package may shadow it: that folder is
  # the package itself, so the warning is silenced here)
  PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q --no-deps -e .
  if [ "$level" = test ]; then
    # The install puts etc/jupyter/jupyter_server_config.d/tfos_nb.json into .venv, which enables the
    # TensorBoard proxy for `.venv/bin/jupyter lab`; check it, and enable it by hand if an old setuptools did not.
    listed=$(.venv/bin/python -m jupyter_server extension list 2>&1 || true)  # not piped into grep -q: pipefail
    if ! grep -q "tfos_nb.tbproxy.*enabled" <<<"$listed"; then
      .venv/bin/python -m jupyter_server extension enable --sys-prefix tfos_nb.tbproxy
    fi
  fi
  echo "$level $files" > "$stamp"
fi
