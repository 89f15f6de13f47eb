"""`agent-sandbox release` refuses a tag no registry accepts and an --out that is a file, in one line.

Until December 6 `--tag 'v1 0'` rendered `...agent-sandbox-controller:v1 0` into the assets and exited 0, and
`--out <an existing file>` ended in a FileExistsError traceback after the rendering.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_sandbox.cli import release
from agent_sandbox.cli.main import main

pytestmark = pytest.mark.unit


def _no_render(*args: object, **kwargs: object) -> None:
    raise AssertionError("a usage error must be reported before anything is built or rendered")


@pytest.fixture(autouse=True)
def no_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release, "ensure_binaries", _no_render)


@pytest.mark.parametrize("tag", ["v1 0", "-v1", ".v1", "v1:2", "v1/2", "é", "a" * 129])
def test_an_invalid_image_tag_is_a_usage_error(
    tag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["release", f"--tag={tag}", "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"usage error: --tag {tag!r} is not a valid image tag (letters, digits, '_', '.' and '-', at most 128, "
        "not starting with '.' or '-'; e.g. v0.1.0)\n"
    )
    assert captured.out == ""
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tag", ["v0.1.0", "latest", "_x", "1.2.3-rc.1_b", "a" * 128])
def test_valid_tags_pass_the_check(tag: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """They get as far as building kubectl (stubbed here)."""
    with pytest.raises(AssertionError, match="before anything is built"):
        main(["release", "--tag", tag, "--out", str(tmp_path / "out")])


def test_out_naming_an_existing_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    assert main(["release", "--tag", "v1", "--out", str(afile)]) == 2
    assert capsys.readouterr().err == f"usage error: --out {afile} exists and is not a directory\n"
    assert afile.read_text() == "keep me\n"


def test_an_unwritable_out_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A parent that is a file (or no permission, a full disk) shows up only when writing: exit 1, one line."""

    class _Assets:
        files = {"sandbox.yaml": "kind: List\n"}

    class _Bins:
        def path(self, name: str) -> Path:
            return Path("/nonexistent") / name

    monkeypatch.setattr(release, "ensure_binaries", _Bins)
    monkeypatch.setattr(release, "render_assets", lambda *a, **k: _Assets())
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "sub"
    assert main(["release", "--tag", "v1", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write the release assets to {out}: NotADirectoryError: ")
    assert err.count("\n") == 1
