"""NATS JetStream: the synchronous publisher the router delivers through, and stream planning."""
