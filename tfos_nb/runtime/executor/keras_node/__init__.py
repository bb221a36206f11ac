"""Keras on the node: the progress callback, every epoch as long as its data, whether the Keras asked for
loads, and Keras 3's repairs under ``MultiWorkerMirroredStrategy``.
"""
