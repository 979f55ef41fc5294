"""The dead letters' size limit narrowed while the router runs (QA 57-a F-3): moved out of
router/loop.py as it was."""

from __future__ import annotations

import logging

from cdc_router.config.model import RouterConfig
from cdc_router.router import clients
from cdc_router.router.destinations import Describe
from cdc_router.router.poison import LetterTooLarge
from cdc_router.router.timestamps import batch_bytes

log = logging.getLogger("cdc_router.router")


def narrowed_letters_limit(config: RouterConfig, describe: Describe, refused: LetterTooLarge,
                           current: int) -> int:
    """QA 57-a F-3: the dead-letter topic's max.message.bytes, lowered while the router
    ran, refused a letter: read it again; when it is now lower than the letters' limit
    `current`, return it, so that the re-read sends the letter without its value
    (dlq.value.dropped.bytes), as a restart would. Otherwise no re-read nor restart can
    fix it: raise refused.unmended()."""
    dead_letters = refused.topic == config.dead_letter.topic
    topic_max = clients.dead_letter_topic_max(config, describe) if dead_letters else None
    limit = clients.letters_limit(config, topic_max)
    if not dead_letters or limit >= current:
        kafka = config.kafka
        raise refused.unmended(topic_max, batch_bytes(kafka.config, kafka.producer)) \
            from refused
    log.warning("event=dead_letter_limit_lowered topic=%s letter_bytes=%s max_bytes=%d "
                "hint='%s refused a letter as too large (its max.message.bytes was lowered "
                "while the router ran): letters over %d bytes now go without their value "
                "(dlq.value.dropped.bytes; the raw topic keeps it); to keep whole letters, "
                "raise the topic's max.message.bytes and restart the router: it reads "
                "the limit again only at start or at a refusal'", refused.topic, refused.size,
                limit, refused.topic, limit)
    return limit
