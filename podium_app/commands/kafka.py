"""``podium kafka fetch|start|stop|status``: the local development broker; ``podium kafka
tail TOPIC``: any topic as JSON lines.

The broker actions are the same as ``scripts/kafka.sh`` (:mod:`podium_app.kafka_broker`);
``tail`` is :mod:`podium_app.kafka_tail` and reads any broker, the local one or a cluster's.
"""

from __future__ import annotations

import argparse

from podium_app import kafka_broker, kafka_tail

TAIL_HELP = "print a topic's records as JSON lines (decoded envelopes and payloads)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One sub-command per action: the broker's (with their options) and ``tail``."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in kafka_broker.ACTIONS.items():
        kafka_broker.add_broker_options(actions.add_parser(name, help=text, description=text))
    tail = actions.add_parser("tail", help=TAIL_HELP, description=kafka_tail.__doc__)
    tail.formatter_class = argparse.RawDescriptionHelpFormatter
    kafka_tail.add_arguments(tail)


def run(args: argparse.Namespace) -> int:
    """Tail a topic, or fetch, start, stop or report the broker (prints
    PODIUM_KAFKA_BOOTSTRAP=... when up)."""
    if args.action == "tail":
        return kafka_tail.run(args)
    return kafka_broker.run(args)
