//! calm on a three-member etcd cluster, every member a process the test
//! starts: the conformance suite and the recipes; a history of 16 clients
//! that stays linearizable while the raft leader is frozen, then killed
//! and restarted, and a follower is killed; and an `Election` that fails
//! over within 1.5 TTL of its leader process freezing, the frozen leader's
//! late writes all refused by the fence.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use calm::backend::etcd::EtcdStore;

use calm::testing::conformance::{check_history, record_history};
use calm::testing::linearizability::KvOutput;
use calm::testing::servers::{EtcdCluster, EtcdServer, ServerError, Signal, skip_or_fail};

use crate::backends::Backend;

/// The cluster as a backend of the shared suite: a client balances over
/// every member; a kill is the raft leader's.
impl Backend for EtcdCluster {
    type Store = EtcdStore;
    const NAME: &'static str = "etcd cluster";
    const TTL: Duration = Duration::from_secs(2);

    fn start() -> Result<Self, ServerError> {
        EtcdCluster::start(3)
    }

    fn target(&self) -> String {
        self.endpoints().join(",")
    }

    async fn store_at(target: &str, namespace: &str) -> EtcdStore {
        EtcdServer::store_at(target, namespace).await
    }

    fn is_ours(&self) -> bool {
        true
    }

    fn kill(&mut self) {
        if let Ok(leader) = self.wait_for_leader(Duration::from_secs(20)) {
            EtcdCluster::kill(self, leader);
        }
    }

    fn restart(&mut self) {
        for i in 0..self.len() {
            if self.process(i).is_none() {
                EtcdCluster::restart(self, i).unwrap();
            }
        }
    }
}

/// A fresh three-member cluster, or a loud skip.
fn cluster() -> Option<EtcdCluster> {
    skip_or_fail(<EtcdCluster as Backend>::start())
}

/// Runs blocking cluster control off the async workers.
fn control<T>(cluster: &Mutex<EtcdCluster>, f: impl FnOnce(&mut EtcdCluster) -> T) -> T {
    tokio::task::block_in_place(|| f(&mut cluster.lock().unwrap()))
}

/// The conformance suite and the recipes, through a client that balances
/// over the three members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_and_recipes() {
    let Some(cluster) = cluster() else {
        return;
    };
    crate::backends::run_conformance(&cluster, EtcdCluster::NAME).await;
    let store = cluster.store("recipes").await;
    crate::faults::recipes(store, "recipes/", EtcdCluster::TTL).await;
}

/// 16 clients record a history on 16 keys for twelve seconds while the
/// raft leader is frozen for two seconds, the next leader is killed and
/// restarted, and then a follower is killed and restarted. The history
/// must be linearizable (writes whose answer was lost count as either
/// applied or not), and the cluster must serve the same client after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_through_leader_and_follower_faults() {
    let Some(cluster) = cluster() else {
        return;
    };
    let store = cluster.store("lin").await;
    let cluster = Mutex::new(cluster);
    let keys = (0..16).map(|i| format!("lin/{i}").into_bytes()).collect();
    let until = Instant::now() + Duration::from_secs(12);
    let recording = tokio::spawn(record_history(
        store.clone(),
        keys,
        16,
        usize::MAX,
        Some(until),
    ));
    let sleep = |s: u64| tokio::time::sleep(Duration::from_secs(s));
    let leader = |c: &mut EtcdCluster| c.wait_for_leader(Duration::from_secs(20)).unwrap();

    sleep(1).await;
    let frozen = control(&cluster, leader);
    control(&cluster, |c| c.signal(frozen, Signal::Stop).unwrap());
    // The other two elect a leader among themselves meanwhile.
    sleep(2).await;
    let next = control(&cluster, leader);
    assert_ne!(next, frozen, "the frozen member is still reported leader");
    control(&cluster, |c| c.signal(frozen, Signal::Cont).unwrap());
    sleep(1).await;

    let killed = control(&cluster, leader);
    control(&cluster, |c| c.kill(killed));
    sleep(2).await;
    control(&cluster, |c| c.restart(killed).unwrap());
    sleep(1).await;

    let current = control(&cluster, leader);
    let follower = (0..3).find(|&i| i != current).unwrap();
    control(&cluster, |c| c.kill(follower));
    sleep(2).await;
    control(&cluster, |c| c.restart(follower).unwrap());
    eprintln!(
        "etcd cluster: froze leader m{frozen}, killed leader m{killed}, killed follower m{follower}"
    );

    let history = recording.await.unwrap().unwrap();
    let unknown = history
        .iter()
        .filter(|o| o.output == KvOutput::Unknown)
        .count();
    eprintln!(
        "etcd cluster, 16 clients: {} operations, {unknown} with unknown outcome",
        history.len()
    );
    assert!(
        history.len() > 160,
        "too few operations completed: {}",
        history.len()
    );
    check_history(&history).unwrap();
    crate::server_faults::recovers(&store, b"after").await;
}

/// Two candidate processes campaign through the whole cluster; the leader
/// process is frozen for 3 and for 8 TTL (`CALM_FAULT_ROUNDS` rounds
/// each): the other's first fenced write comes within 1.5 TTL of the stop
/// in every round, and no write of the frozen one commits after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_fails_over_within_1_5_ttl() {
    let Some(cluster) = cluster() else {
        return;
    };
    let target = cluster.target();
    let failovers = tokio::task::spawn_blocking(move || {
        crate::server_faults::election_failover(
            "etcd",
            &target,
            "e/",
            EtcdCluster::TTL,
            &[3, 8],
            crate::server_faults::fault_rounds(),
        )
    })
    .await
    .unwrap();
    let worst = failovers.iter().cloned().fold(0.0, f64::max);
    eprintln!("etcd cluster failovers (TTL): {failovers:.2?}, worst {worst:.2}");
    drop(cluster);
}
