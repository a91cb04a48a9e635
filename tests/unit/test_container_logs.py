"""Container identities from the names of the kubelet's log symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_numa.model import ContainerIdentity
from otel_numa.sources.container_logs import parse_container_log_name, read_container_identities
from otel_numa.sources.errors import SourceMissing

ID_1 = "4f2d8b1c9e0a7d6f5b3c2a1908e7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c6b"
ID_2 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
ID_3 = "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff"


def _link(root: Path, name: str, target: str = "/var/log/pods/x/y/0.log") -> None:
    os.symlink(target, root / name)  # dangling on purpose: only the name is read


def test_names_split_with_dashes_everywhere(tmp_path: Path) -> None:
    _link(tmp_path, f"coredns-5d78c9869d-x7k2p_kube-system_coredns-{ID_1}.log")
    _link(tmp_path, f"web-0_shop-prod_istio-proxy-{ID_2}.log")
    _link(tmp_path, f"etcd-node-1.example.com_kube-system_etcd-{ID_3}.log")

    assert read_container_identities(tmp_path) == {
        ID_1: ContainerIdentity("coredns-5d78c9869d-x7k2p", "kube-system", "coredns", ID_1),
        ID_2: ContainerIdentity("web-0", "shop-prod", "istio-proxy", ID_2),
        ID_3: ContainerIdentity("etcd-node-1.example.com", "kube-system", "etcd", ID_3),
    }


def test_container_name_ending_in_hex_like_words(tmp_path: Path) -> None:
    _link(tmp_path, f"job-abc_batch_worker-beef-{ID_1}.log")
    assert read_container_identities(tmp_path)[ID_1].container_name == "worker-beef"


@pytest.mark.parametrize(
    "name",
    [
        f"pod_ns_ctr-{ID_1[:63]}.log",  # id too short
        f"pod_ns_ctr-{ID_1}g.log",  # not hex
        f"pod_ns_ctr-{ID_1.upper()}.log",  # runtimes write lowercase ids
        f"pod_ns_ctr-{ID_1}.log.1",  # rotated copy
        f"pod_ns_ctr_{ID_1}.log",  # no '-' before the id
        f"pod_ctr-{ID_1}.log",  # namespace missing
        f"pod_ns_extra_ctr-{ID_1}.log",  # names never contain '_'
        f"pod_ns_-{ID_1}.log",  # empty container name
        "README",
    ],
)
def test_other_names_are_ignored(name: str) -> None:
    assert parse_container_log_name(name) is None


def test_directory_with_foreign_files(tmp_path: Path) -> None:
    _link(tmp_path, f"a_b_c-{ID_1}.log")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "subdir").mkdir()
    assert list(read_container_identities(tmp_path)) == [ID_1]


def test_empty_directory(tmp_path: Path) -> None:
    assert read_container_identities(tmp_path) == {}


def test_missing_root(tmp_path: Path) -> None:
    with pytest.raises(SourceMissing):
        read_container_identities(tmp_path / "containers")
    (tmp_path / "file").write_text("")
    with pytest.raises(SourceMissing):
        read_container_identities(tmp_path / "file")


def test_names_listed_again_are_last_rounds_objects_while_they_are_equal(tmp_path: Path) -> None:
    """Every round lists the directory anew; a container whose name did not change keeps last round's
    identity object (and so its strings), and an unchanged listing is last round's mapping itself."""
    from otel_numa.snapshot.collectors.cgroups import ContainerLogNames

    _link(tmp_path, f"web-0_shop_app-{ID_1}.log")
    _link(tmp_path, f"web-1_shop_app-{ID_2}.log")
    names = ContainerLogNames(tmp_path)
    first = names()
    again = names()
    assert again is first
    _link(tmp_path, f"web-2_shop_app-{ID_3}.log")
    third = names()
    assert third is not first and set(third) == {ID_1, ID_2, ID_3}
    assert third[ID_1] is first[ID_1] and third[ID_2] is first[ID_2]
    assert third[ID_3] == ContainerIdentity("web-2", "shop", "app", ID_3)
    os.unlink(tmp_path / f"web-0_shop_app-{ID_1}.log")
    assert names() == {ID_2: first[ID_2], ID_3: third[ID_3]}


def test_a_containers_names_and_ids_are_one_string_whichever_source_read_them() -> None:
    """A node's sources name the same pods and containers again and again (log names, cgroup paths,
    checkpoints, podresources): each name or id is kept once for all of them."""
    from otel_numa.proto import podresources_v1_pb2 as pb
    from otel_numa.sources.cgroups import _container_id_of, _pod_uid_of
    from otel_numa.sources.checkpoints.cpu_manager import parse_cpu_manager_state
    from otel_numa.sources.pod_logs import parse_pod_log_dir_name
    from otel_numa.sources.podresources_answer import AnswerReader, MachineLimits
    from otel_numa.testing.checkpoints import cpu_manager_state_bytes

    uid, container_id = "0d4e5b8a-1c2f-4a6b-9e7d-3f1a2b3c4d5e", "ab" * 32
    log = parse_container_log_name("_".join(["web-0", "shop", f"app-{container_id}.log"]))
    pod = parse_pod_log_dir_name("_".join(["shop", "web-0", uid]))
    assert log is not None and pod is not None
    assert log.namespace is pod.namespace and log.pod_name is pod.name
    assert _pod_uid_of("pod" + uid) is pod.uid
    assert _container_id_of(f"cri-containerd-{container_id}.scope") is log.container_id
    cpu_manager = parse_cpu_manager_state(cpu_manager_state_bytes("static", [0], {uid: {"app": [1, 2]}}))
    ((checkpoint_uid, containers),) = cpu_manager.entries.items()
    assert checkpoint_uid is pod.uid and next(iter(containers)) is log.container_name
    answer = pb.PodResources(name="web-0", namespace="shop", containers=[pb.ContainerResources(name="app")])
    (listed,) = AnswerReader(MachineLimits(), "List").pods([answer])
    assert listed.name is pod.name and listed.namespace is pod.namespace
    assert listed.containers[0].name is log.container_name


def test_a_listing_again_parses_only_names_it_had_not_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory that just changed is listed every round until it settles; the names found before are
    not parsed again, and the same links give the same mapping."""
    from otel_numa.sources import container_logs

    _link(tmp_path, f"web-0_shop_app-{ID_1}.log")
    _link(tmp_path, f"web-1_shop_app-{ID_2}.log")
    parsed: list[str] = []

    def counting(name: str) -> ContainerIdentity | None:
        parsed.append(name)
        return parse_container_log_name(name)

    monkeypatch.setattr(container_logs, "parse_container_log_name", counting)
    listing = container_logs.ContainerLogListing(tmp_path)  # the links are new: never settled
    first = listing.identities()
    assert len(parsed) == 2
    assert listing.identities() is first and len(parsed) == 2
    _link(tmp_path, f"web-2_shop_app-{ID_3}.log")
    third = listing.identities()
    assert parsed[2:] == [f"web-2_shop_app-{ID_3}.log"]
    assert third[ID_1] is first[ID_1] and set(third) == {ID_1, ID_2, ID_3}
    os.unlink(tmp_path / f"web-0_shop_app-{ID_1}.log")
    assert set(listing.identities()) == {ID_2, ID_3} and len(parsed) == 3
    _link(tmp_path, f"web-0_shop_app-{ID_1}.log")  # a name forgotten when it left is parsed anew
    assert set(listing.identities()) == {ID_1, ID_2, ID_3} and len(parsed) == 4
