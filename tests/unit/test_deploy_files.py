"""docker-compose.yml, the Dockerfile and the Procfile only run what the CLIs and settings have.

Docker is not available here, so the compose file and the Dockerfile are
checked by parsing them: every command and healthcheck that calls
``toolexec`` or ``celery`` must parse with the real command-line interfaces,
every ``TOOLEXEC_*`` variable must be a setting, every published port must be
on loopback, the image must install every extra the docs send a user to, and
the services keep the properties operations rely on. The Procfile really runs
in tests/integration/test_procfile.py.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from celery.bin.celery import celery as celery_cli

from toolexec.ops.cli import cli as toolexec_cli
from toolexec.settings import Settings

REPO = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
_DEFAULT = re.compile(r"\$\{(\w+):[-?+]([^}]*)\}")


def procfile() -> dict[str, str]:
    lines = (REPO / "Procfile").read_text().splitlines()
    found = dict(line.split(":", 1) for line in lines if line.strip() and not line.startswith("#"))
    return {name.strip(): command.strip() for name, command in found.items()}


def _expand(text: str) -> str:
    """Shell defaults (${X:-d}) by their default, other variables by a placeholder."""
    while _DEFAULT.search(text):
        text = _DEFAULT.sub(lambda m: m.group(2), text)
    return re.sub(r"\$\$?\{?(\w+)\}?", "x", text)


def invocations(command: str | list[str]) -> list[list[str]]:
    """The toolexec/celery invocations in a command (list form or a shell string)."""
    words = list(command) if isinstance(command, list) else shlex.split(_expand(command))
    if words[:2] == ["sh", "-c"] or words[:1] == ["CMD-SHELL"]:
        words = shlex.split(_expand(words[-1]))
    words = [w for w in words if not re.match(r"^\w+=", w)]  # VAR=value prefixes
    return [words] if words and words[0] in ("toolexec", "celery") else []


def check_parses(words: list[str]) -> click.Command:
    """Resolve sub-commands and parse the options as the real CLI would, without running."""
    group: click.Command = toolexec_cli if words[0] == "toolexec" else celery_cli
    args = words[1:]
    if words[0] == "celery":
        assert args[:2] == ["-A", "toolexec.worker.app"], words
        args = args[2:]
    command = group
    while isinstance(command, click.Group):
        found = command.get_command(click.Context(command), args[0])
        assert found is not None, f"{' '.join(words)}: no command {args[0]!r}"
        command, args = found, args[1:]
    command.make_context(command.name or "", list(args))
    return command


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, rest) per Dockerfile line, continuation lines joined."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def image_extras() -> set[str]:
    """The extras of toolexec the image installs (``pip install '.[a,b]'``)."""
    found: set[str] = set()
    for instruction, rest in dockerfile():
        if instruction == "RUN" and "pip install" in rest:
            for group in re.findall(r"\.\[([\w,-]+)\]", rest):
                found |= set(group.split(","))
    return found


def image_command() -> list[str]:
    (cmd,) = [rest for instruction, rest in dockerfile() if instruction == "CMD"]
    words: list[str] = yaml.safe_load(cmd)  # the exec form is a JSON (so YAML) list
    return words


def all_commands() -> list[tuple[str, list[str]]]:
    found = [("Dockerfile:CMD", image_command())]
    for name, service in SERVICES.items():
        for source in (service.get("command"), service.get("healthcheck", {}).get("test")):
            if source:
                found += [(f"compose:{name}", words) for words in invocations(source)]
    for name, command in procfile().items():
        found += [(f"Procfile:{name}", words) for words in invocations(command)]
    return found


def test_the_deploy_files_call_the_cli_at_all() -> None:
    """Guards the test below against a parser that finds nothing to check."""
    sources = {source for source, _ in all_commands()}
    assert {"compose:worker", "compose:flower", "Procfile:worker", "Procfile:flower"} <= sources
    assert "Procfile:valkey" in sources


@pytest.mark.parametrize(("source", "words"), all_commands(), ids=lambda v: str(v)[:40])
def test_every_command_exists_in_the_cli_with_those_options(source: str, words: list[str]) -> None:
    check_parses(words)


def test_an_unknown_option_or_command_would_be_caught() -> None:
    with pytest.raises(click.NoSuchOption):
        check_parses(["toolexec", "worker", "--no-such-option"])
    with pytest.raises(AssertionError, match="no command 'wrker'"):
        check_parses(["toolexec", "wrker"])
    with pytest.raises(click.NoSuchOption):
        check_parses(["celery", "-A", "toolexec.worker.app", "inspect", "ping", "--no-such"])


def test_procfile_runs_the_same_processes_as_compose() -> None:
    """The monitoring stack (Prometheus, Grafana) is compose's alone: it has no binaries here."""
    assert set(procfile()) == {"valkey", "worker", "flower"}
    assert set(SERVICES) == {"valkey", "worker", "flower", "prometheus", "grafana"}


def test_compose_provisions_the_dashboard_from_files_that_exist() -> None:
    for name in ("prometheus", "grafana"):
        for volume in SERVICES[name]["volumes"]:
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (REPO / source).is_file(), volume
    scrape = yaml.safe_load((REPO / "docs/deploy/prometheus.yml").read_text())
    (worker_job,) = [j for j in scrape["scrape_configs"] if j["job_name"] == "toolexec-worker"]
    port = worker_job["dns_sd_configs"][0]["port"]
    assert str(port) in SERVICES["worker"]["command"]
    assert SERVICES["worker"]["environment"]["TOOLEXEC_METRICS_ADDRESS"] == "0.0.0.0"


def test_valkey_never_evicts_and_persists() -> None:
    valkey = SERVICES["valkey"]
    command = [str(word) for word in valkey["command"]]
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(volume.endswith(":/data") for volume in valkey["volumes"])


def test_every_service_has_a_healthcheck() -> None:
    assert all("test" in service.get("healthcheck", {}) for service in SERVICES.values())


def test_the_worker_scales_with_unique_names() -> None:
    """--scale needs no fixed container name or host port; %h differs per replica."""
    worker = SERVICES["worker"]
    assert "container_name" not in worker and "ports" not in worker
    assert "worker@%h" in worker["command"]
    assert "worker@$$HOSTNAME" in worker["healthcheck"]["test"][1]


def test_flower_takes_basic_auth_from_the_environment_and_never_inline() -> None:
    flower = SERVICES["flower"]
    env = flower["environment"]
    assert env["TOOLEXEC_FLOWER_USER"].startswith("${TOOLEXEC_FLOWER_USER")
    assert env["TOOLEXEC_FLOWER_PASSWORD"].startswith("${TOOLEXEC_FLOWER_PASSWORD")
    assert flower["command"][:2] == ["toolexec", "flower"]
    assert not any("basic" in word for word in flower["command"])
    assert "basic" not in procfile()["flower"]


# -- the image -------------------------------------------------------------------------------

#: Extras the image leaves out, and why: none of them runs a documented command or setting.
NOT_IN_THE_IMAGE = {
    "dev": "the test suite's",
    "e2e": "the browser test's",
    "bench": "the benchmarks'",
    "preview": "the dashboard preview's (make dashboard-preview)",
    "sdks": "the agent process's (the model SDKs), not a worker's",
    "openai-agents": "the agent process's (toolexec.integrations), not a worker's",
    "pydantic-ai": "the agent process's (toolexec.integrations), not a worker's",
    "langchain": "the agent process's (toolexec.integrations), not a worker's",
    "docs": "the documentation build's (make docs)",
}


def test_the_image_installs_every_extra_the_docs_send_a_user_to() -> None:
    """Every ``toolexec[x]`` the README or docs name is in the image, or left out on purpose."""
    declared = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
    named = {
        extra
        for page in pages
        for group in re.findall(r"toolexec\[([\w,-]+)\]", page.read_text())
        for extra in group.split(",")
    }
    installed = image_extras()

    assert {"ops", "mcp", "otel", "s3"} <= installed, installed
    assert installed <= declared, installed - declared
    assert named - installed <= set(NOT_IN_THE_IMAGE), named - installed - set(NOT_IN_THE_IMAGE)
    assert set(NOT_IN_THE_IMAGE) <= declared  # an extra renamed away is noticed here


def test_the_image_runs_the_worker_as_a_user_with_the_tools_on_its_path() -> None:
    instructions = dict(dockerfile())
    assert image_command()[:2] == ["toolexec", "worker"]
    assert instructions["USER"] != "root" and "PYTHONPATH=/tools" in instructions["ENV"]
    assert "./tools:/tools:ro" in SERVICES["worker"]["volumes"]


# -- ports and variables ---------------------------------------------------------------------


def _published(service: dict[str, Any]) -> list[str]:
    return [str(port) for port in service.get("ports", [])]


def test_every_published_port_is_on_loopback() -> None:
    published = {name: _published(service) for name, service in SERVICES.items()}
    assert published["flower"] == ["127.0.0.1:5555:5555"]
    for name, ports in published.items():
        for port in ports:
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def _variables(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment", {})
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {str(k): str(v) for k, v in environment.items()}


def test_every_toolexec_variable_is_a_setting() -> None:
    """A misspelt TOOLEXEC_ variable would be ignored silently (``extra="ignore"``)."""
    fields = {f"TOOLEXEC_{name.upper()}" for name in Settings.model_fields}
    used: set[str] = set()
    for service in SERVICES.values():
        for name, value in _variables(service).items():
            used |= {name} if name.startswith("TOOLEXEC_") else set()
            used |= {v for v in re.findall(r"\$\{(\w+)", value) if v.startswith("TOOLEXEC_")}
    for command in procfile().values():
        used |= set(re.findall(r"\b(TOOLEXEC_\w+)", command))
    for instruction, rest in dockerfile():
        if instruction == "ENV":
            used |= set(re.findall(r"\b(TOOLEXEC_\w+)", rest))

    assert used, "no TOOLEXEC_ variable found: the parser is broken"
    assert used <= fields, used - fields


def test_the_header_documents_what_compose_really_does() -> None:
    header = (REPO / "docker-compose.yml").read_text().split("x-toolexec-env", 1)[0]
    assert "loopback" in header and "--profile flower" in header
    assert "TOOLEXEC_FLOWER_USER" in header and "TOOLEXEC_FLOWER_PASSWORD" in header
    assert "restarted at most 3 times" in header


# -- Flower ----------------------------------------------------------------------------------


def test_flower_waits_for_its_profile_and_never_restart_loops() -> None:
    """Without credentials ``toolexec flower`` refuses 0.0.0.0 and exits 1: the plain
    ``docker compose up`` leaves it out, and with the profile a refusal is retried 3 times."""
    flower = SERVICES["flower"]
    assert flower["profiles"] == ["flower"]
    assert flower["restart"] == "on-failure:3"
    assert all("profiles" not in s for name, s in SERVICES.items() if name != "flower")
    assert "0.0.0.0" in flower["command"]


def test_prometheus_scrapes_flower_without_credentials_as_flower_serves_metrics() -> None:
    """Flower 2.2's /metrics handler is not authenticated: no basic_auth in the scrape job,
    and the file says so rather than claiming the opposite."""
    text = (REPO / "docs/deploy/prometheus.yml").read_text()
    scrape = yaml.safe_load(text)
    (job,) = [j for j in scrape["scrape_configs"] if j["job_name"] == "flower"]
    assert "basic_auth" not in job and job["static_configs"][0]["targets"] == ["flower:5555"]
    assert "without authentication" in text
    from flower.views.monitor import Healthcheck, Metrics
    from flower.views.tasks import TasksView

    assert hasattr(TasksView.get, "__wrapped__")  # tornado's @authenticated wraps a page
    assert not hasattr(Metrics.get, "__wrapped__") and not hasattr(Healthcheck.get, "__wrapped__")
