//! Efficiency locks on real `redis-server` processes: acquire, extend and
//! release; non-holders refused with the key untouched; bad input refused
//! before anything is sent; Redis killed, restarted and frozen under a
//! holder; Redlock on three and five servers with one down; and the seed's
//! lesson as a runnable pair: a holder frozen past its TTL and its
//! successor both act on a Redis lock, while calm's `Lock` with a fence
//! refuses the frozen holder's late write.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use calm::backend::redis::{
    EfficiencyLoss, MAX_KEY_LEN, MAX_TTL, RedisLock, RedisLockError, RedisLockOptions, Redlock,
};
use calm::testing::servers::{RedisServer, Signal, send_signal, skip_or_fail};

/// A server: `CALM_REDIS_URL` if set, else one of our own (or a skip).
fn server() -> Option<RedisServer> {
    skip_or_fail(RedisServer::start())
}

/// A server of our own, to freeze or kill (or a skip).
fn own_server() -> Option<RedisServer> {
    skip_or_fail(RedisServer::start_own())
}

/// A plain connection, to look at keys behind the lock's back.
async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn get(url: &str, key: &[u8]) -> Option<Vec<u8>> {
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut raw(url).await)
        .await
        .unwrap()
}

async fn pttl(url: &str, key: &[u8]) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut raw(url).await)
        .await
        .unwrap()
}

async fn set(url: &str, key: &[u8], value: &[u8], px: u64) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(px)
        .query_async(&mut raw(url).await)
        .await
        .unwrap();
}

fn opts(ttl_ms: u64) -> RedisLockOptions {
    RedisLockOptions::new(Duration::from_millis(ttl_ms))
}

/// Acquire sets our random value with the TTL, a second acquire finds it
/// held, extend renews the TTL, release deletes it and frees the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_extend_release() {
    let Some(server) = server() else { return };
    let url = server.url();
    let key = b"calm-test/basic";
    let locks = RedisLock::new(url, opts(2000).with_auto_extend(false)).unwrap();
    let guard = locks.try_acquire(key).await.unwrap().expect("free lock");
    assert!(guard.is_held());
    assert_eq!(get(url, key).await.as_deref(), Some(guard.value()));
    assert!(guard.valid_for() > Duration::from_millis(1500));
    // Held: a second holder is refused without an error.
    assert!(locks.try_acquire(key).await.unwrap().is_none());
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before = pttl(url, key).await;
    guard.extend().await.unwrap();
    let after = pttl(url, key).await;
    assert!(before < 1500 && after > 1800, "pttl {before} -> {after}");
    assert!(guard.valid_for() > Duration::from_millis(1800));
    guard.release().await.unwrap();
    assert_eq!(get(url, key).await, None);
    // Free again, and `acquire` takes it at once.
    let again = locks.acquire(key).await.unwrap();
    again.release().await.unwrap();
}

/// A holder whose lock expired is a non-holder: its extend and release
/// are refused with `NotHeld`, and the successor's key keeps its value
/// and its TTL. Its lost signal says `Expired`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_holder_refused_key_untouched() {
    let Some(server) = server() else { return };
    let url = server.url();
    let key = b"calm-test/non-holder";
    let short = RedisLock::new(url, opts(300).with_auto_extend(false)).unwrap();
    let a = short.try_acquire(key).await.unwrap().unwrap();
    let loss = tokio::time::timeout(Duration::from_secs(2), a.lost())
        .await
        .expect("the lost signal");
    assert_eq!(loss, EfficiencyLoss::Expired);
    let long = RedisLock::new(url, opts(10_000)).unwrap();
    // A's validity ends a drift allowance before Redis expires the key.
    let b = long.acquire(key).await.unwrap();
    // A's guard is lost: its extend is refused locally...
    assert!(a.extend().await.unwrap_err().is_not_held());
    // ... and its release is refused by Redis (the script compares).
    assert!(matches!(
        a.release().await.unwrap_err(),
        RedisLockError::NotHeld
    ));
    assert_eq!(get(url, key).await.as_deref(), Some(b.value()));
    let left = pttl(url, key).await;
    assert!(left > 9000, "the successor's ttl changed: {left} ms");

    // A holder whose key was taken over behind its back (deleted and set
    // by another) is refused by Redis on extend, and marked lost.
    let c = RedisLock::new(url, opts(10_000).with_auto_extend(false)).unwrap();
    let other = b"calm-test/non-holder-2";
    let g = c.try_acquire(other).await.unwrap().unwrap();
    set(url, other, b"someone else", 10_000).await;
    assert!(g.extend().await.unwrap_err().is_not_held());
    assert_eq!(g.loss(), Some(EfficiencyLoss::Expired));
    assert!(g.release().await.unwrap_err().is_not_held());
    assert_eq!(get(url, other).await.as_deref(), Some(&b"someone else"[..]));
    b.release().await.unwrap();
}

/// Empty and oversize keys, zero, tiny and oversize TTLs, bad options and
/// URLs: typed errors, and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_typed() {
    let Some(server) = server() else { return };
    let url = server.url();
    let locks = RedisLock::new(url, opts(1000)).unwrap();
    let long = vec![b'k'; MAX_KEY_LEN + 1];
    for key in [&b""[..], &long[..]] {
        let e = locks.try_acquire(key).await.unwrap_err();
        assert!(
            matches!(e, RedisLockError::InvalidKey { len, .. } if len == key.len()),
            "{e:?}"
        );
        let e = locks.acquire(key).await.unwrap_err();
        assert!(matches!(e, RedisLockError::InvalidKey { .. }), "{e:?}");
        assert!(!e.is_retryable());
    }
    assert_eq!(get(url, &long).await, None);
    // The longest key is fine.
    let max = vec![b'm'; MAX_KEY_LEN];
    locks
        .try_acquire(&max)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    for ttl in [
        Duration::ZERO,
        Duration::from_micros(500),
        // Not longer than the drift allowance (1% + 2 ms).
        Duration::from_millis(2),
        MAX_TTL + Duration::from_millis(1),
        Duration::MAX,
    ] {
        let e = RedisLock::new(url, RedisLockOptions::new(ttl)).unwrap_err();
        assert!(
            matches!(e, RedisLockError::InvalidTtl { .. }),
            "{ttl:?}: {e:?}"
        );
        let e = Redlock::new([url], RedisLockOptions::new(ttl)).unwrap_err();
        assert!(
            matches!(e, RedisLockError::InvalidTtl { .. }),
            "{ttl:?}: {e:?}"
        );
    }
    for bad in [
        opts(1000).with_renew_fraction(1.0),
        opts(1000).with_drift_factor(-0.1),
        opts(1000).with_backoff(Duration::from_millis(10), Duration::from_millis(1)),
        opts(1000).with_request_timeout(Duration::ZERO),
    ] {
        let e = RedisLock::new(url, bad).unwrap_err();
        assert!(matches!(e, RedisLockError::InvalidOptions { .. }), "{e:?}");
    }
    let e = Redlock::new(Vec::<String>::new(), opts(1000)).unwrap_err();
    assert!(matches!(e, RedisLockError::InvalidOptions { .. }), "{e:?}");
    let e = RedisLock::new("not a url", opts(1000)).unwrap_err();
    assert!(matches!(e, RedisLockError::InvalidUrl { .. }), "{e:?}");
}

/// Outside a Tokio runtime, creating a lock service is a typed error.
#[test]
fn no_runtime_is_typed() {
    let e = RedisLock::new("redis://127.0.0.1:1/", opts(1000)).unwrap_err();
    assert!(matches!(e, RedisLockError::NoRuntime), "{e:?}");
}

/// Redis is SIGKILLed while a holder extends: the lost signal fires within
/// the validity; after a restart, acquisition works again through the
/// same lock service (its connection is remade).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_under_a_holder() {
    let Some(mut server) = own_server() else {
        return;
    };
    let key = b"calm-test/kill";
    let locks = RedisLock::new(server.url(), opts(1000).with_wait(Duration::from_secs(5))).unwrap();
    let guard = locks.acquire(key).await.unwrap();
    // Extensions keep it alive past its TTL.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(guard.is_held(), "{:?}", guard.state());
    tokio::task::block_in_place(|| server.kill());
    let killed = Instant::now();
    let loss = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the lost signal");
    eprintln!("lost {:?} after the kill: {loss}", killed.elapsed());
    assert!(
        matches!(loss, EfficiencyLoss::Unreachable { .. }),
        "{loss:?}"
    );
    assert!(killed.elapsed() <= Duration::from_millis(1100));
    assert!(guard.check().is_err());
    // Down: a bounded, typed failure.
    let e = locks.try_acquire(key).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let again = locks.acquire(key).await.unwrap();
    assert!(again.is_held());
    again.release().await.unwrap();
}

/// Redis is frozen with SIGSTOP: `acquire` returns `TimedOut` at its
/// deadline (never hangs), `try_acquire` a request timeout; after SIGCONT
/// the lock works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_times_out() {
    let Some(server) = own_server() else { return };
    let locks = RedisLock::new(
        server.url(),
        opts(5000)
            .with_wait(Duration::from_millis(600))
            .with_request_timeout(Duration::from_millis(200)),
    )
    .unwrap();
    // A warm connection, so the freeze hits requests, not the connect.
    let warm = locks
        .try_acquire(b"calm-test/frozen-warm")
        .await
        .unwrap()
        .unwrap();
    server.signal(Signal::Stop).unwrap();
    let start = Instant::now();
    let e = locks.acquire(b"calm-test/frozen").await.unwrap_err();
    let took = start.elapsed();
    server.signal(Signal::Cont).unwrap();
    assert!(
        matches!(&e, RedisLockError::TimedOut { source: Some(s), .. } if s.is_timeout()),
        "{e:?}"
    );
    assert!(took < Duration::from_millis(1200), "acquire took {took:?}");
    server.signal(Signal::Stop).unwrap();
    let start = Instant::now();
    let e = locks.try_acquire(b"calm-test/frozen").await.unwrap_err();
    let took = start.elapsed();
    server.signal(Signal::Cont).unwrap();
    assert!(matches!(e, RedisLockError::RequestTimeout { .. }), "{e:?}");
    assert!(
        took < Duration::from_millis(1000),
        "try_acquire took {took:?}"
    );
    let g = locks.acquire(b"calm-test/frozen").await.unwrap();
    g.release().await.unwrap();
    warm.release().await.unwrap();
}

/// `n` servers of our own, or a skip.
fn servers(n: usize) -> Option<Vec<RedisServer>> {
    (0..n).map(|_| own_server()).collect()
}

/// Redlock on three servers, one of them down: a majority of two grants
/// the lock and a second client is refused, leaving nothing of its own
/// behind; release clears every live instance. With two down, no quorum:
/// a typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_three_servers_one_down() {
    let Some(mut s) = servers(3) else { return };
    let urls: Vec<String> = s.iter().map(|s| s.url().to_string()).collect();
    s[2].kill();
    let key = b"calm-test/redlock3";
    let options = opts(5000).with_request_timeout(Duration::from_millis(200));
    let a = Redlock::new(&urls, options.clone()).unwrap();
    let b = Redlock::new(&urls, options.clone()).unwrap();
    assert_eq!((a.instances(), a.quorum()), (3, 2));
    let ga = a.try_acquire(key).await.unwrap().expect("a majority is up");
    assert!(ga.valid_for() > Duration::from_millis(4500));
    for url in &urls[..2] {
        assert_eq!(get(url, key).await.as_deref(), Some(ga.value()));
    }
    assert!(b.try_acquire(key).await.unwrap().is_none());
    for url in &urls[..2] {
        assert_eq!(get(url, key).await.as_deref(), Some(ga.value()));
    }
    ga.extend().await.unwrap();
    ga.release().await.unwrap();
    for url in &urls[..2] {
        assert_eq!(get(url, key).await, None);
    }
    let gb = b.try_acquire(key).await.unwrap().expect("released");
    gb.release().await.unwrap();
    s[1].kill();
    let e = b.try_acquire(key).await.unwrap_err();
    assert!(
        matches!(
            e,
            RedisLockError::NoQuorum {
                answered: 1,
                needed: 2,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(get(&urls[0], key).await, None, "released on all");
}

/// Redlock on five servers, one down: another value on three of the four
/// live instances means no majority (the round's own writes are released
/// on all); on two of them, still none (two yeses of five); once they are
/// gone, four yeses grant it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_five_servers_one_down() {
    let Some(mut s) = servers(5) else { return };
    let urls: Vec<String> = s.iter().map(|s| s.url().to_string()).collect();
    s[4].kill();
    let key = b"calm-test/redlock5";
    let locks = Redlock::new(&urls, opts(5000).with_wait(Duration::from_millis(300))).unwrap();
    assert_eq!(locks.quorum(), 3);
    for url in &urls[..3] {
        set(url, key, b"other", 10_000).await;
    }
    assert!(locks.try_acquire(key).await.unwrap().is_none());
    assert_eq!(get(&urls[3], key).await, None, "released on all");
    let _: () = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut raw(&urls[0]).await)
        .await
        .unwrap();
    // Two "other", two free, one down: two yeses of five is no majority.
    let e = locks.acquire(key).await.unwrap_err();
    assert!(matches!(e, RedisLockError::TimedOut { .. }), "{e:?}");
    for url in [&urls[0], &urls[3]] {
        assert_eq!(get(url, key).await, None, "released on all");
    }
    for url in &urls[1..3] {
        let _: () = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut raw(url).await)
            .await
            .unwrap();
    }
    let g = locks.acquire(key).await.unwrap();
    for url in &urls[..4] {
        assert_eq!(get(url, key).await.as_deref(), Some(g.value()));
    }
    g.release().await.unwrap();
}

/// The seed's lesson, first half: a holder process checks that it holds
/// the Redis lock and is frozen (SIGSTOP) before it writes; its key
/// expires; a second holder acquires and writes; the first is resumed and
/// writes too, overwriting the second's write. Both believed they held the
/// lock; nothing could refuse the stale write, because the guard has no
/// token to check. The lost signal comes, but after the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lock_lets_a_paused_holder_act() {
    let Some(server) = own_server() else { return };
    let url = server.url().to_string();
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "--nocapture",
            "redis::paused_holder",
        ])
        .env("CALM_REDIS_HOLDER", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let child = Kill(child);
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let expect = |prefix: &str| -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx.recv_timeout(left).expect("the holder went quiet");
            if line.starts_with(prefix) {
                return line;
            }
        }
    };
    expect("CHECKED");
    // A checked that it holds the lock; it is frozen before it writes.
    send_signal(child.0.id(), Signal::Stop).unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await; // > A's TTL
    let locks = RedisLock::new(&url, opts(5000)).unwrap();
    let b = locks
        .try_acquire(HOLDER_KEY)
        .await
        .unwrap()
        .expect("A's key expired while A was frozen");
    b.check().unwrap();
    set(&url, RESOURCE_KEY, b"written by B", 60_000).await;
    send_signal(child.0.id(), Signal::Cont).unwrap();
    expect("WROTE");
    let lost = expect("LOST");
    // A's write landed after B's, while B held (and holds) the lock.
    assert_eq!(
        get(&url, RESOURCE_KEY).await.as_deref(),
        Some(&b"written by A"[..]),
        "A's stale write went through"
    );
    assert!(b.is_held());
    assert_eq!(get(&url, HOLDER_KEY).await.as_deref(), Some(b.value()));
    eprintln!("A: {lost} (after its write); B still holds the lock: both acted");
    b.release().await.unwrap();
    drop(child);
}

/// The lock and the resource of the paused-holder scenario.
const HOLDER_KEY: &[u8] = b"calm-test/paused/lock";
const RESOURCE_KEY: &[u8] = b"calm-test/paused/resource";

/// The entry point of [`redis_lock_lets_a_paused_holder_act`]'s holder
/// process: does nothing unless `CALM_REDIS_HOLDER` (the URL) is set.
/// Acquires (TTL 500 ms, extended in the background), checks, works for
/// 400 ms, writes, then reports the lost signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "entry point of the paused-holder test's child process"]
async fn paused_holder() {
    let Ok(url) = std::env::var("CALM_REDIS_HOLDER") else {
        return;
    };
    let locks = RedisLock::new(&url, opts(500)).unwrap();
    let guard = locks.acquire(HOLDER_KEY).await.unwrap();
    println!("ACQUIRED");
    guard.check().unwrap();
    println!("CHECKED held");
    // The work between the check and the write (here it is frozen).
    tokio::time::sleep(Duration::from_millis(400)).await;
    set(&url, RESOURCE_KEY, b"written by A", 60_000).await;
    println!("WROTE");
    let loss = guard.lost().await;
    println!("LOST {loss}");
    std::future::pending::<()>().await;
}

/// The seed's lesson, second half: the same story with calm's `Lock` and a
/// `StoreFence` (on the embedded store; A's connection frozen and the
/// clock moved past the TTL). B's lock has a higher token; A's late write,
/// made with its old token, is refused, and B's write stands.
#[tokio::test]
async fn fenced_lock_refuses_the_paused_holder() {
    use std::sync::Arc;

    use calm::coord::{CoordError, Lease, LeaseOptions, Lock, StoreFence};
    use calm::store::{ManualClock, MemoryStore, MemoryStoreOptions, Store};
    use calm::testing::faults::InstrumentedStore;

    let clock = ManualClock::new();
    let store = MemoryStore::with_options(MemoryStoreOptions::default().with_clock(clock.clone()));
    let ttl = Duration::from_millis(500);
    let lease_opts = LeaseOptions::new(ttl).with_clock(Arc::new(clock.clone()));
    let a_conn = InstrumentedStore::new(store.clone());
    let a_lock = Lock::new(a_conn.clone(), "paused/lock/").unwrap();
    let a_fence = StoreFence::new(a_conn.clone(), b"paused/fence".to_vec()).unwrap();
    let a_lease = Lease::grant_with(a_conn.clone(), lease_opts.clone())
        .await
        .unwrap();
    let a = a_lock.lock(&a_lease).await.unwrap();
    a_lease.check().unwrap(); // A checked that it holds the lock...
    a_conn.pause(); // ... and is frozen before it writes.
    clock.advance(Duration::from_millis(1200));

    let b_lock = Lock::new(store.clone(), "paused/lock/").unwrap();
    let b_fence = StoreFence::new(store.clone(), b"paused/fence".to_vec()).unwrap();
    let b_lease = Lease::grant_with(store.clone(), lease_opts).await.unwrap();
    let b = b_lock.lock(&b_lease).await.unwrap();
    assert!(b.token() > a.token());
    b_fence
        .put(b.token(), b"paused/resource", b"written by B")
        .await
        .unwrap();

    a_conn.resume();
    let late = a_fence
        .put(a.token(), b"paused/resource", b"written by A")
        .await;
    assert!(matches!(late, Err(CoordError::Fenced(_))), "{late:?}");
    let stored = store
        .get(b"paused/resource")
        .await
        .unwrap()
        .map(|kv| kv.value);
    assert_eq!(stored.as_deref(), Some(&b"written by B"[..]));
    drop(a);
    b.unlock().await.unwrap();
}

/// Kills the child process when the test ends, however it ends (resuming
/// it first, so a frozen one dies too).
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = send_signal(self.0.id(), Signal::Cont);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
