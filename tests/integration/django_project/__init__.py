"""A tiny Django app for the integration tests: one view that locks, and management commands.

``gate`` lets a test hold a command inside ``handle()`` until it has seen what it wants.
"""
