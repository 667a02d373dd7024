//! `PgFence`: fencing inside the user's own PostgreSQL transactions, on a
//! real server the tests start, at every isolation level.

use std::sync::Arc;
use std::time::Duration;

use calm::backend::postgres::{MAX_FENCE_NAME, PgFence};
use calm::coord::{CoordError, FencingToken};
use calm::testing::servers::{PostgresServer, skip_or_fail};
use tokio_postgres::{Client, IsolationLevel, NoTls};

const LEVELS: [IsolationLevel; 3] = [
    IsolationLevel::ReadCommitted,
    IsolationLevel::RepeatableRead,
    IsolationLevel::Serializable,
];

/// A client whose connection runs on the current runtime.
async fn client(url: &str) -> Client {
    let mut last = None;
    for _ in 0..50 {
        match tokio_postgres::connect(url, NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(conn);
                return client;
            }
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("cannot connect: {last:?}");
}

/// The fence table and the user's own table: one account.
async fn setup(c: &Client, fence: &PgFence) {
    fence.migrate(c).await.expect("fence table");
    c.batch_execute(
        "DROP TABLE IF EXISTS accounts, history;
         CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL,
                                last_token bigint NOT NULL);
         INSERT INTO accounts VALUES (1, 100, 0);
         CREATE TABLE history (id bigserial PRIMARY KEY, token bigint NOT NULL);
         TRUNCATE calm_fence.fences;",
    )
    .await
    .expect("user tables");
}

fn t(n: u64) -> FencingToken {
    FencingToken::new(n)
}

async fn balance(c: &Client) -> i64 {
    c.query_one("SELECT balance FROM accounts WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0)
}

/// The seed scenario in the user's tables: the holder of #34 wrote; the
/// paused holder of #33 wakes, opens a transaction and is refused, and
/// its update never lands. Bad names and tokens are refused up front.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_token_is_refused_and_its_writes_roll_back() {
    let Some(server) = skip_or_fail(PostgresServer::start()) else {
        return;
    };
    let fence = PgFence::new("calm_fence").unwrap();
    let mut c = client(server.url()).await;
    setup(&c, &fence).await;

    let tx = c.transaction().await.unwrap();
    fence.admit(&tx, "accounts", t(34)).await.unwrap();
    tx.execute("UPDATE accounts SET balance = 50 WHERE id = 1", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let tx = c.transaction().await.unwrap();
    tx.execute("UPDATE accounts SET balance = 0 WHERE id = 1", &[])
        .await
        .unwrap();
    match fence.admit(&tx, "accounts", t(33)).await {
        Err(CoordError::Fenced(f)) => {
            assert_eq!((f.presented, f.highest), (t(33), t(34)));
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    tx.rollback().await.unwrap();
    assert_eq!(balance(&c).await, 50, "the stale write never landed");

    // The same token again is admitted (the holder of #34 writes twice).
    let tx = c.transaction().await.unwrap();
    fence.admit(&tx, "accounts", t(34)).await.unwrap();
    tx.commit().await.unwrap();

    let tx = c.transaction().await.unwrap();
    for bad in [String::new(), "n".repeat(MAX_FENCE_NAME + 1)] {
        assert!(matches!(
            fence.admit(&tx, &bad, t(40)).await,
            Err(CoordError::InvalidName { .. })
        ));
    }
    assert!(matches!(
        fence.admit(&tx, "accounts", t(u64::MAX)).await,
        Err(CoordError::InvalidName { .. })
    ));
    tx.commit().await.unwrap();
    assert!(PgFence::new("no-dash").is_err());
    assert!(
        fence
            .migration()
            .contains("CREATE TABLE IF NOT EXISTS calm_fence.fences")
    );
}

/// At each isolation level: a higher token admitted while a lower one's
/// transaction is open waits for it, so commits follow token order; a
/// lower token after a higher one is refused, as a `Fenced` error or (in
/// snapshot isolation) a retryable serialization failure, never admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_follow_token_order_at_every_isolation_level() {
    let Some(server) = skip_or_fail(PostgresServer::start()) else {
        return;
    };
    let fence = PgFence::new("calm_fence").unwrap();
    let mut a = client(server.url()).await;
    let mut b = client(server.url()).await;
    setup(&a, &fence).await;
    let mut next = 10u64;
    for level in LEVELS {
        let name = format!("{level:?}");
        let (low, high) = (t(next), t(next + 1));
        next += 10;
        let ta = a
            .build_transaction()
            .isolation_level(level)
            .start()
            .await
            .unwrap();
        fence.admit(&ta, &name, low).await.unwrap();
        // B, with the higher token, must wait for A to end.
        let (fence_b, name_b) = (fence.clone(), name.clone());
        let waiting = tokio::spawn(async move {
            let tb = b
                .build_transaction()
                .isolation_level(level)
                .start()
                .await
                .unwrap();
            let admitted = fence_b.admit(&tb, &name_b, high).await;
            if admitted.is_ok() {
                tb.commit().await.unwrap();
            } else {
                tb.rollback().await.unwrap();
            }
            (b, admitted)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiting.is_finished(),
            "{level:?}: admitted while a lower token's transaction was open"
        );
        ta.commit().await.unwrap();
        let (b_back, admitted) = waiting.await.unwrap();
        b = b_back;
        match (level, admitted) {
            (_, Ok(())) => {}
            // Snapshot isolation may refuse the waiter with a
            // serialization failure: retrying admits it.
            (
                IsolationLevel::RepeatableRead | IsolationLevel::Serializable,
                Err(CoordError::Store(e)),
            ) if e.is_retryable() => {
                let tb = b
                    .build_transaction()
                    .isolation_level(level)
                    .start()
                    .await
                    .unwrap();
                fence.admit(&tb, &name, high).await.unwrap();
                tb.commit().await.unwrap();
            }
            (_, other) => panic!("{level:?}: the higher token was not admitted: {other:?}"),
        }
        // Now the lower token is refused, at this level too.
        let ta = a
            .build_transaction()
            .isolation_level(level)
            .start()
            .await
            .unwrap();
        match fence.admit(&ta, &name, low).await {
            Err(CoordError::Fenced(f)) => assert_eq!(f.highest, high),
            other => panic!("{level:?}: a stale token got {other:?}"),
        }
        ta.rollback().await.unwrap();
        // A transaction whose snapshot predates the higher token's commit
        // is not admitted either.
        let ta = a
            .build_transaction()
            .isolation_level(level)
            .start()
            .await
            .unwrap();
        ta.query_one("SELECT count(*) FROM accounts", &[])
            .await
            .unwrap();
        let tb = b
            .build_transaction()
            .isolation_level(level)
            .start()
            .await
            .unwrap();
        fence.admit(&tb, &name, t(next)).await.unwrap();
        tb.commit().await.unwrap();
        match fence.admit(&ta, &name, t(next - 1)).await {
            Err(CoordError::Fenced(_)) => {}
            Err(CoordError::Store(e))
                if e.is_retryable() && !matches!(level, IsolationLevel::ReadCommitted) => {}
            other => panic!("{level:?}: an old snapshot's stale token got {other:?}"),
        }
        drop(ta);
        next += 10;
    }
}

/// Many writers with random tokens, isolation levels and pauses race on
/// one fence through real transactions. The history they append in the
/// same transactions (its ids follow commit order, since every writer
/// holds the fence's row lock from admission to commit) never goes down
/// in token, every write saw an account last written by a token no
/// higher than its own, and refused transactions left nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_never_commit_out_of_token_order() {
    let Some(server) = skip_or_fail(PostgresServer::start()) else {
        return;
    };
    let fence = Arc::new(PgFence::new("calm_fence").unwrap());
    let setup_client = client(server.url()).await;
    setup(&setup_client, &fence).await;
    let writers = 8;
    let rounds = 12;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (fence, url) = (Arc::clone(&fence), server.url().to_owned());
        tasks.push(tokio::spawn(async move {
            let mut c = client(&url).await;
            // A small deterministic generator per writer.
            let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (w as u64 + 1);
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            let mut committed = 0u32;
            for _ in 0..rounds {
                let token = t(1 + next() % 60);
                let level = LEVELS[(next() % 3) as usize];
                let tx = c
                    .build_transaction()
                    .isolation_level(level)
                    .start()
                    .await
                    .unwrap();
                let admitted = fence.admit(&tx, "accounts", token).await;
                if next() % 2 == 0 {
                    tokio::time::sleep(Duration::from_millis(next() % 15)).await;
                }
                if admitted.is_err() {
                    let _ = tx.rollback().await;
                    continue;
                }
                let write = async {
                    let prev: i64 = tx
                        .query_one(
                            "SELECT last_token FROM accounts WHERE id = 1 FOR UPDATE",
                            &[],
                        )
                        .await?
                        .get(0);
                    let token = i64::try_from(token.get()).unwrap();
                    assert!(
                        prev <= token,
                        "token {token} admitted after {prev} was written"
                    );
                    tx.execute(
                        "UPDATE accounts SET last_token = $1, balance = balance + 1 WHERE id = 1",
                        &[&token],
                    )
                    .await?;
                    tx.execute("INSERT INTO history (token) VALUES ($1)", &[&token])
                        .await?;
                    Ok::<_, tokio_postgres::Error>(())
                };
                // Snapshot isolation may abort the write (serialization
                // failure): then nothing of it commits.
                if write.await.is_ok() && tx.commit().await.is_ok() {
                    committed += 1;
                }
            }
            committed
        }));
    }
    let mut committed = 0;
    for task in tasks {
        committed += task.await.unwrap();
    }
    let rows = setup_client
        .query("SELECT token FROM history ORDER BY id", &[])
        .await
        .unwrap();
    let tokens: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        tokens.len(),
        committed as usize,
        "only committed writes left rows"
    );
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "history went down in token: {tokens:?}"
    );
    assert_eq!(balance(&setup_client).await, 100 + i64::from(committed));
    assert!(committed > 0, "some writes committed");
}
