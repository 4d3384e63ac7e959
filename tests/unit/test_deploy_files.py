"""docker-compose.yml and the Procfile only run commands and options the CLIs have.

Docker is not available here, so the compose file is checked by parsing it:
every command and healthcheck that calls ``toolexec`` or ``celery`` must
parse with the real command-line interfaces, and the services keep the
properties operations rely on. The Procfile really runs in
tests/integration/test_procfile.py.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from celery.bin.celery import celery as celery_cli

from toolexec.ops.cli import cli as toolexec_cli

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
        assert args[:2] == ["-A", "toolexec.app"], words
        args = args[2:]
    command = group
    while isinstance(command, click.Group):
        found = command.get_command(click.Context(command), args[0])
        assert found is not None, f"{' '.join(words)}: no command {args[0]!r}"
        command, args = found, args[1:]
    command.make_context(command.name or "", list(args))
    return command


def all_commands() -> list[tuple[str, list[str]]]:
    found = []
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
        check_parses(["celery", "-A", "toolexec.app", "inspect", "ping", "--no-such"])


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
