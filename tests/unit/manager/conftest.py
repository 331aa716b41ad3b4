"""Fixtures of the manager unit tests (fakes live in manager_fakes.py)."""

from __future__ import annotations

import pytest
from manager_fakes import FakeLoader


@pytest.fixture
def loader() -> FakeLoader:
    return FakeLoader()
