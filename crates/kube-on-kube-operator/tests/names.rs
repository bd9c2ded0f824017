//! Names and ownership against the real API server: an object whose name a
//! Cluster needs but that another owner controls (another Cluster's, a
//! tenant's own) is left exactly as it was and the Cluster says so; and a
//! derived object the API server refuses (here: a ValidatingAdmissionPolicy
//! of the namespace) shows the API server's message on the Cluster.

use kok_test_support as common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{context, event_notes, kwok_cluster};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kok_testenv::kube_env::KubeEnv;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Client, Resource, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{ClusterMode, READY};
use kube_on_kube_operator::config::Config;
use kube_on_kube_operator::context::{Context, MANAGER};
use kube_on_kube_operator::controller::reconcile;
use kube_on_kube_operator::refused::{NAME_CONFLICT, OBJECT_REJECTED, RECHECK};
use serde_json::json;

/// Create `name` and run one reconcile of it; the Cluster as it is then.
async fn create_and_reconcile(
    ctx: &Arc<Context>,
    clusters: &Api<Cluster>,
    namespace: &str,
    name: &str,
) -> (Action, Cluster) {
    clusters
        .create(
            &PostParams::default(),
            &kwok_cluster(ClusterMode::Minimal, namespace, name),
        )
        .await
        .expect("create cluster");
    reconcile_once(ctx, clusters, name).await
}

async fn reconcile_once(
    ctx: &Arc<Context>,
    clusters: &Api<Cluster>,
    name: &str,
) -> (Action, Cluster) {
    let live = clusters.get(name).await.expect("get cluster");
    let action = reconcile(Arc::new(live), ctx.clone())
        .await
        .expect("a refusal is reported, not returned");
    (action, clusters.get(name).await.expect("get cluster"))
}

fn ready(c: &Cluster) -> (String, String, String) {
    let r = c
        .status
        .as_ref()
        .and_then(|s| s.condition(READY))
        .unwrap_or_else(|| panic!("no Ready condition: {:?}", c.status));
    (r.status.clone(), r.reason.clone(), r.message.clone())
}

/// resourceVersion of every Secret, Service and ConfigMap of the namespace
/// (the kinds nothing but the operator changes here).
async fn snapshot(client: &Client, namespace: &str) -> BTreeMap<String, String> {
    async fn of<K>(client: &Client, namespace: &str, out: &mut BTreeMap<String, String>)
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        for o in Api::<K>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .expect("list")
        {
            out.insert(
                format!("{} {}", K::kind(&()), o.name_any()),
                o.resource_version().unwrap_or_default(),
            );
        }
    }
    let mut out = BTreeMap::new();
    of::<Secret>(client, namespace, &mut out).await;
    of::<Service>(client, namespace, &mut out).await;
    of::<ConfigMap>(client, namespace, &mut out).await;
    out
}

/// Cluster `x` meets, under names it needs, a Secret another Cluster
/// controls (as `x-etcd-ca` of a Cluster `x-etcd`, which the CRD now
/// refuses, would be) and Cluster `z` a Service nobody controls: neither is
/// written, each Cluster is `Ready=False` with `NameConflict` naming the
/// object and its owner, with a Warning Event, and nothing that existed
/// before changed. Once the other object is gone, `x` converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_owners_object_is_left_alone_and_reported() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("names-conflict").await;
    let ctx = context(&client, Config::default());
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);

    // The other Cluster, converged one pass, and its object under x's name.
    let (_, other) = create_and_reconcile(&ctx, &clusters, &ns, "other").await;
    let owner = other.controller_owner_ref(&()).expect("owner reference");
    let taken: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": "x-etcd-ca",
            "labels": {"kubeonkube.io/cluster": "other"},
            "ownerReferences": [owner],
        },
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": "b3RoZXI=", "tls.key": "b3RoZXI=", "ca.crt": "b3RoZXI="},
    }))
    .expect("secret");
    // Written as the operator writes its own (server-side apply with its
    // field manager), so nothing but the check keeps an apply for x from
    // taking it over.
    secrets
        .patch(
            "x-etcd-ca",
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&taken),
        )
        .await
        .expect("apply the other's secret");
    let unowned: Service = serde_json::from_value(json!({
        "metadata": {"name": "z-apiserver", "labels": {"app": "mine"}},
        "spec": {"ports": [{"port": 8443}], "selector": {"app": "mine"}},
    }))
    .expect("service");
    services
        .create(&PostParams::default(), &unowned)
        .await
        .expect("create the tenant's service");
    let before = snapshot(&client, &ns).await;

    let (action, x) = create_and_reconcile(&ctx, &clusters, &ns, "x").await;
    assert_eq!(action, Action::requeue(RECHECK));
    let (status, reason, message) = ready(&x);
    assert_eq!((status.as_str(), reason.as_str()), ("False", NAME_CONFLICT));
    assert!(
        message.contains("Secret x-etcd-ca") && message.contains("Cluster other"),
        "{message}"
    );
    let notes = event_notes(&client, &ns, "x", NAME_CONFLICT).await;
    assert!(
        notes.iter().any(|n| n.contains("x-etcd-ca")),
        "no NameConflict Event: {notes:?}"
    );

    let (action, z) = create_and_reconcile(&ctx, &clusters, &ns, "z").await;
    assert_eq!(action, Action::requeue(RECHECK));
    let (status, reason, message) = ready(&z);
    assert_eq!((status.as_str(), reason.as_str()), ("False", NAME_CONFLICT));
    assert!(
        message.contains("Service z-apiserver") && message.contains("no controller"),
        "{message}"
    );

    // Again, as the operator would later: still nothing changed.
    reconcile_once(&ctx, &clusters, "x").await;
    reconcile_once(&ctx, &clusters, "z").await;
    let after = snapshot(&client, &ns).await;
    let changed: Vec<_> = before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(*v))
        .collect();
    assert!(changed.is_empty(), "changed or gone: {changed:?}");
    let kept = secrets.get("x-etcd-ca").await.expect("the other's secret");
    assert_eq!(
        kept.labels()
            .get("kubeonkube.io/cluster")
            .map(String::as_str),
        Some("other")
    );
    assert_eq!(kept.owner_references(), taken.owner_references());
    assert_eq!(kept.data, taken.data);

    // The other object gone, x takes the name and moves on.
    secrets
        .delete("x-etcd-ca", &DeleteParams::default())
        .await
        .expect("delete");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, x) = reconcile_once(&ctx, &clusters, "x").await;
        if ready(&x).1 != NAME_CONFLICT {
            break;
        }
        assert!(Instant::now() < deadline, "x still reports {:?}", ready(&x));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ca = secrets.get("x-etcd-ca").await.expect("x's etcd CA");
    assert_eq!(
        ca.owner_references().first().map(|o| o.uid.clone()),
        clusters.get("x").await.expect("x").uid()
    );
}

/// A derived object the API server refuses (a ValidatingAdmissionPolicy
/// bound to the namespace denies the external apiserver Service) shows the
/// API server's message in the Cluster's status and an Event, and the
/// Cluster waits [`RECHECK`] rather than retrying at once; once the policy
/// is unbound, the next pass creates the Service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_object_reaches_the_clusters_status() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("names-refused").await;
    let ctx = context(&client, Config::default());
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let denial = "external apiserver Services are not allowed in this namespace";
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": ns},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["services"],
            }]},
            "validations": [{
                "expression": "!object.metadata.name.endsWith('-apiserver-external')",
                "message": denial,
            }],
        },
    }))
    .expect("policy");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": ns},
        "spec": {
            "policyName": ns,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": ns},
            }},
        },
    }))
    .expect("binding");
    policies
        .create(&PostParams::default(), &policy)
        .await
        .expect("create policy");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("create binding");

    // The policy takes effect once the API server has loaded it.
    let probe = |name: &str| -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"ports": [{"port": 443}]},
        }))
        .expect("service")
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match services
            .create(&PostParams::default(), &probe("probe-apiserver-external"))
            .await
        {
            Err(kube::Error::Api(e)) if e.message.contains(denial) => break,
            Ok(_) => {
                let _ = services
                    .delete("probe-apiserver-external", &DeleteParams::default())
                    .await;
            }
            Err(e) => panic!("probe: {e}"),
        }
        assert!(Instant::now() < deadline, "the policy never denied");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let (action, r) = create_and_reconcile(&ctx, &clusters, &ns, "r").await;
    assert_eq!(action, Action::requeue(RECHECK), "waits, no hot loop");
    let (status, reason, message) = ready(&r);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", OBJECT_REJECTED)
    );
    assert!(
        message.contains("Service r-apiserver-external") && message.contains(denial),
        "{message}"
    );
    let notes = event_notes(&client, &ns, "r", OBJECT_REJECTED).await;
    assert!(
        notes.iter().any(|n| n.contains(denial)),
        "no ObjectRejected Event: {notes:?}"
    );

    // Unbound, the next pass goes on.
    bindings
        .delete(&ns, &DeleteParams::default())
        .await
        .expect("delete binding");
    policies
        .delete(&ns, &DeleteParams::default())
        .await
        .expect("delete policy");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, r) = reconcile_once(&ctx, &clusters, "r").await;
        if ready(&r).1 != OBJECT_REJECTED {
            break;
        }
        assert!(Instant::now() < deadline, "r still reports {:?}", ready(&r));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    services
        .get("r-apiserver-external")
        .await
        .expect("the external Service exists");
}
