"""The process exit codes of every command: a contract scripts rely on (docs/DESIGN.md, "Exit codes"). One
module so that no command, sink or screen spells a number of its own; it imports nothing, so the argument parser
and the core may both use it."""

from __future__ import annotations

import signal

EXIT_OK = 0  # no finding of severity error (also: --help, --dry-run, log-level done, a reader gone from the pipe)
EXIT_FINDINGS = 1  # at least one finding of severity error
# Usage or input error (one line on stderr), or a run that read nothing and found no error.
EXIT_USAGE = 2
EXIT_SIGNAL_BASE = 128  # ended by signal N: 128 + N, as a shell reports it


def by_signal(signum: int) -> int:
    """The exit code of a run ended by signal ``signum`` (SIGINT 130, SIGTERM 143, SIGHUP 129)."""
    return EXIT_SIGNAL_BASE + int(signum)


EXIT_INTERRUPTED = by_signal(signal.SIGINT)  # Ctrl-C outside a run's own handling: 130

# The codes as --help says them (its epilogs, re-wrapped to the terminal): here, beside the numbers, so that the
# help does not keep a copy that drifts from README's "Exit codes" and docs/DESIGN.md's.
EXIT_CODES_HELP = f"""\
exit codes: {EXIT_OK} no error finding, {EXIT_FINDINGS} at least one error finding, {EXIT_USAGE} usage or input
error (one line on stderr), or a run that read nothing and found no error (the report is printed; its problems
say why): a watch where no interface captured anything or every capture stream was lost, an analyze where no input held
anything to read (a pcap header alone, frames of no byte, a log with no line of Envoy's)
"""
