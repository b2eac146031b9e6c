"""``python -m shardstream`` runs the command-line tool."""

from __future__ import annotations

from shardstream.cli import main

__all__: list[str] = []

raise SystemExit(main())
