"""Runs in the notebook's (Spark driver's) process: start clusters and parallel runs, feed them, watch them."""
