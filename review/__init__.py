"""Headway: the scheduling review (issue #28).

What ran is recorded in the store (``headway.store.history``); this package turns that
record into a scenario (``workload``: ``headway export workload``), replays it through
the scheduler core under today's layout and a proposed one (``compare``: ``headway
review``), and draws the result as one self-contained HTML file (``report``).
"""
