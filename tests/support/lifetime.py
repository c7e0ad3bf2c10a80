"""Processes a test starts end with the test process, even when it is killed.

A killed pytest (a loop stopped by hand, a CI job cancelled) runs no ``finally``, and
the workers and the chDB endpoint it had started lived on, retrying a broker that had
died with it (the broker watches the test's pid: ``scripts/kafka.sh --watch-pid``); two
such orphans ran through a whole benchmark session. Linux sends a child a signal of its
choice when its parent dies (``prctl(PR_SET_PDEATHSIG)``, kept across ``exec``);
util-linux's ``setpriv`` sets it and then runs the command, so the child is the command
itself (its pid is ``Popen.pid``) and nothing runs between fork and exec (a
``preexec_fn`` can deadlock a child forked beside other threads). A parent that dies
while ``setpriv`` starts, before it has set the signal, leaves that child untied (a
clean-clone CI met this window once, in this module's own test, which killed the
parent at once; the test now waits until the command runs).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence


def tied(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that it is killed (SIGKILL) when the thread that starts it ends:
    start it from the main thread, or one that outlives it. As it is where ``setpriv``
    is missing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return list(argv)
    return [setpriv, "--pdeathsig", "KILL", "--", *argv]
