"""CDI spec files an attacker (or a broken driver) could write, for the tests: each costs little to write and,
parsed without a budget, a great deal to read."""

from __future__ import annotations


def aliased_spec(devices: int = 20_000, nodes: int = 50_000) -> bytes:
    """``devices`` devices sharing one anchored list of ``nodes`` device nodes (~0.9 MB by default): a few
    bytes per device, ``nodes`` device nodes each once the aliases are expanded."""
    lines = [
        "cdiVersion: 0.6.0",
        "kind: attack.example.com/alias",
        "devices:",
        "- name: d0",
        "  containerEdits:",
    ]
    lines.append("    deviceNodes: &n [" + ",".join(["{path: a}"] * nodes) + "]")
    lines += [f"- {{name: d{index}, containerEdits: {{deviceNodes: *n}}}}" for index in range(1, devices)]
    return ("\n".join(lines) + "\n").encode()


def laughing_spec(levels: int = 9, width: int = 9) -> bytes:
    """Nested aliases, each level ``width`` aliases of the one below (under 1 KB: ``width ** levels``
    nodes expanded)."""
    lines = ["cdiVersion: 0.6.0", "kind: attack.example.com/laughs", "devices: []"]
    lines.append("x0: &x0 [" + ", ".join(["lol"] * width) + "]")
    lines += [
        f"x{level}: &x{level} [" + ", ".join([f"*x{level - 1}"] * width) + "]" for level in range(1, levels)
    ]
    return ("\n".join(lines) + "\n").encode()


def plain_yaml_spec(min_bytes: int) -> bytes:
    """A spec shaped as a driver writes one (a device node, a major:minor and an env per device), in block
    YAML, with devices until it is at least ``min_bytes`` long: ~180 bytes and ~21 nodes a device."""
    lines = ["cdiVersion: 0.6.0", "kind: attack.example.com/plain", "devices:"]
    size, index = 0, 0
    while size < min_bytes:
        device = (
            f"- name: gpu-{index}\n  containerEdits:\n    deviceNodes:\n    - path: /dev/gpu{index}\n"
            f"      hostPath: /dev/gpu{index}\n      type: c\n      major: 195\n      minor: {index % 256}\n"
            f"    env:\n    - GPU_DEVICE_{index}=gpu-{index}"
        )
        lines.append(device)
        size += len(device) + 1
        index += 1
    return ("\n".join(lines) + "\n").encode()
