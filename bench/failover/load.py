#!/usr/bin/env python3
"""bench/failover's load: SESSIONS parallel SMTP sessions, each sending
messages of SIZE bytes (one recipient) for DURATION seconds, each message
tagged (Subject: TAG) so the sink's copies can be matched with the 250s.

A session keeps its connection; a message answered 4xx, or whose
connection fails, is sent again (the same tag, as a client's retry) on a
new connection, to the next of the TARGETS (host:port,host:port: the MX
hosts in order of preference) when the connection could not be made.

It writes one line per event to OUT, "kind epoch_seconds tag":
  S  the final dot sent (the message is in flight until its answer)
  A  answered 250 (accepted)
  F  answered otherwise or no answer (it will be sent again)
"""
import argparse
import smtplib
import socket
import threading
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--sessions', type=int, default=20)
    ap.add_argument('--size', type=int, default=2048)
    ap.add_argument('--duration', type=float, required=True)
    ap.add_argument('--targets', required=True)
    ap.add_argument('--prefix', default='m')
    ap.add_argument('--out', required=True)
    args = ap.parse_args()
    targets = [(t.rsplit(':', 1)[0], int(t.rsplit(':', 1)[1])) for t in args.targets.split(',')]
    stop_at = time.time() + args.duration
    events = []
    lock = threading.Lock()
    filler = ('x' * 76 + '\r\n') * (args.size // 78 + 1)

    def record(kind, tag):
        with lock:
            events.append('%s %.3f %s' % (kind, time.time(), tag))

    def session(number):
        smtp = None
        target = 0
        n = 0
        tag = None
        while time.time() < stop_at:
            if tag is None:
                n += 1
                tag = '%s-%02d-%06d' % (args.prefix, number, n)
            if smtp is None:
                try:
                    smtp = smtplib.SMTP(*targets[target], local_hostname='load.bench.test', timeout=10)
                    smtp.ehlo()
                except (OSError, smtplib.SMTPException):
                    smtp = None
                    target = (target + 1) % len(targets)
                    time.sleep(0.1)
                    continue
            head = ('From: <sender@example.org>\r\nTo: <rcpt@example.net>\r\nSubject: %s\r\n'
                    'Message-ID: <%s@load.bench.test>\r\n\r\n' % (tag, tag))
            body = (head + filler)[:args.size]
            try:
                code, _ = smtp.mail('sender@example.org')
                if code == 250:
                    code, _ = smtp.rcpt('rcpt@example.net')
                if code == 250:
                    code, _ = smtp.docmd('DATA')
                    if code == 354:
                        smtp.send(body.encode() + b'\r\n.\r\n')
                        record('S', tag)
                        code, _ = smtp.getreply()
                    else:
                        code = 0
                if code == 250:
                    record('A', tag)
                    tag = None
                    continue
                record('F', tag)
                try:
                    smtp.rset()
                except (OSError, smtplib.SMTPException):
                    smtp.close()
                    smtp = None
                time.sleep(0.1)
            except (OSError, smtplib.SMTPException, socket.timeout):
                record('F', tag)
                try:
                    smtp.close()
                except OSError:
                    pass
                smtp = None
                time.sleep(0.1)
        if smtp is not None:
            try:
                smtp.quit()
            except (OSError, smtplib.SMTPException):
                pass

    threads = [threading.Thread(target=session, args=(i,)) for i in range(args.sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(args.out, 'w') as f:
        f.write('\n'.join(events) + '\n')


if __name__ == '__main__':
    main()
