"""The node's feed (receiving): the data server that feeding tasks connect to, the hub that queues what they
bring, the ``DataFeed`` the user's function reads, and the named sets (a validation or test set fed once).
"""
