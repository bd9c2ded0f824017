//! The per-cluster node-operator runs with exactly the rights the
//! kube-on-kube-operator's node-operator add-on grants in a business
//! cluster, not as its admin: with only those rights it provisions a Machine
//! to Ready and offboards it, and those rights do not reach other Secrets.
//! Along the way, what a Machine's author or a status writer controls is
//! played as an attacker: a key Secret outside the allowed namespaces is
//! refused exactly like a missing one, and a forged `status.installed` key
//! removes nothing outside the install root.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kok_testenv::wait::wait_for;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Config};
use kube_on_kube_api::Machine;
use serde_json::json;

use support::*;

fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(ref s)) if s.code == 403)
}

#[tokio::test]
async fn the_add_on_rights_are_enough_and_reach_no_other_secret() {
    let started = Instant::now();
    let h = Harness::start(HarnessOptions { hosts: 1 }).await;
    let (admin, host) = (h.client.clone(), &h.hosts.hosts()[0]);
    node_operator_rbac(&admin, &h.env, &h.server).await;
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = work.path().join("node-operator.kubeconfig");
    let config = node_operator_kubeconfig(&h.env, &kubeconfig);
    let restricted = Client::try_from(
        Config::from_custom_kubeconfig(config, &Default::default())
            .await
            .unwrap(),
    )
    .unwrap();

    // A Secret elsewhere: the node-operator's identity can neither read nor
    // list it, nor give itself more rights.
    let other = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("node-ssh-key".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        string_data: Some(
            [(
                "ssh-privatekey".to_string(),
                h.hosts.client_private_key_pem(),
            )]
            .into(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    let elsewhere: Api<Secret> = Api::namespaced(restricted.clone(), "default");
    assert!(forbidden(elsewhere.get("node-ssh-key").await));
    assert!(forbidden(elsewhere.list(&ListParams::default()).await));
    assert!(forbidden(
        Api::<Secret>::all(restricted.clone())
            .list(&ListParams::default())
            .await
    ));
    let escalate: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "node-operator-escalates"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": NODE_OPERATORS_GROUP}],
    }))
    .unwrap();
    assert!(forbidden(
        Api::<ClusterRoleBinding>::all(restricted.clone())
            .create(&PostParams::default(), &escalate)
            .await
    ));

    let operator = Operator::start_as(&kubeconfig, &h.operator_log(), &[]);
    let machines: Api<Machine> = Api::all(admin.clone());

    // Two Machines the operator must refuse alike: one names an existing
    // Secret in a namespace keys are not read from, one a Secret that does
    // not exist. Their messages differ only in the name they gave.
    let mut outside = machine(host, host.host_public_key(), 0);
    outside.metadata.name = Some("key-outside".into());
    outside.spec.ip = "10.255.255.1".into();
    outside.spec.ssh.private_key_secret_ref.namespace = "default".into();
    let mut missing = outside.clone();
    missing.metadata.name = Some("key-missing".into());
    missing.spec.ip = "10.255.255.2".into();
    missing.spec.ssh.private_key_secret_ref.namespace = "kube-system".into();
    missing.spec.ssh.private_key_secret_ref.name = "no-such-key".into();
    apply(&machines, &outside).await;
    apply(&machines, &missing).await;
    let mut messages = Vec::new();
    for (m, given) in [
        ("key-outside", "default/node-ssh-key"),
        ("key-missing", "kube-system/no-such-key"),
    ] {
        let refused = wait_condition(
            &machines,
            m,
            "Reachable",
            "False",
            "SecretMissing",
            Duration::from_secs(60),
        )
        .await;
        let message = condition_message(&refused, "Reachable").unwrap();
        assert!(message.contains(given), "{message}");
        messages.push(message.replace(given, "<secret>"));
    }
    assert_eq!(
        messages[0], messages[1],
        "no way to tell which Secrets exist"
    );

    // The real Machine: Ready with the add-on's rights only.
    apply(&machines, &machine(host, host.host_public_key(), 0)).await;
    wait_ready(&machines, host.name(), Duration::from_secs(180)).await;
    eprintln!("Machine Ready at {:?}", started.elapsed());

    // Whoever may write a Machine's status names a "package" that is a path
    // out of the install root; offboarding must not remove it. The CRD
    // refuses such a key; with a CRD from before that rule (played by
    // removing it) it gets in, and the operator itself must refuse it.
    on(host, "echo precious > /root/keep");
    let forged = json!({"status": {"installed": {"../../../root/keep": {
        "packageVersion": "kubelet-1.35.4",
        "version": "1.35.4",
        "healthy": true,
    }}}});
    let refused = machines
        .patch_status(host.name(), &PatchParams::default(), &Patch::Merge(&forged))
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("installed package names must be lowercase DNS labels"),
        "{refused}"
    );
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let mut crd = crds.get("machines.kubeonkube.io").await.unwrap();
    let installed = crd.spec.versions[0]
        .schema
        .as_mut()
        .and_then(|s| s.open_api_v3_schema.as_mut())
        .and_then(|s| s.properties.as_mut())
        .and_then(|p| p.get_mut("status"))
        .and_then(|s| s.properties.as_mut())
        .and_then(|p| p.get_mut("installed"))
        .expect("status.installed in the Machine CRD");
    assert!(installed.x_kubernetes_validations.take().is_some());
    crds.replace("machines.kubeonkube.io", &PostParams::default(), &crd)
        .await
        .unwrap();
    wait_for(
        "the forged key accepted",
        Duration::from_secs(30),
        async || {
            machines
                .patch_status(host.name(), &PatchParams::default(), &Patch::Merge(&forged))
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
    offboard(
        &admin,
        &machines,
        host.name(),
        Duration::from_secs(120),
        &["HostCleaned", "NodeDeleted", "UnsafePath"],
    )
    .await;
    eprintln!("Machine offboarded at {:?}", started.elapsed());
    assert_eq!(
        on(host, "cat /root/keep"),
        "precious",
        "nothing outside removed"
    );
    assert_eq!(
        on(host, "ls -A /opt/kube-on-kube/packages"),
        "",
        "packages removed"
    );
    drop(operator);
    let log = std::fs::read_to_string(h.operator_log()).unwrap();
    assert!(
        !log.contains("forbidden"),
        "a request of the node-operator was refused by RBAC:\n{}",
        log.lines()
            .filter(|l| l.contains("forbidden"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("whole test in {:?}", started.elapsed());
}
