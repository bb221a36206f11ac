"""The control plane on the driver: the controller (the one writer of a cluster's state), the state it writes
and its views, the roles, the stall flag and the nodes' stacks.
"""
