"""Counter-based uniforms: deterministic, uniform, independent across slots and positions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from diagnostics.gof import chi_square_gof, gof_tokens
from diagnostics.rng import SLOTS, sample_inverse_cdf, sample_token, uniforms

N = 200_000
LEVEL = 1e-4


def test_pure_function_of_the_key() -> None:
    positions = torch.arange(1000)
    first = uniforms(7, positions, "accept")
    assert torch.equal(first, uniforms(7, positions, "accept"))
    assert torch.equal(first[123], uniforms(7, 123, "accept"))
    assert not torch.equal(first, uniforms(8, positions, "accept"))
    assert first.dtype == torch.float64 and ((first >= 0) & (first < 1)).all()


@pytest.mark.parametrize("slot", sorted(SLOTS))
def test_uniform_marginals(slot: str) -> None:
    u = uniforms(0, torch.arange(N), slot).numpy()
    assert stats.kstest(u, "uniform").pvalue > LEVEL
    counts = torch.histc(torch.from_numpy(u), bins=64, min=0, max=1)
    assert chi_square_gof(counts, torch.full((64,), 1 / 64)).p_value > LEVEL


def test_uniform_across_seeds_at_a_fixed_position() -> None:
    u = uniforms(torch.arange(N), 17, "draft").numpy()
    assert stats.kstest(u, "uniform").pvalue > LEVEL


def _pair_independence(u: np.ndarray, v: np.ndarray) -> float:
    """χ² p-value that ``(u, v)`` is uniform on a 16 × 16 grid."""
    cells = (np.floor(u * 16) * 16 + np.floor(v * 16)).astype(np.int64)
    counts = torch.bincount(torch.from_numpy(cells), minlength=256)
    return chi_square_gof(counts, torch.full((256,), 1 / 256)).p_value


def test_independent_across_slots_positions_seeds_and_siblings() -> None:
    positions = torch.arange(N)
    draft = uniforms(3, positions, "draft").numpy()
    checks = {
        "draft vs accept": uniforms(3, positions, "accept").numpy(),
        "accept vs fallback": uniforms(3, positions, "fallback").numpy(),
        "position t vs t+1": uniforms(3, positions + 1, "draft").numpy(),
        "seed vs seed+1": uniforms(4, positions, "draft").numpy(),
        "sibling 0 vs 1": uniforms(3, positions, "draft", sibling=1).numpy(),
    }
    for label, other in checks.items():
        assert abs(np.corrcoef(draft, other)[0, 1]) < 0.015, label
        assert _pair_independence(draft, other) > LEVEL, label


def test_bad_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown rng slot"):
        uniforms(0, 0, "coin")
    with pytest.raises(ValueError, match="non-negative"):
        uniforms(-1, 0, "draft")


def test_inverse_cdf_follows_the_law() -> None:
    law = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0], dtype=torch.float64)
    tokens = sample_inverse_cdf(law, uniforms(0, torch.arange(N), "draft"))
    result = gof_tokens(tokens, law)
    assert result.impossible == 0 and result.p_value > LEVEL


def test_inverse_cdf_order_and_edges() -> None:
    law = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0], dtype=torch.float64)
    u = torch.tensor([0.0, 0.2499, 0.25, 0.9999, 1 - 2**-53])
    assert sample_inverse_cdf(law, u).tolist() == [1, 1, 3, 3, 3]
    batch = torch.stack([law, law.flip(0)])
    assert sample_inverse_cdf(batch, torch.tensor([0.1, 0.1])).tolist() == [1, 1]
    assert sample_inverse_cdf(batch, torch.tensor([[0.1, 0.9], [0.1, 0.9]])).tolist() == [[1, 3], [1, 3]]
    # Unnormalised float32 input with a total that rounds: never past the last positive token.
    odd = torch.tensor([0.3, 0.3, 0.3, 0.0], dtype=torch.float32)
    assert sample_inverse_cdf(odd, torch.tensor([1 - 2**-53])).item() == 2


def test_sample_token_is_the_inverse_cdf_bit_for_bit() -> None:
    """The engine's one-token path must pick exactly the token of the batched inverse CDF."""
    generator = torch.Generator().manual_seed(3)
    laws = [torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0], dtype=torch.float64),
            torch.tensor([0.3, 0.3, 0.3, 0.0], dtype=torch.float32)]
    for vocab in (2, 7, 1000, 49152):
        law = torch.rand(vocab, generator=generator, dtype=torch.float64) ** 8
        law[torch.rand(vocab, generator=generator) < 0.3] = 0.0
        law[vocab // 2] += 1e-3
        laws += [law, (law / law.sum()).to(torch.float32)]
    edges = [0.0, 1e-300, 0.25, 0.2499999, 0.5, 1 - 2**-53, 1 - 2**-40]
    for law in laws:
        for u in edges + torch.rand(200, generator=generator, dtype=torch.float64).tolist():
            assert sample_token(law, u) == int(sample_inverse_cdf(law, torch.tensor(u))), (law.shape, u)
    for bad in (torch.tensor([0.5, -0.1, 0.6]), torch.tensor([0.5, float("nan")]), torch.tensor([1.0, float("inf")]),
                torch.zeros(3)):
        with pytest.raises(ValueError):
            sample_token(bad, 0.5)


def test_independence_check_catches_a_weak_stream() -> None:
    """Negative control: a Weyl sequence is perfectly uniform but neighbours lie on a line."""
    positions = np.arange(N, dtype=np.float64)
    weyl = np.mod(positions * 0.6180339887498949, 1.0)
    assert stats.kstest(weyl, "uniform").pvalue > LEVEL
    assert _pair_independence(weyl, np.mod((positions + 1) * 0.6180339887498949, 1.0)) < LEVEL
