"""Runnable examples: the demo router config and the fulfillment service."""
