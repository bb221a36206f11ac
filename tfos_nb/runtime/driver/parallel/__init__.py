"""Parallel runs (``TFParallel``, ``%%tfos_parallel``): N independent single-node runs on Spark executors.

``runs``: the runs' job (``ParallelRuns``, ``start``, ``run``); ``control``: their controller and how a barrier
stage is checked to fit (loaded alone by Spark Connect's coordinator); ``results``: each run's result, the best one,
the live view.
"""
