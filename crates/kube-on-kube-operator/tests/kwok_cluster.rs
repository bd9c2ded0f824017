//! The Cluster controller against the real API server, with kwok standing in
//! for the nodes (Pods become Running and Ready without running anything): the
//! objects it owns appear with owner references, status reports every
//! component, and deleting the Cluster garbage-collects everything.

use kok_test_support as common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{condition, context, kwok_cluster};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use kok_testenv::kube_env::KubeEnv;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube_on_kube_api::cluster::ClusterMode;
use kube_on_kube_api::{Cluster, ClusterStatus};
use kube_on_kube_operator::config::Config;
use kube_on_kube_operator::context::Context;
use kube_on_kube_operator::controller::{WATCHED_RECHECK, reconcile};

async fn converge(
    ctx: &Arc<Context>,
    api: &Api<Cluster>,
    name: &str,
    until: impl Fn(&Cluster) -> bool,
    timeout: Duration,
) -> Cluster {
    let deadline = Instant::now() + timeout;
    loop {
        let cluster = api.get(name).await.expect("get cluster");
        if until(&cluster) {
            return cluster;
        }
        assert!(
            Instant::now() < deadline,
            "cluster did not converge in {timeout:?}: {:#?}",
            cluster.status
        );
        reconcile(Arc::new(cluster), ctx.clone())
            .await
            .expect("reconcile");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every condition of the control plane True (add-ons need a business API,
/// which kwok's Pods do not serve).
fn control_plane_ready(c: &Cluster) -> bool {
    c.status
        .as_ref()
        .is_some_and(ClusterStatus::control_plane_ready)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_cluster_gets_its_objects_and_is_collected_on_delete() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("kwok-cluster").await;
    let ctx = context(&client, Config::default());
    let api: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &kwok_cluster(ClusterMode::Production, &ns, "prod"),
    )
    .await
    .expect("create");

    let cluster = converge(
        &ctx,
        &api,
        "prod",
        control_plane_ready,
        Duration::from_secs(120),
    )
    .await;
    let status = cluster.status.clone().expect("status");
    let components = status.components.expect("components");
    assert_eq!(components.etcd.ready, "3/3");
    assert_eq!(components.api_server.ready, "3/3");
    assert_eq!(components.api_server.version.as_deref(), Some("1.35.4"));
    assert_eq!(status.etcd_members.len(), 3);
    assert_eq!(
        status.endpoint.as_deref(),
        Some("https://api.prod-east.example.com:6443")
    );
    assert!(status.certificates_expire_at.is_some());
    // Add-ons are not applied against simulated Pods: Ready says which part is missing.
    assert_eq!(condition(&cluster, "Ready").as_deref(), Some("False"));

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let owned = |meta: &kube::api::ObjectMeta| {
        meta.owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == cluster.uid().unwrap_or_default() && o.controller == Some(true))
    };
    let all_secrets = secrets
        .list(&ListParams::default().labels("kubeonkube.io/cluster=prod"))
        .await
        .expect("secrets")
        .items;
    // 3 CAs, SA key, encryption key, 5 leaves, 6 etcd member certs, 5
    // kubeconfigs, 2 users.
    assert_eq!(
        all_secrets.len(),
        3 + 1 + 1 + 5 + 6 + 5 + 2,
        "{:?}",
        all_secrets.iter().map(|s| s.name_any()).collect::<Vec<_>>()
    );
    assert!(all_secrets.iter().all(|s| owned(&s.metadata)));
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let member = services.get("prod-etcd-1").await.expect("member service");
    assert_eq!(
        member
            .spec
            .as_ref()
            .and_then(|s| s.publish_not_ready_addresses),
        Some(true)
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    for d in [
        "prod-apiserver",
        "prod-controller-manager",
        "prod-scheduler",
    ] {
        assert!(
            owned(&deployments.get(d).await.expect(d).metadata),
            "{d} is owned"
        );
    }

    // Simulated Pods serve no business API, so the add-on step fails; it is
    // retried after its backoff (1 s, then doubling), not on every
    // reconcile, and the condition says when the next attempt is due: no
    // pass retries it before that time.
    let addons = |c: &Cluster| {
        let c = c.status.as_ref()?.condition("AddonsReady")?;
        Some((c.reason.clone(), c.message.clone()))
    };
    let pass = || async {
        reconcile(Arc::new(api.get("prod").await.expect("get")), ctx.clone())
            .await
            .expect("reconcile");
        addons(&api.get("prod").await.expect("get")).expect("AddonsReady")
    };
    let (reason, first) = pass().await;
    assert_eq!(reason, "BusinessAPIUnreachable", "{first}");
    assert!(first.contains("failed; next at "), "{first}");
    // The UTC second of the day the message names for the next attempt.
    let due = |m: &str| -> i64 {
        let at = m.split("next at ").nth(1).expect("next at");
        let f: Vec<i64> = at[..8].split(':').map(|x| x.parse().unwrap()).collect();
        f[0] * 3600 + f[1] * 60 + f[2]
    };
    let second_of_day = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        now % 86400
    };
    let attempt = |m: &str| -> u32 {
        let n = m.split("(attempt ").nth(1).expect("attempt count");
        n.split(' ').next().unwrap().parse().expect("a number")
    };
    let waited = Instant::now();
    let mut passes = 0;
    let retried = loop {
        let (_, message) = pass().await;
        if message != first {
            // Not before the time the previous message named (its second
            // is truncated, hence the one second of slack).
            let early = (due(&first) - second_of_day() - 1).rem_euclid(86400);
            assert!(
                early == 0 || early > 43200,
                "retried {early}s before the time it named: {first}"
            );
            break message;
        }
        passes += 1;
        assert!(
            waited.elapsed() < Duration::from_secs(25),
            "no new attempt after 25s: {message}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(attempt(&retried), attempt(&first) + 1, "{retried}");
    println!(
        "add-on step retried after {:?} and {passes} passes that waited: {retried}",
        waited.elapsed()
    );

    // A second pass changes nothing: no new certificates.
    let before: Vec<_> = all_secrets.iter().map(|s| s.resource_version()).collect();
    reconcile(Arc::new(api.get("prod").await.expect("get")), ctx.clone())
        .await
        .expect("reconcile");
    let after: Vec<_> = secrets
        .list(&ListParams::default().labels("kubeonkube.io/cluster=prod"))
        .await
        .expect("secrets")
        .items
        .iter()
        .map(|s| s.resource_version())
        .collect();
    assert_eq!(before, after, "an unchanged cluster rewrote its Secrets");

    // Deleting the Cluster removes everything it owns.
    let started = Instant::now();
    api.delete("prod", &DeleteParams::background())
        .await
        .expect("delete");
    // The operator's part of the deletion: stop the Pods, release the Cluster.
    reconcile(Arc::new(api.get("prod").await.expect("get")), ctx.clone())
        .await
        .expect("teardown");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let labels = ListParams::default().labels("kubeonkube.io/cluster=prod");
    loop {
        let left = secrets.list(&labels).await.expect("list").items.len()
            + services.list(&labels).await.expect("list").items.len()
            + deployments.list(&labels).await.expect("list").items.len()
            + pods.list(&labels).await.expect("list").items.len();
        if left == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{left} objects still there after 60s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "cluster objects collected {:?} after delete",
        started.elapsed()
    );
}

/// A Cluster that waits only for its Pods is not polled: its Pods select a
/// node label no node has, so they stay Pending, and each pass waits for the
/// 5-minute recheck. Under the operator's controller, the Pods' and
/// Deployments' events (once a node gets the label) and a deleted Secret's
/// event wake it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_waiting_for_its_pods_is_woken_by_them_not_polled() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("kwok-wake").await;
    let ctx = context(&client, Config::default());
    let label = format!("kubeonkube.io/test-wake-{ns}");
    let mut cluster = kwok_cluster(ClusterMode::Minimal, &ns, "stuck");
    cluster.spec.placement = Some(kube_on_kube_api::cluster::Placement {
        node_selector: [(label.clone(), "yes".to_string())].into(),
        tolerations: Vec::new(),
    });
    let api: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &cluster)
        .await
        .expect("create");

    // Its Pods select a node label no node has: nothing runs, and nothing
    // but their watch events could change that. Once its objects exist, each
    // pass waits for those events, with only a recheck after minutes.
    let mut waits = Vec::new();
    for _ in 0..6 {
        let cluster = api.get("stuck").await.expect("get");
        waits.push(
            reconcile(Arc::new(cluster), ctx.clone())
                .await
                .expect("reconcile"),
        );
    }
    println!("waits while stuck: {waits:?}");
    let recheck = Action::requeue(WATCHED_RECHECK);
    assert!(
        waits[2..].iter().all(|w| *w == recheck),
        "a Cluster waiting for its Pods is polled: {waits:?}"
    );

    // The operator's controller, watching the namespace: a node the Pods
    // can run on makes it converge through the Pods' and Deployments'
    // events, long before the recheck.
    let controller = tokio::spawn(kube_on_kube_operator::run(
        client.clone(),
        Some(ns.clone()),
        4,
        Config::default(),
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = serde_json::json!({"metadata": {"labels": {label.as_str(): "yes"}}});
    nodes
        .patch(
            "kwok-node-0",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("label a node");
    let labelled = Instant::now();
    let ready_types = [
        "EtcdReady",
        "APIServerReady",
        "ControllerManagerReady",
        "SchedulerReady",
    ];
    let outcome = loop {
        let cluster = api.get("stuck").await.expect("get");
        if ready_types
            .iter()
            .all(|t| condition(&cluster, t).as_deref() == Some("True"))
        {
            break Ok(labelled.elapsed());
        }
        if labelled.elapsed() > Duration::from_secs(90) {
            break Err(cluster.status);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let nodes_cleanup = serde_json::json!({"metadata": {"labels": {label.as_str(): null}}});
    let _ = nodes
        .patch(
            "kwok-node-0",
            &PatchParams::default(),
            &Patch::Merge(&nodes_cleanup),
        )
        .await;
    match outcome {
        Ok(took) => println!("control plane Ready {took:?} after the node was labelled"),
        Err(status) => panic!("not converged 90 s after the node was labelled: {status:#?}"),
    }

    // A Secret deleted now comes back through the deletion's event, long
    // before anything else is due: the add-ons (which kwok's Pods cannot
    // serve) retry at the time their condition names, so wait for a gap of
    // several seconds before it.
    let seconds_of_day = |hms: &str| -> Option<u64> {
        let mut parts = hms.split(':').map(|p| p.parse::<u64>().ok());
        Some(parts.next()?? * 3600 + parts.next()?? * 60 + parts.next()??)
    };
    let gap_deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            Instant::now() < gap_deadline,
            "add-on retries never 8 s apart"
        );
        let cluster = api.get("stuck").await.expect("get");
        let message = cluster
            .status
            .as_ref()
            .and_then(|s| s.condition("AddonsReady"))
            .map(|c| c.message.clone())
            .unwrap_or_default();
        let next = message
            .split("next at ")
            .nth(1)
            .and_then(|t| seconds_of_day(t.trim_end_matches(|c: char| !c.is_ascii_digit())));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs()
            % 86_400;
        // No time named: no retry is due at all.
        match next {
            Some(at) if at >= now && at <= now + 8 => {
                tokio::time::sleep(Duration::from_secs(at - now + 1)).await
            }
            Some(at) if at < now => tokio::time::sleep(Duration::from_secs(1)).await,
            _ => break,
        }
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let name = "stuck-scheduler-kubeconfig";
    let uid = secrets.get(name).await.expect("the Secret").metadata.uid;
    secrets
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete a Secret");
    let deleted = Instant::now();
    loop {
        let now = secrets.get_opt(name).await.expect("get");
        if now.as_ref().is_some_and(|s| s.metadata.uid != uid) {
            println!(
                "Secret recreated {:?} after its deletion",
                deleted.elapsed()
            );
            break;
        }
        assert!(
            deleted.elapsed() < Duration::from_secs(5),
            "a deleted Secret not recreated in 5 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Edits of its Deployments and Services are undone: they changed since
    // the operator's last apply, which it does not repeat otherwise.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let managed_by = "app.kubernetes.io/managed-by";
    deployments
        .patch(
            "stuck-apiserver",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("scale the kube-apiserver Deployment");
    services
        .patch(
            "stuck-apiserver",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {managed_by: null}}})),
        )
        .await
        .expect("drop a label of the kube-apiserver Service");
    let edited = Instant::now();
    loop {
        let replicas = deployments
            .get("stuck-apiserver")
            .await
            .expect("get")
            .spec
            .and_then(|s| s.replicas);
        let label = services
            .get("stuck-apiserver")
            .await
            .expect("get")
            .labels()
            .get(managed_by)
            .cloned();
        if replicas == Some(1) && label.is_some() {
            println!("edits undone {:?} after they were made", edited.elapsed());
            break;
        }
        assert!(
            edited.elapsed() < Duration::from_secs(10),
            "edits not undone in 10 s: replicas {replicas:?}, label {label:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    controller.abort();
    api.delete("stuck", &DeleteParams::background())
        .await
        .expect("delete");
}

/// The attempt number in an AddonsReady message ("… (attempt 3 failed; next
/// at …)").
fn addon_attempt(cluster: &Cluster) -> Option<u32> {
    let message = &cluster.status.as_ref()?.condition("AddonsReady")?.message;
    message
        .split("attempt ")
        .nth(1)?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_addon_step_is_retried_alone_until_something_changes() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("kwok-addon-retry").await;
    // kwok's Pods serve no business API: the add-on step keeps failing, and
    // is retried after 10 ms, doubling.
    let ctx = context(
        &client,
        Config {
            addon_retry: Duration::from_millis(10),
            ..Config::default()
        },
    );
    let api: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &kwok_cluster(ClusterMode::Minimal, &ns, "waits"),
    )
    .await
    .expect("create");
    let settled = |c: &Cluster| control_plane_ready(c) && addon_attempt(c).is_some();
    converge(&ctx, &api, "waits", settled, Duration::from_secs(120)).await;

    // Reconcile (as the requeues would) until the add-on step was attempted
    // `more` more times; what that left of the Secret `name`.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let name = "waits-scheduler-kubeconfig";
    let attempts = async |more: u32| -> Option<Secret> {
        let first = addon_attempt(&api.get("waits").await.expect("get"));
        let done = |c: &Cluster| addon_attempt(c) >= first.map(|n| n + more);
        converge(&ctx, &api, "waits", done, Duration::from_secs(30)).await;
        secrets.get_opt(name).await.expect("get Secret")
    };
    let attempt_alone = || {
        kok_common::metrics::global()
            .encode()
            .lines()
            .find(|l| l.starts_with("kok_addon_attempts_total{pass=\"alone\"}"))
            .and_then(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    attempts(1).await;

    // No watch runs here, so deleting a Secret tells the operator nothing: the
    // retries that follow are the add-on step alone, which reads no Secret
    // list, and leave it missing.
    secrets
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete a Secret");
    let alone_before = attempt_alone();
    assert!(
        attempts(2).await.is_none(),
        "a retry of the add-on step alone recreated a Secret"
    );
    assert!(
        attempt_alone() >= alone_before + 2.0,
        "retries not counted as alone"
    );

    // Its watch event, as the controller's watch passes it on, ends that: the
    // next pass is a full one and recreates the Secret.
    ctx.addon_waits.touch(&format!("{ns}/waits"));
    let cluster = api.get("waits").await.expect("get");
    reconcile(Arc::new(cluster), ctx.clone())
        .await
        .expect("reconcile");
    assert!(
        secrets.get_opt(name).await.expect("get").is_some(),
        "a watch event did not end the wait for the add-on retry"
    );

    // So does any write to the Cluster other than the retries' own status
    // writes.
    attempts(1).await;
    secrets
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete the Secret again");
    let cluster = api
        .patch(
            "waits",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .expect("label the Cluster");
    reconcile(Arc::new(cluster), ctx.clone())
        .await
        .expect("reconcile");
    assert!(
        secrets.get_opt(name).await.expect("get").is_some(),
        "a write to the Cluster did not end the wait for the add-on retry"
    );
    api.delete("waits", &DeleteParams::background())
        .await
        .expect("delete");
}

/// A Production Cluster's etcd members require a node each when three nodes
/// match its placement, and only prefer it (with `EtcdSpread` False) when one
/// does; either way a PodDisruptionBudget owned by the Cluster lets evictions
/// take at most one member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_members_spread_over_the_nodes_that_match_and_have_a_disruption_budget() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use kube_on_kube_api::cluster::Placement;

    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("kwok-spread").await;
    let ctx = context(&client, Config::default());
    let api: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    // The three kwok nodes, or only the first of them.
    for (name, selector) in [
        ("spread", ("type", "kwok")),
        ("packed", ("kubernetes.io/hostname", "kwok-node-0")),
    ] {
        let mut c = kwok_cluster(ClusterMode::Production, &ns, name);
        c.spec.placement = Some(Placement {
            node_selector: [(selector.0.to_string(), selector.1.to_string())].into(),
            tolerations: vec![],
        });
        api.create(&PostParams::default(), &c)
            .await
            .expect("create");
    }
    for (name, required, spread) in [("spread", true, "True"), ("packed", false, "False")] {
        let cluster = converge(
            &ctx,
            &api,
            name,
            control_plane_ready,
            Duration::from_secs(120),
        )
        .await;
        let members = pods
            .list(&ListParams::default().labels(&format!(
                "kubeonkube.io/cluster={name},kubeonkube.io/etcd-member"
            )))
            .await
            .expect("member pods")
            .items;
        assert_eq!(members.len(), 3, "{name}");
        let mut nodes: Vec<String> = Vec::new();
        for p in &members {
            let spec = p.spec.clone().expect("spec");
            let anti = spec
                .affinity
                .and_then(|a| a.pod_anti_affinity)
                .unwrap_or_else(|| panic!("{name}: no anti-affinity on {}", p.name_any()));
            let terms = if required {
                anti.required_during_scheduling_ignored_during_execution
            } else {
                anti.preferred_during_scheduling_ignored_during_execution
                    .map(|w| w.into_iter().map(|w| w.pod_affinity_term).collect())
            }
            .unwrap_or_else(|| panic!("{name}: required={required} expected: {:?}", p.spec));
            assert_eq!(terms[0].topology_key, "kubernetes.io/hostname");
            nodes.extend(spec.node_name);
        }
        nodes.sort();
        nodes.dedup();
        // With the rule required the scheduler put each member on a node of
        // its own; with one node they share it and still run.
        assert_eq!(
            nodes.len(),
            if required { 3 } else { 1 },
            "{name}: {nodes:?}"
        );
        let c = cluster
            .status
            .as_ref()
            .and_then(|s| s.condition("EtcdSpread"))
            .expect("EtcdSpread");
        assert_eq!(c.status, spread, "{name}: {c:?}");
        if !required {
            assert_eq!(c.reason, "NotEnoughNodes", "{c:?}");
        }

        let pdb = budgets.get(&format!("{name}-etcd")).await.expect("budget");
        assert!(
            pdb.owner_references()
                .iter()
                .any(|o| o.uid == cluster.uid().unwrap_or_default() && o.controller == Some(true)),
            "{name}: {:?}",
            pdb.metadata
        );
        let spec = pdb.spec.expect("spec");
        assert_eq!(spec.min_available, Some(IntOrString::Int(2)));
        // It covers exactly the three members, and the disruption
        // controller allows one eviction: one member may go, not two.
        let status = converge_budget(&budgets, &format!("{name}-etcd")).await;
        assert_eq!(
            (
                status.expected_pods,
                status.current_healthy,
                status.disruptions_allowed
            ),
            (3, 3, 1),
            "{name}: {status:?}"
        );
    }
    for name in ["spread", "packed"] {
        api.delete(name, &DeleteParams::background())
            .await
            .expect("delete");
    }
}

/// A budget's status once the disruption controller has counted its Pods.
async fn converge_budget(
    budgets: &Api<k8s_openapi::api::policy::v1::PodDisruptionBudget>,
    name: &str,
) -> k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = budgets.get(name).await.expect("budget").status;
        if let Some(s) = status.filter(|s| s.expected_pods > 0 && s.current_healthy > 0) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: no expected Pods counted"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
