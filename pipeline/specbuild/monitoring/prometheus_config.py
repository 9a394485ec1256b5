"""Prometheus for one release served outside Kubernetes: the files ``specbuild monitoring`` writes for the compose
file's ``prometheus`` profile (docker/compose.yaml mounts the folder at /etc/prometheus/specbuild): the
configuration scraping the release's metrics port, the release's rule file, and a copy of the dashboard to import
into Grafana."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import yaml

from specbuild.monitoring.dashboard import DASHBOARD_FILE
from specbuild.monitoring.promql import Scope
from specbuild.monitoring.alert_rules import AlertThresholds, rule_groups

JOB = "specbuild"  # the scrape job: the release's ``job`` label
CONFIG_FILE = "prometheus.yml"
RULES_FILE = "specbuild-rules.yaml"
DASHBOARD_COPY = "specbuild-dashboard.json"
COMPOSE_TARGET_HOST = "triton"  # the network alias every Triton service of docker/compose.yaml has


def prometheus_config(targets: Sequence[str], *, scrape_interval: str = "15s",
                      rule_files: Sequence[str] = (RULES_FILE,)) -> dict[str, Any]:
    """Scrape ``targets`` (host:port of Triton's metrics endpoint) as job :data:`JOB`, evaluating ``rule_files``
    (paths relative to the configuration file) as often as it scrapes."""
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": list(rule_files),
        "scrape_configs": [{"job_name": JOB, "metrics_path": "/metrics",
                            "static_configs": [{"targets": list(targets)}]}],
    }


def rule_file(thresholds: AlertThresholds, scope: Scope = Scope()) -> str:
    """The rule file of the releases in ``scope`` (default: every series, as in a Prometheus that scrapes one)."""
    return ("# specbuild's recording and alerting rules (docs/deployment.md, \"Alerts\"); written by specbuild\n"
            + yaml.safe_dump({"groups": rule_groups(scope, thresholds)}, sort_keys=False, width=1000))


def write_monitoring(out_dir: str | Path, thresholds: AlertThresholds, metrics_port: int) -> list[Path]:
    """The compose profile's files in ``out_dir``, each written whole or not at all."""
    from specbuild.stages.atomic import atomic_write_text

    out = Path(out_dir)
    config = prometheus_config([f"{COMPOSE_TARGET_HOST}:{metrics_port}"])
    return [atomic_write_text(out / CONFIG_FILE, yaml.safe_dump(config, sort_keys=False)),
            atomic_write_text(out / RULES_FILE, rule_file(thresholds)),
            atomic_write_text(out / DASHBOARD_COPY, DASHBOARD_FILE.read_text(encoding="utf-8"))]
