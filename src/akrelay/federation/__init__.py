"""Federation: replicating public knowledge from configured peer relays.

Accepting an old event is replication, not replay (Knowledge §8.1), so a peer's
records go through exactly the acceptance pipeline that ``POST /events`` uses;
this package only decides *what to fetch, from whom, and how carefully*.
"""
