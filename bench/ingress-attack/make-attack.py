#!/usr/bin/python3
# bench/ingress-attack/make-attack.py OUT FIELDS SIGNATURES NAMES MIME_DEPTH DOMAIN
#
# The worst message the ingress limits let through, written to OUT (CRLF
# lines): a header section of exactly FIELDS fields (MAX_HEADER_FIELDS),
# SIGNATURES DKIM-Signatures and an ARC chain of SIGNATURES sets, every
# h= naming NAMES fields (the cap, 128) of the header, with correct body
# hashes (so the header hashes are made) and b= values that do not
# verify, from DOMAIN (whose keys the benchmark publishes); a body of
# multiparts nested MIME_DEPTH deep.
import base64
import hashlib
import sys

out, fields, signatures, names, depth, domain = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]

# The body: multiparts nested depth deep around one text part.
body = []
for level in range(depth):
    if level:
        body.append("Content-Type: multipart/mixed; boundary=\"b%d\"" % level)
        body.append("")
    body.append("--b%d" % (level + 1))
body.append("Content-Type: text/plain")
body.append("")
body.append("The innermost part.")
for level in range(depth, 0, -1):
    body.append("--b%d--" % level)
body = "\r\n".join(body) + "\r\n"
bh = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
b = base64.b64encode(bytes(256)).decode()  # an RSA-2048-sized b= that does not verify

fixed = ["From: <attacker@%s>" % domain, "To: <rcpt@example.net>", "Subject: attack",
         "Date: Tue, 1 Dec 2026 12:00:00 +0000", "MIME-Version: 1.0",
         "Content-Type: multipart/mixed; boundary=\"b1\""]
pad = fields - len(fixed) - 4 * signatures
assert pad >= names, "too few fields for the signatures"
padding = ["X-Pad-%04d: value %d" % (i, i) for i in range(pad)]
signed = ",".join("x-pad-%04d" % i for i in range(names)).replace(",", ":")


def folded(h):
    # h= over lines of about 70 octets
    parts, line = [], ""
    for name in h.split(":"):
        if len(line) + len(name) > 70:
            parts.append(line)
            line = ""
        line += name + ":"
    parts.append(line.rstrip(":"))
    return "\r\n\t".join(parts)


header = []
for i in range(signatures, 0, -1):
    cv = "none" if i == 1 else "pass"
    header.append("ARC-Seal: i=%d; a=rsa-sha256; cv=%s; d=%s; s=arc; t=1796000000;\r\n\tb=%s" % (i, cv, domain, b))
    header.append("ARC-Message-Signature: i=%d; a=rsa-sha256; c=relaxed/relaxed; d=%s; s=arc;\r\n\th=%s;\r\n\tbh=%s;\r\n\tb=%s"
                  % (i, domain, folded(signed), bh, b))
    header.append("ARC-Authentication-Results: i=%d; mx.%s; dkim=pass header.d=%s" % (i, domain, domain))
for i in range(signatures):
    header.append("DKIM-Signature: v=1; a=rsa-sha256; c=relaxed/relaxed; d=%s; s=sel%d;\r\n\th=%s;\r\n\tbh=%s;\r\n\tb=%s"
                  % (domain, i % 8, folded(signed), bh, b))
header += fixed + padding
assert len(header) == fields
open(out, "wb").write(("\r\n".join(header) + "\r\n\r\n" + body).encode())
