//! A Website's Deployment and Service, written with k8s-openapi's types (the
//! feature `json` builds children_json.rs instead).

use super::*; // variant switch
use k8s_openapi::api::apps::v1::DeploymentSpec;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, PodSpec, PodTemplateSpec, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kinformer_controllers::apply;
use std::collections::BTreeMap;

pub async fn serve(website: &Website, client: &Client) -> Result<Action, ReconcileError> {
    let (name, ns) = (website.name_any(), website.namespace().unwrap_or_default());
    let labels = Some(BTreeMap::from([("app".to_owned(), name.clone())]));
    let metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(ns.clone()),
        owner_references: website.controller_owner_ref(&()).map(|owner| vec![owner]),
        ..Default::default()
    };
    let container = Container {
        name: "web".into(),
        image: Some(website.spec.image.clone()),
        ports: Some(vec![ContainerPort {
            container_port: 80,
            ..Default::default()
        }]),
        env: Some(vec![EnvVar {
            name: "WEBSITE_HOST".into(),
            value: Some(website.spec.host.clone()),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let deployment = Deployment {
        metadata: metadata.clone(),
        spec: DeploymentSpec {
            replicas: Some(website.spec.replicas),
            selector: LabelSelector {
                match_labels: labels.clone(),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: labels.clone(),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    ..Default::default()
                }),
            },
            ..Default::default()
        },
        ..Default::default()
    };
    let deployment = apply(client, MANAGER, &deployment).await?;
    let service = Service {
        metadata,
        spec: Some(ServiceSpec {
            selector: labels,
            ports: Some(vec![ServicePort {
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    apply(client, MANAGER, &service).await?;
    let ready_replicas = deployment
        .status
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    apply_status(client, MANAGER, website, &WebsiteStatus { ready_replicas }).await?;
    Ok(Action::Done)
}
