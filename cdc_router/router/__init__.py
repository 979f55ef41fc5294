"""The router: consume the raw change topic, route each outbox event, produce in transactions.

- step.py: the pure per-record step (decode -> replay check -> route -> serialize);
- transaction.py: one batch and the numbered procedure that commits it (KIP-98/KIP-447);
- poison.py: finding and dead-lettering the record the broker refuses;
- loop.py: OutboxRouter, the loop that owns the clients and handles rebalances;
- clients.py: every client's configuration; destinations.py: the topic metadata cache.
"""

from cdc_router.router.loop import OutboxRouter
from cdc_router.router.transaction import Delivered

__all__ = ["Delivered", "OutboxRouter"]
