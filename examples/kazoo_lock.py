#!/usr/bin/env python3
"""kazoo's own Lock recipe, unchanged, against Baton's ZooKeeper listener.

    python3 examples/kazoo_lock.py 127.0.0.1:2181 [--contenders 100]

Starts CONTENDERS kazoo clients (one session each) on one lock. They all
queue, then each takes the lock in turn, writes to a fenced register with its
fencing token (its lock node's czxid), and lets go. It prints every grant
with its token and checks that grants came in queue order (FIFO) and that no
token ever went back. Exit status 0 when both hold.

Against a cluster (`baton cluster local --zk` prints the connect string and
the members' pids), add `--kill-leader-after N --pids P1,P2,P3` (the pids in
the order of the connect string): after N grants it finds the member that
leads (its `srvr` says `Mode: leader`) and kills it; the contenders' sessions
move to the new leader and the lock goes on, in order.

Needs kazoo (`pip install kazoo`).
"""

import argparse
import os
import signal
import socket
import sys
import threading
import time
import uuid

from kazoo.client import KazooClient


def four_letter_word(host, word, timeout=2.0):
    """A four-letter word's answer from HOST:PORT ('' if none)."""
    name, port = host.rsplit(":", 1)
    try:
        with socket.create_connection((name, int(port)), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


class FencedRegister:
    """Storage that refuses a write whose token is below the highest seen."""

    def __init__(self):
        self.lock = threading.Lock()
        self.highest = 0
        self.refused = 0

    def write(self, token, value):
        with self.lock:
            if token < self.highest:
                self.refused += 1
                return False
            self.highest = token
            self.value = value
            return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hosts", help="ZooKeeper connect string, e.g. 127.0.0.1:2181")
    parser.add_argument("--contenders", type=int, default=100)
    parser.add_argument("--kill-leader-after", type=int, metavar="N")
    parser.add_argument("--pids", help="the members' pids, in connect-string order")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds")
    args = parser.parse_args()
    hosts = args.hosts.split(",")
    pids = [int(p) for p in args.pids.split(",")] if args.pids else []
    if args.kill_leader_after is not None and len(pids) != len(hosts):
        parser.error("--kill-leader-after needs --pids, one per host of the connect string")

    path = "/examples/kazoo-lock-" + uuid.uuid4().hex[:8]
    register = FencedRegister()
    grants = []  # (queue position, token, contender)
    grants_lock = threading.Lock()
    queued = threading.Barrier(args.contenders + 1)
    killed = threading.Event()
    holding = []

    first = KazooClient(hosts=args.hosts, timeout=15.0)
    first.start(timeout=30)
    first.ensure_path(path)
    gate = first.Lock(path, "gate")
    gate.acquire(timeout=30)  # everyone queues behind this holder

    def contender(i):
        client = KazooClient(hosts=args.hosts, timeout=15.0)
        client.start(timeout=30)
        lock = client.Lock(path, "contender-%d" % i)
        queued.wait(timeout=60)
        lock.acquire(timeout=args.timeout)
        try:
            node = path + "/" + lock.node
            token = client.exists(node).czxid  # the fencing token
            holding.append(i)
            if len(holding) > 1:
                print("VIOLATION: %s hold at once" % holding, file=sys.stderr)
            if not register.write(token, "written by %d" % i):
                print("contender %d: token %d refused (stale)" % (i, token), file=sys.stderr)
            with grants_lock:
                grants.append((lock.node, token, i))
                n = len(grants)
            holding.remove(i)
            if args.kill_leader_after == n and not killed.is_set():
                killed.set()
                kill_leader(hosts, pids)
        finally:
            lock.release()
            client.stop()
            client.close()

    threads = [threading.Thread(target=contender, args=(i,), daemon=True) for i in range(args.contenders)]
    for t in threads:
        t.start()
    queued.wait(timeout=60)
    # Each contender creates its node right after the barrier: wait until
    # all of them are queued behind the gate, then open it.
    deadline = time.time() + 60
    while len(first.get_children(path)) < args.contenders + 1 and time.time() < deadline:
        time.sleep(0.05)
    order = sorted(first.get_children(path), key=lambda n: n[-10:])
    gate.release()
    for t in threads:
        t.join(timeout=args.timeout)
    first.stop()
    first.close()

    queue = [n for n in order if "__lock__" in n]
    expected = [n for n in queue if n != gate.node] if gate.node else queue
    got = [node for node, _, _ in grants]
    tokens = [token for _, token, _ in grants]
    for k, (node, token, who) in enumerate(grants, 1):
        print("grant %3d: contender %3d  token %d  (%s)" % (k, who, token, node))
    fifo = got == [n for n in expected if n in got]
    increasing = all(a < b for a, b in zip(tokens, tokens[1:]))
    print("%d grants of %d; FIFO: %s; tokens always increasing: %s; stale writes refused: %d"
          % (len(grants), args.contenders, "yes" if fifo else "NO",
             "yes" if increasing else "NO", register.refused))
    ok = len(grants) == args.contenders and fifo and increasing
    return 0 if ok else 1


def kill_leader(hosts, pids):
    for host, pid in zip(hosts, pids):
        if "Mode: leader" in four_letter_word(host, "srvr"):
            print("killing the leader, %s (pid %d)" % (host, pid), flush=True)
            os.kill(pid, signal.SIGKILL)
            return
    print("no member says it leads; nothing killed", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
