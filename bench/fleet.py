#!/usr/bin/env python3
"""The fleet step of scripts/bench (issue 17, part 7): three vaultd hosts
sharing their sessions through a three-member etcd on loopback, timed.

  fleet.py run VAULTD VAULTCTL ROOT WORK RESULTS_DIR [quick]
  fleet.py report RESULTS_DIR DOCS/BENCHMARKS.md

`run` starts everything in WORK (a scratch directory it removes at the end):
three etcd members (/usr/bin/etcd, ports of 127.0.0.1, the flags of
Tests/VaultIntegrationTests/EtcdFleet.swift), the test token server
(Tests/servers/token_server.py: refresh-token rotation, reuse detection), a
relay in front of it, and three vaultd (hosts A, B and C) with `Store=etcd`,
one data key in a `CREDENTIALS_DIRECTORY` for all three and sockets of their
own. It measures, and writes RESULTS_DIR/fleet.json:
  1. login propagation: a Login on A, then the time until B and C each serve
     its token (GetToken polled on a persistent connection per host, about
     every millisecond); the logout's the same way;
  2. kick propagation: `vaultctl kick` on A, the time until subscribers on B
     and C (Subscribe, kinds kickedOffline) get the event;
  3. refresh convergence: 20 `vaultctl refresh` per host, 60 at once (each
     process started beforehand, blocked on a pipe that is then written), the
     time until all three hosts serve the same new token; the token server's
     refresh requests, its successful rotations and the reuse it detected;
  4. failover with `LockTTL=3`: the token server answers 500 (the relay holds
     each 5xx answer for a while, so that the refresh is in flight with the
     lock held); a refresh on A; SIGKILL of A while its request waits; the
     server recovers; a refresh on B; the time from the kill to B (and C)
     serving a new token, and the reuse.
`report` writes the section "Fleet (issue 17)" of docs/BENCHMARKS.md between
its markers (bench/docsplice.py) and prints it. A benchmark, not a test: it
fails on nothing it measures; every wait is bounded in count and time.
Tokens are never printed or logged, and reach vaultctl only on stdin.

By hand: FLEET_PARTS="login kick refresh failover" (the default) picks the
measurements; FLEET_KEEP_WORK=1 keeps WORK (the hosts' and members' logs);
FLEET_REVOCATION=1 gives the provider the token server's /revoke as its
RevocationURL= (as a real deployment would have), to see what a revocation
of the tokens a refresh obtained does to the fleet.
"""
import base64, json, math, os, random, secrets, shutil, signal, socket, statistics, subprocess, sys, threading, time
import http.client
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from docsplice import replace_section  # noqa: E402

ETCD = "/usr/bin/etcd"
PROVIDER = "oauth"
CLIENT_ID = "vaultd-bench"
PREFIX = "/vaultd/"
BEGIN = "<!-- fleet: begin (scripts/bench --only fleet rewrites this section) -->"
END = "<!-- fleet: end -->"


def say(*args):
    print("fleet:", *args, file=sys.stderr, flush=True)


def now():
    return time.perf_counter()


def ms(seconds):
    return None if seconds is None else round(seconds * 1000, 2)


def pct(values, p):
    s = sorted(v for v in values if v is not None)
    if not s:
        return None
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


def summary(values):
    v = [x for x in values if x is not None]
    return {"n": len(v), "median": statistics.median(v) if v else None, "p95": pct(v, 95),
            "min": min(v) if v else None, "max": max(v) if v else None, "missing": len(values) - len(v)}


class Processes:
    """Every process this run starts, stopped by its pid at the end."""

    def __init__(self):
        self.all = []

    def add(self, p):
        self.all.append(p)
        return p

    def stop_all(self):
        for p in reversed(self.all):
            if p.poll() is None:
                try:
                    p.terminate()
                except OSError:
                    pass
        for p in reversed(self.all):
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    pass


def free_ports(count):
    """`count` distinct free TCP ports of 127.0.0.1 below the ephemeral range."""
    ports, start = [], random.randrange(10000)
    for i in range(10000):
        if len(ports) == count:
            break
        port = 20000 + (start + i) % 10000
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
            ports.append(port)
        except OSError:
            pass
        finally:
            s.close()
    if len(ports) != count:
        raise RuntimeError("no free ports")
    return ports


def http_json(method, url, body=None, timeout=5.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


def b64(s):
    return base64.b64encode(s.encode()).decode()


# MARK: etcd


class Etcd:
    """Three members on loopback, data in WORK/etcd."""

    def __init__(self, procs, work, size=3):
        self.dir = os.path.join(work, "etcd")
        os.makedirs(self.dir)
        ports = free_ports(2 * size)
        self.clients = [f"http://127.0.0.1:{ports[2 * i]}" for i in range(size)]
        peers = [f"http://127.0.0.1:{ports[2 * i + 1]}" for i in range(size)]
        cluster = ",".join(f"m{i}={peers[i]}" for i in range(size))
        token = "vaultd-bench-" + secrets.token_hex(4)
        for i in range(size):
            log = open(os.path.join(self.dir, f"m{i}.log"), "w")
            procs.add(subprocess.Popen(
                [ETCD, "--name", f"m{i}", "--data-dir", os.path.join(self.dir, f"m{i}"),
                 "--listen-client-urls", self.clients[i], "--advertise-client-urls", self.clients[i],
                 "--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
                 "--initial-cluster", cluster, "--initial-cluster-state", "new", "--initial-cluster-token", token,
                 "--heartbeat-interval", "100", "--election-timeout", "1000"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log))
            log.close()
        deadline = time.monotonic() + 60
        for url in self.clients:
            while True:
                try:
                    self.range(b64("health"), url=url)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"etcd member {url} did not serve within 60 s")
                    time.sleep(0.05)

    def range(self, key, range_end=None, url=None):
        body = {"key": key}
        if range_end:
            body["range_end"] = range_end
        return http_json("POST", (url or self.clients[0]) + "/v3/kv/range", body, timeout=2)

    def locks(self):
        """The refresh locks etcd holds now: [(key, lease id)]."""
        p = PREFIX + "locks/"
        end = p[:-1] + chr(ord(p[-1]) + 1)
        kvs = self.range(b64(p), b64(end)).get("kvs", [])
        return [(base64.b64decode(kv["key"]).decode(errors="replace"), kv.get("lease")) for kv in kvs]

    def lease_ttl(self, lease):
        try:
            return int(http_json("POST", self.clients[0] + "/v3/lease/timetolive", {"ID": lease}, timeout=2).get("TTL"))
        except (OSError, ValueError, TypeError):
            return None


# MARK: the token server and its relay


class TokenServer:
    """Tests/servers/token_server.py; its log read for the refresh grants it answered 200."""

    def __init__(self, procs, root):
        self.p = procs.add(subprocess.Popen(
            [sys.executable, os.path.join(root, "Tests/servers/token_server.py"), "--port", "0",
             "--lifetime", "3600", "--client-id", CLIENT_ID],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        line = self.p.stdout.readline().strip()
        if not line.startswith("LISTENING "):
            raise RuntimeError(f"token server did not start: {line!r}")
        self.url = line.split()[1]
        self.lock = threading.Lock()
        self.rotations = 0      # refresh grants answered 200 (each one rotates the refresh token)
        self.refresh_5xx = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stderr:
            if "POST /token" in line and "grant_type=refresh_token" in line:
                with self.lock:
                    if "-> 200" in line:
                        self.rotations += 1
                    elif "-> 5" in line:
                        self.refresh_5xx += 1

    def counts(self):
        with self.lock:
            return self.rotations, self.refresh_5xx

    def stats(self):
        return http_json("GET", self.url + "/control/stats")

    def mode(self, mode):
        http_json("POST", self.url + "/control/mode", {"mode": mode, "target": "token"})

    def grant(self):
        """A token response of a new grant (client credentials), as JSON text."""
        req = urllib.request.Request(self.url + "/token", data=f"grant_type=client_credentials&client_id={CLIENT_ID}".encode(),
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.read().decode()

    def accepts(self, token):
        req = urllib.request.Request(self.url + "/resource", headers={"Authorization": "Bearer " + token})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status == 200
        except urllib.error.HTTPError:
            return False


class Relay:
    """vaultd's token endpoint: forwards each request to the token server and
    its answer back, holding an answer of 500 and up for `hold_5xx` seconds
    (so that a failing refresh is in flight, with its lock held, while its
    host is killed). `failing` is set when such an answer is being held."""

    def __init__(self, upstream):
        host, port = upstream.split("//")[1].split(":")
        relay = self
        self.hold_5xx = 0.0
        self.failing = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")}
                    conn.request("POST", self.path, body=body, headers=headers)
                    r = conn.getresponse()
                    data, status, ctype = r.read(), r.status, r.getheader("Content-Type") or "application/json"
                finally:
                    conn.close()
                if status >= 500 and relay.hold_5xx > 0:
                    relay.failing.set()
                    time.sleep(relay.hold_5xx)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the host was killed meanwhile

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# MARK: vaultd hosts


# What the hosts' log lines are counted by (vaultd's messages).
LOG_PATTERNS = {
    "refreshed_here": "info: token refreshed ",
    "refreshed_elsewhere": "tokens refreshed on another host",
    "waited": "another host refreshes this session; waiting",
    "revoke_orphaned": "event=revokeOrphaned",
    "conflicted": "another host wrote this session while it was refreshed here",
    "warnings": "vaultd: warning:",
    "errors": "vaultd: error:",
}


def log_counts(hosts):
    out = {}
    for h in hosts:
        with h.counts_lock:
            out[h.name] = dict(h.counts)
    return out


def log_delta(before, after):
    return {n: {k: after[n][k] - before[n].get(k, 0) for k in after[n] if after[n][k] - before[n].get(k, 0)}
            for n in after}


class Host:
    """One vaultd of the fleet on its own socket; its stderr kept in a file."""

    def __init__(self, name, binary, work, key_dir, procs):
        self.name, self.binary, self.work, self.procs = name, binary, work, procs
        self.sock = os.path.join(work, f"vaultd-{name}.sock")
        self.env = dict(os.environ, CREDENTIALS_DIRECTORY=key_dir, VAULTD_STORE="etcd")
        self.p = None
        self.client = None
        self.ready_s = None
        # Lines of its log by what they say, counted as they arrive.
        self.counts = {k: 0 for k in LOG_PATTERNS}
        self.counts_lock = threading.Lock()

    def start(self, conf, deadline_s=60):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        log = open(os.path.join(self.work, f"vaultd-{self.name}.log"), "a")
        t0 = now()
        self.p = self.procs.add(subprocess.Popen(
            [self.binary, "--config", conf, "--socket", self.sock],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=self.env))
        ready = threading.Event()

        def read(p=self.p):
            for line in p.stderr:
                log.write(f"{now():.3f} {line}")
                log.flush()
                for k, pattern in LOG_PATTERNS.items():
                    if pattern in line:
                        with self.counts_lock:
                            self.counts[k] += 1
                if "ready" in line:
                    ready.set()
            log.close()
        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(deadline_s) or self.p.poll() is not None:
            raise RuntimeError(f"vaultd {self.name} did not become ready: {self.log_tail()}")
        self.ready_s = now() - t0
        self.client = Client(self.sock)

    def log_tail(self, n=5):
        try:
            return "".join(open(os.path.join(self.work, f"vaultd-{self.name}.log")).readlines()[-n:])
        except OSError:
            return ""

    def warnings(self):
        try:
            return [l for l in open(os.path.join(self.work, f"vaultd-{self.name}.log"))
                    if "warning" in l.lower() or "error" in l.lower()]
        except OSError:
            return []

    def stop(self, sig=signal.SIGTERM):
        if self.client:
            self.client.close()
            self.client = None
        if self.p and self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)


def import_client(root):
    sys.path.insert(0, os.path.join(root, "clients/python"))
    import vaultd_client
    return vaultd_client


vc = None  # clients/python/vaultd_client.py, imported by run()


class Client:
    """A persistent Varlink connection to one host (clients/python/vaultd_client.py)."""

    def __init__(self, sock):
        self.sock = sock
        self.c = vc.Client(sock, timeout=30)

    def close(self):
        try:
            self.c.close()
        except Exception:
            pass

    def token(self, user):
        """The token this host serves for `user`, None when it serves none."""
        try:
            return self.c.get_token(PROVIDER, user, wait_seconds=0).value
        except vc.NotLoggedIn:
            return None
        except vc.VaultdError as e:
            return "error:" + e.name
        except vc.VaultdClientError:
            # A broken connection (the host was killed or restarted): one new try.
            self.close()
            try:
                self.c = vc.Client(self.sock, timeout=30)
                return self.c.get_token(PROVIDER, user, wait_seconds=0).value
            except vc.NotLoggedIn:
                return None
            except vc.VaultdClientError:
                return "error:connection"


def poll_served(hosts, user, want=None, gone=False, not_token=None, deadline_s=15.0, interval=0.001):
    """Polls GetToken on each host until it serves `want` (or, with `gone`,
    serves nothing; with `not_token`, serves some other token); returns
    {host name: perf_counter time it first did} (None where it never did)."""
    first = {h.name: None for h in hosts}
    end = now() + deadline_s
    for _ in range(int(deadline_s / interval) + 1):
        for h in hosts:
            if first[h.name] is not None:
                continue
            t = h.client.token(user)
            if gone:
                ok = t is None
            elif not_token is not None:
                ok = t is not None and not t.startswith("error:") and t != not_token
            else:
                ok = t == want
            if ok:
                first[h.name] = now()
        if all(v is not None for v in first.values()) or now() > end:
            break
        time.sleep(interval)
    return first


def vaultctl(binary, sock, *args, timeout=60):
    t0 = now()
    r = subprocess.run([binary, "--socket", sock, *args], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=timeout)
    return r, now() - t0


def write_config(path, token_url, endpoints, lock_ttl):
    # FLEET_REVOCATION=1: with the provider's revocation endpoint, as a real
    # deployment (Salesforce's example) has it.
    revocation = f"RevocationURL={token_url}/revoke\n" if os.environ.get("FLEET_REVOCATION") == "1" else ""
    with open(path, "w") as f:
        f.write("[Vault]\nStore=etcd\nMinRefreshInterval=0\n\n"
                f"[Provider {PROVIDER}]\nType=oauth2\nTokenURL={token_url}/token\nClientID={CLIENT_ID}\n{revocation}\n"
                f"[Etcd]\nEndpoints={','.join(endpoints)}\nLockTTL={lock_ttl}\n")


# MARK: the measurements


def measure_login(hosts, server, n):
    a, others = hosts[0], hosts[1:]
    samples = []
    for i in range(n):
        user = f"login{i:03d}"
        grant = server.grant()
        want = json.loads(grant)["access_token"]
        t0 = now()
        a.client.c.login(PROVIDER, user, token_response=grant)
        t1 = now()
        served = poll_served(others, user, want=want)
        s = {"login_ms": ms(t1 - t0)}
        for h in others:
            s[h.name] = ms(served[h.name] - t1) if served[h.name] else None
            s[h.name + "_from_start"] = ms(served[h.name] - t0) if served[h.name] else None
        t2 = now()
        a.client.c.logout(PROVIDER, user)
        t3 = now()
        gone = poll_served(others, user, gone=True)
        s["logout_ms"] = ms(t3 - t2)
        for h in others:
            s["logout_" + h.name] = ms(gone[h.name] - t3) if gone[h.name] else None
        samples.append(s)
        time.sleep(0.05)
    return {"samples": samples}


class Subscriber:
    """A Subscribe stream (kinds kickedOffline) on one host, read by a thread
    that stamps each event when it arrives."""

    def __init__(self, host, kinds):
        self.stream = vc.Client(host.sock, timeout=30).subscribe(kinds=kinds)
        self.events, self.lock, self.stop = [], threading.Lock(), False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        end = time.monotonic() + 3600
        while not self.stop and time.monotonic() < end:
            try:
                e = self.stream.next_event(timeout=0.5)
            except vc.VaultdClientError:
                return
            if e is None:
                if self.stream.end is not None:
                    return
                continue
            with self.lock:
                self.events.append((now(), e.kind, e.user, e.reason))

    def wait(self, user, kind, deadline_s=10.0):
        end = now() + deadline_s
        while now() < end:
            with self.lock:
                for t, k, u, _ in self.events:
                    if u == user and k == kind:
                        return t
            time.sleep(0.001)
        return None

    def close(self):
        self.stop = True
        self.stream.close()
        self.thread.join(2)


def measure_kick(hosts, server, n, vaultctl_bin):
    a, others = hosts[0], hosts[1:]
    subs = {h.name: Subscriber(h, ["kickedOffline"]) for h in others}
    samples = []
    try:
        for i in range(n):
            user = f"kick{i:03d}"
            grant = server.grant()
            want = json.loads(grant)["access_token"]
            a.client.c.login(PROVIDER, user, token_response=grant)
            served = poll_served(others, user, want=want)
            if not all(served.values()):
                samples.append({"error": "the login did not reach every host"})
                continue
            time.sleep(0.02)
            t0 = now()
            r, took = vaultctl(vaultctl_bin, a.sock, "kick", PROVIDER, user, "--reason", "bench", timeout=30)
            t1 = t0 + took
            s = {"kick_cmd_ms": ms(took), "rc": r.returncode}
            if r.returncode != 0:
                s["error"] = r.stderr.strip()[:200]
            for h in others:
                t = subs[h.name].wait(user, "kickedOffline")
                s[h.name] = ms(t - t1) if t else None
                s[h.name + "_from_start"] = ms(t - t0) if t else None
            samples.append(s)
    finally:
        for sub in subs.values():
            sub.close()
    return {"samples": samples}


class Watcher:
    """Polls GetToken on every host about every `interval` s in a thread and
    keeps each change: (perf_counter time, host, token)."""

    def __init__(self, hosts, user, interval=0.002):
        self.hosts, self.user, self.interval = hosts, user, interval
        self.changes, self.last, self.stop = [], {}, False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        end = time.monotonic() + 300
        while not self.stop and time.monotonic() < end:
            for h in self.hosts:
                t = h.client.token(self.user)
                if self.last.get(h.name, "") != t:
                    self.last[h.name] = t
                    self.changes.append((now(), h.name, t))
            time.sleep(self.interval)

    def agreed(self):
        vals = [self.last.get(h.name) for h in self.hosts]
        return vals[0] if len(set(vals)) == 1 and vals[0] and not vals[0].startswith("error:") else None

    def close(self):
        self.stop = True
        self.thread.join(5)


def measure_refresh(hosts, server, rounds, per_host, vaultctl_bin):
    a = hosts[0]
    user = "refresh"
    grant = server.grant()
    a.client.c.login(PROVIDER, user, token_response=grant)
    served = poll_served(hosts[1:], user, want=json.loads(grant)["access_token"])
    if not all(served.values()):
        return {"error": "the login did not reach every host", "rounds": []}
    out = []
    for r in range(rounds):
        old = a.client.token(user)
        relogged = False
        if old is None or old.startswith("error:"):
            # The last round lost the session: logged in again, and said so.
            grant = server.grant()
            a.client.c.login(PROVIDER, user, token_response=grant)
            poll_served(hosts[1:], user, want=json.loads(grant)["access_token"])
            old, relogged = a.client.token(user), True
        stats0, (rot0, _), logs0 = server.stats(), server.counts(), log_counts(hosts)
        # Each refresh process waits for one line on its stdin, then execs vaultctl.
        procs = []
        for h in hosts:
            for _ in range(per_host):
                procs.append(subprocess.Popen(
                    ["/bin/sh", "-c", 'read _ && exec "$0" "$@"', vaultctl_bin, "--socket", h.sock,
                     "refresh", PROVIDER, user],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        time.sleep(0.3)  # every shell at its read
        watch = Watcher(hosts, user)
        t0 = now()
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        for p in procs:
            p.stdin.close()
            p.stdin = None  # communicate() would flush it
        rcs, errors, done = [], {}, {}

        def finish(i, p):
            try:
                _, err = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            done[i] = (now(), p.returncode, err)
        waiters = [threading.Thread(target=finish, args=(i, p), daemon=True) for i, p in enumerate(procs)]
        for w in waiters:
            w.start()
        for w in waiters:
            w.join(75)
        slowest = {}
        for i, (t, rc, err) in sorted(done.items()):
            rcs.append(rc)
            name = hosts[i // per_host].name
            slowest[name] = max(slowest.get(name, 0), t - t0)
            if rc != 0:
                line = (err.strip().splitlines() or ["(no message)"])[-1][:160]
                errors[line] = errors.get(line, 0) + 1
        slow = {hosts[i // per_host].name: 0 for i in done}
        for i, (t, _, _) in done.items():
            if t - t0 > 1.0:
                slow[hosts[i // per_host].name] += 1
        failed_on = {}
        for i, (_, rc, _) in done.items():
            if rc != 0:
                failed_on[hosts[i // per_host].name] = failed_on.get(hosts[i // per_host].name, 0) + 1
        t_cmds = now()
        # Settled: every host serves one token, other than the old one, for 300 ms.
        end, agreed_since, final = now() + 15, None, None
        while now() < end:
            ag = watch.agreed()
            if ag and ag != old:
                if final != ag:
                    final, agreed_since = ag, now()
                elif now() - agreed_since >= 0.3:
                    break
            else:
                final, agreed_since = None, None
            time.sleep(0.005)
        watch.close()
        time.sleep(0.1)  # the token server's log lines of the last answers
        stats1, (rot1, _), logs1 = server.stats(), server.counts(), log_counts(hosts)
        rec = {"round": r + 1, "logs": log_delta(logs0, logs1), "logged_in_again": relogged,
               "revoke_requests": stats1["revoke_requests"] - stats0["revoke_requests"], "commands": len(procs), "ok": sum(1 for c in rcs if c == 0), "errors": errors,
               "commands_done_ms": ms(t_cmds - t0),
               "slowest_command_ms": {n: ms(v) for n, v in sorted(slowest.items())},
               "commands_over_1s": slow, "failed_on": failed_on,
               "refresh_requests": stats1["refresh_requests"] - stats0["refresh_requests"],
               "rotations": rot1 - rot0,
               "reused": stats1["reused_refresh_tokens"] - stats0["reused_refresh_tokens"],
               "revoked_grants": stats1["revoked_grants"] - stats0["revoked_grants"],
               "converged": final is not None}
        if final:
            # When each host first served the token all of them ended with.
            firsts = {}
            for t, name, tok in watch.changes:
                if tok == final and name not in firsts:
                    firsts[name] = t
            rec["converged_ms"] = ms(max(firsts.values()) - t0) if len(firsts) == len(hosts) else None
            rec["per_host_ms"] = {n: ms(t - t0) for n, t in sorted(firsts.items())}
            new = {}
            for t, name, tok in watch.changes:
                if tok and tok != old and not tok.startswith("error:") and name not in new:
                    new[name] = t
            rec["first_new_ms"] = ms(max(new.values()) - t0) if len(new) == len(hosts) else None
            rec["distinct_tokens_seen"] = len({tok for _, _, tok in watch.changes if tok and tok != old})
            rec["final_accepted"] = server.accepts(final)
        else:
            rec["last_seen"] = {n: (None if t is None else ("old" if t == old else ("error" if t.startswith("error:") else "new")))
                                for n, t in watch.last.items()}
        out.append(rec)
        say(f"refresh round {r + 1}: converged {rec.get('converged_ms')} ms, {rec['refresh_requests']} refresh requests, "
            f"{rec['rotations']} rotations, {rec['reused']} reused, {rec['ok']}/{rec['commands']} commands ok, "
            f"slowest command per host {rec['slowest_command_ms']} ms, over 1 s {slow}")
        time.sleep(0.5)
    return {"rounds": out, "per_host": per_host}


def measure_failover(hosts, server, relay, etcd, rounds, vaultctl_bin, conf, lock_ttl):
    a, b, c = hosts
    user = "failover"
    out = []
    grant = server.grant()
    a.client.c.login(PROVIDER, user, token_response=grant)
    poll_served([b, c], user, want=json.loads(grant)["access_token"])
    relay.hold_5xx = 2.0
    for r in range(rounds):
        rec = {"round": r + 1}
        old = b.client.token(user)
        if old is None or old.startswith("error:"):
            # The session did not survive the last round: logged in again.
            grant = server.grant()
            a.client.c.login(PROVIDER, user, token_response=grant)
            poll_served([b, c], user, want=json.loads(grant)["access_token"])
            old = b.client.token(user)
            rec["logged_in_again"] = True
        stats0, (rot0, f0), logs0 = server.stats(), server.counts(), log_counts(hosts)
        relay.failing.clear()
        server.mode("error500")
        ra = subprocess.Popen([vaultctl_bin, "--socket", a.sock, "refresh", PROVIDER, user],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        failing = relay.failing.wait(10)
        locks = etcd.locks() if failing else []
        a.p.send_signal(signal.SIGKILL)
        t_kill = now()
        say(f"killed A at {t_kill:.3f}")
        a.p.wait(10)
        a.client.close()
        a.client = None
        try:
            ra.wait(10)
        except subprocess.TimeoutExpired:
            ra.kill()
            ra.wait()
        rec["killed_while_failing"] = failing
        rec["locks_at_kill"] = len(locks)
        if locks and locks[0][1]:
            rec["lease_ttl_left_s"] = etcd.lease_ttl(locks[0][1])
        server.mode("normal")
        t_recovered = now()
        tb0 = now()
        rb = subprocess.Popen([vaultctl_bin, "--socket", b.sock, "refresh", PROVIDER, user],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        served = poll_served([b, c], user, not_token=old, deadline_s=lock_ttl + 15, interval=0.002)
        try:
            _, err = rb.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            rb.kill()
            _, err = rb.communicate()
        rec["b_refresh_rc"] = rb.returncode
        if rb.returncode != 0:
            rec["b_refresh_error"] = (err.strip().splitlines() or [""])[-1][:200]
        rec["recovered_after_kill_ms"] = ms(t_recovered - t_kill)
        rec["b_ms"] = ms(served["B"] - t_kill) if served["B"] else None
        rec["c_ms"] = ms(served["C"] - t_kill) if served["C"] else None
        rec["b_from_refresh_ms"] = ms(served["B"] - tb0) if served["B"] else None
        time.sleep(0.2)
        stats1, (rot1, f1), logs1 = server.stats(), server.counts(), log_counts(hosts)
        rec["logs"] = log_delta(logs0, logs1)
        rec["refresh_requests"] = stats1["refresh_requests"] - stats0["refresh_requests"]
        rec["rotations"] = rot1 - rot0
        rec["answered_5xx"] = f1 - f0
        rec["reused"] = stats1["reused_refresh_tokens"] - stats0["reused_refresh_tokens"]
        new = b.client.token(user)
        rec["survived"] = bool(new and not new.startswith("error:") and new != old and server.accepts(new))
        # Host A again: it restores the sessions from etcd.
        t = now()
        a.start(conf)
        back = poll_served([a], user, want=new, deadline_s=15)
        rec["a_restart_serves_ms"] = ms(back["A"] - t) if back["A"] else None
        out.append(rec)
        say(f"failover round {r + 1}: lock held at kill {rec['locks_at_kill']}, B serves a new token "
            f"{rec['b_ms']} ms after the kill, {rec['refresh_requests']} refresh requests "
            f"({rec['answered_5xx']} answered 500), {rec['reused']} reused, survived {rec['survived']}")
        time.sleep(0.5)
    relay.hold_5xx = 0.0
    return {"rounds": out, "lock_ttl": lock_ttl, "hold_5xx_s": 2.0}


def machine():
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": model, "kernel": " ".join(os.uname()[2:5:2]),
            "etcd": subprocess.run([ETCD, "--version"], capture_output=True, text=True).stdout.splitlines()[0]}


def run(vaultd, vaultctl_bin, root, work, results, quick):
    global vc
    vc = import_client(root)
    n, rounds, fo_rounds = (8, 3, 2) if quick else (25, 10, 5)
    started = time.time()
    os.makedirs(work, exist_ok=True)
    procs = Processes()
    relay = None
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "quick": quick, "machine": machine(),
           "load_start": open("/proc/loadavg").read().split()[:3], "commit": subprocess.run(
               ["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()}
    try:
        say("starting three etcd members")
        etcd = Etcd(procs, work)
        server = TokenServer(procs, root)
        relay = Relay(server.url)
        key_dir = os.path.join(work, "credentials")
        os.makedirs(key_dir, mode=0o700)
        fd = os.open(os.path.join(key_dir, "data-key"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, secrets.token_bytes(32))
        os.close(fd)
        conf = os.path.join(work, "vaultd.conf")
        write_config(conf, relay.url, etcd.clients, 10)
        hosts = [Host(name, vaultd, work, key_dir, procs) for name in ("A", "B", "C")]
        for h in hosts:
            h.start(conf)
        res["ready_ms"] = {h.name: ms(h.ready_s) for h in hosts}
        say(f"hosts ready: {res['ready_ms']}")

        parts = os.environ.get("FLEET_PARTS", "login kick refresh failover").split()
        if "login" in parts:
            say(f"1. login propagation ({n} logins on A)")
            res["login"] = measure_login(hosts, server, n)
        if "kick" in parts:
            say(f"2. kick propagation ({n} kicks on A)")
            res["kick"] = measure_kick(hosts, server, n, vaultctl_bin)
        if "refresh" in parts:
            say(f"3. refresh convergence ({rounds} rounds, 3 hosts x 20 refreshes)")
            res["refresh"] = measure_refresh(hosts, server, rounds, 20, vaultctl_bin)
        if "failover" in parts:
            say(f"4. failover ({fo_rounds} rounds, LockTTL=3)")
            conf3 = os.path.join(work, "vaultd-ttl3.conf")
            write_config(conf3, relay.url, etcd.clients, 3)
            for h in hosts:
                h.stop()
            for h in hosts:
                h.start(conf3)
            res["failover"] = measure_failover(hosts, server, relay, etcd, fo_rounds, vaultctl_bin, conf3, 3)
        res["final_stats"] = {k: v for k, v in server.stats().items() if k != "revocations"}
        res["host_warnings"] = {h.name: [l.strip()[:300] for l in h.warnings()][-20:] for h in hosts}
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
        say("failed:", res["error"])
    finally:
        if relay:
            relay.close()
        procs.stop_all()
        res["load_end"] = open("/proc/loadavg").read().split()[:3]
        res["duration_s"] = round(time.time() - started, 1)
        os.makedirs(results, exist_ok=True)
        with open(os.path.join(results, "fleet.json"), "w") as f:
            json.dump(res, f, indent=1)
        if os.environ.get("FLEET_KEEP_WORK") != "1":
            shutil.rmtree(work, ignore_errors=True)
    return 0 if "error" not in res else 1


# MARK: the report


def cell(s):
    if not s or s["median"] is None:
        return "–"
    miss = f", {s['missing']} never" if s["missing"] else ""
    return f"{s['median']:.1f} / {s['p95']:.1f} / {s['max']:.1f}{miss}"


# Hand-written notes to print under the figures (none: the history of the
# faults the runs found is in git).
NOTES = ""


def section(rd):
    head = [BEGIN, "## Fleet (issue 17)", ""]
    try:
        d = json.load(open(os.path.join(rd, "fleet.json")))
    except (OSError, ValueError):
        return "\n".join(head + ["Not measured in this run (`scripts/bench --only fleet`).", "", END])
    m = d.get("machine", {})
    lines = [f"Measured {d['date']} at vaultd {d.get('commit', '')}, {m.get('nproc')} CPUs ({m.get('cpu', '')}), "
             f"**shared with other work**: load average {' '.join(d.get('load_start', []))} at the start and "
             f"{' '.join(d.get('load_end', []))} at the end (1, 5, 15 min); the run took {d.get('duration_s', 0):.0f} s"
             + (" (quick mode: fewer samples)." if d.get("quick") else "."),
             "",
             f"Everything on loopback on this one machine: three etcd members ({m.get('etcd', 'etcd')}, "
             "`--heartbeat-interval 100 --election-timeout 1000`, data in a temporary directory), three release "
             "vaultd (hosts A, B, C: `Store=etcd`, `MinRefreshInterval=0`, one `data-key` credential for all three), "
             "the test token server (`Tests/servers/token_server.py`: refresh-token rotation, reuse detection; access "
             "tokens live an hour, so no refresh falls due by itself) behind a relay of the script's. Times are ms, "
             "**median / p95 / max** over the samples; a host's time is when a GetToken polled on a persistent "
             "connection to it (about every 1-2 ms) first answered with the token, or when its subscriber got the event.",
             ""]
    if "error" in d:
        lines += [f"**The run failed**: {d['error']}", ""]

    lo = d.get("login", {}).get("samples", [])
    ki = [s for s in d.get("kick", {}).get("samples", []) if "error" not in s or s.get("rc") == 0]
    if lo or ki:
        rows = ["| What | samples | on A | B | C |", "|---|---:|---:|---:|---:|"]
        if lo:
            rows.append(f"| Login on A → served on B, C (from A's reply) | {len(lo)} | "
                        f"{cell(summary([s['login_ms'] for s in lo]))} (the Login) | {cell(summary([s.get('B') for s in lo]))} | "
                        f"{cell(summary([s.get('C') for s in lo]))} |")
            rows.append(f"| the same, from the Login's start | {len(lo)} | | {cell(summary([s.get('B_from_start') for s in lo]))} | "
                        f"{cell(summary([s.get('C_from_start') for s in lo]))} |")
            rows.append(f"| Logout on A → B, C serve nothing (from A's reply) | {len(lo)} | "
                        f"{cell(summary([s['logout_ms'] for s in lo]))} (the Logout) | {cell(summary([s.get('logout_B') for s in lo]))} | "
                        f"{cell(summary([s.get('logout_C') for s in lo]))} |")
        if ki:
            rows.append(f"| `vaultctl kick` on A → `kickedOffline` at a subscriber (from the command's return) | {len(ki)} | "
                        f"{cell(summary([s['kick_cmd_ms'] for s in ki]))} (the command) | {cell(summary([s.get('B') for s in ki]))} | "
                        f"{cell(summary([s.get('C') for s in ki]))} |")
            rows.append(f"| the same, from the command's start | {len(ki)} | | {cell(summary([s.get('B_from_start') for s in ki]))} | "
                        f"{cell(summary([s.get('C_from_start') for s in ki]))} |")
        lines += ["**Propagation.** A Login (a token response of a new grant) on A through the Python client, then "
                  "GetToken on B and C until they serve it; the Logout the same way. For the kick, a `Subscribe` "
                  "stream (kinds `kickedOffline`) on B and on C, and `vaultctl kick oauth USER --reason bench` on A "
                  "(a process: its start-up is in the \"from the start\" row). A time from the reply can be below "
                  "zero: the other host may hear the watch before A's reply is read.", "", *rows, ""]

    rf = d.get("refresh", {}).get("rounds", [])
    if rf:
        per = d["refresh"].get("per_host", 20)
        rows = ["| Round | converged | slowest command on A / B / C | commands failed | refresh requests | rotations | reuse detected | the host that rotated logged |",
                "|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in rf:
            slowest = " / ".join(f"{r.get('slowest_command_ms', {}).get(n, 0):.0f}" for n in ("A", "B", "C"))
            failed = ", ".join(f"{v} on {k}" for k, v in sorted(r.get("failed_on", {}).items())) or "0"
            said = []
            for k, v in sorted(r.get("logs", {}).items()):
                if v.get("revoke_orphaned"):
                    said.append(f"{k}: `tokens refreshed on another host`, **`revokeOrphaned`**")
                elif v.get("refreshed_here"):
                    said.append(f"{k}: `token refreshed`" + (f" ×{v['refreshed_here']}" if v["refreshed_here"] > 1 else ""))
            orphaned = "; ".join(said) or "–"
            conv = f"{r['converged_ms']:.0f}" if r.get("converged") and r.get("converged_ms") is not None else "**never**"
            again = " (logged in again first)" if r.get("logged_in_again") else ""
            rows.append(f"| {r['round']}{again} | {conv} | {slowest} | {failed} | {r['refresh_requests']} | {r['rotations']} | "
                        f"{r['reused']} | {orphaned} |")
        conv = summary([r.get("converged_ms") for r in rf])
        reqs = sum(r["refresh_requests"] for r in rf)
        rots = sum(r["rotations"] for r in rf)
        reused = sum(r["reused"] for r in rf)
        errs = {}
        for r in rf:
            for k, v in r.get("errors", {}).items():
                errs[k] = errs.get(k, 0) + v
        err_text = ("; the failed commands said: " + "; ".join(f"{v} × `{k}`" for k, v in sorted(errs.items(), key=lambda x: -x[1])[:4])) if errs else ""
        lines += [f"**Refresh convergence.** One account logged in; each round starts {3 * per} "
                  f"`vaultctl refresh oauth USER` at once, {per} on each host (each process started beforehand and "
                  "blocked on a pipe, then all pipes written), and times from that moment until all three hosts serve "
                  "the token they all end with (held for 300 ms). With `MinRefreshInterval=0` a command that starts "
                  "after a refresh ended may start another: *rotations* are the refresh grants the token server "
                  "answered 200 (each rotates the refresh token), *refresh requests* every refresh grant it was sent. "
                  "Targets: one request per rotation, no reuse. The slowest command per host is its exit, in ms from "
                  "the start.", "", *rows, "",
                  f"Over {len(rf)} rounds: converged in {cell(conv)} ms (median / p95 / max); {reqs} refresh requests for "
                  f"{rots} rotations, {reused} reuse detected{err_text}.", ""]
        found = []
        for r in rf:
            for k, v in sorted(r.get("logs", {}).items()):
                if v.get("revoke_orphaned"):
                    found.append(f"round {r['round']}: {k} made the rotation, logged it as another host's and "
                                 f"`revokeOrphaned`, and its {r.get('failed_on', {}).get(k, 0)} callers got an error")
            for k, v in sorted(r.get("slowest_command_ms", {}).items()):
                if v > 1000 and r.get("converged_ms") is not None and v > r["converged_ms"] + 1000:
                    found.append(f"round {r['round']}: the last command on {k} returned after {v / 1000:.1f} s, "
                                 f"though every host served the new token at {r['converged_ms']:.0f} ms")
        if found:
            lines += [f"**Faults seen in this run** (notes 1 and 2 below): " + "; ".join(found) + ".", ""]

    fo = d.get("failover", {}).get("rounds", [])
    if fo:
        rows = ["| Round | lock held at kill (TTL left) | kill → B serves a new token | kill → C | B's refresh command → B serves | B found the lock held | refresh requests (500s) | rotations | reuse | session survived |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in fo:
            held = "yes" if r.get("locks_at_kill") else "**no**"
            ttl = f" ({r['lease_ttl_left_s']} s)" if r.get("lease_ttl_left_s") is not None else ""
            def f0(x, none):
                return none if x is None else f"{x:.0f}"
            rows.append(f"| {r['round']} | {held}{ttl} | {f0(r.get('b_ms'), '**never**')} | {f0(r.get('c_ms'), '**never**')} | "
                        f"{f0(r.get('b_from_refresh_ms'), '–')} | {r.get('logs', {}).get('B', {}).get('waited', 0)} × | "
                        f"{r['refresh_requests']} ({r['answered_5xx']}) | {r['rotations']} | "
                        f"{r['reused']} | {'yes' if r.get('survived') else '**no**'} |")
        lt = d["failover"].get("lock_ttl", 3)
        lines += [f"**Failover** (`LockTTL={lt}`; hosts restarted with it). Each round: the token server answers "
                  "500 (`/control/mode error500`), and the relay holds each 5xx answer "
                  f"{d['failover'].get('hold_5xx_s', 2):.0f} s, so that A's refresh is in flight with the account's lock "
                  "held; `vaultctl refresh` on A; as soon as the relay holds A's 500, SIGKILL of A's vaultd; the server "
                  "back to normal; `vaultctl refresh` on B; times from the kill. B finds the lock held by the dead "
                  "host and waits until its lease ends: its watch sees the lock's key go (or, failing that, the "
                  "lease's TTL left plus a second passes), then it asks again (each time it finds the lock still "
                  "held it logs a wait: *B found the lock held*), and refreshes. A is started again after each round (it restores from etcd).", "", *rows, "",
                  f"Kill → B serving a new token over {len(fo)} rounds: {cell(summary([r.get('b_ms') for r in fo]))} ms; "
                  f"target: within LockTTL + 1 s = {(lt + 1) * 1000} ms.", ""]
    if NOTES:
        lines += [NOTES]
    lines += ["Rerun: `scripts/bench --only fleet` (`--quick`: fewer samples); it rewrites this section alone "
              "(bench/fleet.py; `python3 bench/fleet.py run VAULTD VAULTCTL ROOT WORK RESULTS_DIR` by hand keeps "
              "`RESULTS_DIR/fleet.json`, every sample, and `FLEET_KEEP_WORK=1` the hosts' logs in WORK).", ""]
    return "\n".join(head + lines + [END])


def report(rd, path):
    text = section(rd)
    doc = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    open(path, "w").write(replace_section(doc, text, BEGIN, END))
    print(text)


def main(argv):
    if len(argv) >= 6 and argv[0] == "run":
        def terminated(signum, frame):
            raise SystemExit(143)
        signal.signal(signal.SIGTERM, terminated)
        return run(argv[1], argv[2], argv[3], argv[4], argv[5], len(argv) > 6 and argv[6] == "quick")
    if len(argv) == 3 and argv[0] == "report":
        report(argv[1], argv[2])
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
