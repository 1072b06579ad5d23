#!/usr/bin/env python3
"""egress.py SOCKET ROUTES LOG — the apiserver's way to a lab node's kubelet.

kube-apiserver reaches a kubelet (logs, exec, port-forward) at one of the Node's addresses
(its name first), none of which the host can reach: for a QEMU guest they exist only inside
it. The apiserver's egress selector (`cluster`, HTTP CONNECT over a unix socket) sends each
such connection here; ROUTES maps a destination to a loopback port the lab forwards into the
guest (`e2e/qemu/run hostfwd`), one `HOST:PORT LOOPBACK_PORT` per line (`run route`), read
again for every connection; or, for a native node (e2e/native/run), `HOST:PORT 10.0.2.N:PORT`,
the node's own address on the lab bridge. A destination without a route is refused (502):
nothing here reaches beyond 127.0.0.1 and the lab bridge's nodes.
Python 3 stdlib only.
"""

import asyncio
import os
import sys
import time


def route(routes, dest):
    """(address, port) DEST is routed to, or None."""
    try:
        with open(routes) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 2 or parts[0] != dest:
                    continue
                if parts[1].isdigit():
                    return ("127.0.0.1", int(parts[1]))
                addr, _, port = parts[1].rpartition(":")
                if addr.startswith("10.0.2.") and port.isdigit():
                    return (addr, int(port))
    except FileNotFoundError:
        pass
    return None


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


def main():
    sock, routes, logfile = sys.argv[1:4]
    log = open(logfile, "a", buffering=1)

    def say(msg):
        log.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), msg))

    async def handle(reader, writer):
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError):
            writer.close()
            return
        first = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(first) != 3 or first[0] != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            writer.close()
            return
        dest = first[1]
        target = route(routes, dest)
        if target is None:
            say("refused %s: no route" % dest)
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            writer.close()
            return
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*target), 10)
        except (OSError, asyncio.TimeoutError) as e:
            say("failed %s -> %s:%d: %s" % (dest, *target, e))
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            writer.close()
            return
        say("connected %s -> %s:%d" % (dest, *target))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    async def serve():
        if os.path.exists(sock):
            os.remove(sock)
        server = await asyncio.start_unix_server(handle, path=sock)
        os.chmod(sock, 0o600)
        say("listening on %s" % sock)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
