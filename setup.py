import os
import re

from setuptools import find_packages, setup
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def _version() -> str:
    """The one version: ``__version__`` in tfos_nb/__init__.py (read, not imported)."""
    with open(os.path.join(HERE, "tfos_nb", "__init__.py"), encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M).group(1)


def _readme() -> str:
    path = os.path.join(HERE, "README.md")
    return open(path, encoding="utf-8").read() if os.path.exists(path) else ""


class _Distribution(Distribution):
    """setuptools' editable installs ask the distribution ``has_data()`` before installing ``data_files``
    (distutils names it ``has_data_files``), so `pip install -e .` left the server extension's config out."""

    def has_data(self) -> bool:
        return bool(self.has_data_files())


# The floors are what scripts/check_floor.sh installs (requirements-floor.txt): tested, not guessed.
NOTEBOOK = ["ipython>=8.18", "ipykernel>=6.29", "traitlets>=5.14", "jupyter_server>=2.18", "ipywidgets>=8.1,<9"]
EXAMPLES = ["scikit-learn>=1.2.2"]  # tfos_nb.examples: the digits data set ships inside scikit-learn
MLFLOW = ["mlflow-skinny>=2.16"]  # experiment tracking: the MLflow client only (the notebook logs; nodes need nothing)

setup(
    name="tfos_nb",
    version=_version(),
    description="Distributed TensorFlow on Apache Spark, driven from a Jupyter notebook",
    long_description=_readme(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tfos_nb", "tfos_nb.*"]),
    python_requires=">=3.10",
    install_requires=[
        "tensorflow>=2.16",
        # not tf-keras: each tf-keras X.Y needs tensorflow X.Y, and pip, free to pick the newest, upgraded an
        # installed TensorFlow to match it. keras="tf_keras" (the default) needs the one for your TensorFlow:
        # pip install "tf-keras~=X.Y.0"; a node without it fails at once saying so (executor/keras_node/flavour.py)
        "tensorboard>=2.16",  # TensorFlow 2.21 no longer pulls it in; nodes start it on the chief
        "cloudpickle>=3.0",
        "pyarrow>=14.0.2",
        "numpy>=1.26",
        "pandas>=2.0,<3",  # pyspark 4.3 does not fully support pandas 3
    ],
    extras_require={
        # not a requirement: a platform's own Spark (Databricks, EMR, Dataproc) is not always a pip distribution, and
        # pip would install PyPI's pyspark over it. 3.5: barrier mapInArrow; arrow_udf (4.1) when present.
        "spark": ["pyspark>=3.5"],
        "notebook": NOTEBOOK,
        # Spark Connect sessions (Databricks serverless, standard access): 4.0 is the floor tested
        # (requirements-floor-connect.txt); its client needs protobuf >= 5, so TensorFlow >= 2.18 beside it
        "connect": ["pyspark[connect]>=4.0"],
        "examples": EXAMPLES,
        "mlflow": MLFLOW,
        "all": ["pyspark[connect]>=4.0", *NOTEBOOK, *EXAMPLES, *MLFLOW],
    },
    # Enables the TensorBoard proxy server extension on install (jupyter server extension list);
    # editable installs too, through _Distribution.
    data_files=[("etc/jupyter/jupyter_server_config.d", ["jupyter-config/jupyter_server_config.d/tfos_nb.json"])],
    license="Apache-2.0",
    license_files=["LICENSE"],
    distclass=_Distribution,
    classifiers=[
        "Framework :: Jupyter",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
