"""The run's log file (`run_dir/run.log`) that degrades instead of raising: when a line
cannot be written (a full disk, a vanished run dir) the handler says so once on stderr and
drops file lines until a write works again — never logging's "--- Logging error ---"
traceback on the terminal (the console handler still prints every line)."""

from __future__ import annotations

import logging
import sys

from ..display import printable


class Printable(logging.Filter):
    """A handler's filter: the message made terminal-safe (`display.printable`) — provider
    names, batch ids and API errors in it come from the API, and a log is read in a
    terminal (`tail -f`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        shown = printable(message, keep="\n\t")
        if shown is not message:
            record.msg, record.args = shown, ()
        return True


class RunLogFile(logging.FileHandler):
    def __init__(self, filename, encoding: str = "utf-8"):
        super().__init__(filename, encoding=encoding)
        self.failing: str | None = None  # why the last write failed (None: writing)
        self._error = False  # the current emit failed

    def emit(self, record: logging.LogRecord) -> None:
        self._error = False
        try:
            super().emit(record)  # StreamHandler.emit reports its errors to handleError
        except OSError as exc:  # opening the file again
            self._failed(exc)
            return
        if self.failing is not None and not self._error:
            self.failing = None
            try:
                sys.stderr.write(f"specgen: {self.baseFilename} takes log lines again\n")
            except (OSError, ValueError):
                pass

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            self._failed(exc)
        else:
            super().handleError(record)

    def _failed(self, exc: OSError) -> None:
        self._error = True
        why = exc.strerror or str(exc)
        if self.failing is None:
            try:
                sys.stderr.write(f"specgen: cannot write {self.baseFilename} ({why}): log lines "
                                 "go to the terminal only until it can\n")
            except (OSError, ValueError):
                pass
        self.failing = why
        try:  # a fresh stream next time: the old one may hold a failed partial write
            if self.stream is not None:
                self.stream.close()
        except OSError:
            pass
        self.stream = None  # FileHandler reopens it on the next emit

    def close(self) -> None:
        try:
            super().close()
        except OSError:
            pass
