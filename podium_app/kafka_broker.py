"""A local single-node Apache Kafka broker (KRaft) for development and integration tests.

The broker is the real Apache Kafka release, fetched from Maven Central with ``mvn`` (the
``org.apache.kafka:kafka_2.13`` artifact and its runtime dependencies, see
``scripts/kafka/pom.xml``) into a cache outside the checkout, and run as one combined
broker+controller (``process.roles=broker,controller``) on 127.0.0.1:

    scripts/kafka.sh start      # prints PODIUM_KAFKA_BOOTSTRAP=127.0.0.1:PORT
    scripts/kafka.sh status
    scripts/kafka.sh stop

Tests that need a broker of their own (to ``kill -9`` it) use :class:`KafkaBroker` directly.

Version: Kafka 3.9.x is the last line that still serves the older protocol versions aiokafka
speaks (4.0 removed them, see KIP-896); with it aiokafka's idempotent producer, consumer
groups and transactions all work, which ``tests/podium_app/test_kafka_broker.py`` proves.

This module uses only the standard library (and podium.errors, itself stdlib only), so ``scripts/kafka.sh`` runs without a venv.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from podium.errors import PodiumError

KAFKA_VERSION = "3.9.1"
"""Pinned Apache Kafka release (Scala 2.13 build)."""

DEFAULT_HEAP = "512m"
"""JVM heap of the dev broker: plenty for tests, small enough for a laptop or CI runner."""

_ROOT = Path(__file__).resolve().parent.parent
POM = _ROOT / "scripts" / "kafka" / "pom.xml"
"""The Maven project that lists the broker's artifacts."""


class BrokerError(PodiumError):
    """The local broker could not be fetched, started or stopped. The message says why."""


def cache_dir() -> Path:
    """``$PODIUM_CACHE`` or ``~/.cache/podium``: shared by all checkouts, never inside one."""
    return Path(os.environ.get("PODIUM_CACHE") or Path.home() / ".cache" / "podium")


def kafka_home(version: str = KAFKA_VERSION) -> Path:
    """Where release ``version`` is unpacked: ``<cache>/kafka-<version>``."""
    return cache_dir() / f"kafka-{version}"


def default_run_dir() -> Path:
    """Data, logs and state of the broker started by ``scripts/kafka.sh``."""
    return cache_dir() / "kafka-run"


def fetch(version: str = KAFKA_VERSION, *, pom: Path = POM, quiet: bool = True) -> Path:
    """Download the broker's jars once; returns the ``libs`` directory.

    Idempotent: a ``.complete`` marker is written only after every jar was copied, and a
    second call returns immediately. The copy goes to a temporary sibling that is renamed
    into place, so an interrupted download never looks complete.
    """
    libs = kafka_home(version) / "libs"
    if (libs / ".complete").exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError("`mvn` (Apache Maven) is not on PATH; it is needed to fetch Kafka")
    if not pom.exists():
        raise BrokerError(f"Maven project {pom} not found (run from a Podium checkout)")
    libs.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="libs.", dir=libs.parent))
    cmd = [
        mvn,
        *(["-q"] if quiet else []),
        "-B",
        "-f",
        str(pom),
        f"-Dkafka.version={version}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={tmp}",
        "-DincludeScope=runtime",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not any(tmp.glob(f"kafka_2.13-{version}.jar")):
        shutil.rmtree(tmp, ignore_errors=True)
        tail = (result.stdout + result.stderr)[-3000:]
        raise BrokerError(
            f"mvn could not fetch Kafka {version} (exit {result.returncode}):\n{tail}"
        )
    (tmp / ".complete").write_text(f"kafka {version}\n")
    if libs.exists():
        shutil.rmtree(libs)
    tmp.rename(libs)
    return libs


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kafka_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def metadata_brokers(host: str, port: int, timeout_s: float = 2.0) -> list[tuple[int, str, int]]:
    """Send a Kafka ``Metadata`` request (v1) and return the brokers it lists.

    Used as the readiness check: a listening socket is not enough, the broker must have
    joined its KRaft quorum and be serving metadata.
    """
    # Request header v1: api_key=3 (Metadata), api_version=1, correlation id, client id;
    # body v1: topics = null (-1), i.e. "no topic list needed".
    body = struct.pack(">hhi", 3, 1, 7) + _kafka_string("podium-ready") + struct.pack(">i", -1)
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _recv_exact(sock, 4))[0]
        data = _recv_exact(sock, size)
    correlation, count = struct.unpack_from(">ii", data, 0)
    if correlation != 7:
        raise BrokerError(f"unexpected metadata correlation id {correlation}")
    pos = 8
    brokers = []
    for _ in range(count):
        node_id, hlen = struct.unpack_from(">ih", data, pos)
        pos += 6
        bhost = data[pos : pos + hlen].decode()
        pos += hlen
        (bport, rack_len) = struct.unpack_from(">ih", data, pos)
        pos += 6 + max(rack_len, 0)
        brokers.append((node_id, bhost, bport))
    return brokers


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        buf += chunk
    return buf


def _cluster_id() -> str:
    # Kafka's Uuid format: 16 random bytes, URL-safe base64 without padding. Ids starting
    # with "-" are avoided (Kafka does the same) so they are never read as a CLI flag.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _pid_is_kafka(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"kafka.Kafka" in cmdline


_LOG4J = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.RollingFileAppender
log4j.appender.file.File={log}
log4j.appender.file.MaxFileSize=20MB
log4j.appender.file.MaxBackupIndex=2
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.org.apache.kafka.controller=INFO
log4j.logger.state.change.logger=WARN
"""


@dataclass
class KafkaBroker:
    """One combined broker+controller process with its data in ``run_dir``.

    ``start()`` formats the storage on first use and keeps it afterwards, so a broker can be
    stopped, ``kill -9``-ed and started again on the same log directory and ports.
    """

    run_dir: Path
    """Holds ``data/`` (the Kafka log dirs), ``logs/``, ``server.properties`` and ``state.json``."""
    port: int = 0
    """Client listener port on 127.0.0.1; 0 picks a free one (kept across restarts)."""
    version: str = KAFKA_VERSION
    """Apache Kafka release to run."""
    heap: str = DEFAULT_HEAP
    """JVM ``-Xmx``."""
    extra_config: dict[str, str] = field(default_factory=dict)
    """Additional ``server.properties`` entries (override the defaults)."""
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        state = self._read_state()
        if state and not self.port:
            self.port = int(str(state["port"]))

    # -- state --------------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.run_dir / "state.json"

    @property
    def log_file(self) -> Path:
        return self.run_dir / "logs" / "server.log"

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT`` for clients."""
        return f"127.0.0.1:{self.port}"

    def _read_state(self) -> dict[str, object]:
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def pid(self) -> int | None:
        """Process id of the running broker, or None."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        pid = self._read_state().get("pid")
        if isinstance(pid, int) and _pid_is_kafka(pid):
            return pid
        return None

    def is_ready(self) -> bool:
        """True when the broker answers a metadata request listing itself."""
        if not self.port:
            return False
        try:
            brokers = metadata_brokers("127.0.0.1", self.port)
        except (OSError, struct.error, BrokerError):
            return False
        return any(p == self.port for _, _, p in brokers)

    # -- lifecycle ----------------------------------------------------------------------------

    def _properties(self, controller_port: int) -> str:
        data = self.run_dir / "data"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(data),
            "num.partitions": "3",
            "auto.create.topics.enable": "true",
            # Single node: internal topics cannot have more replicas than brokers.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            # Fewer internal partitions: the first group/transaction is ready much sooner.
            "offsets.topic.num.partitions": "6",
            "transaction.state.log.num.partitions": "3",
            # Tests start and stop consumers constantly; do not wait for more members.
            "group.initial.rebalance.delay.ms": "0",
        }
        props.update(self.extra_config)
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def start(self, timeout_s: float = 90.0) -> str:
        """Start (formatting storage on first use); returns the bootstrap address when ready."""
        if self.pid() is not None:
            if self._wait_ready(timeout_s):
                return self.bootstrap
            raise BrokerError(
                f"broker pid {self.pid()} is running but not ready; see {self.log_file}"
            )
        java = shutil.which("java")
        if java is None:
            raise BrokerError("`java` (17 or newer) is not on PATH; the Kafka broker needs it")
        libs = fetch(self.version)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        state = self._read_state()
        self.port = self.port or int(str(state.get("port") or 0)) or free_port()
        controller_port = int(str(state.get("controller_port") or 0)) or free_port()
        config = self.run_dir / "server.properties"
        config.write_text(self._properties(controller_port))
        log4j = self.run_dir / "log4j.properties"
        log4j.write_text(_LOG4J.format(log=self.log_file))
        jvm = [
            java,
            f"-Xmx{self.heap}",
            "-Xms128m",
            "-XX:+UseG1GC",
            "-XX:TieredStopAtLevel=1",  # faster start-up; a dev broker never gets hot
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{log4j}",
            f"-Dkafka.logs.dir={self.run_dir / 'logs'}",
            "-cp",
            f"{libs}/*",
        ]
        if not (self.run_dir / "data" / "meta.properties").exists():
            fmt = subprocess.run(
                [*jvm, "kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(config)],
                capture_output=True,
                text=True,
                check=False,
            )
            if fmt.returncode != 0:
                raise BrokerError(f"formatting KRaft storage failed:\n{fmt.stdout}{fmt.stderr}")
        out = (self.run_dir / "logs" / "broker.out").open("ab")
        # Own session/process group, so signals to the test runner never reach the broker
        # and stop() can signal the broker alone.
        self._proc = subprocess.Popen(
            [*jvm, "kafka.Kafka", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        self.state_file.write_text(
            json.dumps(
                {
                    "pid": self._proc.pid,
                    "port": self.port,
                    "controller_port": controller_port,
                    "version": self.version,
                    "bootstrap": self.bootstrap,
                    "log": str(self.log_file),
                },
                indent=2,
            )
        )
        if not self._wait_ready(timeout_s):
            self.kill9()
            tail = _tail(self.log_file) or _tail(self.run_dir / "logs" / "broker.out")
            raise BrokerError(f"Kafka did not become ready within {timeout_s:.0f}s:\n{tail}")
        return self.bootstrap

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.is_ready():
                return True
            if self.pid() is None:
                return False
            time.sleep(0.25)
        return False

    def stop(self, timeout_s: float = 30.0) -> bool:
        """SIGTERM (a controlled shutdown that flushes logs), then SIGKILL after ``timeout_s``.

        Returns True if a broker was running.
        """
        pid = self.pid()
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not self._wait_exit(pid, timeout_s):
            self._signal_kill(pid)
        return True

    def kill9(self) -> None:
        """``kill -9`` the broker: no shutdown hooks, no flush (the crash test)."""
        pid = self.pid()
        if pid is not None:
            self._signal_kill(pid)

    def restart(self, timeout_s: float = 90.0) -> str:
        """Stop gracefully if running, then start on the same log directory and port."""
        self.stop()
        return self.start(timeout_s)

    def _signal_kill(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self._wait_exit(pid, 10.0)

    def _wait_exit(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                if self._proc.poll() is not None:
                    return True
            elif not _pid_is_kafka(pid):
                return True
            time.sleep(0.1)
        return False


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# -- command line (scripts/kafka.sh and `podium kafka`) -----------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium kafka`` / ``scripts/kafka.sh``."""
    parser.add_argument("action", choices=("fetch", "start", "stop", "status"), help="what to do")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="broker run directory (default: $PODIUM_CACHE/kafka-run)",
    )
    parser.add_argument("--port", type=int, default=0, help="client port (default: a free one)")
    parser.add_argument("--version", default=KAFKA_VERSION, help="Apache Kafka release")
    parser.add_argument("--heap", default=DEFAULT_HEAP, help="JVM -Xmx of the broker")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for start")


def run(args: argparse.Namespace) -> int:
    """Carry out one action; prints ``PODIUM_KAFKA_BOOTSTRAP=...`` on start and status."""
    if args.port < 0 or args.port > 65535:
        print(f"error: --port must be 0..65535, got {args.port}", file=sys.stderr)
        return 2
    broker = KafkaBroker(args.dir or default_run_dir(), args.port, args.version, args.heap)
    try:
        if args.action == "fetch":
            libs = fetch(args.version)
            print(f"Kafka {args.version}: {libs} ({len(list(libs.glob('*.jar')))} jars)")
            return 0
        if args.action == "start":
            bootstrap = broker.start(args.timeout)
            print(f"PODIUM_KAFKA_BOOTSTRAP={bootstrap}")
            print(f"# pid {broker.pid()}, log {broker.log_file}", file=sys.stderr)
            return 0
        if args.action == "stop":
            print("stopped" if broker.stop() else "not running")
            return 0
        pid = broker.pid()
        if pid is not None and broker.is_ready():
            print(f"PODIUM_KAFKA_BOOTSTRAP={broker.bootstrap}")
            print(
                f"# running, pid {pid}, Kafka {broker.version}, log {broker.log_file}",
                file=sys.stderr,
            )
            return 0
        print("not running" if pid is None else f"pid {pid} running but not ready")
        return 3  # LSB "program is not running"
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kafka.sh", description="Local single-node Apache Kafka (KRaft) for development."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
