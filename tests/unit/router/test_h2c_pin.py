"""What an h2c connection is pinned to: the route fields that select the sandbox, not `X-Sandbox-Timeout`."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest

from agent_sandbox.router._h2c_routing import _PINNED_FIELDS, _pin_of, _routing
from agent_sandbox.router._routing import Route, parse_route

BASE = Route("sb", "ns", 9090, ipaddress.ip_address("10.0.0.7"), "uid-1", 30.0)


def test_every_route_field_is_decided_on() -> None:
    """A field added to `Route` must be classed as pinned (it selects the target) or not (here)."""
    assert {f.name for f in dataclasses.fields(Route)} == {*_PINNED_FIELDS, "timeout"}


@pytest.mark.parametrize(
    "change",
    [
        {"sandbox_id": "other"},
        {"namespace": "other"},
        {"port": 8080},
        {"pod_ip": ipaddress.ip_address("10.0.0.8")},
        {"pod_ip": None},
        {"uid": "uid-2"},
        {"uid": None},
    ],
)
def test_a_field_that_selects_the_target_breaks_the_pin(change: dict[str, object]) -> None:
    assert _pin_of(dataclasses.replace(BASE, **change)) != _pin_of(BASE)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [None, 0.5, 31.0, 600.0])
def test_the_timeout_does_not(timeout: float | None) -> None:
    assert _pin_of(dataclasses.replace(BASE, timeout=timeout)) == _pin_of(BASE)


def test_x_sandbox_timeout_is_not_read_on_h2c() -> None:
    """Ignored, not validated (docs/router.md): an invalid or repeated value refuses nothing."""
    headers = [
        ("x-sandbox-id", "sb"),
        ("x-sandbox-timeout", "not-a-number"),
        ("X-Sandbox-Timeout", "5"),
        ("authorization", "Bearer t"),
    ]
    routing, dups, authorization = _routing(headers)
    assert (routing, dups, authorization) == ({b"x-sandbox-id": b"sb"}, set(), b"Bearer t")
    assert parse_route(routing, dups).timeout is None
