"""transformers' assisted generation drafts what the bench and the audit say it drafts.

transformers reads γ and its confidence stop from the assistant's ``generation_config``, not from
``generate``'s keyword arguments; ``hf_assisted.assistant_settings`` sets them there.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation import candidate_generator

from diagnostics.hf_assisted import assistant_settings, fixed_gamma
from diagnostics.tiny import tiny_llama


@pytest.fixture
def draft_lengths(monkeypatch) -> list[int]:
    lengths: list[int] = []
    original = candidate_generator.AssistedCandidateGenerator.get_candidates

    def spy(self, input_ids, **kwargs):
        ids, logits = original(self, input_ids, **kwargs)
        lengths.append(ids.shape[1] - input_ids.shape[1])
        return ids, logits

    monkeypatch.setattr(candidate_generator.AssistedCandidateGenerator, "get_candidates", spy)
    return lengths


def _generate(model, **kwargs) -> None:
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, min_new_tokens=30, do_sample=True, top_k=0,
                   assistant_early_exit=2, pad_token_id=0, **kwargs)


def test_generate_keywords_do_not_reach_the_assistant_but_its_config_does(draft_lengths) -> None:
    model = tiny_llama(3, vocab=40, layers=4).model
    torch.manual_seed(0)
    _generate(model, num_assistant_tokens=4, num_assistant_tokens_schedule="constant")
    ignored = list(draft_lengths)
    assert max(ignored) < 4  # the keywords were ignored: its confidence stop at 0.4 cut every block short
    draft_lengths.clear()
    with assistant_settings(model, fixed_gamma(4)):
        _generate(model)
    assert set(draft_lengths[:-1]) == {4}  # every block but a short last one drafts exactly 4
    assert model.generation_config.num_assistant_tokens is None  # restored after the call
    with pytest.raises(ValueError, match="not assistant settings"):
        with assistant_settings(model, {"gamma": 4}):
            pass
