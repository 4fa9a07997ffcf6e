"""The wire protocol's constants, kept importable here for code written against earlier versions.

They live in :mod:`lease_lock.wire`, below both the server and the HTTP client.
"""

from ..wire import *  # noqa: F403 - a re-export of the whole module
from ..wire import __all__ as __all__
