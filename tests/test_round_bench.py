"""``bench --only round`` (``diagnostics.round_bench``): every setup × batch size timed on both cores (and
plain decoding against transformers), the ratios taken within the run, the machine's facts beside the
table. Everyday tier: a tiny local model, 2 tokens, 1 repetition, about 10 s. The figures on the embedded
model are the bench's own output (``docs/``), not a test's."""

from __future__ import annotations

from diagnostics.models import load_model
from diagnostics.round_bench import machine_facts, markdown, round_table, setups


def test_every_setup_and_batch_size_is_timed_on_both_cores_with_the_ratio_taken_in_the_run(tiny_folder: str) -> None:
    target = load_model(tiny_folder)
    chosen = setups(layer=1)
    seen: list[dict] = []
    table = round_table(target, [5, 6, 7, 5, 6], chosen, [1, 3], tokens=2, repeat=1, progress=seen.append)
    assert seen == table and [(entry["setup"], entry["rows"]) for entry in table] == [
        (setup.label, rows) for setup in chosen for rows in (1, 3)]
    for entry in table:
        tensor, reference = entry["tensor_positions_per_s"], entry["reference_positions_per_s"]
        assert tensor > 0 and reference > 0
        assert abs(entry["tensor_over_reference"] - tensor / reference) <= 0.01 * entry["tensor_over_reference"] + 1e-3
        assert ("tensor_over_transformers" in entry) == entry["setup"].startswith("plain")
    text = markdown(table, machine_facts())
    assert text.startswith("| setup |") and text.count("\n| ") == len(table) and "Machine: " in text and "cores" in text


def test_the_machine_is_named_with_its_caches() -> None:
    facts = machine_facts()
    assert facts["cpu"] and facts["cores"] >= 1 and facts["torch_threads"] >= 1
    assert all(name.startswith("L") for name in facts["caches"])  # Linux lists them here; an empty dict elsewhere
