//! Fencing writes to PostgreSQL with Baton's lock tokens.
//!
//! # The pattern
//!
//! A lock's lease can run out while its holder is paused (a GC pause, a
//! stopped VM). Baton then expires the holder's session and grants the lock
//! to the next contender. When the first holder wakes, it still believes it
//! holds the lock, and whatever it writes next would land on top of the new
//! holder's data. Checking "do I still hold it?" first does not help: the
//! pause can fall between the check and the write.
//!
//! So every grant carries a fencing token ([`baton::FencingToken`]), strictly
//! greater than the tokens of all earlier grants of the same lock. Each row
//! keeps the highest token that wrote it, and every write is one conditional
//! statement that checks and writes atomically:
//!
//! ```sql
//! UPDATE accounts SET balance = $3, fencing_token = $2
//!  WHERE id = $1 AND fencing_token <= $2
//! ```
//!
//! One row updated: the write landed (an equal token is fine: one holder
//! writes many times). Zero rows: a higher token has already written, so the
//! writer's lease is over, and the write is refused. Under concurrent writers
//! PostgreSQL re-checks the `WHERE` against the newest row version after
//! waiting for the row lock, so a lower token can never overwrite a higher
//! one. Never split this into a `SELECT` followed by an `UPDATE`.
//!
//! Tokens are `u64`, PostgreSQL's `bigint` is `i64`: a token that does not
//! fit is an error, never a wrapped negative number.
//!
//! # What this example does
//!
//! It starts an embedded Baton server, then:
//!
//! 1. holder A takes the lock `/locks/account-alice` and writes with its token;
//! 2. A pauses (its network is cut here, which looks the same to the server);
//!    the server expires A's session and grants the lock to holder B, who
//!    writes with its higher token;
//! 3. A wakes and makes the write it had prepared, with its old token: the
//!    database refuses it, and B's balance stays.
//!
//! The table lives in a schema of its own, `baton_fencing_example`, which the
//! example creates and drops again.
//!
//! # Running it
//!
//! It needs a PostgreSQL server and a role that may create a schema:
//!
//! ```sh
//! BATON_POSTGRES="host=127.0.0.1 port=5432 user=postgres dbname=postgres" \
//!     cargo run --example postgres_fencing
//! ```
//!
//! On a Debian machine, as root, `bash .ci/postgres` starts a throwaway
//! server on 127.0.0.1 and prints a connection string to use. Without
//! `BATON_POSTGRES`, or if the server cannot be reached, the example says so
//! and exits with status 2.

use std::error::Error;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use baton::server::{Config, Server};
use baton::{Client, FencingToken, Lock};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

const SCHEMA: &str = "baton_fencing_example";
const LOCK: &str = "/locks/account-alice";
const ACCOUNT: &str = "alice";

/// Why a fenced write did not land.
#[derive(Debug)]
enum FenceError {
    /// A write with a higher token already landed: the writer's lease is over.
    Stale {
        account: String,
        presented: FencingToken,
        highest: i64,
    },
    /// There is no such account.
    NoSuchAccount(String),
    /// The token does not fit in a PostgreSQL `bigint`.
    TokenTooLarge(FencingToken),
    Db(tokio_postgres::Error),
}

impl fmt::Display for FenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenceError::Stale {
                account,
                presented,
                highest,
            } => write!(
                f,
                "write to account {account} refused: stale fencing token {presented} \
                 (token {highest} already wrote it)"
            ),
            FenceError::NoSuchAccount(account) => write!(f, "there is no account {account}"),
            FenceError::TokenTooLarge(token) => write!(
                f,
                "fencing token {token} does not fit in a PostgreSQL bigint (at most {})",
                i64::MAX
            ),
            FenceError::Db(e) => write!(f, "database error: {}", error_chain(e)),
        }
    }
}

impl Error for FenceError {}

impl From<tokio_postgres::Error> for FenceError {
    fn from(e: tokio_postgres::Error) -> Self {
        FenceError::Db(e)
    }
}

/// A fencing token as a PostgreSQL `bigint`.
fn pg_token(token: FencingToken) -> Result<i64, FenceError> {
    i64::try_from(token.get()).map_err(|_| FenceError::TokenTooLarge(token))
}

/// Sets `account`'s balance, unless a write with a higher token than `token`
/// already landed. The check and the write are one statement.
async fn set_balance_fenced(
    db: &tokio_postgres::Client,
    account: &str,
    token: FencingToken,
    balance: i64,
) -> Result<(), FenceError> {
    let pg = pg_token(token)?;
    let updated = db
        .execute(
            "UPDATE accounts SET balance = $3, fencing_token = $2 \
              WHERE id = $1 AND fencing_token <= $2",
            &[&account, &pg, &balance],
        )
        .await?;
    if updated == 1 {
        return Ok(());
    }
    // Refused (or no such row). The refusal above is the atomic part; this
    // read only picks the error message.
    match db
        .query_opt(
            "SELECT fencing_token FROM accounts WHERE id = $1",
            &[&account],
        )
        .await?
    {
        None => Err(FenceError::NoSuchAccount(account.to_owned())),
        Some(row) => Err(FenceError::Stale {
            account: account.to_owned(),
            presented: token,
            highest: row.get(0),
        }),
    }
}

async fn balance_of(db: &tokio_postgres::Client, account: &str) -> Result<(i64, i64), FenceError> {
    let row = db
        .query_opt(
            "SELECT balance, fencing_token FROM accounts WHERE id = $1",
            &[&account],
        )
        .await?
        .ok_or_else(|| FenceError::NoSuchAccount(account.to_owned()))?;
    Ok((row.get(0), row.get(1)))
}

/// A connection to PostgreSQL, its `search_path` set to the example's schema.
async fn connect_db(conn: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config: tokio_postgres::Config = conn.parse()?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("PostgreSQL connection: {}", error_chain(&e));
        }
    });
    client
        .batch_execute(&format!("SET search_path TO {SCHEMA}"))
        .await?;
    Ok(client)
}

/// `e` and its sources, on one line (tokio-postgres puts the server's
/// message in the source).
fn error_chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s = s.to_string();
        if !text.contains(&s) {
            text = format!("{text}: {s}");
        }
        source = source.and_then(Error::source);
    }
    text
}

/// Stands in for holder A's network: forwards A's connections to the server
/// until the returned sender is set to `true`, then drops them and refuses
/// new ones, so the server hears nothing more from A, as if A's process had
/// stopped.
async fn cuttable_link(server: SocketAddr) -> std::io::Result<(SocketAddr, watch::Sender<bool>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (cut, cut_rx) = watch::channel(false);
    tokio::spawn(async move {
        while let Ok((mut near, _)) = listener.accept().await {
            if *cut_rx.borrow() {
                continue; // dropped: the connection is refused
            }
            let mut cut_rx = cut_rx.clone();
            tokio::spawn(async move {
                let Ok(mut far) = TcpStream::connect(server).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut near, &mut far) => {}
                    _ = cut_rx.wait_for(|cut| *cut) => {}
                }
            });
        }
    });
    Ok((addr, cut))
}

#[tokio::main]
async fn main() {
    let Ok(conn) = std::env::var("BATON_POSTGRES") else {
        eprintln!(
            "BATON_POSTGRES is not set. Point it at a PostgreSQL server, for example:\n\
             \n    BATON_POSTGRES=\"host=127.0.0.1 port=5432 user=postgres dbname=postgres\" \
             cargo run --example postgres_fencing\n\
             \n(on Debian, as root, `bash .ci/postgres` starts a throwaway server and prints a \
             connection string)"
        );
        std::process::exit(2);
    };
    let setup = match connect_db(&conn).await {
        Ok(db) => db,
        Err(e) => {
            eprintln!(
                "cannot connect to PostgreSQL using BATON_POSTGRES: {}\n\
                 (is the server running, and does the connection string name it?)",
                error_chain(&e)
            );
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&conn, &setup).await {
        eprintln!("error: {}", error_chain(e.as_ref()));
        let _ = drop_schema(&setup).await;
        std::process::exit(1);
    }
    if let Err(e) = drop_schema(&setup).await {
        eprintln!("error dropping schema {SCHEMA}: {e}");
        std::process::exit(1);
    }
}

async fn drop_schema(db: &tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
    db.batch_execute(&format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        .await
}

async fn run(conn: &str, setup: &tokio_postgres::Client) -> Result<(), Box<dyn Error>> {
    setup
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE;
             CREATE SCHEMA {SCHEMA};
             CREATE TABLE {SCHEMA}.accounts (
                 id text PRIMARY KEY,
                 balance bigint NOT NULL,
                 fencing_token bigint NOT NULL DEFAULT 0
             );
             INSERT INTO {SCHEMA}.accounts (id, balance) VALUES ('{ACCOUNT}', 100);"
        ))
        .await
        .map_err(|e| FenceError::Db(e).to_string())?;
    println!("table {SCHEMA}.accounts: account {ACCOUNT} with balance 100");

    // An embedded Baton server.
    let server = Server::bind(
        "127.0.0.1:0",
        Config {
            min_session_timeout: Duration::from_millis(100),
            ..Config::default()
        },
    )
    .await?;
    let server_addr = server.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let server_task = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    println!("Baton server on {server_addr}");

    // Holder A: a short session, over a link we can cut.
    let (link, cut) = cuttable_link(server_addr).await?;
    let a = Client::builder(&link.to_string())
        .session_timeout(Duration::from_millis(500))
        .connect()
        .await?;
    let b = Client::connect(&server_addr.to_string()).await?;
    let db_a = connect_db(conn).await?;
    let db_b = connect_db(conn).await?;

    // 1. A takes the lock and writes.
    let guard_a = Lock::new(&a, LOCK).acquire().await?;
    let token_a = guard_a.token();
    println!("A holds {LOCK} with fencing token {token_a}");
    let (balance, _) = balance_of(&db_a, ACCOUNT).await?;
    set_balance_fenced(&db_a, ACCOUNT, token_a, balance + 50).await?;
    println!(
        "A: balance {balance} -> {} (token {token_a}): written",
        balance + 50
    );
    // A reads again and prepares its next write...
    let (balance, _) = balance_of(&db_a, ACCOUNT).await?;
    let a_late_balance = balance * 2;

    // B queues for the lock.
    let lock_b = Lock::new(&b, LOCK);
    let waiting_b = tokio::spawn(async move { lock_b.acquire().await });

    // 2. ...and pauses before writing it. The server hears nothing more from A.
    println!("A pauses before writing {a_late_balance} (its network is cut)");
    cut.send_replace(true);
    let reason = guard_a.lost().await;
    println!("A's lease is over: {reason}");
    let guard_b = tokio::time::timeout(Duration::from_secs(10), waiting_b)
        .await
        .map_err(|_| "B was not granted the lock within 10 s")???;
    let token_b = guard_b.token();
    println!("B holds {LOCK} with fencing token {token_b}");
    let (balance, _) = balance_of(&db_b, ACCOUNT).await?;
    set_balance_fenced(&db_b, ACCOUNT, token_b, balance - 30).await?;
    println!(
        "B: balance {balance} -> {} (token {token_b}): written",
        balance - 30
    );

    // 3. A wakes up and makes the write it had prepared, with its old token.
    println!("A wakes and writes {a_late_balance} with token {token_a}");
    match set_balance_fenced(&db_a, ACCOUNT, token_a, a_late_balance).await {
        Err(e @ FenceError::Stale { .. }) => println!("A: {e}"),
        Ok(()) => return Err("A's late write landed: the fence did not hold".into()),
        Err(e) => return Err(e.into()),
    }
    let (balance, token) = balance_of(&db_b, ACCOUNT).await?;
    println!("account {ACCOUNT}: balance {balance}, written last with token {token}");
    if token != pg_token(token_b)? {
        return Err(format!("expected the row to carry B's token {token_b}, found {token}").into());
    }

    guard_b.release().await?;
    a.close().await;
    b.close().await;
    let _ = stop.send(());
    server_task.await??;
    Ok(())
}
