"""``engine.records.position_record``, the one builder every program's position records go through (the
reference chain and tree from tensors, the tensor core from its host buffer). Everyday tier, < 0.1 s; the
cross-core agreement of whole runs is in ``test_chain_program.py`` and ``test_tree_program.py``."""

from __future__ import annotations

import numpy as np
import torch

from diagnostics.engine.records import DRAFT_FIELDS, PositionRecord, position_record


def _values(**more: object) -> dict:
    return {"p_token": torch.tensor(0.25, dtype=torch.float64), "u_fallback": np.float64(0.5), "entropy_p": 1.0,
            "p_top_ids": np.array([3.0, 1.0]), "p_top_probs": torch.tensor([0.5, 0.25]), "p_tail": 0.25,
            "draft_token": np.float64(3.0), "p_draft": 0.5, "q_draft": 0.4, "accept_prob": 1.0, "u_draft": 0.1,
            "u_accept": 0.2, "alpha": 0.9, "q_top_ids": [3, 2], "q_top_probs": [0.4, 0.3], "q_tail": 0.3,
            "allowed_size": np.float64(7.0), **more}


def _text(token: int) -> str:
    return f"<{token}>"


def test_numbers_become_python_numbers_whatever_their_source() -> None:
    record = position_record("rejected", 5, 2, 1, np.float64(9.0), _values(), _text)
    assert isinstance(record, PositionRecord) and (record.position, record.block, record.index_in_block) == (5, 2, 1)
    assert record.token == 9 and type(record.token) is int and record.draft_token == 3 and type(record.draft_token) is int
    assert type(record.p_token) is float and record.p_token == 0.25 and record.u_fallback == 0.5
    assert record.p_top_ids == [3, 1] and all(type(v) is int for v in record.p_top_ids)
    assert record.p_top_probs == [0.5, 0.25] and all(type(v) is float for v in record.p_top_probs)
    assert record.allowed_size == 7 and type(record.allowed_size) is int
    assert (record.token_text, record.draft_text) == ("<9>", "<3>")


def test_an_accepted_draft_used_no_fallback_uniform() -> None:
    assert position_record("accepted", 0, 0, 0, 3, _values(), _text).u_fallback is None


def test_a_bonus_keeps_no_draft_field_and_its_own_uniform() -> None:
    record = position_record("bonus", 0, 0, 0, 4, _values(), _text)
    assert all(getattr(record, name) in (None, []) for name in DRAFT_FIELDS) and record.draft_text is None
    assert record.u_fallback == 0.5 and record.p_top_ids == [3, 1]


def test_a_top_choice_has_no_draft_uniform_and_absent_fields_stay_none() -> None:
    record = position_record("accepted", 0, 0, 0, 3, _values(u_draft=float("nan"), severe_overshoot=None), _text,
                             tree_node=-1)
    assert record.u_draft is None and record.severe_overshoot is None and record.tv_target is None
    assert record.tree_node == -1
