"""The control plane on the driver: the controller (the one writer of a cluster's state), the state it writes
and its views, the node and cluster states with their transitions (``states.py``), the roles, the stall flag and
the nodes' stacks.
"""
