"""Runs on Spark executors: the tasks that launch and feed nodes, the supervisors, the node processes."""
