"""Which waiting rows join a continuous batch next: shared by the per-row driver and the round program."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class Admission:
    """The rows not yet started, in prompt order. ``take(free)`` starts up to ``free`` of them (calling
    ``on_start`` for each); once one row has started, a batch-wide ``stop_all`` that says stop keeps every
    row still waiting from starting (their result stays ``None``)."""

    def __init__(self, count: int, stop_all: Callable[[], bool] | None, on_start: Callable[[int], None] | None) -> None:
        self.waiting = deque(range(count))
        self.stop_all, self.on_start = stop_all, on_start
        self.started = 0

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def take(self, free: int) -> list[int]:
        taken: list[int] = []
        while self.waiting and len(taken) < free:
            if self.started and self.stop_all is not None and self.stop_all():
                self.waiting.clear()  # stopped: rows not yet begun never start
                break
            index = self.waiting.popleft()
            self.started += 1
            if self.on_start is not None:
                self.on_start(index)
            taken.append(index)
        return taken
