"""Test configuration: 8 host CPU devices for JAX, set before jax is imported;
Ray on loopback, set before ray is imported."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Ray reads this when first imported: every node (and the JAX coordinator the
# host workers start on their node's address) on 127.0.0.1, loopback only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
