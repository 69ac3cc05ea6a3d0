//! Image garbage collection's rule, pure (the kubelet's image GC idea): images in use are
//! kept; images unused for longer than `max_unused_age` go; then, while the store is over its
//! byte budget, images unused for at least `min_age` go, least recently used first; layers no
//! remaining image references go with them. The store's `gc` applies the plan.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// When images are removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcPolicy {
    /// An image used (pulled or reported in use) more recently than this is never removed.
    pub min_age: Duration,
    /// The store's size (unpacked layers, bytes) GC brings it under, removing images.
    pub max_bytes: u64,
    /// Images unused for longer than this are removed whatever the store's size.
    pub max_unused_age: Option<Duration>,
}

impl Default for GcPolicy {
    /// The kubelet's minimum age (2 minutes), no byte budget and no maximum age: only what no
    /// image references is removed.
    fn default() -> Self {
        GcPolicy { min_age: Duration::from_secs(120), max_bytes: u64::MAX, max_unused_age: None }
    }
}

/// What a GC removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Manifest digests of the removed images.
    pub removed_images: Vec<String>,
    /// Diff ids of the removed layers.
    pub removed_layers: Vec<String>,
    /// Bytes freed (unpacked layer content and blobs).
    pub freed_bytes: u64,
    /// The store's size afterwards.
    pub remaining_bytes: u64,
}

/// One image as GC sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcImage {
    /// Manifest digest.
    pub digest: String,
    /// Seconds since the epoch it was last pulled or reported in use.
    pub last_used: u64,
    /// Its layers' keys.
    pub layers: Vec<String>,
}

/// What to remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcPlan {
    /// Images, in removal order.
    pub images: Vec<String>,
    /// Layers no remaining image references.
    pub layers: Vec<String>,
}

/// Plans a GC over `images` and the `layers` on disk (key → bytes) at `now` (epoch seconds).
pub fn plan_gc(
    images: &[GcImage],
    layers: &BTreeMap<String, u64>,
    in_use: &BTreeSet<String>,
    policy: &GcPolicy,
    now: u64,
) -> GcPlan {
    let age = |image: &GcImage| now.saturating_sub(image.last_used);
    let mut candidates: Vec<&GcImage> = images
        .iter()
        .filter(|image| !in_use.contains(&image.digest) && age(image) >= policy.min_age.as_secs())
        .collect();
    candidates.sort_by_key(|image| (image.last_used, image.digest.clone()));
    let mut removed: BTreeSet<&str> = BTreeSet::new();
    if let Some(max) = policy.max_unused_age {
        for image in &candidates {
            if age(image) > max.as_secs() {
                removed.insert(&image.digest);
            }
        }
    }
    let referenced = |removed: &BTreeSet<&str>| -> BTreeSet<&str> {
        images
            .iter()
            .filter(|image| !removed.contains(image.digest.as_str()))
            .flat_map(|image| image.layers.iter().map(String::as_str))
            .collect()
    };
    let size_of =
        |keep: &BTreeSet<&str>| -> u64 { keep.iter().filter_map(|key| layers.get(*key)).sum() };
    for image in &candidates {
        if size_of(&referenced(&removed)) <= policy.max_bytes {
            break;
        }
        removed.insert(&image.digest);
    }
    let keep = referenced(&removed);
    GcPlan {
        images: candidates
            .iter()
            .filter(|i| removed.contains(i.digest.as_str()))
            .map(|i| i.digest.clone())
            .collect(),
        layers: layers.keys().filter(|key| !keep.contains(key.as_str())).cloned().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(digest: &str, last_used: u64, layers: &[&str]) -> GcImage {
        GcImage {
            digest: digest.into(),
            last_used,
            layers: layers.iter().map(|l| l.to_string()).collect(),
        }
    }

    #[test]
    fn removes_least_recently_used_until_under_budget_keeping_in_use_and_young() {
        let images = [
            image("old", 100, &["base", "a"]),
            image("older", 50, &["base", "b"]),
            image("used", 10, &["base", "c"]),
            image("young", 990, &["d"]),
        ];
        let layers = BTreeMap::from([
            ("base".to_string(), 100),
            ("a".to_string(), 10),
            ("b".to_string(), 20),
            ("c".to_string(), 30),
            ("d".to_string(), 40),
            ("orphan".to_string(), 5),
        ]);
        let in_use = BTreeSet::from(["used".to_string()]);
        let policy = |max_bytes| GcPolicy {
            min_age: Duration::from_secs(60),
            max_bytes,
            max_unused_age: None,
        };
        // Under budget: only the orphan layer goes.
        let plan = plan_gc(&images, &layers, &in_use, &policy(1000), 1000);
        assert_eq!(plan, GcPlan { images: vec![], layers: vec!["orphan".into()] });
        // 200 bytes referenced; budget 185: the least recently used unused image goes first.
        let plan = plan_gc(&images, &layers, &in_use, &policy(185), 1000);
        assert_eq!(plan.images, ["older"]);
        assert_eq!(plan.layers, ["b", "orphan"]);
        // A budget nothing can meet: every old unused image, never the used or the young one.
        let plan = plan_gc(&images, &layers, &in_use, &policy(0), 1000);
        assert_eq!(plan.images, ["older", "old"]);
        assert_eq!(plan.layers, ["a", "b", "orphan"]);
        // Maximum unused age, whatever the budget.
        let aged = GcPolicy { max_unused_age: Some(Duration::from_secs(920)), ..policy(u64::MAX) };
        assert_eq!(plan_gc(&images, &layers, &in_use, &aged, 1000).images, ["older"]);
    }
}
