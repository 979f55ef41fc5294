"""The polling relay, `cdc-router relay`: the outbox table read directly, without Debezium.

- guard.py: the visibility guard and the position (pure): which rows a read may take;
- reader.py: the outbox table's snapshot and rows, as Debezium would have encoded them;
- lock.py: one active relay per table (a Postgres advisory lock);
- start.py: the start's reads: stored records of a topic, rows a killed relay left behind;
- loop.py: OutboxRelay, which delivers each batch through the router's step and transaction.

This file imports nothing, so that importing one module does not load the others.
"""
