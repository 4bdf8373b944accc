#!/usr/bin/env python3
"""Fill a Postfix instance through its smtpd: fill-postfix.py HOST PORT MESSAGES SESSIONS.

MESSAGES messages of about 2 KB, one recipient each, spread over 1,000
recipient domains (user<n % 997>@d<n % 1000>.example) and 5,000 senders,
sent over SESSIONS concurrent SMTP sessions.  Prints how long it took;
exits non-zero if a message was refused.
"""
import smtplib
import sys
import threading
import time

host, port, total, sessions = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
line = "x" * 76 + "\r\n"
failures = []


def session(first):
    try:
        smtp = smtplib.SMTP(host, port, timeout=60)
        for n in range(first, total, sessions):
            sender = "sender%d@example.org" % (n % 5000)
            rcpt = "user%d@d%d.example" % (n % 997, n % 1000)
            message = ("From: <%s>\r\nTo: <%s>\r\nSubject: benchmark message %d\r\n"
                       "Message-ID: <%d.bench@example.org>\r\n\r\n" % (sender, rcpt, n, n)) + line * 24
            smtp.sendmail(sender, [rcpt], message)
        smtp.quit()
    except Exception as e:  # noqa: BLE001 - reported, and the run fails
        failures.append("session %d: %s" % (first, e))


start = time.time()
threads = [threading.Thread(target=session, args=(k,)) for k in range(sessions)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
print("postfix: %d messages sent through smtpd in %.1f s" % (total, time.time() - start))
