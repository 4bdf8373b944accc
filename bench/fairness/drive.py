#!/usr/bin/env python3
"""bench/fairness driver: one run of light senders, a burst, or both.

Light clients: LIGHT connections, each from its own loopback address
(127.0.0.11, .12, ...), each sending one message every INTERVAL seconds to
the light mailbox, the send time in an X-Bench-Sent header.  The burst:
Postfix's smtp-source from 127.0.0.1, BURST messages to the heavy mailbox.
A message's latency runs from the start of its send to its file's mtime in
the maildir (written by relay-to-maildir, renamed into new/ unchanged).

Prints one line: mode, the light messages' latency median and p99 (of the
ones sent while the burst was in flight, when there is one), their count,
the largest, and the burst's throughput in messages per second.
"""
import argparse
import os
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


def wait_count(mailbox, count, deadline):
    while time.time() < deadline:
        if len(maildir_files(mailbox)) >= count:
            return True
        time.sleep(0.1)
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
            sent.append(at)
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
    """(sent, latency) of every light message delivered."""
    out = []
    for path in maildir_files(mailbox):
        with open(path, "rb") as f:
            head = f.read(4096)
        for line in head.split(b"\n"):
            if line.lower().startswith(b"x-bench-sent:"):
                sent = float(line.split(b":", 1)[1])
                out.append((sent, os.stat(path).st_mtime - sent))
                break
    return out


def percentile(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def main():
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
    args = ap.parse_args()
    light_box = os.path.join(args.maildir, args.light_rcpt)
    heavy_box = os.path.join(args.maildir, args.heavy_rcpt)

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
        if not wait_count(heavy_box, args.burst, burst_start + 600):
            print("the burst did not arrive within 600 s", file=sys.stderr)
            source.kill()
            return 1
        source.wait()
        burst_end = max(os.stat(p).st_mtime for p in maildir_files(heavy_box))
    else:
        time.sleep(args.light_seconds)
    stop.set()
    for t in threads:
        t.join()

    rate = args.burst / (burst_end - burst_start) if burst_start else float("nan")
    lat = []
    if threads:
        if not wait_count(light_box, len(sent), time.time() + 300):
            print("only %d of %d light messages arrived" % (len(maildir_files(light_box)), len(sent)),
                  file=sys.stderr)
            return 1
        lat = [l for s, l in latencies(light_box)
               if burst_start is None or burst_start <= s <= burst_end]
    print("%s median=%.4f p99=%.4f n=%d max=%.4f rate=%.1f" % (
        args.mode, percentile(lat, 0.5), percentile(lat, 0.99), len(lat),
        max(lat) if lat else float("nan"), rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
