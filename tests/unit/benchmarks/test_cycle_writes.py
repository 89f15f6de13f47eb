"""The cycle benchmark's read count: kube-apiserver's request counter summed per verb and resource."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from benchmarks.cycle_writes import _requests
from benchmarks.promtext import parse

METRICS = """\
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",group="extensions.agents.x-k8s.io",resource="sandboxclaims",scope="resource",subresource="",verb="GET",version="v1beta1"} 7
apiserver_request_total{code="404",component="apiserver",group="extensions.agents.x-k8s.io",resource="sandboxclaims",scope="resource",subresource="",verb="GET",version="v1beta1"} 2
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="resource",subresource="log",verb="GET",version="v1"} 1
apiserver_request_total{code="201",component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 40
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="WATCH",version="v1"} 5
"""


class _Bench:
    async def scrape_apiserver(self) -> Any:
        return parse(METRICS)


def test_reads_are_summed_over_codes_and_split_by_subresource() -> None:
    counts = asyncio.run(_requests(cast(Any, _Bench())))
    assert counts == {"GET sandboxclaims": 9, "LIST pods": 3, "GET pods/log": 1}
