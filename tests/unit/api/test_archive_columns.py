"""The SandboxArchive CRD's printer columns: `kubectl get sbarchive` shows the `expired-at` mark.

Until December 6 an expired `Retain` archive (never restored) looked like a restorable one in the listing.
The API server's rendering: tests/integration/lifecycle/test_restore_refused.py.
"""

from __future__ import annotations

import pytest
import yaml

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.crdgen._archive import archive_crd
from agent_sandbox.manifests import REPO_ROOT

pytestmark = pytest.mark.unit

EXPIRED = {
    "jsonPath": r".metadata.annotations.lifecycle\.agents\.x-k8s\.io/expired-at",
    "name": "Expired",
    "type": "date",
}


def test_the_archive_crd_has_an_expired_column() -> None:
    columns = archive_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert columns[-1] == EXPIRED
    assert lc.ANNOTATION_EXPIRED_AT == "lifecycle.agents.x-k8s.io/expired-at"


def test_the_installed_crd_carries_it() -> None:
    path = REPO_ROOT / "k8s" / "lifecycle" / f"{lc.ARCHIVE.group}_{lc.ARCHIVE.plural}.yaml"
    crd = yaml.safe_load(path.read_text())
    assert EXPIRED in crd["spec"]["versions"][0]["additionalPrinterColumns"]
