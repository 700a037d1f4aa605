"""The package's folders tell the life of a task (docs: explanation/architecture, "Where each step
lives"): its root keeps the public face and what every stage shares, and each moving part lives in
the folder of its stage."""

from pathlib import Path

import timeouts

PACKAGE = Path(timeouts.__file__).resolve().parent
# Modules directly in timeouts/, __init__.py included; a newcomer reads them all at a glance.
MOST_AT_THE_ROOT = 15


def test_the_root_holds_few_modules():
    modules = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(modules) <= MOST_AT_THE_ROOT, (
        f"timeouts/ holds {len(modules)} modules, {modules}: move one into the folder of its stage")
