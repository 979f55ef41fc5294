"""The router: consume the raw change topic, route each outbox event, produce in transactions.

- step.py: the pure per-record step (decode -> replay check -> route -> serialize);
- transaction.py: one batch and the numbered procedure that commits it (KIP-98/KIP-447);
- poison.py: finding and dead-lettering the record the broker refuses;
- loop.py: OutboxRouter, the loop that owns the clients and handles rebalances;
- clients.py: every client's configuration; destinations.py: the topic metadata cache;
- debezium.py: the Debezium change-event envelope to an OutboxEvent (connect_time.py: its
  timestamps);
- routing.py: the routes applied to an event; partitioner.py: Kafka's default partitioner;
- replay.py: the replay filter over the dedup changelog; committed_ids.py: its sweep;
- cleanup.py: deleting or ageing out delivered outbox rows; topics.py: `topics apply`;
- metrics.py: Prometheus metrics and the health endpoint; process_info.py: cdc_router_info,
  which pipeline and process a /metrics is (the status exporter's too);
- dlq_letters.py and dlq_replay.py: `dlq replay`, dead letters through the step again;
- republish.py: `outbox republish`, outbox rows back onto the raw topic.

This file imports nothing, so that a module needing one piece (config needs the OutboxEvent
type) does not load the whole router.
"""
