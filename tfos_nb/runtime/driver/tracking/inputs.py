"""The DataFrame a job trained on, as its MLflow run's ``train`` input: recorded where the data is.

MLflow's autologging would record ``fit``'s dataset on the chief by iterating it for a digest; a
stream-fed dataset cannot be iterated twice (:mod:`tfos_nb.runtime.executor.tracking.datasets` stops that).  The
notebook holds the DataFrame itself, so it logs the record instead, once its first epoch was fed:
MLflow's own Spark dataset (``mlflow.data.from_spark``: the schema, and a digest of the DataFrame's
plan from Spark's ``semanticHash``, so the same data logs the same digest) with the exact row count
that epoch fed as its profile.  A named set (``train(..., validation=val_df)``) is logged the same way once fed,
its name as the context (``validation``).  A DataFrame logged already in the run is not logged again.
"""

from __future__ import annotations

import json
from typing import Any


def log_dataframe(client: Any, run_id: str, df: Any, num_rows: int, context: str = "train") -> None:
    """Log ``df`` as an input of run ``run_id`` (``context``: MLflow's ``mlflow.data.context`` tag)."""
    from mlflow.data.dataset import Dataset
    from mlflow.data.spark_dataset import from_spark
    from mlflow.entities import Dataset as DatasetEntity
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    dataset = from_spark(df)
    config = Dataset.to_dict(dataset)  # name, digest, source: not SparkDataset's profile (a Spark job of its own)
    schema = dataset.schema
    entity = DatasetEntity(name=config["name"], digest=config["digest"], source_type=config["source_type"],
                           source=config["source"],
                           schema=json.dumps({"mlflow_colspec": schema.to_dict()}) if schema is not None else None,
                           profile=json.dumps({"num_rows": int(num_rows)}))
    run = client.get_run(run_id)
    if not any(i.dataset.digest == entity.digest and i.dataset.name == entity.name for i in run.inputs.dataset_inputs):
        client.log_inputs(run_id, [DatasetInput(entity, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])])


def log_train_input(run: Any, df: Any, num_rows: int, context: str = "train") -> None:
    """``df`` as an input of ``run`` (a :class:`~.run.JobRun`): ``train``, or a named set's name (a
    validation set: ``validation``); a failure is a warning, never the job's."""
    import logging

    from ... import net

    try:
        log_dataframe(run.client, run.run_id, df, num_rows, context)
    except Exception as exc:  # noqa: BLE001 - tracking never fails a job once it runs
        what = "training DataFrame" if context == "train" else f"{context!r} DataFrame"
        logging.getLogger(__name__).warning("tfos_nb: MLflow logging of %s's %s failed: %s", run.name, what,
                                            net.scrub_credentials(str(exc)))
