from setuptools import find_packages, setup

setup(
    name="tfos_nb",
    version="0.1.0",
    description="Distributed TensorFlow on Apache Spark, driven from a Jupyter notebook",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tfos_nb", "tfos_nb.*"]),
    python_requires=">=3.10",
    install_requires=[
        "pyspark>=4.1",  # the pipeline API uses Arrow UDFs (pyspark.sql.functions.arrow_udf)
        "tensorflow>=2.16",
        "tf-keras>=2.16",
        "tensorboard>=2.16",  # TensorFlow 2.21 no longer pulls it in; nodes start it on the chief
        "cloudpickle>=3.0",
        "pyarrow>=14",
        "numpy>=1.26",
        "pandas>=2.0,<3",  # pyspark 4.3 does not fully support pandas 3
    ],
    extras_require={
        "notebook": ["ipython>=8", "ipykernel>=6", "traitlets>=5", "jupyter_server>=2.14", "ipywidgets>=8.1,<9"],
    },
    # Enables the TensorBoard proxy server extension on install (jupyter server extension list).
    data_files=[("etc/jupyter/jupyter_server_config.d", ["jupyter-config/jupyter_server_config.d/tfos_nb.json"])],
    license="Apache-2.0",
)
