#!/usr/bin/env python3
"""The storescale step of scripts/bench (issue 16, item 5): the two store
engines at scale, side by side where the keyring can be measured.

  storescale.py VAULTD ROOT WORK RESULTS_DIR KEYRING_DIR [quick]

ROOT is the checkout (its debug test build must exist: the databases are
seeded by Tests/VaultIntegrationTests/BenchSeed.swift through
`swift test --skip-build --filter BenchSeed`); WORK a scratch directory;
KEYRING_DIR the private gnome-keyring the current DBUS_SESSION_BUS_ADDRESS
reaches (scripts/lib/keyring.sh), holding no other items. Writes
RESULTS_DIR/storescale.json (bench/storescale_report.py reads it).

What it measures, each with a release vaultd whose only provider is an
oauth2 one (`bench`) whose token endpoint is bench/refresh_server.py:
  - one Login (time until acknowledged, one connection, one at a time) with
    50, 1,000, 10,000 and 100,000 sessions stored (SQLite, seeded), and 50 and
    1,000 (Secret Service, logged in through Login);
  - start-up: exec to the `ready` line and to the first answer on the socket,
    3 starts; RSS 2 s after ready; disk bytes (file + WAL after a checkpoint);
  - 100,000 sessions refreshing hourly: refresh times spread evenly over the
    hour (27.8 a second), vaultd's CPU over a window of steady refreshes;
  - sustained refresh writes: a backlog of overdue sessions that vaultd
    refreshes as fast as it can, timed by its `token refreshed` lines.
"""
import json, math, os, secrets, sqlite3, statistics, subprocess, sys, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vutil import call, connect, cpu_ticks, rss_kb, run_ns_and_switches, stop  # noqa: E402

HOUR_RATE = 100_000 / 3600  # refreshes a second when 100,000 sessions refresh hourly
LONG_LIFETIME = 13_500  # seeded for the Login and start-up runs: first refresh 2-3 h away


def say(*args):
    print("storescale:", *args, file=sys.stderr, flush=True)


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


def summary(ms):
    return {"n": len(ms), "median_ms": statistics.median(ms) if ms else None, "p90_ms": pct(ms, 90),
            "min_ms": min(ms) if ms else None, "max_ms": max(ms) if ms else None}


class Vaultd:
    """A release vaultd with its stderr read line by line (each line stamped
    when it arrived), and how long it took to say `ready` and to answer."""

    def __init__(self, binary, sock, conf, env, args=(), deadline_s=300):
        if os.path.exists(sock):
            os.unlink(sock)
        self.sock, self.lines, self.ready_ms, self.answer_ms = sock, [], None, None
        t0 = time.perf_counter()
        self.p = subprocess.Popen([binary, "--socket", sock, "--config", conf, *args],
                                  stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
        self.reader = threading.Thread(target=self._read, args=(t0,), daemon=True)
        self.reader.start()
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline and self.p.poll() is None:
            try:  # the first answer on the socket (org.varlink.service.GetInfo)
                s = connect(sock)
                call(s, "org.varlink.service.GetInfo", {}, timeout=30)
                s.close()
                self.answer_ms = (time.perf_counter() - t0) * 1000
                break
            except OSError:
                time.sleep(0.002)
        while self.ready_ms is None and time.monotonic() < deadline and self.p.poll() is None:
            time.sleep(0.002)
        if self.ready_ms is None or self.answer_ms is None:
            tail = "".join(l for _, l in self.lines[-5:])
            self.stop()
            raise RuntimeError(f"vaultd did not become ready: {tail}")
        self.ready_at = time.time() - (time.perf_counter() - t0 - self.ready_ms / 1000)

    def _read(self, t0):
        for raw in self.p.stderr:
            line = raw.decode(errors="replace")
            now = time.perf_counter()
            self.lines.append((now, line))
            if self.ready_ms is None and "ready" in line:
                self.ready_ms = (now - t0) * 1000

    def count(self, text):
        return sum(1 for _, l in self.lines if text in l)

    def stop(self):
        stop(self.p, 60)
        self.reader.join(10)


def tok(head, size):
    return (head + secrets.token_urlsafe(size))[:size]


def one_login(s, user, lifetime=LONG_LIFETIME):
    """One oauth2 Login of bench/USER with a token response of real sizes on
    connection `s`: (milliseconds until the answer, error or None)."""
    params = {"provider": "bench", "user": user, "tokenResponse": {
        "access_token": tok("ya29.a0", 180), "refresh_token": tok("1//0g", 100),
        "token_type": "Bearer", "expires_in": lifetime}}
    t0 = time.perf_counter()
    r = call(s, "io.vaultd.Vault.Login", params, timeout=120)
    return (time.perf_counter() - t0) * 1000, (json.dumps(r)[:300] if "error" in r else None)


def time_logins(sock, prefix, count, lifetime=LONG_LIFETIME):
    """Logs in bench/PREFIX0..COUNT-1 one at a time; the milliseconds of each."""
    s = connect(sock)
    ms, errors = [], 0
    for i in range(count):
        t, error = one_login(s, f"{prefix}{i}", lifetime)
        ms.append(t)
        if error:
            errors += 1
            if errors <= 3:
                say(f"login {prefix}{i}: {error}")
    s.close()
    return ms, errors


def disk_bytes(db):
    """The database's bytes on disk once its WAL is checkpointed into it."""
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    con.close()
    return sum(os.path.getsize(db + s) for s in ("", "-wal") if os.path.exists(db + s))


class Bench:
    def __init__(self, vaultd, root, work, results, keyring, quick):
        self.vaultd, self.root, self.work, self.results, self.keyring, self.quick = (
            vaultd, root, work, results, keyring, quick)
        self.sock = os.path.join(work, "scale.sock")
        self.out = {"quick": quick, "load_start": open("/proc/loadavg").read().split()[:3]}
        os.makedirs(work, exist_ok=True)
        self.cred = os.path.join(work, "credentials")
        os.makedirs(self.cred, mode=0o700, exist_ok=True)
        with open(os.path.join(self.cred, "data-key"), "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(os.urandom(32))
        self.server = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                     "refresh_server.py"), "4575"],
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        url = self.server.stdout.readline().decode().split()[1]
        self.server_url = url
        self.conf = os.path.join(work, "scale.conf")
        with open(self.conf, "w") as f:
            f.write(f"[Provider bench]\nType=oauth2\nTokenURL={url}/token\nRevocationURL={url}/revoke\n"
                    "ClientID=vaultd-bench\n")

    def close(self):
        stop(self.server, 10)

    def server_times(self):
        host, port = self.server_url.split("//")[1].split(":")
        import http.client
        c = http.client.HTTPConnection(host, int(port), timeout=30)
        c.request("GET", "/stats")
        return json.loads(c.getresponse().read())["times"]

    def env(self, **extra):
        e = dict(os.environ)
        for k in ("VAULTD_STORE", "VAULTD_DATABASE", "VAULTD_STORE_SCOPE", "CREDENTIALS_DIRECTORY"):
            e.pop(k, None)
        e.update(extra)
        return e

    def sqlite_env(self, db):
        return self.env(VAULTD_STORE="sqlite", VAULTD_DATABASE=db, CREDENTIALS_DIRECTORY=self.cred)

    def seed(self, seeds, now):
        """Writes the databases `seeds` describe (BenchSeed.swift), timed."""
        plan = os.path.join(self.work, "seed-plan.json")
        json.dump({"credentials": self.cred, "now": now, "seeds": seeds}, open(plan, "w"))
        t0 = time.monotonic()
        r = subprocess.run(["swift", "test", "--skip-build", "--filter", "BenchSeed"], cwd=self.root,
                           env=self.env(VAULTD_BENCH_SEED=plan), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        text = r.stdout.decode(errors="replace")
        if r.returncode != 0 or "seeded" not in text:
            raise RuntimeError("seeding failed:\n" + text[-2000:])
        say(f"seeded {sum(s['count'] for s in seeds):,} sessions in {time.monotonic() - t0:.0f} s")

    def starts(self, env, rounds=3):
        """`rounds` starts: ready and first-answer milliseconds, RSS 2 s after ready."""
        res = []
        for _ in range(rounds):
            v = Vaultd(self.vaultd, self.sock, self.conf, env)
            time.sleep(2.0)
            rss = rss_kb(v.p.pid)
            sessions = next((l for _, l in v.lines if "ready" in l), "")
            v.stop()
            res.append({"ready_ms": v.ready_ms, "answer_ms": v.answer_ms, "rss_kb": rss,
                        "ready_line_sessions": sessions.split("sessions=")[1].split()[0] if "sessions=" in sessions else None})
        return res

    # --- SQLite: Login, start-up, RSS, disk at each size ----------------------
    def sqlite_sizes(self):
        sizes = [0, 50, 1000, 10000] + ([] if self.quick else [100000])
        logins = 50 if self.quick else 200
        now = int(time.time())
        dbs = {n: os.path.join(self.work, f"sessions-{n}.db") for n in sizes}
        self.seed([{"path": dbs[n], "count": n, "prefix": "s", "lifetime": LONG_LIFETIME,
                    "firstRefresh": 7200, "spread": 3600} for n in sizes], now)
        rows = {}
        for n in sizes:
            say(f"SQLite, {n:,} sessions: disk, 3 starts")
            row = {"sessions": n, "disk_bytes": disk_bytes(dbs[n])}
            row["starts"] = self.starts(self.sqlite_env(dbs[n]))
            say(f"  ready {statistics.median(s['ready_ms'] for s in row['starts']):.1f} ms, "
                f"RSS {statistics.median(s['rss_kb'] for s in row['starts']) / 1024:.1f} MB, "
                f"disk {row['disk_bytes'] / 1e6:.2f} MB")
            rows[str(n)] = row
        # Logins: one vaultd per size, all running, taking turns one Login at a
        # time (the order rotating), so that the disk's and the machine's
        # moments of load fall on every size alike.
        say(f"SQLite Logins: {logins} per size, the sizes taking turns")
        vs, conns = {}, {}
        try:
            for n in sizes:
                sock = os.path.join(self.work, f"login-{n}.sock")
                vs[n] = Vaultd(self.vaultd, sock, self.conf, self.sqlite_env(dbs[n]))
                conns[n] = connect(sock)
            ms, errors = {n: [] for n in sizes}, {n: 0 for n in sizes}
            for i in range(logins):
                for n in sizes[i % len(sizes):] + sizes[:i % len(sizes)]:
                    t, error = one_login(conns[n], f"login{i}")
                    ms[n].append(t)
                    if error:
                        errors[n] += 1
                        if errors[n] <= 3:
                            say(f"login at {n}: {error}")
        finally:
            for n in vs:
                vs[n].stop()
        for n in sizes:
            row = rows[str(n)]
            row["login"], row["login_errors"], row["login_ms"] = summary(ms[n]), errors[n], ms[n]
            say(f"  {n:,}: Login median {row['login']['median_ms']:.2f} ms, p90 {row['login']['p90_ms']:.2f} ms, "
                f"min {row['login']['min_ms']:.2f} ms")
        self.out["sqlite"] = rows

    # --- Secret Service: Login at 50 and 1,000; start-up, RSS, keyring file ---
    def secret_service(self):
        fill = 300 if self.quick else 1000
        timed = 20
        env = self.env(VAULTD_STORE="secret-service", VAULTD_STORE_SCOPE="storescale-" + secrets.token_hex(4))
        say("Secret Service, empty: 3 starts")
        out = {"starts_0": self.starts(env)}
        v = Vaultd(self.vaultd, self.sock, self.conf, env)
        t0 = time.monotonic()
        time_logins(self.sock, "fill-a", 50)
        ms50, e50 = time_logins(self.sock, "t50-", timed)
        say(f"  Login at ~50 items: median {statistics.median(ms50):.1f} ms; filling to {fill:,}")
        time_logins(self.sock, "fill-b", fill - 50 - timed)
        msn, en = time_logins(self.sock, "tn-", timed)
        v.stop()
        say(f"  Login at ~{fill:,} items: median {statistics.median(msn):.1f} ms "
            f"(filling took {time.monotonic() - t0:.0f} s)")
        out.update(login_50=summary(ms50), login_n=summary(msn), fill=fill, timed=timed,
                   login_errors=e50 + en, login_50_ms=ms50, login_n_ms=msn, sessions=fill + timed)
        say(f"Secret Service, {fill + timed:,} sessions: 3 starts")
        out["starts_n"] = self.starts(env)
        files = []
        for d, _, names in os.walk(self.keyring):
            files += [os.path.join(d, x) for x in names if x.endswith(".keyring")]
        out["keyring_files"] = {os.path.basename(p): os.path.getsize(p) for p in files}
        self.out["secret_service"] = out

    # --- 100,000 sessions refreshing hourly ---------------------------------
    def refreshing(self):
        n = 20000 if self.quick else 100000
        window = 30.0 if self.quick else 60.0
        backlog = 3000 if self.quick else int(os.environ.get("BENCH_BACKLOG", "24000"))
        rate = n / 3600
        paced = os.path.join(self.work, "refresh-paced.db")
        burst = os.path.join(self.work, "refresh-backlog.db")
        now = int(time.time())
        # Paced: refresh times spread evenly over the hour from now + 60 s; a
        # lifetime of 4,575 s puts every issue time in the past (the refresh
        # comes 80-90% into it) and makes each session refresh about hourly.
        # Backlog: `backlog` sessions overdue by 100-300 s (still valid: a
        # lifetime of 20,000 s), the rest hours away: at start-up vaultd
        # spreads the overdue ones over its 30 s window, more than it can
        # write, so it refreshes them as fast as it can.
        self.seed([
            {"path": paced, "count": n, "prefix": "p", "lifetime": 4575, "firstRefresh": 60, "spread": 3600},
            {"path": burst, "count": backlog, "prefix": "b", "lifetime": 20000, "firstRefresh": -300, "spread": 200},
            {"path": burst, "count": n - backlog, "prefix": "q", "lifetime": LONG_LIFETIME, "firstRefresh": 7200,
             "spread": 3600, "append": True},
        ], now)
        first = now + 60
        say(f"paced: {n:,} sessions, refreshes from {first - time.time():.0f} s from now at {rate:.1f}/s")
        v = Vaultd(self.vaultd, self.sock, self.conf, self.sqlite_env(paced))
        ready = v.ready_at
        # Overdue refreshes (vaultd ready after the first due) come spread over 30 s: wait them out.
        start = max(first + 10, ready + 5) if ready <= first else ready + 35
        say(f"  ready in {v.ready_ms:.0f} ms; measuring {window:.0f} s from {start - time.time():.0f} s from now")
        time.sleep(2.0)
        rss_ready = rss_kb(v.p.pid)
        while time.time() < start:
            time.sleep(0.2)
        hz = os.sysconf("SC_CLK_TCK")
        w0, c0, (n0, _) = time.time(), cpu_ticks(v.p.pid), run_ns_and_switches(v.p.pid)
        time.sleep(window)
        w1, c1, (n1, _) = time.time(), cpu_ticks(v.p.pid), run_ns_and_switches(v.p.pid)
        rss = rss_kb(v.p.pid)
        times = self.server_times()
        warnings = v.count("refresh failed") + v.count("could not be stored")
        v.stop()
        done = sum(1 for t in times if w0 <= t < w1)
        wall = w1 - w0
        p = {"sessions": n, "rate_planned": rate, "window_s": wall, "refreshes": done,
             "refreshes_per_s": done / wall, "cpu_ticks": c1 - c0, "cpu_s_ticks": (c1 - c0) / hz,
             "cpu_s_schedstat": (n1 - n0) / 1e9, "rss_kb": rss, "rss_ready_kb": rss_ready, "warnings": warnings, "ready_ms": v.ready_ms,
             "total_refreshes": len(times)}
        p["cpu_pct"] = 100 * p["cpu_s_schedstat"] / wall
        p["cpu_ms_per_refresh"] = 1000 * p["cpu_s_schedstat"] / done if done else None
        p["cpu_pct_at_hourly_100k"] = (p["cpu_ms_per_refresh"] / 1000 * HOUR_RATE * 100) if done else None
        say(f"  {done} refreshes in {wall:.1f} s ({done / wall:.1f}/s), vaultd CPU {p['cpu_pct']:.2f}% of a core "
            f"({p['cpu_ms_per_refresh'] or 0:.2f} ms per refresh; ticks {c1 - c0}), {warnings} warnings")
        self.out["paced"] = p

        say(f"backlog: {backlog:,} overdue of {n:,}")
        before = len(self.server_times())
        v = Vaultd(self.vaultd, self.sock, self.conf, self.sqlite_env(burst), args=("--log-level", "info"))
        c0, (n0, _) = cpu_ticks(v.p.pid), run_ns_and_switches(v.p.pid)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and v.count("token refreshed") < backlog and v.p.poll() is None:
            if v.count("refresh failed") + v.count("could not be stored") > 50:
                break
            time.sleep(0.2)
        c1, (n1, _) = cpu_ticks(v.p.pid), run_ns_and_switches(v.p.pid)
        stamps = sorted(t for t, l in v.lines if "token refreshed" in l)
        warnings = v.count("refresh failed") + v.count("could not be stored")
        v.stop()
        kinds = {}
        for _, line in v.lines:
            if "refresh failed" in line or "could not be stored" in line:
                kind = line.split(" event=")[0] + (" " + line.split("reason=")[1].split('" ')[0] + '"' if "reason=" in line else "")
                kinds[kind] = kinds.get(kind, 0) + 1
        b = {"sessions": n, "backlog": backlog, "refreshed": len(stamps), "warnings": warnings, "warning_kinds": kinds,
             "http_refreshes": len(self.server_times()) - before, "cpu_s_schedstat": (n1 - n0) / 1e9,
             "cpu_ticks": c1 - c0}
        if len(stamps) >= 10:
            lo, hi = stamps[len(stamps) // 10], stamps[(len(stamps) * 9) // 10]
            b["middle_rate_per_s"] = ((len(stamps) * 9) // 10 - len(stamps) // 10) / (hi - lo) if hi > lo else None
            b["span_s"] = stamps[-1] - stamps[0]
            b["overall_rate_per_s"] = len(stamps) / b["span_s"] if b["span_s"] else None
            b["cpu_ms_per_refresh"] = 1000 * b["cpu_s_schedstat"] / len(stamps)
            # Demand: every overdue refresh falls due within 30 s of start-up.
            b["demand_per_s"] = backlog / 30
        say(f"  {len(stamps)} refreshed, middle 80% at {b.get('middle_rate_per_s') or 0:.0f}/s, "
            f"all in {b.get('span_s') or 0:.1f} s, {warnings} warnings, CPU {b.get('cpu_ms_per_refresh') or 0:.2f} ms each")
        self.out["backlog"] = b

    def run(self):
        steps = os.environ.get("BENCH_STORESCALE_STEPS", "sqlite,keyring,refresh").split(",")
        try:
            if "sqlite" in steps:
                self.sqlite_sizes()
            if "keyring" in steps:
                self.secret_service()
            if "refresh" in steps:
                self.refreshing()
        finally:
            self.out["load_end"] = open("/proc/loadavg").read().split()[:3]
            self.out["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            self.close()
            json.dump(self.out, open(os.path.join(self.results, "storescale.json"), "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv
    Bench(a[1], a[2], a[3], a[4], a[5], len(a) > 6 and a[6] == "quick").run()
