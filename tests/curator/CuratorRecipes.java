// Apache Curator's own recipes against Baton's ZooKeeper listener.
//
//   java -cp CLASSPATH tests/curator/CuratorRecipes.java HOSTS
//
// (Java's source-file mode: no build step.) CLASSPATH holds Curator 5 and
// ZooKeeper's client jars (Debian's libcurator-recipes-java and
// libzookeeper-java; tests/suite/zookeeper/curator.rs puts it together).
// Prints one line per check, "ok NAME: ..." or "FAIL NAME: ...", and exits 0
// only if every check passed. Every wait is bounded.

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.api.ACLProvider;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.atomic.AtomicValue;
import org.apache.curator.framework.recipes.atomic.DistributedAtomicLong;
import org.apache.curator.framework.recipes.cache.CuratorCache;
import org.apache.curator.framework.recipes.cache.CuratorCacheListener;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.curator.retry.RetryNTimes;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.data.ACL;
import org.apache.zookeeper.data.Stat;

public class CuratorRecipes {
    static String hosts;
    static String root;
    static int failures = 0;

    static CuratorFramework client() throws Exception {
        CuratorFramework c = CuratorFrameworkFactory.builder()
            .connectString(hosts)
            .sessionTimeoutMs(15_000)
            .connectionTimeoutMs(10_000)
            .retryPolicy(new ExponentialBackoffRetry(50, 10, 1_000))
            .build();
        c.start();
        if (!c.blockUntilConnected(30, TimeUnit.SECONDS)) {
            throw new IllegalStateException("no session within 30 s");
        }
        return c;
    }

    interface Check {
        String run() throws Exception;
    }

    static void check(String name, Check body) {
        long started = System.nanoTime();
        try {
            String what = body.run();
            System.out.printf("ok %s: %s (%.1f s)%n", name, what, (System.nanoTime() - started) / 1e9);
        } catch (Throwable e) {
            failures++;
            System.out.printf("FAIL %s: %s%n", name, e);
            e.printStackTrace(System.out);
        }
        System.out.flush();
    }

    static void require(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    /// Lock: CONTENDERS sessions queue behind a holder, then each takes the
    /// lock in turn: never two at once, in queue order, each with a token
    /// (its node's czxid) above every earlier one, and a fenced write (a
    /// transaction that checks its own node) that succeeds while it holds.
    static String mutex(int contenders) throws Exception {
        String path = root + "/mutex";
        CuratorFramework admin = client();
        InterProcessMutex gate = new InterProcessMutex(admin, path);
        require(gate.acquire(30, TimeUnit.SECONDS), "the gate holder got the lock");
        admin.create().creatingParentContainersIfNeeded().forPath(root + "/register", new byte[0]);
        AtomicInteger holders = new AtomicInteger();
        AtomicInteger violations = new AtomicInteger();
        AtomicLong lastToken = new AtomicLong();
        List<String> granted = Collections.synchronizedList(new ArrayList<>());
        ExecutorService pool = Executors.newFixedThreadPool(contenders);
        List<CuratorFramework> clients = new ArrayList<>();
        List<Future<?>> done = new ArrayList<>();
        for (int i = 0; i < contenders; i++) {
            CuratorFramework c = client();
            clients.add(c);
            InterProcessMutex lock = new InterProcessMutex(c, path);
            done.add(pool.submit(() -> {
                if (!lock.acquire(60, TimeUnit.SECONDS)) {
                    throw new IllegalStateException("no grant within 60 s");
                }
                try {
                    if (holders.incrementAndGet() != 1) {
                        violations.incrementAndGet();
                    }
                    // While it holds, its node is the first participant.
                    String mine = lock.getParticipantNodes().iterator().next();
                    long token = c.checkExists().forPath(mine).getCzxid();
                    if (lastToken.getAndAccumulate(token, Math::max) >= token) {
                        violations.incrementAndGet();
                    }
                    c.transaction().forOperations(
                        c.transactionOp().check().forPath(mine),
                        c.transactionOp().setData().forPath(root + "/register", Long.toString(token).getBytes()));
                    granted.add(mine.substring(mine.lastIndexOf('/') + 1));
                    holders.decrementAndGet();
                } finally {
                    lock.release();
                }
                return null;
            }));
        }
        long deadline = System.currentTimeMillis() + 60_000;
        while (gate.getParticipantNodes().size() < contenders + 1) {
            require(System.currentTimeMillis() < deadline, "every contender queued within 60 s");
            Thread.sleep(20);
        }
        List<String> queue = new ArrayList<>();
        for (String node : gate.getParticipantNodes()) {
            queue.add(node.substring(node.lastIndexOf('/') + 1));
        }
        queue.remove(0); // the gate's own node
        gate.release();
        for (Future<?> f : done) {
            f.get(90, TimeUnit.SECONDS);
        }
        pool.shutdown();
        for (CuratorFramework c : clients) {
            c.close();
        }
        String register = new String(admin.getData().forPath(root + "/register"));
        admin.close();
        require(violations.get() == 0, violations.get() + " violations");
        require(granted.equals(queue), "grants in queue order: " + granted + " against " + queue);
        require(register.equals(Long.toString(lastToken.get())), "the register holds the last token");
        return contenders + " contenders, FIFO, one holder at a time, tokens increasing, fenced writes";
    }

    static String leaderLatch() throws Exception {
        String path = root + "/latch";
        List<CuratorFramework> clients = new ArrayList<>();
        List<LeaderLatch> latches = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            CuratorFramework c = client();
            clients.add(c);
            LeaderLatch latch = new LeaderLatch(c, path, "member-" + i);
            latch.start();
            latches.add(latch);
        }
        LeaderLatch leader = null;
        long deadline = System.currentTimeMillis() + 30_000;
        while (leader == null) {
            require(System.currentTimeMillis() < deadline, "a leader within 30 s");
            int leading = 0;
            for (LeaderLatch l : latches) {
                if (l.hasLeadership()) {
                    leading++;
                    leader = l;
                }
            }
            require(leading <= 1, leading + " leaders at once");
            if (leader == null) {
                Thread.sleep(20);
            }
        }
        String first = leader.getId();
        require(latches.get(0).getLeader().getId().equals(first), "everyone sees the same leader");
        leader.close();
        latches.remove(leader);
        LeaderLatch next = null;
        deadline = System.currentTimeMillis() + 30_000;
        while (next == null) {
            require(System.currentTimeMillis() < deadline, "a new leader within 30 s");
            for (LeaderLatch l : latches) {
                if (l.hasLeadership()) {
                    next = l;
                }
            }
            if (next == null) {
                Thread.sleep(20);
            }
        }
        for (LeaderLatch l : latches) {
            l.close();
        }
        for (CuratorFramework c : clients) {
            c.close();
        }
        return first + " led, then " + next.getId() + " when it left";
    }

    static String atomicLong() throws Exception {
        String path = root + "/counter";
        ExecutorService pool = Executors.newFixedThreadPool(4);
        List<Future<?>> done = new ArrayList<>();
        List<CuratorFramework> clients = new ArrayList<>();
        for (int t = 0; t < 4; t++) {
            CuratorFramework c = client();
            clients.add(c);
            DistributedAtomicLong counter = new DistributedAtomicLong(c, path, new RetryNTimes(1000, 1));
            done.add(pool.submit(() -> {
                for (int i = 0; i < 25; i++) {
                    AtomicValue<Long> v = counter.increment();
                    if (!v.succeeded()) {
                        throw new IllegalStateException("an increment did not succeed");
                    }
                }
                return null;
            }));
        }
        for (Future<?> f : done) {
            f.get(60, TimeUnit.SECONDS);
        }
        pool.shutdown();
        long total = new DistributedAtomicLong(clients.get(0), path, new RetryNTimes(10, 1)).get().postValue();
        for (CuratorFramework c : clients) {
            c.close();
        }
        require(total == 100, "the counter is " + total);
        return "4 clients x 25 increments = 100";
    }

    static String semaphore() throws Exception {
        String path = root + "/semaphore";
        AtomicInteger holding = new AtomicInteger();
        AtomicInteger most = new AtomicInteger();
        ExecutorService pool = Executors.newFixedThreadPool(8);
        List<Future<?>> done = new ArrayList<>();
        List<CuratorFramework> clients = new ArrayList<>();
        for (int i = 0; i < 8; i++) {
            CuratorFramework c = client();
            clients.add(c);
            InterProcessSemaphoreV2 sem = new InterProcessSemaphoreV2(c, path, 3);
            done.add(pool.submit(() -> {
                for (int round = 0; round < 3; round++) {
                    Lease lease = sem.acquire(60, TimeUnit.SECONDS);
                    if (lease == null) {
                        throw new IllegalStateException("no lease within 60 s");
                    }
                    int now = holding.incrementAndGet();
                    most.accumulateAndGet(now, Math::max);
                    Thread.sleep(2);
                    holding.decrementAndGet();
                    sem.returnLease(lease);
                }
                return null;
            }));
        }
        for (Future<?> f : done) {
            f.get(90, TimeUnit.SECONDS);
        }
        pool.shutdown();
        for (CuratorFramework c : clients) {
            c.close();
        }
        require(most.get() <= 3, most.get() + " leases held at once, of 3");
        return "8 contenders x 3 rounds, at most " + most.get() + " of 3 leases at once";
    }

    static String cache() throws Exception {
        String path = root + "/cache";
        CuratorFramework c = client();
        c.create().creatingParentContainersIfNeeded().forPath(path, "0".getBytes());
        List<String> events = Collections.synchronizedList(new ArrayList<>());
        CountDownLatch deleted = new CountDownLatch(1);
        CountDownLatch primed = new CountDownLatch(1);
        CuratorCache cache = CuratorCache.build(c, path);
        cache.listenable().addListener(CuratorCacheListener.builder()
            .forCreates(n -> events.add("created " + n.getPath()))
            .forChanges((before, after) -> events.add("changed " + after.getPath() + " " + new String(after.getData())))
            .forDeletes(n -> {
                events.add("deleted " + n.getPath());
                if (n.getPath().equals(path + "/a")) {
                    deleted.countDown();
                }
            })
            .forInitialized(primed::countDown)
            .build());
        cache.start();
        require(primed.await(30, TimeUnit.SECONDS), "the cache primed within 30 s");
        // One change at a time: the cache reads a node it is told of, and a
        // node created and deleted at once may be gone before it reads it.
        c.create().withMode(CreateMode.PERSISTENT).forPath(path + "/a", "x".getBytes());
        waitFor(events, "created " + path + "/a");
        c.setData().forPath(path + "/a", "y".getBytes());
        waitFor(events, "changed " + path + "/a y");
        c.delete().forPath(path + "/a");
        require(deleted.await(30, TimeUnit.SECONDS), "the deletion reached the cache: " + events);
        cache.close();
        c.close();
        require(events.contains("created " + path + "/a"), "creation seen: " + events);
        require(events.contains("changed " + path + "/a y"), "change seen: " + events);
        return "CuratorCache saw " + events.size() + " events, creates, changes and deletes";
    }

    /// Waits up to 30 s for `event` among `events`.
    static void waitFor(List<String> events, String event) throws InterruptedException {
        long deadline = System.currentTimeMillis() + 30_000;
        while (!events.contains(event)) {
            require(System.currentTimeMillis() < deadline, "no " + event + " within 30 s: " + events);
            Thread.sleep(10);
        }
    }

    static String basics() throws Exception {
        CuratorFramework c = client();
        String seq = c.create().creatingParentContainersIfNeeded()
            .withMode(CreateMode.EPHEMERAL_SEQUENTIAL).forPath(root + "/basics/job-", "x".getBytes());
        require(seq.matches(".*/job-\\d{10}"), "a 10-digit suffix: " + seq);
        Stat stat = c.checkExists().forPath(seq);
        require(stat.getEphemeralOwner() == c.getZookeeperClient().getZooKeeper().getSessionId(), "owned by its session");
        require(c.getChildren().forPath(root + "/basics").size() == 1, "listed");
        c.sync().forPath(root);
        c.close();
        return "sequential ephemeral " + seq.substring(seq.lastIndexOf('/') + 1) + ", stat, children, sync";
    }

    /// ACLs as Curator sets them: a client with a digest credential whose
    /// ACL provider gives its nodes under PREFIX the creator's ACL
    /// (CREATOR_ALL_ACL, which the server fills in with the credential).
    static CuratorFramework owner(String credential, String prefix) throws Exception {
        ACLProvider acls = new ACLProvider() {
            public List<ACL> getDefaultAcl() {
                return ZooDefs.Ids.OPEN_ACL_UNSAFE;
            }

            public List<ACL> getAclForPath(String path) {
                return path.startsWith(prefix) ? ZooDefs.Ids.CREATOR_ALL_ACL : ZooDefs.Ids.OPEN_ACL_UNSAFE;
            }
        };
        CuratorFramework c = CuratorFrameworkFactory.builder()
            .connectString(hosts)
            .sessionTimeoutMs(15_000)
            .connectionTimeoutMs(10_000)
            .retryPolicy(new ExponentialBackoffRetry(50, 10, 1_000))
            .authorization("digest", credential.getBytes())
            .aclProvider(acls)
            .build();
        c.start();
        if (!c.blockUntilConnected(30, TimeUnit.SECONDS)) {
            throw new IllegalStateException("no session within 30 s");
        }
        return c;
    }

    /// An InterProcessMutex whose nodes only its owner may touch: the
    /// lock node's ACL names alice's digest, and a client without her
    /// credential gets NoAuth reading it or joining the lock's queue.
    static String acl() throws Exception {
        String prefix = root + "/acl";
        CuratorFramework alice = owner("alice:secret", prefix);
        CuratorFramework other = client();
        String lockPath = prefix + "/lock";
        InterProcessMutex held = new InterProcessMutex(alice, lockPath);
        require(held.acquire(30, TimeUnit.SECONDS), "alice's lock granted");
        List<String> nodes = alice.getChildren().forPath(lockPath);
        require(nodes.size() == 1, "one lock node: " + nodes);
        String node = lockPath + "/" + nodes.get(0);
        List<ACL> acl = alice.getACL().forPath(node);
        require(acl.size() == 1 && acl.get(0).getId().getScheme().equals("digest")
            && acl.get(0).getId().getId().startsWith("alice:") && acl.get(0).getPerms() == ZooDefs.Perms.ALL,
            "the lock node's ACL names alice's digest: " + acl);
        try {
            other.getData().forPath(node);
            throw new AssertionError("a client without alice's credential read her lock node");
        } catch (KeeperException.NoAuthException expected) {
        }
        try {
            other.create().withMode(CreateMode.EPHEMERAL_SEQUENTIAL).forPath(lockPath + "/intruder-");
            throw new AssertionError("a client without alice's credential joined her lock");
        } catch (KeeperException.NoAuthException expected) {
        }
        held.release();
        alice.delete().deletingChildrenIfNeeded().forPath(prefix);
        alice.close();
        other.close();
        return "a lock under CREATOR_ALL_ACL: its node names alice's digest; NoAuth for others";
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: java -cp CLASSPATH CuratorRecipes.java HOSTS");
            System.exit(2);
        }
        hosts = args[0];
        root = "/curator-" + Long.toHexString(System.nanoTime());
        check("basics", CuratorRecipes::basics);
        check("mutex", () -> mutex(30));
        check("leader-latch", CuratorRecipes::leaderLatch);
        check("atomic-long", CuratorRecipes::atomicLong);
        check("semaphore", CuratorRecipes::semaphore);
        check("cache", CuratorRecipes::cache);
        check("acl", CuratorRecipes::acl);
        System.out.println(failures == 0 ? "all checks passed" : failures + " checks failed");
        System.exit(failures == 0 ? 0 : 1);
    }
}
