"""What every benchmark does with its figures: the JSON (all of it) and a readable table beside it
(same name, .md), and the table on stdout."""

from __future__ import annotations

import json
from pathlib import Path


def save(out: str | Path, result: dict, table: str) -> None:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    path.with_suffix(".md").write_text(table.rstrip("\n") + "\n")
    print(table)
