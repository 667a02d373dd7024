use super::queue::check_prefix;
use super::{CoordError, FencingToken, Lease};
use crate::occ::Version;
use crate::store::{Expect, KeySpan, PutOptions, Store, Watch, WriteOutcome, check_key};

/// One live member of an [`Ownership`] group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Member {
    /// The member's name.
    pub id: String,
    /// The create revision of its membership key: distinguishes this
    /// incarnation from an earlier one with the same name.
    pub epoch: FencingToken,
}

/// A consistent snapshot of the group: who is live, at which store
/// revision.
///
/// Keys are assigned to members by rendezvous (highest random weight)
/// hashing: each key goes to the member with the highest
/// `hash(member, key)`. Every process with the same view computes the same
/// owner, with no coordination; when a member leaves, only its keys move
/// (each to the member with its second-highest score), and when one joins,
/// it takes about `1/N` of the keys from the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// Live members, by name.
    members: Vec<Member>,
    /// The store revision the view was read at.
    revision: Version,
}

impl View {
    /// A view of the given members (for tests and simulations); real views
    /// come from [`Ownership::view`].
    pub fn new(mut members: Vec<Member>, revision: Version) -> Self {
        members.sort_by(|a, b| a.id.cmp(&b.id));
        Self { members, revision }
    }

    /// The live members, sorted by name.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The fencing token of decisions made from this view: the store
    /// revision it was read at. A membership change happens at a higher
    /// revision, so an owner acting on a view from before it lost a key
    /// presents a lower token than the key's new owner.
    pub fn token(&self) -> FencingToken {
        FencingToken::from(self.revision)
    }

    /// The owner of `key`, or `None` if nobody is live.
    pub fn owner(&self, key: &[u8]) -> Option<&Member> {
        self.members.iter().max_by_key(|m| {
            (
                rendezvous_score(m.id.as_bytes(), key),
                std::cmp::Reverse(&m.id),
            )
        })
    }

    /// Whether the member named `id` owns `key` in this view.
    pub fn owns(&self, id: &str, key: &[u8]) -> bool {
        self.owner(key).is_some_and(|m| m.id == id)
    }
}

/// A member's score for a key: a stable 64-bit hash of both (the same in
/// every process and every build, unlike the standard library's hasher).
/// FNV-1a over the bytes, then the splitmix64 finaliser for avalanche.
pub fn rendezvous_score(member: &[u8], key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in member.iter().chain(&[0xff]).chain(key) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Partition ownership: members register with leases, and every key has
/// exactly one owner among the live members.
///
/// "One owner per key" removes the need to lock keys at all: the owner
/// processes its keys alone. A member that crashes stops renewing, its
/// lease ends, its membership key vanishes, and the next [`View`] hands
/// its keys to the others. Because a member may be paused and keep acting
/// on an old view, every write for a key carries the view's
/// [`token`](View::token), checked at the resource.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use calm::coord::{Lease, Ownership};
/// use calm::store::MemoryStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::coord::CoordError> {
/// let store = MemoryStore::new();
/// let group = Ownership::new(store.clone(), "workers/")?;
/// let (la, lb) = (
///     Lease::grant(store.clone(), Duration::from_secs(10)).await?,
///     Lease::grant(store.clone(), Duration::from_secs(10)).await?,
/// );
/// group.join("a", &la).await?;
/// group.join("b", &lb).await?;
/// let view = group.view().await?;
/// let owner = view.owner(b"customer/42").unwrap();
/// assert!(["a", "b"].contains(&owner.id.as_str()));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Ownership<S> {
    store: S,
    prefix: Vec<u8>,
}

impl<S: Store + Clone + 'static> Ownership<S> {
    /// A group whose members register under `prefix`.
    ///
    /// # Errors
    ///
    /// [`CoordError::InvalidName`] for an empty or oversized prefix.
    pub fn new(store: S, prefix: impl Into<Vec<u8>>) -> Result<Self, CoordError> {
        let prefix = prefix.into();
        check_prefix(&prefix)?;
        Ok(Self { store, prefix })
    }

    fn key(&self, id: &str) -> Result<Vec<u8>, CoordError> {
        if id.is_empty() {
            return Err(CoordError::InvalidName {
                reason: "a member name must not be empty",
            });
        }
        let mut k = self.prefix.clone();
        k.extend_from_slice(id.as_bytes());
        check_key(&k)?;
        Ok(k)
    }

    /// Registers `id` as a live member for as long as `lease` lives.
    ///
    /// # Errors
    ///
    /// [`CoordError::InvalidName`] if the name is empty or already taken
    /// by another live member; [`CoordError::LeaseLost`] if the lease is
    /// gone; a store error.
    ///
    /// # Cancel safety
    ///
    /// As [`Store::put`]: a registration dropped in flight may have
    /// happened; it ends with the lease.
    pub async fn join(&self, id: &str, lease: &Lease<S>) -> Result<Member, CoordError> {
        lease.check()?;
        let key = self.key(id)?;
        let put = self
            .store
            .put(
                &key,
                id.as_bytes(),
                PutOptions::new()
                    .with_expect(Expect::Absent)
                    .with_lease(lease.id()),
            )
            .await
            .map_err(|e| {
                if e.is_lease_lost() {
                    CoordError::LeaseLost { lease: lease.id() }
                } else {
                    e.into()
                }
            })?;
        match put {
            WriteOutcome::Committed { revision, .. } => Ok(Member {
                id: id.to_owned(),
                epoch: revision.into(),
            }),
            WriteOutcome::Conflict { current: Some(kv) } if kv.lease == Some(lease.id()) => {
                Ok(Member {
                    id: id.to_owned(),
                    epoch: kv.create_revision.into(),
                })
            }
            WriteOutcome::Conflict { .. } => Err(CoordError::InvalidName {
                reason: "another live member already has this name",
            }),
        }
    }

    /// Leaves the group now (its keys move at the next view).
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// As [`Store::delete`]; otherwise membership ends with the lease.
    pub async fn leave(&self, member: &Member) -> Result<(), CoordError> {
        let key = self.key(&member.id)?;
        let txn = crate::store::Txn::new()
            .when(crate::store::Compare::create_revision(
                &key,
                crate::store::CompareOp::Equal,
                Version::new(member.epoch.get()),
            ))
            .then(crate::store::TxnOp::delete(&key));
        self.store.txn(txn).await?;
        Ok(())
    }

    /// The group as it is now.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn view(&self) -> Result<View, CoordError> {
        let r = self.store.range(&self.prefix, None).await?;
        let members = r
            .kvs
            .into_iter()
            .map(|kv| Member {
                id: String::from_utf8_lossy(&kv.key[self.prefix.len()..]).into_owned(),
                epoch: kv.create_revision.into(),
            })
            .collect();
        Ok(View::new(members, r.revision))
    }

    /// Waits for the first membership change after `view` and returns the
    /// new view.
    ///
    /// # Errors
    ///
    /// A store error, including [`StoreError::Compacted`](crate::store::StoreError::Compacted)
    /// if `view` is too old (read a fresh one).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads and waits.
    pub async fn next_view(&self, view: &View) -> Result<View, CoordError> {
        let mut w = self
            .store
            .watch(KeySpan::Prefix(self.prefix.clone()), view.revision.next())
            .await?;
        loop {
            w.next().await?;
            let next = self.view().await?;
            if next.members != view.members {
                return Ok(next);
            }
        }
    }
}
