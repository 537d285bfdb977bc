"""docker-compose.yml and what it mounts, checked without a Docker engine (none runs here)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from agentfleet.hooks.metrics import PrometheusHook

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("planner", "executor", "observer")


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_every_service_is_there_with_an_image_a_restart_policy_and_a_healthcheck() -> None:
    services = compose()["services"]
    assert set(services) == {"rabbitmq", "postgres", "redis", "migrate", *ROLES, "flower", "console", "prometheus",
                             "grafana"}
    for name, service in services.items():
        assert service.get("image"), name
        assert service.get("restart") == ("no" if name == "migrate" else "unless-stopped"), name
        assert name == "migrate" or service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    assert services["rabbitmq"]["image"].endswith("-management")
    assert "postgres-data:/var/lib/postgresql/data" in services["postgres"]["volumes"]


def test_workers_wait_for_their_services_and_the_migration_and_load_the_users_agents() -> None:
    services = compose()["services"]
    for role in ROLES:
        worker = services[role]
        assert worker["command"][:2] == ["worker", role]
        assert worker["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
        for needed in ("rabbitmq", "postgres", "redis"):
            assert worker["depends_on"][needed] == {"condition": "service_healthy"}
        env = worker["environment"]
        assert env["AGENTFLEET_AGENTS"].startswith("${AGENTFLEET_AGENTS:-") and env["PYTHONPATH"] == "/app/agents"
        assert "./agents:/app/agents:ro" in worker["volumes"]
        # The healthcheck pings the node name the command gives the worker.
        node = worker["command"][worker["command"].index("--hostname") + 1].replace("%h", "$$HOSTNAME")
        assert worker["healthcheck"]["test"][-1].endswith(f"-d {node}"), worker["healthcheck"]
        assert env["AGENTFLEET_METRICS_PORT"] == "9100" and env["AGENTFLEET_METRICS_ADDR"] == "0.0.0.0"
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["migrate"]["environment"]["AGENTFLEET_DATABASE_URL"] == \
        services["executor"]["environment"]["AGENTFLEET_DATABASE_URL"]


def test_every_variable_in_env_reaches_every_fleet_process_and_never_the_image() -> None:
    """Containment 21: compose passed only the 16 variables it named; AGENTFLEET_APPROVAL_RULES, _HOOKS,
    _REDACT_VALUES, _OTEL_EXPORTER, _AUDIT_LOG and a tool's own key never reached the workers."""
    services = compose()["services"]
    for name in (*ROLES, "flower", "console", "migrate"):
        assert services[name].get("env_file") == [".env"], name
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ".env" in ignored and "!.env.example" in ignored
    assert "COPY . " not in (ROOT / "Dockerfile").read_text()  # and the image copies only what it names


def test_nothing_is_published_beyond_loopback_and_nothing_runs_without_a_password() -> None:
    services = compose()["services"]
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"
    text = (ROOT / "docker-compose.yml").read_text()
    assert "guest:guest" not in text and "agentfleet:agentfleet@" not in text
    flower = " ".join(services["flower"]["command"])
    assert "--basic-auth=${FLOWER_BASIC_AUTH:?" in flower
    required = set(re.findall(r"\$\{([A-Z_]+):\?", text))
    example = {line.split("=")[0] for line in (ROOT / ".env.example").read_text().splitlines()
               if line and not line.startswith("#")}
    assert required <= example, required - example


def test_prometheus_scrapes_every_role_on_the_metrics_port_and_grafana_is_provisioned() -> None:
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    [job] = prometheus["scrape_configs"]
    [sd] = job["dns_sd_configs"]
    assert set(sd["names"]) == set(ROLES) and sd["port"] == 9100
    services = compose()["services"]
    mounts = " ".join(services["grafana"]["volumes"])
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning" in mounts
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards" in mounts
    datasource = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_the_dashboard_only_charts_series_the_workers_serve() -> None:
    served = {m.name for m in PrometheusHook().registry.collect()}
    suffixes = ("_total", "_bucket", "_count", "_sum", "_created")
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/agentfleet.json").read_text())
    charted = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"\b(agentfleet_[a-z_]+)", target["expr"]):
                base = next((name[: -len(s)] for s in suffixes if name.endswith(s)), name)
                assert base in served, f"{panel['title']}: {name} is not a series the workers serve"
                charted.add(base)
    assert charted == served  # and every series has a chart
