//! The fencing check of `examples/postgres_fencing.rs` against a real
//! PostgreSQL server: one conditional `UPDATE` that refuses a write whose
//! token is lower than the highest that wrote the row, with tokens from
//! Baton's lock.
//!
//! Needs `BATON_TEST_POSTGRES`, a connection string such as
//! `host=127.0.0.1 port=5432 user=postgres dbname=postgres` for a role that
//! may create tables and functions. Without it every test here says it is
//! skipped and passes; with it, a server that cannot be reached fails them.
//! `.ci/run` starts a server (`.ci/postgres`) and sets it. Each test works in
//! tables of its own, named after the process id, and drops them at the end.

use std::env::VarError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton::recipes::LostReason;
use baton::{FencingToken, Lock};
use baton_testkit::*;
use tokio_postgres::NoTls;

const ENV: &str = "BATON_TEST_POSTGRES";

/// The connection string, or `None` (having said why the test is skipped).
fn conn_string(test: &str) -> Option<String> {
    match std::env::var(ENV) {
        Ok(conn) if conn.trim().is_empty() => {
            panic!("{ENV} is set but empty: unset it to skip the PostgreSQL tests")
        }
        Ok(conn) => Some(conn),
        Err(VarError::NotPresent) => {
            eprintln!(
                "skipping the PostgreSQL test '{test}': {ENV} is not set (e.g. {ENV}=\"host=127.0.0.1 port=5432 \
                 user=postgres dbname=postgres\"; .ci/run starts a server and sets it)"
            );
            None
        }
        Err(VarError::NotUnicode(_)) => panic!("{ENV} is not valid UTF-8"),
    }
}

/// `e` and its sources on one line (tokio-postgres keeps the server's
/// message in the source).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s = s.to_string();
        if !text.contains(&s) {
            text = format!("{text}: {s}");
        }
        source = source.and_then(std::error::Error::source);
    }
    text
}

/// A new connection; panics, naming the server (not the password), if there
/// is none to be had.
async fn connect(conn: &str) -> tokio_postgres::Client {
    let mut config: tokio_postgres::Config = conn
        .parse()
        .unwrap_or_else(|e| panic!("{ENV} is not a valid connection string: {e}"));
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    let (client, connection) = config.connect(NoTls).await.unwrap_or_else(|e| {
        panic!(
            "cannot connect to PostgreSQL from {ENV} (hosts {:?}, ports {:?}, user {:?}, \
             dbname {:?}): {}",
            config.get_hosts(),
            config.get_ports(),
            config.get_user(),
            config.get_dbname(),
            error_chain(&e)
        )
    });
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("PostgreSQL connection: {}", error_chain(&e));
        }
    });
    client
}

/// Runs SQL, panicking with the server's message on failure.
async fn sql(db: &tokio_postgres::Client, statements: &str) {
    db.batch_execute(statements)
        .await
        .unwrap_or_else(|e| panic!("{}\nin:\n{statements}", error_chain(&e)));
}

/// This test's `accounts` table, named `baton_fence_<pid>_<test>`. Dropped
/// by [`Table::drop_all`] at the end; a test that fails first still drops it
/// (from `Drop`).
struct Table {
    conn: String,
    db: tokio_postgres::Client,
    name: String,
    /// Dropped with the table: what a test adds next to it.
    extra: Vec<String>,
    dropped: bool,
}

impl Table {
    /// `None` if the tests are skipped.
    async fn create(test: &str) -> Option<Table> {
        let conn = conn_string(test)?;
        let db = connect(&conn).await;
        let name = format!("baton_fence_{}_{test}", std::process::id());
        sql(
            &db,
            &format!(
                "DROP TABLE IF EXISTS {name};
                 CREATE TABLE {name} (
                     id text PRIMARY KEY,
                     balance bigint NOT NULL,
                     fencing_token bigint NOT NULL DEFAULT 0
                 );"
            ),
        )
        .await;
        Some(Table {
            conn,
            db,
            name,
            extra: Vec::new(),
            dropped: false,
        })
    }

    async fn insert(&self, id: &str, balance: i64) {
        sql(
            &self.db,
            &format!(
                "INSERT INTO {} (id, balance) VALUES ('{id}', {balance})",
                self.name
            ),
        )
        .await;
    }

    /// `(balance, fencing_token)` of the row `id`.
    async fn row(&self, id: &str) -> (i64, i64) {
        let row = self
            .db
            .query_one(
                &format!(
                    "SELECT balance, fencing_token FROM {} WHERE id = $1",
                    self.name
                ),
                &[&id],
            )
            .await
            .unwrap_or_else(|e| panic!("reading row {id}: {}", error_chain(&e)));
        (row.get(0), row.get(1))
    }

    fn cleanup_sql(&self) -> String {
        let mut statements = vec![format!("DROP TABLE IF EXISTS {} CASCADE", self.name)];
        statements.extend(self.extra.iter().cloned());
        statements.join(";\n")
    }

    async fn drop_all(mut self) {
        sql(&self.db, &self.cleanup_sql()).await;
        self.dropped = true;
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // The test failed before dropping its table. This thread may be inside
        // the test's runtime, so the clean-up gets a thread and runtime of its
        // own.
        let (conn, cleanup) = (self.conn.clone(), self.cleanup_sql());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let (db, connection) = conn
                    .parse::<tokio_postgres::Config>()
                    .ok()?
                    .connect(NoTls)
                    .await
                    .ok()?;
                tokio::spawn(connection);
                db.batch_execute(&cleanup).await.ok()
            })
        })
        .join();
    }
}

/// Why a fenced write did not land.
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    /// A higher token already wrote the row.
    Stale {
        presented: u64,
        highest: i64,
    },
    NoSuchRow,
    /// The token does not fit in a `bigint`.
    TokenTooLarge(u64),
}

/// The fenced write: sets `id`'s balance unless a higher token than `token`
/// already wrote it, check and write in one statement.
async fn write_fenced(
    db: &tokio_postgres::Client,
    table: &str,
    id: &str,
    token: FencingToken,
    balance: i64,
) -> Result<(), Refused> {
    let pg = i64::try_from(token.get()).map_err(|_| Refused::TokenTooLarge(token.get()))?;
    let updated = db
        .execute(
            &format!(
                "UPDATE {table} SET balance = $3, fencing_token = $2 \
                  WHERE id = $1 AND fencing_token <= $2"
            ),
            &[&id, &pg, &balance],
        )
        .await
        .unwrap_or_else(|e| panic!("fenced update: {}", error_chain(&e)));
    if updated == 1 {
        return Ok(());
    }
    assert_eq!(updated, 0, "one row per id");
    // Only for the error: which of the two it was.
    let highest = db
        .query_opt(
            &format!("SELECT fencing_token FROM {table} WHERE id = $1"),
            &[&id],
        )
        .await
        .unwrap_or_else(|e| panic!("reading the token: {}", error_chain(&e)));
    match highest {
        None => Err(Refused::NoSuchRow),
        Some(row) => Err(Refused::Stale {
            presented: token.get(),
            highest: row.get(0),
        }),
    }
}

#[tokio::test]
async fn an_equal_token_is_accepted_again() {
    let Some(t) = Table::create("equal").await else {
        return;
    };
    t.insert("a", 0).await;
    write_fenced(&t.db, &t.name, "a", FencingToken(5), 10)
        .await
        .expect("first write with token 5");
    write_fenced(&t.db, &t.name, "a", FencingToken(5), 20)
        .await
        .expect("second write with the same token");
    assert_eq!(t.row("a").await, (20, 5));
    t.drop_all().await;
}

#[tokio::test]
async fn a_higher_token_is_accepted() {
    let Some(t) = Table::create("higher").await else {
        return;
    };
    t.insert("a", 0).await;
    write_fenced(&t.db, &t.name, "a", FencingToken(5), 10)
        .await
        .unwrap();
    write_fenced(&t.db, &t.name, "a", FencingToken(9), 30)
        .await
        .expect("a higher token");
    assert_eq!(t.row("a").await, (30, 9));
    t.drop_all().await;
}

#[tokio::test]
async fn a_lower_token_is_refused_and_leaves_the_row_unchanged() {
    let Some(t) = Table::create("lower").await else {
        return;
    };
    t.insert("a", 0).await;
    t.insert("b", 7).await;
    write_fenced(&t.db, &t.name, "a", FencingToken(9), 90)
        .await
        .unwrap();
    assert_eq!(
        write_fenced(&t.db, &t.name, "a", FencingToken(5), 50).await,
        Err(Refused::Stale {
            presented: 5,
            highest: 9
        })
    );
    assert_eq!(
        t.row("a").await,
        (90, 9),
        "the refused write changed nothing"
    );
    // Rows are fenced one by one: token 5 still writes another row.
    write_fenced(&t.db, &t.name, "b", FencingToken(5), 8)
        .await
        .unwrap();
    assert_eq!(t.row("b").await, (8, 5));
    // A missing row is not taken for a stale token.
    assert_eq!(
        write_fenced(&t.db, &t.name, "nobody", FencingToken(10), 1).await,
        Err(Refused::NoSuchRow)
    );
    // A token beyond bigint is refused before it reaches the database.
    assert_eq!(
        write_fenced(&t.db, &t.name, "a", FencingToken(u64::MAX), 1).await,
        Err(Refused::TokenTooLarge(u64::MAX))
    );
    assert_eq!(t.row("a").await, (90, 9));
    t.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_lock_handover_the_first_holders_late_write_is_refused() {
    let Some(t) = Table::create("handover").await else {
        return;
    };
    t.insert("acct", 100).await;
    let db_first = connect(&t.conn).await;
    let db_second = connect(&t.conn).await;
    let server = TestServer::start().await;
    let first = server.client().await;
    let second = server.client().await;

    let held = Lock::new(&first, "/locks/pg").acquire().await.unwrap();
    let old = held.token();
    write_fenced(&db_first, &t.name, "acct", old, 150)
        .await
        .expect("the holder writes");
    let lock = Lock::new(&second, "/locks/pg");
    let waiting = tokio::spawn(async move { lock.acquire().await });
    // The first holder's session closes (its lease ends) while its code still
    // has the token and a write to make.
    first.close().await;
    let new = within(10, "the second client's grant", waiting)
        .await
        .unwrap()
        .expect("acquire");
    assert!(new.token() > old, "{} > {old}", new.token());
    write_fenced(&db_second, &t.name, "acct", new.token(), 120)
        .await
        .expect("the new holder writes");

    assert_eq!(
        write_fenced(&db_first, &t.name, "acct", old, 300).await,
        Err(Refused::Stale {
            presented: old.get(),
            highest: i64::try_from(new.token().get()).unwrap()
        }),
        "the first holder's late write"
    );
    assert_eq!(
        t.row("acct").await,
        (120, i64::try_from(new.token().get()).unwrap())
    );
    new.release().await.unwrap();
    second.close().await;
    server.stop().await;
    t.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_session_expired_while_paused_cannot_write() {
    let Some(t) = Table::create("expired").await else {
        return;
    };
    t.insert("acct", 100).await;
    let db_first = connect(&t.conn).await;
    let db_second = connect(&t.conn).await;
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let first = connect_with_timeout(&proxy.addr(), Duration::from_millis(300)).await;
    let second = server.client().await;

    let held = Lock::new(&first, "/locks/pg").acquire().await.unwrap();
    write_fenced(&db_first, &t.name, "acct", held.token(), 150)
        .await
        .unwrap();
    let lock = Lock::new(&second, "/locks/pg");
    let waiting = tokio::spawn(async move { lock.acquire().await });
    // The first holder's process stops: the server hears nothing more from it.
    proxy.hold();
    proxy.block();
    let reason = within(5, "the lease to end", held.lost()).await;
    assert!(
        matches!(
            reason,
            LostReason::DeadlinePassed | LostReason::SessionExpired
        ),
        "{reason:?}"
    );
    let new = within(
        10,
        "the server to expire the session and grant the lock",
        waiting,
    )
    .await
    .unwrap()
    .expect("acquire");
    assert!(new.token() > held.token());
    write_fenced(&db_second, &t.name, "acct", new.token(), 120)
        .await
        .unwrap();
    // The paused holder wakes and writes what it had prepared.
    assert!(matches!(
        write_fenced(&db_first, &t.name, "acct", held.token(), 300).await,
        Err(Refused::Stale { .. })
    ));
    assert_eq!(t.row("acct").await.0, 120);
    new.release().await.unwrap();
    second.close().await;
    first.close().await;
    server.stop().await;
    t.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_never_let_a_lower_token_overwrite_a_higher_one() {
    const WRITERS: usize = 8;
    const TOKENS: u64 = 400;
    let Some(mut t) = Table::create("concurrent").await else {
        return;
    };
    t.insert("acct", 0).await;
    // Every update of the row, as the database applied them, in order (the
    // trigger runs under the row lock, so `seq` follows the updates).
    let log = format!("{}_log", t.name);
    let audit = format!("{}_audit", t.name);
    t.extra.push(format!("DROP TABLE IF EXISTS {log}"));
    t.extra.push(format!("DROP FUNCTION IF EXISTS {audit}()"));
    sql(
        &t.db,
        &format!(
            "CREATE TABLE {log} (
                 seq bigserial PRIMARY KEY,
                 old_token bigint NOT NULL,
                 new_token bigint NOT NULL,
                 new_balance bigint NOT NULL
             );
             CREATE FUNCTION {audit}() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO {log} (old_token, new_token, new_balance)
                 VALUES (OLD.fencing_token, NEW.fencing_token, NEW.balance);
                 RETURN NEW;
             END $$;
             CREATE TRIGGER {audit} AFTER UPDATE ON {table}
                 FOR EACH ROW EXECUTE FUNCTION {audit}();",
            table = t.name
        ),
    )
    .await;

    // Tokens 1..=TOKENS dealt round-robin: each writer goes up through its
    // own, and the writers race each other with neighbouring tokens. Each
    // writes balance = 10 * token.
    let tokens: Vec<u64> = (1..=TOKENS).collect();
    let accepted = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(WRITERS));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let mine: Vec<u64> = tokens.iter().copied().skip(w).step_by(WRITERS).collect();
        let db = connect(&t.conn).await;
        let (table, accepted, barrier) = (t.name.clone(), accepted.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut max_accepted = 0;
            for token in mine {
                match write_fenced(&db, &table, "acct", FencingToken(token), 10 * token as i64)
                    .await
                {
                    Ok(()) => {
                        accepted.fetch_add(1, Ordering::SeqCst);
                        max_accepted = max_accepted.max(token);
                    }
                    Err(Refused::Stale { presented, highest }) => assert!(
                        highest > presented as i64,
                        "token {presented} refused although the row had only {highest}"
                    ),
                    Err(other) => panic!("token {token}: {other:?}"),
                }
            }
            max_accepted
        }));
    }
    let mut max_accepted = 0;
    for task in within(60, "the writers", futures::future::join_all(tasks)).await {
        max_accepted = max_accepted.max(task.unwrap());
    }
    assert_eq!(max_accepted, TOKENS, "the highest token is never refused");
    assert_eq!(
        t.row("acct").await,
        (10 * TOKENS as i64, TOKENS as i64),
        "the row holds the highest token's write"
    );

    let rows =
        t.db.query(
            &format!("SELECT old_token, new_token, new_balance FROM {log} ORDER BY seq"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        rows.len(),
        accepted.load(Ordering::SeqCst),
        "one update per accepted write"
    );
    let mut previous = 0i64;
    for row in &rows {
        let (old, new, balance): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        assert_eq!(old, previous, "each update starts from the one before");
        assert!(new > old, "token {new} overwrote token {old}");
        assert_eq!(balance, 10 * new, "the balance written with token {new}");
        previous = new;
    }
    eprintln!(
        "{WRITERS} writers, {TOKENS} tokens: {} writes accepted, {} refused",
        rows.len(),
        TOKENS as usize - rows.len()
    );
    t.drop_all().await;
}
