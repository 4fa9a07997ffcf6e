"""Migrations of the ``lease_lock`` Django app."""

__all__: list[str] = []
