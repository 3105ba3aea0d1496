#!/usr/bin/env python3
"""Helpers for scripts/bench that speak vaultd's Varlink protocol.

  vutil.py login SOCKET PREFIX START COUNT OUT.json
      logs in demo/PREFIX{START..START+COUNT-1} through one connection, one
      request at a time; writes the milliseconds of every Login to OUT.json.
  vutil.py startup VAULTD SOCKET CONFIG OUT.json [ROUNDS]
      starts vaultd ROUNDS times: milliseconds from exec to the 'ready' line,
      then VmRSS after 1 s idle; stops it again.
  vutil.py idle VAULTD SOCKET CONFIG COUNT SECONDS OUT.json
      starts vaultd --memory-store with CONFIG (an oauth2 provider 'bench'),
      logs in COUNT sessions with refresh tokens valid for a day (pipelined over
      a few connections), checks with ListSessions that every one has a
      refresh scheduled, then samples vaultd's CPU time over SECONDS idle and
      its RSS; stops it again.
"""
import json, os, signal, socket, subprocess, sys, threading, time


def call(sock, method, params, timeout=30.0):
    sock.settimeout(timeout)
    sock.sendall(json.dumps({"method": method, "parameters": params}).encode() + b"\0")
    buf = b""
    while not buf.endswith(b"\0"):
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("vaultd closed the connection")
        buf += chunk
    return json.loads(buf[:-1])


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def token(prefix, i):
    return f"tok_{prefix}{i:06d}_bench_token_value_abcdefghij"


def login(path, prefix, start, count, out):
    s = connect(path)
    times, errors = [], 0
    for i in range(start, start + count):
        t0 = time.perf_counter()
        r = call(s, "io.vaultd.Vault.Login", {"provider": "demo", "user": f"{prefix}{i}", "token": token(prefix, i)})
        times.append((time.perf_counter() - t0) * 1000)
        if "error" in r:
            errors += 1
            if errors <= 3:
                print(f"login {prefix}{i}: {r}", file=sys.stderr)
    s.close()
    json.dump({"ms": times, "errors": errors}, open(out, "w"))


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def stop(p, seconds):
    """SIGTERM, then SIGKILL if `p` has not exited within `seconds`."""
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(seconds)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def startup(vaultd, path, config, out, rounds=3):
    res = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        p = subprocess.Popen([vaultd, "--socket", path, "--config", config],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
        ready = None
        deadline = time.monotonic() + 120
        os.set_blocking(p.stderr.fileno(), True)
        while time.monotonic() < deadline:
            line = p.stderr.readline()
            if not line:
                break
            if b"ready" in line:
                ready = (time.perf_counter() - t0) * 1000
                break
        time.sleep(1.0)
        rss = rss_kb(p.pid) if p.poll() is None else 0
        stop(p, 10)
        res.append({"ready_ms": ready, "rss_kb": rss})
    json.dump(res, open(out, "w"))


def cpu_ticks(pid):
    """utime+stime of the whole process, in clock ticks (/proc/PID/stat fields 14, 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def run_ns_and_switches(pid):
    """CPU time in ns (schedstat) and context switches, summed over every thread."""
    ns = switches = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns += int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        switches += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended between the listing and the read
    return ns, switches


def recv_replies(sock, n, buf):
    """Reads n NUL-terminated replies; returns (replies, leftover bytes)."""
    out = []
    while len(out) < n:
        end = buf.find(b"\0")
        if end < 0:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise RuntimeError("vaultd closed the connection")
            buf += chunk
            continue
        out.append(buf[:end])
        buf = buf[end + 1:]
    return out, buf


def login_scheduled(path, count, connections=4, window=256, deadline_s=600):
    """Logs in bench/i{0..count-1}, each with a refresh token and a day's
    lifetime, over several connections, each keeping up to `window` Logins
    in flight (a reader thread per connection takes the replies, so neither
    side blocks the other). Returns (seconds, errors, first errors)."""
    errors, samples = [0], []
    lock = threading.Lock()
    failures = []

    def reader(s, n, slots):
        buf = b""
        try:
            for _ in range(n):
                replies, buf = recv_replies(s, 1, buf)
                slots.release()
                if b'"error"' in replies[0]:
                    with lock:
                        errors[0] += 1
                        if len(samples) < 3:
                            samples.append(replies[0].decode()[:200])
        except Exception as e:  # reported by the caller
            failures.append(f"reader: {e}")
            for _ in range(window):
                slots.release()

    def worker(k):
        s = connect(path)
        s.settimeout(120)
        ids = range(k, count, connections)
        slots = threading.Semaphore(window)
        r = threading.Thread(target=reader, args=(s, len(ids), slots))
        r.start()
        deadline = time.monotonic() + deadline_s
        for i in ids:
            if failures or time.monotonic() > deadline:
                failures.append("logging in took too long" if not failures else "")
                break
            slots.acquire()
            s.sendall(json.dumps({"method": "io.vaultd.Vault.Login", "parameters": {
                "provider": "bench", "user": f"i{i}", "tokenResponse": {
                    "access_token": token("a", i), "refresh_token": token("r", i),
                    "token_type": "Bearer", "expires_in": 86400}}}).encode() + b"\0")
        r.join(deadline_s)
        s.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError("; ".join(f for f in failures if f))
    return time.perf_counter() - t0, errors[0], samples


def idle(vaultd, path, config, count, seconds, out):
    log_path = out + ".vaultd.log"
    log = open(log_path, "wb")
    p = subprocess.Popen([vaultd, "--memory-store", "--socket", path, "--config", config],
                         stderr=log, stdout=subprocess.DEVNULL)
    res = {"sessions": count, "seconds": seconds, "store": "memory"}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None:
            if b"ready" in open(log_path, "rb").read():
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("vaultd did not become ready: " + open(log_path, "rb").read().decode()[-300:])
        time.sleep(1.0)
        res["rss_empty_kb"] = rss_kb(p.pid)
        secs, errors, samples = login_scheduled(path, count)
        res.update(login_s=secs, login_per_s=count / secs if secs else None, login_errors=errors)
        if samples:
            res["login_error_samples"] = samples
        print(f"logged in {count:,} sessions in {secs:.1f} s ({count / secs:,.0f}/s), {errors} errors",
              file=sys.stderr)
        time.sleep(2.0)
        res["rss_kb"] = rss_kb(p.pid)
        # Every session has its refresh scheduled: ListSessions shows refreshAt.
        s = connect(path)
        sessions, params = [], {"limit": 1000}
        while True:  # ListSessions answers a page at a time; follow next
            r = call(s, "io.vaultd.Vault.ListSessions", params, timeout=300)
            sessions += r.get("parameters", {}).get("sessions", [])
            if not r.get("parameters", {}).get("next"):
                break
            params = {"limit": 1000, "after": r["parameters"]["next"]}
        s.close()
        now = time.time()
        res["listed"] = len(sessions)
        res["scheduled"] = sum(1 for x in sessions if x.get("provider") == "bench" and x.get("refreshAt")
                               and x["refreshAt"] > now + 3600)
        res["next_refresh_in_s"] = min((x["refreshAt"] for x in sessions if x.get("refreshAt")), default=now) - now
        del sessions, r
        print(f"ListSessions: {res['listed']:,} sessions, {res['scheduled']:,} with a refresh scheduled "
              f"(the nearest in {res['next_refresh_in_s'] / 3600:.1f} h)", file=sys.stderr)
        time.sleep(3.0)  # let the listing's buffers go before measuring
        hz = os.sysconf("SC_CLK_TCK")
        t0, c0, (n0, w0) = time.monotonic(), cpu_ticks(p.pid), run_ns_and_switches(p.pid)
        time.sleep(seconds)
        t1, c1, (n1, w1) = time.monotonic(), cpu_ticks(p.pid), run_ns_and_switches(p.pid)
        wall = t1 - t0
        res.update(
            idle_wall_s=wall,
            idle_cpu_ticks=c1 - c0,
            idle_cpu_pct=100.0 * (c1 - c0) / hz / wall,
            idle_cpu_pct_schedstat=100.0 * (n1 - n0) / 1e9 / wall,
            idle_wakeups_per_s=(w1 - w0) / wall,
            rss_end_kb=rss_kb(p.pid),
            threads=len(os.listdir(f"/proc/{p.pid}/task")),
        )
        res["rss_per_session_bytes"] = (res["rss_kb"] - res["rss_empty_kb"]) * 1024 / count if count else None
        text = open(log_path, "rb").read().decode(errors="replace")
        res["refreshes_logged"] = text.count("token refreshed") + text.count("refresh failed")
        print(f"idle {wall:.1f} s: {res['idle_cpu_pct']:.3f}% of a core "
              f"(schedstat {res['idle_cpu_pct_schedstat']:.3f}%), {res['idle_wakeups_per_s']:.1f} context switches/s; "
              f"RSS {res['rss_kb'] / 1024:.1f} MB, {res['rss_per_session_bytes']:.0f} B per session",
              file=sys.stderr)
    finally:
        stop(p, 30)
        log.close()
    json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "login":
        login(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    elif cmd == "startup":
        startup(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]) if len(sys.argv) > 6 else 3)
    elif cmd == "idle":
        idle(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]), sys.argv[7])
