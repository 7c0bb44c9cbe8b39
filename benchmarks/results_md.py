"""Writing one ``## name`` section of benchmarks/RESULTS.md, keeping every other section as it is."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(heading: str, section: str, path: Path = RESULTS) -> None:
    """Replace the section that starts with the line ``heading`` (``## name``) by ``section`` (which starts with the
    same line), up to the next ``## `` heading; append it when the file has no such section."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    start = text.find(f"\n{heading}\n")
    section = section.strip() + "\n"
    if start >= 0:
        end = text.find("\n## ", start + len(heading) + 2)
        text = text[:start + 1] + section + (text[end:] if end >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text)
