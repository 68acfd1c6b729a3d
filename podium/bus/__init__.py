"""The event bus: one contract (:mod:`podium.bus.base`), two implementations.

* :class:`InProcBus` — in memory, for a zero-setup run and unit tests;
* :class:`KafkaBus` — Apache Kafka via aiokafka, for everything real.

Services use :func:`connect` with a URL from their config, then :class:`EventPublisher` to
write events, :class:`EventConsumer` to process them (at-least-once, effectively once), and
:class:`Transformer` for consume-transform-produce exactly once (one transaction per input
partition), :func:`read_committed` to read a state topic whole. Whether a URL
names Kafka is decided here only (:func:`is_kafka_url`). Importing this package never
contacts a broker.
"""

from __future__ import annotations

from podium.bus.base import (
    TP,
    Bus,
    Headers,
    PartitionsCallback,
    PartitionTransaction,
    Publisher,
    Record,
    RecordMetadata,
    Subscriber,
    TopicSpec,
    TransactionalMember,
    TransactionFencedError,
    partition_transactional_id,
)
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
from podium.bus.read import read_committed, read_tail
from podium.bus.transform import Output, Transform, Transformer, TransformStats
from podium.errors import ConfigError

__all__ = [
    "TP",
    "Bus",
    "ConsumerStats",
    "EventConsumer",
    "EventPublisher",
    "Handler",
    "Headers",
    "InProcBus",
    "KafkaBus",
    "KafkaConfig",
    "Output",
    "PartitionTransaction",
    "PartitionsCallback",
    "PublishedEvent",
    "Publisher",
    "Record",
    "RecordMetadata",
    "Subscriber",
    "TopicSpec",
    "TransactionFencedError",
    "TransactionalMember",
    "Transform",
    "TransformStats",
    "Transformer",
    "connect",
    "is_kafka_url",
    "is_retriable",
    "partition_transactional_id",
    "read_committed",
    "read_tail",
]


def _scheme(url: str) -> str:
    """The scheme of a bus URL (``kafka``, ``inproc``...), empty if it has none."""
    return url.strip().split("://", 1)[0].lower() if "://" in url else ""


def is_kafka_url(url: str) -> bool:
    """Whether ``url`` names a Kafka bus (``kafka://HOST:PORT...``).

    The one place this is decided: drivers and commands that need a broker ask here rather
    than testing a string prefix of their own.
    """
    return _scheme(url) == "kafka"


def connect(url: str) -> Bus:
    """A (not yet started) bus for ``url``.

    ``inproc://`` or ``memory://`` gives an :class:`InProcBus`; ``kafka://HOST:PORT[,HOST:PORT]``
    (optionally ``?field=value`` for :class:`KafkaConfig` fields) gives a :class:`KafkaBus`.
    """
    scheme = _scheme(url)
    if scheme in ("inproc", "memory"):
        return InProcBus()
    if is_kafka_url(url):
        return KafkaBus(KafkaConfig.from_url(url))
    raise ConfigError(
        f"bus URL must be inproc://, memory:// or kafka://HOST:PORT[,HOST:PORT], got {url!r}"
    )
