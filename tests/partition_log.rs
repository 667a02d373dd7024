//! `PartitionLog`: a single writer per partition across members that pause
//! and crash, the same test on every backend.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use calm::coord::{Lease, Member, Ownership, View};
use calm::occ::Version;
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
/// Each command takes `pace` (a blocking sleep, as slow work would);
/// `say` hears of each command begun (see [`effect`]), each pass that
/// applied something (`APPLIED <commands> <token>`) and each pass that
/// found a partition fenced by a newer owner (`FENCED <token>`).
async fn member<S: Store + Clone + 'static>(
    store: S,
    prefix: String,
    name: String,
    ttl: Duration,
    stop: Arc<AtomicBool>,
    pace: Duration,
    say: fn(String),
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
            let token = view.token().get();
            match log
                .apply_owned(&view, &name, effect(&effects, token, pace, say))
                .await
            {
                Ok(a) => {
                    if a.commands > 0 {
                        say(format!("APPLIED {} {token}", a.commands));
                    }
                    if !a.fenced.is_empty() {
                        say(format!("FENCED {token}"));
                    }
                }
                Err(LogError::Coord(_)) => {}
                Err(e) => panic!("{name}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The effect of a command: a key of its own (`effects/<entity>/<seq>`)
/// holding the token of the view it was applied under, made after `pace`
/// (told to `say` first, as `APPLYING <token>`, when not zero).
fn effect(
    effects: &str,
    token: u64,
    pace: Duration,
    say: fn(String),
) -> impl FnMut(&calm::partition::Command) -> Vec<TxnOp> {
    let effects = effects.to_owned();
    move |c| {
        if !pace.is_zero() {
            say(format!("APPLYING {token}"));
            std::thread::sleep(pace);
        }
        let mut key = effects.clone().into_bytes();
        key.extend_from_slice(&c.key);
        key.push(b'/');
        key.extend_from_slice(&c.payload);
        vec![TxnOp::put(&key, &token.to_be_bytes())]
    }
}

/// What the producer does to the members mid-stream.
trait Members {
    /// Freezes member `i` (its lease runs out meanwhile) if now is a good
    /// moment, or in any case if `now`; says whether it did.
    async fn pause(&mut self, i: usize, now: bool) -> bool;
    /// Lets frozen member `i` run on, with whatever view it held.
    fn resume(&mut self, i: usize);
    /// Ends member `i` at once, its lease left to expire.
    async fn crash(&mut self, i: usize);
    /// Starts a fresh member `i` under the same name.
    fn restart(&mut self, i: usize);
}

/// How long the paused member stays frozen, in TTLs: well past its lease.
const PAUSE_TTLS: u32 = 3;

/// How long the zombie's effects take: its window between reading the log
/// and writing.
const ZOMBIE_PACE: Duration = Duration::from_millis(2);

/// The entity of the `n`th command.
fn entity(n: usize) -> Vec<u8> {
    format!("account-{}", n % ENTITIES).into_bytes()
}

/// Which members the faults hit, by index among `m0`, `m1`, `m2`
/// (ownership is a fixed hash of the names, so fixed indexes might own
/// nothing): the one paused owns the most entities in `view`; the one that
/// crashes owns the most once the paused one has left, so it is the one
/// that took over the paused one's partitions.
fn victims<S: Store + Clone + 'static>(view: &View, log: &PartitionLog<S>) -> Victims {
    let most = |view: &View| {
        let mut owned = [0usize; 3];
        for n in 0..ENTITIES {
            let partition = log.partition_name(log.partition_of(&entity(n)));
            let owner = view.owner(&partition).expect("a member");
            owned[owner.id[1..].parse::<usize>().expect("a member named m<i>")] += 1;
        }
        (0..3)
            .max_by_key(|&i| (owned[i], std::cmp::Reverse(i)))
            .unwrap_or(0)
    };
    let paused = most(view);
    let rest: Vec<Member> = view
        .members()
        .iter()
        .filter(|m| m.id != format!("m{paused}"))
        .cloned()
        .collect();
    let crashed = most(&View::new(rest, Version::ZERO));
    Victims { paused, crashed }
}

/// The members the faults hit.
#[derive(Clone, Copy)]
struct Victims {
    paused: usize,
    crashed: usize,
}

/// Appends [`PER_ENTITY`] commands for each of [`ENTITIES`] entities, one
/// entity after another, while one member is paused for [`PAUSE_TTLS`]
/// TTL (from the 60th command, or as soon after as it is a good moment)
/// and another crashes (at the 120th, at least 1.5 TTL into the pause)
/// and comes back (at the 200th); returns each entity's commands'
/// revisions.
async fn produce<S: Store + Clone + 'static>(
    log: &PartitionLog<S>,
    ttl: Duration,
    members: &mut impl Members,
    victims: Victims,
) -> HashMap<Vec<u8>, Vec<u64>> {
    let mut appended: HashMap<Vec<u8>, Vec<u64>> = HashMap::new();
    let mut paused = None;
    for n in 0..ENTITIES * PER_ENTITY {
        let entity = entity(n);
        let seq = (n / ENTITIES) as u64;
        let revision = log
            .append(&entity, format!("{seq:04}").as_bytes())
            .await
            .unwrap();
        appended.entry(entity).or_default().push(revision.get());
        if (60..120).contains(&n)
            && paused.is_none()
            && members.pause(victims.paused, n == 119).await
        {
            paused = Some(Instant::now());
        }
        let paused_at = paused.unwrap_or_else(Instant::now);
        match n {
            120 => {
                // By now the paused member's lease is gone and the crashed
                // one has taken over its partitions.
                tokio::time::sleep_until((paused_at + ttl * 3 / 2).into()).await;
                members.crash(victims.crashed).await;
            }
            200 => {
                tokio::time::sleep_until((paused_at + ttl * PAUSE_TTLS).into()).await;
                members.resume(victims.paused);
                members.restart(victims.crashed);
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
    appended
}

/// Waits until no partition has a command waiting.
async fn drained<S: Store + Clone + 'static>(log: &PartitionLog<S>, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let mut waiting = 0;
        for p in 0..log.partitions() {
            waiting += log.pending(p).await.unwrap().len();
        }
        if waiting == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{waiting} commands still waiting"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every command of `appended` was applied exactly once, each entity's in
/// the order they were appended; in each partition the applying tokens
/// never went down in commit order (a stale owner's effect never landed
/// after a newer owner's); each partition's recorded progress is its last
/// command's revision.
async fn applied_once_in_order<S: Store + Clone + 'static>(
    store: &S,
    prefix: &str,
    log: &PartitionLog<S>,
    appended: &HashMap<Vec<u8>, Vec<u64>>,
) {
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
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    for (entity, revisions) in appended {
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

/// Three member tasks of this process, each on its own instrumented
/// connection: a pause holds its in-flight calls, then releases them.
struct Tasks<S: Store + Clone + 'static> {
    conns: Vec<InstrumentedStore<S>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    prefix: String,
    ttl: Duration,
    stop: Arc<AtomicBool>,
}

impl<S: Store + Clone + 'static> Tasks<S> {
    fn spawn(&self, i: usize) -> tokio::task::JoinHandle<()> {
        tokio::spawn(member(
            self.conns[i].clone(),
            self.prefix.clone(),
            format!("m{i}"),
            self.ttl,
            Arc::clone(&self.stop),
            Duration::ZERO,
            |_| {},
        ))
    }
}

impl<S: Store + Clone + 'static> Members for Tasks<S> {
    async fn pause(&mut self, i: usize, _now: bool) -> bool {
        self.conns[i].pause();
        true
    }

    fn resume(&mut self, i: usize) {
        self.conns[i].resume();
    }

    async fn crash(&mut self, i: usize) {
        self.tasks[i].abort();
        let _ = (&mut self.tasks[i]).await;
    }

    fn restart(&mut self, i: usize) {
        self.tasks[i] = self.spawn(i);
    }
}

/// Three members apply a stream of commands for ten entities while one is
/// paused past its lease (its in-flight calls held, then released with a
/// stale view) and another crashes (its task aborted, its lease left to
/// expire) and comes back, and a zombie keeps applying as the paused
/// member with the first view (an owner that paused holding it: two
/// members then believe they own the same partitions). Afterwards every command was
/// applied exactly once, in each entity's order, and no stale owner's
/// effect landed after a newer owner's ([`applied_once_in_order`]).
pub(crate) async fn single_writer_under_pauses_and_crashes<S: Store + Clone + 'static>(
    store: S,
    prefix: &str,
    ttl: Duration,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut members = Tasks {
        conns: (0..3)
            .map(|_| InstrumentedStore::new(store.clone()))
            .collect(),
        tasks: Vec::new(),
        prefix: prefix.to_owned(),
        ttl,
        stop: Arc::clone(&stop),
    };
    members.tasks = (0..3).map(|i| members.spawn(i)).collect();

    let log = PartitionLog::new(store.clone(), format!("{prefix}log/"), 8).unwrap();
    let group = Ownership::new(store.clone(), format!("{prefix}members/")).unwrap();
    let first_view = joined(&group, 3, ttl * 20).await;
    let victims = victims(&first_view, &log);
    let zombie = {
        let (log, stop) = (log.clone(), Arc::clone(&stop));
        let effects = format!("{prefix}effects/");
        tokio::spawn(async move {
            let mut applied = 0;
            while !stop.load(Ordering::Relaxed) {
                // A pause between reading the log and writing: the window
                // in which the partition's other owner moves on.
                let handler = effect(&effects, first_view.token().get(), ZOMBIE_PACE, |_| {});
                let name = format!("m{}", victims.paused);
                if let Ok(a) = log.apply_owned(&first_view, &name, handler).await {
                    applied += a.commands;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            applied
        })
    };
    let appended = produce(&log, ttl, &mut members, victims).await;
    drained(&log, ttl * 30).await;
    stop.store(true, Ordering::Relaxed);
    for m in &members.tasks {
        m.abort();
    }
    let zombie_applied = zombie.await.unwrap();
    eprintln!("partition log: the zombie applied {zombie_applied} commands before it was fenced");
    applied_once_in_order(&store, prefix, &log, &appended).await;
}

/// The group's view once it has `members` members.
async fn joined<S: Store + Clone + 'static>(
    group: &Ownership<S>,
    members: usize,
    within: Duration,
) -> calm::coord::View {
    let deadline = Instant::now() + within;
    loop {
        let view = group.view().await.unwrap();
        if view.members().len() == members {
            return view;
        }
        assert!(Instant::now() < deadline, "the members never joined");
        tokio::time::sleep(Duration::from_millis(20)).await;
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

/// The partition log's members as OS processes over a real server: the
/// stream, the faults and the checks of
/// [`single_writer_under_pauses_and_crashes`](super::single_writer_under_pauses_and_crashes),
/// with one member frozen by SIGSTOP and another killed by SIGKILL.
#[cfg(any(feature = "postgres", feature = "etcd"))]
pub(crate) mod processes {
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use calm::coord::Ownership;
    use calm::partition::PartitionLog;
    use calm::testing::servers::{Signal, send_signal};

    use crate::backends::Backend;
    use crate::faults::child_config;
    use crate::server_faults::Kill;

    /// The namespace (on PostgreSQL, the schema) of the members and the test.
    const NAMESPACE: &str = "partitions_p";

    /// How long a member process's effect takes: long enough for the
    /// SIGSTOP sent when it says it began one to land inside it.
    const PACE: Duration = Duration::from_millis(5);

    /// Lines the members printed, each with its member's index.
    type Lines = Arc<Mutex<Vec<(usize, String)>>>;

    /// Member `i`: this test binary run again with `CALM_PARTITION_MEMBER`
    /// set to `config|m<i>`, its lines collected.
    fn spawn_member(config: &str, i: usize, lines: &Lines) -> Child {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "--nocapture",
                "partition_log::processes::member_process",
            ])
            .env("CALM_PARTITION_MEMBER", format!("{config}|m{i}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let lines = Arc::clone(lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                lines.lock().unwrap().push((i, line));
            }
        });
        child
    }

    /// Three member processes.
    struct Processes {
        children: Kill,
        config: String,
        lines: Lines,
    }

    impl super::Members for Processes {
        /// Freezes member `i` in the middle of a command (so that it
        /// resumes holding a stale view): if it begins one within 50 ms
        /// (else the producer appends more and asks again), or at once if
        /// `now`.
        async fn pause(&mut self, i: usize, now: bool) -> bool {
            let seen = self.lines.lock().unwrap().len();
            let deadline = Instant::now() + Duration::from_millis(50);
            let mut started = now;
            while !started && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
                started = self.lines.lock().unwrap()[seen..]
                    .iter()
                    .any(|(m, l)| *m == i && l.starts_with("APPLYING "));
            }
            if started {
                send_signal(self.children.0[i].id(), Signal::Stop).unwrap();
            }
            started
        }

        fn resume(&mut self, i: usize) {
            send_signal(self.children.0[i].id(), Signal::Cont).unwrap();
        }

        async fn crash(&mut self, i: usize) {
            // SIGKILL: no destructor runs, the lease is left to expire.
            self.children.0[i].kill().unwrap();
            self.children.0[i].wait().unwrap();
        }

        fn restart(&mut self, i: usize) {
            self.children.0[i] = spawn_member(&self.config, i, &self.lines);
        }
    }

    /// Three member processes apply the stream while one is frozen
    /// (SIGSTOP) for three TTLs and another is killed (SIGKILL) and
    /// started again: every command applied exactly once, in each
    /// entity's order, and no stale owner's effect after a newer owner's.
    pub(crate) async fn single_writer_across_processes<B: Backend>(server: &B, prefix: &str) {
        let ttl = B::TTL;
        // Created before the members race to create it.
        let store = server.store(NAMESPACE).await;
        let config = format!(
            "{}|{}|{prefix}|{}",
            B::NAME,
            server.target(),
            ttl.as_millis()
        );
        let lines = Lines::default();
        let mut members = Processes {
            children: Kill((0..3).map(|i| spawn_member(&config, i, &lines)).collect()),
            config,
            lines: Arc::clone(&lines),
        };
        let log = PartitionLog::new(store.clone(), format!("{prefix}log/"), 8).unwrap();
        let group = Ownership::new(store.clone(), format!("{prefix}members/")).unwrap();
        let view = super::joined(&group, 3, Duration::from_secs(60)).await;
        let victims = super::victims(&view, &log);
        let appended = super::produce(&log, ttl, &mut members, victims).await;
        super::drained(&log, ttl * 30).await;
        drop(members);
        let lines = lines.lock().unwrap().clone();
        // Per member: commands applied, passes that applied some, passes
        // refused by a newer owner's fence.
        let mut said = [(0usize, 0usize, 0usize); 3];
        for (m, line) in &lines {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("APPLIED") => {
                    said[*m].0 += words.next().and_then(|n| n.parse().ok()).unwrap_or(0);
                    said[*m].1 += 1;
                }
                Some("FENCED") => said[*m].2 += 1,
                _ => {}
            }
        }
        for (i, (applied, passes, fenced)) in said.iter().enumerate() {
            let fault = if i == victims.paused {
                ", frozen"
            } else if i == victims.crashed {
                ", killed"
            } else {
                ""
            };
            eprintln!(
                "{} member m{i}{fault}: applied {applied} commands in {passes} passes, fenced in {fenced} passes",
                B::NAME
            );
        }
        super::applied_once_in_order(&store, prefix, &log, &appended).await;
        // Frozen in the middle of a command, it resumed with a stale view:
        // the partition's newer owner had raised the fence meanwhile.
        assert!(
            said[victims.paused].2 > 0,
            "the frozen member was never refused a stale write"
        );
    }

    /// The entry point of the member processes: does nothing unless
    /// `CALM_PARTITION_MEMBER` is set (`backend|target|prefix|ttl_ms|name`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "entry point of the partition log's member processes"]
    async fn member_process() {
        let Some([backend, target, prefix, ttl_ms, name]) = child_config("CALM_PARTITION_MEMBER")
        else {
            return;
        };
        let ttl = Duration::from_millis(ttl_ms.parse().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let say: fn(String) = |line| println!("{line}");
        match backend.as_str() {
            #[cfg(feature = "postgres")]
            "postgres" => {
                use calm::testing::servers::PostgresServer;
                let store = <PostgresServer as Backend>::store_at(&target, NAMESPACE).await;
                super::member(store, prefix, name, ttl, stop, PACE, say).await;
            }
            #[cfg(feature = "etcd")]
            "etcd" => {
                use calm::testing::servers::EtcdServer;
                let store = <EtcdServer as Backend>::store_at(&target, NAMESPACE).await;
                super::member(store, prefix, name, ttl, stop, PACE, say).await;
            }
            other => panic!("unknown backend {other}"),
        }
    }
}
