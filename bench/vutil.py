#!/usr/bin/env python3
"""Helpers for scripts/bench that speak vaultd's Varlink protocol.

  vutil.py login SOCKET PREFIX START COUNT OUT.json
      logs in demo/PREFIX{START..START+COUNT-1} through one connection, one
      request at a time; writes the milliseconds of every Login to OUT.json.
  vutil.py startup VAULTD SOCKET CONFIG OUT.json [ROUNDS]
      starts vaultd ROUNDS times: milliseconds from exec to the 'ready' line,
      then VmRSS after 1 s idle; stops it again.
"""
import json, os, signal, socket, subprocess, sys, time


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
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        res.append({"ready_ms": ready, "rss_kb": rss})
    json.dump(res, open(out, "w"))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "login":
        login(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    elif cmd == "startup":
        startup(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]) if len(sys.argv) > 6 else 3)
