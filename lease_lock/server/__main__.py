"""``python -m lease_lock.server serve|service-keys ...``: the service commands without the main CLI."""

from .cli import main

__all__: list[str] = []

raise SystemExit(main())
