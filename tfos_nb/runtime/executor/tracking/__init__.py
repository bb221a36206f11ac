"""MLflow on the node (the notebook's side: :mod:`tfos_nb.runtime.driver.tracking`).
"""
