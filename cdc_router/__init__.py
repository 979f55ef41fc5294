"""cdc-router: the transactional outbox pattern end to end on PostgreSQL, Debezium and Kafka."""

# The release: `cdc-router --version`, the `event=started` / `event=relay_started` lines and
# pyproject.toml (dynamic) read it. README "Upgrading from 0.1.x to 0.2.0" is keyed by it.
__version__ = "0.2.0"
