"""The deployment files in configs/: the Grafana dashboard covers every metric family ashd exports,
shows down as down, and is laid out; the systemd units start what they say."""

from __future__ import annotations

import configparser
import json
import re
from pathlib import Path
from typing import Any

from ashd.metrics import Metrics

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONFIGS / "grafana-ashd.json").read_text())
    return loaded


def exprs(panel: dict[str, Any]) -> list[str]:
    return [t["expr"] for t in panel["targets"]]


def test_every_metric_family_has_a_panel() -> None:
    families = {m.name for m in Metrics().registry.collect()}
    assert "ash_model_tokens" in families  # counters are listed without `_total`
    used = " ".join(e for p in dashboard()["panels"] for e in exprs(p))
    missing = {f for f in families if not re.search(rf"\b{f}(_total|_bucket)?\{{", used)}
    assert not missing, f"no panel shows {sorted(missing)}"


def test_datasource_is_a_variable_used_by_every_panel() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in dashboard()["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]), panel["title"]
        assert all('job="$job"' in e for e in exprs(panel)), panel["title"]


def test_an_up_panel_can_show_down() -> None:
    (up,) = [p for p in dashboard()["panels"] if any(e.startswith("up{job=") for e in exprs(p))]
    defaults = up["fieldConfig"]["defaults"]
    assert defaults["mappings"][0]["options"]["0"]["text"] == "DOWN"
    assert "DOWN" in defaults["noValue"]  # a target Prometheus never scraped has no series at all


def test_panels_are_laid_out_without_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard()["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24 and g["w"] > 0 and g["h"] > 0, panel["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_systemd_units_for_serve_and_runner() -> None:
    for name, command in [("ashd.service", "ashd serve"), ("ashd-runner.service", "ashd runner")]:
        unit = configparser.ConfigParser(strict=False, interpolation=None)
        unit.read_string((CONFIGS / name).read_text())
        service = unit["Service"]
        assert service["ExecStart"].endswith(command), name
        assert service["Delegate"] == "yes" and service["KillMode"] == "mixed", name
        assert "SERVICE_DATA_DIR=" in service["Environment"], name
        assert unit["Install"]["WantedBy"] == "multi-user.target", name


def test_the_cluster_tests_nginx_config_names_each_coordinator_whole() -> None:
    """The e2e cluster's nginx config is the shipped one with the run's ports: a first coordinator on
    a port starting 4102 once turned the second's address into port 598613 (a failed CI run)."""
    from tests.fixtures.cluster import NGINX_CONF, nginx_conf

    shipped = NGINX_CONF.read_text()
    both = nginx_conf(shipped, 40000, [41023, 59861])
    assert re.findall(r"server (127\.0\.0\.1:\d+)", both) == ["127.0.0.1:41023", "127.0.0.1:59861"]
    one = nginx_conf(shipped, 40000, [41023])
    assert re.findall(r"server (127\.0\.0\.1:\d+)", one) == ["127.0.0.1:41023"]
    assert "listen 127.0.0.1:40000;" in both and "X-Upstream" in both
