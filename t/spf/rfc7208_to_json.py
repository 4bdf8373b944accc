#!/usr/bin/python3
# The OpenSPF RFC 7208 test suite (YAML, as python3-spf ships it) to the
# JSON that t/spf/spf_suite.c reads: per scenario, the zone and the tests.
# The zone follows the suite's own driver (pyspf's testspf.py): an SPF-type
# record stands in for TXT when the name has no TXT record, "NONE" is no
# record, and "TIMEOUT" makes the name (or one type of it) never answer.
# Usage: rfc7208_to_json.py rfc7208-tests.yml.gz > suite.json
import gzip
import json
import sys

import yaml


def records(name, rrs):
    out, generated, has_txt = [], [], False
    for rr in rrs:
        if rr == "TIMEOUT":
            out.append(["TIMEOUT"])
            continue
        for rtype, value in rr.items():
            if rtype in ("TXT", "SPF") and isinstance(value, str):
                value = [value]
            if rtype == "TXT":
                has_txt = True
            elif rtype == "SPF":
                generated.append(["TXT", value])
                continue  # we never ask for type SPF
            if value == ["NONE"]:
                continue
            out.append([rtype, value])
    if not has_txt:
        out.extend(generated)
    return out


def main():
    path = sys.argv[1]
    opener = gzip.open if path.endswith(".gz") else open
    scenarios = []
    with opener(path, "rb") as f:
        for doc in yaml.safe_load_all(f):
            zone = {name.lower().rstrip("."): records(name, rrs)
                    for name, rrs in doc.get("zonedata", {}).items()}
            tests = []
            for tid, t in doc["tests"].items():
                result = t["result"]
                tests.append({
                    "name": tid,
                    "spec": str(t.get("spec", "")),
                    "helo": t["helo"],
                    "host": t["host"],
                    "mailfrom": t["mailfrom"],
                    "result": result if isinstance(result, list) else [result],
                    "explanation": t.get("explanation"),
                })
            scenarios.append({"description": doc["description"], "zone": zone, "tests": tests})
    json.dump(scenarios, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
