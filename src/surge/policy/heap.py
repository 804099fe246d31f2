"""When a long-lived process freezes its heap out of the cyclic collector, and when it thaws it.

CPython's full collection walks every tracked object. A controller at 10,000 replicas
and 1,000 routers holds a few hundred thousand of them (replica records, the members'
connections) that live as long as the members do, and a full collection took 100-300
ms on a 2-core machine, inside whichever tick allocated last: the loaded tick's p99.
Almost nothing such a collection walks is garbage, so once one is slow, what survived
it is frozen (`gc.freeze`): later collections walk only what came since, and the next
slow one freezes that too. A frozen object is still freed when its last reference goes;
only a cycle among frozen objects is never collected, so once the members fall below
half of what they were while frozen, the heap thaws (`gc.unfreeze`) and the next full
collection frees what the departed left (and, if slow, freezes what is left).

Pure: the shell (controller/heap.py) measures the collections and counts the members.
"""

from __future__ import annotations

import enum

__all__ = ["SLOW_FULL_COLLECTION_S", "THAW_BELOW", "HeapStep", "heap_step"]

# A full collection this long is mostly walking long-lived objects: freeze them. Well
# under a tick (0.1 s), and over what one takes for a controller of a few hundred members.
SLOW_FULL_COLLECTION_S = 0.01
# Thaw once the members fall below this share of the most the frozen heap held.
THAW_BELOW = 0.5


class HeapStep(enum.Enum):
    KEEP = "keep"
    FREEZE = "freeze"
    THAW = "thaw"


def heap_step(full_collection_s: float | None, members: int, frozen_for: int | None
              ) -> HeapStep:
    """`full_collection_s`: the longest full collection since the last step (None:
    none ran); `members`: how many members the process serves now; `frozen_for`: the
    most it served while its heap was frozen (None: nothing frozen)."""
    if frozen_for is not None and members < THAW_BELOW * frozen_for:
        return HeapStep.THAW
    if full_collection_s is not None and full_collection_s >= SLOW_FULL_COLLECTION_S:
        return HeapStep.FREEZE
    return HeapStep.KEEP
