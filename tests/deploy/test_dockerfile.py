"""Static checks of the container image recipe (no Docker engine needed).

The Dockerfile is parsed into stages and instructions; each check states a property the image must
have: sources that exist in the build context, a final stage without build tools, an entry point that
is the project's console script, and a health check that really probes /healthz.
"""

from __future__ import annotations

import http.server
import json
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

BUILD_TOOLS = ("gcc", "g++", "clang", "make", "build-essential", "cmake", "python3-dev", "libc6-dev", "cargo")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Joins backslash continuations and drops comments, as the Dockerfile parser does."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        yield start, " ".join(part for part in pending if part)
        pending = []
    if pending:
        yield start, " ".join(pending)


def parse_dockerfile(text: str) -> list[Stage]:
    stages: list[Stage] = []
    for number, line in logical_lines(text):
        keyword, _, arguments = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = arguments.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif stages:
            stages[-1].instructions.append(Instruction(keyword, arguments.strip(), number))
    return stages


def split_flags(arguments: str) -> tuple[dict[str, str], list[str]]:
    """Splits `--flag=value` options from the operands of COPY/RUN/HEALTHCHECK."""
    flags: dict[str, str] = {}
    words = shlex.split(arguments) if not arguments.lstrip().startswith("[") else [arguments]
    operands: list[str] = []
    for index, word in enumerate(words):
        if word.startswith("--") and not operands:
            name, _, value = word[2:].partition("=")
            flags[name] = value
        else:
            operands = words[index:]
            break
    return flags, operands


def copy_sources(instruction: Instruction) -> tuple[dict[str, str], list[str]]:
    flags, operands = split_flags(instruction.arguments)
    if operands and operands[0].startswith("["):
        operands = json.loads(" ".join(operands))
    return flags, operands[:-1]


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Whether the build context leaves `path` out: the last matching pattern wins, `!` re-includes,
    and a pattern that matches a parent directory matches everything below it."""

    def to_regex(pattern: str) -> re.Pattern[str]:
        out = ""
        index = 0
        while index < len(pattern):
            if pattern.startswith("**/", index):
                out += "(?:.*/)?"
                index += 3
            elif pattern.startswith("**", index):
                out += ".*"
                index += 2
            elif pattern[index] == "*":
                out += "[^/]*"
                index += 1
            elif pattern[index] == "?":
                out += "[^/]"
                index += 1
            elif pattern[index] == "[":
                end = pattern.index("]", index)
                out += pattern[index : end + 1]
                index = end + 1
            else:
                out += re.escape(pattern[index])
                index += 1
        return re.compile(out + r"\Z")

    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: length + 1]) for length in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        regex = to_regex(pattern.lstrip("!").strip("/"))
        if any(regex.match(candidate) for candidate in candidates):
            excluded = not negated
    return excluded


def read_dockerignore() -> list[str]:
    lines = DOCKERIGNORE.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final(stages: list[Stage]) -> Stage:
    return stages[-1]


def test_parser_reads_continuations_and_stages() -> None:
    text = "# c\nFROM a:1 AS one\nRUN x \\\n    # inner comment\n    y\nFROM b:2\nCOPY --from=one /w /w\n"
    parsed = parse_dockerfile(text)
    assert [(s.base, s.name) for s in parsed] == [("a:1", "one"), ("b:2", None)]
    assert parsed[0].instructions[0].arguments == "x y"
    assert copy_sources(parsed[1].instructions[0]) == ({"from": "one"}, ["/w"])


def global_build_args(text: str) -> dict[str, str | None]:
    """The ARGs before the first FROM (the only ones a FROM line may use), with their defaults."""
    found: dict[str, str | None] = {}
    for _, line in logical_lines(text):
        keyword, _, arguments = line.partition(" ")
        if keyword.upper() == "FROM":
            break
        if keyword.upper() == "ARG":
            name, equals, default = arguments.strip().partition("=")
            found[name] = default if equals else None
    return found


def test_multi_stage_on_a_pinned_python_311_slim_base(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    base_default = global_build_args(DOCKERFILE.read_text()).get("BASE_IMAGE")
    assert base_default, "ARG BASE_IMAGE=<default> before the first FROM lets a local base replace it"
    pinned = re.compile(r"^python:3\.11\.\d+-slim(-[a-z]+)?$")
    assert pinned.match(base_default), f"default base {base_default!r} is not a pinned python:3.11.X-slim tag"
    for stage in stages:
        assert stage.base in ("${BASE_IMAGE}", "$BASE_IMAGE"), f"stage on {stage.base!r}, not on BASE_IMAGE"
    assert stages[0].name, "the builder stage needs a name for the final stage to refer to"


def test_nothing_depends_on_where_the_base_keeps_python(stages: list[Stage]) -> None:
    # the official image's Python lives in /usr/local, Debian's in /usr: commands on the PATH only
    for stage in stages:
        for instruction in stage.instructions:
            assert not re.search(r"/usr/(local/)?(bin|lib)/python", instruction.arguments), instruction


def test_builder_turns_the_project_into_wheels(stages: list[Stage]) -> None:
    builder = stages[0]
    runs = " ".join(i.arguments for i in builder.all("RUN"))
    assert re.search(r"pip wheel\b.*--wheel-dir[= ]/wheels\b.*\s\.(\s|$)", runs), runs
    # the exact releases the agent was proven on, not whatever PyPI has newest that day
    assert re.search(r"pip wheel\b.*--constraint[= ]constraints\.txt\b", runs), runs


def test_every_copy_source_is_in_the_build_context(stages: list[Stage]) -> None:
    patterns = read_dockerignore()
    names = {stage.name for stage in stages if stage.name}
    checked = 0
    for stage in stages:
        for instruction in stage.all("COPY") + stage.all("ADD"):
            flags, sources = copy_sources(instruction)
            if "from" in flags:
                assert flags["from"] in names, f"line {instruction.line}: unknown stage {flags['from']!r}"
                continue
            for source in sources:
                assert (REPO / source).exists(), f"line {instruction.line}: {source} does not exist"
                assert not dockerignore_excludes(patterns, source), f"{source} is left out by .dockerignore"
                checked += 1
    assert checked >= 2


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    patterns = read_dockerignore()
    for leaked in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/deploy/test_dockerfile.py",
        "otel_numa/__pycache__/x.pyc",
    ):
        assert dockerignore_excludes(patterns, leaked), leaked
    for needed in ("pyproject.toml", "otel_numa/__init__.py", "otel_numa/sources/files.py"):
        assert not dockerignore_excludes(patterns, needed), needed


def test_dockerignore_matcher_follows_last_match_wins() -> None:
    assert dockerignore_excludes(["*", "!keep/", "**/junk"], "keep/junk/file")
    assert not dockerignore_excludes(["*", "!keep/"], "keep/a/b.py")
    assert dockerignore_excludes(["*"], "anything/at/all")


def test_final_stage_installs_only_the_built_wheels(stages: list[Stage], final: Stage) -> None:
    runs = final.all("RUN")
    assert runs, "the final stage must install the wheels"
    builder = stages[0].name
    for instruction in runs:
        text = instruction.arguments
        assert "apt-get" not in text and "apk " not in text, f"line {instruction.line}: system packages"
        for tool in BUILD_TOOLS:
            assert not re.search(rf"(^|\s){re.escape(tool)}(\s|$)", text), f"line {instruction.line}: {tool}"
        if "pip install" in text:
            assert "--no-index" in text, "pip must not reach an index in the final stage"
            assert f"from={builder}" in text, "the wheels come from the builder stage"
        assert "pip wheel" not in text
    for instruction in final.all("COPY") + final.all("ADD"):
        flags, _ = copy_sources(instruction)
        assert "from" in flags, f"line {instruction.line}: the final stage copies from the build context"


def test_runs_as_a_non_root_user_by_default(final: Stage) -> None:
    users = final.all("USER")
    assert users, "no USER in the final stage"
    uid = users[-1].arguments.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "use a numeric non-root UID so runAsNonRoot can check it"


def test_entrypoint_is_the_console_script(final: Stage) -> None:
    entrypoints = final.all("ENTRYPOINT")
    assert entrypoints, "no ENTRYPOINT"
    command = json.loads(entrypoints[-1].arguments)
    assert isinstance(command, list), "use the exec form so signals reach the agent"
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert command[0] in scripts


def test_exposes_the_metrics_and_health_ports(final: Stage) -> None:
    exposed = {word.split("/")[0] for i in final.all("EXPOSE") for word in i.arguments.split()}
    assert {"9464", "9465"} <= exposed


def healthcheck_command(final: Stage) -> list[str]:
    checks = final.all("HEALTHCHECK")
    assert len(checks) == 1, "exactly one HEALTHCHECK"
    arguments = checks[0].arguments
    _, _, command = arguments.partition("CMD ")
    assert command, "HEALTHCHECK must run a command"
    parsed = json.loads(command)
    assert isinstance(parsed, list) and all(isinstance(word, str) for word in parsed)
    return list(parsed)


def test_healthcheck_probes_healthz_with_the_standard_library(final: Stage) -> None:
    command = healthcheck_command(final)
    assert command[0] == "python", "the slim image has python but no curl or wget"
    assert "urllib" in command[-1]
    assert "/healthz" in command[-1] and ":9465/" in command[-1]


class _HealthHandler(http.server.BaseHTTPRequestHandler):
    status = 200
    seen: list[str] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


def run_healthcheck(final: Stage, port: int) -> int:
    command = healthcheck_command(final)
    command[0] = sys.executable
    command[-1] = command[-1].replace(":9465/", f":{port}/")
    return subprocess.run(command, capture_output=True, timeout=20).returncode


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_healthcheck_follows_the_endpoint_status(final: Stage, status: int, healthy: bool) -> None:
    handler: type[_HealthHandler] = type("Handler", (_HealthHandler,), {"status": status, "seen": []})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        returncode = run_healthcheck(final, server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
    assert (returncode == 0) is healthy
    assert handler.seen == ["/healthz"]


def test_healthcheck_fails_when_nothing_listens(final: Stage) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _HealthHandler)
    port = server.server_address[1]
    server.server_close()
    assert run_healthcheck(final, port) != 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def test_healthcheck_passes_against_the_running_agent(final: Stage, tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "otel_numa", "--exporter=console", "--interval=3600"]
    command += [f"--health-address=127.0.0.1:{port}", "--node-name=test-node", "--podresources-socket=none"]
    command += [
        f"--kubelet-root={tmp_path}",
        f"--pod-logs-root={tmp_path}",
        f"--container-logs-root={tmp_path}",
    ]
    log = tmp_path / "agent.log"
    with log.open("wb") as log_file:
        agent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log_file)
    try:
        deadline = time.monotonic() + 30
        while http_status(f"http://127.0.0.1:{port}/readyz") != 200:
            assert agent.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the agent never became ready"
            time.sleep(0.2)
        assert run_healthcheck(final, port) == 0
    finally:
        agent.terminate()
        agent.wait(timeout=15)
