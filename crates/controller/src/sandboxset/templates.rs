//! A pool's materialised SandboxTemplates (reference: `template_materialize.go`).
//!
//! # Expected flow
//!
//! 1. A pool with an inline `spec.template` has its effective template
//!    ([`crate::revision::effective_template`]) kept as a SandboxTemplate named
//!    `<set>-<revision>` ([`materialized_name`]), controlled by the pool (ownerReference with
//!    `controller: true`, `blockOwnerDeletion: false`, so deleting the pool never waits on
//!    it). Its name is the pool's `status.currentRevision`. A pool with `templateRef` has
//!    none.
//! 2. Of the templates the pool controls, all but the newest
//!    [`TEMPLATE_HISTORY_LIMIT`] (by `creationTimestamp`) are annotated
//!    `agents.kruise.io/cleanup-candidate: "true"`.
//! 3. **oka only:** a template already marked, that is not the current revision's and that no
//!    listed sandbox of the pool names in `spec.templateRef`, is deleted.
//!
//! # Where this differs from the reference, and why
//!
//! The reference marks candidates for a garbage collector it does not have, so they pile up
//! (one per template edit, forever). oka deletes a candidate on the pass after it marked it,
//! when nothing of the pool refers to it: members created from an inline template carry the
//! template inline, so a materialised template is a record of a revision, not something a
//! sandbox runs from. The marking step is kept, so a tool that looks for the annotation sees
//! what it would see with the reference.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use oka_api::{Sandbox, SandboxSet, SandboxTemplate, annotations, labels};

use crate::revision::effective_template;

/// How many materialised templates a pool keeps unmarked (the reference's
/// `defaultTemplateHistoryLimit`).
pub const TEMPLATE_HISTORY_LIMIT: usize = 10;

/// The name of the SandboxTemplate that materialises revision `revision` of pool `set`.
pub fn materialized_name(set: &str, revision: &str) -> String {
    format!("{set}-{revision}")
}

/// One write to a pool's templates.
#[derive(Debug, Clone, PartialEq)]
pub enum TemplateAction {
    /// Create this template (the current revision's).
    Create(Box<SandboxTemplate>),
    /// Annotate this template `agents.kruise.io/cleanup-candidate: "true"`.
    MarkCleanupCandidate(Arc<SandboxTemplate>),
    /// Delete this marked template.
    Delete(Arc<SandboxTemplate>),
}

/// Whether `template` is controlled by the pool with uid `uid`.
pub fn is_owned_by(template: &SandboxTemplate, uid: &str) -> bool {
    template
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == uid)
}

/// Plans the templates of pool `set` at `revision`: `templates` are the SandboxTemplates of
/// its namespace (others than the pool's are ignored), `sandboxes` the pool's listed
/// sandboxes. See the [module documentation](self).
pub fn plan_templates(
    set: &SandboxSet,
    revision: &str,
    templates: &[Arc<SandboxTemplate>],
    sandboxes: &[Arc<Sandbox>],
) -> Vec<TemplateAction> {
    let (Some(uid), Some(name)) = (set.metadata.uid.as_deref(), set.metadata.name.as_deref())
    else {
        return Vec::new();
    };
    if set.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let mut owned: Vec<&Arc<SandboxTemplate>> =
        templates.iter().filter(|t| is_owned_by(t, uid)).collect();
    let mut actions = Vec::new();
    let current = materialized_name(name, revision);
    if set.spec.template.is_some()
        && !templates.iter().any(|t| t.metadata.name.as_deref() == Some(current.as_str()))
    {
        let mut owner = super::pool_owner_reference(set);
        owner.block_owner_deletion = Some(false);
        let template = SandboxTemplate {
            metadata: ObjectMeta {
                name: Some(current.clone()),
                namespace: set.metadata.namespace.clone(),
                labels: Some(BTreeMap::from([(labels::SANDBOX_POOL.to_owned(), name.to_owned())])),
                owner_references: Some(vec![owner]),
                ..ObjectMeta::default()
            },
            spec: effective_template(&set.spec, None),
        };
        actions.push(TemplateAction::Create(Box::new(template)));
    }
    owned.sort_by_key(|t| {
        (t.metadata.creation_timestamp.as_ref().map(|time| time.0), t.metadata.name.clone())
    });
    let is_marked = |t: &SandboxTemplate| {
        t.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::CLEANUP_CANDIDATE))
            .is_some_and(|v| !v.is_empty())
    };
    let referenced = |t: &SandboxTemplate| {
        sandboxes
            .iter()
            .any(|s| s.spec.template_ref.as_ref().map(|r| &r.name) == t.metadata.name.as_ref())
    };
    let stale = owned.len().saturating_sub(TEMPLATE_HISTORY_LIMIT);
    for template in owned.iter().take(stale) {
        if template.metadata.name.as_deref() == Some(current.as_str()) {
            continue;
        }
        if !is_marked(template) {
            actions.push(TemplateAction::MarkCleanupCandidate(Arc::clone(template)));
        } else if !referenced(template) {
            actions.push(TemplateAction::Delete(Arc::clone(template)));
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;
    use k8s_openapi::api::core::v1::PodTemplateSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use oka_api::SandboxSetSpec;

    use super::*;

    fn pool() -> SandboxSet {
        let mut set = SandboxSet::new(
            "pool",
            SandboxSetSpec {
                replicas: 1,
                template: Some(PodTemplateSpec::default()),
                ..Default::default()
            },
        );
        set.metadata.namespace = Some("default".into());
        set.metadata.uid = Some("pool-uid".into());
        set
    }

    fn owned(name: &str, second: i64, marked: bool) -> Arc<SandboxTemplate> {
        let mut owner = super::super::pool_owner_reference(&pool());
        owner.block_owner_deletion = Some(false);
        let mut template = SandboxTemplate::new(name, Default::default());
        template.metadata.owner_references = Some(vec![owner]);
        template.metadata.creation_timestamp =
            Some(Time(Timestamp::from_second(1_700_000_000 + second).expect("valid")));
        if marked {
            template.metadata.annotations = Some(BTreeMap::from([(
                annotations::CLEANUP_CANDIDATE.to_owned(),
                labels::TRUE.to_owned(),
            )]));
        }
        Arc::new(template)
    }

    #[test]
    fn an_inline_template_is_materialised_once_owned_by_the_pool() {
        let set = pool();
        let actions = plan_templates(&set, "abc", &[], &[]);
        let [TemplateAction::Create(template)] = actions.as_slice() else { panic!("{actions:?}") };
        assert_eq!(template.metadata.name.as_deref(), Some("pool-abc"));
        let owner = &template.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!((owner.controller, owner.block_owner_deletion), (Some(true), Some(false)));
        assert_eq!(owner.uid, "pool-uid");
        assert_eq!(template.spec.template, set.spec.template);
        let existing = vec![Arc::new((**template).clone())];
        assert!(plan_templates(&set, "abc", &existing, &[]).is_empty());
    }

    #[test]
    fn a_template_ref_pool_materialises_nothing() {
        let mut set = pool();
        set.spec.template = None;
        set.spec.template_ref =
            Some(oka_api::common::SandboxTemplateRef { name: "base".into(), ..Default::default() });
        assert!(plan_templates(&set, "abc", &[], &[]).is_empty());
    }

    #[test]
    fn templates_beyond_the_newest_ten_are_marked_then_deleted() {
        let set = pool();
        let mut templates: Vec<_> =
            (0..12).map(|i| owned(&format!("pool-r{i:02}"), i, false)).collect();
        templates.push(owned("pool-current", 100, false));
        let actions = plan_templates(&set, "current", &templates, &[]);
        let marked: Vec<_> = actions
            .iter()
            .map(|a| match a {
                TemplateAction::MarkCleanupCandidate(t) => t.metadata.name.clone().unwrap(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(marked, ["pool-r00", "pool-r01", "pool-r02"]);
        // Once marked, a candidate no sandbox refers to is deleted; one that is referred to
        // stays.
        templates[0] = owned("pool-r00", 0, true);
        templates[1] = owned("pool-r01", 1, true);
        let mut user = Sandbox::default();
        user.spec.template_ref = Some(oka_api::common::SandboxTemplateRef {
            name: "pool-r01".into(),
            ..Default::default()
        });
        let actions = plan_templates(&set, "current", &templates, &[Arc::new(user)]);
        assert!(
            matches!(&actions[0], TemplateAction::Delete(t) if t.metadata.name.as_deref() == Some("pool-r00"))
        );
        assert!(
            matches!(&actions[1], TemplateAction::MarkCleanupCandidate(t) if t.metadata.name.as_deref() == Some("pool-r02"))
        );
        assert_eq!(actions.len(), 2);
    }

    #[test]
    fn another_pools_templates_are_never_touched() {
        let set = pool();
        let mut templates: Vec<_> =
            (0..12).map(|i| owned(&format!("pool-r{i:02}"), i, true)).collect();
        for template in &mut templates {
            let mut other = (**template).clone();
            other.metadata.owner_references.as_mut().expect("owned")[0].uid = "other".into();
            *template = Arc::new(other);
        }
        templates.push(owned("pool-current", 100, false));
        assert!(plan_templates(&set, "current", &templates, &[]).is_empty());
    }
}
