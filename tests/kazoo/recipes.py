#!/usr/bin/env python3
"""kazoo's own recipes, run against a server that speaks ZooKeeper's protocol.

    python recipes.py HOSTS [--contenders N] [--check NAME]... [--skip NAME]... [--verbose]

HOSTS is a ZooKeeper connect string (127.0.0.1:2181, or several separated by
commas). Every check prints one line, `ok NAME: what was seen`, or `FAIL NAME:
why` (or `skip NAME: why`, for what the server is configured not to answer);
the exit status is 0 only if no check failed, 1 otherwise, 2 on bad
arguments. Everything happens under a root of its own (/kazoo-<random>),
removed at the end.

Each contender of a recipe is a KazooClient of its own (its own session), as
separate processes would be. No wait is unbounded: a check that has not
finished within --check-timeout seconds fails, and the whole run stops after
--timeout seconds. Waits poll a condition against a deadline, or wait on
kazoo's events and watches; nothing sleeps to let something happen.

--verbose logs kazoo at DEBUG level on stderr (every request and reply),
which together with the server's own log (RUST_LOG=debug) shows which
request went wrong.
"""

import argparse
import logging
import os
import re
import select
import socket
import sys
import threading
import time
import traceback
import uuid

try:
    from kazoo.client import KazooClient
    from kazoo.exceptions import (
        BadVersionError,
        KazooException,
        InvalidACLError,
        NoAuthError,
        NoChildrenForEphemeralsError,
        NodeExistsError,
        NoNodeError,
        NotEmptyError,
        RolledBackError,
        RuntimeInconsistency,
    )
    from kazoo.protocol.states import EventType, KazooState
    from kazoo.recipe.barrier import Barrier, DoubleBarrier
    from kazoo.recipe.cache import TreeCache, TreeEvent
    from kazoo.recipe.counter import Counter
    from kazoo.recipe.election import Election
    from kazoo.recipe.lock import Lock, ReadLock, Semaphore, WriteLock
    from kazoo.recipe.party import Party, ShallowParty
    from kazoo.recipe.queue import LockingQueue, Queue
    from kazoo.recipe.watchers import ChildrenWatch, DataWatch
    from kazoo.security import make_acl, make_digest_acl
except ImportError as e:  # pragma: no cover
    sys.stderr.write(
        "cannot import kazoo (%s): install it (bash .ci/kazoo makes a venv with it)\n" % e
    )
    sys.exit(2)

# The longest any single wait inside a check may take (each check also has
# --check-timeout in all); set from the arguments.
WAIT = 30.0


class CheckFailed(Exception):
    """A check saw the server (or the recipe on it) do something wrong."""


class Skip(Exception):
    """A check that cannot run against this server's configuration."""


def expect(cond, message, *args):
    if not cond:
        raise CheckFailed(message % args if args else message)


def wait_for(cond, what, timeout=None):
    """Polls `cond` until it is true; fails naming `what` at the deadline."""
    deadline = time.monotonic() + (WAIT if timeout is None else timeout)
    delay = 0.002
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise CheckFailed("timed out after %.0f s waiting for %s" % (
                WAIT if timeout is None else timeout, what))
        time.sleep(delay)  # a poll interval, not a synchronization
        delay = min(delay * 2, 0.05)


def wait_event(event, what, timeout=None):
    if not event.wait(WAIT if timeout is None else timeout):
        raise CheckFailed("timed out after %.0f s waiting for %s" % (
            WAIT if timeout is None else timeout, what))


def children(client, path):
    """The children of `path`, or none while it does not exist yet."""
    try:
        return client.get_children(path)
    except NoNodeError:
        return []


def sequence_of(node):
    """The sequence number a sequential node's name ends with."""
    m = re.search(r"(\d{10})$", node)
    expect(m is not None, "node %r has no 10-digit sequence suffix", node)
    return int(m.group(1))


class Env:
    """What a check works with: the connect string, its own path, and the
    clients it opened (all closed when it ends)."""

    def __init__(self, hosts, root, name):
        self.hosts = hosts
        self.path = "%s/%s" % (root, name)
        self._clients = []
        self._guard = threading.Lock()
        self._threads = []
        self._proxies = []
        self.errors = []

    def proxy(self):
        proxy = Proxy(self.hosts)
        with self._guard:
            self._proxies.append(proxy)
        return proxy

    def proxied_client(self, proxy, timeout=10.0):
        """A client that reaches the servers through `proxy` only, and
        tries again quickly when its connection breaks."""
        return self.client(hosts=proxy.hosts, timeout=timeout, connection_retry={
            "max_tries": -1, "delay": 0.05, "backoff": 1.5, "max_jitter": 0.05,
            "max_delay": 0.5})

    def client(self, hosts=None, timeout=10.0, **kwargs):
        """A new, started client: a session of its own."""
        c = KazooClient(hosts=hosts or self.hosts, timeout=timeout, **kwargs)
        with self._guard:
            self._clients.append(c)
        c.start(timeout=WAIT)
        return c

    def clients(self, n):
        """`n` new clients, connected at once."""
        out = [None] * n

        def start(i):
            out[i] = self.client()

        self.run_all([lambda i=i: start(i) for i in range(n)], "connecting %d clients" % n)
        return out

    def spawn(self, name, fn):
        """Runs `fn` in a thread of the check's; an exception it raises is
        recorded (and fails the check once joined)."""

        def body():
            try:
                fn()
            except Exception as e:  # noqa: BLE001 (reported as the check's failure)
                with self._guard:
                    self.errors.append("%s: %s" % (name, describe(e)))

        t = threading.Thread(target=body, name=name, daemon=True)
        t.start()
        with self._guard:
            self._threads.append(t)
        return t

    def join(self, threads, what, timeout=None):
        deadline = time.monotonic() + (WAIT if timeout is None else timeout)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise CheckFailed("timed out waiting for %s (%s still running)" % (what, t.name))
        self.raise_errors()

    def run_all(self, fns, what):
        self.join([self.spawn("%s #%d" % (what, i), fn) for i, fn in enumerate(fns)], what)

    def raise_errors(self):
        with self._guard:
            errors = list(self.errors)
        if errors:
            more = " (and %d more)" % (len(errors) - 1) if len(errors) > 1 else ""
            raise CheckFailed(errors[0] + more)

    def close(self):
        with self._guard:
            clients, self._clients = self._clients, []
            proxies, self._proxies = self._proxies, []
        for proxy in proxies:
            proxy.unblock()  # let the clients close their sessions
        closers = []
        for c in clients:
            t = threading.Thread(target=quietly_close, args=(c,), daemon=True)
            t.start()
            closers.append(t)
        deadline = time.monotonic() + 15
        for t in closers:
            t.join(max(0.0, deadline - time.monotonic()))
        for proxy in proxies:
            proxy.close()


def quietly_close(c):
    try:
        c.stop()
        c.close()
    except Exception:  # noqa: BLE001 (best effort)
        pass


def describe(e):
    if isinstance(e, CheckFailed):
        return str(e)
    return "%s: %s" % (type(e).__name__, e) if str(e) else type(e).__name__


class Proxy:
    """A TCP proxy on loopback to the servers of the connect string (each new
    connection to the next server, so that a client that lands on a cluster
    member that does not serve it reaches another), whose connections can be
    cut, and new ones refused, at will: a network fault for one client."""

    def __init__(self, hosts):
        servers, slash, chroot = hosts.partition("/")
        self.upstreams = []
        for hp in servers.split(","):
            host, _, port = hp.strip().rpartition(":")
            self.upstreams.append((host.strip("[]") or "127.0.0.1", int(port or 2181)))
        self._next = 0
        self._guard = threading.Lock()
        self._conns = []
        self.blocked = False
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.hosts = "127.0.0.1:%d%s%s" % (self._listener.getsockname()[1], slash, chroot)
        threading.Thread(target=self._accept, name="proxy", daemon=True).start()

    def _accept(self):
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            if self.blocked:
                down.close()
                continue
            with self._guard:
                upstream = self.upstreams[self._next % len(self.upstreams)]
                self._next += 1
            try:
                up = socket.create_connection(upstream, timeout=5)
            except OSError:
                down.close()
                continue
            with self._guard:
                self._conns.append((down, up))
            threading.Thread(target=self._pump, args=(down, up), name="proxy pump",
                             daemon=True).start()

    def _pump(self, down, up):
        try:
            while True:
                readable, _, _ = select.select([down, up], [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (up if sock is down else down).sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            for sock in (down, up):
                try:
                    sock.close()
                except OSError:
                    pass

    def cut(self, block=False):
        """Breaks every connection; with `block`, refuses new ones too."""
        self.blocked = block
        with self._guard:
            conns, self._conns = self._conns, []
        for pair in conns:
            for sock in pair:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def unblock(self):
        self.blocked = False

    def close(self):
        self.cut(block=True)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self._listener.close()


# --- locks ----------------------------------------------------------------


class FencedRegister:
    """A register that, like a storage service fenced with lock tokens,
    refuses a write whose token is lower than the highest it has seen."""

    def __init__(self):
        self._guard = threading.Lock()
        self.token = -1
        self.value = 0
        self.refused = []

    def read(self):
        with self._guard:
            return self.value

    def write(self, token, value):
        with self._guard:
            if token < self.token:
                self.refused.append((token, self.token))
                return False
            self.token = token
            self.value = value
            return True


def check_lock(env, args):
    n = args.contenders
    path = env.path
    register = FencedRegister()
    guard = threading.Lock()
    state = {"active": 0, "max": 0}
    grants = []  # lock node names, in the order they were granted

    def hold(client, lock, who):
        # The token: the lock node's czxid (its sequence number orders the
        # same way); the fenced write must accept it.
        node = lock.node
        stat = client.exists(path + "/" + node)
        expect(stat is not None, "%s holds the lock but its node %s is gone", who, node)
        with guard:
            state["active"] += 1
            state["max"] = max(state["max"], state["active"])
            grants.append(node)
        value = register.read()
        # One more round trip while holding, to let an overlap show.
        client.get_children(path)
        ok = register.write(stat.czxid, value + 1)
        with guard:
            state["active"] -= 1
        expect(ok, "%s's write with token %d was refused: a later holder already wrote", who,
               stat.czxid)

    gate_client = env.client()
    gate = Lock(gate_client, path, "gate")
    expect(gate.acquire(timeout=WAIT), "the first holder did not get the free lock")
    # kazoo finds the contenders by a suffix of exactly 10 digits
    # (ZooKeeper's %010d); a node it cannot parse is no contender at all.
    expect(gate._contenders_re.search(gate.node) is not None,
           "lock node %s: kazoo's Lock does not see it as a contender (it takes a sequence "
           "suffix of exactly 10 digits), so no contender would wait for another", gate.node)
    hold(gate_client, gate, "the first holder")

    clients = env.clients(n)

    def contend(i):
        lock = Lock(clients[i], path, "c%d" % i)
        if not lock.acquire(timeout=2 * WAIT):
            raise CheckFailed("contender %d never got the lock" % i)
        try:
            hold(clients[i], lock, "contender %d" % i)
        finally:
            lock.release()

    threads = [env.spawn("contender %d" % i, lambda i=i: contend(i)) for i in range(n)]
    # All of them queue behind the first holder before anyone releases.
    queued = wait_for(
        lambda: env.errors or len(grants) > 1
        or (lambda c: c if len(c) == n + 1 else None)(children(gate_client, path)),
        "all %d contenders to queue (lock nodes under %s)" % (n, path))
    env.raise_errors()
    expect(len(grants) == 1, "a contender got the lock while the first holder held it")
    queue_order = sorted((c for c in queued if c != gate.node), key=sequence_of)
    gate.release()
    env.join(threads, "the contenders to take and release the lock in turn", timeout=2 * WAIT)

    expect(state["max"] == 1, "%d holders held the lock at once", state["max"])
    expect(not register.refused, "the fenced register refused stale tokens %s", register.refused)
    expect(register.value == n + 1, "register is %d after %d holders", register.value, n + 1)
    granted = grants[1:]
    expect(len(granted) == n, "%d grants for %d contenders", len(granted), n)
    if granted != queue_order:
        first = next(i for i, (g, q) in enumerate(zip(granted, queue_order)) if g != q)
        raise CheckFailed(
            "grants not in queue order: grant %d went to %s, next in the queue was %s"
            % (first, granted[first], queue_order[first]))
    expect(gate_client.get_children(path) == [], "lock nodes left behind: %s",
           gate_client.get_children(path))
    return "%d contenders, all queued first, FIFO, max 1 holder, fenced tokens increasing" % n


def check_rwlock(env, args):
    path = env.path
    # Queue order: W0 (holds first), then R1, R2, W3, R4, R5.
    plan = [("W0", WriteLock), ("R1", ReadLock), ("R2", ReadLock), ("W3", WriteLock),
            ("R4", ReadLock), ("R5", ReadLock)]
    clients = env.clients(len(plan))
    observer = clients[0]
    guard = threading.Lock()
    holders = set()
    grants = []
    violations = []
    acquired = {name: threading.Event() for name, _ in plan}
    release = {name: threading.Event() for name, _ in plan}

    def contend(i, name, kind):
        lock = kind(clients[i], path, name)
        if not lock.acquire(timeout=2 * WAIT):
            raise CheckFailed("%s never got the lock" % name)
        with guard:
            writers = [h for h in holders if h.startswith("W")]
            if name.startswith("W") and holders:
                violations.append("writer %s granted while %s held" % (name, sorted(holders)))
            if name.startswith("R") and writers:
                violations.append("reader %s granted while writer %s held" % (name, writers))
            holders.add(name)
            grants.append(name)
        acquired[name].set()
        try:
            wait_event(release[name], "the test to let %s release" % name, timeout=2 * WAIT)
        finally:
            with guard:
                holders.discard(name)
            lock.release()

    threads = []
    for i, (name, kind) in enumerate(plan):
        threads.append(env.spawn(name, lambda i=i, name=name, kind=kind: contend(i, name, kind)))
        # Each queues before the next starts: the queue order is the plan's.
        wait_for(lambda i=i: env.errors or len(children(observer, path)) == i + 1,
                 "%s to queue" % name)
        env.raise_errors()
        if i == 0:
            wait_event(acquired["W0"], "W0 to take the free lock")

    def phase(released, granted, waiting):
        for name in released:
            release[name].set()
        for name in granted:
            wait_event(acquired[name], "%s to be granted after %s released" % (
                name, "+".join(released)))
        env.raise_errors()
        for name in waiting:
            expect(not acquired[name].is_set(), "%s was granted while %s held the lock",
                   name, "+".join(granted))

    phase(["W0"], ["R1", "R2"], ["W3", "R4", "R5"])  # readers share
    phase(["R1", "R2"], ["W3"], ["R4", "R5"])  # the writer waits for both
    phase(["W3"], ["R4", "R5"], [])
    phase(["R4", "R5"], [], [])
    env.join(threads, "the read/write lock holders to finish")
    expect(not violations, "; ".join(violations))
    expect(grants[0] == "W0" and set(grants[1:3]) == {"R1", "R2"} and grants[3] == "W3"
           and set(grants[4:]) == {"R4", "R5"}, "grant order %s is not the queue order", grants)
    return "W0 | R1+R2 shared | W3 alone | R4+R5 shared, in queue order"


def check_semaphore(env, args):
    n, leases = 10, 3
    path = env.path
    clients = env.clients(n)
    guard = threading.Lock()
    state = {"active": 0, "max": 0}
    release = threading.Event()

    def contend(i):
        sem = Semaphore(clients[i], path, "s%d" % i, max_leases=leases)
        if not sem.acquire(timeout=2 * WAIT):
            raise CheckFailed("contender %d never got a lease" % i)
        try:
            with guard:
                state["active"] += 1
                state["max"] = max(state["max"], state["active"])
            holders = sem.lease_holders()
            expect(len(holders) <= leases, "lease holders %s exceed %d", holders, leases)
            # The first holders keep their leases until the test has seen
            # everyone else wait; later ones give them back at once.
            wait_event(release, "the test to let contender %d release" % i)
        finally:
            with guard:
                state["active"] -= 1
            sem.release()

    threads = [env.spawn("contender %d" % i, lambda i=i: contend(i)) for i in range(n)]

    # The others wait in the semaphore's queue (its lock, path-__lock__).
    def waiting():
        return len(children(clients[0], path + "-__lock__"))

    wait_for(lambda: env.errors or state["max"] > leases
             or (state["active"] == leases and waiting() == n - leases),
             "%d contenders to hold a lease and the other %d to wait for one" % (
                 leases, n - leases))
    env.raise_errors()
    expect(state["max"] <= leases, "%d held a lease at once (max_leases=%d)", state["max"],
           leases)
    expect(state["active"] == leases, "%d held a lease with %d waiting (max_leases=%d)",
           state["active"], waiting(), leases)
    release.set()
    env.join(threads, "the contenders to take and return the leases in turn")
    expect(state["max"] <= leases, "%d held a lease at once (max_leases=%d)", state["max"],
           leases)
    return "%d contenders, max_leases=%d: %d held while %d waited, never more" % (
        n, leases, leases, n - leases)


def check_election(env, args):
    n = 5
    path = env.path
    clients = env.clients(n)
    observer = env.client()
    guard = threading.Lock()
    leaders = []
    led = [threading.Event() for _ in range(n)]
    stop = [threading.Event() for _ in range(n)]

    def lead(i):
        with guard:
            leaders.append(i)
        led[i].set()
        wait_event(stop[i], "the test to end candidate %d's leadership" % i, timeout=2 * WAIT)

    def candidate(i):
        try:
            Election(clients[i], path, "cand%d" % i).run(lead, i)
        except KazooException:
            # The first leader's client is stopped under it: its release
            # cannot reach the server any more (its session is gone).
            if i != 0:
                raise

    threads = [env.spawn("candidate 0", lambda: candidate(0))]
    wait_event(led[0], "the first candidate to lead")
    contenders = Election(observer, path).contenders
    for i in range(1, n):
        threads.append(env.spawn("candidate %d" % i, lambda i=i: candidate(i)))
        wait_for(lambda i=i: env.errors or len(contenders()) == i + 1,
                 "candidate %d to stand" % i)
        env.raise_errors()
    names = ["cand%d" % i for i in range(n)]
    expect(contenders() == names, "contenders() is %s, expected %s", contenders(), names)
    # The leader's client stops: its session closes, the next runs.
    clients[0].stop()
    wait_event(led[1], "candidate 1 to lead once the leader's client stopped")
    stop[0].set()
    wait_for(lambda: contenders() == names[1:], "contenders() to drop the old leader")
    expect(leaders == [0, 1], "leaders so far %s, expected [0, 1]", leaders)
    for i in range(1, n):
        stop[i].set()
    env.join(threads, "the candidates to finish")
    expect(leaders == list(range(n)), "leaders in order %s, expected %s", leaders,
           list(range(n)))
    return "%d candidates lead in turn; the next runs when the leader's client stops" % n


# --- barriers, counter, queues, party ---------------------------------------


def check_barrier(env, args):
    n = 3
    path = env.path
    owner = env.client()
    clients = env.clients(n)
    barrier = Barrier(owner, path)
    barrier.create()
    expect(owner.exists(path) is not None, "Barrier.create() made no node")
    results = [None] * n

    def waiter(i):
        results[i] = Barrier(clients[i], path).wait(timeout=2 * WAIT)

    threads = [env.spawn("waiter %d" % i, lambda i=i: waiter(i)) for i in range(n)]
    # Each waiter has its exists watch on the barrier node set (kazoo keeps
    # a registered exists watch in _data_watchers, by full path, once the
    # reply arrives).
    wait_for(lambda: env.errors or all(c._data_watchers.get((c.chroot or "") + path)
                                       for c in clients),
             "the waiters to watch the barrier")
    env.raise_errors()
    expect(all(r is None for r in results), "a waiter passed the barrier while it stood")
    expect(barrier.remove(), "Barrier.remove() found no barrier")
    env.join(threads, "the waiters to pass the removed barrier")
    expect(all(results), "waiters' results %s, expected all True", results)
    expect(Barrier(owner, path).wait(timeout=1), "wait() on a removed barrier did not pass")

    # DoubleBarrier: no one leaves enter() before all have entered, and no
    # one leaves leave() before all have left.
    dpath = path + "-double"
    dclients = env.clients(n)
    guard = threading.Lock()
    state = {"entering": 0, "leaving": 0}
    problems = []
    entered = threading.Barrier(n, timeout=WAIT)

    def member(i):
        db = DoubleBarrier(dclients[i], dpath, n, identifier="m%d" % i)
        with guard:
            state["entering"] += 1
        db.enter()
        expect(db.participating, "member %d failed to enter the double barrier", i)
        with guard:
            if state["entering"] != n:
                problems.append("member %d entered with %d of %d in" % (
                    i, state["entering"], n))
        entered.wait()  # every member is past enter() before any leaves
        with guard:
            state["leaving"] += 1
        db.leave()
        with guard:
            if state["leaving"] != n:
                problems.append("member %d left with %d of %d leaving" % (
                    i, state["leaving"], n))

    env.run_all([lambda i=i: member(i) for i in range(n)], "the double barrier's members")
    expect(not problems, "; ".join(problems))
    left = owner.get_children(dpath)
    expect(left == [], "nodes left in the double barrier: %s", left)
    return ("Barrier holds %d waiters until removed; DoubleBarrier of %d enters and leaves "
            "together" % (n, n))


def check_counter(env, args):
    n, each = 4, 25
    path = env.path
    clients = env.clients(n)

    def bump(i):
        counter = Counter(clients[i], path)
        for _ in range(each):
            counter += 1
            expect(counter.post_value == counter.pre_value + 1,
                   "pre %r post %r", counter.pre_value, counter.post_value)

    env.run_all([lambda i=i: bump(i) for i in range(n)], "the counter's clients")
    value = Counter(clients[0], path).value
    expect(value == n * each, "counter is %d after %d increments", value, n * each)
    c = Counter(clients[0], path + "-float", default=1.5)
    c += 2.0
    c -= 0.5
    expect(c.value == 3.0, "float counter is %r, expected 3.0", c.value)
    return "%d clients x %d concurrent increments = %d" % (n, each, value)


def check_queue(env, args):
    path = env.path
    a, b = env.clients(2)
    q = Queue(a, path)
    for item in (b"one", b"two", b"three"):
        q.put(item)
    q.put(b"urgent", priority=1)
    expect(len(q) == 4, "len(queue) is %d, expected 4", len(q))
    got = [q.get() for _ in range(4)]
    expect(got == [b"urgent", b"one", b"two", b"three"], "got %s, not priority then put order",
           got)
    expect(q.get() is None, "get() on an empty queue did not return None")

    # Two consumers take every item exactly once.
    items = [("item-%02d" % i).encode() for i in range(20)]
    for item in items:
        q.put(item)
    taken = [[], []]

    def consume(i, client):
        mine = Queue(client, path)
        while True:
            item = mine.get()
            if item is None:
                return
            taken[i].append(item)

    env.run_all([lambda: consume(0, a), lambda: consume(1, b)], "two queue consumers")
    both = taken[0] + taken[1]
    expect(sorted(both) == items, "consumers took %d items for %d (duplicates or losses)",
           len(both), len(items))
    for t in taken:
        expect(t == sorted(t), "a consumer took items out of order: %s", t)
    return "priority and FIFO order; 2 consumers take %d items once each" % len(items)


def check_locking_queue(env, args):
    path = env.path
    a, b, c = env.clients(3)
    qa, qb = LockingQueue(a, path), LockingQueue(b, path)
    qa.put(b"first")
    qa.put(b"second")
    expect(len(qa) == 2, "len is %d, expected 2", len(qa))
    expect(qa.get(WAIT) == b"first", "the first get() did not return the first entry")
    expect(qb.get(WAIT) == b"second", "a second consumer did not skip the locked entry")
    expect(qa.holds_lock(), "holds_lock() is False for the entry just taken")
    expect(qa.release(), "release() failed")
    expect(qb.consume(), "consume() failed")
    expect(qb.get(WAIT) == b"first", "a released entry was not available again")
    expect(qb.consume(), "consume() failed")
    expect(len(qa) == 0, "len is %d after consuming everything", len(qa))
    expect(qa.get(0.2) is None, "get() on an empty queue returned something")
    # put_all: one transaction of sequential creates.
    qa.put_all([b"x", b"y", b"z"], priority=5)
    expect(len(qa) == 3, "len is %d after put_all of 3", len(qa))
    # An entry locked by a session that ends is free again.
    qc = LockingQueue(c, path)
    expect(qc.get(WAIT) == b"x", "put_all's first entry did not come first")
    c.stop()
    expect(qa.get(WAIT) == b"x", "the entry of a closed session did not become free")
    expect(qa.consume(), "consume() failed")
    rest = []
    for _ in range(2):
        rest.append(qa.get(WAIT))
        expect(qa.consume(), "consume() failed")
    expect(rest == [b"y", b"z"], "got %s, expected [b'y', b'z']", rest)
    expect(len(qa) == 0, "len is %d at the end", len(qa))
    return "get/consume/release, locked entries skipped, put_all, a closed session's lock freed"


def check_party(env, args):
    a, b, observer = env.clients(3)
    for kind in (Party, ShallowParty):
        path = "%s/%s" % (env.path, kind.__name__)
        pa, pb = kind(a, path, "alice"), kind(b, path, "bob")
        watch = kind(observer, path)
        expect(len(watch) == 0, "%s: an empty party has %d members", kind.__name__, len(watch))
        pa.join()
        pb.join()
        expect(len(watch) == 2, "%s: %d members after 2 joined", kind.__name__, len(watch))
        expect(sorted(watch) == ["alice", "bob"], "%s: members %s", kind.__name__, sorted(watch))
        pa.leave()
        expect(sorted(watch) == ["bob"], "%s: members %s after alice left", kind.__name__,
               sorted(watch))
        pa.join()
        expect(sorted(watch) == ["alice", "bob"], "%s: alice did not join again", kind.__name__)
    # The members' nodes are ephemeral: a closed session leaves both parties.
    b.stop()
    for kind in (Party, ShallowParty):
        watch = kind(observer, "%s/%s" % (env.path, kind.__name__))
        wait_for(lambda: sorted(watch) == ["alice"], "%s: bob to leave with his session" %
                 kind.__name__)
    return "Party and ShallowParty: join, leave, len, iteration, gone with the session"


def check_tree_cache(env, args):
    path = env.path
    a, b = env.clients(2)
    a.create(path + "/pre", b"before", makepath=True)
    guard = threading.Lock()
    events = []
    cache = TreeCache(a, path)
    faults = []
    cache.listen_fault(faults.append)

    @cache.listen
    def on_event(event):
        data = event.event_data
        with guard:
            events.append((event.event_type, data.path if data else None,
                           data.data if data else None))

    def seen(kind, p, data=None):
        with guard:
            return any(e[0] == kind and e[1] == p and (data is None or e[2] == data)
                       for e in events)

    cache.start()
    try:
        wait_for(lambda: seen(TreeEvent.INITIALIZED, None), "the cache to initialize")
        expect(seen(TreeEvent.NODE_ADDED, path + "/pre", b"before"),
               "no NODE_ADDED for the node that was there before start")
        n1, n2 = path + "/a", path + "/a/b"
        b.create(n1, b"1")
        b.create(n2, b"2")
        wait_for(lambda: seen(TreeEvent.NODE_ADDED, n1, b"1"), "NODE_ADDED for %s" % n1)
        wait_for(lambda: seen(TreeEvent.NODE_ADDED, n2, b"2"), "NODE_ADDED for %s" % n2)
        b.set(n1, b"1-changed")
        wait_for(lambda: seen(TreeEvent.NODE_UPDATED, n1, b"1-changed"),
                 "NODE_UPDATED for %s" % n1)
        expect(cache.get_data(n1).data == b"1-changed", "the cache holds stale data for %s", n1)
        expect(cache.get_children(path) == frozenset({"pre", "a"}),
               "cached children %s", cache.get_children(path))
        b.delete(n1, recursive=True)
        wait_for(lambda: seen(TreeEvent.NODE_REMOVED, n2), "NODE_REMOVED for %s" % n2)
        wait_for(lambda: seen(TreeEvent.NODE_REMOVED, n1), "NODE_REMOVED for %s" % n1)
        expect(cache.get_data(n1) is None, "the cache still holds deleted %s", n1)
        expect(not faults, "the cache reported errors: %s", faults)
    finally:
        cache.close()
    return "TreeCache sees the initial tree, creates, updates and deletes, with events"


# --- plain client checks ------------------------------------------------------


def check_ephemeral(env, args):
    path = env.path
    a, b = env.clients(2)
    a.ensure_path(path)
    node = path + "/eph"
    b.create(node, b"mine", ephemeral=True)
    gone = threading.Event()
    kinds = []

    def on_change(event):
        kinds.append(event.type)
        gone.set()

    stat = a.exists(node, watch=on_change)
    expect(stat is not None, "the ephemeral node is not there")
    expect(stat.ephemeralOwner == b.client_id[0],
           "ephemeralOwner %#x is not the creator's session %#x", stat.ephemeralOwner,
           b.client_id[0])
    expect(b.get_children(node) == [], "an ephemeral node has children")
    b.stop()
    wait_event(gone, "the watch on the ephemeral node to fire when its session closed")
    expect(kinds == [EventType.DELETED], "watch events %s, expected [DELETED]", kinds)
    expect(a.exists(node) is None, "the ephemeral node outlived its session")
    return "ephemeral node owned by its session, deleted (watch fires) when the session closes"


def check_watches(env, args):
    path = env.path
    a, b = env.clients(2)
    a.create(path, b"v0", makepath=True)
    guard = threading.Lock()
    datas, childs = [], []

    @DataWatch(a, path)
    def on_data(data, stat):
        with guard:
            datas.append((data, stat.version if stat else None))

    @ChildrenWatch(a, path)
    def on_children(children):
        with guard:
            childs.append(sorted(children))

    def has(lst, item):
        with guard:
            return item in lst

    wait_for(lambda: has(datas, (b"v0", 0)), "DataWatch's first call")
    wait_for(lambda: has(childs, []), "ChildrenWatch's first call")
    b.set(path, b"v1")
    wait_for(lambda: has(datas, (b"v1", 1)), "DataWatch to see a set")
    b.create(path + "/c1")
    wait_for(lambda: has(childs, ["c1"]), "ChildrenWatch to see a child created")
    b.create(path + "/c2")
    wait_for(lambda: has(childs, ["c1", "c2"]), "ChildrenWatch to see a second child")
    b.delete(path + "/c1")
    wait_for(lambda: has(childs, ["c2"]), "ChildrenWatch to see a child deleted")
    b.set(path, b"v2")
    wait_for(lambda: has(datas, (b"v2", 2)), "DataWatch to see a second set")

    # A one-shot watch fires once, for the first change only.
    fired = []
    one = threading.Event()

    def once(event):
        fired.append(event.type)
        one.set()

    a.get(path, watch=once)
    b.set(path, b"v3")
    wait_event(one, "a getData watch to fire")
    b.set(path, b"v4")
    a.sync(path)  # a round trip after the second change: its event would be here
    wait_for(lambda: has(datas, (b"v4", 4)), "DataWatch to see the fourth set")
    expect(fired == [EventType.CHANGED], "one-shot watch events %s, expected [CHANGED]", fired)
    # exists() on a missing node sets a watch that fires on its creation.
    created = threading.Event()
    expect(a.exists(path + "/later", watch=lambda e: created.set()) is None,
           "exists() found a node not yet created")
    b.create(path + "/later")
    wait_event(created, "an exists watch to fire on creation")
    # DataWatch follows its node's deletion and re-creation.
    b.delete(path, recursive=True)
    wait_for(lambda: has(datas, (None, None)), "DataWatch to see its node deleted")
    b.create(path, b"again")
    wait_for(lambda: has(datas, (b"again", 0)), "DataWatch to see its node created again")
    return "DataWatch, ChildrenWatch, one-shot getData and exists watches fire"


def check_transaction(env, args):
    path = env.path
    a = env.client()
    a.create(path, b"start", makepath=True)
    _, stat = a.get(path)
    t = a.transaction()
    t.create(path + "/x", b"1")
    t.check(path, stat.version)
    t.set_data(path, b"committed")
    t.create(path + "/seq-", b"s", sequence=True)
    results = t.commit()
    expect(len(results) == 4, "commit() returned %r", results)
    expect(results[0] == path + "/x", "create's result %r", results[0])
    expect(results[1] is True, "check's result %r", results[1])
    expect(getattr(results[2], "version", None) == stat.version + 1,
           "set_data's result %r", results[2])
    expect(isinstance(results[3], str) and results[3].startswith(path + "/seq-"),
           "sequential create's result %r", results[3])
    expect(a.get(path)[0] == b"committed", "the committed set_data is not there")
    expect(a.exists(path + "/x") is not None, "the committed create is not there")

    # A failing check: nothing changes.
    t = a.transaction()
    t.create(path + "/y", b"2")
    t.check(path, 999)
    t.set_data(path, b"rolled back")
    results = t.commit()
    kinds = [type(r) for r in results]
    expect(kinds == [RolledBackError, BadVersionError, RuntimeInconsistency],
           "failed commit's results %s, expected [RolledBackError, BadVersionError, "
           "RuntimeInconsistency]", [k.__name__ for k in kinds])
    expect(a.exists(path + "/y") is None, "a create of a failed transaction was applied")
    expect(a.get(path)[0] == b"committed", "a set of a failed transaction was applied")
    # A failing delete in the middle: the same.
    t = a.transaction()
    t.delete(path + "/x")
    t.delete(path + "/missing")
    results = t.commit()
    expect(isinstance(results[1], NoNodeError), "deleting a missing node gave %r", results)
    expect(a.exists(path + "/x") is not None, "a delete of a failed transaction was applied")
    return "create+check+set_data commit together; a failing check or delete changes nothing"


def check_server_version(env, args):
    a = env.client()
    try:
        version = a.server_version()
    except KazooException as e:
        answer = a.command(b"envi")
        if "not in the whitelist" in answer or "not executed" in answer:
            raise Skip("server_version() asks `envi`, which this server does not answer "
                       "(start it with --zk-4lw ruok,srvr,mntr,isro,envi)")
        raise CheckFailed("server_version() failed: %s; envi answered %r" % (e, answer[:200]))
    expect(isinstance(version, tuple) and len(version) >= 2 and version >= (3, 4),
           "server_version() is %r", version)
    ruok = a.command(b"ruok")
    expect(ruok == "imok", "ruok answered %r", ruok)
    return "server_version() %s; ruok: imok" % ".".join(map(str, version))


def check_basics(env, args):
    """Errors and stats as ZooKeeper gives them."""
    path = env.path
    a = env.client()
    created, stat = a.create(path, b"abc", makepath=True, include_data=True)
    expect(created == path, "create2 returned %r", created)
    expect(stat.version == 0 and stat.czxid == stat.mzxid and stat.dataLength == 3
           and stat.numChildren == 0 and stat.ephemeralOwner == 0,
           "a new node's stat %s", stat)
    for exc, what, fn in [
        (NodeExistsError, "create of an existing node", lambda: a.create(path)),
        (NoNodeError, "create under a missing parent", lambda: a.create(path + "/no/child")),
        (NoNodeError, "get of a missing node", lambda: a.get(path + "/missing")),
        (BadVersionError, "set with a wrong version", lambda: a.set(path, b"x", version=7)),
        (BadVersionError, "delete with a wrong version", lambda: a.delete(path, version=7)),
    ]:
        try:
            fn()
        except exc:
            continue
        except KazooException as e:
            raise CheckFailed("%s raised %s, expected %s" % (what, describe(e), exc.__name__))
        raise CheckFailed("%s succeeded, expected %s" % (what, exc.__name__))
    stat2 = a.set(path, b"abcd", version=0)
    expect(stat2.version == 1 and stat2.mzxid > stat.mzxid and stat2.czxid == stat.czxid
           and stat2.dataLength == 4, "stat after a set %s", stat2)
    a.create(path + "/c1")
    a.create(path + "/e1", ephemeral=True)
    children, pstat = a.get_children(path, include_data=True)
    expect(sorted(children) == ["c1", "e1"] and pstat.numChildren == 2
           and pstat.cversion == stat.cversion + 2 and pstat.pzxid > stat2.mzxid,
           "children %s with stat %s", children, pstat)
    for exc, what, fn in [
        (NotEmptyError, "delete of a node with children", lambda: a.delete(path)),
        (NoChildrenForEphemeralsError, "create under an ephemeral node",
         lambda: a.create(path + "/e1/x")),
    ]:
        try:
            fn()
        except exc:
            continue
        except KazooException as e:
            raise CheckFailed("%s raised %s, expected %s" % (what, describe(e), exc.__name__))
        raise CheckFailed("%s succeeded, expected %s" % (what, exc.__name__))
    acls, _ = a.get_acls(path)
    expect([(x.perms, x.id.scheme, x.id.id) for x in acls] == [(31, "world", "anyone")],
           "get_acls gave %s", acls)
    a.delete(path + "/c1")
    expect(a.exists(path).cversion == stat.cversion + 3, "cversion did not count a delete")
    expect(a.sync(path) == path, "sync() did not return its path")
    return "create2/getChildren2 stats, version/cversion/pzxid, the usual errors, getACL, sync"


def check_sequential(env, args):
    path = env.path
    clients = env.clients(4)
    a = clients[0]
    a.ensure_path(path)
    made = [[] for _ in clients]

    def create(i):
        for _ in range(10):
            made[i].append(clients[i].create(path + "/job-", b"", sequence=True,
                                             ephemeral=bool(i % 2)))

    env.run_all([lambda i=i: create(i) for i in range(len(clients))],
                "concurrent sequential creates")
    names = [n for m in made for n in m]
    expect(len(set(names)) == len(names) == 40, "%d distinct names for 40 creates",
           len(set(names)))
    # ZooKeeper's suffix is %010d of its counter, and clients rely on it:
    # kazoo's Lock (and all built on it) takes exactly 10 digits.
    for name in names:
        expect(re.match(re.escape(path) + r"/job-\d{10}$", name),
               "%s: the sequence suffix is not 10 digits (kazoo's Lock, Semaphore and Election "
               "then see no contenders)", name)
    for m in made:
        seqs = [sequence_of(n) for n in m]
        expect(seqs == sorted(seqs) and len(set(seqs)) == len(seqs),
               "one client's sequence numbers do not grow: %s", seqs)
    expect(sorted(a.get_children(path)) == sorted(n.rsplit("/", 1)[1] for n in names),
           "the children are not the names the creates returned")
    return "40 concurrent creates from 4 sessions: distinct, growing, 10-digit numbers"


def check_sequential_slash(env, args):
    path = env.path
    a = env.client()
    a.ensure_path(path)
    # ZooKeeper checks a sequential create's path with its sequence number
    # appended, so a path ending in / names the node by the number alone.
    try:
        bare = a.create(path + "/", b"", sequence=True)
    except KazooException as e:
        raise CheckFailed("create(%r, sequence=True) refused with %s; ZooKeeper takes it "
                          "(the node is named by its sequence number)" % (path + "/", describe(e)))
    expect(re.match(re.escape(path) + r"/\d{10}$", bare), "create(path/, sequence) gave %r", bare)
    expect(a.get_children(path) == [bare.rsplit("/", 1)[1]], "children %s after creating %s",
           a.get_children(path), bare)
    return "create(%s/, sequence=True) names the node by its number alone" % path.rsplit("/")[-1]


def check_reconnect(env, args):
    path = env.path
    proxy = env.proxy()
    a = env.proxied_client(proxy)
    b = env.client()
    a.add_auth("digest", "kazoo:secret")
    node, eph = path + "/d", path + "/eph"
    a.create(node, b"before", makepath=True)
    a.create(eph, b"", ephemeral=True)
    session = a.client_id
    guard = threading.Lock()
    datas = []
    DataWatch(a, node)(lambda data, stat: datas.append(data))
    states = []
    connected = threading.Event()
    suspended = threading.Event()

    def listener(state):
        with guard:
            states.append(state)
        if state == KazooState.SUSPENDED:
            suspended.set()
        elif state == KazooState.CONNECTED:
            connected.set()

    a.add_listener(listener)
    for round_, block in enumerate((True, False)):
        suspended.clear()
        connected.clear()
        proxy.cut(block=block)
        wait_event(suspended, "the client to notice its connection cut (round %d)" % round_)
        b.set(node, b"while away %d" % round_)
        proxy.unblock()
        wait_event(connected, "the client to reconnect (round %d)" % round_)
        expect(a.client_id is not None and a.client_id[0] == session[0],
               "the client came back with session %r, not %#x", a.client_id, session[0])
        stat = b.exists(eph)
        expect(stat is not None and stat.ephemeralOwner == session[0],
               "the ephemeral node did not survive a reconnect: %s", stat)
        wait_for(lambda: b"while away %d" % round_ in datas,
                 "DataWatch to catch up on a change made while disconnected")
    expect(KazooState.LOST not in states, "the session was lost: states %s", states)
    a.set(node, b"after")
    expect(b.get(node)[0] == b"after", "a write after reconnecting did not land")
    return "connection cut twice: same session, ephemeral kept, auth resent, DataWatch caught up"


def check_session_expiry(env, args):
    path = env.path
    proxy = env.proxy()
    a = env.proxied_client(proxy, timeout=1.0)
    observer = env.client()
    node = path + "/eph"
    a.create(node, b"", ephemeral=True, makepath=True)
    session = a.client_id
    states = []
    changed = threading.Event()
    lost = threading.Event()

    def listener(state):
        states.append(state)
        changed.set()
        if state == KazooState.LOST:
            lost.set()

    a.add_listener(listener)
    # Idle past the session timeout (1 s asked; the server may grant up to
    # its minimum): the client's pings keep the session.
    idle = 2.5
    expect(not changed.wait(idle), "an idle client's connection went %s within %.1f s: pings "
           "do not keep it", states, idle)
    expect(observer.exists(node) is not None, "an idle session's ephemeral node is gone")
    gone = threading.Event()
    observer.exists(node, watch=lambda e: gone.set())
    t0 = time.monotonic()
    proxy.cut(block=True)
    wait_event(gone, "the server to expire the session of a client cut off")
    after = time.monotonic() - t0
    expect(observer.exists(node) is None, "the expired session's node is still there")
    proxy.unblock()
    wait_event(lost, "the cut-off client to find its session expired (LOST)")
    wait_for(lambda: a.connected and a.client_id, "the client to open a new session")
    expect(a.client_id[0] != session[0], "the client resumed an expired session")
    return ("idle %.1f s on a 1 s timeout, kept by pings; cut off: expired after %.1f s, "
            "node gone, client LOST, then a new session" % (idle, after))


def check_session_close(env, args):
    """The way kazoo's own test harness expires a session: a second
    connection attaches to the session and closes it."""
    path = env.path
    a, observer = env.clients(2)
    a.ensure_path(path)
    node = path + "/eph"
    a.create(node, ephemeral=True)
    states = []
    lost = threading.Event()

    def listener(state):
        states.append(state)
        if state == KazooState.LOST:
            lost.set()

    a.add_listener(listener)
    session = a.client_id
    twin = env.client(client_id=session)
    twin_session = twin.client_id
    expect(twin_session is not None and twin_session[0] == session[0],
           "the twin got session %r, not %#x", twin_session, session[0])
    twin.stop()  # closes the shared session
    wait_for(lambda: observer.exists(node) is None, "the session's ephemeral node to go")
    # The first client finds its session gone (at its next request or ping).
    try:
        a.exists(path)
    except KazooException:
        pass
    wait_event(lost, "the client whose session was closed to see it LOST")
    return "a session closed by another connection: its node goes, its client sees LOST"


def check_acl(env, args):
    """Digest ACLs as kazoo sets them (auth_data and default_acl): a lock
    whose nodes only its owner may touch, refusals for everyone else, and
    set_acls with its version."""
    path = env.path
    mine = [make_digest_acl("alice", "secret", all=True)]
    alice = env.client(auth_data=[("digest", "alice:secret")], default_acl=mine)
    alice2 = env.client(auth_data=[("digest", "alice:secret")], default_acl=mine)
    bob = env.client(auth_data=[("digest", "bob:other")])
    anonymous = env.client()
    alice.create(path, b"private", makepath=True)
    lock_path = path + "/lock"
    held = Lock(alice, lock_path, "alice-1")
    expect(held.acquire(timeout=WAIT), "alice's lock was not granted")
    expect(not Lock(alice2, lock_path, "alice-2").acquire(blocking=False),
           "a second holder of alice's lock")
    contenders = Lock(alice, lock_path).contenders()
    expect(contenders == ["alice-1"], "contenders %r", contenders)
    node = children(alice, lock_path)[0]
    acls, _ = alice.get_acls("%s/%s" % (lock_path, node))
    expect([(a.perms, a.id.scheme, a.id.id) for a in acls]
           == [(31, "digest", mine[0].id.id)], "the lock node's ACL %s", acls)
    for who, c in (("bob", bob), ("anonymous", anonymous)):
        for what, fn in [
            ("get", lambda: c.get(path)),
            ("set", lambda: c.set(path, b"x")),
            ("get_children of the lock", lambda: c.get_children(lock_path)),
            ("create", lambda: c.create(path + "/x")),
            ("get_acls", lambda: c.get_acls(path)),
            ("set_acls", lambda: c.set_acls(path, [make_acl("world", "anyone", all=True)])),
            ("a Lock's acquire", lambda: Lock(c, lock_path, who).acquire(timeout=WAIT)),
        ]:
            try:
                fn()
            except NoAuthError:
                continue
            except KazooException as e:
                raise CheckFailed("%s: %s raised %s, expected NoAuthError" % (who, what, describe(e)))
            raise CheckFailed("%s: %s succeeded, expected NoAuthError" % (who, what))
    try:
        anonymous.create(path + "-mine", acl=[make_acl("auth", "", all=True)])
        raise CheckFailed("an `auth` ACL without credentials was accepted")
    except InvalidACLError:
        pass
    held.release()
    # Readable by everyone from now on, by ACL version.
    _, stat = alice.get_acls(path)
    readable = mine + [make_acl("world", "anyone", read=True)]
    stat2 = alice.set_acls(path, readable, version=stat.aversion)
    expect(stat2.aversion == stat.aversion + 1, "aversion %s after %s", stat2.aversion, stat.aversion)
    try:
        alice.set_acls(path, mine, version=stat.aversion)
        raise CheckFailed("set_acls with a stale ACL version succeeded")
    except BadVersionError:
        pass
    expect(anonymous.get(path)[0] == b"private", "the node is not readable to everyone")
    try:
        anonymous.set(path, b"x")
        raise CheckFailed("a read-only node was written")
    except NoAuthError:
        pass
    alice.delete(path, recursive=True)
    return ("a lock under alice's digest ACL: NoAuth for bob and anonymous on every "
            "operation, set_acls by aversion")


CHECKS = [
    ("lock", check_lock),
    ("rwlock", check_rwlock),
    ("semaphore", check_semaphore),
    ("election", check_election),
    ("barrier", check_barrier),
    ("counter", check_counter),
    ("queue", check_queue),
    ("locking-queue", check_locking_queue),
    ("party", check_party),
    ("tree-cache", check_tree_cache),
    ("basics", check_basics),
    ("sequential", check_sequential),
    ("sequential-slash", check_sequential_slash),
    ("ephemeral", check_ephemeral),
    ("watches", check_watches),
    ("transaction", check_transaction),
    ("acl", check_acl),
    ("server-version", check_server_version),
    ("reconnect", check_reconnect),
    ("session-expiry", check_session_expiry),
    ("session-close", check_session_close),
]


def run_check(name, fn, hosts, root, args):
    """Runs one check in a thread of its own, bounded by --check-timeout.
    Returns ("ok" | "FAIL" | "skip", text)."""
    env = Env(hosts, root, name)
    outcome = {}

    def body():
        try:
            outcome["result"] = ("ok", fn(env, args))
        except Skip as e:
            outcome["result"] = ("skip", str(e))
        except CheckFailed as e:
            outcome["result"] = ("FAIL", str(e))
        except Exception as e:  # noqa: BLE001 (an unexpected error fails the check)
            if args.verbose:
                traceback.print_exc()
            outcome["result"] = ("FAIL", describe(e))

    t = threading.Thread(target=body, name="check " + name, daemon=True)
    t.start()
    t.join(args.check_timeout)
    if t.is_alive():
        result = ("FAIL", "did not finish within %.0f s" % args.check_timeout)
    else:
        result = outcome["result"]
    env.close()
    return result


def main():
    global WAIT
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hosts", help="ZooKeeper connect string, host:port[,host:port...]")
    parser.add_argument("--contenders", type=int, default=60,
                        help="lock contenders, each its own session (default 60, at least 2)")
    parser.add_argument("--check", action="append", choices=[n for n, _ in CHECKS],
                        metavar="NAME", help="run only this check (may be repeated; names: %s)"
                        % ", ".join(n for n, _ in CHECKS))
    parser.add_argument("--skip", action="append", choices=[n for n, _ in CHECKS], default=[],
                        metavar="NAME", help="leave this check out (may be repeated)")
    parser.add_argument("--check-timeout", type=float, default=60.0,
                        help="seconds a check may take (default 60)")
    parser.add_argument("--timeout", type=float, default=110.0,
                        help="seconds the whole run may take (default 110)")
    parser.add_argument("--verbose", action="store_true",
                        help="log kazoo's requests and replies (DEBUG) on stderr")
    args = parser.parse_args()
    if args.contenders < 2:
        parser.error("--contenders must be at least 2")
    WAIT = max(1.0, args.check_timeout / 2)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.ERROR, stream=sys.stderr,
        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")

    started = time.monotonic()

    def overall_timeout():
        print("FAIL overall: the run did not finish within %.0f s" % args.timeout, flush=True)
        os._exit(1)

    watchdog = threading.Timer(args.timeout, overall_timeout)
    watchdog.daemon = True
    watchdog.start()

    # The checks' root, below the connect string's chroot if it has one
    # (which the admin client, without it, makes first).
    servers, _, chroot = args.hosts.partition("/")
    root = "/kazoo-" + uuid.uuid4().hex[:12]
    full_root = ("/" + chroot.strip("/") if chroot.strip("/") else "") + root
    admin = KazooClient(hosts=servers, timeout=10.0)
    try:
        admin.start(timeout=15)
        admin.create(full_root, b"kazoo recipes test", makepath=True)
    except Exception as e:  # noqa: BLE001
        print("FAIL setup: cannot open a session and create %s on %s: %s"
              % (full_root, servers, describe(e)), flush=True)
        quietly_close(admin)
        return 1
    print("root %s on %s" % (root, args.hosts), flush=True)

    counts = {"ok": 0, "FAIL": 0, "skip": 0}
    try:
        for name, fn in CHECKS:
            if (args.check and name not in args.check) or name in args.skip:
                continue
            t0 = time.monotonic()
            status, text = run_check(name, fn, args.hosts, root, args)
            counts[status] += 1
            print("%s %s: %s (%.1f s)" % (status, name, text, time.monotonic() - t0), flush=True)
    finally:
        try:
            admin.delete(full_root, recursive=True)
        except Exception as e:  # noqa: BLE001
            print("warning: could not remove %s: %s" % (full_root, describe(e)), flush=True)
        quietly_close(admin)
    watchdog.cancel()
    print("%d ok, %d failed, %d skipped in %.1f s" % (
        counts["ok"], counts["FAIL"], counts["skip"], time.monotonic() - started), flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # Threads of a check that timed out may still be blocked in kazoo.
    os._exit(code)
