"""Which files the PTY wrapper refuses up front as the kernel would (ENOEXEC), binfmt_misc entries included."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from agent_sandbox.runtime import spawn

pytestmark = pytest.mark.unit


@pytest.fixture
def binfmt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "binfmt_misc"
    d.mkdir()
    (d / "status").write_text("enabled\n")
    (d / "register").write_text("")
    monkeypatch.setattr(spawn, "_BINFMT_MISC", str(d))
    return d


def _exe(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    path.chmod(0o755)
    return str(path)


def test_no_format_is_enoexec(tmp_path: Path, binfmt: Path) -> None:
    with pytest.raises(OSError, match="Exec format error") as err:
        spawn._check_program(_exe(tmp_path, "plain", b"echo hi\n"), str(tmp_path), {})
    assert err.value.errno == errno.ENOEXEC


def test_a_binfmt_misc_magic_or_extension_is_left_to_exec(tmp_path: Path, binfmt: Path) -> None:
    (binfmt / "mz").write_text("enabled\ninterpreter /usr/bin/wine\nflags: \noffset 0\nmagic 4d5a\n")
    (binfmt / "jar").write_text("enabled\ninterpreter /usr/bin/jexec\nflags: \nextension jar\n")
    (binfmt / "off").write_text("disabled\ninterpreter /x\nflags: \noffset 0\nmagic 6563\n")
    spawn._check_program(_exe(tmp_path, "prog.exe", b"MZ\x90\x00"), str(tmp_path), {})
    spawn._check_program(_exe(tmp_path, "app.jar", b"PK\x03\x04"), str(tmp_path), {})
    with pytest.raises(OSError, match="Exec format error"):  # "ec" matches only the disabled entry
        spawn._check_program(_exe(tmp_path, "plain", b"echo hi\n"), str(tmp_path), {})
    (binfmt / "status").write_text("disabled\n")
    with pytest.raises(OSError, match="Exec format error"):
        spawn._check_program(_exe(tmp_path, "prog2.exe", b"MZ\x90\x00"), str(tmp_path), {})


def test_a_masked_magic_at_an_offset(tmp_path: Path, binfmt: Path) -> None:
    (binfmt / "m").write_text("enabled\ninterpreter /x\nflags: \noffset 2\nmagic abf0\nmask fff0\n")
    spawn._check_program(_exe(tmp_path, "a", b"\x00\x00\xab\xf7rest"), str(tmp_path), {})
    with pytest.raises(OSError, match="Exec format error"):
        spawn._check_program(_exe(tmp_path, "b", b"\x00\x00\xab\x07rest"), str(tmp_path), {})
