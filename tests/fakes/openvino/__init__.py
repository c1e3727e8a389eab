"""A fake ``openvino`` for tests/test_openvino_worker.py: only ``Tensor`` built from nested lists,
which is all the OpenVINO GenAI worker takes from it."""


class Tensor:
    """A tensor made from a nested list; ``data`` gives the rows back."""

    def __init__(self, data: list) -> None:
        self.data = [list(row) for row in data]
