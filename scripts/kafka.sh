#!/usr/bin/env bash
# Local single-node Apache Kafka (KRaft) for development and integration tests.
#
#   scripts/kafka.sh fetch    # mvn: pinned Kafka jars into ${PODIUM_CACHE:-~/.cache/podium}/kafka-<version>/libs (once)
#   scripts/kafka.sh start    # format storage (first time: TLS certificates, SCRAM users),
#                             # start, wait for a metadata response over TLS+SCRAM, create the
#                             # services' ACLs, print `export PODIUM_KAFKA_BOOTSTRAP='kafka://...'`
#                             # (the admin's URL) and `export PODIUM_KAFKA_SASL_PASSWORD=...`
#   scripts/kafka.sh status   # exit 0 and print the same if it is up, 3 if not
#   scripts/kafka.sh stop     # SIGTERM, wait, then SIGKILL
#   --plaintext               # (start) no TLS, no authentication: development only
#
# Typical use:  eval "$(scripts/kafka.sh start)"
# Each service's own PODIUM_BUS and password: <dir>/credentials/<service>.env.
# Needs java (17+), mvn and openssl. The logic lives in podium_app/kafka_broker.py (stdlib only, so any
# python3 works; `podium kafka ...` is the same command).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m podium_app.kafka_broker "$@"
