"""docker/monitoring's alert rules and README Operations' `status` sample against the code of
`cdc-router status` (its verdict, its levels, its default thresholds).

Pure (PyYAML and the rules' PromQL as text); `promtool test rules` of alerts_test.yml runs too
when promtool is on PATH (`make system-deps` installs Debian's prometheus package for it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from cdc_router.config.load import load_config
from cdc_router.config.status import StatusSettings
from cdc_router.ops.exporter import CONNECTOR_STATES
from cdc_router.ops.verdict import EXIT_CODES
from cdc_router.router.clients import static_member_id
from cdc_router.router.metrics import RouterMetrics, cleanup_metrics
from tests.unit.compose_drift import DOCKER, REPO, ROUTER_CONFIG

ALERTS = DOCKER / "monitoring" / "alerts.yml"
DEFAULTS = StatusSettings()


def _rules(name: str) -> dict[str, dict[str, Any]]:
    """The rules of alert `name` by severity."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    found = [rule for group in groups for rule in group["rules"] if rule.get("alert") == name]
    by_level = {rule["labels"]["severity"]: rule for rule in found}
    assert len(by_level) == len(found), f"{name}: two rules of one severity"
    return by_level


def _threshold(rule: dict[str, Any], pattern: str) -> float:
    match = re.search(pattern, " ".join(rule["expr"].split()))
    assert match, f"{rule['alert']} ({rule['labels']['severity']}): {rule['expr']}"
    return float(match.group(1))


def _minutes(duration: str) -> float:
    match = re.fullmatch(r"(\d+)([sm])", duration)
    assert match, duration
    return int(match.group(1)) / (60 if match.group(2) == "s" else 1)


def test_the_verdict_of_status_pages_at_its_level():
    # Review 52-d F1: no rule read cdc_router_status, so a critical problem with no metric of
    # its own (a publication without the outbox: its rows silently not streamed) paged nobody.
    for name, level in (("CdcRouterStatusCritical", "critical"),
                        ("CdcRouterStatusWarning", "warning")):
        rule = _rules(name)[level]
        assert " ".join(rule["expr"].split()) == f"cdc_router_status == {EXIT_CODES[level]}"
        assert "`cdc-router status -c router.yaml`" in rule["annotations"]["summary"]
        # A critical verdict pages within minutes; a warning after it lasts (new dead letters
        # warn for one check, and have their own rule).
        assert _minutes(rule["for"]) <= (5 if level == "critical" else 15)
    assert _minutes(_rules("CdcRouterStatusWarning")["warning"]["for"]) >= 5


def test_a_stall_is_judged_partition_by_partition_at_the_status_thresholds():
    # Review 52-d F3: max(lag) by group and min(commit age) by group, not tied to one
    # partition: a frozen instance's partition went unsaid while another instance committed.
    # Review 52-j F4: on the smaller of the last commit's age and the oldest waiting record's,
    # as status: on the commit's age alone an idle partition's first record paged at once.
    rules = _rules("CdcRouterStalled")
    for level, rule in rules.items():
        expr = " ".join(rule["expr"].split())
        assert not re.search(r"\b(min|max|sum|avg)\b|\bby\s*\(", expr), expr
        limit = int(getattr(DEFAULTS, f"stalled_{level}_s"))
        on = "on (group, topic, partition)"
        commit, pending = ("cdc_router_group_last_commit_age_seconds",
                           "cdc_router_group_oldest_pending_age_seconds")
        assert expr == (f"cdc_router_group_lag > 0 and {on} ({commit} >= {limit} or {pending} "
                        f">= {limit}) unless {on} ({commit} < {limit} or {pending} < {limit})")
        assert "{{ $labels.partition }}" in rule["annotations"]["summary"]


def test_the_router_s_own_lag_alerts_at_the_stall_thresholds():
    # QA 54-b F-1: a transaction open on a raw partition held 19,250 records for 3 minutes;
    # the group's lag (to the last stable offset) said 0 and no rule read the router's own
    # consumer lag (to the high watermark).
    rules = _rules("CdcRouterConsumerStuck")
    assert set(rules) == {"warning", "critical"}
    for level, rule in rules.items():
        limit = int(getattr(DEFAULTS, f"stalled_{level}_s"))
        assert " ".join(rule["expr"].split()) == (
            "cdc_router_consumer_lag > 0 and on (job, instance) "
            f"cdc_router_last_commit_age_seconds >= {limit}")
        assert _minutes(rule["for"]) >= 1  # a transaction in flight holds records a moment
        assert "{{ $labels.partition }}" in rule["annotations"]["summary"]
    assert "a raw partition held by an open transaction" in \
        rules["critical"]["annotations"]["summary"]
    assert "### Runbook: a raw partition held by an open transaction" in \
        (REPO / "README.md").read_text()


def test_slot_wal_alerts_have_the_status_levels_and_thresholds():
    # Review 52-d F4: only the 50 % warning, and with max_slot_wal_keep_size -1 the ratio is
    # negative, so no size of WAL alerted.
    ratio = _rules("CdcRouterSlotWalHigh")
    for level, percent in (("warning", DEFAULTS.wal_warning_percent),
                           ("critical", DEFAULTS.wal_critical_percent)):
        expr = " ".join(ratio[level]["expr"].split())
        assert "(cdc_router_max_slot_wal_keep_size_bytes >= 0)" in expr, expr
        assert _threshold(ratio[level], r">= ([\d.]+)$") == percent / 100
    unlimited = _rules("CdcRouterSlotWalUnlimited")
    for level, size in (("warning", DEFAULTS.wal_warning_bytes),
                        ("critical", DEFAULTS.wal_critical_bytes)):
        expr = " ".join(unlimited[level]["expr"].split())
        assert expr.endswith("unless on() (cdc_router_max_slot_wal_keep_size_bytes >= 0)"), expr
        assert _threshold(unlimited[level], r"_bytes >= (\d+) unless") == size


def test_connector_states_alert_at_the_status_levels():
    # Review 52-d F4: a PAUSED connector was critical here and a warning in `status`.
    expected = {state: "warning" for state in CONNECTOR_STATES if state != "RUNNING"}
    expected.update(FAILED="critical", MISSING="critical")
    found: dict[str, str] = {}
    for name in ("CdcRouterConnectorFailed", "CdcRouterConnectorNotRunning"):
        for level, rule in _rules(name).items():
            states = re.search(r'cdc_router_connector_state\{state=~"([A-Z|]+)"\} == 1',
                               rule["expr"])
            assert states, rule["expr"]
            found.update(dict.fromkeys(states.group(1).split("|"), level))
    assert found == expected
    failed_tasks = _rules("CdcRouterConnectorFailed")["critical"]["expr"]
    assert "cdc_router_connector_failed_tasks > 0" in failed_tasks


def test_lag_alert_is_at_the_status_threshold():
    rule = _rules("CdcRouterLag")["warning"]
    assert _threshold(rule, r"\(cdc_router_group_lag\) >= (\d+)$") == DEFAULTS.lag_warning


def test_a_cleanup_that_stops_deleting_alerts_on_the_router_s_gauge():
    # QA 58-b F-1: a revoked DELETE grant left the outbox growing 50 rows/s with `status: ok`
    # and no rule firing; only the router's log and its cleanup lag gauge said it.
    (rule,) = _rules("CdcRouterCleanupLag").values()
    assert rule["labels"]["severity"] == "warning"
    assert " ".join(rule["expr"].split()) == "cdc_router_cleanup_lag_seconds > 300"
    assert _minutes(rule["for"]) >= 5
    assert "event=cleanup_failed" in rule["annotations"]["summary"]
    registry = CollectorRegistry()
    cleanup_metrics(registry)  # the gauge the rule reads is the one the router exposes
    assert "\ncdc_router_cleanup_lag_seconds 0.0\n" in generate_latest(registry).decode()
    readme = (REPO / "README.md").read_text()
    metrics = re.search(r"\n\*\*Metrics\.\*\*(.*?)\n\n", readme, re.DOTALL)
    assert metrics and "`cdc_router_cleanup_lag_seconds`" in metrics.group(1)
    assert "`CdcRouterCleanupLag`" in readme


def test_a_router_that_reaches_no_broker_alerts_on_its_own_gauge():
    # QA 58-b F-6: Kafka stopped 73 s; the router's lag series went with its assignment, it
    # aborted nothing, and no rule on its own exposition could fire.
    (rule,) = _rules("CdcRouterKafkaUnreachable").values()
    assert rule["labels"]["severity"] == "critical"
    assert " ".join(rule["expr"].split()) == "cdc_router_kafka_reachable == 0"
    assert 1 <= _minutes(rule["for"]) <= 2  # not a broker restarting for seconds
    assert "{{ $labels.instance }}" in rule["annotations"]["summary"]
    # The gauge the rule reads is the one the router exposes, from its start.
    exposed = generate_latest(RouterMetrics().registry).decode()
    assert "\ncdc_router_kafka_reachable 1.0\n" in exposed
    readme = (REPO / "README.md").read_text()
    metrics = re.search(r"\n\*\*Metrics\.\*\*(.*?)\n\n", readme, re.DOTALL)
    assert metrics and "`cdc_router_kafka_reachable`" in metrics.group(1)
    assert "`CdcRouterKafkaUnreachable`" in readme


def test_jetstream_storage_full_alerts_on_the_router_s_abort_causes():
    # QA 65-b F-1, lw66 item 2: storage full was only a stall to status and to every rule.
    (rule,) = _rules("CdcRouterJetStreamFull").values()
    assert rule["labels"]["severity"] == "critical"
    expr = " ".join(rule["expr"].split())
    causes = re.search(r'cause=~"([^"]+)"', expr)
    assert causes and set(causes.group(1).split("|")) == {"jetstream_storage_full",
                                                           "jetstream_stream_full"}
    assert expr.startswith("increase(cdc_router_batches_aborted_total{")
    # The series the rule reads are the ones the router exposes, each from 0 at its start.
    exposed = generate_latest(RouterMetrics().registry).decode()
    for cause in ("jetstream_storage_full", "jetstream_stream_full", "cluster"):
        assert f'\ncdc_router_batches_aborted_total{{cause="{cause}"}} 0.0\n' in exposed
    readme = (REPO / "README.md").read_text()
    assert "`cdc_router_batches_aborted{cause}`" in readme
    assert "`CdcRouterJetStreamFull`" in readme


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not on PATH")
def test_promtool_unit_tests_of_the_rules_pass():
    done = subprocess.run(["promtool", "test", "rules", "alerts_test.yml"],
                          cwd=ALERTS.parent, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_test_file_docker_s_files_name_exists():
    # Review 52-j F5: alerts_test.yml sent its reader to tests/unit/test_docker_alerts.py.
    named = {(path, name) for path in DOCKER.rglob("*") if path.is_file()
             and path.suffix in {".yml", ".yaml", ".md", ""}
             for name in re.findall(r"\btests/[\w/]+\.py\b", path.read_text(errors="replace"))}
    assert named, "docker/ names no test file: is the pattern right?"
    assert [(str(path.relative_to(REPO)), name) for path, name in sorted(named)
            if not (REPO / name).is_file()] == []


def test_the_readme_status_sample_shows_the_instance_as_status_does():
    # Review 52-d F5: the sample said `router-1`; the line shows the static member id, the
    # instance id and a digest of source.topics (router/clients.py).
    topics = load_config(ROUTER_CONFIG).config.source.topics
    member = static_member_id("router-1", topics)
    sample = re.search(r"\nA paused connector, for example .*?\n```\n(.*?)\n```\n",
                       (REPO / "README.md").read_text(), re.DOTALL)
    assert sample, "README, Operations: the paused connector's `status` sample"
    assert f"\n  {member} on /127.0.0.1: outbox.public.outbox[0]\n" in sample.group(1)
