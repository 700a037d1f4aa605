"""Reliability scenarios: the system under test in processes of its own, faults injected, an oracle
outside it that checks at-least-once, no early start, cancel and duplicate guarantees.

- clusters.py: throwaway PostgreSQL and Redis servers (own ports and temp dirs) for the system under test
- oracle.py: what was scheduled/cancelled/run, recorded outside the system, and check() -> Report
- system.py: the system's processes (workers, dispatchers, scan loops) and waits on their progress
- conftest.py: fixtures (oracle database, throwaway servers, a running system)
- settings.py: Django settings of the system's child processes

Run them with `pytest -m reliability tests/reliability`.
"""
