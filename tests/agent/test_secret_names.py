"""Secrets stay home: names that may hold a secret are refused (look-alike letters folded first), for
environment variables, pod labels and pod annotations alike, and URL-shaped values lose their credentials,
on the page of the agent as it serves."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_numa.sources.secret_names import fold, is_secret_like, without_url_credentials
from otel_numa.testing.checkpoints import write_cpu_manager_state
from otel_numa.testing.cri_server import CriServer, one_running_container
from otel_numa.testing.kubelet_scenario import KubeletScenario, ScenarioPod, build_scenario, series
from otel_numa.testing.peers import run_agent, wait_for
from otel_numa.testing.podresources_server import short_socket_dir
from otel_numa.testing.sysfs_tree import uniform_nodes

# Names that exported a secret when allowlisted, and look-alike spellings of refused ones.
LEAKED_BEFORE = [
    "PWD", "DB_PWD", "AUTH", "AUTHORIZATION", "CREDS", "BEARER", "JWT", "GITHUB_PAT", "DSN", "SENTRY_DSN",
    "PRIVATE_PEM", "SSH_PRIV", "HMAC", "SIGNING_SALT", "KUBECONFIG", "VAULT_ROLE_ID", "SLACK_WEBHOOK_URL",
]  # fmt: skip
LOOK_ALIKES = [
    "\u03a4OKEN",  # Greek capital Tau
    "S\u0415CRET",  # Cyrillic capital Ie
    "\u0420\u0410SSWORD",  # Cyrillic Er and A
    "\uff30\uff21\uff33\uff33\uff37\uff2f\uff32\uff24",  # full-width PASSWORD
    "P\u00c1SSWORD",  # an accent
    "api\u0422oken",  # camel case with a Cyrillic Te
    "DB_PASS_WORD",
    "githubPat",
]
ORDINARY = ["TEAM", "LOG_LEVEL", "HOSTNAME", "PATH", "COST_CENTER", "NODE_NAME", "REGION", "DATABASE_URL"]


@pytest.mark.parametrize("name", LEAKED_BEFORE + LOOK_ALIKES)
def test_names_that_may_hold_a_secret_are_refused(name: str) -> None:
    assert is_secret_like(name)


@pytest.mark.parametrize("name", [*ORDINARY, "app.kubernetes.io/name", "team", "owner"])
def test_ordinary_names_are_kept(name: str) -> None:
    assert not is_secret_like(name)


def test_look_alike_letters_fold_to_latin() -> None:
    assert fold("\u03a4OKEN") == "TOKEN" and fold("\u0420\u0410SS") == "PASS"


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("postgres://admin:hunter2@db.example:5432/app", "postgres://db.example:5432/app"),
        ("redis://:hunter2@redis:6379/0", "redis://redis:6379/0"),
        ("https://user:p@ss@host/x?a=b@c", "https://host/x?a=b@c"),  # an unescaped @ in the password
        (
            "primary mysql://u:pw@m1/db, replica mysql://u:pw@m2/db",
            "primary mysql://m1/db, replica mysql://m2/db",
        ),
        ("https://example.com/a@b", "https://example.com/a@b"),  # an @ in the path is no user
        ("alice@example.com", "alice@example.com"),
    ],
)
def test_url_credentials_are_taken_out(value: str, kept: str) -> None:
    assert without_url_credentials(value) == kept


UID = "0b8c1a7e-5d2f-4e3a-9c61-7a2d4b5e6f70"
SECRET = "hunter2-do-not-export"


@pytest.fixture
def node(tmp_path: Path) -> KubeletScenario:
    scenario = build_scenario(tmp_path, uniform_nodes(2, 4), [ScenarioPod(UID, "shop-0", "retail")])
    write_cpu_manager_state(scenario.cpu_manager_path, "static", {0, 1, 2, 3, 6, 7}, {UID: {"api": {4, 5}}})
    return scenario


ENV = {
    **{name: f"{SECRET}-{index}" for index, name in enumerate(LEAKED_BEFORE + LOOK_ALIKES)},
    "DATABASE_URL": f"postgres://shop:{SECRET}@db.retail:5432/shop",
    "REDIS_URL": f"redis://:{SECRET}@cache:6379/0",
    "TEAM": "checkout",
}
LABELS = {"team": "checkout", "vault.hashicorp.com/role-id": SECRET, "api-token": SECRET}
ANNOTATIONS = {
    "owner": "bob",
    "upstream": f"https://deploy:{SECRET}@git.example/shop.git",
    "vault.hashicorp.com/agent-inject-secret-db": SECRET,
    "auth\u0422oken": SECRET,
}


@pytest.fixture
def runtime() -> Iterator[CriServer]:
    directory = short_socket_dir()
    with CriServer(directory / "containerd.sock") as server:
        one_running_container(
            server, (UID, "shop-0", "retail"), ("c1", "api"), labels=LABELS, annotations=ANNOTATIONS, env=ENV
        )
        yield server
    shutil.rmtree(directory, ignore_errors=True)


def test_the_agent_exports_no_secret_of_any_allowlisted_name(
    tmp_path: Path, node: KubeletScenario, runtime: CriServer
) -> None:
    allowlist = [
        *(flag for name in ENV for flag in ("--enrich-env", name)),
        *(flag for key in LABELS for flag in ("--enrich-pod-label", key)),
        *(flag for key in ANNOTATIONS for flag in ("--enrich-pod-annotation", key)),
    ]
    args = node.cli_args(
        "--cri-socket", str(runtime.socket_path), "--enrich-value-max-length", "256", *allowlist
    )
    with run_agent(args, tmp_path) as agent:

        def enriched_page() -> str | None:
            page = agent.metrics_text()
            return page if "numa_container_info{" in page else None

        text = wait_for(enriched_page, 30, "the enrichment on the page")
        log = agent.log()
    [info] = series(text, "numa_container_info")
    attributes = dict(info)
    assert SECRET not in text
    assert {
        key: value for key, value in attributes.items() if key.startswith(("env_", "label_", "annotation_"))
    } == {
        "env_TEAM": "checkout",
        "env_DATABASE_URL": "postgres://db.retail:5432/shop",
        "env_REDIS_URL": "redis://cache:6379/0",
        "label_team": "checkout",
        "annotation_owner": "bob",
        "annotation_upstream": "https://git.example/shop.git",
    }
    # the operator is told once which allowlisted names were refused, by setting
    refusals = [line for line in log.splitlines() if "allowlisted names refused" in line]
    assert len(refusals) == 1
    for setting, name in [
        ("enrich_env", "GITHUB_PAT"),
        ("enrich_env", "\u03a4OKEN"),
        ("enrich_pod_labels", "api-token"),
        ("enrich_pod_annotations", "vault.hashicorp.com/agent-inject-secret-db"),
    ]:
        assert f"{setting}: {name}" in refusals[0]
