"""The chaos campaign (issue 15): load, faults on a seeded schedule, an independent verifier.

    python -m tests.chaos --events 10000 --seed 7 --profile short

`verifier.py` imports nothing from cdc_router, so a defect in the router cannot hide itself
in the check; the rest drives the stack and may use cdc_router's CLI like any operator.
"""
