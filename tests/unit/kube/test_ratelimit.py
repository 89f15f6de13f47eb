"""Rate limiters: token bucket, per-item exponential backoff, max-of, controller default."""

from __future__ import annotations

import pytest

from agent_sandbox.kube import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    TokenBucket,
    default_controller_rate_limiter,
)
from agent_sandbox.kube.testing import FakeClock

pytestmark = pytest.mark.unit


def test_token_bucket_burst_then_paced() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10.0, 3, clock=clock)
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)  # reservations queue up
    clock.advance(1.0)  # refill: 10 tokens, capped at burst 3, minus the 2 borrowed
    assert bucket.reserve() == 0.0


def test_token_bucket_non_positive_qps_is_unlimited() -> None:
    bucket = TokenBucket(-1, 10)
    assert bucket.unlimited
    assert all(bucket.reserve() == 0.0 for _ in range(1000))
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(5, 0)


def test_item_exponential_doubles_caps_and_forgets() -> None:
    rl = ItemExponentialFailureRateLimiter(0.005, 1000.0)
    delays = [rl.when("a") for _ in range(20)]
    assert delays[:5] == [0.005, 0.01, 0.02, 0.04, 0.08]
    assert delays[-1] == 1000.0
    assert max(delays) == 1000.0
    assert rl.when("b") == 0.005  # per item
    assert rl.num_requeues("a") == 20
    rl.forget("a")
    assert rl.num_requeues("a") == 0
    assert rl.when("a") == 0.005
    for _ in range(200):  # no float overflow for huge failure counts
        rl.when("c")
    assert rl.when("c") == 1000.0


def test_max_of_takes_the_longest_delay() -> None:
    clock = FakeClock()
    rl = MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0), BucketRateLimiter(1.0, 1, clock=clock)
    )
    assert rl.when("a") == 0.005  # bucket has its one token
    assert rl.when("b") == pytest.approx(1.0)  # bucket empty: 1 s > 5 ms
    assert rl.num_requeues("a") == 1
    rl.forget("a")
    assert rl.num_requeues("a") == 0


def test_controller_default_is_5ms_exponential_with_10qps_100_burst_bucket() -> None:
    clock = FakeClock()
    rl = default_controller_rate_limiter(clock=clock)
    first = [rl.when(f"k{i}") for i in range(100)]
    assert first == [0.005] * 100
    assert rl.when("k100") == pytest.approx(0.1)  # 101st distinct failure waits for the 10 qps bucket
