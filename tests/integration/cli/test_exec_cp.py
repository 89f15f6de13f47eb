"""`agent-sandbox exec|cp|logs` as a user runs them (the console script, through the router, against
runtimes the local runner serves): streamed output, the command's exit code, files both ways."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from tests.helpers import wait_for
from tests.integration.cli.conftest import role_kubeconfig
from tests.integration.sdk.conftest import RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CLI = str(Path(sys.executable).with_name("agent-sandbox"))


def cli(
    cluster: DevCluster,
    router: str,
    *argv: str,
    stdin: str | None = None,
    umask: int = -1,
    prefix: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """The CLI's `argv` (`umask`: the process's, -1 this one's; `prefix`: a command that runs it)."""
    common = ["--kubeconfig", str(cluster.kubeconfig), "--router-url", router]
    return subprocess.run(
        [*prefix, CLI, argv[0], *common, *argv[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
        check=False,
        umask=umask,
    )


def test_exec_cp_and_logs(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    created = cli(cluster, router, "create", "pool", *ns, "--name", "sb", "-o", "json")
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["ready"] is True

    out = cli(cluster, router, "exec", *ns, "sb", "--", "sh", "-c", "echo to-out; echo to-err >&2; exit 7")
    assert (out.returncode, out.stdout, out.stderr) == (7, "to-out\n", "to-err\n")
    out = cli(cluster, router, "exec", "sb", "-n", namespace, "--env", "A=b", "--", "printenv", "A")
    assert (out.returncode, out.stdout) == (0, "b\n")
    out = cli(cluster, router, "exec", "sb", "-n", namespace, "-o", "json", "--", "echo", "hi")
    assert json.loads(out.stdout)["stdout"] == "hi\n"
    assert out.returncode == 0
    out = cli(cluster, router, "exec", "sb", "-n", namespace, "--timeout", "1", "--", "sleep", "10")
    assert out.returncode == 124
    assert "timed out" in out.stderr
    # A command killed by a signal exits 128 + N, as a shell, `docker exec` and `kubectl exec` say it (137:
    # SIGKILL, the OOM killer's); it was 1, the same as any failure. With -o json the runtime's -N is kept.
    for signal_name, code in (("KILL", 137), ("TERM", 143)):
        out = cli(cluster, router, "exec", "sb", "-n", namespace, "--", "sh", "-c", f"kill -{signal_name} $$")
        assert out.returncode == code, (signal_name, out.returncode, out.stderr)
    out = cli(cluster, router, "exec", "sb", "-n", namespace, "-o", "json", "--", "sh", "-c", "kill -KILL $$")
    assert (out.returncode, json.loads(out.stdout)["exit_code"]) == (137, -9)

    # Output is bytes, exactly as the command wrote them (not UTF-8, NULs): `exec ... > file` is a copy.
    raw = subprocess.run(
        [CLI, "exec", "--kubeconfig", str(cluster.kubeconfig), "--router-url", router, *ns, "sb", "--",
         "sh", "-c", "printf '\\377\\376\\000'; head -c 300000 /dev/zero | tr '\\000' '\\351'"],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout == b"\xff\xfe\x00" + b"\xe9" * 300_000
    # A reader that goes away (`| head`) ends exec quietly with 141 (128 + SIGPIPE), no traceback.
    piped = subprocess.run(
        f"{CLI} exec --kubeconfig {cluster.kubeconfig} --router-url {router} -n {namespace} sb -- "
        "sh -c 'yes | head -c 5000000' | head -c 10 > /dev/null; echo ${PIPESTATUS[0]} >&2",
        shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert piped.stderr == "141\n"

    local = tmp_path / "up.txt"
    local.write_bytes(b"uploaded\x00bytes")
    assert cli(cluster, router, "cp", str(local), "sb:in/up.txt", *ns).returncode == 0
    back = tmp_path / "down.txt"
    assert cli(cluster, router, "cp", "sb:in/up.txt", str(back), *ns).returncode == 0
    assert back.read_bytes() == b"uploaded\x00bytes"
    missing = cli(cluster, router, "cp", "sb:in/none.txt", str(tmp_path), *ns)
    # Not found: exit 3, as the exit codes say of a 404 (exit 1 until December 7).
    assert (missing.returncode, missing.stderr) == (3, "error: sb:in/none.txt: no such file or directory\n")
    # A failed download leaves the file that was there (it is replaced only by a complete download).
    failed = cli(cluster, router, "cp", "sb:in/none.txt", str(back), *ns)
    assert failed.returncode == 3
    assert back.read_bytes() == b"uploaded\x00bytes"
    # `-`: standard input as the source, standard output as the destination (as `docker cp`).
    piped = cli(cluster, router, "cp", "-", "sb:in/piped.txt", *ns, stdin="from a pipe\n")
    assert (piped.returncode, piped.stderr) == (0, "- -> sb:in/piped.txt (12 bytes)\n")
    out = cli(cluster, router, "cp", "sb:in/piped.txt", "-", *ns)
    assert (out.returncode, out.stdout) == (0, "from a pipe\n")
    assert not (Path.cwd() / "-").exists()
    nameless = cli(cluster, router, "cp", "-", "sb:in/", *ns, stdin="x")
    assert nameless.returncode == 2
    assert "needs a file name" in nameless.stderr
    both_local = cli(cluster, router, "cp", str(local), str(back), *ns)
    assert both_local.returncode == 2
    # Local paths that are not there are named as typed.
    absent = cli(cluster, router, "cp", str(tmp_path / "absent.txt"), "sb:x", *ns)
    assert (absent.returncode, absent.stderr) == (
        2,
        f"error: {tmp_path / 'absent.txt'}: no such file or directory\n",
    )
    into_nothing = cli(cluster, router, "cp", "sb:in/up.txt", str(tmp_path / "no-dir" / "f"), *ns)
    assert into_nothing.returncode == 2
    assert f"No such file or directory: '{tmp_path / 'no-dir' / 'f'}'" in into_nothing.stderr

    # The runtime's own log, as `kubectl logs` shows it (the runner keeps it, kwok serves it: kubelet_api.py).
    logs = cli(cluster, router, "logs", "sb", "--tail", "1", *ns)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.count("\n") == 1
    assert "INFO agent_sandbox.runtime.server: serving /" in logs.stdout

    nothing = cli(cluster, router, "exec", "nobody", *ns, "--", "true")
    assert nothing.returncode == 3


def test_cp_copies_directory_trees_both_ways(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    """`cp` copies a directory with everything under it, as `docker cp` does: into a destination directory that
    exists, as a destination that does not, or only its contents with `/.`; empty directories too; local
    symbolic links reported and skipped. It used to refuse directories ("directories are not copied")."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    assert cli(cluster, router, "create", "pool", *ns, "--name", "tree").returncode == 0
    tree = tmp_path / "project"
    (tree / "src" / "pkg").mkdir(parents=True)
    (tree / "empty").mkdir()
    (tree / "README").write_text("top\n")
    (tree / "src" / "pkg" / "data.bin").write_bytes(bytes(range(256)) * 800)
    (tree / "src" / "main.py").write_text("print(1)\n")
    (tree / "link").symlink_to(tree / "README")

    up = cli(cluster, router, "cp", str(tree), "tree:work", *ns)
    assert up.returncode == 0, up.stderr
    assert f"warning: skipped {tree / 'link'} (symbolic links and special files are not copied)" in up.stderr
    assert up.stderr.endswith(f"{tree} -> tree:work (3 files, 204813 bytes)\n")
    listing = cli(cluster, router, "exec", *ns, "tree", "--", "sh", "-c", "cd work && find . | sort")
    assert listing.stdout.split() == [
        ".", "./README", "./empty", "./src", "./src/main.py", "./src/pkg", "./src/pkg/data.bin",
    ]  # fmt: skip
    # `work` exists now: a second copy goes inside it, as `cp -r` and `docker cp` do.
    assert cli(cluster, router, "cp", str(tree), "tree:work", *ns).returncode == 0
    assert (
        cli(cluster, router, "exec", *ns, "tree", "--", "test", "-f", "work/project/src/main.py").returncode
        == 0
    )
    # A single file into an existing directory keeps its name.
    assert cli(cluster, router, "cp", str(tree / "README"), "tree:work/src", *ns).returncode == 0
    assert cli(cluster, router, "exec", *ns, "tree", "--", "cat", "work/src/README").stdout == "top\n"

    down = tmp_path / "down"
    got = cli(cluster, router, "cp", "tree:work", str(down), *ns)
    assert got.returncode == 0, got.stderr
    assert (down / "src" / "pkg" / "data.bin").read_bytes() == bytes(range(256)) * 800
    assert (down / "project" / "README").read_text() == "top\n"
    assert (down / "empty").is_dir()
    assert not (down / "link").exists()
    # Into an existing local directory: as `down/pkg`; with `/.`, only the contents.
    assert cli(cluster, router, "cp", "tree:work/src/pkg", str(down), *ns).returncode == 0
    assert (down / "pkg" / "data.bin").is_file()
    flat = tmp_path / "flat"
    flat.mkdir()
    assert cli(cluster, router, "cp", "tree:work/src/.", str(flat), *ns).returncode == 0
    assert sorted(p.name for p in flat.iterdir()) == ["README", "main.py", "pkg"]
    # A directory cannot go to standard output; a local file is not a directory to copy into.
    to_stdout = cli(cluster, router, "cp", "tree:work", "-", *ns)
    assert (to_stdout.returncode, to_stdout.stderr) == (
        2,
        "error: tree:work: a directory cannot be written to standard output\n",
    )
    onto_file = cli(cluster, router, "cp", "tree:work", str(tree / "README"), *ns)
    assert (onto_file.returncode, onto_file.stderr) == (2, f"error: {tree / 'README'}: not a directory\n")
    # A FIFO in the sandbox's tree is reported and the rest copied; until December 6 it stopped the copy half-way
    # with "Permission denied" (and one in a local tree was reported as a symbolic link).
    fifo = cli(cluster, router, "exec", *ns, "tree", "--", "mkfifo", "work/src/pipe")
    assert fifo.returncode == 0, fifo.stderr
    with_fifo = cli(cluster, router, "cp", "tree:work/src", str(tmp_path / "with-fifo"), *ns)
    assert with_fifo.returncode == 1
    assert "tree:work/src/pipe: no such file or directory" in with_fifo.stderr
    assert "not a regular file" in with_fifo.stderr
    assert (tmp_path / "with-fifo" / "pkg" / "data.bin").read_bytes() == bytes(range(256)) * 800
    # A missing file is said as the local side says it (it was the runtime's "GET <url>: HTTP 404").
    missing = cli(cluster, router, "cp", "tree:work/nope.txt", str(tmp_path / "nope"), *ns)
    assert (missing.returncode, missing.stderr) == (
        3,
        "error: tree:work/nope.txt: no such file or directory\n",
    )


def test_cp_keeps_permission_bits_both_ways(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    """A script copied in runs (`./run.sh`), and one copied out is still executable: `cp` keeps modes as `cp`
    and `docker cp` do, less the umask when writing locally. Every file used to arrive 0644."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    assert cli(cluster, router, "create", "pool", *ns, "--name", "modes").returncode == 0
    tree = tmp_path / "tools"
    tree.mkdir()
    (tree / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (tree / "run.sh").chmod(0o755)
    (tree / "secret").write_text("s\n")
    (tree / "secret").chmod(0o600)
    (tree / "plain").write_text("p\n")
    (tree / "plain").chmod(0o644)
    single = tmp_path / "one.sh"
    single.write_text("#!/bin/sh\necho one\n")
    single.chmod(0o750)

    assert cli(cluster, router, "cp", str(tree), "modes:tools", *ns).returncode == 0
    assert cli(cluster, router, "cp", str(single), "modes:one.sh", *ns).returncode == 0
    ran = cli(cluster, router, "exec", *ns, "modes", "--", "sh", "-c", "./tools/run.sh && ./one.sh")
    assert (ran.returncode, ran.stdout) == (0, "ran\none\n"), ran.stderr
    modes = cli(cluster, router, "exec", *ns, "modes", "--", "stat", "-c", "%n %a", "tools/run.sh",
                "tools/secret", "tools/plain", "one.sh")  # fmt: skip
    assert modes.stdout.split("\n")[:4] == [
        "tools/run.sh 755",
        "tools/secret 600",
        "tools/plain 644",
        "one.sh 750",
    ]

    down = tmp_path / "down"
    assert cli(cluster, router, "cp", "modes:tools", str(down), *ns).returncode == 0
    assert cli(cluster, router, "cp", "modes:one.sh", str(tmp_path / "one-back.sh"), *ns).returncode == 0
    umask = os.umask(0o022)
    os.umask(umask)
    got = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [*down.iterdir(), tmp_path / "one-back.sh"]}
    assert got == {
        "run.sh": 0o755 & ~umask,
        "secret": 0o600 & ~umask,
        "plain": 0o644 & ~umask,
        "one-back.sh": 0o750 & ~umask,
    }


def test_cp_keeps_directory_modes_both_ways(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    """A private 0700 directory stays private: every directory arrived 0755, both ways (the runtime's, then
    mkdir's), open to every other user. As `cp -r`: the source's mode (less the umask, locally), set once its
    contents are in (a 0500 one too); a directory that was already there, or a symbolic link where the tree
    has a directory, is left as it is."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    assert cli(cluster, router, "create", "pool", *ns, "--name", "dirmodes").returncode == 0
    tree = tmp_path / "tree"
    for sub in ("sub/deep", "ro", "emptyd", "plain"):
        (tree / sub).mkdir(parents=True)
    (tree / "sub" / "deep" / "f").write_text("deep\n")
    (tree / "ro" / "f").write_text("ro\n")
    local_modes = {"sub": 0o700, "ro": 0o500, "emptyd": 0o700, "plain": 0o755, "": 0o750}
    for sub, mode in local_modes.items():
        (tree / sub).chmod(mode)

    def remote_modes(*paths: str) -> list[str]:
        out = cli(cluster, router, "exec", *ns, "dirmodes", "--", "stat", "-c", "%n %a", *paths)
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    up = cli(cluster, router, "cp", str(tree), "dirmodes:tree", *ns)
    assert up.returncode == 0, up.stderr
    assert remote_modes("tree", "tree/sub", "tree/sub/deep", "tree/ro", "tree/emptyd", "tree/plain") == [
        "tree 750", "tree/sub 700", "tree/sub/deep 755", "tree/ro 500", "tree/emptyd 700", "tree/plain 755",
    ]  # fmt: skip
    assert cli(cluster, router, "exec", *ns, "dirmodes", "--", "cat", "tree/ro/f").stdout == "ro\n"
    # The contents into a directory the sandbox has: its mode is left alone; a symbolic link where the tree
    # has `sub` is written through, and what it names not chmodded.
    made = cli(cluster, router, "exec", *ns, "dirmodes", "--", "sh", "-c",
               "mkdir -m 0711 into shared && chmod 0755 shared && ln -s ../shared into/sub")  # fmt: skip
    assert made.returncode == 0, made.stderr
    up = cli(cluster, router, "cp", f"{tree}/.", "dirmodes:into", *ns)
    assert up.returncode == 0, up.stderr
    assert remote_modes("into", "shared", "into/ro", "shared/deep/f") == [
        "into 711", "shared 755", "into/ro 500", "shared/deep/f 644",
    ]  # fmt: skip

    changed = cli(cluster, router, "exec", *ns, "dirmodes", "--", "chmod", "0700", "tree/plain")
    assert changed.returncode == 0, changed.stderr
    umask = os.umask(0o022)
    os.umask(umask)
    out = tmp_path / "out"
    down = cli(cluster, router, "cp", "dirmodes:tree", str(out), *ns)
    assert down.returncode == 0, down.stderr
    got = {p.relative_to(out).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [out, *out.rglob("*")]}
    assert got == {
        ".": 0o750 & ~umask,
        "sub": 0o700 & ~umask,
        "sub/deep": 0o755 & ~umask,
        "sub/deep/f": 0o644 & ~umask,
        "ro": 0o500 & ~umask,
        "ro/f": 0o644 & ~umask,
        "emptyd": 0o700 & ~umask,
        "plain": 0o700 & ~umask,
    }
    assert (out / "ro" / "f").read_text() == "ro\n"
    # Into a local directory that exists: `out/tree` (made) gets its mode, `again` keeps its own; and a
    # local symbolic link where the tree has `sub` is written through, what it names not chmodded.
    again = tmp_path / "again"
    (again / "tree").mkdir(parents=True)
    (again / "tree").chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    elsewhere.chmod(0o755)
    (again / "tree" / "sub").symlink_to(elsewhere)
    down = cli(cluster, router, "cp", "dirmodes:tree", str(again), *ns)
    assert down.returncode == 0, down.stderr
    assert stat.S_IMODE((again / "tree").stat().st_mode) == 0o755
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755
    assert (elsewhere / "deep" / "f").read_text() == "deep\n"
    assert stat.S_IMODE((again / "tree" / "ro").stat().st_mode) == 0o500 & ~umask
    # leave nothing a cleanup cannot remove (as a user other than root)
    for place in (tree, out, again):
        subprocess.run(["chmod", "-R", "u+rwx", str(place)], check=True)
    cli(cluster, router, "exec", *ns, "dirmodes", "--", "chmod", "-R", "u+rwx", "tree", "into", "shared")


def test_cp_makes_directories_as_cp_r_makes_them(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    """A review of 74c9dba (December 7), end to end: a tree of 8,000 directories of one mode (0775 under
    umask 002) is copied (its `mkdir -p` and its `chmod` were one command each: over the legacy runtime's
    1 MiB request body here - 413 once every file was sent - and, through sandboxd's `/bin/sh -c`, over
    Linux's 128 KiB for one argument from ~2,000 directories on: E2BIG); a directory the sandbox has keeps
    its mode; a sticky directory stays sticky, less the umask of `cp`; modes listed in four digits
    (set-group-ID, sticky) are kept, less the umask, set-id bits never; and, for a user other than root,
    what cannot be read is named, the rest copied."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    assert cli(cluster, router, "create", "pool", *ns, "--name", "ascp").returncode == 0

    def sh(script: str) -> str:
        out = cli(cluster, router, "exec", *ns, "ascp", "--", "sh", "-c", script)
        assert out.returncode == 0, out.stderr
        return out.stdout

    # 8,000 empty directories of 0775 (umask 002, Ubuntu's and Fedora's for a user): 1.1 MB of paths
    big = tmp_path / "big"
    for i in range(8000):
        (big / f"directory-{i:05d}-{'x' * 120}").mkdir(parents=True)
        (big / f"directory-{i:05d}-{'x' * 120}").chmod(0o775)
    (big / "private").mkdir()
    (big / "private").chmod(0o700)
    up = cli(cluster, router, "cp", str(big), "ascp:big", *ns, umask=0o002)
    assert up.returncode == 0, up.stderr
    assert sh("find big -mindepth 1 -type d -perm 0775 | wc -l; stat -c %a big/private") == "8000\n700\n"

    # what the sandbox has keeps its mode (`shared`, 0755, used by others); what the copy makes gets the
    # source's less the umask, its sticky bit too: a 1777 one is 1755 under umask 022, as `cp -r` makes it
    src = tmp_path / "src"
    for sub in ("shared/new", "sticky", "open"):
        (src / sub).mkdir(parents=True)
        (src / sub / "f").write_text("x")
    (src / "open" / "f").chmod(0o777)
    for sub, mode in {"shared/new": 0o700, "shared": 0o700, "sticky": 0o1777, "open": 0o777}.items():
        (src / sub).chmod(mode)
    sh("mkdir -p into/shared into/src && chmod 0755 into/shared into/src")
    up = cli(cluster, router, "cp", f"{src}/.", "ascp:into", *ns, umask=0o022)
    assert up.returncode == 0, up.stderr
    up = cli(cluster, router, "cp", str(src), "ascp:into", *ns, umask=0o022)
    assert up.returncode == 0, up.stderr
    assert sh(
        "cd into && stat -c '%n %a' shared shared/new sticky open open/f src src/shared src/sticky"
    ) == (
        "shared 755\nshared/new 700\nsticky 1755\nopen 755\nopen/f 755\nsrc 755\nsrc/shared 700\n"
        "src/sticky 1755\n"
    )

    # four-digit modes listed (a volume with an fsGroup: every directory set-group-ID)
    sh("mkdir -p fsg/private fsg/tmp && echo s > fsg/private/secret && chmod 4755 fsg/private/secret"
       " && chmod 2700 fsg/private && chmod 1777 fsg/tmp && chmod 2770 fsg")  # fmt: skip
    out = tmp_path / "fsg"
    down = cli(cluster, router, "cp", "ascp:fsg", str(out), *ns, umask=0o022)
    assert down.returncode == 0, down.stderr
    got = {p.relative_to(out).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [out, *out.rglob("*")]}
    assert got == {".": 0o750, "private": 0o700, "private/secret": 0o755, "tmp": 0o1755}

    # as a user the kernel checks permissions for (root reads a 0600 directory's entries): the CLI with
    # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER taken away
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            return  # what remains needs a user other than root
        prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search,-fowner"]
    tree = tmp_path / "unreadable"
    (tree / "ok").mkdir(parents=True)
    (tree / "ok" / "f").write_text("ok")
    (tree / "closed").mkdir()
    (tree / "closed" / "g").write_text("g")
    (tree / "secret").write_text("s")
    (tree / "secret").chmod(0)
    (tree / "closed").chmod(0o600)
    try:
        up = cli(cluster, router, "cp", str(tree), "ascp:unreadable", *ns, umask=0o022, prefix=prefix)
    finally:
        (tree / "closed").chmod(0o700)
    assert up.returncode == 1, up.stderr
    assert f"error: {tree / 'closed' / 'g'}: not copied: Permission denied\n" in up.stderr
    assert f"error: {tree / 'secret'}: not copied: Permission denied\n" in up.stderr
    assert up.stderr.endswith(f"{tree} -> ascp:unreadable (1 file, 2 bytes)\n")
    assert sh("cat unreadable/ok/f; stat -c %a unreadable/closed") == "ok600\n"
    assert sh("test -e unreadable/secret || echo absent") == "absent\n"


def test_cp_of_a_tree_copies_the_rest_when_a_listed_file_cannot_be_read(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    """A program names a file with bytes that are not UTF-8: the listing used to be a 500 for the whole
    directory (nothing copied, the runtime's raw error). It is listed with U+FFFD now, so that file cannot be
    read by name; `cp -r` says which file it could not copy, copies the rest and exits 1, as GNU cp does
    for a file removed while it copies (a live sandbox's temporary files)."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    assert cli(cluster, router, "create", "pool", *ns, "--name", "names").returncode == 0
    made = cli(
        cluster, router, "exec", *ns, "names", "--",
        "sh", "-c", 'mkdir -p d/sub && printf bad > "d/$(printf "bad\\377")" && echo ok > d/ok && echo s > d/sub/s',
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    down = tmp_path / "down"
    got = cli(cluster, router, "cp", "names:d", str(down), *ns)
    assert got.returncode == 1, got.stderr
    assert got.stderr.splitlines() == [
        "error: names:d/bad\ufffd: no such file or directory (removed after it was listed, its name is not"
        " UTF-8, or it is not a regular file: a FIFO, a socket, a device)",
        f"names:d -> {down} (2 files, 5 bytes)",
    ]
    assert (down / "ok").read_text() == "ok\n"
    assert (down / "sub" / "s").read_text() == "s\n"


def test_a_role_that_grants_claims_only_can_exec_and_copy(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    """`create` worked with a role that grants claims only, and then `exec` and `cp` failed: the
    SDK's `get_sandbox` read the Sandbox (403). A claim's status carries what a handle needs through the
    router (the Sandbox's name, Ready, pod IPs), so it stands in when Sandboxes are forbidden."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    rule = {
        "apiGroups": ["extensions.agents.x-k8s.io"],
        "resources": ["sandboxclaims"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    }
    kubeconfig = role_kubeconfig(cluster, namespace, "agent", [rule], tmp_path)

    def as_agent(*argv: str) -> subprocess.CompletedProcess[str]:
        common = ["--kubeconfig", str(kubeconfig), "--router-url", router, "-n", namespace]
        return subprocess.run([CLI, argv[0], *common, *argv[1:]], capture_output=True, text=True, timeout=120, check=False)  # fmt: skip

    created = wait_for(lambda: (r := as_agent("create", "pool", "--name", "mine")).returncode == 0 and r, what="the role to apply")  # fmt: skip
    assert "forbidden" not in created.stdout
    out = as_agent("exec", "mine", "--", "sh", "-c", "echo hi; exit 3")
    assert (out.returncode, out.stdout) == (3, "hi\n"), out.stderr
    (tmp_path / "up.txt").write_text("up\n")
    up = as_agent("cp", str(tmp_path / "up.txt"), "mine:up.txt")
    assert up.returncode == 0, up.stderr
    down = as_agent("cp", "mine:up.txt", str(tmp_path / "down.txt"))
    assert down.returncode == 0, down.stderr
    assert (tmp_path / "down.txt").read_text() == "up\n"
    # What needs the Sandbox itself says why, with the API server's words.
    suspend = as_agent("suspend", "mine")
    assert suspend.returncode == 1
    assert "forbidden" in suspend.stderr
    assert as_agent("delete", "mine").returncode == 0


def test_exec_without_timeout_that_the_runtimes_limit_ends_exits_124(
    cluster: DevCluster, namespace: str, controller: Started, router: str
) -> None:
    """`exec CLAIM -- sleep 400` without --timeout: the runtime's own limit (300 s by default; 2 s here, the
    runtime's --command-timeout) killed it and `exec` crashed formatting the missing --timeout: a TypeError
    traceback, exit 1, and with -o json no JSON (until December 6). One line and 124, as docs/sdk/python.md
    says."""
    runtime = {"name": "runtime", "image": RUNTIME_IMAGE, "args": ["--command-timeout", "2"]}
    apply_pool(cluster, namespace, replicas=1, containers=[runtime])
    ns = ("-n", namespace)
    assert cli(cluster, router, "create", "pool", *ns, "--name", "limited").returncode == 0
    said = (
        "error: the command timed out: the runtime's time limit ended it (300 s unless the runtime sets "
        "another; --timeout N sets one)\n"
    )
    out = cli(cluster, router, "exec", *ns, "limited", "--", "sh", "-c", "echo started; sleep 60")
    assert (out.returncode, out.stdout, out.stderr) == (124, "started\n", said)
    out = cli(
        cluster, router, "exec", *ns, "limited", "-o", "json", "--", "sh", "-c", "echo started; sleep 60"
    )
    assert (out.returncode, out.stderr) == (124, said)
    result = json.loads(out.stdout)
    assert (result["stdout"], result["exit_code"], result["timed_out"]) == ("started\n", 124, True)


def test_cp_of_empty_directories_to_an_absolute_path_stays_in_the_sandbox(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    """`cp DIR CLAIM:/abs/d3`: the file API puts `/abs/d3/f` at `abs/d3/f` under the sandbox's root, but the
    empty directories were made by `mkdir -p -- /abs/d3/...`, a path a command takes literally: outside the
    root (the dev runner's commands run on this machine: there), and missing from the copy both ways (until
    December 6). The destination here is under this test's tmp_path, so a regression leaves nothing behind."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    assert cli(cluster, router, "create", "pool", *ns, "--name", "abs").returncode == 0
    tree = tmp_path / "tree"
    (tree / "sub" / "empty").mkdir(parents=True)
    (tree / "blank").mkdir()
    (tree / "sub" / "f.txt").write_text("f\n")
    outside = tmp_path / "abs"  # what `mkdir -p -- <tmp_path>/abs/d3/...` made on the runner's host
    absolute = f"{outside}/d3"

    up = cli(cluster, router, "cp", str(tree), f"abs:{absolute}", *ns)
    assert up.returncode == 0, up.stderr
    assert not outside.exists()
    relative = absolute.lstrip("/")
    found = cli(cluster, router, "exec", *ns, "abs", "--", "sh", "-c", f"cd {relative} && find . | sort")
    assert found.stdout.split() == [".", "./blank", "./sub", "./sub/empty", "./sub/f.txt"], found.stderr

    down = tmp_path / "down"
    got = cli(cluster, router, "cp", f"abs:{absolute}", str(down), *ns)
    assert got.returncode == 0, got.stderr
    assert (down / "sub" / "empty").is_dir()
    assert (down / "blank").is_dir()
    assert (down / "sub" / "f.txt").read_text() == "f\n"
    assert not outside.exists()


def test_cp_of_a_tree_with_a_symbolic_link_loop_copies_the_rest_and_names_the_loop(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    """The runtimes' listings follow symbolic links and say nothing of them, so `proj/d/up -> ..` listed as a
    directory again at every level: `cp` recursed until Python's RecursionError (exit 1, after ~7 s), leaving
    ~968 empty local directories and no file copied (until December 6). The loop is named on stderr, nothing
    made for it, the rest copied, exit 1 (a tree copied in part, as for a file that cannot be read)."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    assert cli(cluster, router, "create", "pool", *ns, "--name", "loop").returncode == 0
    made = cli(
        cluster, router, "exec", *ns, "loop", "--",
        "sh", "-c", "mkdir -p proj/d && echo top > proj/top && echo in > proj/d/in && ln -s .. proj/d/up",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    down = tmp_path / "down"
    got = cli(cluster, router, "cp", "loop:proj", str(down), *ns)
    assert got.returncode == 1, got.stderr
    assert "RecursionError" not in got.stderr
    assert got.stderr.splitlines() == [
        "error: loop:proj/d/up: not copied: it lists what loop:proj lists (a symbolic link loop)",
        f"loop:proj -> {down} (2 files, 7 bytes)",
    ]
    assert sorted(p.relative_to(down).as_posix() for p in down.rglob("*")) == ["d", "d/in", "top"]


def test_cp_of_a_tree_copies_names_with_a_backslash(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    """A backslash is an ordinary character of a Linux file name; a sandbox that listed `a\\b` made the whole
    download fail ("the sandbox listed an unusable name", exit 1, nothing copied) until December 6."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    assert cli(cluster, router, "create", "pool", *ns, "--name", "slash").returncode == 0
    made = cli(
        cluster, router, "exec", *ns, "slash", "--",
        "sh", "-c", "mkdir -p d/sub && echo b > 'd/a\\b' && echo s > d/sub/s",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    down = tmp_path / "down"
    got = cli(cluster, router, "cp", "slash:d", str(down), *ns)
    assert got.returncode == 0, got.stderr
    assert (down / "a\\b").read_text() == "b\n"
    assert (down / "sub" / "s").read_text() == "s\n"


def test_cp_of_a_local_tree_skips_a_name_no_file_api_can_carry_before_uploading(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    """A local name with a newline cannot be sent (no runtime's file API takes a control character): the copy
    stopped half-way at it - with the usage error's exit code 2, after the files before it were uploaded
    (until December 6). Every name is checked while the tree is walked; such a one is named on stderr and
    the rest copied, exit 1."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    assert cli(cluster, router, "create", "pool", *ns, "--name", "ctl").returncode == 0
    tree = tmp_path / "tree"
    (tree / "sub" / "bad\ndir").mkdir(parents=True)
    (tree / "sub" / "bad\ndir" / "inner").write_text("i\n")
    (tree / "a").write_text("a\n")
    (tree / "sub" / "new\nline").write_text("n\n")
    (tree / "sub" / "z").write_text("z\n")
    up = cli(cluster, router, "cp", str(tree), "ctl:up", *ns)
    assert up.returncode == 1, up.stderr
    lines = up.stderr.splitlines()
    assert lines[-1] == f"{tree} -> ctl:up (2 files, 4 bytes)"
    assert sorted(lines[:-1]) == sorted(
        f"error: {path!r}: not copied: a name with a control character, which no sandbox file API takes"
        for path in (str(tree / "sub" / "bad\ndir"), str(tree / "sub" / "new\nline"))
    )
    found = cli(cluster, router, "exec", *ns, "ctl", "--", "sh", "-c", "cd up && find . | sort")
    assert found.stdout.split("\n")[:-1] == [".", "./a", "./sub", "./sub/z"], found.stderr


def test_cp_of_nested_directories_that_list_alike_copies_them_all(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    """`chain` lists `x`, `chain/x` lists `x`, with the same size, mode and modification time (`mkdir -p` in
    one clock tick, a tar, a reproducible build): `chain/x` was taken for a symbolic link loop of `chain` and
    not copied, file and all, exit 1 (ef087c0). It is copied; only a listing that keeps repeating is a loop."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    assert cli(cluster, router, "create", "pool", *ns, "--name", "chain").returncode == 0
    made = cli(
        cluster, router, "exec", *ns, "chain", "--",
        "sh", "-c", "mkdir -p chain/x/x && echo f > chain/x/x/f && touch -r chain/x/x chain/x",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    down = tmp_path / "down"
    got = cli(cluster, router, "cp", "chain:chain", str(down), *ns)
    assert got.returncode == 0, got.stderr
    assert got.stderr.splitlines() == [f"chain:chain -> {down} (1 file, 2 bytes)"]
    assert (down / "x" / "x" / "f").read_text() == "f\n"


def test_cp_of_a_tree_to_the_sandboxs_root_copies_a_name_of_spaces(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    """The SDK refuses a path of only whitespace (upstream's order of checks, 9abf078); a file or empty
    directory named ` ` at the top of a tree copied to the sandbox's root stopped the copy (ValueError)."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    assert cli(cluster, router, "create", "pool", *ns, "--name", "spaces").returncode == 0
    tree = tmp_path / "tree"
    (tree / "  ").mkdir(parents=True)  # an empty directory, made by `mkdir -p`
    (tree / " ").write_text("s\n")
    (tree / "a").write_text("a\n")
    up = cli(cluster, router, "cp", f"{tree}/.", "spaces:", *ns)
    assert up.returncode == 0, up.stderr
    found = cli(cluster, router, "exec", *ns, "spaces", "--", "sh", "-c", "cat ' ' a && test -d '  '")
    assert (found.returncode, found.stdout) == (0, "s\na\n"), found.stderr
