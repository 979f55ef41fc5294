"""Thin typed wrappers of confluent-kafka: error classes, producer, consumer, admin."""
