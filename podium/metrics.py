"""Podium's metrics: one OpenTelemetry meter provider per process, served for Prometheus.

Every metric of the platform is declared here, once (:class:`Instruments`), and recorded
through the small functions below, so a service's call site is one line and the names the
dashboards query (``k8s/observability/grafana-dashboard.json``) cannot drift apart. Rendered
by the OpenTelemetry Prometheus exporter they read (label sets in braces; every series also
has the exporter's ``otel_scope_*`` labels, and all but the two bus-level ones, labelled by
consumer ``group`` instead, a ``service`` label)::

    podium_sessions_total{outcome}                 counter    sessions ended (succeeded|failed)
    podium_decisions_total                         counter    scheduling decisions taken
    podium_decision_latency_seconds                histogram  time the policy took per decision
    podium_subagent_executions_total{agent,outcome} counter   sub-agent executions run
    podium_consumer_lag{topic,group}               gauge      records behind the partition ends
    podium_dead_letters_total{topic,group}         counter    records dead-lettered (source topic)
    podium_reward_component{component}             histogram  weighted reward components
    podium_detector_firings_total{detector}        counter    detectors that charged a penalty
    podium_learner_samples_total                   counter    samples the learner trained on
    podium_learner_policy_lag                      gauge      versions behind, of trained samples
    podium_live_policy_version                     gauge      version deciding sessions (0: rules)

Why one provider per process, with a ``service`` attribute on every point, rather than one
per service: the embedded mode (``podium demo``, ``podium train``) runs the four services in
one process, and a Prometheus endpoint serves one process. Per-service providers would each
need their own reader, registry and port (or register the same metric names twice in one
registry, which the scrape then shows as duplicate families); a per-service meter on one
provider would render the same instrument name once per scope. One provider with one set of
instruments has exactly one family per name, whichever services run in the process; the
``service`` attribute says who recorded a point, and the resource (``target_info``) says what
the process is (``OTEL_SERVICE_NAME`` winning over the code's name, as for traces).

The instruments are created on the *global* meter provider's proxy, so a library call site
records nothing (cheaply) until :func:`setup_metrics` installs the provider, and everything
from then on. :class:`MetricsServer` serves the registry on ``PODIUM_METRICS_PORT``
(``/metrics``; :func:`podium.service.serve` starts it for standalone services).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Counter, Histogram, Meter, _Gauge
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, start_http_server

from podium.errors import ConfigError
from podium.policy.versions import is_version_number, policy_version_number
from podium.telemetry import service_resource

_log = logging.getLogger(__name__)

METER_NAME = "podium"
"""Instrumentation scope of every Podium metric (``otel_scope_name`` in a scrape)."""

SERVICE_ATTRIBUTE = "service"
"""Attribute naming the service that recorded a point (the ``service`` label)."""

METRICS_PATH = "/metrics"
"""Where Prometheus scrapes (the server answers the registry on any path; this is the one
the manifests and docs name)."""

METRIC_NAMES = (
    "podium_sessions_total",
    "podium_decisions_total",
    "podium_decision_latency_seconds",
    "podium_subagent_executions_total",
    "podium_consumer_lag",
    "podium_dead_letters_total",
    "podium_reward_component",
    "podium_detector_firings_total",
    "podium_learner_samples_total",
    "podium_learner_policy_lag",
    "podium_live_policy_version",
)
"""The Prometheus family names of :class:`Instruments`, as the exporter renders them."""

DECISION_LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Bucket bounds of the decision latency: a rule engine decides in well under a millisecond,
a served policy in a few, a cold or remote one up to seconds."""

REWARD_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0, 5.0)
"""Bucket bounds of a weighted reward component (mostly within [0, 1]). None is negative on
purpose: the Prometheus text format drops ``_sum`` and ``_count`` of a histogram whose first
bound is negative, and the dashboards read the mean per component (sum / count, exact for
negative values too, which all land in the first bucket)."""


@dataclass(frozen=True)
class Instruments:
    """The platform's instruments, created once per process (:func:`instruments`)."""

    sessions: Counter
    """Sessions ended, by ``outcome`` (``succeeded`` / ``failed``)."""
    decisions: Counter
    """Scheduling decisions taken by the orchestrator's policy."""
    decision_latency: Histogram
    """Seconds the policy took for one decision (inference, not the session's time)."""
    subagent_executions: Counter
    """Sub-agent executions run, by ``agent`` and ``outcome`` (success, failure, ...)."""
    consumer_lag: _Gauge
    """Records between a consumer's position and the end of the partitions it owns, by
    ``topic`` and ``group`` (this member's share; sum over instances for the group's)."""
    dead_letters: Counter
    """Records published to a dead-letter topic, by the ``topic`` they were read from and the
    consumer ``group`` that gave up on them."""
    reward_component: Histogram
    """Each weighted reward component of a scored trajectory, by ``component``."""
    detector_firings: Counter
    """Reward detectors that charged a penalty (> 0) on a trajectory, by ``detector``."""
    learner_samples: Counter
    """Samples (trajectories) the learner trained on."""
    learner_policy_lag: _Gauge
    """Policy versions between the newest trained sample's and the learner's own version."""
    live_policy_version: _Gauge
    """Version of the policy deciding this orchestrator's sessions (0: a rule engine)."""


def create_instruments(meter: Meter) -> Instruments:
    """The platform's instruments on ``meter`` (tests may pass their own)."""
    return Instruments(
        sessions=meter.create_counter(
            "podium.sessions", unit="{session}", description="Sessions ended, by outcome."
        ),
        decisions=meter.create_counter(
            "podium.decisions", unit="{decision}", description="Scheduling decisions taken."
        ),
        decision_latency=meter.create_histogram(
            "podium.decision.latency",
            unit="s",
            description="Time the policy took for one scheduling decision.",
            explicit_bucket_boundaries_advisory=list(DECISION_LATENCY_BUCKETS_S),
        ),
        subagent_executions=meter.create_counter(
            "podium.subagent.executions",
            unit="{execution}",
            description="Sub-agent executions run, by agent and outcome.",
        ),
        consumer_lag=meter.create_gauge(
            "podium.consumer.lag",
            unit="{record}",
            description="Records behind the end of the partitions this consumer owns.",
        ),
        dead_letters=meter.create_counter(
            "podium.dead_letters",
            unit="{record}",
            description="Records dead-lettered, by the topic they were read from.",
        ),
        reward_component=meter.create_histogram(
            "podium.reward.component",
            unit="1",
            description="Weighted reward components of scored trajectories.",
            explicit_bucket_boundaries_advisory=list(REWARD_BUCKETS),
        ),
        detector_firings=meter.create_counter(
            "podium.detector.firings",
            unit="{firing}",
            description="Reward detectors that charged a penalty, by detector.",
        ),
        learner_samples=meter.create_counter(
            "podium.learner.samples", unit="{sample}", description="Samples the learner trained on."
        ),
        learner_policy_lag=meter.create_gauge(
            "podium.learner.policy_lag",
            unit="{version}",
            description="Versions between the newest trained sample's policy and the learner's.",
        ),
        live_policy_version=meter.create_gauge(
            "podium.live_policy_version",
            unit="1",
            description="Version of the policy deciding sessions (0: a rule engine).",
        ),
    )


@functools.cache
def instruments() -> Instruments:
    """The process's instruments, on the global meter provider (no-op until
    :func:`setup_metrics`; the proxies switch to the real provider when it is installed)."""
    return create_instruments(metrics.get_meter(METER_NAME))


# --- the process's provider ----------------------------------------------------------------

_setup_lock = threading.Lock()
_registry: CollectorRegistry | None = None


def setup_metrics(process_name: str) -> CollectorRegistry:
    """Install the process's meter provider (once) and return the registry it renders into.

    The provider's resource is :func:`podium.telemetry.service_resource` of ``process_name``
    (a standalone service's name, ``podium`` for the embedded mode). A second call, by any
    service of the same process, returns the same registry: the first name wins, which is
    the point (one provider per process). The registry is Podium's own, not
    ``prometheus_client``'s global one, so nothing else registered in the process leaks in.
    """
    global _registry
    with _setup_lock:
        if _registry is None:
            registry = CollectorRegistry(auto_describe=True)
            reader = PrometheusMetricReader(registry=registry)
            provider = MeterProvider(
                resource=service_resource(process_name), metric_readers=[reader]
            )
            metrics.set_meter_provider(provider)
            _registry = registry
        return _registry


class MetricsServer:
    """The Prometheus endpoint of a process: :func:`setup_metrics`'s registry over HTTP.

    ``prometheus_client``'s server (a thread; scrapes never wait on the event loop, so a busy
    loop still answers and a scrape never stalls a session).
    """

    def __init__(self, port: int, *, host: str = "0.0.0.0", registry: CollectorRegistry) -> None:
        if not 0 <= port <= 65535:
            raise ConfigError(f"metrics port {port} is not in 0..65535")
        self.host = host
        self.requested_port = port
        self.registry = registry
        self.port = 0
        """The bound port once started (the requested one, or the OS's choice for 0)."""
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Bind and serve; the bound port. Raises ``OSError`` if the port is taken."""
        server, thread = start_http_server(
            self.requested_port, addr=self.host, registry=self.registry
        )
        self._server, self._thread = server, thread
        self.port = int(server.server_port)
        return self.port

    def stop(self) -> None:
        """Stop serving and release the port (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


# --- recording: one function per fact, so call sites stay one line ------------------------


def _attrs(service: str, **labels: str) -> Mapping[str, str]:
    return {SERVICE_ATTRIBUTE: service, **labels}


def record_session(service: str, *, succeeded: bool) -> None:
    """A session ended."""
    outcome = "succeeded" if succeeded else "failed"
    instruments().sessions.add(1, _attrs(service, outcome=outcome))


def record_decision(service: str, seconds: float) -> None:
    """The policy took one decision in ``seconds``."""
    inst = instruments()
    attrs = _attrs(service)
    inst.decisions.add(1, attrs)
    inst.decision_latency.record(max(seconds, 0.0), attrs)


def record_live_policy_version(service: str, policy_version: str) -> None:
    """The policy deciding sessions is ``policy_version`` now: a learned version's number, 0
    for anything else (a rule engine's ``rules:<name>``)."""
    number = policy_version_number(policy_version) if is_version_number(policy_version) else 0
    instruments().live_policy_version.set(number, _attrs(service))


def record_subagent_execution(service: str, *, agent: str, outcome: str) -> None:
    """A sub-agent ran one execution ending in ``outcome`` (e.g. ``success``)."""
    instruments().subagent_executions.add(1, _attrs(service, agent=agent, outcome=outcome))


def record_consumer_lag(group: str, lags: Mapping[str, int]) -> None:
    """This member of ``group`` is ``lags[topic]`` records behind on each topic.

    The bus-level metrics (this and :func:`record_dead_letters`) are labelled by consumer
    group rather than by service: the consume loops are library code that knows its group,
    and a group names its service's role more precisely than the service does."""
    gauge = instruments().consumer_lag
    for topic, lag in lags.items():
        gauge.set(lag, {"topic": topic, "group": group})


def record_dead_letters(topic: str, group: str, count: int = 1) -> None:
    """``count`` records read from ``topic`` by ``group`` were dead-lettered."""
    instruments().dead_letters.add(count, {"topic": topic, "group": group})


def record_reward(
    service: str, components: Mapping[str, float], penalties: Mapping[str, float]
) -> None:
    """A trajectory was scored: its weighted ``components``, and each detector in
    ``penalties`` that charged more than nothing fired."""
    inst = instruments()
    for name, value in components.items():
        inst.reward_component.record(value, _attrs(service, component=name))
    for name, penalty in penalties.items():
        if penalty > 0:
            inst.detector_firings.add(1, _attrs(service, detector=name))


def record_learner_update(service: str, *, samples: int, policy_lag: int | None) -> None:
    """The learner trained on ``samples`` samples, the newest ``policy_lag`` versions behind
    (None: not known, e.g. samples of a rule engine)."""
    inst = instruments()
    attrs = _attrs(service)
    inst.learner_samples.add(samples, attrs)
    if policy_lag is not None:
        inst.learner_policy_lag.set(policy_lag, attrs)


def lag_by_topic(lags: Mapping[tuple[str, int], int], topics: tuple[str, ...]) -> dict[str, int]:
    """Per topic of ``topics``, the sum of the per-partition ``lags`` (0 for a topic whose
    partitions this member does not own or has not measured yet)."""
    out = dict.fromkeys(topics, 0)
    for (topic, _partition), lag in lags.items():
        if topic in out:
            out[topic] += max(lag, 0)
    return out
