"""index: the answers the policy would give, remembered between events, and when they
still stand (``validity``). Read them through ``view``; see
docs/scheduler-internals.md."""
