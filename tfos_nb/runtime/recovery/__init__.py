"""Recovery with no user code: a job's backups, and the ledger of the rows each backup had trained on.

The node's side (the Keras backup in ``ctx.progress_callback()``, the element log of ``as_dataset``) and the
driver's side (the backup folder's owner, what the next attempt feeds) both read :mod:`.ledger`'s files, opened
through :mod:`.files` (the folder checked at every use, never a file through a link).
"""
