//! `coord::Ownership`: rendezvous hashing moves only a departed member's
//! keys (about 1/N of them), membership follows leases, and a stale owner
//! is fenced by the newer view's token.

use std::collections::HashMap;
use std::time::Duration;

use calm::coord::{CoordError, Lease, LeaseOptions, Ownership, StoreFence, View};
use calm::store::{ManualClock, MemoryStore, Store, StoreError};
use calm::testing::faults::InstrumentedStore;

/// Members' lease TTL in the manual-clock tests.
const TTL: Duration = Duration::from_secs(9);

/// A store and lease options of [`TTL`] on one manual clock.
fn world() -> (ManualClock, MemoryStore, LeaseOptions) {
    crate::common::world::world(TTL)
}

/// Moves time past `TTL` in quarter-TTL steps, letting live leases renew
/// at each step: only paused processes lose theirs.
async fn outlive_ttl(clock: &ManualClock) {
    for _ in 0..5 {
        clock.advance(TTL / 4);
        crate::common::world::settle().await;
    }
}

const KEYS: usize = 100_000;

fn keys() -> Vec<Vec<u8>> {
    (0..KEYS)
        .map(|i| format!("customer/{i}").into_bytes())
        .collect()
}

/// The owner's name of every key in `view`.
fn owners(view: &View, keys: &[Vec<u8>]) -> Vec<String> {
    keys.iter()
        .map(|k| view.owner(k).expect("members are live").id.clone())
        .collect()
}

/// The keys whose owner differs between two assignments, as
/// `(before, after)` pairs.
fn moved<'a>(before: &'a [String], after: &'a [String]) -> Vec<(&'a str, &'a str)> {
    before
        .iter()
        .zip(after)
        .filter(|(b, a)| b != a)
        .map(|(b, a)| (b.as_str(), a.as_str()))
        .collect()
}

/// With 10 members and 100,000 keys: removing one moves about 1/10 of the
/// keys, all of them the removed member's; adding an eleventh moves about
/// 1/11, all of them to the newcomer; shares are balanced and every key has
/// exactly one live owner.
#[tokio::test]
async fn a_departure_moves_only_its_keys() {
    let (_clock, store, opts) = world();
    let group = Ownership::new(store.clone(), "workers/").expect("valid prefix");
    let mut members = HashMap::new();
    for i in 0..=10 {
        let lease = Lease::grant_with(store.clone(), opts.clone())
            .await
            .expect("grant");
        let name = format!("member-{i:02}");
        let member = group.join(&name, &lease).await.expect("join");
        members.insert(name, (member, lease));
    }
    let eleven = group.view().await.expect("view");
    group.leave(&members["member-10"].0).await.expect("leave");
    let ten = group.view().await.expect("view");
    group.leave(&members["member-03"].0).await.expect("leave");
    let nine = group.view().await.expect("view");
    assert_eq!(
        (
            eleven.members().len(),
            ten.members().len(),
            nine.members().len()
        ),
        (11, 10, 9)
    );

    let keys = keys();
    let (by11, by10, by9) = (
        owners(&eleven, &keys),
        owners(&ten, &keys),
        owners(&nine, &keys),
    );

    // Balance: every one of the ten holds about a tenth.
    let mut share: HashMap<&str, usize> = HashMap::new();
    for o in &by10 {
        *share.entry(o.as_str()).or_default() += 1;
    }
    assert_eq!(share.len(), 10);
    for (m, n) in &share {
        let f = *n as f64 / KEYS as f64;
        assert!((0.09..=0.11).contains(&f), "{m} owns {f:.4} of the keys");
    }

    // Removing one of ten.
    let removal = moved(&by10, &by9);
    let f = removal.len() as f64 / KEYS as f64;
    println!(
        "ownership: removing 1 of 10 members moved {} of {KEYS} keys ({f:.4}; 1/N = 0.1000)",
        removal.len()
    );
    assert!(
        (0.09..=0.11).contains(&f),
        "moved {f:.4}, expected about 0.1"
    );
    assert!(removal.iter().all(|(before, _)| *before == "member-03"));
    assert_eq!(removal.len(), share["member-03"], "all its keys moved");

    // Adding an eleventh.
    let addition = moved(&by10, &by11);
    let f = addition.len() as f64 / KEYS as f64;
    println!(
        "ownership: adding an 11th member moved {} of {KEYS} keys ({f:.4}; 1/(N+1) = 0.0909)",
        addition.len()
    );
    assert!(
        (0.0818..=0.1).contains(&f),
        "moved {f:.4}, expected about 1/11"
    );
    assert!(addition.iter().all(|(_, after)| *after == "member-10"));

    // Exactly one owner among the live members, for every key.
    for (key, owner) in keys.iter().zip(&by9) {
        let claimants = nine.members().iter().filter(|m| nine.owns(&m.id, key));
        assert_eq!(
            claimants.map(|m| m.id.as_str()).collect::<Vec<_>>(),
            [owner]
        );
    }
}

/// Joining, viewing and leaving follow the store: a duplicate live name is
/// refused without a write, a member whose lease expires drops out of the
/// next view (`next_view` wakes for it), `leave` takes effect at once, and
/// a name can be taken again, with a higher epoch, once free.
#[tokio::test]
async fn membership_follows_leases() {
    let (clock, store, opts) = world();
    let group = Ownership::new(store.clone(), "workers/").expect("valid prefix");
    let lease_a = Lease::grant_with(store.clone(), opts.clone())
        .await
        .expect("grant");
    let lease_b = Lease::grant_with(store.clone(), opts.clone())
        .await
        .expect("grant");
    let a = group.join("a", &lease_a).await.expect("join a");
    let _b = group.join("b", &lease_b).await.expect("join b");
    // c is a process of its own, which the test will freeze.
    let c_store = InstrumentedStore::new(store.clone());
    let c_group = Ownership::new(c_store.clone(), "workers/").expect("valid prefix");
    let lease_c = Lease::grant_with(c_store.clone(), opts.clone())
        .await
        .expect("grant");
    let c = c_group.join("c", &lease_c).await.expect("join c");

    let view = group.view().await.expect("view");
    let names: Vec<&str> = view.members().iter().map(|m| m.id.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(
        group.join("a", &lease_a).await.expect("rejoin").epoch,
        a.epoch
    );

    let before = store.revision().await.expect("revision");
    let intruder = Lease::grant_with(store.clone(), opts.clone())
        .await
        .expect("grant");
    let err = group.join("b", &intruder).await.expect_err("b is live");
    assert!(matches!(err, CoordError::InvalidName { .. }), "{err}");
    assert_eq!(store.revision().await.expect("revision"), before);

    let next = tokio::spawn({
        let (group, view) = (group.clone(), view.clone());
        async move { group.next_view(&view).await }
    });
    crate::common::world::settle().await;
    assert!(!next.is_finished(), "nothing changed yet");
    c_store.pause(); // c stops renewing
    outlive_ttl(&clock).await;
    let after = next.await.expect("joins").expect("next view");
    let names: Vec<&str> = after.members().iter().map(|m| m.id.as_str()).collect();
    assert_eq!(names, ["a", "b"], "c's lease expired");
    assert!(after.token() > view.token());
    assert!(lease_a.is_alive() && lease_b.is_alive());

    group.leave(&a).await.expect("leave");
    let names: Vec<String> = group
        .view()
        .await
        .expect("view")
        .members()
        .iter()
        .map(|m| m.id.clone())
        .collect();
    assert_eq!(names, ["b"]);

    // "c" is free again: a new incarnation gets a higher epoch.
    let lease_c2 = Lease::grant_with(store.clone(), opts).await.expect("grant");
    let c2 = group.join("c", &lease_c2).await.expect("join c again");
    assert!(c2.epoch > c.epoch);
    c_store.resume();
}

/// The seed scenario for ownership: the old owner of a key decides to
/// write on its view, pauses, loses its membership; the new owner writes
/// with its newer view's token; the old owner's late write is refused and
/// leaves the store unchanged.
#[tokio::test]
async fn stale_owner_is_fenced_by_the_new_views_token() {
    let (clock, store, opts) = world();
    let a_store = InstrumentedStore::new(store.clone());
    let a_group = Ownership::new(a_store.clone(), "owners/").expect("valid prefix");
    let group = Ownership::new(store.clone(), "owners/").expect("valid prefix");
    let lease_a = Lease::grant_with(a_store.clone(), opts.clone())
        .await
        .expect("grant");
    let lease_b = Lease::grant_with(store.clone(), opts).await.expect("grant");
    let _ = a_group.join("a", &lease_a).await.expect("join a");
    let _ = group.join("b", &lease_b).await.expect("join b");

    let old = a_group.view().await.expect("view");
    let key = (0..)
        .map(|i| format!("order/{i}").into_bytes())
        .find(|k| old.owns("a", k))
        .expect("a owns some key");
    // One fence per key: a token is only comparable with other owners of
    // the same key.
    let mut fence_key = b"fence/".to_vec();
    fence_key.extend_from_slice(&key);
    let a_fence = StoreFence::new(a_store.clone(), fence_key.clone()).expect("valid key");
    let b_fence = StoreFence::new(store.clone(), fence_key).expect("valid key");

    a_store.pause();
    let late = tokio::spawn({
        let (key, token) = (key.clone(), old.token());
        async move { a_fence.put(token, &key, b"from a").await }
    });
    outlive_ttl(&clock).await;

    let new = group.view().await.expect("view");
    assert!(new.owns("b", &key), "a is gone: b owns everything");
    assert!(new.token() > old.token());
    let _ = b_fence
        .put(new.token(), &key, b"from b")
        .await
        .expect("b writes");

    let before = store.revision().await.expect("revision");
    a_store.resume();
    match late.await.expect("joins") {
        Err(CoordError::Fenced(f)) => {
            assert_eq!((f.presented, f.highest), (old.token(), new.token()))
        }
        other => panic!("the stale owner's write must be fenced, got {other:?}"),
    }
    let kv = store.get(&key).await.expect("get").expect("written");
    assert_eq!(kv.value, b"from b");
    assert_eq!(
        store.revision().await.expect("revision"),
        before,
        "refused: no write"
    );
}

/// Empty prefix, empty or oversized name, a lost lease (known to the store
/// only, then to its holder too): typed errors, the store's revision
/// unchanged; an empty group owns nothing.
#[tokio::test]
async fn bad_input_is_refused_with_typed_errors_and_no_write() {
    let (clock, store, opts) = world();
    let err = Ownership::new(store.clone(), "").expect_err("empty prefix");
    assert!(matches!(err, CoordError::InvalidName { .. }), "{err}");
    let group = Ownership::new(store.clone(), "workers/").expect("valid prefix");
    assert_eq!(group.view().await.expect("view").owner(b"k"), None);

    let lease = Lease::grant_with(store.clone(), opts.clone())
        .await
        .expect("grant");
    let before = store.revision().await.expect("revision");
    let err = group.join("", &lease).await.expect_err("empty name");
    assert!(matches!(err, CoordError::InvalidName { .. }), "{err}");
    let err = group
        .join(&"n".repeat(64 * 1024), &lease)
        .await
        .expect_err("oversized name");
    assert!(
        matches!(err, CoordError::Store(StoreError::InvalidKey { .. })),
        "{err}"
    );

    // A lease the store has expired, before its keeper has noticed.
    clock.advance(TTL + Duration::from_secs(1));
    let err = group.join("late", &lease).await.expect_err("lease gone");
    assert!(matches!(err, CoordError::LeaseLost { .. }), "{err}");
    // The same lease once its keeper has said so.
    crate::common::world::settle().await;
    assert!(!lease.is_alive());
    let err = group.join("late", &lease).await.expect_err("lease lost");
    assert!(matches!(err, CoordError::LeaseLost { .. }), "{err}");
    assert!(group.view().await.expect("view").members().is_empty());
    assert_eq!(store.revision().await.expect("revision"), before);
}

/// `rendezvous_score` is fixed: members on different calm versions (or
/// builds, or machines) must agree on every key's owner. These values come
/// from an independent implementation of the documented hash (FNV-1a over
/// member, 0xff, key; then the splitmix64 finaliser).
#[test]
fn rendezvous_score_test_vectors() {
    use calm::coord::rendezvous_score;
    let vectors: [(&[u8], &[u8], u64); 5] = [
        (b"m1", b"key-1", 0xeeeb_762f_02eb_d86d),
        (b"m2", b"key-1", 0x9333_755d_c9f5_90c0),
        (b"node-a", b"", 0x6450_dc43_52f6_a123),
        (b"", b"k", 0xee8d_e170_b292_42d0),
        (b"worker-17", b"orders/42", 0x250c_d486_ee18_ec65),
    ];
    for (member, key, score) in vectors {
        assert_eq!(rendezvous_score(member, key), score, "{member:?} {key:?}");
    }
}
