#!/usr/bin/env bash
# The floor of the support matrix (docs/getting-started.md, "Supported versions"): the fast tier and a slice of the
# slow one -- feeding, training and inference on real Spark, the pipeline, a training cell in a real kernel with its
# panel, and Spark Connect -- on the lowest versions setup.py admits, in two environments of their own on Python 3.10:
#   .venv-floor          requirements-floor.txt: pyspark 3.5.0, TensorFlow 2.16.1 + tf-keras 2.16.0, pandas 2.0.3,
#                        pyarrow 14.0.2, numpy 1.26.4, IPython 8.18 (the suite itself runs the newest: requirements.txt)
#   .venv-floor-connect  requirements-floor-connect.txt: pyspark[connect] 4.0.0 with TensorFlow 2.18.1 (see there)
# .ci/run runs it after the suite (`--setup` only sets the environments up: .ci/run does that while the suite runs);
# by hand: bash scripts/check_floor.sh (about 1.5 GB of downloads the first time).
# Each environment installs tfos_nb (-e) with its extras under the floor's constraints, and the test tools at the
# suite's versions; the install is skipped while those files are unchanged. pytest's output is printed; the Spark
# JVMs' shutdown lines after the last test (pyspark 3.5's standalone worker says it cannot relaunch executors
# during shutdown) go to .venv-floor*/pytest.log, printed whole if a run fails.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {  # Python 3.10, the lowest supported (setup.py python_requires)
  local candidate
  for candidate in "${FLOOR_PYTHON:-}" "$(command -v python3.10 || true)" \
    "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10*/bin/python3.10; do
    # (a pyenv shim on PATH is there whether or not it can run 3.10: ask each candidate itself)
    if [ -n "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
  echo "tfos_nb: the floor tier needs Python 3.10 (python3.10 on PATH, or FLOOR_PYTHON=/path/to/python3.10)" >&2
  exit 1
}

tools() {  # the test tools, at the versions requirements-test.txt pins
  local name
  for name in pytest pytest-timeout pytest-xdist psutil hypothesis; do
    grep -E "^$name==" requirements-test.txt | cut -d' ' -f1
  done
  grep -E "^(nbclient|nbformat)==" requirements-quickstart.txt | cut -d' ' -f1
}

setup() {  # setup VENV CONSTRAINTS EXTRAS
  local venv=$1 constraints=$2 extras=$3 stamp files
  stamp=$venv/.tfos_nb-stamp
  files=$(cat "$constraints" setup.py requirements-test.txt requirements-quickstart.txt "$0" | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null || true)" = "$files" ]; then return; fi
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # tf-keras is not a dependency (each release is for one TensorFlow minor): the user installs the matching one
  PYTHONWARNINGS="ignore:Editable installation" "$venv/bin/python" -m pip install -q -c "$constraints" \
    -e ".[$extras]" tf-keras $(tools)
  echo "$files" > "$stamp"
}

run() {  # run VENV WORKERS PYTEST-ARGS...: pytest in VENV (WORKERS processes), its JVMs' late lines in VENV/pytest.log
  local venv=$1 workers=$2
  shift 2
  "$venv/bin/python" -c "import sys, pyspark, tensorflow as tf, pandas, pyarrow, numpy
print(f'tfos_nb floor tier: Python {sys.version.split()[0]}, pyspark {pyspark.__version__}, TensorFlow {tf.__version__},'
      f' pandas {pandas.__version__}, pyarrow {pyarrow.__version__}, numpy {numpy.__version__}')" 2>/dev/null || true
  # worker processes as test.sh runs the suite: each test module (or the modules sharing a session) whole in one
  if ! "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
      -n "$workers" --dist loadgroup --no-loadscope-reorder "$@" 2>"$venv/pytest.log"; then
    echo "--- $venv/pytest.log" >&2
    cat "$venv/pytest.log" >&2
    return 1
  fi
}

PY=$(find_python)
setup .venv-floor requirements-floor.txt spark,notebook,examples,mlflow
setup .venv-floor-connect requirements-floor-connect.txt notebook,examples,connect
if [ "${1:-}" = --setup ]; then exit 0; fi
# the fast tier: all of it but the docs build (the suite's tools) and a test that needs the Connect client
workers=${TFOS_NB_TEST_WORKERS:-2}
run .venv-floor "$workers" -m "not slow" --ignore=tests/test_docs.py \
  --deselect tests/test_connect_snapshot.py::test_is_connect_tells_connect_sessions_from_classic_ones "$@"
run .venv-floor "$workers" \
  tests/test_runtime_spark.py::test_mwms_chief_and_two_workers_from_dataframe \
  tests/test_runtime_spark.py::test_mwms_from_rdd_and_inference_in_order \
  tests/test_runtime_spark.py::test_wrongly_shaped_rows_name_the_column \
  "tests/test_pipeline.py::test_array_column_and_multiple_outputs[pandas]" \
  tests/test_cell_output.py::test_frontend_without_widgets_sees_quiet_output_and_the_final_table \
  tests/test_panel_magic.py::test_real_cluster_run_renders_html_panel_and_snapshot \
  tests/test_magics.py::test_the_installed_pyspark_runs_the_embedded_connect_server_from_4_0_and_refuses_it_before \
  tests/test_install.py::test_installing_the_wheel_leaves_the_installed_tensorflow_and_spark_alone \
  "$@"
# one process: the Connect modules share one server, so all but one test are one group
run .venv-floor-connect 0 \
  tests/test_connect.py::test_spark_mode_train_and_inference \
  tests/test_connect.py::test_tensorflowonspark_program \
  tests/test_connect_pipeline.py::test_estimator_saves_and_loads_params_and_functions \
  tests/test_magics.py::test_the_installed_pyspark_runs_the_embedded_connect_server_from_4_0_and_refuses_it_before \
  "$@"
