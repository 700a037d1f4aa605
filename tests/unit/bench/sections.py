"""What the unit tests of the bench's scenarios share: the report's sections of a scenario's
summary and ratios alone."""

from benchmarks import report
from benchmarks.config import BenchConfig


def sections(summary, ratios) -> list:
    """report.sections() of a result that holds only this summary and these ratios: no peers, no targets."""
    return report.sections({"summary": summary, "config": BenchConfig().public(), "ratios": ratios,
                            "peers_summary": {}, "targets": []})
