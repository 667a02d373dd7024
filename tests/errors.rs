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

/// `e` is a `WrongFormat` naming both formats, and says `says`.
fn assert_wrong_format(
    e: &StoreError,
    found: calm::store::StoredFormat,
    expected: calm::store::StoredFormat,
    says: &str,
) {
    assert!(
        matches!(e, StoreError::WrongFormat { found: f, expected: x } if *f == found && *x == expected),
        "{e:?}"
    );
    assert!(e.to_string().contains(says), "{e}");
}

/// Reading a key with the other of calm's two formats says what the bytes
/// are, instead of a parser's complaint about byte 0.
#[tokio::test]
async fn a_value_read_in_the_wrong_format_says_what_it_is() {
    use calm::store::{StoreExt, StoredFormat, Typed};
    use calm::{GCounter, causal::ReplicaId};

    let store = MemoryStore::new();
    let typed = Typed::<_, u64>::new(store.clone());
    let _ = typed
        .put(b"json", &7, calm::store::Expect::Any)
        .await
        .unwrap();
    let mut counter = GCounter::new();
    counter.increment(ReplicaId::new(1), 3);
    store.merge_into(b"codec", &counter).await.unwrap();

    let e = store
        .merge_into(b"json", &counter)
        .await
        .expect_err("JSON is not a counter");
    assert_wrong_format(&e, StoredFormat::Json, StoredFormat::Codec, "JSON");
    let e = store
        .read_merged::<GCounter>(b"json")
        .await
        .expect_err("JSON");
    assert!(matches!(e, StoreError::WrongFormat { .. }), "{e:?}");
    assert_eq!(
        typed.get(b"json").await.unwrap().map(|v| *v.value()),
        Some(7),
        "unchanged"
    );

    let e = typed
        .get(b"codec")
        .await
        .expect_err("codec bytes are not JSON");
    assert_wrong_format(&e, StoredFormat::Codec, StoredFormat::Json, "binary codec");

    // Bytes in neither format keep the parser's error.
    let _ = store
        .put(b"junk", b"\xff\xfe", Default::default())
        .await
        .unwrap();
    assert!(matches!(
        typed.get(b"junk").await,
        Err(StoreError::Serde(_))
    ));
    assert!(matches!(
        store.read_merged::<GCounter>(b"junk").await,
        Err(StoreError::Decode(_))
    ));
}
