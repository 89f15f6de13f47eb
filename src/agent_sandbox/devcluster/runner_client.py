"""Calls to a dev cluster's local runner over its control port (docs/devcluster.md "Local runner").

Owns: listing the runner's runtimes, crashing one as a dying container would, and the runtimes' lines in
`DevCluster.describe`. The runner itself (runner.py) runs as its own process; this side needs only the
port recorded in the cluster state, so it imports none of the runner's dependencies.

Failure modes: `ClusterError` (the cluster runs no runner, or the runner refused the call).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from agent_sandbox.devcluster.state import ClusterError, ClusterHandle


class RunnerClient(ClusterHandle):
    """The local runner's control calls on a running cluster (a base of `DevCluster`)."""

    def _runner_call(self, method: str, path: str) -> tuple[int, Any]:
        if not self.config.runner or "runner" not in self.state.ports:
            raise ClusterError(f"cluster {self.name!r} runs no local runner")
        req = urllib.request.Request(f"http://127.0.0.1:{self.state.ports['runner']}{path}", method=method)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def runtimes(self) -> list[dict[str, Any]]:
        """The runner's runtimes: namespace, pod, uid, ip, state, ready, restarts, workspace, claim, ports."""
        status, body = self._runner_call("GET", "/runtimes")
        if status != 200:
            raise ClusterError(f"runner answered {status}: {body}")
        return list(body)

    def crash_runtime(
        self, namespace: str, pod: str, *, noticed_after: float = 0.0, hard: bool = False
    ) -> dict[str, Any]:
        """Kill a pod's runtime as a dying container would: the pod turns NotReady (`noticed_after` s later, as
        a kubelet's probe notices), then Ready again. `hard`: as SIGKILL (requests in flight unanswered)."""
        params = {"noticed-after": str(noticed_after)} if noticed_after else {}
        if hard:
            params["hard"] = "true"
        query = "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
        status, body = self._runner_call("POST", f"/runtimes/{namespace}/{pod}/crash{query}")
        if status != 200:
            raise ClusterError(f"cannot crash the runtime of {namespace}/{pod}: {body}")
        return dict(body)

    def _describe_runtimes(self) -> list[str]:
        try:
            runtimes = self.runtimes()
        except (ClusterError, OSError, ValueError) as err:
            return [f"  runtimes: runner not answering ({err})"]
        lines = [f"  runtimes:   {len(runtimes)} (local runner, control port {self.state.ports['runner']})"]
        for rt in sorted(runtimes, key=lambda r: (r["namespace"], r["pod"])):
            where = f"claim {rt['claim']}" if rt["claim"] else "per-pod dir"
            lines.append(
                f"    {rt['namespace']}/{rt['pod']:<32} {rt['ip']:<15} {rt['state']:<11} "
                f"restarts {rt['restarts']}  processes {rt['processes']}  {where}"
            )
        return lines
