"""The bundled runtime: TensorFlow clusters on Spark executors (no IPython here).

Import what you need from the submodules; this package stays light so that
the node processes it starts import fast.
"""
