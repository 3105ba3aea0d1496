#!/usr/bin/env python3
"""Fan-out for scripts/bench: N subscribers (Subscribe, more) to one account,
then KICKS times: log the account in, send ForceLogout, and time from sending
it until the last subscriber has read its kickedOffline event.
usage: fanout.py SOCKET N KICKS OUT.json"""
import json, selectors, socket, sys, time

from vutil import call

path, n, kicks, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
USER = "fanout"


ctl = socket.socket(socket.AF_UNIX)
ctl.connect(path)
ctl.settimeout(30)
sel = selectors.DefaultSelector()
subs = []
req = json.dumps({"method": "io.vaultd.Vault.Subscribe", "more": True,
                  "parameters": {"provider": "demo", "user": USER, "kinds": ["kickedOffline"]}}).encode() + b"\0"
for i in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(req)
    s.setblocking(False)
    subs.append(s)
    sel.register(s, selectors.EVENT_READ, i)
bufs = [b""] * n
# The ForceLogout caller's connection is watched too: its reply comes once the
# secret store is updated, which may be before or after the last event.
ctl_buf = b""
ctl_reply_at = None


def pump(deadline, want):
    """Reads until every subscriber has `want` complete replies more; returns the
    time the last one completed (or None on timeout)."""
    global ctl_buf, ctl_reply_at
    left = set(range(n))
    count = [0] * n
    last = None
    while left and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
            i = key.data
            if i == -1:
                ctl_buf += ctl.recv(65536)
                if ctl_buf.endswith(b"\0") and ctl_reply_at is None:
                    ctl_reply_at = time.perf_counter()
                continue
            try:
                data = key.fileobj.recv(65536)
            except BlockingIOError:
                continue
            if not data:
                left.discard(i)
                continue
            bufs[i] += data
            while b"\0" in bufs[i]:
                msg, bufs[i] = bufs[i].split(b"\0", 1)
                count[i] += 1
                if count[i] >= want and i in left:
                    left.discard(i)
                    last = time.perf_counter()
    return last if not left else None, len(left)


# The first reply of every subscriber is its snapshot: then all are subscribed.
_, missing = pump(time.monotonic() + 60, 1)
result = {"subscribers": n, "snapshot_missing": missing, "kicks_ms": [], "forcelogout_reply_ms": [], "errors": []}
for k in range(kicks):
    r = call(ctl, "io.vaultd.Vault.Login", {"provider": "demo", "user": USER, "token": f"tok_fanout_{k}_abcdefghijklmnopqrstu"})
    if "error" in r:
        result["errors"].append(str(r))
    time.sleep(0.2)
    ctl_buf, ctl_reply_at = b"", None
    sel.register(ctl, selectors.EVENT_READ, -1)
    t0 = time.perf_counter()
    ctl.sendall(json.dumps({"method": "io.vaultd.Vault.ForceLogout",
                            "parameters": {"provider": "demo", "user": USER, "reason": "admin"}}).encode() + b"\0")
    last, left = pump(time.monotonic() + 30, 1)
    sel.unregister(ctl)
    while not ctl_buf.endswith(b"\0"):
        ctl_buf += ctl.recv(65536)
    if ctl_reply_at is None:
        ctl_reply_at = time.perf_counter()
    if b'"error"' in ctl_buf:
        result["errors"].append(f"kick {k}: {ctl_buf[:200]!r}")
    result["forcelogout_reply_ms"].append((ctl_reply_at - t0) * 1000)
    if last is None:
        result["errors"].append(f"kick {k}: {left} subscribers without the event after 30 s")
    else:
        result["kicks_ms"].append((last - t0) * 1000)
    time.sleep(0.2)
for s in subs:
    s.close()
json.dump(result, open(out, "w"))
print(json.dumps(result))
