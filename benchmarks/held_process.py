"""A child process held ready: the line protocol between the bench and a process that sets itself up
and warms its path, says `ready` (a line on its standard output), waits for a line on its standard
input, then does what is measured and prints its result as one JSON line. The bench so starts
measuring only once the child is up and warm, and reads its result as it comes.

The child's side is say(), wait_for_go() and wait_for_stop(); the bench's, HeldProcess.
"""

import json
import os
import select
import subprocess
import sys
import time

from .database import BenchError

READY = "ready"
GO = b"go\n"
POLL = 0.25  # seconds between the bench's looks: it shares the cores with what it measures


# --- the child's side --------------------------------------------------------------------------------

def say(line: str):
    """A line on standard output, at once: the bench waits for it."""
    print(line)
    sys.stdout.flush()


def wait_for_go():
    """Say `ready`, then wait for the bench's line."""
    say(READY)
    sys.stdin.readline()


def wait_for_stop():
    """Wait until the bench closes the standard input (HeldProcess.stop()): a child whose CPU time
    the bench reads stays until the reading is done."""
    sys.stdin.read()


# --- the bench's side --------------------------------------------------------------------------------

class HeldProcess:
    """The child `args`, started with pipes to its standard input and output; its standard error goes
    to the file `log` (appended to), else to the bench's. `name` says which child in errors."""

    def __init__(self, args, *, env, cwd, name, log=None):
        self.name, self.log = name, log
        if log is None:
            self.process = subprocess.Popen(args, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        else:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as stderr:
                self.process = subprocess.Popen(args, env=env, cwd=cwd, stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE, stderr=stderr)
        self.buffer = b""

    def line(self, timeout, idle=None) -> str:
        """The next line the child prints, within `timeout` seconds (read from the pipe as it comes: a
        line may arrive with the next). `idle()` is called whenever nothing came for POLL seconds."""
        deadline = time.monotonic() + timeout
        fd = self.process.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name} said nothing within {timeout:.0f} s")
            if select.select([fd], [], [], min(POLL, left))[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self._exited(self.process.wait(10))
                self.buffer += chunk
            elif idle is not None:
                idle()
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode(errors="replace").strip()

    def wait_ready(self, timeout, idle=None):
        """Until the child says `ready`, within `timeout` seconds (what it prints before is passed over)."""
        deadline = time.monotonic() + timeout
        while self.line(deadline - time.monotonic(), idle) != READY:
            pass

    def go(self):
        self.process.stdin.write(GO)
        self.process.stdin.flush()

    def end_input(self):
        """Close the child's standard input: a child that runs until it ends stops, then prints its result."""
        try:
            self.process.stdin.close()
        except OSError:
            pass

    def result(self, timeout, idle=None) -> dict:
        """The child's result: its next line, as JSON."""
        return json.loads(self.line(timeout, idle))

    def check(self):
        """Raise if the child has exited."""
        if self.process.poll() is not None:
            self._exited(self.process.returncode)

    def stop(self):
        """Close its pipes (a held child exits at the end of its standard input) and wait for it to
        exit; kill it if it does not within 30 s."""
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def _exited(self, code):
        where = "" if self.log is None else f" (its log: {self.log.name})"
        raise BenchError(f"{self.name} exited with {code}{where}")
