"""A forked child that never runs its parent's code again: what both sandboxes share (`_coreai`'s
worker that reads an `.aimodel`, `io`'s first run of a `.pt2` program).

A fork copies only the forking thread and all of the parent's state: its open files and sockets,
its Python signal handlers and event loop's wakeup descriptor, and objects whose finalizers would
flush or unlink the parent's files. The child closes or resets each of those before it does
anything, and leaves through `os._exit` only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import warnings

CAUGHT = frozenset(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP}


def fork() -> tuple[int, set[signal.Signals]]:
    """`os.fork` with every catchable signal held until the child has set itself up (a Ctrl-C at
    the fork must not raise in the child before it can leave): (pid, the mask to restore)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT)
    try:
        with warnings.catch_warnings():  # 3.12+: "multi-threaded, use of fork() may lead to
            warnings.simplefilter("ignore", DeprecationWarning)  # deadlocks": callers say why not
            pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return pid, held


def enter_child(mask: set[signal.Signals], log: int, *kept: int) -> None:
    """Make a just-forked child its own: the parent's objects never collected here, stdout and
    stderr into `log`, every descriptor but those and `kept` closed, default signal handlers,
    then the signal mask the parent had."""
    import gc

    gc.freeze()  # the parent's objects are never collected here (no finalizer, flush or unlink)
    os.dup2(log, 1)  # native code that prints lands in the log, never on the parent's stdout
    os.dup2(log, 2)
    close_all_but(0, 1, 2, *kept)
    default_signal_handlers()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def close_all_but(*kept: int) -> None:
    low = 0
    for fd in sorted(set(kept)):
        if fd > low:  # never an empty range: CPython 3.11 hears closerange(0, 0) as "close all"
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, max(low, os.sysconf("SC_OPEN_MAX")))


def default_signal_handlers() -> None:
    """The parent's Python signal handlers (and its event loop's wakeup fd) are not the child's."""
    with contextlib.suppress(ValueError):  # set from the main thread only (the child's one thread)
        signal.set_wakeup_fd(-1)
        for number in CAUGHT:
            handler = signal.getsignal(number)
            if callable(handler) and handler is not signal.default_int_handler:
                signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
