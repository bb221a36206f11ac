"""Feeding a running cluster from the driver: batch data (one Spark job a feed), named sets, streaming, and
each epoch's shares.
"""
