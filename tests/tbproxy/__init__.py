"""The TensorBoard proxy (``tfos_nb.tbproxy``) through real Jupyter servers: its fixtures are ``conftest.py``."""
