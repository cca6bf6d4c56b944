"""``python -m headway.cli``: how ``headway up`` starts its workers with this interpreter."""

from __future__ import annotations

from headway.cli.main import main

main()
