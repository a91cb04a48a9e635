"""The kubelet's directory is read, never written: the agent works with it mounted read-only, and over a
writable one it creates, changes, locks and removes nothing there.

The node (values by hand): 2 NUMA nodes, CPUs 0-3 and 4-7. Pod ``ro/reader`` (UID ...a1) has ``app`` on CPUs
1-2 with 1 GiB of memory on node 0 and ``db`` on CPUs 5-7 with 2 GiB on node 1 and gpu0 on NUMA 1.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from otel_numa.model import DeviceEntry, MemoryBlock, MemoryTable, NumaMemoryState
from otel_numa.testing.checkpoints import (
    write_atomically,
    write_cpu_manager_state,
    write_device_checkpoint,
    write_memory_manager_state,
)
from otel_numa.testing.kubelet_scenario import (
    KubeletScenario,
    ScenarioPod,
    build_scenario,
    counted_errors,
    labels,
    series,
)
from otel_numa.testing.peers import REPO, agent_command, run_agent
from otel_numa.testing.sysfs_tree import uniform_nodes

GIB = 1 << 30
POD = "3e1d5c7a-9b2f-4a6e-8d0c-1f2e3d4c5ba1"
GPU = "example.com/gpu"
UNPRIVILEGED = 65534  # nobody

EXPECTED = {
    "numa_cpu_allocated": {labels(numa_node_id=0): 2, labels(numa_node_id=1): 3},
    "numa_memory_allocated_bytes": {labels(numa_node_id=0): 1 * GIB, labels(numa_node_id=1): 2 * GIB},
    "numa_device_allocated": {labels(numa_node_id=1, numa_resource_name=GPU): 1},
    "numa_container_cpu_allocated": {
        labels(
            k8s_pod_uid=POD,
            k8s_pod_name="reader",
            k8s_namespace_name="ro",
            k8s_container_name="app",
            numa_node_id=0,
        ): 2,
        labels(
            k8s_pod_uid=POD,
            k8s_pod_name="reader",
            k8s_namespace_name="ro",
            k8s_container_name="db",
            numa_node_id=1,
        ): 3,
    },
}


def make_node(root: Path) -> KubeletScenario:
    scenario = build_scenario(root, uniform_nodes(2, 4), [ScenarioPod(POD, "reader", "ro")])
    (scenario.kubelet_root / "pod-resources").mkdir()  # where the podresources socket would be
    write_cpu_manager_state(
        scenario.cpu_manager_path, "static", {0, 3, 4}, {POD: {"app": {1, 2}, "db": {5, 6, 7}}}
    )
    machine_state = {
        numa: NumaMemoryState(1, (numa,), {"memory": MemoryTable(8 * GIB, 0, 8 * GIB, (numa + 1) * GIB, 0)})
        for numa in (0, 1)
    }
    entries = {
        POD: {"app": [MemoryBlock((0,), "memory", 1 * GIB)], "db": [MemoryBlock((1,), "memory", 2 * GIB)]}
    }
    write_memory_manager_state(scenario.memory_manager_path, "Static", machine_state, entries)
    write_device_checkpoint(
        scenario.device_checkpoint_path, [DeviceEntry(POD, "db", GPU, {1: ("gpu0",)})], {GPU: ["gpu0"]}
    )
    return scenario


Tree = dict[str, tuple[str, int, int, int, int, int]]


def tree_state(root: Path) -> Tree:
    """Every entry under ``root`` (root included): kind, size, mode, inode, mtime and ctime in ns."""
    state: Tree = {}
    for directory, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            kind = "dir" if stat.S_ISDIR(info.st_mode) else "file" if stat.S_ISREG(info.st_mode) else "other"
            key = os.path.normpath(os.path.relpath(path, root))
            state[key] = (kind, info.st_size, info.st_mode, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)
    return state


def check_exposition(text: str) -> None:
    for name, expected in EXPECTED.items():
        assert series(text, name) == expected, name
    assert counted_errors(text) == {}
    read = {dict(key)["numa_source"] for key in series(text, "numa_agent_source_age_seconds")}
    assert {"cpu_manager", "memory_manager", "device_manager"} <= read


# --- a read-only kubelet directory ---------------------------------------------------------------

_BIND_READ_ONLY = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1"'


def _read_only_mount_works(scratch: Path) -> bool:
    """Whether a private mount namespace with a read-only bind mount can be had (root with CAP_SYS_ADMIN)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = f'{_BIND_READ_ONLY} && ! touch "$1/probe" 2>/dev/null'
    completed = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", probe, "sh", str(scratch)],
        capture_output=True,
        check=False,
    )
    return completed.returncode == 0 and not (scratch / "probe").exists()


def _as_unprivileged() -> None:
    os.setgroups([])
    os.setgid(UNPRIVILEGED)
    os.setuid(UNPRIVILEGED)


def _unprivileged_python_works() -> bool:
    """Whether the unprivileged user can run this interpreter and import the agent (not under /root)."""
    try:
        completed = subprocess.run(
            [sys.executable, "-c", "import otel_numa"],
            preexec_fn=_as_unprivileged,
            capture_output=True,
            check=False,
            cwd="/",
        )
    except OSError:
        return False
    return completed.returncode == 0


def _make_read_only_for(root: Path, uid: int) -> None:
    for directory, dirs, files in os.walk(root):
        for name in files:
            os.chown(os.path.join(directory, name), uid, uid)
            os.chmod(os.path.join(directory, name), 0o444)
        for name in dirs:
            os.chown(os.path.join(directory, name), uid, uid)
    for directory, dirs, _files in os.walk(root, topdown=False):
        for name in dirs:
            os.chmod(os.path.join(directory, name), 0o555)
    os.chown(root, uid, uid)
    os.chmod(root, 0o555)


@pytest.fixture
def world_readable_root() -> Iterator[Path]:
    """A scratch directory others can traverse (pytest's tmp_path is private to root)."""
    root = Path(tempfile.mkdtemp(prefix="otel-numa-ro-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        for directory, dirs, _files in os.walk(root):
            for name in dirs:
                os.chmod(os.path.join(directory, name), 0o755)
        shutil.rmtree(root)


def _run(command: list[str], preexec_fn: Callable[[], None] | None = None) -> str:
    completed = subprocess.run(
        command, capture_output=True, timeout=60, check=False, cwd=REPO, preexec_fn=preexec_fn
    )
    assert completed.returncode == 0, completed.stderr.decode(errors="replace")
    assert b"Traceback" not in completed.stderr, completed.stderr.decode(errors="replace")
    return completed.stdout.decode()


def test_the_agent_works_over_a_read_only_kubelet_directory(world_readable_root: Path) -> None:
    node = make_node(world_readable_root / "node")
    agent = agent_command(*node.cli_args("--once", podresources=True))
    scratch = world_readable_root / "probe"
    scratch.mkdir()
    if _read_only_mount_works(scratch):
        before = tree_state(node.kubelet_root)
        # the bind mount lives in the agent's own mount namespace: nothing to undo, nothing left behind
        script = f'{_BIND_READ_ONLY} && ! touch "$1/probe" 2>/dev/null && shift && exec "$@"'
        text = _run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
                str(node.kubelet_root),
                *agent,
            ]
        )
    elif os.geteuid() == 0 and _unprivileged_python_works():
        # no mount namespace: the kubelet's files as an unprivileged agent would find a tree it cannot write
        _make_read_only_for(node.kubelet_root, UNPRIVILEGED)
        before = tree_state(node.kubelet_root)
        text = _run(agent, preexec_fn=_as_unprivileged)
    else:
        pytest.skip(
            "neither a read-only bind mount nor an unprivileged user is available to make it read-only"
        )
    check_exposition(text)
    assert tree_state(node.kubelet_root) == before


# --- a writable kubelet directory, watched from inside the agent ---------------------------------

# Installed in the agent process (sitecustomize): records every Python-level attempt to write, create,
# rename, remove, re-mode or lock anything under the kubelet root, and counts the reads there.
AUDIT_HOOK = """
import os, sys

_ROOT = os.path.realpath(os.environ["AUDIT_KUBELET_ROOT"])
_LOG = os.environ["AUDIT_LOG"]
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CHANGES = {
    "os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.truncate", "os.chmod", "os.chown", "os.utime",
    "os.link", "os.symlink", "os.mknod", "os.mkfifo", "os.setxattr", "os.removexattr", "shutil.rmtree",
    "shutil.move", "shutil.copyfile",
}
_LOCKS = {"fcntl.flock", "fcntl.lockf"}


def _path(value):
    if isinstance(value, int):
        try:
            return os.readlink(f"/proc/self/fd/{value}")
        except OSError:
            return None
    if isinstance(value, (str, bytes, os.PathLike)):
        return os.path.abspath(os.fsdecode(value))
    return None


def _under_root(value):
    path = _path(value)
    return path is not None and (path == _ROOT or path.startswith(_ROOT + os.sep))


def _record(kind, event, args):
    with open(_LOG, "a") as log:
        log.write(f"{kind} {event} {args!r}\\n")


def _hook(event, args):
    try:
        if event == "open" and _under_root(args[0]):
            flags = args[2] or 0
            mode = args[1] or ""
            writing = flags & _WRITE_FLAGS or any(c in mode for c in "wax+")
            _record("WRITE" if writing else "read", event, args)
        elif event == "os.scandir" and args and _under_root(args[0]):
            _record("read", event, args)
        elif event in _CHANGES and any(_under_root(arg) for arg in args[:2]):
            _record("WRITE", event, args)
        elif event in _LOCKS:
            _record("LOCK", event, args)
    except Exception as exc:
        _record("HOOK-ERROR", event, exc)


sys.addaudithook(_hook)
"""


@pytest.mark.e2e
def test_the_agent_never_writes_under_the_kubelet_root(tmp_path: Path) -> None:
    node = make_node(tmp_path / "node")
    hook_dir = tmp_path / "audit"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(AUDIT_HOOK)
    audit_log = tmp_path / "audit.log"
    env = {
        "PYTHONPATH": str(hook_dir),
        "AUDIT_KUBELET_ROOT": str(node.kubelet_root),
        "AUDIT_LOG": str(audit_log),
    }
    args = node.cli_args("--interval", "1", podresources=True)
    with run_agent(args, tmp_path, env=env) as agent:
        check_exposition(agent.metrics_text())
        # the kubelet changes its files while the agent runs: a damaged file, its replacement, a deleted pod
        valid = node.cpu_manager_path.read_bytes()
        write_atomically(node.cpu_manager_path, valid.replace(b'"app":"1-2"', b'"app":"1-3"'))
        assert "numa_cpu_allocated" not in agent.metrics_text()
        write_atomically(node.cpu_manager_path, valid)
        assert series(agent.metrics_text(), "numa_cpu_allocated") == EXPECTED["numa_cpu_allocated"]
        node.remove_pod_directory(POD)
        assert series(agent.metrics_text(), "numa_container_cpu_allocated") == {}

        before = tree_state(node.kubelet_root)
        for _ in range(3):
            agent.metrics_text()
        assert agent.stop(signal.SIGTERM) == 0
        assert tree_state(node.kubelet_root) == before

    events = audit_log.read_text().splitlines()
    assert not [line for line in events if not line.startswith("read ")], "\n".join(events)
    # the hook did watch the agent: it saw the checkpoints and the pods directory being read
    assert any("cpu_manager_state" in line for line in events)
    assert any("os.scandir" in line and "/pods" in line for line in events)
