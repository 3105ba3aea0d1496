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
rounds = int(text("rounds", "1") or 1)
METRICS = ("rps", "p50_us", "p99_us", "p999_us", "cpu_us_per_req")


def per_round(kind, c):
    """The load_client results of every round, None where a round has none."""
    return [kv(f"{kind}_{c}_r{r}.txt") for r in range(1, rounds + 1)]


def median_of(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def spread(values, nd=2, scale=1.0, unit=""):
    """'median (min–max over N rounds)' of the values that exist."""
    values = [v * scale for v in values if v is not None]
    if not values:
        return "not measured"
    m = statistics.median(values)
    if len(values) == 1:
        return f"{m:,.{nd}f}{unit}"
    return f"{m:,.{nd}f}{unit} ({min(values):,.{nd}f}–{max(values):,.{nd}f} over {len(values)} rounds)"


runs = {(kind, c): per_round(kind, c) for kind in ("floor", "gettoken", "getsession") for c in conns}


def load_median(kind, c, metric):
    return median_of([r.get(metric) if r else None for r in runs[(kind, c)]])


def ratios(kind, c, metric):
    """vaultd's figure over the floor's of the same round, per round."""
    out = []
    for mine, fl in zip(runs[(kind, c)], runs[("floor", c)]):
        if mine and fl and mine.get(metric) is not None and fl.get(metric):
            out.append(mine[metric] / fl[metric])
    return out


lines = []
lines.append("| Test | conns | req/s | p50 µs | p99 µs | p99.9 µs | server CPU µs/req | req/s vs floor | CPU vs floor |")
lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for name, kind in (("C echo floor", "floor"), ("vaultd GetToken", "gettoken"), ("vaultd GetSession", "getsession")):
    for c in conns:
        if not any(runs[(kind, c)]):
            lines.append(f"| {name} | {c} | not measured | | | | | | |")
            continue
        errors = sum(int(r.get("errors", 0)) for r in runs[(kind, c)] if r)
        rr, cr = ratios(kind, c, "rps"), ratios(kind, c, "cpu_us_per_req")
        lines.append(f"| {name} | {c} | {f(load_median(kind, c, 'rps'))} | {f(load_median(kind, c, 'p50_us'), 1)} | "
                     f"{f(load_median(kind, c, 'p99_us'), 1)} | {f(load_median(kind, c, 'p999_us'), 1)} | "
                     f"{f(load_median(kind, c, 'cpu_us_per_req'), 2)} | "
                     f"{'1.00×' if kind == 'floor' else f(median_of(rr), 2, '×')} | "
                     f"{'1.00×' if kind == 'floor' else f(median_of(cr), 2, '×')} |"
                     + (f" errors={errors}" if errors else ""))
load_table = "\n".join(lines)

# hyperfine: one export per round; medians of the per-round medians
labels = json.loads(text("hyperfine_labels.json", "{}") or "{}")
hf_rounds = []
for r in range(1, rounds + 1):
    h = js(f"hyperfine_r{r}.json")
    hf_rounds.append({x["command"]: x for x in h.get("results", [])} if h else {})
cmd_ms = {label: [hr[cmd]["median"] * 1000 for hr in hf_rounds if cmd in hr] for label, cmd in labels.items()}
med = {label: statistics.median(v) for label, v in cmd_ms.items() if v}


def cmd_ratio(a, b):
    """Per-round ratio of two commands' medians, then the median of those."""
    out = []
    for hr in hf_rounds:
        ca, cb = labels.get(a), labels.get(b)
        if ca in hr and cb in hr and hr[cb]["median"]:
            out.append(hr[ca]["median"] / hr[cb]["median"])
    return out


hl = ["| Command | median ms | min ms | σ ms (last round) | runs | vs /bin/true |", "|---|---:|---:|---:|---:|---:|"]
for label, cmd in labels.items():
    rs = [hr[cmd] for hr in hf_rounds if cmd in hr]
    if not rs:
        hl.append(f"| {label} | not measured | | | | |")
        continue
    hl.append(f"| {label} | {spread(cmd_ms[label], 2)} | {min(x['min'] for x in rs) * 1000:.2f} | "
              f"{rs[-1]['stddev'] * 1000:.2f} | {sum(len(x['times']) for x in rs)} | "
              f"{f(median_of(cmd_ratio(label, '/bin/true')), 1, '×')} |")
for label in json.loads(text("hyperfine_missing.json", "[]") or "[]"):
    hl.append(f"| {label} | not measured (not installed) | | | | |")
cmd_table = "\n".join(hl)

fans = [x for x in (js(f"fanout_r{r}.json") for r in range(1, rounds + 1)) if x]
fan = fans[0] if fans else None
fan_ms = [k for x in fans for k in x.get("kicks_ms", [])]
reply_ms = [k for x in fans for k in x.get("forcelogout_reply_ms", [])]
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

st["oauth2"] = js("startup_oauth2.json")
rss0, rss100, rssn = stmed("0", "rss_kb"), stmed("100", "rss_kb"), stmed(str(nsess), "rss_kb")
rss_oauth2 = stmed("oauth2", "rss_kb")
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
tput_r, cpu_r = ratios("gettoken", 32, "rps"), ratios("gettoken", 32, "cpu_us_per_req")
tput, cpu = median_of(tput_r), median_of(cpu_r)
p99_r = [r.get("p99_us") for r in runs[("gettoken", 32)] if r]
p99 = median_of(p99_r)
floor_p99 = load_median("floor", 32, "p99_us")
vt_gc = median_of(cmd_ratio("vaultctl token", "git credential fill (credential-cache)"))
vt_st = median_of(cmd_ratio("vaultctl token", "secret-tool lookup"))
tg = [
    ("GetToken req/s at 32 conns ≥ 67% of the floor (issue 12; issue 6 asked 50%)", spread(tput_r, 0, 100, "%"), met(tput >= 0.67) if tput is not None else "—"),
    ("Server CPU per GetToken ≤ 1.5× floor per echo (issue 12; issue 6 asked 2.5×)", spread(cpu_r, 2, 1, "×"), met(cpu <= 1.5) if cpu is not None else "—"),
    ("GetToken p99 at 32 conns ≤ 1 ms", spread(p99_r, 2, 0.001, " ms") + (f"; the floor's own p99: {floor_p99/1000:.2f} ms" if floor_p99 else ""), met(p99 <= 1000) if p99 is not None else "—"),
    ("`vaultctl token` ≤ 1.5× `git credential fill` (cache)", spread(cmd_ratio("vaultctl token", "git credential fill (credential-cache)"), 2, 1, "×"), met(vt_gc <= 1.5) if vt_gc else "—"),
    ("`vaultctl token` ≤ 1/5 of `secret-tool lookup`", spread(cmd_ratio("vaultctl token", "secret-tool lookup"), 2, 1, "×"), met(vt_st <= 0.2) if vt_st else "—"),
    ("Fan-out to 1,000 subscribers: last delivery ≤ 50 ms", f"p50 {f(fan_p50,1)} ms, max {f(fan_max,1)} ms" + (f" ({fan['subscribers']} subscribers)" if fan else ""), met(fan_max <= 50) if fan_max is not None else "—"),
    ("Idle vaultd ≤ 20 MB RSS", f"{rss0/1024:.1f} MB" if rss0 else "not measured", met(rss0 <= 20 * 1024) if rss0 else "—"),
    ("≤ 4 KB RSS per additional session", f"{per_sess/1024:.2f} KB" if per_sess is not None else "not measured", met(per_sess <= 4096) if per_sess is not None else "—"),
    ("Idle CPU with 100,000 scheduled sessions ≤ 1% of a core", idle_measured,
     (met(idle_pct <= 1.0) if idle_ok and idle_n >= 100000 else "— (fewer sessions than the target names)"
      if idle_ok else "—")),
]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clitoken_report  # noqa: E402  (issue 15: vaultctl token against git-credential-cache get)
if clitoken_report.target(rd):
    tg.append(clitoken_report.target(rd))
cli_section = clitoken_report.section(rd)
tt = ["| Target | Measured | |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in tg]
target_table = "\n".join(tt)

scale = ["| Figure | Value |", "|---|---|",
         f"| Start-up to `ready`, 0 sessions | {f(stmed('0','ready_ms'), 1, ' ms')} |",
         f"| Start-up to `ready`, 100 sessions | {f(stmed('100','ready_ms'), 1, ' ms')} |",
         f"| Start-up to `ready`, {nsess:,} sessions | {f(stmed(str(nsess),'ready_ms'), 1, ' ms')} |",
         f"| RSS idle, 0 sessions | {f(rss0 and rss0/1024, 1, ' MB')} |",
         f"| RSS idle, 0 sessions, an oauth2 provider configured (libcurl and its TLS stack loaded) | {f(rss_oauth2 and rss_oauth2/1024, 1, ' MB')} |",
         f"| RSS, 100 sessions | {f(rss100 and rss100/1024, 1, ' MB')} |",
         f"| RSS, {nsess:,} sessions | {f(rssn and rssn/1024, 1, ' MB')} |",
         f"| RSS per additional session | {f(per_sess and per_sess/1024, 2, ' KB')} |",
         f"| One Login (keyring write), store at ~50 items | {f(login_50, 1, ' ms')} |",
         f"| One Login (keyring write), store at ~{nsess:,} items | {f(login_n, 1, ' ms')} |",
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
    fan_txt = (f"{fan['subscribers']} subscribers, {len(fan_ms)} kicks over {len(fans)} round(s): last delivery "
               f"p50 {f(fan_p50,1)} ms, max {f(fan_max,1)} ms (each: {', '.join(f'{x:.1f}' for x in fan_ms)} ms). "
               f"The `ForceLogout` reply, which waits for the secret store: p50 {f(median_of(reply_ms),1)} ms, "
               f"max {f(max(reply_ms) if reply_ms else None,1)} ms.")
    errors = [e for x in fans for e in x.get("errors", [])]
    if errors:
        fan_txt += f"; errors: {'; '.join(errors[:3])}"

# plot
png = os.path.join(docs, "bench-latency.png")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for kind, style in (("gettoken", "-"), ("floor", ":")):
        for c in conns:
            p = os.path.join(rd, f"lat_{kind}_{c}_r{rounds}.txt")
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
    ax.set_title(f"GetToken latency CDF per concurrency level, round {rounds} (dotted: C floor)")
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

Generated by `scripts/bench{' --quick' if mode == 'quick' else ''}` on {text('date.txt')}{', quick mode (smaller counts, shorter runs)' if mode == 'quick' else ''}. The
machine is shared and noisy, so the load, command and fan-out runs are made
{rounds} time(s) ("rounds"), the C floor and vaultd in turn within each round;
tables quote the median over the rounds, and a ratio is taken within each round
(vaultd against the floor measured minutes apart on the same machine) before
its median is taken. Read the ratios, not the last digit.

## Machine

{machine}

## Targets (issues 6 and 12)

{target_table}

## Request/response over the Unix socket

vaultd holds {nsess:,} logged-in sessions (demo provider, static tokens). Each
row is `bench/load_client` with one thread per connection in a
request/response loop: {params}. Server CPU is utime+stime of the server
process from `/proc/PID/stat` over the timed run, divided by the requests it
served (10 ms tick resolution). vaultd's stderr is a pipe that a reader
drains (as journald's stream would be). Its audit trail writes the first
GetToken of a kind (uid, pid, account, result) at once and counts the
repeats, written as one `count=` line per 10 s (see [SECURITY.md](SECURITY.md), "Audit lines"), so a load
row writes a few lines, not one per call. (Under systemd, with
`JOURNAL_STREAM` set, each audit line is one datagram to journald instead;
that path is not measured here.) The floor is `bench/echo_server` (C,
thread per connection) answering every NUL-terminated message with a
100-byte reply, the size of a GetToken reply; the client and server share the
machine's {text('nproc.txt')} CPUs, so at 32 and 256 connections the client's
own threads compete with the server.

{load_table}

{plot_note}

## Whole-command latency

hyperfine, `--warmup 3`, `-N` (no shell) where possible, {text('hyperfine_runs.txt','30')} runs of each
command per round; the median column is the median of the rounds' medians.
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
D-Bus buffers grow with it. (Its empty RSS includes libcurl, which vaultd
loads for the oauth2 provider.)

{scale_table}

{cli_section}

## Method

- `scripts/bench` builds vaultd and vaultctl (release, static Swift runtime, as
  `scripts/run` and `scripts/install` do), compiles
  `bench/echo_server.c` and `bench/load_client.c` with `gcc -O2`, starts a
  private D-Bus + gnome-keyring (`scripts/lib/keyring.sh`), and stops every
  process it starts on exit.
- Sessions are logged in through one connection, one `Login` at a time
  (`bench/vutil.py`).
- Per load row: warm-up, then the timed run; latencies of every request of the
  timed run go to a file for the CDF (the plot shows the last round).
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
