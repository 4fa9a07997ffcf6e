"""Settings for running the test project as a real ``manage.py`` process.

``DJANGO_TEST_SQLITE`` names the SQLite file of the ``default`` database; ``LEASE_LOCK_TEST_URL``
(default ``django://default``), ``LEASE_LOCK_TEST_PREFIX`` and ``LEASE_LOCK_TEST_METRICS`` fill
``LEASE_LOCK``.
"""

import os

SECRET_KEY = "lease-lock-tests"  # noqa: S105 - a throwaway key for a test-only site
USE_TZ = True
INSTALLED_APPS = ["lease_lock.contrib.django", "tests.integration.django_project"]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("DJANGO_TEST_SQLITE", "site.db")}
}
LEASE_LOCK = {
    "URL": os.environ.get("LEASE_LOCK_TEST_URL", "django://default"),
    "KEY_PREFIX": os.environ.get("LEASE_LOCK_TEST_PREFIX", ""),
    "METRICS": os.environ.get("LEASE_LOCK_TEST_METRICS") or None,
}
