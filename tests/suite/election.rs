//! Leader election with fenced epochs, against a real server.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::recipes::{LeaseState, LostReason};
use baton::{CreateMode, Election, Error};
use baton_testkit::*;
use futures::{FutureExt, StreamExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_within_the_session_timeout_plus_one_second() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let timeout = Duration::from_millis(1000);
    let active = connect_with_timeout(&proxy.addr(), timeout).await;
    let standby = server.client().await;
    let leadership = Election::new(&active, "/election/master")
        .campaign("host-a:16000")
        .await
        .unwrap();
    let election = Election::new(&standby, "/election/master");
    let waiting = {
        let election = election.clone();
        tokio::spawn(async move { election.campaign("host-b:16000").await })
    };
    eventually_async(10, "the standby to queue", || async {
        queued(&standby, "/election/master").await == 2
    })
    .await;
    // The active master's host drops off the network.
    let cut = Instant::now();
    proxy.hold();
    proxy.block();
    let new = within(10, "the standby to lead", waiting)
        .await
        .unwrap()
        .unwrap();
    let failover = cut.elapsed();
    assert!(
        failover <= timeout + Duration::from_secs(1),
        "failover took {failover:?}"
    );
    assert!(new.token() > leadership.token());
    assert_eq!(&new.value()[..], b"host-b:16000");
    let leader = election.leader().await.unwrap().unwrap();
    assert_eq!(leader.token, new.token());
    assert_eq!(&leader.value[..], b"host-b:16000");
    // The old leader learns it too, by its own clock.
    let reason = within(5, "the old leader to learn", leadership.lost()).await;
    assert!(
        matches!(
            reason,
            LostReason::DeadlinePassed | LostReason::SessionExpired
        ),
        "{reason:?}"
    );
    new.resign().await.unwrap();
    standby.close().await;
    server.stop().await;
}

/// Counts the candidates queued in an election.
#[tokio::test]
async fn a_lost_leadership_stays_lost_when_a_late_answer_moves_the_deadline() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let client = connect_with_timeout(&proxy.addr(), Duration::from_secs(2)).await;
    let leadership = Election::new(&client, "/election/late")
        .campaign("a")
        .await
        .unwrap();
    proxy.hold_replies_everywhere();
    let reason = within(10, "leadership to run out", leadership.lost()).await;
    assert_eq!(reason, LostReason::DeadlinePassed);
    assert!(leadership.is_lost());
    proxy.release();
    wait_state(&client, baton::SessionState::Reconnected).await;
    assert!(
        client.session_deadline() > tokio::time::Instant::now(),
        "the late answer moved the deadline on"
    );
    assert!(leadership.is_lost(), "lost, then not lost");
    assert_eq!(
        leadership.state(),
        LeaseState::Lost(LostReason::DeadlinePassed)
    );
    assert_eq!(
        leadership.lost().now_or_never(),
        Some(LostReason::DeadlinePassed)
    );
    client.close().await;
    server.stop().await;
}

#[tokio::test]
async fn leadership_is_lost_before_the_server_may_expire_the_session() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let client = connect_with_timeout(&proxy.addr(), Duration::from_millis(1000)).await;
    let margin = Duration::from_millis(300);
    let leadership = Election::new(&client, "/election/early")
        .stop_before(margin)
        .campaign("a")
        .await
        .unwrap();
    proxy.hold();
    proxy.block();
    let reason = within(10, "leadership to run out", leadership.lost()).await;
    let now = tokio::time::Instant::now();
    assert_eq!(reason, LostReason::DeadlinePassed);
    let deadline = client.session_deadline();
    assert!(
        now < deadline,
        "told {:?} after the deadline",
        now - deadline
    );
    assert!(deadline - now <= margin, "{:?} early", deadline - now);
    client.close().await;
    server.stop().await;
}

async fn queued(client: &baton::Client, path: &str) -> usize {
    baton::Lock::new(client, path)
        .contenders()
        .await
        .unwrap()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_intervals_never_overlap_and_epochs_grow() {
    let server = TestServer::start().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let client = server.client().await;
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let election = Election::new(&client, "/election/rotating");
            for _ in 0..5 {
                let lead = election.campaign(format!("candidate {i}")).await.unwrap();
                log.lock().unwrap().push((lead.token(), "start"));
                tokio::task::yield_now().await;
                log.lock().unwrap().push((lead.token(), "end"));
                lead.resign().await.unwrap();
            }
            client.close().await;
        }));
    }
    within(60, "every candidate to lead five times", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 80);
    for pair in log.chunks(2) {
        assert_eq!(
            pair[0].0, pair[1].0,
            "a leadership ends before the next starts: {pair:?}"
        );
        assert_eq!((pair[0].1, pair[1].1), ("start", "end"));
    }
    let epochs: Vec<_> = log.iter().step_by(2).map(|(t, _)| *t).collect();
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "{epochs:?}");
    server.stop().await;
}

#[tokio::test]
async fn resign_hands_over_at_once() {
    let server = TestServer::start().await;
    let a = server.client().await;
    let b = server.client().await;
    let first = Election::new(&a, "/election/resign")
        .campaign("a")
        .await
        .unwrap();
    let election = Election::new(&b, "/election/resign");
    let next = {
        let election = election.clone();
        tokio::spawn(async move { election.campaign("b").await })
    };
    eventually_async(10, "b to queue", || async {
        queued(&a, "/election/resign").await == 2
    })
    .await;
    let old = first.token();
    first.resign().await.unwrap();
    let second = within(2, "b to lead", next).await.unwrap().unwrap();
    assert!(second.token() > old);
    assert_eq!(election.leader().await.unwrap().unwrap().value, "b");
    a.close().await;
    b.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_candidates_succeed_each_other_with_one_notification_each() {
    let server = TestServer::start().await;
    const CANDIDATES: usize = 100;
    let mut clients = Vec::new();
    let mut campaigns = Vec::new();
    for i in 0..CANDIDATES {
        let client = server.client().await;
        let election = Election::new(&client, "/election/hundred");
        campaigns.push(tokio::spawn(async move {
            election.campaign(format!("c{i}")).await
        }));
        clients.push(client);
        let expected = i + 1;
        eventually_async(10, "the candidate to queue", || async {
            queued(&clients[0], "/election/hundred").await == expected
        })
        .await;
    }
    let events_before = server.stats().watch_events;
    let mut last = None;
    for (i, campaign) in campaigns.into_iter().enumerate() {
        let lead = within(10, "the next leader", campaign)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            lead.value(),
            &format!("c{i}"),
            "candidates lead in the order they joined"
        );
        assert!(Some(lead.token()) > last);
        last = Some(lead.token());
        lead.resign().await.unwrap();
    }
    let events = server.stats().watch_events - events_before;
    assert_eq!(
        events,
        CANDIDATES as u64 - 1,
        "one notification per succession"
    );
    for c in clients {
        c.close().await;
    }
    server.stop().await;
}

#[tokio::test]
async fn observers_see_every_change_of_leader_in_order() {
    let server = TestServer::start().await;
    let watcher = server.client().await;
    let mut changes = Box::pin(Election::new(&watcher, "/election/observed").observe());
    assert_eq!(
        within(5, "the first report", changes.next())
            .await
            .unwrap()
            .unwrap(),
        None
    );
    let mut expected = Vec::new();
    let clients = [
        server.client().await,
        server.client().await,
        server.client().await,
    ];
    for (i, c) in clients.iter().enumerate() {
        let lead = Election::new(c, "/election/observed")
            .campaign(format!("leader {i}"))
            .await
            .unwrap();
        let seen = within(5, "the observer to see the leader", changes.next())
            .await
            .unwrap()
            .unwrap()
            .expect("a leader");
        assert_eq!(seen.token, lead.token());
        assert_eq!(seen.value, format!("leader {i}"));
        expected.push(lead.token());
        lead.resign().await.unwrap();
        let seen = within(5, "the observer to see no leader", changes.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen, None);
    }
    assert!(expected.windows(2).all(|w| w[0] < w[1]));
    watcher.close().await;
    for c in clients {
        c.close().await;
    }
    server.stop().await;
}

#[tokio::test]
async fn a_candidate_whose_session_expired_never_leads() {
    let server = TestServer::start().await;
    let leader_client = server.client().await;
    let leader = Election::new(&leader_client, "/election/expired")
        .campaign("leader")
        .await
        .unwrap();
    let proxy = Proxy::start(server.addr).await;
    let doomed = connect_with_timeout(&proxy.addr(), Duration::from_millis(300)).await;
    let election = Election::new(&doomed, "/election/expired");
    let campaign = tokio::spawn(async move { election.campaign("doomed").await });
    eventually_async(10, "the candidate to queue", || async {
        queued(&leader_client, "/election/expired").await == 2
    })
    .await;
    proxy.sever();
    proxy.block();
    eventually(10, "the session to expire", || {
        server.stats().sessions_expired >= 1
    })
    .await;
    // The leader steps down: the expired candidate's node is already gone,
    // so nobody is reported leading on its behalf.
    leader.resign().await.unwrap();
    let observer = Election::new(&leader_client, "/election/expired");
    assert_eq!(observer.leader().await.unwrap(), None);
    proxy.unblock();
    let result = within(10, "the campaign to fail", campaign).await.unwrap();
    assert!(
        matches!(result, Err(Error::SessionExpired(_))),
        "{result:?}"
    );
    // Fenced: a write with the expired leader's epoch is refused once a
    // later epoch wrote.
    let store = server.client().await;
    store
        .create("/record", "", CreateMode::Persistent)
        .await
        .unwrap();
    let next = Election::new(&store, "/election/expired")
        .campaign("next")
        .await
        .unwrap();
    store
        .set_data_fenced("/record", "next", next.token().get())
        .await
        .unwrap();
    assert!(matches!(
        store
            .set_data_fenced("/record", "old", next.token().get() - 1)
            .await,
        Err(Error::StaleFence(_))
    ));
    leader_client.close().await;
    store.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_resign_cancelled_while_waiting_for_room_still_resigns() {
    let server = TestServer::start().await;
    let observer = server.client().await;
    let proxy = Proxy::start(server.addr).await;
    let leader = connect_with_timeout(&proxy.addr(), Duration::from_secs(10)).await;
    leader
        .create("/big", "", CreateMode::Persistent)
        .await
        .unwrap();
    let leadership = Election::new(&leader, "/election/stalled")
        .campaign("host-a")
        .await
        .unwrap();
    let writes = stall_behind_big_writes(&leader, &proxy, "/big").await;
    // The resign's delete waits in line behind the writes; the caller gives
    // up on it there.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), leadership.resign())
            .await
            .is_err()
    );
    proxy.release();
    let election = Election::new(&observer, "/election/stalled");
    eventually_async(10, "the leader to be gone", || async {
        election.leader().await.unwrap().is_none()
    })
    .await;
    for write in writes {
        within(10, "the writes to be answered", write)
            .await
            .unwrap()
            .unwrap();
    }
    leader.close().await;
    observer.close().await;
    server.stop().await;
}

/// A leadership shorter than a round trip is still reported: two leaders
/// resign back to back (the second leads between the two deletes), and
/// the observer reports the first, the second and the third in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_see_a_leadership_that_ends_before_anyone_could_read_it() {
    let server = TestServer::start().await;
    let watcher = server.client().await;
    let clients = [
        server.client().await,
        server.client().await,
        server.client().await,
    ];
    let (mut leaders, mut queued) = (Vec::new(), Vec::new());
    for (i, c) in clients.iter().enumerate() {
        let election = Election::new(c, "/election/short");
        if i == 0 {
            leaders.push(election.campaign("first").await.unwrap());
        } else {
            // Queued behind the first.
            let value = format!("candidate {i}");
            let joined = tokio::spawn(async move { election.campaign(value).await.unwrap() });
            eventually_async(10, "the candidate to queue", || {
                let c = watcher.clone();
                async move { c.get_children("/election/short").await.unwrap().0.len() == i + 1 }
            })
            .await;
            queued.push(joined);
        }
    }
    let mut changes = Box::pin(Election::new(&watcher, "/election/short").observe());
    let first = within(5, "the first report", changes.next())
        .await
        .unwrap()
        .unwrap()
        .expect("a leader");
    assert_eq!(first.value, "first");
    // The first resigns and the second's node goes right behind it, both
    // deletes sent without waiting: the second leads for no time at all.
    let (names, _) = watcher.get_children("/election/short").await.unwrap();
    let mut nodes: Vec<String> = names
        .iter()
        .map(|n| format!("/election/short/{n}"))
        .collect();
    nodes.sort_by_key(|n| n.rsplit('-').next().unwrap().to_owned());
    let (a, b) = tokio::join!(
        watcher.delete(&nodes[0], None),
        watcher.delete(&nodes[1], None)
    );
    a.unwrap();
    b.unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let l = within(5, "the next leader", changes.next())
            .await
            .unwrap()
            .unwrap()
            .expect("a leader");
        seen.push(l.token);
    }
    let tokens: Vec<u64> = nodes[1..]
        .iter()
        .map(|n| n.rsplit('-').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        seen.iter().map(|t| t.get()).collect::<Vec<_>>(),
        tokens,
        "the second leader, then the third"
    );
    drop(leaders);
    drop(queued);
    watcher.close().await;
    for c in clients {
        c.close().await;
    }
    server.stop().await;
}
