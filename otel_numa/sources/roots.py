"""Start-up checks of the configured roots: a directory that holds none of what the agent reads there is
almost always a mount mistake (the host's /sys not mounted, a kubelet directory at another path), which
would otherwise look like a healthy node with nothing on it."""

from __future__ import annotations

from pathlib import Path

# What a kubelet root holds on any node that has run a pod: one of these is enough.
KUBELET_FILES = (
    "cpu_manager_state",
    "memory_manager_state",
    "device-plugins/kubelet_internal_checkpoint",
    "pods",
    "pod-resources",
)


def sysfs_problem(root: Path) -> str | None:
    """Why ``root`` is not a sysfs mount, or None."""
    if (root / "devices" / "system").is_dir():
        return None
    return f"{root} holds no devices/system: is the host's /sys mounted there? (--sysfs-root)"


def kubelet_problem(root: Path) -> str | None:
    """Why ``root`` is not the kubelet's state directory, or None. A root that does not exist at all is a
    machine without a kubelet (a workstation, a test): its sources are merely absent."""
    if not root.exists() or any((root / name).exists() for name in KUBELET_FILES):
        return None
    return (
        f"{root} holds none of the kubelet's files ({', '.join(KUBELET_FILES)}): is the kubelet's "
        "directory mounted there? (--kubelet-root)"
    )


def cgroup_problem(root: Path) -> str | None:
    """Why ``root`` is not a cgroup mount (v2: ``cgroup.controllers``; v1: controller directories), or None.
    A root that does not exist is a machine without cgroups there: the source is merely absent."""
    if not root.exists() or (root / "cgroup.controllers").is_file() or (root / "cgroup.procs").is_file():
        return None
    try:
        children = [child for child in root.iterdir() if child.is_dir()]
    except OSError:
        children = []
    if any((child / "cgroup.procs").is_file() or (child / "tasks").is_file() for child in children):
        return None
    return f"{root} is not a cgroup mount (no cgroup.controllers, no controller directories) (--cgroup-root)"
