"""TensorBoard's runtime halves, one module a side, and what every side of TensorBoard shares.

``chief.py`` runs on the chief's executor (its TensorBoard process, reported once it answers);
``news.py`` on the driver (what the driver takes from the chief's heartbeat).  ``ports.py`` is the
one port finder (which port a process listens on, who owns a listening port) and ``urls.py`` the one
URL checker (what a TensorBoard's address may be): both standard library only, called by the chief,
the driver, the kernel (``tfos_nb.tensorboard``) and the Jupyter server's proxy
(``tfos_nb.tensorboard.proxy``).  Those notebook-side halves live above the runtime, in
``tfos_nb/tensorboard/``: the runtime never imports them.  Importing this package imports nothing.
"""
