#!/usr/bin/python3
# bench/ingress-attack/load.py PORT SECONDS NORMAL ATTACKERS NORMAL.eml [ATTACK.eml]
#
# NORMAL sessions send NORMAL.eml over and over for SECONDS, each
# transaction timed from MAIL FROM to the 250 that accepts its content;
# ATTACKERS sessions meanwhile send ATTACK.eml in a loop.  Prints one line:
#   normal=N rate=MSG_PER_S p50=MS p99=MS attack=N attack_replies=CODE:N,...
# The files are the messages' bytes (CRLF lines); dot-stuffing is done here.
import asyncio
import collections
import sys
import time


def stuffed(path):
    data = open(path, "rb").read()
    if data.startswith(b"."):
        data = b"." + data
    return data.replace(b"\r\n.", b"\r\n..") + (b"" if data.endswith(b"\r\n") else b"\r\n") + b".\r\n"


async def reply(reader):
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("connection closed")
        if line[3:4] != b"-":
            return line


async def command(reader, writer, line):
    writer.write(line + b"\r\n")
    await writer.drain()
    return await reply(reader)


waits = []


async def session(port, message, deadline, latencies, replies, sender):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await reply(reader)
    await command(reader, writer, b"EHLO client.bench.example")
    while time.monotonic() < deadline:
        start = time.monotonic()
        await command(reader, writer, b"MAIL FROM:<" + sender + b">")
        await command(reader, writer, b"RCPT TO:<rcpt@example.net>")
        if not (await command(reader, writer, b"DATA")).startswith(b"354"):
            await command(reader, writer, b"RSET")
            continue
        writer.write(message)
        await writer.drain()
        sent = time.monotonic()
        final = await reply(reader)
        if latencies is not None and final.startswith(b"250"):
            waits.append(time.monotonic() - sent)
        replies[final[:3].decode()] += 1
        if latencies is not None and final.startswith(b"250"):
            latencies.append(time.monotonic() - start)
    await command(reader, writer, b"QUIT")
    writer.close()


async def main():
    port, seconds, normal, attackers = (int(a) for a in sys.argv[1:5])
    normal_message = stuffed(sys.argv[5])
    attack_message = stuffed(sys.argv[6]) if attackers else b""
    latencies = []
    normal_replies = collections.Counter()
    attack_replies = collections.Counter()
    started = time.monotonic()
    deadline = started + seconds
    tasks = [session(port, attack_message, deadline, None, attack_replies, b"attacker@evil.bench.example")
             for _ in range(attackers)]
    # The attackers first, so every normal transaction runs beside them.
    if attackers:
        await asyncio.sleep(0.5)
        deadline += 0.5
    tasks += [session(port, normal_message, deadline, latencies, normal_replies, b"sender@d1.bench.example")
              for _ in range(normal)]
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - started - (0.5 if attackers else 0)
    latencies.sort()

    def pct(p):
        return 1000 * latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else float("nan")

    waits.sort()
    print("normal=%d rate=%.1f p50=%.2f p99=%.2f dot_p50=%.2f refused=%d attack=%d attack_replies=%s load_cpu=%.2f" % (
        len(latencies), len(latencies) / elapsed, pct(0.50), pct(0.99),
        1000 * waits[len(waits) // 2] if waits else float("nan"),
        sum(n for code, n in normal_replies.items() if code != "250"),
        sum(attack_replies.values()),
        ",".join("%s:%d" % kv for kv in sorted(attack_replies.items())) or "-", time.process_time()))


asyncio.run(main())
