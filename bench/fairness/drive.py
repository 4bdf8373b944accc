#!/usr/bin/env python3
"""bench/fairness driver: one run of light senders, a burst, or both.

Light clients: LIGHT connections, each from its own loopback address
(127.0.0.11, .12, ...), each sending one message every INTERVAL seconds to
the light mailbox, the send time in an X-Bench-Sent header.  The burst:
Postfix's smtp-source from 127.0.0.1, BURST messages to the heavy mailbox.
A message's latency runs from the start of its send to its delivery: the
statement that committed it as delivered, its file already renamed into
the maildir's new/ (bench_trace's "deleted", clock_timestamp() on the
clock the send time was read from).  A file's mtime would do only at
whole ticks: here it came out 0 to 6 ms after the time read just before
the write, about the light messages' whole latency alone; it stays the
fallback when no trace is given (no --psql), and for the burst's end,
where a tick is nothing against its seconds.

Prints one line: mode, the light messages' latency median and p99 (of the
ones sent while the burst was in flight, when there is one), their count,
the largest, and the burst's throughput in messages per second; then, for
those same light messages, where their time went (medians, in seconds):

  accept      the send, from its start to the 250 reply to DATA
  admit       from the start of the send to the row's INSERT
  STAGE.wait  pending at STAGE until a claim set it running (claim wait)
  STAGE.run   from that claim to the commit that moved it on: the rows
              ahead of it in its worker's pipeline, then its own pass
              (its fused successors included) and commit
  STAGE.svc   the stage's mean worker time per row over the run (all
              senders), from pepsi.stage_stats: STAGE.run minus this is
              about the wait in the pipeline
  deliver     from the final commit to the maildir file's mtime

The row times come from bench_trace, filled by a trigger on
pepsi.workqueue for rows of senders other than the burst's (run.sh).

For the burst: burst.accept, from its start until smtp-source is done,
and burst.drain, from then until its last message is in the maildir.

And what the run cost the database, for all its messages (light and
burst), from pg_stat_statements and pg_stat_database over the run:

  claims/msg    the dispatcher's workqueue_claim calls per message
  rows/claim    rows those claims returned, per claim
  claim.ms      the server's time per claim (mean_exec_time)
  commits/msg   worker commits (workqueue_commit_many and workqueue_commit
                calls) per message: a message makes one per hop not fused,
                divided by the rows each commit carries
  commit.ms     the server's time per worker commit
  xact/msg      pg_stat_database.xact_commit per message

And what it cost the machine: cpu.ms/msg, the CPU time every process
used (/proc/stat, this driver included) from the start of the run to its
last delivery, per message; a light message costs far more than one of
the burst (it runs alone through every stage), so this tells the burst's
loss to the light clients' own work from a loss to how they are served;
and light.ms/msg, the part of it this driver used (its light clients'
sending, and its polling of the mailboxes), per light message: on the
machine the system runs on, the clients compete with it, as the burst's
smtp-source does in both runs.  And steal.s, the seconds of CPU the
hypervisor gave to others over the run while this machine's had work:
on a shared machine, what tells a run slowed from outside.
"""
import argparse
import os
import shlex
import smtplib
import subprocess
import sys
import threading
import time


def maildir_files(mailbox):
    out = []
    for sub in ("new", "cur"):
        path = os.path.join(mailbox, sub)
        with os.scandir(path) as entries:
            out.extend(e.path for e in entries if e.is_file())
    return out


def wait_count(mailbox, count, deadline, interval=0.1):
    """Listing a mailbox of the burst's size costs milliseconds of CPU
    (and the GIL the light clients' threads need to send), so the burst's
    is listed only every interval, and not while it is being sent."""
    while time.time() < deadline:
        if len(maildir_files(mailbox)) >= count:
            return True
        time.sleep(interval)
    return False


def light_client(index, args, stop, sent):
    source = "127.0.0.%d" % (11 + index)
    start = time.time() + index * args.interval / args.light
    smtp = None
    n = 0
    while not stop.is_set():
        due = start + n * args.interval
        delay = due - time.time()
        if delay > 0:
            time.sleep(delay)
        if stop.is_set():
            break
        at = time.time()
        body = ("From: light%d@example.net\r\nTo: %s\r\nSubject: light %d %d\r\n"
                "X-Bench-Sent: %.6f\r\n\r\nlight message\r\n" % (index, args.light_rcpt, index, n, at))
        try:
            if smtp is None:
                smtp = smtplib.SMTP("127.0.0.1", args.port, source_address=(source, 0), timeout=120)
                smtp.ehlo("light%d.example.net" % index)
            smtp.sendmail("light%d@example.net" % index, [args.light_rcpt], body)
            sent.append((at, time.time() - at))
        except (smtplib.SMTPException, OSError) as e:
            print("light client %d: %s" % (index, e), file=sys.stderr)
            smtp = None
        n += 1
    if smtp is not None:
        try:
            smtp.quit()
        except (smtplib.SMTPException, OSError):
            pass


def latencies(mailbox):
    """(sent, latency, mtime) of every light message delivered."""
    out = []
    for path in maildir_files(mailbox):
        with open(path, "rb") as f:
            head = f.read(4096)
        for line in head.split(b"\n"):
            if line.lower().startswith(b"x-bench-sent:"):
                sent = float(line.split(b":", 1)[1])
                mtime = os.stat(path).st_mtime
                out.append((sent, mtime - sent, mtime))
                break
    return out


def trace_delivered(args):
    """send time (as in the header, to the microsecond) -> when the row
    was deleted as delivered, from bench_trace."""
    return {round(float(sent), 6): float(at) for sent, at in psql(
        args, "SELECT i.sent, d.at FROM bench_trace i JOIN bench_trace d USING (id)"
              " WHERE i.sent IS NOT NULL AND d.status = 'deleted'")}


def cpu_seconds():
    """CPU time used by the whole machine so far (user, nice, system, irq,
    softirq), and the time the hypervisor gave the machine's CPUs to
    others while they had work (steal)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    ticks = sum(int(fields[i]) for i in (0, 1, 2, 5, 6))
    steal = int(fields[7]) if len(fields) > 7 else 0
    return ticks / os.sysconf("SC_CLK_TCK"), steal / os.sysconf("SC_CLK_TCK")


def psql(args, sql):
    """Rows of one query, through the --psql command, as lists of strings."""
    out = subprocess.run(shlex.split(args.psql) + ["-XAtq", "-F", "\t", "-c", sql],
                         check=True, capture_output=True, text=True).stdout
    return [line.split("\t") for line in out.splitlines() if line]


def stage_totals(args):
    """stage -> (messages, worker seconds) from pepsi.stage_stats."""
    return {r[0]: (int(r[1]), float(r[2])) for r in psql(
        args, "SELECT stage, messages, extract(epoch FROM processing_time)"
              " FROM pepsi.stage_stats")}


def cost_start(args):
    """Reset pg_stat_statements; return xact_commit so far."""
    psql(args, "SELECT pg_stat_statements_reset()")
    return int(psql(args, "SELECT xact_commit FROM pg_stat_database"
                          " WHERE datname = current_database()")[0][0])


def cost_fields(args, xact_before, messages):
    """The run's database cost (see the file comment) as key=value fields."""
    time.sleep(1.2)  # backends report xact_commit within a second of going idle
    xact = int(psql(args, "SELECT xact_commit FROM pg_stat_database"
                          " WHERE datname = current_database()")[0][0])
    claims, claimed, claim_ms, commits, commit_ms = (float(v or 0) for v in psql(
        args, "SELECT sum(calls) FILTER (WHERE query ~ 'workqueue_claim(_tokens)?\\('),"
              " sum(rows) FILTER (WHERE query ~ 'workqueue_claim(_tokens)?\\('),"
              " sum(total_exec_time) FILTER (WHERE query ~ 'workqueue_claim(_tokens)?\\('),"
              " sum(calls) FILTER (WHERE query ~ 'workqueue_commit(_many)?\\('),"
              " sum(total_exec_time) FILTER (WHERE query ~ 'workqueue_commit(_many)?\\(')"
              " FROM pg_stat_statements")[0])
    out = ["claims/msg=%.3f" % (claims / messages), "rows/claim=%.2f" % (claimed / max(claims, 1)),
           "claim.ms=%.2f" % (claim_ms / max(claims, 1))]
    if commits:
        out.append("commits/msg=%.3f" % (commits / messages))
        out.append("commit.ms=%.2f" % (commit_ms / commits))
    out.append("xact/msg=%.2f" % ((xact - xact_before) / messages))
    return " ".join(out)


def wait_stats_flush(args, after, deadline):
    """The dispatcher writes its statistics soon after the pipeline idles."""
    while time.time() < deadline:
        rows = psql(args, "SELECT coalesce(extract(epoch FROM max(updated_at)), 0)"
                          " FROM pepsi.stage_stats")
        if rows and float(rows[0][0]) >= after:
            return
        time.sleep(0.1)


def breakdown(args, in_window, accepts, mtimes, totals_before):
    """Medians of where the light messages' time went (see the file comment).
    Messages are known by their send time, which their header carries to
    the microsecond: the key that joins a file, its trace rows and its
    accept time."""
    events = {}
    for row_id, stage, status, sent, at in psql(
            args, "SELECT id, stage, status, coalesce(sent::text, ''), at"
                  " FROM bench_trace ORDER BY id, at"):
        events.setdefault(row_id, []).append((stage, status, round(float(sent), 6) if sent else None,
                                              float(at)))
    parts = {}
    order = []

    def add(key, value):
        if key not in parts:
            parts[key] = []
            order.append(key)
        parts[key].append(value)

    slowest = []
    for row_events in events.values():
        sent = row_events[0][2]
        if sent is None or not in_window(sent):
            continue
        mine = []
        if sent in accepts:
            mine.append(("accept", accepts[sent]))
        mine.append(("admit", row_events[0][3] - sent))
        for i, (stage, status, _, at) in enumerate(row_events):
            if status != "running" or i == 0:
                continue
            mine.append((stage + ".wait", at - row_events[i - 1][3]))
            if i + 1 < len(row_events):
                mine.append((stage + ".run", row_events[i + 1][3] - at))
        if row_events[-1][1] == "deleted" and sent in mtimes:
            mine.append(("deliver", mtimes[sent] - row_events[-1][3]))
        for key, value in mine:
            add(key, value)
        slowest.append((row_events[-1][3] - sent, sent, mine))
    # The few slowest, part by part: an outlier's cause is not in the medians.
    for total, sent, mine in sorted(slowest, reverse=True)[:3]:
        print("  slowest light: %.4f s, sent at %.3f: %s" % (
            total, sent, " ".join("%s=%.4f" % kv for kv in mine)), file=sys.stderr)
    fields = ["%s=%.4f" % (k, percentile(parts[k], 0.5)) for k in order]
    totals = stage_totals(args)
    for stage in sorted({k.split(".")[0] for k in order if "." in k}):
        before = totals_before.get(stage, (0, 0.0))
        after = totals.get(stage, before)
        if after[0] > before[0]:
            fields.append("%s.svc=%.4f" % (stage, (after[1] - before[1]) / (after[0] - before[0])))
    return " ".join(fields)


def percentile(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summary(lines):
    """The median over runs of every key=value a run's line printed after
    its first five fields, on one line: where the time went, typically."""
    values = {}
    order = []
    for line in lines:
        for field in line.split()[6:]:
            key, _, value = field.partition("=")
            if key not in values:
                values[key] = []
                order.append(key)
            values[key].append(float(value))
    return " ".join("%s=%.4f" % (k, percentile(values[k], 0.5)) for k in order)


def diagnose(path):
    """One line from a run's samples (run.sh's sampler, sample.sql): the
    longest anyone held back the xmin horizon and who, the queue table's
    dead versions and vacuums, the rows running and pending, the claim's
    worst second; then the likeliest cause of a slow claim among them: a
    snapshot held for seconds keeps every dead version of a queue row
    from being pruned or its index entry killed, so every claim's index
    scan walks them all."""
    rows = []
    with open(path) as f:
        for line in f:
            v = line.rstrip("\n").split("\t")
            if len(v) == 13:
                try:
                    rows.append([float(x) if i != 3 else x for i, x in enumerate(v)])
                except ValueError:
                    pass
    if not rows:
        return "no samples"
    t, xmin_age, xact_s, holder, longest, dead, live, av, aa, running, pending, calls, total = range(13)
    held = max(rows, key=lambda r: r[xact_s])
    worst = (0.0, 0)
    for a, b in zip(rows, rows[1:]):
        if b[calls] > a[calls]:
            worst = max(worst, ((b[total] - a[total]) / (b[calls] - a[calls]), int(b[calls] - a[calls])))
    most_dead = max(r[dead] for r in rows)
    most_running = max(r[running] for r in rows)
    vacuums = rows[-1][av] - rows[0][av]
    analyzes = rows[-1][aa] - rows[0][aa]
    if held[xact_s] >= 5:
        cause = "xmin held back %.0f s by %s" % (held[xact_s], held[holder])
    elif most_running > 2000:
        cause = "many rows held running (%d)" % most_running
    else:
        cause = "no xmin held >= 5 s, no pile of running rows: look at the dead versions and plans"
    return ("%d samples; oldest xmin %d xids, held %.1f s by %s; longest transaction %.1f s;"
            " workqueue dead <= %d, live <= %d,"
            " autovacuum +%d, autoanalyze +%d; running <= %d, pending <= %d;"
            " claim's worst second %.2f ms/call (%d calls); cause: %s" % (
                len(rows), max(r[xmin_age] for r in rows), held[xact_s], held[holder],
                max(r[longest] for r in rows), most_dead,
                max(r[live] for r in rows), vacuums, analyzes, most_running,
                max(r[pending] for r in rows), worst[0], worst[1], cause))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "summary":
        print(summary(sys.argv[2:]))
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "diagnose":
        print(diagnose(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["light", "burst", "both"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--maildir", required=True)
    ap.add_argument("--light", type=int, default=10)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--light-seconds", type=float, default=10)
    ap.add_argument("--burst", type=int, default=20000)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--lead", type=float, default=2.0, help="light traffic before the burst")
    ap.add_argument("--light-rcpt", default="light@example.org")
    ap.add_argument("--heavy-rcpt", default="heavy@example.org")
    ap.add_argument("--psql", help="psql command line for the benchmark's database"
                                   " (to read bench_trace and pepsi.stage_stats)")
    args = ap.parse_args()
    light_box = os.path.join(args.maildir, args.light_rcpt)
    heavy_box = os.path.join(args.maildir, args.heavy_rcpt)

    totals_before = stage_totals(args) if args.psql else {}
    xact_before = cost_start(args) if args.psql else 0
    cpu_before = cpu_seconds()
    driver_before = time.process_time()
    stop = threading.Event()
    sent = []
    threads = []
    if args.mode in ("light", "both"):
        for i in range(args.light):
            t = threading.Thread(target=light_client, args=(i, args, stop, sent), daemon=True)
            t.start()
            threads.append(t)

    burst_start = burst_end = None
    if args.mode in ("burst", "both"):
        if args.mode == "both":
            time.sleep(args.lead)
        burst_start = time.time()
        source = subprocess.Popen(
            ["/usr/sbin/smtp-source", "-d", "-s", str(args.sessions), "-m", str(args.burst),
             "-l", "2048", "-f", "heavy@example.net", "-t", args.heavy_rcpt,
             "127.0.0.1:%d" % args.port], stdout=subprocess.DEVNULL)
        try:
            source.wait(timeout=600)
        except subprocess.TimeoutExpired:
            source.kill()
        accepted = time.time()
        if not wait_count(heavy_box, args.burst, burst_start + 600, 0.25):
            print("the burst did not arrive within 600 s", file=sys.stderr)
            return 1
        burst_end = max(os.stat(p).st_mtime for p in maildir_files(heavy_box))
    else:
        time.sleep(args.light_seconds)
    stop.set()
    for t in threads:
        t.join()
    light_arrived = not threads or wait_count(light_box, len(sent), time.time() + 300)
    cpu_now = cpu_seconds()
    cpu_used = cpu_now[0] - cpu_before[0]
    steal = cpu_now[1] - cpu_before[1]
    driver_used = time.process_time() - driver_before

    rate = args.burst / (burst_end - burst_start) if burst_start else float("nan")
    def in_window(s):
        return burst_start is None or burst_start <= s <= burst_end

    lat = []
    parts = ""
    cost = ""
    if threads:
        if not light_arrived:
            print("only %d of %d light messages arrived" % (len(maildir_files(light_box)), len(sent)),
                  file=sys.stderr)
            return 1
        delivered = latencies(light_box)
        done = trace_delivered(args) if args.psql else {}
        delivered = [(round(s, 6), done[round(s, 6)] - s if round(s, 6) in done else l, m)
                     for s, l, m in delivered]
        lat = [l for s, l, _ in delivered if in_window(s)]
        if args.psql:
            # The statistics are written once the pipeline idles after its last delivery.
            wait_stats_flush(args, max([m for _, _, m in delivered] + [burst_end or 0]),
                             time.time() + 5)
            parts = " " + breakdown(args, in_window,
                                    {round(at, 6): accept for at, accept in sent},
                                    {s: m for s, _, m in delivered}, totals_before)
    if burst_start:
        cost += " burst.accept=%.2f burst.drain=%.2f" % (accepted - burst_start, burst_end - accepted)
    messages = len(sent) + (args.burst if burst_start else 0)
    if args.psql:
        cost += " " + cost_fields(args, xact_before, messages)
    cost += " cpu.ms/msg=%.3f steal.s=%.2f" % (cpu_used * 1000 / messages, steal)
    if sent:
        cost += " light.ms/msg=%.3f" % (driver_used * 1000 / len(sent))
    print("%s median=%.4f p99=%.4f n=%d max=%.4f rate=%.1f%s%s" % (
        args.mode, percentile(lat, 0.5), percentile(lat, 0.99), len(lat),
        max(lat) if lat else float("nan"), rate, cost, parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
