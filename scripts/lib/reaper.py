#!/usr/bin/python3
"""Runs a command, then ends every process it left behind.

scripts/test runs each step through this. A test's children (vaultd, token
servers, etcd) are each in a process group of their own (Foundation's Process
puts them there), so killing the step's group does not reach them, and when a
test process crashes they outlive it. As a child subreaper (prctl
PR_SET_CHILD_SUBREAPER) this process becomes the parent of every orphan below
it, whatever its group or session, and kills them all when the command ends.
Exits with the command's status.
"""

import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def children(me):
    """The pids whose parent is `me`, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found.append(int(name))
    return found


def end_the_rest():
    """Kills what is left below this process, round by round: a killed
    process's own children come here next. Returns how many were killed."""
    me = os.getpid()
    killed = 0
    for _ in range(1000):
        left = children(me)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        for pid in left:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    return killed


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: reaper.py COMMAND [ARG...]")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit(f"reaper.py: prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")
    command = os.fork()
    if command == 0:
        # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays
        # ignored across exec: the command gets the defaults a shell gives
        # (`man | grep -q` failed the package's checks without this).
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        try:
            os.execvp(sys.argv[1], sys.argv[1:])
        except OSError as error:
            print(f"reaper.py: cannot run {sys.argv[1]}: {error}", file=sys.stderr)
            os._exit(127)
    # Passed on, so that the command can end its work in order.
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, lambda received, _frame: os.kill(command, received))
    status = 0
    while True:
        try:
            pid, raw = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == command:
            status = os.waitstatus_to_exitcode(raw)
            status = 128 - status if status < 0 else status
            break
    killed = end_the_rest()
    if killed:
        print(f"reaper.py: ended {killed} process(es) the step left running", file=sys.stderr)
    sys.exit(status)


if __name__ == "__main__":
    main()
