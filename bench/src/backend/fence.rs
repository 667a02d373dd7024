//! What fencing a write costs in the user's own PostgreSQL transaction:
//! `PgFence::begin; UPDATE; commit` (the admission sent with `COMMIT`,
//! one message) against `BEGIN; UPDATE; COMMIT` on the same server, each
//! task on its own connection and its own account row, with fence names
//! of their own or one shared name. Two rows at 1 writer show the
//! admission as its own statement instead (`BEGIN; PgFence::admit;
//! UPDATE; COMMIT`), awaited first and pipelined with the update.

use calm::backend::postgres::PgFence;
use calm::coord::FencingToken;
use tokio::runtime::Runtime;
use tokio_postgres::{Client, NoTls, Statement};

use super::load::interleaved;
use super::{Op, Worker};
use crate::harness::{Row, throughput_row_of};

/// The tables: one account row per task, and the fence table.
const SETUP: &str = "CREATE TABLE IF NOT EXISTS fence_accounts \
    (id int PRIMARY KEY, balance bigint NOT NULL)";
/// The user's write, the same on both sides.
const UPDATE: &str = "UPDATE fence_accounts SET balance = balance + 1 WHERE id = $1";
/// Concurrent writers of the rows.
const WRITERS: [usize; 3] = [1, 4, 16];

/// One task's connection and account, fenced or not.
pub(crate) struct AccountWriter {
    client: Client,
    update: Statement,
    account: i32,
    /// The fence and the name it admits on, or `None` for the unfenced
    /// side.
    fence: Option<(PgFence, String)>,
    /// Where the admission goes.
    admission: Admission,
}

/// Where a fenced transaction admits its token.
#[derive(Clone, Copy, PartialEq)]
enum Admission {
    /// `PgFence::begin`: sent with `COMMIT`.
    AtCommit,
    /// `PgFence::admit`, pipelined with the update (both sent, then both
    /// awaited).
    Pipelined,
    /// `PgFence::admit`, awaited before the update.
    Awaited,
}

impl AccountWriter {
    /// `tasks` writers, on accounts 0.., fenced on `name(task)` if given.
    fn many(
        rt: &Runtime,
        url: &str,
        tasks: usize,
        name: Option<&dyn Fn(usize) -> String>,
        admission: Admission,
    ) -> Vec<Self> {
        rt.block_on(async {
            let mut out = Vec::with_capacity(tasks);
            for task in 0..tasks {
                let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
                tokio::spawn(conn);
                let account = i32::try_from(task).expect("few tasks");
                client
                    .execute(
                        "INSERT INTO fence_accounts VALUES ($1, 0) ON CONFLICT DO NOTHING",
                        &[&account],
                    )
                    .await
                    .expect("account row");
                let update = client.prepare(UPDATE).await.expect("prepare");
                let fence = name.map(|n| (PgFence::new("calm_bench").expect("schema"), n(task)));
                out.push(Self {
                    client,
                    update,
                    account,
                    fence,
                    admission,
                });
            }
            out
        })
    }
}

impl Worker for AccountWriter {
    async fn preload(&mut self) {}

    async fn run(&mut self, _op: Op) -> bool {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&self.account];
        let token = FencingToken::new(1);
        let Some((fence, name)) = &self.fence else {
            let tx = self.client.transaction().await.expect("begin");
            tx.execute(&self.update, &params).await.expect("update");
            tx.commit().await.expect("commit");
            return true;
        };
        if self.admission == Admission::AtCommit {
            let tx = fence
                .begin(&mut self.client, name, token)
                .await
                .expect("begin");
            tx.execute(&self.update, &params).await.expect("update");
            tx.commit()
                .await
                .expect("one holder's token is always admitted");
            return true;
        }
        let tx = self.client.transaction().await.expect("begin");
        let update = tx.execute(&self.update, &params);
        let admit = fence.admit(&tx, name, token);
        if self.admission == Admission::Pipelined {
            let (admitted, updated) = tokio::join!(admit, update);
            admitted.expect("one holder's token is always admitted");
            updated.expect("update");
        } else {
            admit.await.expect("one holder's token is always admitted");
            update.await.expect("update");
        }
        tx.commit().await.expect("commit");
        true
    }
}

/// The fenced transaction against the unfenced one, at 1, 4 and 16
/// writers, with distinct fence names and with one shared name.
pub(crate) fn rows(rt: &Runtime, url: &str) -> Vec<Row> {
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
        tokio::spawn(conn);
        client.batch_execute(SETUP).await.expect("accounts table");
        let fence = PgFence::new("calm_bench").expect("schema");
        fence.migrate(&client).await.expect("fence table");
    });
    let max = WRITERS[WRITERS.len() - 1];
    let mut rows = Vec::new();
    let distinct = |task: usize| format!("account-{task}");
    let shared = |_: usize| "accounts".to_owned();
    let names: [(&str, &dyn Fn(usize) -> String); 2] = [
        ("own fence names", &distinct),
        ("one shared fence name", &shared),
    ];
    for (label, name) in names {
        let mut fenced = AccountWriter::many(rt, url, max, Some(name), Admission::AtCommit);
        let mut plain = AccountWriter::many(rt, url, max, None, Admission::AtCommit);
        if label == "own fence names" {
            // The admission as a statement of its own, at one writer.
            for (admission, how) in [
                (Admission::Awaited, "awaited first"),
                (Admission::Pipelined, "pipelined with the update"),
            ] {
                let mut other = AccountWriter::many(rt, url, 1, Some(name), admission);
                let (a, b) = interleaved(rt, &mut other, &mut plain, 1, Op::Put);
                rows.push(throughput_row_of(
                    "PostgreSQL, the user's table",
                    format!("fenced UPDATE transaction, PgFence::admit {how}, 1 writer"),
                    "the same transaction unfenced",
                    a,
                    b,
                ));
            }
        }
        for tasks in WRITERS {
            let (a, b) = interleaved(rt, &mut fenced, &mut plain, tasks, Op::Put);
            eprintln!(
                "backend: fenced UPDATE × {tasks} ({label}): {:.0}/s, unfenced {:.0}/s",
                a.rate, b.rate
            );
            let plural = if tasks == 1 { "" } else { "s" };
            rows.push(throughput_row_of(
                "PostgreSQL, the user's table",
                format!(
                    "fenced UPDATE transaction (PgFence::begin), {tasks} writer{plural}, {label}"
                ),
                "the same transaction unfenced",
                a,
                b,
            ));
        }
    }
    rows
}
