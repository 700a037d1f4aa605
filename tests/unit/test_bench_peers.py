"""Where the benchmark reads its peers' results (benchmarks.peers), without running any."""

from pathlib import Path
from types import SimpleNamespace

from benchmarks.peers import Peers


def test_peer_results_are_read_where_the_harness_writes_them_for_a_relative_json_path(monkeypatch, tmp_path):
    """The harness runs in its own directory: a relative --json must not send its results there, or
    the bench, reading next to its own JSON, finds none."""
    monkeypatch.chdir(tmp_path)
    cfg = SimpleNamespace(peers=("celery",), peers_src="peers-src", peers_dir="peers-dir")
    peers = Peers(cfg, db=None, out_path=Path("var/bench/run-peers.jsonl"))
    assert peers.out == tmp_path / "var" / "bench" / "run-peers.jsonl"
    assert peers.log == tmp_path / "var" / "bench" / "run-peers.log"
