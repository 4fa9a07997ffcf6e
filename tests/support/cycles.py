"""Reference cycles left by a call: what only Python's cyclic collector would free.

An exception kept by a frame its traceback passes through (a local of the frame that caught
it, say) makes such a cycle, and it keeps alive every frame of that traceback and every frame
those were called from, with their locals: a lock its holder has dropped among them, which is
then given back only when a collection runs instead of at the drop.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable

__all__ = ["collector_off", "errors_left_in_cycles"]


@contextmanager
def collector_off() -> Iterator[None]:
    """Run the block with the cyclic collector off, from a clean start: what the block leaves
    in reference cycles stays there, and whatever it frees is freed by reference counting."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def errors_left_in_cycles(call: Callable[[], object]) -> list[BaseException]:
    """The exceptions that ``call`` left in reference cycles (run with the collector off)."""
    with collector_off():
        try:
            call()
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            return [found for found in gc.garbage if isinstance(found, BaseException)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
