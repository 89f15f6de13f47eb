"""The invalid-policy conversion error quotes the annotation value as upstream's Go ``%q`` does.

Upstream: ``fmt.Errorf("invalid VolumeClaimTemplatesPolicy annotation value: %q", policy)``. The message reaches
clients verbatim (the API server returns the webhook's Failure message), so it is compared as text; Python's
``repr`` quoted 'bogus' with single quotes and escaped differently.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api.conversion import ConversionError, to_hub

pytestmark = pytest.mark.unit

PREFIX = "invalid VolumeClaimTemplatesPolicy annotation value: "


def _alpha_template(policy: str) -> dict[str, Any]:
    return {"apiVersion": "extensions.agents.x-k8s.io/v1alpha1", "kind": "SandboxTemplate",
            "metadata": {"name": "t", "annotations": {c.ANNOTATION_V1BETA1_VCT_POLICY: policy}},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "quoted"),
    [
        # Expected texts as Go's strconv.Quote (fmt %q) writes them.
        ("bogus", '"bogus"'),
        ('it"s', r'"it\"s"'),
        ("back\\slash", r'"back\\slash"'),
        ("", '""'),
        ("it's", '"it\'s"'),
        ("a\nb\tc\rd", r'"a\nb\tc\rd"'),
        ("\a\b\f\v", r'"\a\b\f\v"'),
        ("esc\x1b del\x7f nul\x00", r'"esc\x1b del\x7f nul\x00"'),
        ("é Ω 日本", '"é Ω 日本"'),  # printable non-ASCII stays as it is
        ("nbsp\u00a0zwsp\u200b", r'"nbsp\u00a0zwsp\u200b"'),  # not printable for Go: \u escapes
        ("tag\U000e0001", r'"tag\U000e0001"'),
        ("emoji \U0001f600", '"emoji \U0001f600"'),
        # A Go string holds no lone surrogate: its JSON decoder turns one into U+FFFD, which is printable.
        ("lone\ud800", '"lone\ufffd"'),
    ],
)
def test_the_invalid_policy_is_quoted_as_go_does(policy: str, quoted: str) -> None:
    with pytest.raises(ConversionError) as raised:
        to_hub(_alpha_template(policy))
    assert str(raised.value) == PREFIX + quoted
