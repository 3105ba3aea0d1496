#!/usr/bin/env python3
"""Sends Varlink calls to vaultd over one connection, one after another, as
whoever runs it (the tests run it as a second real user through setpriv).

Run:  python3 varlink_calls.py SOCKET < calls
Each line of stdin is one call ({"method": ..., "parameters": {...}}); each
reply is printed as one line of JSON, prefixed with the wall-clock time it
came at ({"at": SECONDS, "reply": {...}}). Stdlib only.
"""

import json
import socket
import sys
import time


def main():
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sys.argv[1])
    buffered = b""
    for line in sys.stdin:
        if not line.strip():
            continue
        sock.sendall(json.dumps(json.loads(line)).encode() + b"\0")
        while b"\0" not in buffered:
            chunk = sock.recv(65536)
            if not chunk:
                raise SystemExit("vaultd closed the connection")
            buffered += chunk
        reply, buffered = buffered.split(b"\0", 1)
        print(json.dumps({"at": time.time(), "reply": json.loads(reply)}), flush=True)


if __name__ == "__main__":
    main()
