"""index: see docs/scheduler-internals.md."""
