//! Concurrent histories, recorded and checked for linearizability.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::linearizability::{self, KvInput, KvOutput, Operation, Verdict};
use super::{Case, CheckResult};
use crate::occ::Version;
use crate::store::{Expect, PutOptions, Store, StoreError, WriteOutcome};

/// Concurrent clients issue random reads, writes, compare-and-sets,
/// creates and deletes on three keys; the recorded history must be
/// linearizable.
pub async fn linearizable<S: Store + Clone + 'static>(c: &Case<S>) -> CheckResult {
    let keys = (0..3).map(|i| c.key(&format!("lin/{i}"))).collect();
    let history = record_history(c.store.clone(), keys, 8, c.ops_per_client, None).await?;
    check_history(&history)
}

/// Checks a history recorded by [`record_history`] with a one-minute
/// deadline; a timeout is a failure too.
///
/// # Errors
///
/// The violating key's operations (the first 40), or the timeout.
pub fn check_history(history: &[Operation]) -> CheckResult {
    match linearizability::check(history, Duration::from_secs(60)) {
        Verdict::Linearizable => Ok(()),
        Verdict::Unknown => Err(format!("checker timed out on {} operations", history.len())),
        Verdict::Violation { key, operations } => Err(format!(
            "history of key {key} is not linearizable ({} operations): {:?}",
            operations.len(),
            &operations[..operations.len().min(40)]
        )),
    }
}

/// Records the history of `clients` concurrent clients issuing random
/// reads, writes, compare-and-sets, creates and deletes on `keys`, each
/// until it has completed `ops_per_client` operations or `until` passes.
///
/// Built to run while a fault is injected: a write that fails with
/// [`StoreError::Indeterminate`] is recorded with an
/// [`Unknown`](KvOutput::Unknown) outcome (it may or may not have applied),
/// and an operation that fails with [`StoreError::Unavailable`] is left
/// out (nothing was applied) after a short pause.
///
/// # Errors
///
/// Any other store error, or a client that panicked.
pub async fn record_history<S: Store + Clone + 'static>(
    store: S,
    keys: Vec<Vec<u8>>,
    clients: usize,
    ops_per_client: usize,
    until: Option<Instant>,
) -> Result<Vec<Operation>, String> {
    let origin = Instant::now();
    let keys = Arc::new(keys);
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let (s, keys) = (store.clone(), Arc::clone(&keys));
            tokio::spawn(async move {
                let mut history = Vec::with_capacity(ops_per_client.min(4096));
                let mut last_seen: BTreeMap<usize, u64> = BTreeMap::new();
                let mut rng = (client as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let n = keys.len() as u64;
                let mut seq = 0;
                while seq < ops_per_client && until.is_none_or(|u| Instant::now() < u) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let key = (rng % n) as usize;
                    let k = &keys[key];
                    let value = (client * 1_000_000 + seq) as u64;
                    seq += 1;
                    let call = origin.elapsed().as_nanos() as u64;
                    let (input, result) = match (rng >> 8) % 10 {
                        0..=2 => {
                            let result = s.get(k).await.map(|kv| {
                                if let Some(kv) = &kv {
                                    last_seen.insert(key, kv.mod_revision.get());
                                }
                                KvOutput::Value(
                                    kv.map(|kv| (decode_u64(&kv.value), kv.mod_revision.get())),
                                )
                            });
                            (KvInput::Get, result)
                        }
                        3..=4 => {
                            let o = s.put(k, &value.to_be_bytes(), PutOptions::new()).await;
                            (KvInput::Put(value), o.map(|o| write_output(&o)))
                        }
                        5..=7 => {
                            let expected = last_seen.get(&key).copied().unwrap_or(1);
                            let expect = Expect::Version(Version::new(expected));
                            let o = s
                                .put(
                                    k,
                                    &value.to_be_bytes(),
                                    PutOptions::new().with_expect(expect),
                                )
                                .await;
                            (
                                KvInput::CompareAndSet { expected, value },
                                o.map(|o| write_output(&o)),
                            )
                        }
                        8 => {
                            let expect = PutOptions::new().with_expect(Expect::Absent);
                            let o = s.put(k, &value.to_be_bytes(), expect).await;
                            (KvInput::Create(value), o.map(|o| write_output(&o)))
                        }
                        _ => {
                            let o = s.delete(k, Expect::Any).await.map(|o| {
                                KvOutput::Deleted(matches!(
                                    o,
                                    WriteOutcome::Committed { prev: Some(_), .. }
                                ))
                            });
                            (KvInput::Delete, o)
                        }
                    };
                    let (output, ret) = match result {
                        Ok(output) => (output, origin.elapsed().as_nanos() as u64),
                        Err(StoreError::Indeterminate { .. }) if input != KvInput::Get => {
                            (KvOutput::Unknown, u64::MAX)
                        }
                        Err(StoreError::Unavailable { .. } | StoreError::Indeterminate { .. }) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    if rng % 3 == 0 {
                        // Interleave clients more than the scheduler would.
                        tokio::task::yield_now().await;
                    }
                    history.push(Operation {
                        client,
                        key: key as u64,
                        call,
                        ret,
                        input,
                        output,
                    });
                }
                Ok::<_, StoreError>(history)
            })
        })
        .collect();
    let mut history = Vec::new();
    for t in tasks {
        history.extend(
            t.await
                .map_err(|e| format!("client panicked: {e}"))?
                .map_err(|e| format!("client: {e}"))?,
        );
    }
    Ok(history)
}

fn decode_u64(bytes: &[u8]) -> u64 {
    bytes.try_into().map(u64::from_be_bytes).unwrap_or(u64::MAX)
}

fn write_output(o: &WriteOutcome) -> KvOutput {
    match o {
        WriteOutcome::Committed { revision, .. } => KvOutput::Written(revision.get()),
        WriteOutcome::Conflict { .. } => KvOutput::Conflict,
    }
}
