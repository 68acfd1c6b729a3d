"""The event bus: one contract (:mod:`podium.bus.base`), two implementations.

* :class:`InProcBus` — in memory, for a zero-setup run and unit tests;
* :class:`KafkaBus` — Apache Kafka via aiokafka, for everything real.

Services use :func:`connect` with a URL from their config, then :class:`EventPublisher` to
write events and :class:`EventConsumer` to process them. Importing this package never
contacts a broker.
"""

from __future__ import annotations

from podium.bus.base import Bus, Headers, Record, RecordMetadata, Subscriber, TopicSpec
from podium.bus.consumer import (
    ConsumerStats,
    EventConsumer,
    EventPublisher,
    Handler,
    PublishedEvent,
    is_retriable,
)
from podium.bus.inproc import InProcBus
from podium.bus.kafka import KafkaBus, KafkaConfig
from podium.errors import ConfigError

__all__ = [
    "Bus",
    "ConsumerStats",
    "EventConsumer",
    "EventPublisher",
    "Handler",
    "Headers",
    "InProcBus",
    "KafkaBus",
    "KafkaConfig",
    "PublishedEvent",
    "Record",
    "RecordMetadata",
    "Subscriber",
    "TopicSpec",
    "connect",
    "is_retriable",
]


def connect(url: str) -> Bus:
    """A (not yet started) bus for ``url``.

    ``inproc://`` or ``memory://`` gives an :class:`InProcBus`; ``kafka://HOST:PORT[,HOST:PORT]``
    (optionally ``?field=value`` for :class:`KafkaConfig` fields) gives a :class:`KafkaBus`.
    """
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme in ("inproc", "memory"):
        return InProcBus()
    if scheme == "kafka":
        return KafkaBus(KafkaConfig.from_url(url))
    raise ConfigError(
        f"bus URL must be inproc://, memory:// or kafka://HOST:PORT[,HOST:PORT], got {url!r}"
    )
