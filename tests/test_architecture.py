"""The layout is a checked architecture: import contracts, a small package root, a short README,
and a project that speaks of itself (no history of how it got here)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sailor_tasks"

HISTORY = re.compile(
    r"\bstop \d+\b|\bissues? #?\d+\b|\bearlier (?:runs?|code|stops?|versions?) (?:compared|took|measured|ran)\b",
    re.IGNORECASE,
)
"""Accounts of earlier work ("stop 12's code took…", "issue #9", "earlier runs compared…")."""


def test_import_contracts_are_declared_and_kept():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    kinds = {c["type"] for c in config["contracts"]}
    assert len(config["contracts"]) >= 4 and {"layers", "forbidden", "acyclic_siblings"} <= kinds
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_package_root_holds_only_the_shared_vocabulary():
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 8, modules


def test_readme_is_a_first_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; reference belongs in docs/"


def test_the_project_speaks_of_itself_only():
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for folder in ("sailor_tasks", "bench", "dags", "plugins", "docker"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".yaml", ".sql", ".Dockerfile")]
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert found == [], "\n".join(found)
