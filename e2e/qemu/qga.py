#!/usr/bin/env python3
# Adapted from the team's lab scripts; see e2e/qemu/README.md.
"""qga.py SOCK CMD [ARGS...]: run a command in the guest via qemu-guest-agent (virtio-serial), print output + exit code."""
import base64, json, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(30); f = s.makefile('rw')
def call(cmd, **a):
    f.write(json.dumps({"execute": cmd, "arguments": a}) + "\n"); f.flush()
    return json.loads(f.readline())
# resync the channel (may contain stale data)
f.write(json.dumps({"execute": "guest-sync", "arguments": {"id": 4242}}) + "\n"); f.flush()
while json.loads(f.readline()).get("return") != 4242: pass
pid = call("guest-exec", path=sys.argv[2], arg=sys.argv[3:], **{"capture-output": True})["return"]["pid"]
while True:
    st = call("guest-exec-status", pid=pid)["return"]
    if st["exited"]: break
    time.sleep(0.1)
sys.stdout.write(base64.b64decode(st.get("out-data", "")).decode())
sys.stderr.write(base64.b64decode(st.get("err-data", "")).decode())
sys.exit(st.get("exitcode", 255))
