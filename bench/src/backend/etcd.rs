//! The raw etcd side: bare `etcd-client` calls on one shared client.

use std::time::Instant;

use etcd_client::{Client, Compare, CompareOp, KvClient, Txn, TxnOp};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use super::load::{CONTENDED_KEY, VALUE, WATCH_KEY, arrival, keys};
use super::{Op, Probe, Stamps, Worker};

/// The raw side's name for `key`: calm's store and the raw client share
/// the server's one keyspace, so the raw keys live under `raw/`.
fn raw(key: &[u8]) -> Vec<u8> {
    [b"raw/", key].concat()
}

/// The revision in a response header (etcd always sends one).
fn revision(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.expect("an etcd response header").revision()
}

/// One task's handle on the shared client, and its keys.
pub(crate) struct RawWorker {
    /// A clone of the shared client's KV service (same channel).
    kv: KvClient,
    /// The task's own keys.
    keys: Vec<Vec<u8>>,
    /// `versions[i]` is `keys[i]`'s `mod_revision` after this task's last
    /// write.
    versions: Vec<i64>,
    /// The next key to use, cycling.
    next: usize,
    /// The value written.
    value: Vec<u8>,
}

impl RawWorker {
    /// `tasks` workers sharing `client`.
    pub(crate) fn many(client: &Client, tasks: usize) -> Vec<Self> {
        (0..tasks)
            .map(|task| Self {
                kv: client.kv_client(),
                keys: keys(task).iter().map(|k| raw(k)).collect(),
                versions: vec![0; keys(task).len()],
                next: 0,
                value: vec![7; VALUE],
            })
            .collect()
    }

    /// A put; returns the key's new `mod_revision`.
    async fn put(&mut self, key: Vec<u8>) -> i64 {
        let resp = self.kv.put(key, self.value.clone(), None).await;
        revision(resp.expect("raw put").header())
    }

    /// A put of `key` if its `mod_revision` is `expected`; returns the new
    /// one, or `None` if the compare failed.
    async fn cas(&mut self, key: Vec<u8>, expected: i64) -> Option<i64> {
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                expected,
            )])
            .and_then([TxnOp::put(key, self.value.clone(), None)]);
        let resp = self.kv.txn(txn).await.expect("raw compare-and-set");
        resp.succeeded().then(|| revision(resp.header()))
    }

    /// The `mod_revision` of a key that exists.
    async fn version(&mut self, key: Vec<u8>) -> i64 {
        let resp = self.kv.get(key, None).await.expect("raw get");
        let kv = resp.kvs().first().expect("a preloaded key");
        std::hint::black_box(kv.value());
        kv.mod_revision()
    }
}

impl Worker for RawWorker {
    async fn preload(&mut self) {
        for i in 0..self.keys.len() {
            self.versions[i] = self.put(self.keys[i].clone()).await;
        }
        self.put(raw(CONTENDED_KEY)).await;
    }

    async fn run(&mut self, op: Op) -> bool {
        let i = self.next;
        self.next = (i + 1) % self.keys.len();
        let key = self.keys[i].clone();
        match op {
            Op::Get => {
                let version = self.version(key).await;
                assert_eq!(version, self.versions[i], "raw get: stale read");
            }
            Op::Put => self.versions[i] = self.put(key).await,
            Op::Cas => {
                let new = self.cas(key, self.versions[i]).await;
                self.versions[i] =
                    new.expect("raw compare-and-set lost on a key only one task writes");
            }
            Op::ContendedCas => {
                let version = self.version(raw(CONTENDED_KEY)).await;
                return self.cas(raw(CONTENDED_KEY), version).await.is_some();
            }
        }
        true
    }
}

/// An `etcd-client` watch whose events a task stamps on arrival, and puts
/// through the same client.
pub(crate) struct RawProbe {
    /// Writes the watched key.
    kv: KvClient,
    /// Arrival instant and `mod_revision` of each event.
    events: mpsc::UnboundedReceiver<(Instant, i64)>,
    /// The task reading the watch stream, aborted on drop.
    reader: tokio::task::JoinHandle<()>,
}

impl RawProbe {
    /// Starts the watch and waits until etcd has created it.
    pub(crate) fn start(rt: &Runtime, client: &Client) -> Self {
        rt.block_on(async {
            let mut stream = client
                .clone()
                .watch(raw(WATCH_KEY), None)
                .await
                .expect("raw watch");
            // The first response confirms the watch; only then are later
            // puts sure to be seen.
            let created = stream.message().await.expect("raw watch created");
            assert!(
                created.is_some_and(|r| r.created()),
                "raw watch not created"
            );
            let (tx, events) = mpsc::unbounded_channel();
            let reader = tokio::spawn(async move {
                while let Ok(Some(resp)) = stream.message().await {
                    let now = Instant::now();
                    for event in resp.events() {
                        let rev = event.kv().map_or(0, |kv| kv.mod_revision());
                        if tx.send((now, rev)).is_err() {
                            return;
                        }
                    }
                }
            });
            Self {
                kv: client.kv_client(),
                events,
                reader,
            }
        })
    }
}

impl Drop for RawProbe {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Probe for RawProbe {
    async fn sample(&mut self) -> Stamps {
        let call = Instant::now();
        let resp = self.kv.put(raw(WATCH_KEY), vec![7; VALUE], None).await;
        let rev = revision(resp.expect("raw watched put").header());
        let ack = Instant::now();
        let (arrived, seen) = arrival(&mut self.events).await;
        assert_eq!(seen, rev, "raw watch: not the event of the put");
        Stamps { call, ack, arrived }
    }
}
