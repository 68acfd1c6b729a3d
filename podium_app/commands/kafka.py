"""``podium kafka fetch|start|stop|status``: the local development broker.

Same as ``scripts/kafka.sh``; the implementation is :mod:`podium_app.kafka_broker`.
"""

from __future__ import annotations

import argparse

from podium_app import kafka_broker


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: the action and where/how to run the broker."""
    kafka_broker.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Fetch, start, stop or report the broker; prints PODIUM_KAFKA_BOOTSTRAP=... when up."""
    return kafka_broker.run(args)
