"""The data plane's payloads: rows and Arrow record batches and numpy columns (``columns``), an RDD's Python rows
packed into batches as they stream (``rowpack``), and inference results back to rows (``results``); the wire that
carries them is :mod:`..protocol.dataplane`."""
