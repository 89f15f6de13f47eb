"""What a 502 from a Sandbox that is suspended and asks to be resumed on request is said to lack.

A router running `--sandbox-lifecycle` holds a request for a suspended Sandbox and sends it again, whole, to
the resumed pod - unless its body cannot be sent again (streamed, or over 64 KiB: docs/lifecycle.md), which
gets the 502. The advice said "this request did not go through a router running --sandbox-lifecycle" then
too, through a router that runs it; it is the body that the SDK knows, and says.
"""

from __future__ import annotations

import io
import re
from typing import Any

import pytest

from agent_sandbox_sdk import AsyncSandboxClient, SandboxClient, SandboxRequestError

from .fakes import endpoint
from .test_lifecycle_sdk import AUTO_RESUME, CONFIG, TEMPLATE_REF, TemplatedCluster

pytestmark = pytest.mark.unit

NOT_THE_ROUTER = "this request did not go through a router running --sandbox-lifecycle"


class _Slow(io.RawIOBase):
    """A file object that cannot be read again (a pipe, a socket): streamed, not seekable."""

    def __init__(self, data: bytes) -> None:
        self.left = data

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk, self.left = self.left[: len(buffer)], self.left[len(buffer) :]
        buffer[: len(chunk)] = chunk
        return len(chunk)


def _suspended(on: str) -> tuple[TemplatedCluster, Any]:
    fake = TemplatedCluster()
    sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
    obj = fake.sandboxes[sandbox.sandbox_id]
    obj["spec"]["operatingMode"] = "Suspended"
    if on == "sandbox":
        obj["metadata"]["annotations"] = {AUTO_RESUME: "true", TEMPLATE_REF: "tmpl"}
    else:
        obj["metadata"]["annotations"] = {TEMPLATE_REF: "tmpl"}
    fake.templates["tmpl"] = {"metadata": {"name": "tmpl", "annotations": {AUTO_RESUME: "true"}}}
    fake.faults["/upload"] = [502] * 6
    fake.faults["/download/"] = [502] * 6
    fake.faults["/execute"] = [502] * 6
    return fake, sandbox


@pytest.mark.parametrize("on", ["sandbox", "template"])
@pytest.mark.parametrize(
    ("content", "said"),
    [
        (lambda: io.BufferedReader(_Slow(b"x" * 10)), "this request's body was streamed"),
        (lambda: io.BytesIO(b"x" * 10), "this request's body was streamed"),
        # the multipart form's framing is part of the body
        (lambda: b"x" * (64 << 10), r"this request's body is 65\d{3} bytes"),
        (lambda: b"x" * (300 << 10), r"this request's body is 3073\d\d bytes"),
        (lambda: b"x" * (2 << 20), r"this request's body is 20973\d\d bytes"),  # streamed, with its length
    ],
    ids=["file-object", "seekable-file-object", "64KiB", "300KiB", "2MiB"],
)
def test_a_body_a_router_cannot_send_again_is_named_not_the_router(on: str, content: Any, said: str) -> None:
    """`sb.files.write("x.bin", slow_file)` cut by a suspend, through a router that runs --sandbox-lifecycle:
    it was told the router did not run it."""
    _, sandbox = _suspended(on)
    with pytest.raises(SandboxRequestError) as info:
        sandbox.files.write("x.bin", content())
    message = str(info.value)
    assert info.value.status_code == 502
    assert "is suspended (spec.operatingMode: Suspended)" in message, message
    assert re.search(said, message), message
    assert "which a router cannot hold to send again" in message, message
    assert "calling again (with the content from its start) resumes the Sandbox and succeeds" in message, (
        message
    )
    # the other cause is still named, as a possibility, not as what happened
    assert message.endswith("- unless this request did not go through a router running --sandbox-lifecycle")
    assert f"but {NOT_THE_ROUTER}" not in message, message


def test_a_small_body_names_both_causes() -> None:
    """A body the router holds (64 KiB or less, sent whole): it did not go through such a router, or the
    router could not send it again for another reason (it had reached the pod, which may have run it)."""
    _, sandbox = _suspended("sandbox")
    with pytest.raises(SandboxRequestError) as info:
        sandbox.files.write("x.bin", b"x" * 100)
    message = str(info.value)
    assert f"but {NOT_THE_ROUTER}, or it reached the Sandbox's pod as it was suspended" in message, message
    assert "this request's body" not in message, message


def test_a_request_without_a_body_names_both_causes() -> None:
    _, sandbox = _suspended("template")
    with pytest.raises(SandboxRequestError) as info:
        sandbox.files.read("a.txt")
    message = str(info.value)
    assert f"but {NOT_THE_ROUTER}, or it reached the Sandbox's pod as it was suspended" in message, message
    assert "calling again then resumes the Sandbox" in message, message


async def test_the_async_client_says_the_same_of_a_streamed_body() -> None:
    fake = TemplatedCluster()
    async with AsyncSandboxClient(
        CONFIG, api_client=endpoint(), transport=fake.transport(), cleanup=False
    ) as client:
        sandbox = await client.create_sandbox("p")
        obj = fake.sandboxes[sandbox.sandbox_id]
        obj["spec"]["operatingMode"] = "Suspended"
        obj["metadata"]["annotations"] = {AUTO_RESUME: "true"}
        fake.faults["/upload"] = [502]
        assert sandbox.files is not None
        with pytest.raises(SandboxRequestError) as info:
            await sandbox.files.write("x.bin", io.BufferedReader(_Slow(b"x" * 10)))
    assert "this request's body was streamed" in str(info.value), str(info.value)
