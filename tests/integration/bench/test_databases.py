"""The benchmark drops the peer databases it created (benchmarks.peers on a real PostgreSQL)."""

from types import SimpleNamespace

from django.conf import settings

from benchmarks.database import BenchDatabase
from benchmarks.peers import Peers


def test_the_peer_databases_the_bench_created_are_dropped_at_the_end(tmp_path):
    db = BenchDatabase("unused")
    name = f"{settings.DATABASES['default']['TEST']['NAME']}_peer"
    with db.admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    cfg = SimpleNamespace(peers=("naive_ln",), peers_src="peers-src", peers_dir=str(tmp_path / "peers"))
    peers = Peers(cfg, db, out_path=tmp_path / "run-peers.jsonl")
    peers.created = [name]  # as setup() records the ones it creates
    peers.drop_databases()
    with db.admin() as admin:
        assert not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    assert peers.created == []
