#!/usr/bin/python3
# The tests' DNS server (started by TestDNS.pm, which documents it): answers
# UDP and TCP on one loopback port from a zone file the test rewrites at
# will (re-read whenever it changes), as a recursive server would, so a
# resolver can forward to it.  Lines of the zone file:
#
#   name TTL IN TYPE data      a record, in master-file syntax (dnslib)
#   ; silent NAME              never answer a query for NAME (any type)
#   ; servfail NAME            answer SERVFAIL for NAME
#   ; garbage NAME             answer NAME with bytes that are no DNS message
#
# Names are absolute; a CNAME is followed within the zone.  A query for a
# name with no record is NXDOMAIN, for a name with records of other types
# only, an empty answer; both carry the SOA record of the name's zone in
# their authority section when the zone file has one, so that resolvers
# cache them (RFC 2308), as they do on the internet.  Usage: testdns.py ZONEFILE PORT [ADDRESS]
# (ADDRESS: where to listen, 127.0.0.1 by default; bench/ uses another).
import os
import socket
import sys
import threading
import time

from dnslib import DNSRecord, QTYPE, RCODE, RR
from dnslib.server import BaseResolver, DNSLogger, DNSServer


class ZoneResolver(BaseResolver):
    def __init__(self, path):
        self.path = path
        self.stamp = None
        self.records = {}
        self.directives = {}
        self.lock = threading.Lock()

    def load(self):
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self.stamp:
            return
        records = {}
        directives = {}
        with open(self.path, encoding="utf-8") as f:
            text = f.read()
        body = []
        for line in text.splitlines():
            words = line.split()
            if len(words) == 3 and words[0] == ";" and words[1] in ("silent", "servfail", "garbage"):
                directives[words[2].rstrip(".").lower()] = words[1]
            elif line.strip() and not line.lstrip().startswith(";"):
                body.append(line)
        for rr in RR.fromZone("\n".join(body)) if body else []:
            key = str(rr.rname).rstrip(".").lower()
            records.setdefault(key, []).append(rr)
        self.records, self.directives, self.stamp = records, directives, stamp

    def soa_for(self, records, name):
        """The SOA record of the closest enclosing zone of name, or None."""
        labels = name.split(".")
        for i in range(len(labels)):
            for rr in records.get(".".join(labels[i:]), []):
                if rr.rtype == QTYPE.SOA:
                    return rr
        return None

    def resolve(self, request, handler):
        with self.lock:
            self.load()
            records, directives = self.records, self.directives
        reply = request.reply()
        reply.header.ra = 1
        qname = str(request.q.qname).rstrip(".").lower()
        qtype = request.q.qtype
        action = directives.get(qname)
        if action == "silent":
            return None
        if action == "servfail":
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        if action == "garbage":
            return "garbage"
        name = qname
        for _ in range(8):
            rrs = records.get(name)
            if rrs is None:
                if name == qname:
                    reply.header.rcode = RCODE.NXDOMAIN
                soa = self.soa_for(records, name)
                if soa is not None:
                    reply.add_auth(soa)
                return reply
            matching = [rr for rr in rrs if rr.rtype == qtype or qtype == QTYPE.ANY]
            if matching:
                for rr in matching:
                    reply.add_answer(rr)
                return reply
            cname = [rr for rr in rrs if rr.rtype == QTYPE.CNAME]
            if not cname:
                soa = self.soa_for(records, name)
                if soa is not None:
                    reply.add_auth(soa)
                return reply
            reply.add_answer(cname[0])
            name = str(cname[0].rdata.label).rstrip(".").lower()
        return reply


class Handler(__import__("dnslib.server", fromlist=["DNSHandler"]).DNSHandler):
    def get_reply(self, data):
        request = DNSRecord.parse(data)
        reply = self.server.resolver.resolve(request, self)
        if reply is None:
            raise SilentQuery()
        if reply == "garbage":
            # A header claiming answers that are not there, then noise.
            return data[:2] + b"\x81\x80\x00\x01\x00\x05\x00\x00\x00\x00\xff\xfe\xfd"
        rdata = reply.pack()
        if self.protocol == "udp" and len(rdata) > 512:
            rdata = reply.truncate().pack()
        return rdata

    def handle(self):
        try:
            super().handle()
        except SilentQuery:
            pass


class SilentQuery(Exception):
    pass


class QuietLogger(DNSLogger):
    def __init__(self):
        super().__init__("-request,-reply,-truncated,-data,-recv,-send,-error", False)


def main():
    zone, port = sys.argv[1], int(sys.argv[2])
    address = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"
    resolver = ZoneResolver(zone)
    logger = QuietLogger()
    servers = [
        DNSServer(resolver, address=address, port=port, logger=logger, handler=Handler),
        DNSServer(resolver, address=address, port=port, tcp=True, logger=logger, handler=Handler),
    ]
    for s in servers:
        s.start_thread()
    # Ready: the test waits for this line.
    print("ready", flush=True)
    try:
        while all(s.isAlive() for s in servers):
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
