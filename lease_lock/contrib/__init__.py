"""Framework integrations: Django, Flask, Celery and RQ.

Each lives in its own module and imports its framework, so import only the one you use:
``lease_lock.contrib.django`` (an app with settings, a system check, a migration and
``SingletonCommand``), ``lease_lock.contrib.flask`` (the ``LeaseLock`` extension),
``lease_lock.contrib.celery`` (``SingletonTask``) and ``lease_lock.contrib.rq`` (``enqueue_once``
and ``singleton``). Importing ``lease_lock`` never imports any of them.

Each finds its lock store in the same order: its own setting, then the ``LEASE_LOCK_URL``
environment variable, then the framework's own store (Django's default database, Celery's Redis
broker, RQ's Redis connection, Flask-SQLAlchemy's database). When none applies it raises
``ValidationError`` at start-up instead of falling back to a file on one host.
"""

__all__: list[str] = []
