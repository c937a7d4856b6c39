//! Ready-made event filters, controller-runtime's predicates, for
//! [`ControllerBuilder::with_event_filter`](crate::ControllerBuilder::with_event_filter)
//! and [`ControllerOptions::event_filter`](crate::ControllerOptions::event_filter).
//!
//! Each filters updates only: an add or a delete always passes, as in
//! controller-runtime, so a controller never misses an object appearing or
//! going away. Filters added to one builder must all pass ([`all`]); use
//! [`any`] for "either changed".

use kube_client::Resource;

use crate::Event;

/// Updates pass when `metadata.generation` changed: the spec changed, not
/// only the status or metadata (controller-runtime's
/// `GenerationChangedPredicate`). Resyncs never pass.
pub fn generation_changed<K: Resource>(event: Event<'_, K>) -> bool {
    match event {
        Event::Update { old, new } => old.meta().generation != new.meta().generation,
        _ => true,
    }
}

/// Updates pass when the labels changed (`LabelChangedPredicate`).
pub fn labels_changed<K: Resource>(event: Event<'_, K>) -> bool {
    match event {
        Event::Update { old, new } => old.meta().labels != new.meta().labels,
        _ => true,
    }
}

/// Updates pass when the annotations changed (`AnnotationChangedPredicate`).
pub fn annotations_changed<K: Resource>(event: Event<'_, K>) -> bool {
    match event {
        Event::Update { old, new } => old.meta().annotations != new.meta().annotations,
        _ => true,
    }
}

/// Updates pass when the resource version changed: every real change, but
/// not the periodic resyncs (`ResourceVersionChangedPredicate`).
pub fn resource_version_changed<K: Resource>(event: Event<'_, K>) -> bool {
    match event {
        Event::Update { old, new } => old.meta().resource_version != new.meta().resource_version,
        _ => true,
    }
}

/// Passes when any of `filters` passes.
pub fn any<K: Resource + 'static>(
    filters: impl IntoIterator<Item = fn(Event<'_, K>) -> bool>,
) -> impl Fn(Event<'_, K>) -> bool + Send + Sync + 'static {
    let filters: Vec<_> = filters.into_iter().collect();
    move |event| filters.iter().any(|f| f(event))
}

/// Passes when every one of `filters` passes.
pub fn all<K: Resource + 'static>(
    filters: impl IntoIterator<Item = fn(Event<'_, K>) -> bool>,
) -> impl Fn(Event<'_, K>) -> bool + Send + Sync + 'static {
    let filters: Vec<_> = filters.into_iter().collect();
    move |event| filters.iter().all(|f| f(event))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kinformer_store::ObjectOrTombstone;

    use super::*;

    fn cm(generation: i64, rv: &str, label: &str, annotation: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some("a".into());
        c.metadata.generation = Some(generation);
        c.metadata.resource_version = Some(rv.into());
        c.metadata.labels = Some(BTreeMap::from([("l".into(), label.into())]));
        c.metadata.annotations = Some(BTreeMap::from([("a".into(), annotation.into())]));
        c
    }

    fn update(f: fn(Event<'_, ConfigMap>) -> bool, old: &ConfigMap, new: &ConfigMap) -> bool {
        f(Event::Update { old, new })
    }

    #[test]
    fn each_predicate_passes_only_updates_that_change_its_field() {
        let base = cm(1, "10", "x", "y");
        let status_only = cm(1, "11", "x", "y");
        let spec = cm(2, "12", "x", "y");
        let labels = cm(1, "13", "z", "y");
        let annotations = cm(1, "14", "x", "z");
        assert!(!update(generation_changed, &base, &status_only));
        assert!(update(generation_changed, &base, &spec));
        assert!(!update(labels_changed, &base, &annotations));
        assert!(update(labels_changed, &base, &labels));
        assert!(!update(annotations_changed, &base, &labels));
        assert!(update(annotations_changed, &base, &annotations));
        assert!(!update(resource_version_changed, &base, &base.clone()));
        assert!(update(resource_version_changed, &base, &status_only));
    }

    #[test]
    fn adds_and_deletes_always_pass() {
        let base = cm(1, "10", "x", "y");
        let gone = ObjectOrTombstone::Object(std::sync::Arc::new(base.clone()));
        for f in [
            generation_changed,
            labels_changed,
            annotations_changed,
            resource_version_changed,
        ] as [fn(Event<'_, ConfigMap>) -> bool; 4]
        {
            assert!(f(Event::Add(&base)));
            assert!(f(Event::Delete(&gone)));
        }
    }

    #[test]
    fn any_and_all_combine() {
        let base = cm(1, "10", "x", "y");
        let labels = cm(1, "13", "z", "y");
        let either = any([generation_changed, labels_changed]);
        let both = all([generation_changed, labels_changed]);
        assert!(either(Event::Update {
            old: &base,
            new: &labels
        }));
        assert!(!both(Event::Update {
            old: &base,
            new: &labels
        }));
    }
}
