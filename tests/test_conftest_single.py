"""Tests import helpers with ``from conftest import ...``. Pytest puts each conftest.py on
``sys.modules["conftest"]`` in turn, so a second conftest.py under tests/ shadows the first and
those imports fail at collection, depending on which folders a run collects (CI collects all)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_tests_have_one_conftest_so_from_conftest_imports_name_one_module():
    found = sorted(p.relative_to(TESTS).as_posix() for p in TESTS.rglob("conftest.py"))
    assert found == ["conftest.py"], f"move fixtures of {found} into tests/conftest.py"
