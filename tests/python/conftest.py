"""Fixtures the API tests share: `srv`, the scripted mock server (`--mock`,
4 sequences at once; see serverproc.py and src/server/port_mock.c), one per
test module, and `client`, the official openai client bound to it. A module
that needs other flags or the real tiny model defines its own `srv`."""

import pytest

from serverproc import Server


@pytest.fixture(scope="module")
def srv():
    with Server(mock=True, args=["--parallel", "4"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()
