"""cdc-router: the transactional outbox pattern end to end on PostgreSQL, Debezium and Kafka."""

__version__ = "0.1.0"
