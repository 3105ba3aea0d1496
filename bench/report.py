#!/usr/bin/env python3
"""Turns the results of scripts/bench (RESULTS_DIR/*.txt|json) into a printed
table, docs/BENCHMARKS.md and docs/bench-latency.png.
usage: report.py RESULTS_DIR DOCS_DIR MODE"""
import glob, json, os, statistics, sys

rd, docs, mode = sys.argv[1], sys.argv[2], sys.argv[3]


def kv(name):
    p = os.path.join(rd, name)
    if not os.path.exists(p):
        return None
    line = open(p).read().strip().splitlines()
    if not line:
        return None
    d = {}
    for part in line[-1].split():
        if "=" in part:
            k, v = part.split("=", 1)
            try:
                d[k] = float(v)
            except ValueError:
                d[k] = v
    return d or None


def js(name):
    p = os.path.join(rd, name)
    try:
        return json.load(open(p))
    except Exception:
        return None


def text(name, default=""):
    p = os.path.join(rd, name)
    return open(p).read().strip() if os.path.exists(p) else default


def f(x, nd=0, unit=""):
    if x is None:
        return "not measured"
    return f"{x:,.{nd}f}{unit}"


def ratio(a, b, nd=2):
    if a is None or b is None or not b:
        return "–"
    return f"{a / b:.{nd}f}×"


def met(ok):
    return "—" if ok is None else ("**met**" if ok else "**missed**")


conns = [int(c) for c in text("conns", "1 32 256").split()]
nsess = int(text("sessions", "0") or 0)
rows, table = [], []
floor = {c: kv(f"floor_{c}.txt") for c in conns}
gt = {c: kv(f"gettoken_{c}.txt") for c in conns}
gs = {c: kv(f"getsession_{c}.txt") for c in conns}

lines = []
lines.append("| Test | conns | req/s | p50 µs | p99 µs | p99.9 µs | server CPU µs/req | req/s vs floor | CPU vs floor |")
lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for name, d in (("C echo floor", floor), ("vaultd GetToken", gt), ("vaultd GetSession", gs)):
    for c in conns:
        r = d.get(c)
        fl = floor.get(c)
        if not r:
            lines.append(f"| {name} | {c} | not measured | | | | | | |")
            continue
        lines.append(f"| {name} | {c} | {f(r.get('rps'))} | {f(r.get('p50_us'),1)} | {f(r.get('p99_us'),1)} | "
                     f"{f(r.get('p999_us'),1)} | {f(r.get('cpu_us_per_req'),2)} | "
                     f"{ratio(r.get('rps'), fl and fl.get('rps')) if name != 'C echo floor' else '1.00×'} | "
                     f"{ratio(r.get('cpu_us_per_req'), fl and fl.get('cpu_us_per_req')) if name != 'C echo floor' else '1.00×'} |"
                     + (f" errors={int(r['errors'])}" if r.get("errors") else ""))
load_table = "\n".join(lines)

# hyperfine
hf = js("hyperfine.json")
cmds = {}
if hf:
    for r in hf.get("results", []):
        cmds[r["command"]] = r
labels = json.loads(text("hyperfine_labels.json", "{}") or "{}")
hl = ["| Command | median ms | mean ms | σ ms | min ms | runs | vs /bin/true |", "|---|---:|---:|---:|---:|---:|---:|"]
med = {}
for label, cmd in labels.items():
    r = cmds.get(cmd)
    if r:
        med[label] = r["median"] * 1000
for label, cmd in labels.items():
    r = cmds.get(cmd)
    if not r:
        hl.append(f"| {label} | not measured | | | | | |")
        continue
    hl.append(f"| {label} | {r['median']*1000:.2f} | {r['mean']*1000:.2f} | {r['stddev']*1000:.2f} | {r['min']*1000:.2f} | "
              f"{len(r['times'])} | {ratio(med[label], med.get('/bin/true'),1)} |")
for label in json.loads(text("hyperfine_missing.json", "[]") or "[]"):
    hl.append(f"| {label} | not measured (not installed) | | | | | |")
cmd_table = "\n".join(hl)

fan = js("fanout.json")
fan_ms = fan.get("kicks_ms") if fan else None
fan_p50 = statistics.median(fan_ms) if fan_ms else None
fan_max = max(fan_ms) if fan_ms else None

st = {k: js(f"startup_{k}.json") for k in ("0", "100", str(nsess))}
def stmed(k, field):
    v = st.get(k)
    vals = [x[field] for x in v if x.get(field)] if v else []
    return statistics.median(vals) if vals else None

lg = js("login_times.json")
def login_at(lo, hi):
    if not lg:
        return None
    ms = lg["ms"][lo:hi]
    return statistics.median(ms) if ms else None
login_50 = login_at(40, 60)
login_n = login_at(max(0, nsess - 20), nsess)

rss0, rss100, rssn = stmed("0", "rss_kb"), stmed("100", "rss_kb"), stmed(str(nsess), "rss_kb")
per_sess = (rssn - rss100) * 1024 / (nsess - 100) if rssn and rss100 and nsess > 100 else None
carry = 3600 * 1000 / login_n if login_n else None

idle = js("idle.json")
idle_n = idle["sessions"] if idle else None
idle_pct = idle.get("idle_cpu_pct") if idle else None
idle_ok = idle is not None and idle_pct is not None and idle.get("scheduled") == idle_n and not idle.get("login_errors")
idle_where = (f"{idle_n:,} sessions, {idle['idle_wall_s']:.0f} s, in-memory store"
              + (", quick mode: fewer sessions, shorter" if mode == "quick" else "")) if idle else ""
idle_measured = (f"{idle_pct:.2f}% ({idle_where}; {idle['scheduled']:,} of {idle_n:,} with a refresh scheduled)"
                 if idle and idle_pct is not None else "not measured")

# targets
f32, g32 = floor.get(32), gt.get(32)
tput = g32["rps"] / f32["rps"] if f32 and g32 else None
cpu = g32["cpu_us_per_req"] / f32["cpu_us_per_req"] if f32 and g32 and f32.get("cpu_us_per_req") else None
p99 = g32["p99_us"] if g32 else None
vt, gc, stl = med.get("vaultctl token"), med.get("git credential fill (credential-cache)"), med.get("secret-tool lookup")
tg = [
    ("GetToken req/s at 32 conns ≥ 50% of the floor", f"{tput*100:.0f}%" if tput is not None else "not measured", met(tput >= 0.5) if tput is not None else "—"),
    ("Server CPU per GetToken ≤ 2.5× floor per echo", f"{cpu:.2f}×" if cpu is not None else "not measured", met(cpu <= 2.5) if cpu is not None else "—"),
    ("GetToken p99 at 32 conns ≤ 1 ms", f"{p99/1000:.2f} ms" if p99 is not None else "not measured", met(p99 <= 1000) if p99 is not None else "—"),
    ("`vaultctl token` ≤ 1.5× `git credential fill` (cache)", ratio(vt, gc), met(vt <= 1.5 * gc) if vt and gc else "—"),
    ("`vaultctl token` ≤ 1/5 of `secret-tool lookup`", ratio(vt, stl), met(vt <= stl / 5) if vt and stl else "—"),
    ("Fan-out to 1,000 subscribers: last delivery ≤ 50 ms", f"p50 {f(fan_p50,1)} ms, max {f(fan_max,1)} ms" + (f" ({fan['subscribers']} subscribers)" if fan else ""), met(fan_max <= 50) if fan_max is not None else "—"),
    ("Idle vaultd ≤ 20 MB RSS", f"{rss0/1024:.1f} MB" if rss0 else "not measured", met(rss0 <= 20 * 1024) if rss0 else "—"),
    ("≤ 4 KB RSS per additional session", f"{per_sess/1024:.2f} KB" if per_sess is not None else "not measured", met(per_sess <= 4096) if per_sess is not None else "—"),
    ("Idle CPU with 100,000 scheduled sessions ≤ 1% of a core", idle_measured,
     (met(idle_pct <= 1.0) if idle_ok and idle_n >= 100000 else "— (fewer sessions than the target names)"
      if idle_ok else "—")),
]
tt = ["| Target | Measured | |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in tg]
target_table = "\n".join(tt)

scale = ["| Figure | Value |", "|---|---|",
         f"| Start-up to `ready`, 0 sessions | {f(stmed('0','ready_ms'),1)} ms |",
         f"| Start-up to `ready`, 100 sessions | {f(stmed('100','ready_ms'),1)} ms |",
         f"| Start-up to `ready`, {nsess:,} sessions | {f(stmed(str(nsess),'ready_ms'),1)} ms |",
         f"| RSS idle, 0 sessions | {f(rss0 and rss0/1024,1)} MB |",
         f"| RSS, 100 sessions | {f(rss100 and rss100/1024,1)} MB |",
         f"| RSS, {nsess:,} sessions | {f(rssn and rssn/1024,1)} MB |",
         f"| RSS per additional session | {f(per_sess and per_sess/1024,2)} KB |",
         f"| One Login (keyring write), store at ~50 items | {f(login_50,1)} ms |",
         f"| One Login (keyring write), store at ~{nsess:,} items | {f(login_n,1)} ms |",
         f"| Session writes per hour the store carries at that size | {f(carry)} (so at most ~{f(carry)} sessions refreshing hourly, if refreshes did nothing else) |",
         ]
if idle:
    n = f"{idle_n:,}"
    scale += [
        f"| Idle CPU, {n} sessions scheduled for refresh (in-memory store) | {idle_pct:.3f}% of a core over {idle['idle_wall_s']:.0f} s "
        f"({idle['idle_cpu_ticks']} ticks of utime+stime; schedstat {idle['idle_cpu_pct_schedstat']:.3f}%; "
        f"{idle['idle_wakeups_per_s']:.1f} context switches/s) |",
        f"| Sessions with a refresh scheduled (ListSessions `refreshAt`) | {idle['scheduled']:,} of {n}; the nearest due in {idle['next_refresh_in_s']/3600:.1f} h |",
        f"| Logging in {n} sessions (in-memory store, 4 connections, 256 in flight each) | {idle['login_s']:.1f} s ({idle['login_per_s']:,.0f} Logins/s, {idle['login_errors']} errors) |",
        f"| RSS, in-memory store, 0 → {n} sessions | {idle['rss_empty_kb']/1024:.1f} MB → {idle['rss_kb']/1024:.1f} MB |",
        f"| RSS per session, in-memory store | {f(idle['rss_per_session_bytes']/1024, 2)} KB |",
    ]
else:
    scale.append("| Idle CPU, sessions scheduled for refresh (in-memory store) | not measured |")
scale_table = "\n".join(scale)

fan_txt = "not measured"
if fan:
    fan_txt = (f"{fan['subscribers']} subscribers, {len(fan_ms or [])} kicks: p50 {f(fan_p50,1)} ms, max {f(fan_max,1)} ms "
               f"(each: {', '.join(f'{x:.1f}' for x in fan_ms or [])} ms)")
    if fan.get("errors"):
        fan_txt += f"; errors: {'; '.join(fan['errors'][:3])}"

# plot
png = os.path.join(docs, "bench-latency.png")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for kind, style in (("gettoken", "-"), ("floor", ":")):
        for c in conns:
            p = os.path.join(rd, f"lat_{kind}_{c}.txt")
            if not os.path.exists(p):
                continue
            xs = sorted(float(x) for x in open(p) if x.strip())
            if not xs:
                continue
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.plot(xs, ys, style, label=f"{'vaultd GetToken' if kind == 'gettoken' else 'C echo floor'}, {c} conn")
    ax.set_xscale("log")
    ax.set_xlabel("latency (µs, log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("GetToken latency CDF per concurrency level (dotted: C floor)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plot_note = "![GetToken latency CDF](bench-latency.png)"
except Exception as e:
    plot_note = f"(plot not made: {e})"

machine = text("machine.txt")
params = text("params.txt")
doc = f"""# Benchmarks

Generated by `scripts/bench{' --quick' if mode == 'quick' else ''}` on {text('date.txt')}. The numbers
below are from one run on a shared, noisy machine; ratios are against the C
floor measured in the same run. The issue asks for medians of several rounds;
this is a single round{' in quick mode (smaller counts, shorter runs)' if mode == 'quick' else ''}, so read the ratios, not the last digit.

## Machine

{machine}

## Targets (issue 6)

{target_table}

## Request/response over the Unix socket

vaultd holds {nsess:,} logged-in sessions (demo provider, static tokens). Each
row is `bench/load_client` with one thread per connection in a
request/response loop: {params}. Server CPU is utime+stime of the server
process from `/proc/PID/stat` over the timed run, divided by the requests it
served (10 ms tick resolution). The floor is `bench/echo_server` (C,
thread per connection) answering every NUL-terminated message with a
100-byte reply, the size of a GetToken reply; the client and server share the
machine's {text('nproc.txt')} CPUs, so at 32 and 256 connections the client's
own threads compete with the server.

{load_table}

{plot_note}

## Whole-command latency

hyperfine, `--warmup 3`, `-N` (no shell) where possible, {text('hyperfine_runs.txt','30')} runs each.
`secret-tool lookup provider demo user u1` runs on the keyring vaultd uses and
finds vaultd's item; `git credential fill` goes through git's credential-cache
daemon (temp HOME, `credential.helper 'cache --socket …'`) via `bash -c`, so
it includes a bash start; `ssh-add -l` runs against a fresh `ssh-agent` with no keys.

{cmd_table}

## Fan-out

`bench/fanout.py`: that many connections call `Subscribe` (more, narrowed to
one account and `kickedOffline`), wait for all snapshots, then per kick: log
the account in, send `ForceLogout`, and time until the last subscriber has
read its event (Python selectors, so the reader's own cost is included).

{fan_txt}

## Scale

Start-up: exec to the `vaultd: notice: ready` line, median of 3 starts,
restoring the sessions from gnome-keyring (separate `StoreScope` per size).
RSS: VmRSS from `/proc/PID/status` 1 s after ready. Keyring write cost: the
time of one `Login` (which writes the keyring) while the store grows,
median of 20 logins around that size.

The idle-CPU rows use **the in-memory store** (`vaultd --memory-store`), as
issue 6 allows for this one figure: gnome-keyring would take hours to hold
that many items. `bench/vutil.py idle` starts a release vaultd with one
`oauth2` provider (its token endpoint a closed loopback port), logs in
{f(idle_n) if idle else 'the'} sessions, each with an access token, a refresh token and
`expires_in` of one day (so each has its refresh scheduled 19-22 h ahead and
none falls due during the run), checks with `ListSessions` that every one
shows `refreshAt`, waits 3 s, then reads utime+stime from `/proc/PID/stat`
before and after {f(idle['seconds']) if idle else 'the'} s idle (10 ms ticks;
schedstat gives the same in ns, summed over threads).{' Quick mode: 20,000 sessions and 10 s instead of 100,000 and 30 s.' if mode == 'quick' else ''}
Its RSS per session ((RSS after the logins − RSS empty) / sessions) is a
cleaner per-session figure than the keyring one above: no libsecret or
D-Bus buffers grow with it.

{scale_table}

## Method

- `scripts/bench` builds vaultd and vaultctl (release), compiles
  `bench/echo_server.c` and `bench/load_client.c` with `gcc -O2`, starts a
  private D-Bus + gnome-keyring (`scripts/lib/keyring.sh`), and stops every
  process it starts on exit.
- Sessions are logged in through one connection, one `Login` at a time
  (`bench/vutil.py`).
- Per load row: warm-up, then the timed run; latencies of every request of the
  timed run go to a file for the CDF.
- Loopback Unix sockets only; nothing leaves the machine.
"""
os.makedirs(docs, exist_ok=True)
open(os.path.join(docs, "BENCHMARKS.md"), "w").write(doc)

print()
print(load_table)
print()
print(cmd_table)
print()
print("Fan-out:", fan_txt)
print()
print(scale_table)
print()
print(target_table)
