#!/usr/bin/env python3
"""fwd.py HOST PORT [LOG]: relay one guest connection to HOST:PORT (a slirp guestfwd `cmd:`).

slirp spawns this once per guest TCP connection to a guestfwd address, with that connection as
fd 0/1/2. We connect to HOST:PORT (loopback only) and copy bytes both ways, passing half-closes
on, until both directions are done. Errors go to LOG (never to fd 2: that is the guest's stream).
"""
import os
import selectors
import socket
import sys
import time


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    log = sys.argv[3] if len(sys.argv) > 3 else os.devnull
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    if host != "127.0.0.1":
        sys.exit("fwd.py: refusing non-loopback target %s" % host)
    guest = socket.socket(fileno=0)
    try:
        up = socket.create_connection((host, port), timeout=10)
    except OSError as e:
        sys.stderr.write("%s fwd.py: connect %s:%d: %s\n" % (time.strftime("%FT%T"), host, port, e))
        return 1
    up.settimeout(None)
    guest.setblocking(False)
    up.setblocking(False)
    peer = {guest: up, up: guest}
    open_in = {guest, up}
    pending = {guest: b"", up: b""}  # bytes waiting to be written TO the key
    sel = selectors.DefaultSelector()
    for s in (guest, up):
        sel.register(s, selectors.EVENT_READ)

    def rearm(s):
        # read only when what we read last has been passed on (back-pressure, no busy loop)
        ev = (selectors.EVENT_READ if s in open_in and not pending[peer[s]] else 0) \
            | (selectors.EVENT_WRITE if pending[s] else 0)
        if ev:
            sel.modify(s, ev) if s in sel.get_map() else sel.register(s, ev)
        elif s in sel.get_map():
            sel.unregister(s)

    try:
        while sel.get_map():
            for key, ev in sel.select(timeout=None):
                s = key.fileobj
                if ev & selectors.EVENT_WRITE and pending[s]:
                    n = s.send(pending[s])
                    pending[s] = pending[s][n:]
                    if not pending[s] and peer[s] not in open_in:
                        s.shutdown(socket.SHUT_WR)
                if ev & selectors.EVENT_READ and s in open_in and not pending[peer[s]]:
                    data = s.recv(65536)
                    if data:
                        pending[peer[s]] = data
                    else:
                        open_in.discard(s)
                        try:
                            peer[s].shutdown(socket.SHUT_WR)
                        except OSError:
                            pass
                rearm(s)
                rearm(peer[s])
            if not open_in and not pending[guest] and not pending[up]:
                break
    except (ConnectionResetError, BrokenPipeError):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
