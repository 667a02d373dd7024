//! `PgFence`: fencing inside the user's own PostgreSQL transactions, on a
//! real server the tests start, at every isolation level.

use std::sync::Arc;
use std::time::Duration;

use calm::backend::postgres::{MAX_FENCE_NAME, PgFence};
use calm::coord::{CoordError, FencingToken};
use calm::testing::servers::{PostgresServer, skip_or_fail};
use tokio_postgres::{Client, IsolationLevel, NoTls, Transaction};

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

/// A started server (alive as long as the caller keeps it), the fence,
/// and two clients, with the tables set up.
async fn two_writers() -> Option<(PostgresServer, PgFence, Client, Client)> {
    let server = skip_or_fail(PostgresServer::start())?;
    let fence = PgFence::new("calm_fence").unwrap();
    let a = client(server.url()).await;
    let b = client(server.url()).await;
    setup(&a, &fence).await;
    Some((server, fence, a, b))
}

/// A transaction of `c` at `level`.
async fn begin(c: &mut Client, level: IsolationLevel) -> Transaction<'_> {
    c.build_transaction()
        .isolation_level(level)
        .start()
        .await
        .expect("begin")
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
    let Some((_server, fence, mut c, _)) = two_writers().await else {
        return;
    };

    set_balance_admitted(&mut c, &fence, "accounts", t(34), 50)
        .await
        .unwrap();

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

/// The seed scenario with the admission sent with `COMMIT`
/// (`PgFence::begin`): the stale holder's update runs, its commit is
/// refused and nothing of it lands. Names are sent as literals there, so
/// quotes and backslashes must reach the table as they are; bad names
/// are refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_token_is_refused_at_commit_and_its_writes_roll_back() {
    let Some((_server, fence, mut c, _)) = two_writers().await else {
        return;
    };

    let tx = fence.begin(&mut c, "accounts", t(34)).await.unwrap();
    assert_eq!(tx.token(), t(34));
    tx.rollback().await.unwrap();
    set_balance_fenced(&mut c, &fence, "accounts", t(34), 50)
        .await
        .unwrap();
    assert_fenced(
        set_balance_fenced(&mut c, &fence, "accounts", t(33), 0).await,
        (33, 34),
    );
    assert_eq!(balance(&c).await, 50, "the stale write never landed");
    // The connection is usable again: the refused transaction ended.
    let tx = fence.begin(&mut c, "accounts", t(34)).await.unwrap();
    tx.execute("UPDATE accounts SET balance = 60 WHERE id = 1", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(balance(&c).await, 60);
    // Dropped or rolled back, a fenced transaction leaves nothing.
    for drop_it in [true, false] {
        let tx = fence.begin(&mut c, "accounts", t(35)).await.unwrap();
        tx.execute("UPDATE accounts SET balance = 0 WHERE id = 1", &[])
            .await
            .unwrap();
        if drop_it {
            drop(tx);
        } else {
            tx.rollback().await.unwrap();
        }
        assert_eq!(balance(&c).await, 60);
        assert_eq!(recorded_token(&c, "accounts").await, Some(34));
    }
    // One fence, whichever way it is admitted.
    let tx = c.transaction().await.unwrap();
    fence.admit(&tx, "accounts", t(36)).await.unwrap();
    tx.commit().await.unwrap();
    let tx = fence.begin(&mut c, "accounts", t(35)).await.unwrap();
    assert!(matches!(tx.commit().await, Err(CoordError::Fenced(_))));

    for odd in [
        "it's",
        "back\\slash\\",
        "x'); DROP TABLE accounts; --",
        "\\'",
        "naïve ☃",
    ] {
        let tx = fence.begin(&mut c, odd, t(7)).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(recorded_token(&c, odd).await, Some(7), "{odd:?}");
        let tx = fence.begin(&mut c, odd, t(6)).await.unwrap();
        assert!(
            matches!(tx.commit().await, Err(CoordError::Fenced(_))),
            "{odd:?}"
        );
    }
    assert_eq!(balance(&c).await, 60, "the accounts table is still there");
    for bad in [
        String::new(),
        "n".repeat(MAX_FENCE_NAME + 1),
        "nul\0".to_owned(),
    ] {
        assert!(matches!(
            fence.begin(&mut c, &bad, t(40)).await,
            Err(CoordError::InvalidName { .. })
        ));
    }
    assert!(matches!(
        fence.begin(&mut c, "accounts", t(u64::MAX)).await,
        Err(CoordError::InvalidName { .. })
    ));
    // Nothing was left open by the refusals.
    let tx = c.transaction().await.unwrap();
    assert!(matches!(
        fence.admit(&tx, "nul\0", t(1)).await,
        Err(CoordError::InvalidName { .. })
    ));
    tx.commit().await.unwrap();
}

/// A deadpool connection is fenced both ways, through the tokio-postgres
/// client and transaction it dereferences to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadpool_connections_are_fenced_alike() {
    let Some((server, fence, c, _)) = two_writers().await else {
        return;
    };
    let config: tokio_postgres::Config = server.url().parse().unwrap();
    let manager = deadpool_postgres::Manager::new(config, NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(2)
        .build()
        .unwrap();
    let mut pooled = pool.get().await.unwrap();
    set_balance_admitted(&mut pooled, &fence, "pooled", t(3), 3)
        .await
        .unwrap();
    assert_fenced(
        set_balance_fenced(&mut pooled, &fence, "pooled", t(2), 2).await,
        (2, 3),
    );
    assert_eq!(balance(&c).await, 3);
    let tx = fence.begin(&mut pooled, "pooled", t(4)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(recorded_token(&c, "pooled").await, Some(4));
}

/// Sets the account's balance in a transaction opened with
/// `PgFence::begin` (admitted at commit).
async fn set_balance_fenced(
    c: &mut Client,
    fence: &PgFence,
    name: &str,
    token: FencingToken,
    balance: i64,
) -> Result<(), CoordError> {
    let tx = fence.begin(c, name, token).await?;
    tx.execute("UPDATE accounts SET balance = $1 WHERE id = 1", &[&balance])
        .await
        .unwrap();
    tx.commit().await
}

/// Sets the account's balance in a transaction that admits first
/// (`PgFence::admit`).
async fn set_balance_admitted(
    c: &mut Client,
    fence: &PgFence,
    name: &str,
    token: FencingToken,
    balance: i64,
) -> Result<(), CoordError> {
    let tx = c.transaction().await.unwrap();
    fence.admit(&tx, name, token).await?;
    tx.execute("UPDATE accounts SET balance = $1 WHERE id = 1", &[&balance])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    Ok(())
}

/// `result` is a refusal of token `presented` by a fence at `highest`.
fn assert_fenced(result: Result<(), CoordError>, (presented, highest): (u64, u64)) {
    match result {
        Err(CoordError::Fenced(f)) => {
            assert_eq!((f.presented, f.highest), (t(presented), t(highest)));
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
}

/// The token recorded for `name`, if any.
async fn recorded_token(c: &Client, name: &str) -> Option<i64> {
    c.query_opt(
        "SELECT token FROM calm_fence.fences WHERE name = $1",
        &[&name],
    )
    .await
    .unwrap()
    .map(|r| r.get(0))
}

/// At each isolation level, admitting at commit: a lower token's
/// transaction that commits after a higher one's is refused (as `Fenced`,
/// or under snapshot isolation a retryable serialization failure), and
/// its write never lands; a lower token that commits first is admitted
/// and the higher one after it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_commits_follow_token_order_at_every_isolation_level() {
    let Some((_server, fence, mut a, mut b)) = two_writers().await else {
        return;
    };
    let mut next = 10;
    for level in LEVELS {
        let name = format!("at-commit-{level:?}");
        let (low, high) = (t(next), t(next + 1));
        // The lower token's transaction is open (and has read) when the
        // higher one commits.
        let ta = fence
            .begin_with(a.build_transaction().isolation_level(level), &name, low)
            .await
            .unwrap();
        ta.execute("INSERT INTO history (token) VALUES ($1)", &[&-1i64])
            .await
            .unwrap();
        let tb = fence
            .begin_with(b.build_transaction().isolation_level(level), &name, high)
            .await
            .unwrap();
        tb.commit().await.unwrap();
        match (level, ta.commit().await) {
            (_, Err(CoordError::Fenced(f))) => assert_eq!((f.presented, f.highest), (low, high)),
            (IsolationLevel::ReadCommitted, other) => {
                panic!("{level:?}: a lower token committed after a higher one: {other:?}")
            }
            (_, Err(CoordError::Store(e))) => assert!(e.is_retryable(), "{level:?}: {e}"),
            (_, other) => {
                panic!("{level:?}: a lower token committed after a higher one: {other:?}")
            }
        }
        let stale: i64 = a
            .query_one("SELECT count(*) FROM history WHERE token = -1", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(stale, 0, "{level:?}: the refused transaction's row landed");
        // In token order, both commit.
        for token in [t(next + 2), t(next + 3)] {
            let tx = fence
                .begin_with(a.build_transaction().isolation_level(level), &name, token)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        assert_eq!(recorded_token(&a, &name).await, Some(next as i64 + 3));
        next += 10;
    }
}

/// At each isolation level: a higher token admitted while a lower one's
/// transaction is open waits for it, so commits follow token order; a
/// lower token after a higher one is refused, as a `Fenced` error or (in
/// snapshot isolation) a retryable serialization failure, never admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_follow_token_order_at_every_isolation_level() {
    let Some((_server, fence, mut a, mut b)) = two_writers().await else {
        return;
    };
    let mut next = 10u64;
    for level in LEVELS {
        let name = format!("{level:?}");
        let (low, high) = (t(next), t(next + 1));
        next += 10;
        let ta = begin(&mut a, level).await;
        fence.admit(&ta, &name, low).await.unwrap();
        // B, with the higher token, must wait for A to end.
        let (fence_b, name_b) = (fence.clone(), name.clone());
        let waiting = tokio::spawn(async move {
            let tb = begin(&mut b, level).await;
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
                let tb = begin(&mut b, level).await;
                fence.admit(&tb, &name, high).await.unwrap();
                tb.commit().await.unwrap();
            }
            (_, other) => panic!("{level:?}: the higher token was not admitted: {other:?}"),
        }
        // Now the lower token is refused, at this level too.
        let ta = begin(&mut a, level).await;
        match fence.admit(&ta, &name, low).await {
            Err(CoordError::Fenced(f)) => assert_eq!(f.highest, high),
            other => panic!("{level:?}: a stale token got {other:?}"),
        }
        ta.rollback().await.unwrap();
        // A transaction whose snapshot predates the higher token's commit
        // is not admitted either.
        let ta = begin(&mut a, level).await;
        ta.query_one("SELECT count(*) FROM accounts", &[])
            .await
            .unwrap();
        let tb = begin(&mut b, level).await;
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

/// Under READ COMMITTED, transactions presenting the recorded token share
/// the fence: both are admitted while the other is open. A raise waits
/// for every one of them to end, and the token they hold is refused
/// from then on, also in a transaction that was already waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_of_the_recorded_token_share_the_fence_and_a_raise_waits_for_them() {
    let Some((server, fence, mut a, mut b)) = two_writers().await else {
        return;
    };
    let mut c = client(server.url()).await;
    let level = IsolationLevel::ReadCommitted;
    let tx = begin(&mut a, level).await;
    fence.admit(&tx, "shared", t(5)).await.unwrap();
    tx.commit().await.unwrap();

    let ta = begin(&mut a, level).await;
    fence.admit(&ta, "shared", t(5)).await.unwrap();
    let tb = begin(&mut b, level).await;
    tokio::time::timeout(Duration::from_secs(5), fence.admit(&tb, "shared", t(5)))
        .await
        .expect("a second holder of the recorded token is admitted at once")
        .unwrap();
    let (fence_c, raised) = (
        fence.clone(),
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let raised_c = Arc::clone(&raised);
    let raise = tokio::spawn(async move {
        let tc = begin(&mut c, level).await;
        fence_c.admit(&tc, "shared", t(6)).await.unwrap();
        raised_c.store(true, std::sync::atomic::Ordering::SeqCst);
        tc.commit().await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !raised.load(std::sync::atomic::Ordering::SeqCst),
        "raised past two open holders"
    );
    ta.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !raised.load(std::sync::atomic::Ordering::SeqCst),
        "raised past an open holder"
    );
    // A holder arriving while the raise waits queues behind it and is
    // refused once it commits.
    let late = tokio::spawn({
        let fence = fence.clone();
        async move {
            let ta = begin(&mut a, level).await;
            let admitted = fence.admit(&ta, "shared", t(5)).await;
            ta.rollback().await.unwrap();
            admitted
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    tb.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), raise)
        .await
        .expect("the raise goes on once the holders ended")
        .unwrap();
    assert_fenced(late.await.unwrap(), (5, 6));
    assert_eq!(recorded_token(&b, "shared").await, Some(6));
}

/// Many writers, each holding a random token for a few transactions, with
/// random isolation levels and pauses, race on one fence through real
/// transactions, admitting first (`PgFence::admit`) or at commit
/// (`PgFence::begin`). The history they
/// append in the same transactions (its ids follow commit order: every
/// writer holds the account's row lock from its first write to its
/// commit) never goes down in token, an admitted-first write saw an
/// account last written by a token no higher than its own, and refused
/// transactions left nothing behind.
async fn race(at_commit: bool) {
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
            let mut token = t(1);
            for _ in 0..rounds {
                // A holder keeps its token for a few transactions, so
                // many present the recorded token (the shared path).
                if next() % 3 == 0 {
                    token = t(1 + next() % 60);
                }
                let level = LEVELS[(next() % 3) as usize];
                let pause = (next() % 2 == 0).then(|| Duration::from_millis(next() % 15));
                let stored = i64::try_from(token.get()).unwrap();
                // Snapshot isolation may abort the write (serialization
                // failure): then nothing of it commits.
                if at_commit {
                    let builder = c.build_transaction().isolation_level(level);
                    let tx = fence.begin_with(builder, "accounts", token).await.unwrap();
                    if write(&tx, pause, stored).await.is_ok() && tx.commit().await.is_ok() {
                        committed += 1;
                    }
                } else {
                    let tx = begin(&mut c, level).await;
                    if fence.admit(&tx, "accounts", token).await.is_err() {
                        let _ = tx.rollback().await;
                        continue;
                    }
                    if let Ok(prev) = write(&tx, pause, stored).await {
                        assert!(
                            prev <= stored,
                            "token {stored} admitted after {prev} was written"
                        );
                        if tx.commit().await.is_ok() {
                            committed += 1;
                        }
                    }
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
    let highest: i64 = setup_client
        .query_one(
            "SELECT token FROM calm_fence.fences WHERE name = 'accounts'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        tokens.last().is_some_and(|&last| last <= highest),
        "the fence is below a committed token"
    );
}

/// One racing writer's write: the account's last token (read under its
/// row lock), then the account and the history written with `token`.
async fn write(
    tx: &Transaction<'_>,
    pause: Option<Duration>,
    token: i64,
) -> Result<i64, tokio_postgres::Error> {
    if let Some(pause) = pause {
        tokio::time::sleep(pause).await;
    }
    let prev: i64 = tx
        .query_one(
            "SELECT last_token FROM accounts WHERE id = 1 FOR UPDATE",
            &[],
        )
        .await?
        .get(0);
    tx.execute(
        "UPDATE accounts SET last_token = $1, balance = balance + 1 WHERE id = 1",
        &[&token],
    )
    .await?;
    tx.execute("INSERT INTO history (token) VALUES ($1)", &[&token])
        .await?;
    Ok(prev)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_admitting_first_never_commit_out_of_token_order() {
    race(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_admitting_at_commit_never_commit_out_of_token_order() {
    race(true).await;
}

/// Rows in the fence table for `name`.
async fn recorded(c: &Client, name: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM calm_fence.fences WHERE name = $1",
        &[&name],
    )
    .await
    .unwrap()
    .get(0)
}

/// An admission in a transaction that already failed, and one whose
/// connection is closed while it waits for the fence row: typed store
/// errors (the second retryable: nothing was written), and neither leaves
/// a fence row behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_transaction_or_a_closed_connection_admits_nothing() {
    let Some(server) = skip_or_fail(PostgresServer::start()) else {
        return;
    };
    let fence = PgFence::new("calm_fence").unwrap();
    let mut a = client(server.url()).await;
    let mut b = client(server.url()).await;
    let observer = client(server.url()).await;
    setup(&observer, &fence).await;

    let tx = a.transaction().await.unwrap();
    assert!(tx.execute("SELECT 1 / 0", &[]).await.is_err());
    match fence.admit(&tx, "aborted", t(5)).await {
        Err(CoordError::Store(e)) => assert!(!e.is_retryable(), "{e}"),
        other => panic!("an aborted transaction's admission got {other:?}"),
    }
    drop(tx);
    assert_eq!(recorded(&observer, "aborted").await, 0);

    // B holds the fence row in an open transaction; A's admission waits
    // for it, and A's session is ended while it waits.
    let tb = b.transaction().await.unwrap();
    fence.admit(&tb, "held", t(10)).await.unwrap();
    let pid: i32 = a
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let fence_a = fence.clone();
    let waiting = tokio::spawn(async move {
        let ta = a.transaction().await.unwrap();
        fence_a.admit(&ta, "held", t(20)).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "admitted past an open admission");
    observer
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    match waiting.await.unwrap() {
        Err(CoordError::Store(e)) => assert!(e.is_retryable(), "{e}"),
        other => panic!("an admission on a closed connection got {other:?}"),
    }
    tb.rollback().await.unwrap();
    assert_eq!(recorded(&observer, "held").await, 0);
}

/// The same fence through sqlx: the seed scenario, bad input, and a
/// snapshot that predates a newer holder's commit (refused, or a
/// retryable serialization failure).
#[cfg(feature = "sqlx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_transactions_are_fenced_alike() {
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    let Some(server) = skip_or_fail(PostgresServer::start()) else {
        return;
    };
    let fence = PgFence::new("calm_fence").unwrap();
    let c = client(server.url()).await;
    setup(&c, &fence).await;
    // The test server's libpq-style string, as sqlx's options.
    let word = |key: &str| {
        server
            .url()
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap()
            .to_owned()
    };
    let options = PgConnectOptions::new()
        .host(&word("host="))
        .port(word("port=").parse().unwrap())
        .username(&word("user="))
        .database(&word("dbname="));
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();

    let mut tx = pool.begin().await.unwrap();
    fence.admit_sqlx(&mut tx, "accounts", t(34)).await.unwrap();
    sqlx::query("UPDATE accounts SET balance = 50 WHERE id = 1")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("UPDATE accounts SET balance = 0 WHERE id = 1")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_fenced(fence.admit_sqlx(&mut tx, "accounts", t(33)).await, (33, 34));
    tx.rollback().await.unwrap();
    assert_eq!(balance(&c).await, 50, "the stale write never landed");
    assert!(matches!(
        fence
            .admit_sqlx(&mut pool.acquire().await.unwrap(), "", t(40))
            .await,
        Err(CoordError::InvalidName { .. })
    ));

    // A repeatable-read snapshot taken before a newer holder commits.
    let mut old = pool.begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *old)
        .await
        .unwrap();
    sqlx::query("SELECT count(*) FROM accounts")
        .execute(&mut *old)
        .await
        .unwrap();
    let mut newer = pool.begin().await.unwrap();
    fence
        .admit_sqlx(&mut newer, "accounts", t(40))
        .await
        .unwrap();
    newer.commit().await.unwrap();
    match fence.admit_sqlx(&mut old, "accounts", t(41)).await {
        Err(CoordError::Store(e)) => assert!(e.is_retryable(), "{e}"),
        other => panic!("a stale snapshot's admission got {other:?}"),
    }
    old.rollback().await.unwrap();

    // Admitted at commit, in one message.
    set_balance_sqlx(&pool, &fence, 70, t(50)).await.unwrap();
    assert_eq!(balance(&c).await, 70);
    assert_fenced(set_balance_sqlx(&pool, &fence, 0, t(49)).await, (49, 50));
    assert_eq!(balance(&c).await, 70, "the stale write never landed");
    // The connections come back clean, refused or committed: outside any
    // transaction (a savepoint there fails with no_active_sql_transaction).
    let mut conn = pool.acquire().await.unwrap();
    for token in [t(48), t(50)] {
        let tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        let _ = fence.commit_sqlx(tx, "accounts", token).await;
        let probe = sqlx::raw_sql("SAVEPOINT probe").execute(&mut *conn).await;
        let code = probe
            .as_ref()
            .err()
            .and_then(|e| e.as_database_error())
            .and_then(|e| e.code().map(|c| c.into_owned()));
        assert_eq!(
            code.as_deref(),
            Some("25P01"),
            "a transaction was left open on the connection: {probe:?}"
        );
    }
    drop(conn);
    for _ in 0..3 {
        let tx = pool.begin().await.unwrap();
        fence.commit_sqlx(tx, "accounts", t(50)).await.unwrap();
    }
    // A savepoint is refused before anything is sent.
    let mut tx = pool.begin().await.unwrap();
    let savepoint = sqlx::Connection::begin(&mut *tx).await.unwrap();
    assert!(matches!(
        fence.commit_sqlx(savepoint, "accounts", t(50)).await,
        Err(CoordError::InvalidArgument { .. })
    ));
    sqlx::query("UPDATE accounts SET balance = 80 WHERE id = 1")
        .execute(&mut *tx)
        .await
        .unwrap();
    fence.commit_sqlx(tx, "accounts", t(50)).await.unwrap();
    assert_eq!(balance(&c).await, 80);
}

/// Sets the account's balance in a sqlx transaction whose commit admits
/// `token`.
#[cfg(feature = "sqlx")]
async fn set_balance_sqlx(
    pool: &sqlx::PgPool,
    fence: &PgFence,
    balance: i64,
    token: FencingToken,
) -> Result<(), CoordError> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("UPDATE accounts SET balance = $1 WHERE id = 1")
        .bind(balance)
        .execute(&mut *tx)
        .await
        .unwrap();
    fence.commit_sqlx(tx, "accounts", token).await
}

/// The seed scenario with the stale holder a separate OS process: it
/// takes calm's `Lock` on a `PostgresStore` (lease TTL 1 s) and is frozen
/// with SIGSTOP three times: before it opens its transaction; inside it
/// after admitting and updating; and inside a transaction that admits at
/// commit (`PgFence::begin`), before its update. Its successor acquires
/// the lock when the frozen lease expires, admits its own token (in the
/// second case after the server ends the frozen session, idle in its
/// transaction past `idle_in_transaction_session_timeout`) and commits.
/// Resumed, the stale holder is refused every time (in the third, its
/// update runs and its commit is refused), and an observer polling the
/// account never sees the stale holder's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_process_never_commits_after_its_successor() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};

    use calm::backend::postgres::{PostgresOptions, PostgresStore};
    use calm::coord::{Lease, Lock};
    use calm::testing::servers::{Signal, send_signal};

    let Some(server) = skip_or_fail(PostgresServer::start()) else {
        return;
    };
    let store =
        PostgresStore::connect_with(PostgresOptions::new(server.url()).with_schema("fence_locks"))
            .await
            .unwrap();
    let lock = Lock::new(store.clone(), "locks/accounts/").unwrap();
    let fence = PgFence::new("calm_fence").unwrap();
    let mut c = client(server.url()).await;
    let observer = client(server.url()).await;
    setup(&c, &fence).await;
    // Every stale token the observer must never see as the last writer.
    let stale = Arc::new(std::sync::Mutex::new(Vec::<i64>::new()));
    let seen_stale = {
        let stale = Arc::clone(&stale);
        tokio::spawn(async move {
            loop {
                let last: i64 = observer
                    .query_one("SELECT last_token FROM accounts WHERE id = 1", &[])
                    .await
                    .unwrap()
                    .get(0);
                if stale.lock().unwrap().contains(&last) {
                    return last;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let exe = std::env::current_exe().unwrap();
    for phase in ["before-tx", "in-tx", "at-commit"] {
        let child = Command::new(&exe)
            .args([
                "--ignored",
                "--exact",
                "--nocapture",
                "pg_fence::fenced_holder",
            ])
            .env("CALM_FENCED_HOLDER", format!("{}|{phase}", server.url()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut child = crate::server_faults::Kill(vec![child]);
        let pid = child.0[0].id();
        let mut stdin = child.0[0].stdin.take().unwrap();
        let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
        let stdout = child.0[0].stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines_tx.send(line);
            }
        });
        let next = |prefix: &str| loop {
            let line = lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("{phase}: the holder went quiet"));
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_owned();
            }
        };
        let token: i64 = next("HOLDING ").trim().parse().unwrap();
        stale.lock().unwrap().push(token);
        send_signal(pid, Signal::Stop).unwrap();

        let lease = Lease::grant(store.clone(), Duration::from_secs(1))
            .await
            .unwrap();
        let guard = tokio::time::timeout(Duration::from_secs(30), lock.lock(&lease))
            .await
            .expect("the frozen holder's lease never expired")
            .unwrap();
        let mine = i64::try_from(guard.token().get()).unwrap();
        assert!(mine > token, "{phase}: successor {mine} after {token}");
        let successor = "UPDATE accounts SET balance = balance + 5, last_token = $1 WHERE id = 1";
        if phase == "at-commit" {
            let tx = fence
                .begin(&mut c, "accounts", guard.token())
                .await
                .unwrap();
            tx.execute(successor, &[&mine]).await.unwrap();
            tx.commit().await.unwrap();
        } else {
            let tx = c.transaction().await.unwrap();
            tokio::time::timeout(
                Duration::from_secs(30),
                fence.admit(&tx, "accounts", guard.token()),
            )
            .await
            .expect("the frozen holder's transaction was never ended")
            .unwrap();
            tx.execute(successor, &[&mine]).await.unwrap();
            tx.commit().await.unwrap();
        }

        send_signal(pid, Signal::Cont).unwrap();
        writeln!(stdin, "GO").unwrap();
        let outcome = next("OUTCOME ");
        assert!(
            outcome.starts_with("refused"),
            "{phase}: the stale holder {outcome}"
        );
        let row = c
            .query_one("SELECT balance, last_token FROM accounts WHERE id = 1", &[])
            .await
            .unwrap();
        let (balance, last): (i64, i64) = (row.get(0), row.get(1));
        assert_eq!(last, mine, "{phase}: the last writer is the successor");
        let expected = match phase {
            "before-tx" => 105,
            "in-tx" => 110,
            _ => 115,
        };
        assert_eq!(
            balance, expected,
            "{phase}: only the successors' +5s landed"
        );
        guard.unlock().await.unwrap();
        lease.revoke().await.unwrap();
        let _ = child.0[0].wait();
    }
    assert!(
        !seen_stale.is_finished(),
        "a stale holder's write was visible"
    );
    seen_stale.abort();
}

/// The stale holder of
/// [`a_frozen_holder_process_never_commits_after_its_successor`]: does
/// nothing unless `CALM_FENCED_HOLDER` (`url|phase`) is set. Prints
/// `HOLDING <token>` once it holds the lock (and, in phase `in-tx`, has
/// admitted, a second time with the token it holds, and updated the
/// account in an open transaction), waits for `GO` on stdin, then
/// finishes and prints `OUTCOME committed` or `OUTCOME refused: <error>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "entry point of the frozen holder process"]
async fn fenced_holder() {
    use calm::backend::postgres::{PostgresOptions, PostgresStore};
    use calm::coord::{Lease, Lock};

    let Ok(config) = std::env::var("CALM_FENCED_HOLDER") else {
        return;
    };
    let (url, phase) = config.split_once('|').expect("url|phase");
    let store = PostgresStore::connect_with(PostgresOptions::new(url).with_schema("fence_locks"))
        .await
        .unwrap();
    let lock = Lock::new(store.clone(), "locks/accounts/").unwrap();
    let lease = Lease::grant(store.clone(), Duration::from_secs(1))
        .await
        .unwrap();
    let guard = lock.lock(&lease).await.unwrap();
    let token = guard.token();
    let mine = i64::try_from(token.get()).unwrap();
    let fence = PgFence::new("calm_fence").unwrap();
    let mut c = client(url).await;
    // What a fenced writer's sessions should set: a holder frozen inside
    // its transaction keeps the fence locked until the server ends
    // the session. Phase `at-commit` holds no lock while frozen (it
    // opened its transaction and has not written yet), so its session
    // stays, and only the fence can refuse its commit.
    if phase != "at-commit" {
        c.batch_execute("SET idle_in_transaction_session_timeout = '1s'")
            .await
            .unwrap();
    }
    let stale_write = "UPDATE accounts SET balance = balance - 10, last_token = $1 WHERE id = 1";
    let holding = || println!("HOLDING {mine}");
    let finished = if phase == "at-commit" {
        let t = fence.begin(&mut c, "accounts", token).await.unwrap();
        holding();
        wait_for_go().await;
        async {
            t.execute(stale_write, &[&mine])
                .await
                .map_err(|e| e.to_string())?;
            t.commit().await.map_err(|e| e.to_string())
        }
        .await
    } else if phase == "in-tx" {
        // A holder that has written under its token before: its token is
        // the recorded one, so the frozen admission holds the fence shared.
        let t = c.transaction().await.unwrap();
        fence.admit(&t, "accounts", token).await.unwrap();
        t.commit().await.unwrap();
        let t = c.transaction().await.unwrap();
        fence.admit(&t, "accounts", token).await.unwrap();
        t.execute(stale_write, &[&mine]).await.unwrap();
        holding();
        wait_for_go().await;
        t.commit().await.map_err(|e| e.to_string())
    } else {
        holding();
        wait_for_go().await;
        async {
            let t = c.transaction().await.map_err(|e| e.to_string())?;
            fence
                .admit(&t, "accounts", token)
                .await
                .map_err(|e| e.to_string())?;
            t.execute(stale_write, &[&mine])
                .await
                .map_err(|e| e.to_string())?;
            t.commit().await.map_err(|e| e.to_string())
        }
        .await
    };
    match finished {
        Ok(()) => println!("OUTCOME committed"),
        Err(e) => println!("OUTCOME refused: {e}"),
    }
}

/// Blocks until the test writes `GO` to this process' stdin (the process
/// is frozen meanwhile, then resumed).
async fn wait_for_go() {
    let go = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    });
    assert_eq!(go.await.unwrap().unwrap().trim(), "GO");
}
