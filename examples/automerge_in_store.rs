//! An automerge document kept in a store and edited by several tasks at
//! once with `merge_into`: no lock, every edit present at the end.
//!
//! Each task holds its own replica of the document, edits it, and folds it
//! into the stored copy; conflicting writes to the store are retried by
//! `merge_into`, and automerge's merge keeps every task's changes.
//!
//! Run with `cargo run --example automerge_in_store --features automerge`.

use automerge::transaction::Transactable;
use automerge::{ActorId, ROOT, ReadDoc};
use calm::adapt::automerge::Document;
use calm::store::{MemoryStore, StoreExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    const TASKS: u64 = 8;
    const EDITS: u64 = 25;
    let store = MemoryStore::new();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut mine = Document::new();
                mine.edit(|d| {
                    d.set_actor(ActorId::from(t.to_be_bytes().to_vec()));
                });
                for i in 0..EDITS {
                    mine.edit(|d| d.put(ROOT, format!("task{t}-edit{i}"), i as i64))?;
                    store.merge_into(b"docs/shared", &mine).await?;
                    tokio::task::yield_now().await;
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .collect();
    for t in tasks {
        t.await?.map_err(|e| e.to_string())?;
    }
    let doc: Document = store.read_merged(b"docs/shared").await?.unwrap_or_default();
    let keys = doc.doc().keys(ROOT).count();
    assert_eq!(keys as u64, TASKS * EDITS, "an edit was lost");
    println!(
        "{TASKS} tasks × {EDITS} edits merged into one stored document: {keys} keys, none lost"
    );
    Ok(())
}
