"""policy: see docs/scheduler-internals.md."""
