"""Drop-in replacements for other libraries' Redis locks, on lease_lock's Redis support.

- :mod:`lease_lock.compat.redis_py`: redis-py's ``redis.lock.Lock``.
- :mod:`lease_lock.compat.redis_lock`: python-redis-lock's ``redis_lock.Lock``.

Each keeps the original library's interface and its storage in Redis (key names, values, and
python-redis-lock's wake-up lists), so processes on the old library and on the shim exclude
each other on the same names while a fleet is upgraded one process at a time. Importing this
package imports no driver; each module needs the ``redis`` extra.
"""
