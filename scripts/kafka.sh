#!/usr/bin/env bash
# Local single-node Apache Kafka (KRaft) for development and integration tests.
#
#   scripts/kafka.sh fetch    # mvn: pinned Kafka jars into ${PODIUM_CACHE:-~/.cache/podium}/kafka-<version>/libs (once)
#   scripts/kafka.sh start    # format storage (first time), start, wait for a real metadata
#                             # response, print PODIUM_KAFKA_BOOTSTRAP=127.0.0.1:PORT
#   scripts/kafka.sh status   # exit 0 and print the bootstrap address if it is up, 3 if not
#   scripts/kafka.sh stop     # SIGTERM, wait, then SIGKILL
#
# Typical use:  eval "$(scripts/kafka.sh start)" && export PODIUM_KAFKA_BOOTSTRAP
# Needs java (17+) and mvn. The logic lives in podium_app/kafka_broker.py (stdlib only, so any
# python3 works; `podium kafka ...` is the same command).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m podium_app.kafka_broker "$@"
