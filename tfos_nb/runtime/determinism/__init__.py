"""A job's seed and deterministic mode: what the driver checks and tells the nodes (what each node does with it:
:mod:`.seeding`).

``seed=N`` seeds every node before its function runs — Python's ``random``, NumPy, TensorFlow, and Keras 3's
global seed (``keras.utils.set_random_seed``, which also does the first three) — so that a model's initial
weights, dropout and shuffles are the same at every run.  ``deterministic=True`` (with ``seed``, 0 when not
given) adds what a synchronous job needs for a run to end with the same weights as another:

- TensorFlow's op determinism (``tf.config.experimental.enable_op_determinism()``) on every node;
- under tf_keras, its random layers (``Dropout``, ...) on a ``tf.random.Generator``, set from the step before each
  step by ``ctx.progress_callback()`` (:func:`.seeding.step_keyed`): a resumed run draws the clean run's;
- a fixed feed (:mod:`.order` on the driver, :mod:`.turns` on the node): partition ``p`` of every epoch
  goes to the ``p mod n``-th chief/worker, and a node reads its partitions whole, in ascending order (one that
  arrives early waits on the node, in memory and then on disk, its feeding task done).  A node's stream, and so
  each step's global batch, is then the same at every run, whichever executor Spark ran a task on.

Together with recovery's backups (``retries``), a job that lost an executor resumes on exactly the rows that
the clean run trained after the backup's step, in the same batches, and ends with the clean run's weights.
A retry cannot shrink to fewer nodes (``min_workers``): fewer nodes would put other rows together.

One package, its halves a module a side: this module (the options, shared) is what the driver checks and sends;
:mod:`.order` runs in the driver's controller; :mod:`.seeding` and :mod:`.turns` run on the nodes.
"""

from __future__ import annotations

from typing import Any

from ..option_error import Named, OptionError

ENV_SEED = "TFOS_SEED"  # the nodes' seed
ENV_DETERMINISTIC = "TFOS_DETERMINISTIC"  # "1": op determinism on the nodes


def node_env(deterministic: Any = False, seed: Any = None) -> dict[str, str]:
    """The nodes' environment for ``deterministic`` and ``seed`` (validated here, on the driver: an
    :class:`~..option_error.OptionError` naming the option)."""
    if not isinstance(deterministic, bool):
        raise OptionError(Named("deterministic"), f" must be True or False, got {deterministic!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32):
        raise OptionError(Named("seed"), f" must be an integer from 0 to 2**32 - 1, got {seed!r}")
    env: dict[str, str] = {}
    if seed is not None or deterministic:
        env[ENV_SEED] = str(0 if seed is None else seed)
    if deterministic:
        env[ENV_DETERMINISTIC] = "1"
    return env
