"""A node's processes on an executor: the Spark tasks that launch them, the supervisor that owns each, the
node's own process, and parallel runs' tasks and processes.
"""
