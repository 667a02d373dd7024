//! `PartitionLog`: a single writer per partition across members that pause
//! and crash, the same test on every backend.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use calm::coord::{Lease, Ownership};
use calm::partition::{LogError, PartitionLog};
use calm::store::{MemoryStore, Store, TxnOp};
use calm::testing::faults::InstrumentedStore;

/// Entities the producer writes to.
const ENTITIES: usize = 10;
/// Commands per entity.
const PER_ENTITY: usize = 30;

/// One member's loop: join with a fresh lease, apply what it owns, and
/// when its lease is lost (it was paused past the TTL) join again. The
/// effect of a command is a key of its own holding the applying member's
/// view token, so the test can tell who applied what, and whether twice.
async fn member<S: Store + Clone + 'static>(
    store: InstrumentedStore<S>,
    prefix: String,
    name: String,
    ttl: Duration,
    stop: Arc<AtomicBool>,
) {
    let log = PartitionLog::new(store.clone(), format!("{prefix}log/"), 8).unwrap();
    let group = Ownership::new(store.clone(), format!("{prefix}members/")).unwrap();
    let effects = format!("{prefix}effects/");
    while !stop.load(Ordering::Relaxed) {
        let Ok(lease) = Lease::grant(store.clone(), ttl).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if group.join(&name, &lease).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        while !stop.load(Ordering::Relaxed) && lease.is_alive() {
            let Ok(view) = group.view().await else {
                continue;
            };
            match log
                .apply_owned(&view, &name, effect(&effects, view.token().get()))
                .await
            {
                Ok(_) | Err(LogError::Coord(_)) => {}
                Err(e) => panic!("{name}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The effect of a command: a key of its own (`effects/<entity>/<seq>`)
/// holding the token of the view it was applied under.
fn effect(effects: &str, token: u64) -> impl FnMut(&calm::partition::Command) -> Vec<TxnOp> {
    let effects = effects.to_owned();
    move |c| {
        let mut key = effects.clone().into_bytes();
        key.extend_from_slice(&c.key);
        key.push(b'/');
        key.extend_from_slice(&c.payload);
        vec![TxnOp::put(&key, &token.to_be_bytes())]
    }
}

/// Three members apply a stream of commands for ten entities while one is
/// paused past its lease (its in-flight calls held, then released with a
/// stale view) and another crashes (its task aborted, its lease left to
/// expire) and comes back, and a zombie keeps applying with the view from
/// before the crash (an owner that paused holding it: two members then
/// believe they own the same partitions). Afterwards every command was applied exactly
/// once, each entity's commands in the order they were appended, and in
/// each partition the applying tokens never went down in commit order (a
/// stale owner's effect never landed after a newer owner's).
pub(crate) async fn single_writer_under_pauses_and_crashes<S: Store + Clone + 'static>(
    store: S,
    prefix: &str,
    ttl: Duration,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let conns: Vec<InstrumentedStore<S>> = (0..3)
        .map(|_| InstrumentedStore::new(store.clone()))
        .collect();
    let spawn = |i: usize| {
        tokio::spawn(member(
            conns[i].clone(),
            prefix.to_owned(),
            format!("m{i}"),
            ttl,
            Arc::clone(&stop),
        ))
    };
    let mut members: Vec<_> = (0..3).map(spawn).collect();

    let log = PartitionLog::new(store.clone(), format!("{prefix}log/"), 8).unwrap();
    let group = Ownership::new(store.clone(), format!("{prefix}members/")).unwrap();
    let deadline = Instant::now() + ttl * 20;
    let first_view = loop {
        let view = group.view().await.unwrap();
        if view.members().len() == 3 {
            break view;
        }
        assert!(Instant::now() < deadline, "the members never joined");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let zombie = {
        let (log, stop) = (log.clone(), Arc::clone(&stop));
        let effects = format!("{prefix}effects/");
        tokio::spawn(async move {
            let mut applied = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut effect = effect(&effects, first_view.token().get());
                // A pause between reading the log and writing: the window
                // in which the partition's other owner moves on.
                let handler = move |c: &calm::partition::Command| {
                    std::thread::sleep(Duration::from_millis(2));
                    effect(c)
                };
                if let Ok(a) = log.apply_owned(&first_view, "m2", handler).await {
                    applied += a.commands;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            applied
        })
    };
    let mut appended: HashMap<Vec<u8>, Vec<u64>> = HashMap::new();
    for n in 0..ENTITIES * PER_ENTITY {
        let entity = format!("account-{}", n % ENTITIES).into_bytes();
        let seq = (n / ENTITIES) as u64;
        let revision = log
            .append(&entity, format!("{seq:04}").as_bytes())
            .await
            .unwrap();
        appended.entry(entity).or_default().push(revision.get());
        match n {
            // m1 freezes mid-stream, past its lease.
            60 => conns[1].pause(),
            // m2 crashes: its loop and lease keeper vanish at once.
            120 => {
                members[2].abort();
                let _ = (&mut members[2]).await;
            }
            200 => {
                conns[1].resume();
                members[2] = spawn(2);
            }
            _ => {}
        }
        if n % 20 == 0 {
            tokio::time::sleep(ttl / 4).await;
        }
    }
    for revisions in appended.values() {
        assert!(revisions.windows(2).all(|w| w[0] < w[1]));
    }

    // Wait until every partition is drained.
    let deadline = Instant::now() + ttl * 30;
    loop {
        let mut waiting = 0;
        for p in 0..log.partitions() {
            waiting += log.pending(p).await.unwrap().len();
        }
        if waiting == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{waiting} commands still waiting"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for m in members {
        m.abort();
    }
    let zombie_applied = zombie.await.unwrap();
    eprintln!("partition log: the zombie applied {zombie_applied} commands before it was fenced");

    // Every effect exactly once, in each entity's order.
    let effects = store
        .range(format!("{prefix}effects/").as_bytes(), None)
        .await
        .unwrap()
        .kvs;
    assert_eq!(effects.len(), ENTITIES * PER_ENTITY, "a command was lost");
    let mut by_entity: BTreeMap<Vec<u8>, Vec<(u64, u64)>> = BTreeMap::new();
    let mut by_partition: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for kv in &effects {
        assert_eq!(kv.writes, 1, "{:?} applied twice", kv.key);
        let rest = &kv.key[prefix.len() + "effects/".len()..];
        let slash = rest.iter().rposition(|&b| b == b'/').unwrap();
        let (entity, seq) = (&rest[..slash], &rest[slash + 1..]);
        let seq: u64 = std::str::from_utf8(seq).unwrap().parse().unwrap();
        let token = u64::from_be_bytes(kv.value.as_slice().try_into().unwrap());
        by_entity
            .entry(entity.to_vec())
            .or_default()
            .push((kv.create_revision.get(), seq));
        by_partition
            .entry(log.partition_of(entity))
            .or_default()
            .push((kv.create_revision.get(), token));
    }
    for (entity, mut applied) in by_entity {
        applied.sort();
        let order: Vec<u64> = applied.iter().map(|a| a.1).collect();
        assert_eq!(
            order,
            (0..PER_ENTITY as u64).collect::<Vec<_>>(),
            "{}: applied out of order",
            String::from_utf8_lossy(&entity)
        );
    }
    for (partition, mut applied) in by_partition {
        applied.sort();
        assert!(
            applied.windows(2).all(|w| w[0].1 <= w[1].1),
            "partition {partition}: a stale owner's token landed after a newer one's: {applied:?}"
        );
    }
    // Each partition's recorded progress is its last command's revision.
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    for (entity, revisions) in &appended {
        let p = last.entry(log.partition_of(entity)).or_default();
        *p = (*p).max(*revisions.last().unwrap());
    }
    for p in 0..log.partitions() {
        let expected = last.get(&p).copied().unwrap_or(0);
        assert_eq!(
            log.progress(p).await.unwrap().get(),
            expected,
            "partition {p}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_writer_on_memory() {
    single_writer_under_pauses_and_crashes(MemoryStore::new(), "pl/", Duration::from_millis(500))
        .await;
}

/// Bad input is refused with typed errors and changes nothing.
#[tokio::test]
async fn bad_input_is_refused() {
    let store = MemoryStore::new();
    assert!(matches!(
        PartitionLog::new(store.clone(), "x/", 0),
        Err(LogError::InvalidPartitions { .. })
    ));
    assert!(PartitionLog::new(store.clone(), "", 4).is_err());
    let log = PartitionLog::new(store.clone(), "x/", 4).unwrap();
    assert!(matches!(
        log.append(b"", b"p").await,
        Err(LogError::InvalidKey { .. })
    ));
    assert!(matches!(
        log.append(&[7; calm::partition::MAX_ENTITY_KEY + 1], b"p")
            .await,
        Err(LogError::InvalidKey { .. })
    ));
    assert!(matches!(
        log.append_once(b"k", "", b"p").await,
        Err(LogError::InvalidKey { .. })
    ));
    assert!(matches!(
        log.pending(4).await,
        Err(LogError::InvalidPartitions { .. })
    ));
    assert_eq!(store.range(b"x/", None).await.unwrap().kvs.len(), 0);
    // A foreign entry under the prefix is reported, not misread.
    let p = log.partition_of(b"k");
    let _ = store
        .put(
            format!("x/log/{p:05}/foreign").as_bytes(),
            b"\xff\xff\xff\xff",
            calm::store::PutOptions::new(),
        )
        .await
        .unwrap();
    assert!(matches!(
        log.pending(p).await,
        Err(LogError::Corrupt { .. })
    ));
    // A retried append with its own id is added once.
    let (r1, added) = log.append_once(b"k2", "cmd-1", b"p").await.unwrap();
    let (r2, again) = log.append_once(b"k2", "cmd-1", b"p").await.unwrap();
    assert!(added && !again);
    assert_eq!(r1, r2);
}

/// The race the transaction's compares exist for, made deterministic: a
/// newer owner reads a partition's commands, and before it writes, the
/// partition's old owner (its view older, its token lower but not yet
/// fenced out: the newer owner has not written) applies them all. The
/// newer owner's fence admits its higher token, so only the compares on
/// the progress record and the command entry stop it from applying the
/// same commands a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_owner_finishing_first_is_not_applied_over() {
    let store = MemoryStore::new();
    let log = PartitionLog::new(store.clone(), "race/log/", 64).unwrap();
    let group = Ownership::new(store.clone(), "race/members/").unwrap();
    let ttl = Duration::from_secs(30);
    let lease_a = Lease::grant(store.clone(), ttl).await.unwrap();
    group.join("a", &lease_a).await.unwrap();
    let old = group.view().await.unwrap();
    let lease_b = Lease::grant(store.clone(), ttl).await.unwrap();
    group.join("b", &lease_b).await.unwrap();
    let new = group.view().await.unwrap();
    assert!(new.token() > old.token());
    let p = (0..log.partitions())
        .find(|&p| {
            let name = log.partition_name(p);
            old.owns("a", &name) && new.owns("b", &name)
        })
        .expect("b takes some partition over from a");
    let entity = (0..)
        .map(|i| format!("account-{i}").into_bytes())
        .find(|k| log.partition_of(k) == p)
        .unwrap();
    for seq in 0..3 {
        log.append(&entity, format!("{seq}").as_bytes())
            .await
            .unwrap();
    }

    // Each application leaves a key of its own: `<id>/<token>`.
    let effect = |token: u64| {
        move |c: &calm::partition::Command| {
            vec![TxnOp::put(
                format!("race/effects/{}/{token}", c.id).as_bytes(),
                b"",
            )]
        }
    };
    let mut old_ran = None;
    let b_effect = effect(new.token().get());
    let handler = |c: &calm::partition::Command| {
        if old_ran.is_none() {
            // b has read the commands; a runs its whole pass now.
            let (log, old) = (log.clone(), old.clone());
            let a_effect = effect(old.token().get());
            old_ran = Some(
                std::thread::spawn(move || {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                        .block_on(log.apply_owned(&old, "a", a_effect))
                })
                .join()
                .unwrap()
                .unwrap(),
            );
        }
        b_effect(c)
    };
    let by_b = log.apply_owned(&new, "b", handler).await.unwrap();
    let by_a = old_ran.expect("b's handler ran");
    assert_eq!(by_a.commands, 3, "a applied the partition first");
    assert_eq!(by_b.commands, 0, "b applied a command a had applied");
    let effects = store.range(b"race/effects/", None).await.unwrap().kvs;
    assert_eq!(effects.len(), 3, "one effect per command: {effects:?}");
    assert!(log.pending(p).await.unwrap().is_empty());

    // b's next pass finds nothing left, and its write then fences a out.
    log.append(&entity, b"3").await.unwrap();
    let by_b = log
        .apply_owned(&new, "b", effect(new.token().get()))
        .await
        .unwrap();
    assert_eq!(by_b.commands, 1);
    log.append(&entity, b"4").await.unwrap();
    let by_a = log
        .apply_owned(&old, "a", effect(old.token().get()))
        .await
        .unwrap();
    assert!(by_a.fenced.contains(&p), "{by_a:?}");
    assert_eq!(log.pending(p).await.unwrap().len(), 1);
}

/// A member's remembered progress goes stale when another instance (a
/// process that owned the partition meanwhile) applies a command: the
/// stale member's next transaction fails its progress compare, and the
/// same pass reads the progress afresh and applies the new command, once.
#[tokio::test(flavor = "current_thread")]
async fn remembered_progress_gone_stale_is_read_again() {
    let store = MemoryStore::new();
    let group = Ownership::new(store.clone(), "stale/members/").unwrap();
    let lease = Lease::grant(store.clone(), Duration::from_secs(30))
        .await
        .unwrap();
    group.join("m", &lease).await.unwrap();
    let view = group.view().await.unwrap();
    // Two instances, as in two processes: no progress shared in memory.
    let first = PartitionLog::new(store.clone(), "stale/log/", 1).unwrap();
    let second = PartitionLog::new(store.clone(), "stale/log/", 1).unwrap();
    let effect = |c: &calm::partition::Command| {
        vec![TxnOp::put(
            format!("stale/effects/{}", String::from_utf8_lossy(&c.payload)).as_bytes(),
            b"",
        )]
    };
    for (payload, log) in [(b"1", &first), (b"2", &second), (b"3", &first)] {
        log.append(b"entity", payload).await.unwrap();
        let applied = log.apply_owned(&view, "m", effect).await.unwrap();
        assert_eq!(applied.commands, 1, "command {payload:?}: {applied:?}");
    }
    let effects = store.range(b"stale/effects/", None).await.unwrap().kvs;
    assert_eq!(effects.len(), 3, "{effects:?}");
    assert!(first.pending(0).await.unwrap().is_empty());
    assert_eq!(
        first.progress(0).await.unwrap(),
        second.progress(0).await.unwrap()
    );
}
