"""Shared test configuration.

Fixtures that start private servers live in ``tests/support`` and are loaded here as plugins, so
every test directory can ask for them by name.
"""

pytest_plugins: list[str] = [
    "tests.support.postgres_server",
    "tests.support.redis_server",
    "tests.support.http_server",
    "tests.support.etcd_server",
]
