"""Helpers for testing code that uses timeouts.

    from timeouts.testing import run_due

`run_due()` runs the due tasks in the calling process, inside the test's transaction
(in_process.py). `faults` arms fault points for the reliability tests.

The worker imports this package (for `faults`) before the runtime that run_due() drives has loaded,
so run_due is imported on first use.
"""

from typing import TYPE_CHECKING

__all__ = ["run_due"]

if TYPE_CHECKING:
    from timeouts.testing.in_process import run_due


def __getattr__(name):
    if name == "run_due":
        from timeouts.testing.in_process import run_due

        return run_due
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
