"""The README's configuration table is what `ashd config` prints: settings and docs cannot drift."""

from __future__ import annotations

from pathlib import Path

from ashd.config import options_markdown

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_configuration_table_matches_the_settings() -> None:
    lines = README.read_text().splitlines()
    start = lines.index(next(line for line in lines if line.startswith("| variable | accepts")))
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    assert "\n".join(lines[start:end]) == options_markdown().strip(), (
        "README.md's configuration table is stale: paste the output of `ashd config` over it"
    )
