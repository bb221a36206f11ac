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
PYTHONPATH="$PWD" "$V/bin/python" -m pytest -q \
  tests/test_runtime_spark.py -k "from_dataframe or rdd_and_inference or wrongly_shaped" "$@"
PYTHONPATH="$PWD" "$V/bin/python" -m pytest -q tests/test_pipeline.py -k "array_column and pandas" "$@"
