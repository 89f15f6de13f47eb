"""A cancelled upload whose file object blocks in `read()` (a pipe nobody writes to) no longer holds up the
program's end.

The read ran on the loop's default executor: cancelling the upload left the worker thread blocked, and
`asyncio.run` waits for every executor thread as it returns (Python 3.11: with no timeout) - the program
hung after its work was done, and so did the interpreter's exit. It now runs on the upload's own daemon
thread, which neither waits for; the abandoned read goes on in the background until the source yields.
"""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent_sandbox_sdk._bodies import async_body
from agent_sandbox_sdk._steps import Upload

pytestmark = pytest.mark.unit

_PROGRAM = textwrap.dedent(
    """
    import asyncio, os, sys

    sys.path.insert(0, sys.argv[1])
    from fakes import ROUTER, FakeCluster, endpoint

    from agent_sandbox_sdk import AsyncSandboxClient, SandboxDirectConnectionConfig

    read_end, write_end = os.pipe()  # the write end stays open and silent: read() blocks for good
    pipe = open(read_end, "rb", buffering=0)

    async def main() -> None:
        fake = FakeCluster()
        config = SandboxDirectConnectionConfig(api_url=ROUTER)
        async with AsyncSandboxClient(
            config, api_client=endpoint(), transport=fake.transport(), cleanup=False
        ) as client:
            sandbox = await client.create_sandbox("python-pool")
            try:
                async with asyncio.timeout(0.5):
                    await sandbox.files.write("never", pipe)
            except TimeoutError:
                print("upload cancelled", flush=True)

    asyncio.run(main())
    print("asyncio.run returned", flush=True)
    """
)


def test_a_cancelled_upload_from_a_silent_pipe_does_not_hold_up_the_program() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,  # a hang, not a slow run: the fixed program ends as soon as the upload is cancelled
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["upload cancelled", "asyncio.run returned"]


def test_a_file_object_is_uploaded_whole_and_its_errors_are_raised() -> None:
    class Broken(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def read(self, size: int = -1) -> bytes:
            raise OSError("the disk went away")

    async def collect(source: io.RawIOBase) -> bytes:
        upload = Upload(source, b"<", b">", chunk_size=3)  # type: ignore[arg-type]
        return b"".join([chunk async for chunk in async_body(upload)])

    source = io.BufferedReader(io.BytesIO(b"abcdefgh"))  # not a BytesIO: read on the reader's thread
    assert asyncio.run(collect(source)) == b"<abcdefgh>"  # type: ignore[arg-type]
    with pytest.raises(OSError, match="the disk went away"):
        asyncio.run(collect(Broken()))
