"""cdc-router: the transactional outbox pattern end to end on PostgreSQL, Debezium and Kafka."""

# The release: `cdc-router --version`, the `event=started` / `event=relay_started` lines and
# pyproject.toml (dynamic) read it. README's "Upgrading from ..." sections are keyed by it.
__version__ = "0.3.0"
