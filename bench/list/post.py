#!/usr/bin/env python3
# bench/list/post.py PORT COUNT LIST SIZE: COUNT posts of about SIZE bytes
# to LIST, over one SMTP session to 127.0.0.1:PORT, each with its own
# Message-ID; exits non-zero unless every post was accepted with 250.
import smtplib
import sys
import time

port, count, rcpt, size = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
line = "x" * 76 + "\r\n"
body = line * max(1, size // len(line))
with smtplib.SMTP("127.0.0.1", port, timeout=120) as s:
    s.ehlo("poster.bench.test")
    for i in range(count):
        msg = (f"From: Poster <poster@poster.bench.test>\r\nTo: <{rcpt}>\r\n"
               f"Subject: bench post {i}\r\nMessage-ID: <bench-{port}-{i}-{time.time_ns()}@poster.bench.test>\r\n"
               "Date: Sun, 6 Dec 2026 12:00:00 +0000\r\nMIME-Version: 1.0\r\n"
               "Content-Type: text/plain; charset=us-ascii\r\n\r\n" + body)
        s.sendmail("poster@poster.bench.test", [rcpt], msg.encode("ascii"))
