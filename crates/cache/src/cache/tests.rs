//! Tests of the cache: its version rules, read-your-writes, and its secondary indexes, which
//! must agree with a scan of the objects after any sequence of changes and at every moment
//! under concurrent ones.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::ConfigMap;
use proptest::prelude::*;

use super::*;

const POOL: &str = "pool";
const TAGS: &str = "tags";

/// `default/<name>` at resourceVersion `rv`, in pool `pool` (label), with `tags` (data keys).
fn object(name: &str, rv: u64, pool: Option<&str>, tags: &[&str]) -> Arc<ConfigMap> {
    let mut map = ConfigMap::default();
    map.metadata.namespace = Some("default".into());
    map.metadata.name = Some(name.into());
    map.metadata.uid = Some(format!("uid-{name}"));
    map.metadata.resource_version = Some(rv.to_string());
    if let Some(pool) = pool {
        map.metadata.labels = Some(BTreeMap::from([("pool".into(), pool.into())]));
    }
    map.data = Some(tags.iter().map(|t| ((*t).to_owned(), String::new())).collect());
    Arc::new(map)
}

fn pool_of(map: &ConfigMap) -> Vec<String> {
    map.metadata.labels.as_ref().and_then(|l| l.get("pool")).cloned().into_iter().collect()
}

fn tags_of(map: &ConfigMap) -> Vec<String> {
    map.data.iter().flat_map(|d| d.keys().cloned()).collect()
}

fn indexed_cache() -> Cache<ConfigMap> {
    let cache = Cache::default();
    cache.add_index(POOL, pool_of).unwrap();
    cache.add_index(TAGS, tags_of).unwrap();
    cache
}

fn names(objects: &[Arc<ConfigMap>]) -> Vec<&str> {
    objects.iter().map(|o| o.metadata.name.as_deref().unwrap()).collect()
}

/// Every index agrees with a scan of the objects: same values, same objects, same versions.
fn assert_consistent(cache: &Cache<ConfigMap>) {
    let contents = cache.read();
    for index in &contents.indexes {
        let mut expected: HashMap<String, Vec<(ObjectKey, String)>> = HashMap::new();
        for (key, obj) in &contents.objects {
            for value in (index.func)(obj) {
                let rv = obj.metadata.resource_version.clone().unwrap();
                expected.entry(value).or_default().push((key.clone(), rv));
            }
        }
        let actual: HashMap<String, Vec<(ObjectKey, String)>> = index
            .buckets
            .iter()
            .map(|(value, bucket)| {
                let entries = bucket
                    .iter()
                    .map(|(k, o)| (k.clone(), o.metadata.resource_version.clone().unwrap()))
                    .collect();
                (value.clone(), entries)
            })
            .collect();
        assert_eq!(actual, expected, "index {}", index.name);
    }
}

#[test]
fn lookups_by_index_follow_every_change() {
    let cache = indexed_cache();
    cache.apply(object("b", 1, Some("p"), &["x"]));
    cache.apply(object("a", 2, Some("p"), &["x", "y"]));
    cache.apply(object("c", 3, Some("q"), &[]));
    assert_eq!(names(&cache.by_index(POOL, "p").unwrap()), ["a", "b"]);
    assert_eq!(names(&cache.by_index(TAGS, "x").unwrap()), ["a", "b"]);
    assert_eq!(names(&cache.by_index(TAGS, "y").unwrap()), ["a"]);
    assert!(cache.by_index(POOL, "none").unwrap().is_empty());

    // Moving an object moves it in the index; the new version is what the index returns.
    cache.apply(object("b", 4, Some("q"), &["y"]));
    assert_eq!(names(&cache.by_index(POOL, "p").unwrap()), ["a"]);
    assert_eq!(names(&cache.by_index(POOL, "q").unwrap()), ["b", "c"]);
    assert_eq!(names(&cache.by_index(TAGS, "x").unwrap()), ["a"]);
    let b = cache.by_index(TAGS, "y").unwrap();
    assert_eq!(names(&b), ["a", "b"]);
    assert_eq!(b[1].metadata.resource_version.as_deref(), Some("4"));

    // A deletion empties its buckets; an empty bucket is no value.
    cache.delete(&object("a", 5, None, &[]));
    assert!(cache.by_index(POOL, "p").unwrap().is_empty());
    let mut values = cache.index_values(POOL).unwrap();
    values.sort();
    assert_eq!(values, ["q"]);
    assert_eq!(cache.index_value_count(TAGS).unwrap(), 1);
    assert_eq!(
        cache.index_keys(POOL, "q").unwrap(),
        [ObjectKey::new("default", "b"), ObjectKey::new("default", "c")]
    );
    assert_consistent(&cache);
}

#[test]
fn an_index_added_late_files_what_is_cached_and_names_are_unique() {
    let cache = Cache::default();
    cache.apply(object("a", 1, Some("p"), &[]));
    cache.apply(object("b", 2, None, &[]));
    cache.add_index(POOL, pool_of).unwrap();
    assert_eq!(names(&cache.by_index(POOL, "p").unwrap()), ["a"]);
    assert_eq!(cache.add_index(POOL, pool_of), Err(CacheError::IndexExists(POOL)));
    assert_eq!(cache.by_index("nope", "p"), Err(CacheError::NoIndex("nope".into())));
    assert!(cache.index_values("nope").is_err());
    assert_consistent(&cache);
}

#[test]
fn windows_and_whole_indexes() {
    let cache = indexed_cache();
    for (i, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
        cache.apply(object(name, i as u64 + 1, Some("p"), &["x", "y"]));
    }
    let window = cache
        .with_index(POOL, "p", |found| {
            assert_eq!(found.len(), 4);
            found.iter().cycle().skip(3).take(2).cloned().collect::<Vec<_>>()
        })
        .unwrap();
    assert_eq!(names(&window), ["d", "a"]);
    assert!(cache.with_index(POOL, "none", |found| found.is_empty()).unwrap());
    // Filed under two values, listed once.
    assert_eq!(names(&cache.indexed(TAGS).unwrap()), ["a", "b", "c", "d"]);
}

#[test]
fn older_versions_never_replace_newer_ones() {
    let cache = indexed_cache();
    assert!(cache.apply(object("a", 5, Some("p"), &[])).is_some());
    // The caller's own write (7) lands before the watch's 6.
    assert!(cache.apply(object("a", 7, Some("q"), &[])).is_some());
    assert!(cache.apply(object("a", 6, Some("p"), &[])).is_none());
    assert!(cache.apply(object("a", 7, Some("q"), &[])).is_none(), "the echo is no change");
    assert_eq!(names(&cache.by_index(POOL, "q").unwrap()), ["a"]);
    // A removal of an older version (the object was recreated meanwhile) is ignored.
    assert!(cache.remove_observed(object("a", 6, None, &[])).is_none());
    assert!(cache.remove_observed(object("a", 8, None, &[])).is_some());
    assert!(cache.is_empty());

    // Opaque versions: only the very version held is ignored.
    let opaque = |rv: &str| {
        let mut map = (*object("o", 1, None, &[])).clone();
        map.metadata.resource_version = Some(rv.into());
        Arc::new(map)
    };
    assert!(cache.apply(opaque("x")).is_some());
    assert!(cache.apply(opaque("x")).is_none());
    assert!(cache.apply(opaque("w")).is_some());
    assert_consistent(&cache);
}

#[test]
fn a_deleted_object_stays_gone_until_something_newer_arrives() {
    let cache = indexed_cache();
    cache.apply(object("a", 7, Some("p"), &[]));
    let deleted = cache.delete(&object("a", 8, Some("p"), &[]));
    let deleted = deleted.map(|c| c.latest().metadata.resource_version.clone());
    assert_eq!(deleted, Some(Some("7".into())), "the last cached state");
    assert!(
        cache.apply(object("a", 8, Some("p"), &[])).is_none(),
        "a late event of the deleted version"
    );
    assert!(cache.by_index(POOL, "p").unwrap().is_empty());
    assert!(cache.apply(object("a", 9, Some("p"), &[])).is_some(), "recreated");
    assert_eq!(names(&cache.by_index(POOL, "p").unwrap()), ["a"]);

    // The watch's report of the deletion clears the tombstone.
    cache.delete(&object("a", 10, None, &[]));
    assert!(cache.remove_observed(object("a", 10, None, &[])).is_none());
    assert!(cache.apply(object("a", 3, None, &[])).is_some());
}

#[test]
fn a_list_reports_what_differs_and_keeps_tombstones_of_listed_objects_only() {
    let cache = indexed_cache();
    cache.apply(object("a", 1, Some("p"), &[]));
    cache.apply(object("b", 2, Some("p"), &[]));
    cache.apply(object("c", 3, Some("p"), &[]));
    cache.delete(&object("c", 3, None, &[]));
    cache.delete(&object("z", 3, None, &[]));
    let changes = cache.replace(vec![
        object("a", 1, Some("p"), &[]),
        object("b", 4, Some("q"), &[]),
        object("c", 3, Some("p"), &[]),
    ]);
    let described: Vec<String> = changes
        .iter()
        .map(|c| match c {
            Change::Applied { new, .. } => {
                format!("applied {}", new.metadata.name.as_deref().unwrap())
            }
            Change::Deleted(old) => format!("deleted {}", old.metadata.name.as_deref().unwrap()),
        })
        .collect();
    // `a` unchanged, `c` still fenced (the list raced its deletion).
    assert_eq!(described, ["applied b"]);
    assert_eq!(names(&cache.by_index(POOL, "p").unwrap()), ["a"]);
    assert_eq!(names(&cache.by_index(POOL, "q").unwrap()), ["b"]);
    // `z`'s tombstone went with the list that no longer shows it.
    assert!(cache.apply(object("z", 2, None, &[])).is_some());
    let changes = cache.replace(vec![object("a", 1, Some("p"), &[])]);
    assert_eq!(changes.len(), 2, "b and z deleted: {changes:?}");
    assert_consistent(&cache);
}

#[test]
fn indexes_agree_with_the_objects_under_concurrent_changes() {
    let cache = indexed_cache();
    let stop = Arc::new(AtomicBool::new(false));
    let pools = ["p0", "p1", "p2"];
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let cache = cache.clone();
            std::thread::spawn(move || {
                for i in 0..2_000u64 {
                    let name = format!("w{w}-{}", i % 17);
                    let rv = i + 1;
                    if i % 7 == 0 {
                        cache.delete(&object(&name, rv, None, &[]));
                    } else {
                        let pool = pools[((i * 31 + w) % 3) as usize];
                        let tags: &[&str] = if i % 2 == 0 { &["x"] } else { &["x", "y"] };
                        cache.apply(object(&name, rv, Some(pool), tags));
                    }
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (cache, stop) = (cache.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut checks = 0u64;
                while !stop.load(Ordering::Relaxed) || checks == 0 {
                    for pool in pools {
                        // Whatever a lookup returns is filed under the value it was asked for.
                        for obj in cache.by_index(POOL, pool).unwrap() {
                            assert_eq!(pool_of(&obj), [pool]);
                        }
                    }
                    let tagged = cache.by_index(TAGS, "x").unwrap();
                    let both = cache.with_index(TAGS, "y", |found| found.len()).unwrap();
                    assert!(both <= cache.len() + tagged.len());
                    checks += 1;
                }
                checks
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        assert!(reader.join().unwrap() > 0);
    }
    assert_consistent(&cache);
    let scanned: usize = pools.iter().map(|p| cache.filter(|o| pool_of(o) == [*p]).len()).sum();
    let indexed: usize = pools.iter().map(|p| cache.by_index(POOL, p).unwrap().len()).sum();
    assert_eq!(indexed, scanned);
}

#[derive(Debug, Clone)]
enum Op {
    Apply { name: u8, pool: Option<u8>, tags: Vec<u8>, bump: u8 },
    Delete { name: u8 },
    Observed { name: u8, bump: u8 },
    List { keep: Vec<bool> },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6u8, proptest::option::of(0..3u8), proptest::collection::vec(0..3u8, 0..3), 0..3u8)
            .prop_map(|(name, pool, tags, bump)| Op::Apply { name, pool, tags, bump }),
        1 => (0..6u8).prop_map(|name| Op::Delete { name }),
        1 => (0..6u8, 0..3u8).prop_map(|(name, bump)| Op::Observed { name, bump }),
        1 => proptest::collection::vec(any::<bool>(), 6).prop_map(|keep| Op::List { keep }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// After any sequence of applies, deletes, watch removals and relists, with versions that
    /// move forward and back, every index agrees with a scan of the objects.
    #[test]
    fn indexes_agree_with_a_scan_after_any_sequence(ops in proptest::collection::vec(op(), 1..60)) {
        let cache = indexed_cache();
        let mut rv = 10u64;
        for op in ops {
            match op {
                Op::Apply { name, pool, tags, bump } => {
                    rv += 1;
                    let pool = pool.map(|p| format!("p{p}"));
                    let tags: Vec<String> = tags.iter().map(|t| format!("t{t}")).collect();
                    let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
                    let name = format!("o{name}");
                    cache.apply(object(&name, rv - u64::from(bump), pool.as_deref(), &tags));
                }
                Op::Delete { name } => {
                    rv += 1;
                    cache.delete(&object(&format!("o{name}"), rv, None, &[]));
                }
                Op::Observed { name, bump } => {
                    rv += 1;
                    let name = format!("o{name}");
                    cache.remove_observed(object(&name, rv - u64::from(bump), None, &[]));
                }
                Op::List { keep } => {
                    let listed = cache
                        .list()
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| keep.get(*i).copied().unwrap_or(true))
                        .map(|(_, o)| o)
                        .collect();
                    cache.replace(listed);
                }
            }
            assert_consistent(&cache);
        }
    }
}
