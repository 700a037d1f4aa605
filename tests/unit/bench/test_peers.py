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


def test_the_django_tasks_peer_runs_the_bench_workload_and_its_results_pair_with_that_scenario_only(tmp_path):
    """tasks_spread runs the django_tasks script itself with the bench's window and lead (the
    harness's driver passes neither), and its records are named after the bench's scenario, so
    they never pair with the spread scenario's runs."""
    import sys

    from benchmarks.peers import peer_scenario

    (tmp_path / "pb_djt.py").write_text(
        "import json, os, sys\n"
        "with open(os.environ['PB_JSONL'], 'a') as f:\n"
        "    record = {'system': 'django_tasks', 'scenario': 'spread_n2000', 'argv': sys.argv[1:]}\n"
        "    f.write(json.dumps(record) + '\\n')\n")
    cfg = SimpleNamespace(peers=("django_tasks",), peers_src="", peers_dir=str(tmp_path), n_tasks_spread=2000,
                          window=10.0, lead=5.0, peers_redis_url="redis://127.0.0.1:6379/15")
    db = SimpleNamespace(base={"HOST": "127.0.0.1", "USER": "postgres"})
    peers = Peers(cfg, db=db, out_path=tmp_path / "out" / "run-peers.jsonl")
    peers.out.parent.mkdir()
    peers.python, peers.ready = sys.executable, True

    [record] = peers.run("tasks_spread", rep=1)

    assert record["argv"] == ["spread", "--n", "2000", "--window", "10.0", "--lead", "5.0"]
    assert (record["scenario"], record["peer_scenario"], record["bench_rep"]) == ("tasks_spread", "spread_n2000", 1)
    assert peer_scenario(record) == "tasks_spread"
