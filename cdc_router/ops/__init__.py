"""Operations: `cdc-router status`, what it checks and how it judges, and its exporter.

    probe       check(): asks each part below and builds one Report; never raises for a part
                that is down
    connector   Kafka Connect: the connector's state and what its config captures
    database    Postgres: the slots and their WAL, the publication, the outbox
    group       Kafka: the router group's lag per partition, last commit and members
    topics      Kafka: dead letters (count, newest) and the dedup changelog's size
    offsets     the admin lookups and bounded read_committed scans the two above share
    jetstream   NATS: the streams of the JetStream routes, their use and what the router's
                start would refuse
    registry    the schema registry of schema_registry.url, asked as the router's start asks it
    report      the Report and its sections (their field names are the JSON keys)
    verdict     pure: a Report and the thresholds (config/status.py) -> problems, exit code
                (verdict_router: the router group; verdict_jetstream: the streams)
    connector_failure  what a FAILED connector or task needs, by the cause its trace names
                (status's connector line, `connectors apply`)
    exporter    the latest Report as Prometheus gauges (`status --serve`)
"""
