"""Running the ``zephon`` command in tests: in this process (click's runner), and with
``sys.stderr`` on a pseudo-terminal (progress bars show only there)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``zephon ARGS`` run in this process, in ``cwd``; an unexpected exception fails."""
    from click.testing import CliRunner

    from zephon_core.cli.commands import cli as command

    old = Path.cwd()
    os.chdir(cwd)
    try:
        r = CliRunner().invoke(command, list(args))
    finally:
        os.chdir(old)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def terminal_output(run) -> str:
    """What ``run()`` writes to ``sys.stderr`` when that is a terminal: a pseudo-terminal
    of 24x100 (a zero-width one shows no bar), read by a thread while ``run`` writes."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    shown: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other side is closed
                return
            if not data:
                return
            shown.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with os.fdopen(slave, "w") as tty:
        saved, sys.stderr = sys.stderr, tty
        try:
            run()
        finally:
            sys.stderr = saved
    reader.join(timeout=600)  # a hang guard: it ends when the closed side is drained
    os.close(master)
    return b"".join(shown).decode()
