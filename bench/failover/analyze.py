#!/usr/bin/env python3
"""bench/failover: one run's numbers from load.py's events and the sink's
dumped messages.

  analyze.py EVENTS SINK_DIR EVENT_TIME [UNDELIVERED_FILE]

prints "key=value" words: accepted, lost (answered 250, never delivered),
duplicated (copies delivered beyond the first of each tag), unanswered
(delivered though never answered 250: an admission whose answer was lost
and that the client gave up on), in_flight (messages past their final dot
and not yet answered at EVENT_TIME), gap (the longest time without a 250
from EVENT_TIME to the last 250, s), before and after (acceptance
rates, msg/s, over the 15 s before EVENT_TIME and from 2 s after the gap
to the last 250).  With
UNDELIVERED_FILE, the accepted tags not delivered are written there.
"""
import os
import re
import sys


def main():
    events_file, sink_dir, event = sys.argv[1], sys.argv[2], float(sys.argv[3])
    events = []
    with open(events_file) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3:
                events.append((float(parts[1]), parts[0], parts[2]))
    events.sort()
    accepted = {}
    for when, kind, tag in events:
        if kind == 'A':
            accepted.setdefault(tag, when)
    copies = {}
    subject = re.compile(rb'^Subject: (\S+)', re.M)
    for name in os.listdir(sink_dir):
        with open(os.path.join(sink_dir, name), 'rb') as f:
            for m in subject.finditer(f.read()):
                tag = m.group(1).decode()
                copies[tag] = copies.get(tag, 0) + 1
    lost = sorted(t for t in accepted if t not in copies)
    duplicated = sum(n - 1 for n in copies.values() if n > 1)
    unanswered = sum(1 for t in copies if t not in accepted)
    pending = set()
    for when, kind, tag in events:
        if when >= event:
            break
        if kind == 'S':
            pending.add(tag)
        else:
            pending.discard(tag)
    times = sorted(accepted.values())
    # The longest time without a 250 from the event to the last 250 (the
    # end of the load, where sessions stop, is no gap).
    after_event = [event] + [t for t in times if t >= event]
    gap, resumed = 0.0, event
    for a, b in zip(after_event, after_event[1:]):
        if b - a > gap:
            gap, resumed = b - a, b
    before = sum(1 for t in times if event - 15 <= t < event) / 15.0
    window = after_event[-1] - (resumed + 2)
    after = sum(1 for t in times if t >= resumed + 2) / window if window > 1 else 0.0
    print('accepted=%d lost=%d duplicated=%d unanswered=%d in_flight=%d gap=%.2f before=%.1f after=%.1f'
          % (len(accepted), len(lost), duplicated, unanswered, len(pending), gap, before, after))
    if len(sys.argv) > 4:
        with open(sys.argv[4], 'w') as f:
            f.write(''.join(t + '\n' for t in lost))


if __name__ == '__main__':
    main()
