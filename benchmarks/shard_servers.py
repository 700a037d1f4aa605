"""The shard databases of the shards_* scenarios, and the CPU time of the processes that use them.

A ShardSet is `count` databases with timeouts' tables, either all on the bench's own server (the
bench database and siblings named after it) or each on a throwaway cluster of its own (initdb in a
temp dir, on a free port; needs root and PostgreSQL's binaries, as the reliability tests do). A run
with k shards uses the first k. Child processes get them through the demo project's settings:
DATABASE_URL is the first (their "default", where the handlers record their starts) and
TIMEOUTS_SHARD_URLS the others. The bench itself reaches each through a Django alias of its own
(for the ORM API) and a psycopg connection (for counts and statistics).

The clusters copy the bench server's durability and memory settings, so that "one server" and
"separate clusters" differ only in where the databases are.
"""

import copy
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from urllib.parse import quote

import psycopg
from django.db import connections

from .database import BenchError, reset
from .handlers import START_TABLE_SQL

WHERE = ("server", "clusters")
# Settings a throwaway cluster takes from the bench's server (the rest are initdb's defaults, as on
# a fresh server); fsync above all: a throwaway cluster turns it off unless told otherwise.
MIRRORED = ("fsync", "synchronous_commit", "full_page_writes", "wal_level", "shared_buffers", "wal_buffers",
            "max_wal_size", "checkpoint_timeout", "work_mem", "max_connections")
OWN_APPLICATION = "timeouts_bench"  # the bench's own sessions, left out of the CPU of the measured ones


@dataclass
class Shard:
    params: dict  # psycopg connection parameters
    cluster: object = None  # the ThrowawayPostgres, for the clusters

    @property
    def url(self) -> str:
        p = self.params
        auth = quote(p.get("user", "postgres"), safe="")
        if p.get("password"):
            auth += ":" + quote(p["password"], safe="")
        return f"postgres://{auth}@{p.get('host', '127.0.0.1')}:{p.get('port', 5432)}/{p['dbname']}"


def throwaway_postgres():
    """The throwaway cluster class, once the machine is known to run one."""
    from .clusters import ThrowawayPostgres, postgres_available

    if not postgres_available():
        raise BenchError("separate clusters need root (PostgreSQL runs as the postgres user) and PostgreSQL's "
                         "binaries (TIMEOUTS_PG_BIN, default /usr/lib/postgresql/15/bin)")
    return ThrowawayPostgres


class ShardSet:
    def __init__(self, ctx, count, where):
        if where not in WHERE:
            raise ValueError(f"where: one of {WHERE}, not {where!r}")
        self.ctx, self.count, self.where = ctx, count, where
        self.shards: list[Shard] = []
        self.conns: list[psycopg.Connection] = []
        self._stack = ExitStack()

    def __enter__(self):
        try:
            self._create()
            for i, shard in enumerate(self.shards):
                self.conns.append(_connect(shard.params))
                self.conns[i].execute(START_TABLE_SQL)
                connections.settings[self.alias(i)] = self._django_settings(shard.params)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info):
        for i in range(len(self.shards)):
            _close_alias(self.alias(i))
        for conn in self.conns:
            conn.close()
        self._stack.close()  # the clusters
        if self.where == "server":
            with self.ctx.db.admin() as admin:
                for name in self._sibling_names():
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    # -- creating the databases -----------------------------------------------------------------

    def _create(self):
        if self.where == "server":
            self.shards.append(Shard(self.ctx.db.params()))
            names = self._sibling_names()
            with self.ctx.db.admin() as admin:
                for i, name in enumerate(names):
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    # The first is migrated; the others are copies of it (much quicker).
                    template = f' TEMPLATE "{names[0]}"' if i else ""
                    admin.execute(f'CREATE DATABASE "{name}"{template}')
                    shard = Shard(self.ctx.db.params(name))
                    if not i:
                        self._migrate([shard])
                    self.shards.append(shard)
            return
        cluster_class = throwaway_postgres()
        options = tuple(arg for name, value in self._mirrored() for arg in ("-c", f"{name}={value}"))
        for _ in range(self.count):
            cluster = self._stack.enter_context(cluster_class(migrate_schema=False, settings=options))
            self.shards.append(Shard({"dbname": cluster.database, "host": "127.0.0.1", "port": cluster.port,
                                      "user": "postgres"}, cluster))
        self._migrate(self.shards)

    def _sibling_names(self):
        return [f"{self.ctx.db.name}_shard{i}" for i in range(1, self.count)]

    def _mirrored(self):
        return [(name, self.ctx.conn.execute(f"SHOW {name}").fetchone()[0]) for name in MIRRORED]

    def _migrate(self, shards):
        """`migrate` as deployed, in child processes at once (one per database)."""
        children = [subprocess.Popen([sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
                                     env={**self.ctx.env, "DATABASE_URL": shard.url}, cwd=self.ctx.cwd,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                    for shard in shards]
        for shard, child in zip(shards, children, strict=True):
            output, _ = child.communicate(timeout=300)
            if child.returncode != 0:
                raise BenchError(f"migrating {shard.url} failed:\n{output[-2000:]}")

    def _django_settings(self, params) -> dict:
        base = copy.deepcopy(self.ctx.db.base)
        options = {**base.get("OPTIONS", {}), "application_name": OWN_APPLICATION}
        return {**base, "NAME": params["dbname"], "HOST": params.get("host", base.get("HOST")),
                "PORT": params.get("port", base.get("PORT")), "USER": params.get("user", base.get("USER")),
                "PASSWORD": params.get("password", base.get("PASSWORD")), "OPTIONS": options}

    # -- using them -----------------------------------------------------------------------------

    def alias(self, i) -> str:
        """The bench process's Django alias of shard i."""
        return f"timeouts_bench_shard{i}"

    def env(self, k, **extra) -> dict:
        """The environment of a child process that serves the first k shards."""
        urls = ",".join(f"shard{i}={self.shards[i].url}" for i in range(1, k))
        env = {**self.ctx.env, "DATABASE_URL": self.shards[0].url, **{key: str(v) for key, v in extra.items()}}
        if urls:
            env["TIMEOUTS_SHARD_URLS"] = urls
        else:
            env.pop("TIMEOUTS_SHARD_URLS", None)
        return env

    def reset(self, k):
        for conn in self.conns[:k]:
            reset(conn)

    def stop(self, i):
        """Stop shard i's cluster (a clean, fast shutdown: its clients are disconnected). The bench's
        Django connection to it is closed, and opens again when next used."""
        _close_alias(self.alias(i), remove=False)
        self.conns[i].close()
        self.shards[i].cluster.stop("fast")

    def start(self, i):
        self.shards[i].cluster.start()
        self.conns[i] = _connect(self.shards[i].params)

    def own_pids(self) -> set:
        """The server processes of the bench's own sessions on the shards."""
        pids = {conn.info.backend_pid for conn in self.conns if not conn.closed}
        for alias in (self.ctx.alias, *(self.alias(i) for i in range(len(self.shards)))):
            wrapper = connections[alias] if alias in connections.settings else None
            if wrapper is not None and wrapper.connection is not None and not wrapper.connection.closed:
                pids.add(wrapper.connection.info.backend_pid)
        if not self.ctx.conn.closed:
            pids.add(self.ctx.conn.info.backend_pid)
        return pids

    def backend_pids(self, k) -> list[int]:
        """The server processes of every other session on the first k shard databases: those of the
        measured processes (nothing else connects to them)."""
        own, pids = self.own_pids(), []
        for conn in self.conns[:k]:
            if conn.closed:
                continue
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                "AND backend_type = 'client backend'").fetchall()
            pids += [pid for (pid,) in rows if pid not in own]
        return pids

    def listening(self, k) -> bool:
        """Whether a dispatcher listens on each of the first k shards."""
        from timeouts.dispatch.listener import APPLICATION_NAME

        query = ("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                 "AND datname = current_database()")
        return all(conn.execute(query, (APPLICATION_NAME,)).fetchone()[0] for conn in self.conns[:k])


def _connect(params) -> psycopg.Connection:
    return psycopg.connect(**params, autocommit=True, application_name=OWN_APPLICATION)


def _close_alias(alias, remove=True):
    if alias in connections.settings:
        try:
            connections[alias].close()
        except Exception:  # noqa: BLE001 -- a connection to a stopped server may fail to close
            pass
        if remove:
            del connections[alias]
            del connections.settings[alias]


# --- CPU time ------------------------------------------------------------------------------------

def tree(process) -> list[int]:
    """A child process and its descendants (a prefork worker's pool)."""
    import psutil

    try:
        root = psutil.Process(process.pid)
        return [root.pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


class CpuMeter:
    """CPU seconds (user + system) of groups of processes between start() and stop(). `groups` maps
    a name to a function that lists the group's PIDs now: the groups change (a connection opens, a
    pool process is replaced), so sample() looks again, and whatever is found later counts from its
    birth, or from when it was first seen if it is older than start()."""

    def __init__(self, groups):
        self.groups = groups
        self.started = None
        self.first, self.last = {}, {}

    def start(self):
        self.started = time.time()
        self.first, self.last = {}, {}
        self.sample()

    def sample(self):
        import psutil

        for name, pids in self.groups.items():
            for pid in pids():
                try:
                    process = psutil.Process(pid)
                    times = process.cpu_times()
                    born = process.create_time()
                except psutil.Error:
                    continue
                key = (name, pid, born)
                seconds = times.user + times.system
                if key not in self.first:
                    self.first[key] = 0.0 if born >= self.started else seconds
                self.last[key] = seconds

    def stop(self) -> dict:
        self.sample()
        out = dict.fromkeys(self.groups, 0.0)
        for key, seconds in self.last.items():
            out[key[0]] += seconds - self.first[key]
        return {name: round(seconds, 3) for name, seconds in out.items()}


def sampling(check, meter, every=0.5):
    """A `check` for the waits that also samples the meter, at most every `every` seconds."""
    last = [0.0]

    def both():
        check()
        if time.monotonic() - last[0] >= every:
            last[0] = time.monotonic()
            meter.sample()

    return both

