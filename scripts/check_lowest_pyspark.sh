#!/usr/bin/env bash
# Run a few real-Spark tests against the lowest supported pyspark (setup.py: pyspark>=3.5), outside CI:
# a venv (.venv-pyspark35) with only pyspark 3.5 of its own, everything else from .venv through a path
# entry. Downloads the pyspark sdist (~320 MB) once. Needs the project's .venv (bash scripts/setup_env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${PYSPARK_VERSION:-3.5.9}
V=.venv-pyspark35
if [ ! -x "$V/bin/python" ]; then
  .venv/bin/python -m venv --without-pip "$V"
  site=$("$V/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  .venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$site/zz_project_venv.pth"
  .venv/bin/python -m pip --python "$V/bin/python" install -q --no-deps --no-build-isolation "pyspark==$VERSION"
fi
"$V/bin/python" -c "import pyspark; print('pyspark', pyspark.__version__)"
# Before 4.0 a local Spark Connect server has no authentication token and no loopback binding: the embedded
# Spark refuses to be one (TFOS_NB_SPARK_CONNECT=1, quickstart.sh --connect), before starting anything.
PYTHONPATH="$PWD" "$V/bin/python" - <<'PY'
from tfos_nb.magics import spark_session

try:
    spark_session(connect=True)
except RuntimeError as exc:
    print(exc)
else:
    raise SystemExit("an embedded Spark Connect server started on pyspark < 4.0")
PY
PYTHONPATH="$PWD" "$V/bin/python" -m pytest -q \
  tests/test_runtime_spark.py -k "from_dataframe or rdd_and_inference or wrongly_shaped" "$@"
PYTHONPATH="$PWD" "$V/bin/python" -m pytest -q tests/test_pipeline.py -k "array_column and pandas" "$@"
