// ZooKeeper's own Java client across the loss of a Baton cluster's leader:
// its persistent recursive watch and a one-shot watch are set again on the
// new leader (setWatches2), and report the changes made there.
//
//   java -cp CLASSPATH tests/curator/WatchFailover.java HOSTS
//
// It sets its watches, prints "ready", and waits for a line on its stdin:
// meanwhile the test kills the leader. Then it creates nodes and waits for
// their events. Prints "ok ..." and exits 0, or "FAIL ..." and exits 1.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

import org.apache.zookeeper.AddWatchMode;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.WatchedEvent;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.ZooKeeper;

public class WatchFailover {
    static void fail(String why) {
        System.out.println("FAIL " + why);
        System.exit(1);
    }

    /// Creates `path`, sending it again after a connection loss (the
    /// leader it went to may be gone); a node already there from an
    /// earlier try is fine.
    static void create(ZooKeeper zk, String path) throws Exception {
        long deadline = System.currentTimeMillis() + 30_000;
        while (true) {
            try {
                zk.create(path, new byte[0], ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
                return;
            } catch (KeeperException.NodeExistsException e) {
                return;
            } catch (KeeperException.ConnectionLossException e) {
                if (System.currentTimeMillis() > deadline) {
                    throw e;
                }
                Thread.sleep(50);
            }
        }
    }

    static WatchedEvent next(BlockingQueue<WatchedEvent> events, String what) throws Exception {
        WatchedEvent e = events.poll(30, TimeUnit.SECONDS);
        if (e == null) {
            fail("no event within 30 s: " + what);
        }
        return e;
    }

    public static void main(String[] args) throws Exception {
        String root = "/watch-failover-" + Long.toHexString(System.nanoTime());
        CountDownLatch connected = new CountDownLatch(1);
        ZooKeeper zk = new ZooKeeper(args[0], 15_000, e -> {
            if (e.getState() == Watcher.Event.KeeperState.SyncConnected) {
                connected.countDown();
            }
        });
        if (!connected.await(30, TimeUnit.SECONDS)) {
            fail("no session within 30 s");
        }
        create(zk, root);
        BlockingQueue<WatchedEvent> persistent = new LinkedBlockingQueue<>();
        zk.addWatch(root, e -> {
            if (e.getType() != Watcher.Event.EventType.None) {
                persistent.add(e);
            }
        }, AddWatchMode.PERSISTENT_RECURSIVE);
        BlockingQueue<WatchedEvent> oneShot = new LinkedBlockingQueue<>();
        // Watchers hear the connection's ups and downs too (type None).
        Watcher onNode = e -> {
            if (e.getType() != Watcher.Event.EventType.None) {
                oneShot.add(e);
            }
        };
        if (zk.exists(root + "/later", onNode) != null) {
            fail(root + "/later exists already");
        }
        create(zk, root + "/before");
        WatchedEvent e = next(persistent, "the creation before the failover");
        if (!e.getPath().equals(root + "/before")) {
            fail("unexpected event " + e);
        }
        System.out.println("ready");
        System.out.flush();
        new BufferedReader(new InputStreamReader(System.in)).readLine();

        long session = zk.getSessionId();
        create(zk, root + "/later");
        e = next(oneShot, "the exists watch, set again on the new leader");
        if (e.getType() != Watcher.Event.EventType.NodeCreated || !e.getPath().equals(root + "/later")) {
            fail("unexpected one-shot event " + e);
        }
        e = next(persistent, "the persistent watch, set again on the new leader");
        if (e.getType() != Watcher.Event.EventType.NodeCreated || !e.getPath().equals(root + "/later")) {
            fail("unexpected persistent event " + e);
        }
        // A node no one-shot watch names: only the persistent watch the
        // server set again can report it (Java's client hands one event to
        // every watcher of its path, so the one above does not show it).
        create(zk, root + "/only-persistent");
        e = next(persistent, "the persistent watch alone, on the new leader");
        if (e.getType() != Watcher.Event.EventType.NodeCreated || !e.getPath().equals(root + "/only-persistent")) {
            fail("unexpected persistent event " + e);
        }
        if (zk.getSessionId() != session) {
            fail("the session changed");
        }
        zk.close();
        System.out.println("ok: the same session; its exists and persistent recursive watches reported the change made on the new leader");
    }
}
