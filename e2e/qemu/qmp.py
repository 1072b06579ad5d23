#!/usr/bin/env python3
# Adapted from the team's lab scripts; see e2e/qemu/README.md.
"""Tiny QMP client: qmp.py SOCK 'human-monitor-command:info registers' | qmp.py SOCK query-status"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile('rw')
json.loads(f.readline())
def cmd(c, **a):
    f.write(json.dumps({"execute": c, "arguments": a} if a else {"execute": c}) + "\n"); f.flush()
    while True:
        r = json.loads(f.readline())
        if "return" in r or "error" in r: return r
cmd("qmp_capabilities")
for c in sys.argv[2:]:
    if c.startswith("hmp:"):
        r = cmd("human-monitor-command", **{"command-line": c[4:]}); print(r.get("return", r))
    else:
        print(json.dumps(cmd(c)))
