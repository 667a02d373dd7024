//! Error chains say each cause once: a message never repeats its source's
//! text, and no two links of a chain say the same thing.

use calm::coord::{CoordError, Election};
use calm::store::{KeySpan, MemoryStore, MemoryStoreOptions, Store, StoreError};

/// The messages of `e` and its sources, outermost first.
fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut next = e.source();
    while let Some(cause) = next {
        out.push(cause.to_string());
        next = cause.source();
    }
    out
}

fn assert_says_each_cause_once(e: &(dyn std::error::Error + 'static)) {
    let links = chain(e);
    for (i, outer) in links.iter().enumerate() {
        assert!(!outer.is_empty(), "an empty message in {links:#?}");
        for inner in &links[i + 1..] {
            assert!(
                !outer.contains(inner.as_str()),
                "{outer:?} repeats its cause {inner:?}: {links:#?}"
            );
        }
    }
}

/// A loopback port with nothing listening (bound, then released).
#[cfg(any(feature = "postgres", feature = "etcd"))]
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_refused_connection_says_each_cause_once() {
    let url = format!(
        "host=127.0.0.1 port={} user=calm dbname=calm",
        closed_port()
    );
    let e = calm::backend::postgres::PostgresStore::connect(&url)
        .await
        .expect_err("nothing listens");
    assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
    assert_says_each_cause_once(&e);
    let links = chain(&e);
    assert!(
        links.last().unwrap().to_lowercase().contains("refused"),
        "the root cause is kept: {links:#?}"
    );
    assert!(
        links.iter().all(|l| !l.contains("Error {")),
        "no Debug text: {links:#?}"
    );
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn etcd_refused_connection_says_each_cause_once() {
    let endpoint = format!("http://127.0.0.1:{}", closed_port());
    let e = calm::backend::etcd::EtcdStore::connect(&[endpoint])
        .await
        .expect_err("nothing listens");
    assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
    assert_says_each_cause_once(&e);
    assert!(
        chain(&e).last().unwrap().to_lowercase().contains("refused"),
        "the root cause is kept: {:#?}",
        chain(&e)
    );
    assert!(
        chain(&e).iter().all(|l| !l.contains("Status {")),
        "no Debug text: {:#?}",
        chain(&e)
    );
}

#[tokio::test]
async fn an_ended_observation_keeps_its_cause() {
    let store = MemoryStore::with_options(MemoryStoreOptions::default().with_history(2));
    let election = Election::new(store.clone(), "svc/leader/").unwrap();
    let mut observer = election.observe().await.unwrap();
    assert_eq!(observer.next().await.unwrap(), None);
    // The observer falls behind the history kept: its watch ends with
    // `Compacted`, which the observer reports as its cause.
    for i in 0..16u8 {
        let _ = store
            .put(b"svc/leader/x", &[i], Default::default())
            .await
            .unwrap();
    }
    let mut ended = None;
    for _ in 0..20 {
        if let Err(e) = observer.next().await {
            ended = Some(e);
            break;
        }
    }
    let e = ended.expect("the observation ends once its history is gone");
    assert!(
        matches!(e, CoordError::ObserveEnded(StoreError::Compacted { .. })),
        "{e:?}"
    );
    assert!(std::error::Error::source(&e).is_some(), "{e:?}");
    assert_says_each_cause_once(&e);
}

#[tokio::test]
async fn a_compacted_watch_error_reads_once() {
    let store = MemoryStore::with_options(MemoryStoreOptions::default().with_history(2));
    for i in 0..8u8 {
        let _ = store.put(b"k", &[i], Default::default()).await.unwrap();
    }
    let Err(e) = store
        .watch(KeySpan::Key(b"k".to_vec()), calm::occ::Version::new(1))
        .await
    else {
        panic!("revision 1 is compacted");
    };
    assert!(matches!(e, StoreError::Compacted { .. }), "{e:?}");
    assert_says_each_cause_once(&e);
}
