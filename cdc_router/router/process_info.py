"""cdc_router_info: which pipeline and process a /metrics is, for a Prometheus that scrapes
several (QA 63-b L-1: two routers exported the same cdc_router_consumer_lag{topic,partition}
and only the scrape target told them apart)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Info

from cdc_router import __version__

if TYPE_CHECKING:
    from cdc_router.config.model import RouterConfig


def process_info(config: RouterConfig, process: str, **labels: str | None) -> dict[str, str]:
    """The labels of cdc_router_info: the pipeline (`group`, its source.group_id), the
    `process` (router, relay, status), the `labels` given (None: left out) and the version."""
    given = {name: value for name, value in labels.items() if value is not None}
    return {"group": config.source.group_id, "process": process, **given,
            "version": __version__}


def info_metric(registry: CollectorRegistry, labels: Mapping[str, str]) -> None:
    """cdc_router_info{labels} 1 on `registry` (Prometheus' info-metric convention: a query
    joins it on the scrape target's `instance` label, so none of ours is named `instance`)."""
    Info("cdc_router", "What this process is: the pipeline's consumer group (source.group_id), "
         "the process, its instance id and transactional id, the version", registry=registry
         ).info(dict(labels))
