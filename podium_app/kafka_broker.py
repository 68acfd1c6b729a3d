"""A local single-node Apache Kafka broker (KRaft) for development and integration tests.

The broker is the real Apache Kafka release, fetched from Maven Central with ``mvn`` (the
``org.apache.kafka:kafka_2.13`` artifact and its runtime dependencies, plus ``kafka-tools``
for the console consumer, see ``scripts/kafka/pom.xml``) into a cache outside the checkout, and run as one combined
broker+controller (``process.roles=broker,controller``) on 127.0.0.1:

    eval "$(scripts/kafka.sh start)"   # exports PODIUM_KAFKA_BOOTSTRAP (a kafka:// URL)
    scripts/kafka.sh status                # and PODIUM_KAFKA_SASL_PASSWORD
    scripts/kafka.sh stop

Like production it serves clients only over TLS with SCRAM-SHA-512 and enforces ACLs
(``security="sasl_ssl"``, :mod:`podium_app.kafka_auth`): a CA and broker certificate made for
its directory (``tls/ca.pem`` is what clients verify with), an ``admin`` super user (the URL
``start`` prints: tests and tools) and one principal per service with only its ACLs, whose
``PODIUM_BUS`` and password are in ``credentials/<service>.env``. The KRaft controller
listener stays on loopback with SASL PLAIN for the admin alone (SCRAM cannot serve it: its
credentials live in the metadata the controller serves). ``--plaintext`` gives the old
unauthenticated broker for development.

Tests that need a broker of their own (to ``kill -9`` it) use :class:`KafkaBroker` directly.

Version: the release the Kubernetes manifests run (``k8s/base/kafka.yaml``), so the tests meet
the broker production meets. aiokafka's idempotent producer, consumer groups and transactions
work against it, which ``tests/podium_app/test_kafka_broker.py`` proves (Kafka 4.0 removed
the oldest protocol versions, KIP-896; aiokafka negotiates newer ones). librdkafka clients need
2.6.1 or later to log in with SCRAM (docs/kafka.md).

This module uses only the standard library (and podium.errors and podium.topics, themselves
stdlib only), so ``scripts/kafka.sh`` runs without a venv; TLS material needs ``openssl``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shlex
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
from urllib.parse import quote

from podium.errors import PodiumError
from podium_app.kafka_auth import (
    ADMIN_USER,
    SCRAM_MECHANISM,
    SERVICES,
    AuthError,
    Login,
    all_grants,
    create_acls,
    make_tls,
    new_password,
    open_connection,
    request,
)

KAFKA_VERSION = "4.2.1"
"""Pinned Apache Kafka release (Scala 2.13 build)."""

SECURITY_MODES = ("sasl_ssl", "plaintext")
"""How the broker serves clients: see :attr:`KafkaBroker.security`."""

DEFAULT_SECURITY = "sasl_ssl"
"""Clients authenticate (SCRAM over TLS) and are authorized by ACLs, as in production."""

PASSWORD_ENV = "PODIUM_KAFKA_SASL_PASSWORD"
"""Where clients read the SASL password; the same name as ``podium.bus.kafka.SASL_PASSWORD_ENV``
(that module imports aiokafka, this one must stay standard-library only)."""

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


def metadata_brokers(
    host: str, port: int, timeout_s: float = 2.0, login: Login | None = None
) -> list[tuple[int, str, int]]:
    """Send a Kafka ``Metadata`` request (v1) and return the brokers it lists.

    Used as the readiness check: a listening socket is not enough, the broker must have
    joined its KRaft quorum and be serving metadata. With ``login`` the request goes over TLS
    after a SCRAM login (the secured broker serves nothing else), which also proves that the
    broker's certificate and the admin credential work.
    """
    # Body v1: topics = null (-1), i.e. "no topic list needed".
    with open_connection(host, port, timeout_s, login) as sock:
        reply = request(sock, 3, 1, struct.pack(">i", -1))
    brokers = []
    for _ in range(reply.unpack(">i")[0]):
        (node_id,) = reply.unpack(">i")
        bhost = reply.string() or ""
        (bport,) = reply.unpack(">i")
        reply.string()  # rack
        brokers.append((node_id, bhost, bport))
    return brokers


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
    proxy_port: int = 0
    """Port of a TCP proxy in front of the broker (fault tests cut it); 0 = none. When set, a
    second client listener ``PROXIED`` on :attr:`proxied_port` advertises 127.0.0.1:proxy_port,
    so clients that bootstrap through the proxy stay behind it after the metadata response.
    ``PLAINTEXT`` (inter-broker traffic, the readiness check) is unchanged."""
    proxied_port: int = 0
    """Where the ``PROXIED`` listener listens (the proxy forwards there); 0 picks a free one
    (kept across restarts)."""
    security: str = ""
    """Empty: the mode this directory was formatted with, else :data:`DEFAULT_SECURITY`.
    ``sasl_ssl``: clients are served only over TLS (a CA made for this directory) with
    SCRAM-SHA-512, one principal per service plus the ``admin`` super user, and ACLs enforced
    (``allow.everyone.if.no.acl.found=false``); the KRaft controller listener stays on loopback
    with SASL PLAIN (admin only). ``plaintext``: no authentication, for development only.
    Fixed when the storage is formatted."""
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.security = self.security or str(self._read_state().get("security") or DEFAULT_SECURITY)
        if self.security not in SECURITY_MODES:
            raise BrokerError(
                f"security must be one of {', '.join(SECURITY_MODES)}, got {self.security!r}"
            )
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
        """``127.0.0.1:PORT``: the client listener's address (see :meth:`client_url` for how
        to connect to it)."""
        return f"127.0.0.1:{self.port}"

    @property
    def secure(self) -> bool:
        """Whether clients must authenticate over TLS (``security == "sasl_ssl"``)."""
        return self.security == "sasl_ssl"

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients verify the broker with (readable by the broker's user)."""
        return self.run_dir / "tls" / "ca.pem"

    @property
    def credentials_file(self) -> Path:
        """SCRAM passwords by user name (mode 0600), made when the storage is formatted."""
        return self.run_dir / "credentials.json"

    def passwords(self) -> dict[str, str]:
        """SCRAM user -> password; empty for a plaintext broker or one not formatted yet."""
        try:
            data = json.loads(self.credentials_file.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def login(self, user: str = ADMIN_USER) -> Login | None:
        """How the tooling logs in as ``user``; None for a plaintext broker."""
        if not self.secure:
            return None
        return Login(self.ca_file, user, self.passwords().get(user, ""))

    def client_url(self, user: str = ADMIN_USER) -> str:
        """``kafka://`` URL for :func:`podium.bus.connect` as ``user`` (the password is not in
        it: clients read it from ``$PODIUM_KAFKA_SASL_PASSWORD``, see :meth:`client_env`)."""
        url = f"kafka://{self.bootstrap}"
        if not self.secure:
            return url
        params = {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": SCRAM_MECHANISM,
            "sasl_username": user,
            "ssl_cafile": str(self.ca_file),
        }
        return url + "?" + "&".join(f"{k}={quote(v, safe='/')}" for k, v in params.items())

    def client_env(self, user: str = ADMIN_USER) -> dict[str, str]:
        """Environment of a client acting as ``user``: ``PODIUM_KAFKA_BOOTSTRAP`` (admin, the
        tests and tools) or ``PODIUM_BUS`` (a service), plus the password when secure."""
        if not self.secure:
            return {"PODIUM_KAFKA_BOOTSTRAP": self.client_url()}
        var = "PODIUM_KAFKA_BOOTSTRAP" if user == ADMIN_USER else "PODIUM_BUS"
        return {var: self.client_url(user), PASSWORD_ENV: self.passwords()[user]}

    def credentials_env_file(self, user: str) -> Path:
        """``<run_dir>/credentials/<user>.env``: :meth:`client_env` as shell assignments."""
        return self.run_dir / "credentials" / f"{user}.env"

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
            brokers = metadata_brokers("127.0.0.1", self.port, login=self.login())
        except (OSError, struct.error, ValueError, BrokerError, AuthError):
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
        if self.secure:
            props.update(self._security_properties(controller_port))
        if self.proxy_port:
            protocol = "SASL_SSL" if self.secure else "PLAINTEXT"
            props.update(_proxied_listener(props, self.proxied_port, self.proxy_port, protocol))
        props.update(self.extra_config)
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _security_properties(self, controller_port: int) -> dict[str, str]:
        """Listeners, TLS, SASL and the authorizer of a ``sasl_ssl`` broker."""
        password = self.passwords()[ADMIN_USER]
        scram = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{ADMIN_USER}" password="{password}";'
        )
        # The controller listener cannot use SCRAM (its credentials live in the metadata log
        # the controller serves), so it takes PLAIN with the admin alone, on loopback only.
        plain = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{ADMIN_USER}" password="{password}" user_{ADMIN_USER}="{password}";'
        )
        return {
            "listeners": f"SASL_SSL://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"SASL_SSL://127.0.0.1:{self.port}",
            "inter.broker.listener.name": "SASL_SSL",
            "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram,
            "listener.name.proxied.scram-sha-512.sasl.jaas.config": scram,
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": plain,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.run_dir / "tls" / "broker-keystore.pem"),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN_USER}",
        }

    def _prepare_security(self, formatted: bool, state: dict[str, object]) -> list[str]:
        """TLS files and passwords of a new ``sasl_ssl`` broker; the ``--add-scram`` arguments
        of its format command. Refuses to switch an existing directory's security mode."""
        was = str(state.get("security") or ("sasl_ssl" if self.passwords() else "plaintext"))
        if formatted and was != self.security:
            raise BrokerError(
                f"{self.run_dir} holds a {was} broker; it cannot be started as {self.security} "
                "(use another --dir, or the matching --security)"
            )
        if not self.secure:
            return []
        make_tls(self.run_dir / "tls")
        if not formatted:
            users = [ADMIN_USER, *SERVICES]
            self.credentials_file.write_text(json.dumps({u: new_password() for u in users}))
            self.credentials_file.chmod(0o600)
        return [
            arg
            for user, password in self.passwords().items()
            for arg in ("--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]")
        ]

    def _finish_security(self) -> None:
        """Once ready: the service principals' ACLs and the credential files clients read.

        The grants are applied on every start (creating an existing ACL is a no-op, 0.1 s), so
        a broker directory made before a grant was added gets it too."""
        if not self.secure:
            return
        with open_connection("127.0.0.1", self.port, 10.0, self.login()) as sock:
            create_acls(sock, all_grants())
        (self.run_dir / "credentials").mkdir(mode=0o700, exist_ok=True)
        for user in self.passwords():
            path = self.credentials_env_file(user)
            path.touch(mode=0o600)
            path.write_text(env_lines(self.client_env(user)))

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
        if self.proxy_port:
            self.proxied_port = (
                self.proxied_port or int(str(state.get("proxied_port") or 0)) or free_port()
            )
        formatted = (self.run_dir / "data" / "meta.properties").exists()
        scram_args = self._prepare_security(formatted, state)
        config = self.run_dir / "server.properties"
        config.touch(mode=0o600)  # holds the admin password when secure
        config.write_text(self._properties(controller_port))
        log4j = self.run_dir / "log4j.properties"
        log4j.write_text(_LOG4J.format(log=self.log_file))
        jvm = self._jvm(java, libs, log4j)
        if not formatted:
            _format_storage(jvm, config, scram_args)
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
                    "proxied_port": self.proxied_port,
                    "security": self.security,
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
        self._finish_security()
        return self.bootstrap

    def _jvm(self, java: str, libs: Path, log4j: Path) -> list[str]:
        """The JVM command line (before the main class) of the broker and its tools."""
        return [
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


def _format_storage(jvm: list[str], config: Path, scram_args: list[str]) -> None:
    """``kafka-storage format`` with a new cluster id (and the SCRAM users, when secure)."""
    tool = [*jvm, "kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(config)]
    fmt = subprocess.run(
        [*tool, *scram_args],
        capture_output=True,
        text=True,
        check=False,
    )
    if fmt.returncode != 0:
        # The output names the users, never their passwords (those are only in the args).
        raise BrokerError(f"formatting KRaft storage failed:\n{fmt.stdout}{fmt.stderr}")


def _proxied_listener(
    props: dict[str, str], port: int, advertised: int, protocol: str = "PLAINTEXT"
) -> dict[str, str]:
    """The ``PROXIED`` client listener on ``port``, advertised as 127.0.0.1:``advertised``,
    with the same security ``protocol`` as the direct client listener."""
    return {
        "listeners": f"{props['listeners']},PROXIED://127.0.0.1:{port}",
        "advertised.listeners": f"{props['advertised.listeners']},PROXIED://127.0.0.1:{advertised}",
        "listener.security.protocol.map": (
            f"{props['listener.security.protocol.map']},PROXIED:{protocol}"
        ),
    }


def env_lines(env: dict[str, str], *, export: bool = False) -> str:
    """``NAME='value'`` lines (``export NAME='value'`` with ``export``), safe for ``eval`` and
    ``. file``: the URLs hold ``&`` and ``?``."""
    prefix = "export " if export else ""
    return "".join(f"{prefix}{k}={shlex.quote(v)}\n" for k, v in env.items())


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# -- command line (scripts/kafka.sh and `podium kafka`) -----------------------------------------


ACTIONS = {
    "fetch": "download the Kafka release (cached)",
    "start": "start the broker; prints PODIUM_KAFKA_BOOTSTRAP=...",
    "stop": "stop the broker",
    "status": "print PODIUM_KAFKA_BOOTSTRAP=... if the broker is up (exit 3 if not)",
}
"""The broker's actions and their one-line help."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``scripts/kafka.sh``: the action, then :func:`add_broker_options`."""
    parser.add_argument("action", choices=tuple(ACTIONS), help="what to do")
    add_broker_options(parser)


def add_broker_options(parser: argparse.ArgumentParser) -> None:
    """Where and how the broker runs (every action's options)."""
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="broker run directory (default: $PODIUM_CACHE/kafka-run)",
    )
    parser.add_argument("--port", type=int, default=0, help="client port (default: a free one)")
    parser.add_argument(
        "--proxy-port",
        type=int,
        default=0,
        help="port of a TCP proxy in front of the broker: a PROXIED listener advertises it",
    )
    parser.add_argument(
        "--security",
        choices=SECURITY_MODES,
        default="",
        help="sasl_ssl (SCRAM over TLS, ACLs) or plaintext; default: the directory's mode, "
        f"else {DEFAULT_SECURITY}",
    )
    parser.add_argument(
        "--plaintext",
        dest="security",
        action="store_const",
        const="plaintext",
        help="same as --security plaintext: no TLS, no authentication (development only)",
    )
    parser.add_argument("--version", default=KAFKA_VERSION, help="Apache Kafka release")
    parser.add_argument("--heap", default=DEFAULT_HEAP, help="JVM -Xmx of the broker")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for start")


def run(args: argparse.Namespace) -> int:
    """Carry out one action; prints ``PODIUM_KAFKA_BOOTSTRAP=...`` on start and status."""
    if args.port < 0 or args.port > 65535:
        print(f"error: --port must be 0..65535, got {args.port}", file=sys.stderr)
        return 2
    broker = KafkaBroker(
        args.dir or default_run_dir(),
        args.port,
        args.version,
        args.heap,
        proxy_port=args.proxy_port,
        security=args.security,
    )
    try:
        if args.action == "fetch":
            libs = fetch(args.version)
            print(f"Kafka {args.version}: {libs} ({len(list(libs.glob('*.jar')))} jars)")
            return 0
        if args.action == "start":
            broker.start(args.timeout)
            print(env_lines(broker.client_env(), export=True), end="")
            if broker.proxy_port:
                print(f"PODIUM_KAFKA_PROXIED=127.0.0.1:{broker.proxied_port}")
            print(f"# pid {broker.pid()}, log {broker.log_file}", file=sys.stderr)
            if broker.secure:
                where = broker.credentials_env_file("<service>")
                print(f"# each service's PODIUM_BUS and password: {where}", file=sys.stderr)
            return 0
        if args.action == "stop":
            print("stopped" if broker.stop() else "not running")
            return 0
        pid = broker.pid()
        if pid is not None and broker.is_ready():
            print(env_lines(broker.client_env(), export=True), end="")
            print(
                f"# running, pid {pid}, Kafka {broker.version}, log {broker.log_file}",
                file=sys.stderr,
            )
            return 0
        print("not running" if pid is None else f"pid {pid} running but not ready")
        return 3  # LSB "program is not running"
    except (BrokerError, AuthError) as exc:
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
