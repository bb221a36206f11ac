"""The feeding tasks (sending): what runs inside Spark's tasks to send a partition, or a stream's micro-batch,
to the node the driver picks.
"""
