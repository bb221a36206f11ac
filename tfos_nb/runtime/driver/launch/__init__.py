"""Launching a cluster: ``run()``, the task slots it needs, resources per role, the launch stages and the
Spark job that runs them, and waiting for the nodes.
"""
