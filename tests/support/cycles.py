"""Reference cycles left by a call: what only Python's cyclic collector would free.

An exception kept by a frame its traceback passes through (a local of the frame that caught
it, say) makes such a cycle, and it keeps alive every frame of that traceback and every frame
those were called from, with their locals: a lock its holder has dropped among them, which is
then given back only when a collection runs instead of at the drop.
"""

from __future__ import annotations

import gc
from typing import Callable

__all__ = ["errors_left_in_cycles"]


def errors_left_in_cycles(call: Callable[[], object]) -> list[BaseException]:
    """The exceptions that ``call`` left in reference cycles (run with the collector off)."""
    gc.collect()
    gc.disable()
    try:
        call()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return [found for found in gc.garbage if isinstance(found, BaseException)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
