"""Shared fixtures: the event bus under test, the Kafka broker and the KServe-V2 server.

``bus`` is parametrized over both implementations, so every test that uses it is a contract
test: ``[inproc]`` always runs; ``[kafka]`` needs a real broker named by
``$PODIUM_KAFKA_BOOTSTRAP`` (start one with ``eval "$(scripts/kafka.sh start)"``, which also
sets ``$PODIUM_KAFKA_SASL_PASSWORD``: the broker takes only SCRAM over TLS, and the variable
is a ``kafka://`` URL carrying those settings; :mod:`kafka_helpers` turns it into what each
kind of client needs). Without it the Kafka
cases are skipped when run by hand, and fail under CI (``CI=true``), where a missing broker is
a broken pipeline rather than an optional extra.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka_helpers import as_url, kafka_test_config
from svc_helpers import run_stack

from podium.bus import Bus, InProcBus, KafkaBus, KafkaConfig

KAFKA_ENV = "PODIUM_KAFKA_BOOTSTRAP"
V2_GRPC_ENV = "PODIUM_V2_GRPC"
V2_REPOSITORY_ENV = "PODIUM_V2_REPOSITORY"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """The real broker as a ``kafka://`` URL with its security settings (a bare ``host:port``
    in the variable means a plaintext broker), or skip (by hand) / fail (CI) when there is
    none. Raw clients use :func:`kafka_helpers.client_kwargs`, service processes
    :func:`kafka_helpers.kafka_url`, librdkafka :func:`kafka_helpers.librdkafka_config`, Kafka's
    console consumer :func:`kafka_helpers.console_consumer`."""
    bootstrap = os.environ.get(KAFKA_ENV, "").strip()
    if not bootstrap:
        if _in_ci():
            pytest.fail(f"CI=true but ${KAFKA_ENV} is not set: CI must start a broker first")
        pytest.skip(f"no Kafka broker: set ${KAFKA_ENV} (see scripts/kafka.sh start)")
    return as_url(bootstrap)


@pytest.fixture
def kafka_config() -> Callable[..., KafkaConfig]:
    """``kafka_config(bootstrap, **overrides)``: test-tuned settings (see kafka_test_config)."""
    return kafka_test_config


@pytest.fixture(params=["inproc", pytest.param("kafka", marks=pytest.mark.kafka)])
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    """A started bus of each implementation; stopped after the test."""
    impl: Bus
    if request.param == "inproc":
        impl = InProcBus()
    else:
        impl = KafkaBus(kafka_test_config(request.getfixturevalue("kafka_bootstrap")))
    await impl.start()
    try:
        yield impl
    finally:
        await impl.stop()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Unique topic/group names, so tests sharing a broker never see each other's records."""
    run = uuid.uuid4().hex[:10]

    def make(prefix: str) -> str:
        return f"test.{prefix}.{run}.{uuid.uuid4().hex[:6]}"

    return make


@pytest.fixture
async def inproc_bus() -> AsyncIterator[InProcBus]:
    """A started in-process bus; stopped after the test."""
    bus = InProcBus()
    await bus.start()
    try:
        yield bus
    finally:
        await bus.stop()


@pytest.fixture
def stack_factory() -> Callable[..., Any]:
    """``async with stack_factory(bus, ...) as stack:`` (see :func:`svc_helpers.run_stack`)."""
    return run_stack


# -- the real KServe-V2 server (scripts/v2server.sh start) -------------------------------------


def _need_v2(var: str) -> str:
    value = os.environ.get(var, "").strip()
    if not value:
        if _in_ci():
            pytest.fail(f"CI=true but ${var} is not set: CI must start scripts/v2server.sh first")
        pytest.skip(f'no KServe-V2 server: set ${var} (eval "$(scripts/v2server.sh start DIR)")')
    return value


@pytest.fixture(scope="session")
def v2_grpc() -> str:
    """``host:port`` of the real V2 server's gRPC endpoint."""
    return _need_v2(V2_GRPC_ENV)


@pytest.fixture(scope="session")
def v2_repository() -> Path:
    """The model repository directory the server serves (tests export into it)."""
    path = Path(_need_v2(V2_REPOSITORY_ENV))
    if not path.is_dir():
        pytest.fail(f"${V2_REPOSITORY_ENV}={path} is not a directory")
    return path


@pytest.fixture
def model_name(v2_grpc: str) -> Iterator[str]:
    """A model name unique to the test (tests share one server); unloaded afterwards."""
    import tritonclient.grpc as grpcclient

    name = f"policy_{uuid.uuid4().hex[:10]}"
    yield name
    client = grpcclient.InferenceServerClient(v2_grpc)
    try:
        client.unload_model(name)
    except Exception:
        pass  # never loaded, or the test unloaded it itself
    finally:
        client.close()
