//! The raw PostgreSQL side: one `tokio-postgres` connection per task with
//! prepared statements on a plain table, and a bare `LISTEN`/`NOTIFY` pair.

use std::time::Instant;

use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls, Statement};

use super::load::{CONTENDED_KEY, VALUE, arrival, keys};
use super::{Op, Probe, Stamps, Worker};

/// The raw table: a key, its value and a version bumped by every write.
const TABLE: &str = "CREATE TABLE IF NOT EXISTS raw_kv \
    (key bytea PRIMARY KEY, value bytea NOT NULL, version bigint NOT NULL)";
const GET: &str = "SELECT value, version FROM raw_kv WHERE key = $1";
const PUT: &str = "INSERT INTO raw_kv (key, value, version) VALUES ($1, $2, 1) \
    ON CONFLICT (key) DO UPDATE SET value = $2, version = raw_kv.version + 1 \
    RETURNING version";
const CAS: &str = "UPDATE raw_kv SET value = $2, version = version + 1 \
    WHERE key = $1 AND version = $3 RETURNING version";
/// The channel of the bare `LISTEN`/`NOTIFY` pair.
const CHANNEL: &str = "bench_raw_watch";

/// Opens a connection whose driver runs on the current runtime.
async fn open(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// One task's own connection, its prepared statements and its keys.
pub(crate) struct RawWorker {
    client: Client,
    get: Statement,
    put: Statement,
    cas: Statement,
    /// The task's own keys.
    keys: Vec<Vec<u8>>,
    /// `versions[i]` is `keys[i]`'s version after this task's last write.
    versions: Vec<i64>,
    /// The next key to use, cycling.
    next: usize,
    /// The value written.
    value: Vec<u8>,
}

impl RawWorker {
    /// `tasks` workers, each on its own connection; creates the table.
    pub(crate) fn many(rt: &Runtime, url: &str, tasks: usize) -> Vec<Self> {
        rt.block_on(async {
            open(url)
                .await
                .expect("raw connection")
                .batch_execute(TABLE)
                .await
                .expect("raw table");
            let mut workers = Vec::with_capacity(tasks);
            for task in 0..tasks {
                let client = open(url).await.expect("raw connection");
                let prepare = async |sql| client.prepare(sql).await.expect("prepare");
                let (get, put, cas) = (prepare(GET).await, prepare(PUT).await, prepare(CAS).await);
                workers.push(Self {
                    client,
                    get,
                    put,
                    cas,
                    keys: keys(task),
                    versions: vec![0; keys(task).len()],
                    next: 0,
                    value: vec![7; VALUE],
                });
            }
            workers
        })
    }

    async fn upsert(&self, key: &[u8]) -> i64 {
        let row = self.client.query_one(&self.put, &[&key, &self.value]).await;
        row.expect("raw put").get(0)
    }
}

impl Worker for RawWorker {
    async fn preload(&mut self) {
        for i in 0..self.keys.len() {
            self.versions[i] = self.upsert(&self.keys[i]).await;
        }
        self.upsert(CONTENDED_KEY).await;
    }

    async fn run(&mut self, op: Op) -> bool {
        let i = self.next;
        self.next = (i + 1) % self.keys.len();
        let key = self.keys[i].as_slice();
        match op {
            Op::Get => {
                let row = self.client.query_one(&self.get, &[&key]).await;
                let row = row.expect("raw get");
                let version: i64 = row.get(1);
                assert_eq!(version, self.versions[i], "raw get: stale read");
                std::hint::black_box(row.get::<_, &[u8]>(0));
            }
            Op::Put => self.versions[i] = self.upsert(key).await,
            Op::Cas => {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                    [&key, &self.value, &self.versions[i]];
                let row = self.client.query_opt(&self.cas, &params).await;
                let row = row.expect("raw compare-and-set");
                let row = row.expect("raw compare-and-set lost on a key only one task writes");
                self.versions[i] = row.get(0);
            }
            Op::ContendedCas => {
                let read = self.client.query_one(&self.get, &[&CONTENDED_KEY]).await;
                let version: i64 = read.expect("raw get").get(1);
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                    [&CONTENDED_KEY, &self.value, &version];
                let row = self.client.query_opt(&self.cas, &params).await;
                return row.expect("raw contended compare-and-set").is_some();
            }
        }
        true
    }
}

/// A bare `LISTEN` connection whose notifications a task stamps on
/// arrival, and another connection that sends `pg_notify`.
pub(crate) struct RawProbe {
    /// Sends the notifications.
    notifier: Client,
    /// `SELECT pg_notify(channel, payload)`, prepared.
    notify: Statement,
    /// Keeps the listening connection open.
    _listener: Client,
    /// Arrival instant and payload of each notification.
    events: mpsc::UnboundedReceiver<(Instant, String)>,
    /// The listener's driver, aborted on drop.
    driver: tokio::task::JoinHandle<()>,
    /// The payload of the next notification, so each arrival is matched
    /// to its send.
    count: u64,
}

impl RawProbe {
    /// Connects both sides and starts listening.
    pub(crate) fn start(rt: &Runtime, url: &str) -> Self {
        rt.block_on(async {
            let (listener, mut conn) = tokio_postgres::connect(url, NoTls)
                .await
                .expect("raw listen connection");
            let (tx, events) = mpsc::unbounded_channel();
            // The connection is driven by hand so its notifications can be
            // stamped the moment they are read.
            let driver = tokio::spawn(async move {
                while let Some(Ok(msg)) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                    if let AsyncMessage::Notification(n) = msg
                        && tx.send((Instant::now(), n.payload().to_owned())).is_err()
                    {
                        break;
                    }
                }
            });
            listener
                .batch_execute(&format!("LISTEN {CHANNEL}"))
                .await
                .expect("LISTEN");
            let notifier = open(url).await.expect("raw notify connection");
            let notify = notifier
                .prepare("SELECT pg_notify($1, $2)")
                .await
                .expect("prepare");
            Self {
                notifier,
                notify,
                _listener: listener,
                events,
                driver,
                count: 0,
            }
        })
    }
}

impl Drop for RawProbe {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Probe for RawProbe {
    async fn sample(&mut self) -> Stamps {
        self.count += 1;
        let payload = self.count.to_string();
        let call = Instant::now();
        self.notifier
            .execute(&self.notify, &[&CHANNEL, &payload])
            .await
            .expect("pg_notify");
        let ack = Instant::now();
        let (arrived, seen) = arrival(&mut self.events).await;
        assert_eq!(seen, payload, "raw LISTEN: not the notification sent");
        Stamps { call, ack, arrived }
    }
}
