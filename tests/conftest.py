"""Shared test settings: small thread count and fixed seeds so CPU runs are quick and repeatable."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
