"""The no-Docker local stack: Postgres, Kafka (KRaft) and Kafka Connect + Debezium as processes."""
