"""The compose services of Prometheus and Grafana (their configuration files: pipeline.deploy.monitoring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.deploy import images, layout, rules
from pipeline.deploy.compose.parts import bind_mount, hardening, published, required_variable
from pipeline.deploy.monitoring import RETENTION

PROMETHEUS_VOLUME = "prometheus-data"
GRAFANA_VOLUME = "grafana-data"


def prometheus_service(profile: str, deploy_dir: Path, host_port: int) -> dict[str, Any]:
    return {
        "profiles": [profile],
        "image": images.PROMETHEUS_IMAGE,
        "command": [
            "--config.file=/etc/prometheus/prometheus.yml",
            "--storage.tsdb.path=/prometheus",
            f"--storage.tsdb.retention.time={RETENTION}",
            f"--web.listen-address=:{layout.PROMETHEUS_PORT}",
        ],
        "ports": [published(layout.MONITORING_BIND_ADDRESS, host_port, layout.PROMETHEUS_PORT)],
        "volumes": [
            bind_mount(deploy_dir / layout.PROMETHEUS_CONFIG, "/etc/prometheus/prometheus.yml"),
            bind_mount(deploy_dir / rules.RULES_FILE, rules.RULES_MOUNT),
            {"type": "volume", "source": PROMETHEUS_VOLUME, "target": "/prometheus"},
        ],
        **hardening(),
        "healthcheck": {
            "test": ["CMD", "wget", "-q", "-O", "-", f"http://127.0.0.1:{layout.PROMETHEUS_PORT}/-/ready"],
            "interval": "10s",
            "timeout": "3s",
            "retries": 3,
            "start_period": "30s",
        },
    }


def grafana_service(profile: str, deploy_dir: Path, host_port: int) -> dict[str, Any]:
    password = required_variable(layout.GRAFANA_PASSWORD_VARIABLE)
    return {
        "profiles": [profile],
        "image": images.GRAFANA_IMAGE,
        "depends_on": {layout.PROMETHEUS_SERVICE: {"condition": "service_started"}},
        "environment": {
            "GF_SECURITY_ADMIN_USER": "admin",
            "GF_SECURITY_ADMIN_PASSWORD": password,
            "GF_USERS_ALLOW_SIGN_UP": "false",
            "GF_AUTH_ANONYMOUS_ENABLED": "false",
            "GF_ANALYTICS_REPORTING_ENABLED": "false",
            "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
            "GF_LOG_MODE": "console",  # the root file system is read-only: no log files
        },
        "ports": [published(layout.MONITORING_BIND_ADDRESS, host_port, layout.GRAFANA_PORT)],
        "volumes": [
            bind_mount(deploy_dir / layout.GRAFANA_PROVISIONING_DIR, "/etc/grafana/provisioning"),
            bind_mount(deploy_dir / layout.GRAFANA_DASHBOARDS_DIR, layout.GRAFANA_DASHBOARDS_MOUNT),
            {"type": "volume", "source": GRAFANA_VOLUME, "target": "/var/lib/grafana"},
        ],
        **hardening(),
        "healthcheck": {
            "test": ["CMD", "wget", "-q", "-O", "-", f"http://127.0.0.1:{layout.GRAFANA_PORT}/api/health"],
            "interval": "10s",
            "timeout": "3s",
            "retries": 3,
            "start_period": "60s",
        },
    }
