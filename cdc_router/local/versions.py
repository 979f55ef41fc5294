"""Pinned versions of the stack's components; docker/ must use the same (tests check the drift)."""

# Debezium 3.6.1.Final is built and tested against Kafka 4.3.0 (its parent POM's version.kafka),
# so the broker, Connect and the connector's provided classes all come from one Kafka release.
KAFKA_VERSION = "4.3.0"
SCALA_VERSION = "2.13"
DEBEZIUM_VERSION = "3.6.1.Final"
POSTGRES_MAJOR = 15
# The schema registry of `local up --with registry`: Apicurio Registry's runnable bundle (the
# Confluent API under /apis/ccompat/v7), the one Confluent-compatible registry on Maven Central.
APICURIO_REGISTRY_VERSION = "3.0.9"
