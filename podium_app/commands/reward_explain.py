"""``podium reward explain FILE``: the full reward breakdown of one trajectory, as JSON.

FILE holds one ``podium.v1.Trajectory`` in the protobuf JSON mapping (the files in
``podium/data/trajectories/`` are examples). Prints exactly
``{"total", "components", "penalties", "credit", "reward_version"}``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from podium.codec import message_from_json
from podium.errors import PodiumError
from podium.rewards import default_config, load_config, score
from podium.v1 import trajectory_pb2


def _progress(text: str) -> float:
    """argparse type: a finite number of learner updates >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--progress: not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"--progress: must be a finite number >= 0, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium reward explain``."""
    parser.add_argument("file", metavar="FILE", help="trajectory in protobuf JSON mapping")
    parser.add_argument(
        "--config", metavar="FILE", help="reward config YAML (default: the packaged default)"
    )
    parser.add_argument(
        "--progress",
        metavar="F",
        type=_progress,
        default=0.0,
        help="learner updates done, where annealing schedules are evaluated (default 0)",
    )


def run(args: argparse.Namespace) -> int:
    """Score FILE and print the breakdown; 2 with a message naming the problem on bad input."""
    try:
        config = load_config(args.config) if args.config else default_config()
        path = Path(args.file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            print(f"podium reward explain: {path}: cannot read ({exc.strerror})", file=sys.stderr)
            return 2
        trajectory = message_from_json(text, trajectory_pb2.Trajectory)
        breakdown = score(trajectory, config, args.progress)
    except PodiumError as exc:
        print(f"podium reward explain: {args.file}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(breakdown.to_json_dict(), indent=2))
    return 0
