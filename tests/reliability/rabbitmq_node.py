"""A RabbitMQ node of its own for the scenarios where the broker must die: its own node name, AMQP
and distribution ports (free ones), data and logs and Erlang cookie in a temp dir, never the
machine's shared node.

    with ThrowawayRabbitMQ(log_dir) as node:  # rabbitmq-server, up when its AMQP port takes a connection
        node.url                         # amqp://guest:guest@127.0.0.1:<port>//
        node.stop()                      # SIGTERM: a clean shutdown, durable queues and persistent messages kept
        node.kill()                      # SIGKILL: what was not on disk yet is gone
        node.start()
        node.messages()                  # messages queued or delivered and not acknowledged, every queue
    # always killed at exit, its logs copied to log_dir (if given), its directory deleted

It runs as the current user (root in CI) with HOME in its directory, so its Erlang cookie is its own;
the machine's epmd is shared, as every node on a host shares it.
"""

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from tests.support.processes import wait_for

from .clusters import free_port

RABBITMQ_BIN = Path(os.environ.get("TIMEOUTS_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))
START_TIMEOUT = 90.0  # seconds: ample for a node booting on a loaded machine


def rabbitmq_server_available() -> bool:
    return (RABBITMQ_BIN / "rabbitmq-server").exists() and (RABBITMQ_BIN / "rabbitmqctl").exists()


class ThrowawayRabbitMQ:
    def __init__(self, log_dir=None):
        self.log_dir = log_dir  # where its logs are copied at exit
        self.port, self.dist_port = free_port(), free_port()
        self.node = f"timeouts-test-{self.port}@localhost"
        self.dir = None
        self.process = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def __enter__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="timeouts-rabbitmq-"))
        # Its own configuration: the machine's (/etc/rabbitmq) names the shared node and its listener.
        # The guest user may connect from 127.0.0.1 only, which is where everything connects from.
        (self.dir / "rabbitmq.conf").write_text("log.file.level = info\n")
        (self.dir / "rabbitmq-env.conf").write_text("")
        (self.dir / "enabled_plugins").write_text("[].\n")
        try:
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info):
        self.kill()
        if self.dir is not None:
            if self.log_dir is not None:
                for path in [self.dir / "server.out", *(self.dir / "log").glob("*.log")]:
                    shutil.copy(path, Path(self.log_dir) / f"rabbitmq-{path.name}")
            shutil.rmtree(self.dir, ignore_errors=True)

    def env(self) -> dict:
        return {**os.environ, "HOME": str(self.dir), "RABBITMQ_NODENAME": self.node,
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(self.port),
                "RABBITMQ_DIST_PORT": str(self.dist_port), "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
                "RABBITMQ_LOG_BASE": str(self.dir / "log"), "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
                "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
                "RABBITMQ_PID_FILE": str(self.dir / "rabbitmq.pid"), "ERL_EPMD_ADDRESS": "127.0.0.1"}

    def start(self, timeout=START_TIMEOUT):
        with open(self.dir / "server.out", "ab") as out:
            self.process = subprocess.Popen([RABBITMQ_BIN / "rabbitmq-server"], env=self.env(), stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: self.process.poll() is not None or self.answers(), timeout, interval=0.2,
                 message=f"RabbitMQ node {self.node}")
        if self.process.poll() is not None:
            raise RuntimeError(f"RabbitMQ node {self.node} exited with {self.process.returncode}: {self.log_tail()}")

    def answers(self) -> bool:
        from kombu import Connection

        try:
            with Connection(self.url, connect_timeout=1) as conn:
                conn.ensure_connection(max_retries=0)
            return True
        except Exception:  # noqa: BLE001  not up (yet)
            return False

    def _signal(self, sig, timeout):
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self, timeout=60.0):
        """A clean shutdown (what systemd's stop sends): durable queues keep their persistent messages."""
        self._signal(signal.SIGTERM, timeout)

    def kill(self):
        """The node dies at once: only what it had written to disk survives."""
        self._signal(signal.SIGKILL, 10)

    def messages(self) -> int:
        """Messages ready or delivered and not acknowledged, in every queue of the default virtual host."""
        result = subprocess.run([RABBITMQ_BIN / "rabbitmqctl", "-n", self.node, "-q", "list_queues", "messages"],
                                env=self.env(), capture_output=True, text=True, timeout=60, check=True)
        return sum(int(line) for line in result.stdout.split() if line.isdigit())

    def wait_drained(self, timeout=60.0):
        wait_for(lambda: self.messages() == 0, timeout, interval=1.0, message=f"the queues of {self.node} to drain")

    def log_tail(self, chars=3000) -> str:
        path = self.dir / "server.out" if self.dir else None
        return path.read_text(errors="replace")[-chars:] if path and path.exists() else ""
