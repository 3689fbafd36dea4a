"""Test configuration: 8 host CPU devices for JAX, set before jax is imported;
Ray on loopback, set before ray is imported."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Ray reads this when first imported: every node (and the JAX coordinator the
# host workers start on their node's address) on 127.0.0.1, loopback only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from pathlib import Path

import pytest

SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")
"""Tests the fast tier leaves out (``pytest -m "not slow"``), measured by
``tools/list_slow_tests.py`` from a full run; ``@pytest.mark.slow`` marks others."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    listed = {
        line.strip()
        for line in SLOW_TESTS.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)
