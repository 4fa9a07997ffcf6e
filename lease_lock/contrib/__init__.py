"""Framework integrations: Django, Flask, Celery and RQ.

Each lives in its own module and imports its framework, so import only the one you use:
``lease_lock.contrib.django`` (an app with settings, a migration and ``SingletonCommand``),
``lease_lock.contrib.flask`` (the ``LeaseLock`` extension), ``lease_lock.contrib.celery``
(``SingletonTask``) and ``lease_lock.contrib.rq`` (``singleton``). Importing ``lease_lock`` never
imports any of them.
"""

__all__: list[str] = []
