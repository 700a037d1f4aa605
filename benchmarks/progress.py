"""A progress display for long phases, on stderr (stdout is for the table).

On a terminal one line is rewritten in place; otherwise (logs, CI) a line is written every few
seconds, so a long run still shows that it is alive without flooding the log.
"""

import sys
import time


class Progress:
    def __init__(self, label, total=None, *, stream=None, quiet=False):
        self.label, self.total = label, total
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.started = self.last = time.monotonic()
        self.written = False
        self.shown = None  # the count last written

    def _line(self, done, extra):
        elapsed = time.monotonic() - self.started
        count = "" if done is None else (f"{done:,}/{self.total:,}" if self.total else f"{done:,}")
        return f"  {self.label}: {count} {extra} [{elapsed:.1f} s]".replace("  ]", " ]")

    def update(self, done=None, extra=""):
        if self.quiet:
            return
        now = time.monotonic()
        if now - self.last < (0.2 if self.tty else 10.0):
            return
        self.last = now
        if self.tty:
            self.stream.write("\r\033[K" + self._line(done, extra))
        else:
            self.stream.write(self._line(done, extra) + "\n")
        self.stream.flush()
        self.written, self.shown = True, done

    def finish(self, done=None, extra=""):
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\033[K" + self._line(done, extra) + "\n")
        elif (self.written and done != self.shown) or extra:
            self.stream.write(self._line(done, extra) + "\n")
        self.stream.flush()


def note(message, *, stream=None, quiet=False):
    """A one-line status message (phase starts, skipped paths)."""
    if not quiet:
        stream = stream or sys.stderr
        stream.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
        stream.flush()
