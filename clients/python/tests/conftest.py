"""Fixtures for the client tests: a real ``ce serve`` started by the Rust test
``crates/ce-cli/tests/cli/python_client.rs``, which passes its URL and API keys:

- ``CE_TEST_URL``: the server;
- ``CE_TEST_KEY_A`` / ``CE_TEST_KEY_B``: tenant keys of the accounts ``CE_TEST_ACCOUNT_A`` and
  ``CE_TEST_ACCOUNT_B``;
- ``CE_TEST_KEY_ADMIN``: an admin key.

A missing variable fails the run: these tests never skip.
"""

from __future__ import annotations

import os
import uuid
from typing import Iterator

import pytest

from contextengine import Client


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: run these tests through `cargo test python_client`")
    return value


@pytest.fixture(scope="session")
def url() -> str:
    return env("CE_TEST_URL")


@pytest.fixture(scope="session")
def key_a() -> str:
    return env("CE_TEST_KEY_A")


@pytest.fixture(scope="session")
def key_b() -> str:
    return env("CE_TEST_KEY_B")


@pytest.fixture(scope="session")
def key_admin() -> str:
    return env("CE_TEST_KEY_ADMIN")


@pytest.fixture(scope="session")
def account_a() -> str:
    return env("CE_TEST_ACCOUNT_A")


@pytest.fixture(scope="session")
def account_b() -> str:
    return env("CE_TEST_ACCOUNT_B")


@pytest.fixture
def ce(url: str, key_a: str) -> Iterator[Client]:
    """A client with account A's tenant key."""
    with Client(url, api_key=key_a) as c:
        yield c


@pytest.fixture
def ce_b(url: str, key_b: str) -> Iterator[Client]:
    """A client with account B's tenant key."""
    with Client(url, api_key=key_b) as c:
        yield c


@pytest.fixture
def admin(url: str, key_admin: str) -> Iterator[Client]:
    """A client with the admin key."""
    with Client(url, api_key=key_admin) as c:
        yield c


@pytest.fixture
def root(account_a: str) -> str:
    """A fresh subtree of account A for one test (tests share the server)."""
    return f"ctx://{account_a}/py-{uuid.uuid4().hex[:12]}"
