"""`python -m cdc_router` runs the CLI."""

from cdc_router.cli import entry

entry()
