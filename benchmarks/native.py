"""Native MultiWorkerMirroredStrategy: Keras processes started by hand with ``TF_CONFIG`` on loopback ports.

B2's reference (``train``: the same Keras program as the tfos_nb nodes, each process with its share of the rows in
memory) and the ports and ``TF_CONFIG`` of B5's native memory reference.  ``python benchmarks/native.py SPEC`` is
one process of ``train``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("bench")

# How a native worker reads its rows (``node``'s ``input``): ``slices`` (the default) and ``generator_steps`` tell the
# strategy their length; ``slices_once``, ``generator`` and ``generator_chunks`` do not, as ``as_dataset`` does not
INPUTS = ("slices", "slices_once", "generator", "generator_steps", "generator_chunks")
LENGTH_TOLD = ("slices", "generator_steps")
CHUNK = 8  # generator_chunks: global batches a Python call


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_config(ports: Sequence[int], index: int, chief: bool = True, host: str = "127.0.0.1") -> str:
    """Process ``index``'s TF_CONFIG: with ``chief``, process 0 is the chief and the others workers 0, 1, ...;
    without, all are workers."""
    addrs = ["%s:%d" % (host, p) for p in ports]
    if not chief:
        return json.dumps({"cluster": {"worker": addrs}, "task": {"type": "worker", "index": index}})
    role = ("chief", 0) if index == 0 else ("worker", index - 1)
    return json.dumps({"cluster": {"chief": addrs[:1], **({"worker": addrs[1:]} if len(addrs) > 1 else {})},
                       "task": {"type": role[0], "index": role[1]}})


class _PortTaken(Exception):
    """A native worker's port was taken between choosing it and TensorFlow binding it."""


def node(spec_path: str) -> None:
    """One process of ``train``: the Keras program, its rows in memory, every row trained once an epoch.

    By default the rows go to the strategy as TensorFlow's guides give a worker its own input pipeline:
    ``distribute_datasets_from_function`` over ``from_tensor_slices(...).batch(batch).repeat()``, ``batch`` rows a
    replica a step (the global batch is ``batch`` x the workers), ``steps_per_epoch`` = the share's batches, which
    Keras asks for with such a dataset.  Not ``model.fit`` on ``.batch(n)`` with auto-sharding off: the strategy
    splits each of those batches across all replicas, and Keras, which counts an epoch in the unsplit batches, then
    trains half of each worker's rows an epoch (measured: ``.batch(128)`` on 2 workers, 64 rows a replica, 16 steps
    for 2,000 rows a worker).  ``input`` (:data:`INPUTS`) ``generator``: the rows through ``from_generator``, a
    global batch an element, as ``as_dataset`` reads a node's feed (the strategy splits each element across the
    replicas; its length is unknown, so Keras reads to the end, and the strategy asks every step whether each worker
    still has data); ``generator_chunks``: the same, :data:`CHUNK` global batches a Python call, batched again by
    tf.data; ``generator_steps``: ``batch`` rows an element, repeated and handed over as the default's are (its
    length told); ``slices_once``: as ``generator`` with no Python, ``from_tensor_slices`` batched by the global
    batch, its length made unknown by a ``filter`` that keeps every batch (what an unknown length costs alone)."""
    import numpy as np
    from model import build_model, later_epochs_timer

    spec = json.load(open(spec_path))
    kind, batch = spec.get("input", "slices"), spec["batch"]
    if kind not in INPUTS:
        raise ValueError("native: input %r is none of %s" % (kind, ", ".join(INPUTS)))
    import tensorflow as tf

    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    except tf.errors.UnknownError as exc:
        if "Could not start gRPC server" not in str(exc):
            raise
        open(spec["out"] + ".port-taken", "w").close()  # the driver starts the run again on new ports
        sys.exit(3)
    with strategy.scope():
        model = build_model(spec["model"])
    x, y = np.load(spec["x"]), np.load(spec["y"])
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if spec.get("untuned"):  # tfos_nb's tf.data settings: autotuning off, here and on the per-device prefetch
        from tfos_nb.runtime.executor import compat

        opts.autotune.enabled = False
        compat.untuned_device_prefetch()

    def through_generator(rows: int) -> Any:  # the rows through from_generator, `rows` an element
        def elements():
            for i in range(0, len(y), rows):
                yield x[i:i + rows], y[i:i + rows]

        return tf.data.Dataset.from_generator(elements, output_signature=(
            tf.TensorSpec((None,) + x.shape[1:], tf.as_dtype(x.dtype)), tf.TensorSpec((None,), tf.as_dtype(y.dtype))))

    global_batch = batch * strategy.num_replicas_in_sync
    fit_args: dict[str, Any] = {}
    if kind in LENGTH_TOLD:  # each worker's own rows, `batch` a replica
        share = (through_generator(batch) if kind == "generator_steps"
                 else tf.data.Dataset.from_tensor_slices((x, y)).batch(batch))
        share = share.repeat().with_options(opts)
        ds = strategy.distribute_datasets_from_function(lambda _ctx: share)
        fit_args["steps_per_epoch"] = spec["steps"]
    elif kind == "slices_once":  # as "generator" without Python: a global batch an element, its length made unknown
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch).filter(
            lambda *_: True).with_options(opts)
    elif kind == "generator_chunks":  # CHUNK global batches a Python call, batched again by tf.data
        ds = through_generator(global_batch * CHUNK).flat_map(
            lambda a, b: tf.data.Dataset.from_tensor_slices((a, b)).batch(global_batch)).with_options(opts)
    else:  # "generator", as as_dataset: a global batch an element, of unknown length, split by the strategy
        ds = through_generator(global_batch).with_options(opts)
    timer = later_epochs_timer(tf.keras)
    t_fit = time.time()
    model.fit(ds, epochs=spec["epochs"], verbose=0, callbacks=[timer], **fit_args)
    fit = time.time() - t_fit
    # every worker saves (a collective); only the chief's copy is kept
    is_chief = spec["index"] == 0
    model.save(spec["export_dir"] if is_chief else spec["export_dir"] + "-worker%d" % spec["index"])
    with open(spec["out"], "w") as f:
        json.dump({"fit": fit, "step": timer.wall / timer.steps if timer.steps else None, "steps": timer.total}, f)


def write_shares(x: Any, y: Any, processes: int, folder: str) -> list[tuple[str, str]]:
    """The rows split into ``processes`` shares, each one's (x.npy, y.npy) in ``folder``."""
    import numpy as np

    shares = []
    for i, idx in enumerate(np.array_split(np.arange(len(y)), processes)):
        xs, ys = os.path.join(folder, "x%d.npy" % i), os.path.join(folder, "y%d.npy" % i)
        np.save(xs, x[idx])
        np.save(ys, y[idx])
        shares.append((xs, ys))
    return shares


def train(shares: Sequence[tuple[str, str]], run_dir: str, spec: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """One process per (x.npy, y.npy) share, ``spec`` (batch, epochs, model, untuned, export_dir) for each: the wall
    time from the first start to the last exit, and the chief's report (fit, step, steps)."""
    for attempt in (1, 2):
        try:
            return _train_once(shares, run_dir, spec)
        except _PortTaken:
            # free_ports' ports were free when it closed them; another process (a Spark or TensorFlowOnSpark
            # process of an earlier variant) can take one before TensorFlow binds it: a harness race, not the
            # program's cost, so the run starts again on new ports
            log.warning("native: a worker could not bind its port (attempt %d); starting again", attempt)
    raise RuntimeError("native: the workers could not bind free ports twice")


def _train_once(shares: Sequence[tuple[str, str]], run_dir: str, spec: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    ports = free_ports(len(shares))
    if spec.get("input", "slices") in LENGTH_TOLD:  # every worker the same steps: its peers wait for it in each step
        import numpy as np

        rows = max(len(np.load(ys, mmap_mode="r")) for _, ys in shares)
        spec = {**spec, "steps": -(-rows // spec["batch"])}
    env = dict(os.environ, TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", OMP_NUM_THREADS="1",
               TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    procs, outs = [], []
    t0 = time.perf_counter()
    for i, (xs, ys) in enumerate(shares):
        one = {**spec, "x": xs, "y": ys, "index": i, "out": os.path.join(run_dir, "node-%d.json" % i)}
        spec_path = os.path.join(run_dir, "spec-%d.json" % i)
        with open(spec_path, "w") as f:
            json.dump(one, f)
        outs.append(one["out"])
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), spec_path],
                                      env=dict(env, TF_CONFIG=tf_config(ports, i))))
    deadline = time.monotonic() + 1800
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            break  # one worker failed: its peers would wait for it in the strategy's first collective
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    for p in procs:
        if p.poll() is None:
            p.kill()
    codes = [p.wait() for p in procs]
    if any(codes):
        if any(os.path.exists(o + ".port-taken") for o in outs):
            raise _PortTaken()
        raise RuntimeError("native node exit codes %s" % codes)
    chief = json.load(open(outs[0]))
    log.info("native: %d steps on the chief, %.1f ms a step after the first epoch", chief["steps"],
             1000 * (chief["step"] or 0))
    return wall, chief


if __name__ == "__main__":
    node(sys.argv[1])
