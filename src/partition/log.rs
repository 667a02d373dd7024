//! The partition log: a single writer per partition across processes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::LogError;
use crate::coord::{CoordError, FencingToken, StoreFence, View, rendezvous_score};
use crate::occ::Version;
use crate::store::{
    Compare, CompareOp, Expect, KeyValue, MAX_KEY_LEN, PutOptions, Store, TxnOp, WriteOutcome,
    check_key,
};

/// The most partitions a log may have.
pub const MAX_PARTITIONS: u32 = 1 << 16;

/// The longest entity key a command may name, in bytes.
pub const MAX_ENTITY_KEY: usize = 512;

/// One command waiting in (or read from) a partition log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Command {
    /// The partition it belongs to ([`PartitionLog::partition_of`] its
    /// key).
    pub partition: u32,
    /// The entity it is for.
    pub key: Vec<u8>,
    /// What to do, as the producer encoded it.
    pub payload: Vec<u8>,
    /// The command's id in its partition (the producer's, or a random one).
    pub id: String,
    /// The store revision it was appended at: its place in the log's
    /// order.
    pub revision: Version,
    /// Its log entry's key.
    entry: Vec<u8>,
}

/// What one [`PartitionLog::apply_owned`] pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Applied {
    /// Commands applied (each in its own fenced transaction).
    pub commands: usize,
    /// Partitions this member owned in the view and worked through.
    pub partitions: Vec<u32>,
    /// Partitions where a newer owner's token refused this one: the view
    /// is stale; get a new one.
    pub fenced: Vec<u32>,
}

/// A log of commands split into partitions, each applied by its one
/// current owner, in order, exactly once.
///
/// Producers [`append`](PartitionLog::append) a command for an entity
/// key; the key picks the partition (a stable hash), and the store's
/// revision orders the commands. Members of an
/// [`Ownership`](crate::coord::Ownership) group each call
/// [`apply_owned`](PartitionLog::apply_owned) with their current
/// [`View`]: for every partition the view gives them (rendezvous hashing
/// of the partition's name), they apply the waiting commands oldest first.
/// Each command is applied in **one fenced transaction** that writes the
/// handler's effects, records the partition's progress (the command's
/// revision) and deletes the command, under the view's
/// [`token`](View::token):
///
/// - **exactly once**: the transaction also requires the progress record
///   to be as this member read it, so two members racing on a partition
///   cannot both apply a command; a crash before commit leaves the command
///   in place for the next owner, a crash after leaves it gone;
/// - **in order**: commands are applied in revision order, and the next
///   is read only after the previous committed;
/// - **stale owners fenced out**: after membership changes, the new owner's
///   first write raises the partition's fence to its newer view's token,
///   and a paused old owner that wakes and writes is refused
///   ([`Applied::fenced`]), its effects with it;
/// - **trimmed**: an applied command is deleted in the same transaction,
///   so the log holds only what is waiting.
///
/// Effects that live outside the store cannot join the transaction: give
/// them the command's revision as an idempotency key, or fence them with
/// the view's token at the resource
/// (`backend::postgres::PgFence` for PostgreSQL tables).
///
/// # Layout
///
/// Under the log's prefix: `log/<partition>/<id>` for waiting commands,
/// `progress/<partition>` for the last applied revision and
/// `fence/<partition>` for the partition's highest token. A partition's
/// waiting commands are read whole on each pass; keep partitions many
/// enough that backlogs stay short. The progress record is read once and
/// then remembered by the `PartitionLog` (and its clones), so a pass over
/// one waiting command costs a range read and one transaction; an empty
/// partition costs the range read alone.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use calm::coord::{Lease, Ownership};
/// use calm::partition::PartitionLog;
/// use calm::store::{MemoryStore, Store, TxnOp};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let log = PartitionLog::new(store.clone(), "ledger/", 16)?;
/// log.append(b"alice", b"+5").await?;
/// log.append(b"alice", b"-2").await?;
///
/// let group = Ownership::new(store.clone(), "ledger-members/")?;
/// let lease = Lease::grant(store.clone(), Duration::from_secs(10)).await?;
/// group.join("worker-1", &lease).await?;
/// let view = group.view().await?;
///
/// // The only member owns every partition: it applies both, in order,
/// // each with its effect (here: the last payload per account).
/// let applied = log
///     .apply_owned(&view, "worker-1", |c| {
///         vec![TxnOp::put(&[b"balances/".as_slice(), &c.key].concat(), &c.payload)]
///     })
///     .await?;
/// assert_eq!(applied.commands, 2);
/// assert_eq!(store.get(b"balances/alice").await?.unwrap().value, b"-2");
/// assert!(log.pending(log.partition_of(b"alice")).await?.is_empty());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct PartitionLog<S> {
    store: S,
    /// The root of the log's keys.
    prefix: Vec<u8>,
    /// How many partitions (fixed for the log's life: commands are placed
    /// by `hash(key) % partitions`).
    partitions: u32,
    /// Per partition, the progress this log (or a clone) last read or
    /// wrote: the applied revision and the record's mod revision. A pass
    /// starts from it instead of reading the record; the record's compare
    /// in every apply transaction catches a stale entry, which is then
    /// read afresh.
    progress: Arc<Mutex<HashMap<u32, (Version, Version)>>>,
}

impl<S: Store + Clone> PartitionLog<S> {
    /// A log under `prefix` with `partitions` partitions (1 to
    /// [`MAX_PARTITIONS`]). Every producer and member of one log must use
    /// the same prefix and count.
    ///
    /// # Errors
    ///
    /// [`LogError::InvalidPartitions`] for a count out of range;
    /// [`LogError::Coord`] with [`CoordError::InvalidName`] for an empty
    /// or oversized prefix.
    pub fn new(store: S, prefix: impl Into<Vec<u8>>, partitions: u32) -> Result<Self, LogError> {
        let prefix = prefix.into();
        if prefix.is_empty() || prefix.len() + 64 > MAX_KEY_LEN {
            return Err(CoordError::InvalidName {
                reason: "a log prefix is 1 to MAX_KEY_LEN - 64 bytes",
            }
            .into());
        }
        if partitions == 0 || partitions > MAX_PARTITIONS {
            return Err(LogError::InvalidPartitions { partitions });
        }
        Ok(Self {
            store,
            prefix,
            partitions,
            progress: Arc::default(),
        })
    }

    /// The number of partitions.
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// The partition of entity `key`: a stable hash, the same in every
    /// process and build.
    pub fn partition_of(&self, key: &[u8]) -> u32 {
        // The owner-independent half of the rendezvous hash: stable, and
        // well mixed in its low bits.
        (rendezvous_score(b"partition", key) % u64::from(self.partitions)) as u32
    }

    /// The name members compete for: partition `p` is owned by
    /// `view.owner(&log.partition_name(p))`.
    pub fn partition_name(&self, partition: u32) -> Vec<u8> {
        let mut name = b"partition/".to_vec();
        push_decimal(&mut name, partition, 1);
        name
    }

    /// `<prefix><area>/<partition, 5 digits>/<rest>`.
    fn key(&self, area: &str, partition: u32, rest: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + area.len() + 7 + rest.len());
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(area.as_bytes());
        k.push(b'/');
        push_decimal(&mut k, partition, 5);
        k.push(b'/');
        k.extend_from_slice(rest);
        k
    }

    /// Appends a command for entity `key` to its partition; returns the
    /// revision that orders it.
    ///
    /// # Errors
    ///
    /// [`LogError::InvalidKey`] for an empty key or one over
    /// [`MAX_ENTITY_KEY`] bytes; a store error (a payload too large for
    /// one value, a failure).
    ///
    /// # Cancel safety
    ///
    /// As [`Store::put`]: an append dropped in flight may or may not have
    /// happened. [`append_once`](PartitionLog::append_once) makes a retry
    /// safe.
    pub async fn append(&self, key: &[u8], payload: &[u8]) -> Result<Version, LogError> {
        let mut id = [0u8; 16];
        getrandom::fill(&mut id).map_err(|e| {
            CoordError::Store(crate::store::StoreError::Backend {
                source: Box::new(std::io::Error::other(e.to_string())),
            })
        })?;
        let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
        self.append_once(key, &id, payload)
            .await
            .map(|(revision, _)| revision)
    }

    /// Appends a command under the producer's own `id` (unique per
    /// command), so retrying an append whose outcome is unknown adds it at
    /// most once while it waits. Returns its revision and whether this
    /// call added it (`false`: it was already waiting).
    ///
    /// # Errors
    ///
    /// As [`append`](PartitionLog::append); [`LogError::InvalidKey`] also
    /// for an empty `id` or one over 128 bytes.
    ///
    /// # Cancel safety
    ///
    /// As [`Store::put`]; retry with the same `id`.
    pub async fn append_once(
        &self,
        key: &[u8],
        id: &str,
        payload: &[u8],
    ) -> Result<(Version, bool), LogError> {
        if key.is_empty() || key.len() > MAX_ENTITY_KEY {
            return Err(LogError::InvalidKey {
                reason: "an entity key is 1 to MAX_ENTITY_KEY (512) bytes",
            });
        }
        if id.is_empty() || id.len() > 128 {
            return Err(LogError::InvalidKey {
                reason: "a command id is 1 to 128 bytes",
            });
        }
        let partition = self.partition_of(key);
        let entry = self.key("log", partition, id.as_bytes());
        check_key(&entry).map_err(CoordError::from)?;
        let mut value = Vec::with_capacity(4 + key.len() + payload.len());
        value.extend_from_slice(&(key.len() as u32).to_be_bytes());
        value.extend_from_slice(key);
        value.extend_from_slice(payload);
        let put = self
            .store
            .put(
                &entry,
                &value,
                PutOptions::new().with_expect(Expect::Absent),
            )
            .await
            .map_err(CoordError::from)?;
        Ok(match put {
            WriteOutcome::Committed { revision, .. } => (revision, true),
            WriteOutcome::Conflict { current } => (
                current.map_or(Version::ZERO, |kv| kv.create_revision),
                false,
            ),
        })
    }

    /// The commands waiting in `partition`, oldest first.
    ///
    /// # Errors
    ///
    /// [`LogError::InvalidPartitions`] for a partition out of range;
    /// [`LogError::Corrupt`] for a log entry calm did not write; a store
    /// error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn pending(&self, partition: u32) -> Result<Vec<Command>, LogError> {
        if partition >= self.partitions {
            return Err(LogError::InvalidPartitions {
                partitions: partition,
            });
        }
        let range = self
            .store
            .range(&self.key("log", partition, b""), None)
            .await
            .map_err(CoordError::from)?;
        let mut commands = range
            .kvs
            .into_iter()
            .map(|kv| decode(partition, kv))
            .collect::<Result<Vec<_>, _>>()?;
        commands.sort_by_key(|c| c.revision);
        Ok(commands)
    }

    /// The revision of the last command applied in `partition`
    /// ([`Version::ZERO`] if none).
    ///
    /// # Errors
    ///
    /// [`LogError::Corrupt`] for a progress record calm did not write; a
    /// store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn progress(&self, partition: u32) -> Result<Version, LogError> {
        let kv = self
            .store
            .get(&self.key("progress", partition, b""))
            .await
            .map_err(CoordError::from)?;
        Ok(progress_of(kv.as_ref())?.0)
    }

    /// Applies every waiting command of every partition that `member` owns
    /// in `view`, oldest first, each in one fenced transaction with the
    /// effects `handler` returns for it (store writes; may be empty).
    /// `handler` only describes effects: it may be called more than once
    /// for a command (when a transaction has to be retried), and only the
    /// writes of the call whose transaction commits take effect.
    ///
    /// A partition where a newer owner has written stops at once and is
    /// listed in [`Applied::fenced`]: take a new view. Another member
    /// applying a command first (a race during a membership change) is
    /// not an error: the command is skipped, as that member applied it.
    ///
    /// # Errors
    ///
    /// A store error (the pass stops; commands applied before it stay
    /// applied, and the rest wait for the next pass); [`LogError::Corrupt`]
    /// for entries calm did not write.
    ///
    /// # Cancel safety
    ///
    /// Dropping it stops the pass between commands or during one
    /// command's transaction, which then may or may not have committed;
    /// either way the command is applied at most once, and the next pass
    /// (this member's or the next owner's) goes on from the progress
    /// recorded.
    pub async fn apply_owned<F>(
        &self,
        view: &View,
        member: &str,
        mut handler: F,
    ) -> Result<Applied, LogError>
    where
        F: FnMut(&Command) -> Vec<TxnOp>,
    {
        let mut applied = Applied::default();
        let token = view.token();
        for partition in 0..self.partitions {
            if !view.owns(member, &self.partition_name(partition)) {
                continue;
            }
            applied.partitions.push(partition);
            if self
                .apply_partition(partition, token, &mut handler, &mut applied)
                .await?
                .is_err()
            {
                applied.fenced.push(partition);
            }
        }
        Ok(applied)
    }

    /// Applies `partition`'s waiting commands under `token`; `Ok(Err(()))`
    /// when a newer token refused it.
    async fn apply_partition<F>(
        &self,
        partition: u32,
        token: FencingToken,
        handler: &mut F,
        applied: &mut Applied,
    ) -> Result<Result<(), ()>, LogError>
    where
        F: FnMut(&Command) -> Vec<TxnOp>,
    {
        let commands = self.pending(partition).await?;
        if commands.is_empty() {
            return Ok(Ok(()));
        }
        let fence = StoreFence::new(self.store.clone(), self.key("fence", partition, b""))?;
        let progress_key = self.key("progress", partition, b"");
        let cached = self.cached(partition);
        // Whether the progress in hand was read in this pass.
        let mut fresh = cached.is_none();
        let (mut done, mut progress_rev) = match cached {
            Some(progress) => progress,
            None => self.read_progress(partition, &progress_key).await?,
        };
        let mut commands = commands.into_iter().peekable();
        while let Some(command) = commands.peek() {
            if command.revision <= done {
                // Applying a command deletes it in the same transaction,
                // and a read sees every command up to its revision, so
                // none at or below the progress can be waiting: never
                // apply twice all the same.
                commands.next();
                continue;
            }
            let build = || {
                let mut ops = handler(command);
                ops.reserve(2);
                ops.push(TxnOp::put(
                    &progress_key,
                    &command.revision.get().to_be_bytes(),
                ));
                ops.push(TxnOp::delete(&command.entry));
                // The progress record as read (absent: mod revision 0), and
                // the command still waiting: nobody applied it meanwhile.
                let compares = vec![
                    Compare::mod_revision(&progress_key, CompareOp::Equal, progress_rev),
                    Compare::create_revision(&command.entry, CompareOp::Equal, command.revision),
                ];
                (compares, ops)
            };
            let outcome = fence.write_built(token, build).await;
            if !matches!(outcome, Ok(Some(_))) {
                self.forget(partition);
            }
            match outcome {
                Ok(Some(revision)) => {
                    applied.commands += 1;
                    done = command.revision;
                    progress_rev = revision;
                    self.remember(partition, (done, progress_rev));
                    commands.next();
                }
                // The progress in hand was remembered, and another member
                // (or clone) applied something since: read it and retry.
                Ok(None) if !fresh => {
                    fresh = true;
                    (done, progress_rev) = self.read_progress(partition, &progress_key).await?;
                }
                // Another member applied something here first: re-read
                // from its progress on the next pass.
                Ok(None) => return Ok(Ok(())),
                Err(CoordError::Fenced(_)) => return Ok(Err(())),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Ok(()))
    }

    /// Reads `partition`'s progress record (at `key`) and remembers it.
    async fn read_progress(
        &self,
        partition: u32,
        key: &[u8],
    ) -> Result<(Version, Version), LogError> {
        let kv = self.store.get(key).await.map_err(CoordError::from)?;
        let progress = progress_of(kv.as_ref())?;
        self.remember(partition, progress);
        Ok(progress)
    }

    fn progress_cache(&self) -> std::sync::MutexGuard<'_, HashMap<u32, (Version, Version)>> {
        // Only inserts and removes run under the lock: a poisoned map is
        // still consistent, and any entry is checked before it is trusted.
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn cached(&self, partition: u32) -> Option<(Version, Version)> {
        self.progress_cache().get(&partition).copied()
    }

    fn remember(&self, partition: u32, progress: (Version, Version)) {
        self.progress_cache().insert(partition, progress);
    }

    fn forget(&self, partition: u32) {
        self.progress_cache().remove(&partition);
    }
}

/// A waiting command from its log entry.
fn decode(partition: u32, kv: KeyValue) -> Result<Command, LogError> {
    let corrupt = || LogError::Corrupt {
        key: kv.key.clone(),
    };
    // The id is the key's last segment.
    let id = kv
        .key
        .iter()
        .rposition(|&b| b == b'/')
        .and_then(|i| std::str::from_utf8(&kv.key[i + 1..]).ok())
        .ok_or_else(corrupt)?
        .to_owned();
    let len = kv
        .value
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .filter(|&n| n <= MAX_ENTITY_KEY && 4 + n <= kv.value.len())
        .ok_or_else(corrupt)?;
    Ok(Command {
        partition,
        key: kv.value[4..4 + len].to_vec(),
        payload: kv.value[4 + len..].to_vec(),
        id,
        revision: kv.create_revision,
        entry: kv.key,
    })
}

/// Appends `n` in decimal, zero-padded to at least `width` digits.
fn push_decimal(out: &mut Vec<u8>, n: u32, width: usize) {
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.resize(out.len() + width.saturating_sub(digits.len() - at), b'0');
    out.extend_from_slice(&digits[at..]);
}

/// The applied revision a progress record holds and the record's own mod
/// revision (both zero when absent).
fn progress_of(kv: Option<&KeyValue>) -> Result<(Version, Version), LogError> {
    let Some(kv) = kv else {
        return Ok((Version::ZERO, Version::ZERO));
    };
    let bytes: [u8; 8] = kv
        .value
        .as_slice()
        .try_into()
        .map_err(|_| LogError::Corrupt {
            key: kv.key.clone(),
        })?;
    Ok((Version::new(u64::from_be_bytes(bytes)), kv.mod_revision))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    #[test]
    fn keys_and_partition_names_keep_their_layout() {
        let log = PartitionLog::new(MemoryStore::new(), "p/", MAX_PARTITIONS).unwrap();
        for p in [0, 7, 10, 12_345, 99_999, MAX_PARTITIONS - 1] {
            assert_eq!(log.partition_name(p), format!("partition/{p}").into_bytes());
            assert_eq!(
                log.key("log", p, b"id"),
                format!("p/log/{p:05}/id").into_bytes()
            );
        }
    }
}
