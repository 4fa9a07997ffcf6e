"""``python -m lease_lock``: the ``lease-lock`` command."""

from .cli import main

__all__: list[str] = []

if __name__ == "__main__":
    raise SystemExit(main())
