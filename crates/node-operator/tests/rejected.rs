//! A write the business cluster's API server refuses for a Machine reaches
//! the Machine: a ValidatingAdmissionPolicy of the business cluster denies
//! the bootstrap-token Secret the node-operator creates for the Machine's
//! kubelet. What only the operator saw (the API server's answer) must show on
//! the Machine as a condition and a Warning Event carrying the policy's
//! message; the Machine is retried with backoff, not as fast as the operator
//! can fail; and once the policy is gone it converges on its own.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::Secret;
use kok_testenv::wait::wait_for;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube_on_kube_api::Machine;
use kube_on_kube_api::machine::MachinePhase;
use serde_json::json;

use support::*;

/// What the policy answers; distinctive, so finding it proves it came from
/// the API server through the operator.
const DENIAL: &str = "new bootstrap tokens are frozen by the cluster admins (change 4711)";

/// The policy and its binding: no Secret of type `bootstrap.kubernetes.io/token`
/// may be created in kube-system.
fn token_policy() -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let policy = serde_json::from_value(json!({
        "metadata": {"name": "freeze-bootstrap-tokens"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["secrets"],
            }]},
            "validations": [{
                "expression": "object.type != 'bootstrap.kubernetes.io/token'",
                "message": DENIAL,
            }],
        },
    }))
    .unwrap();
    let binding = serde_json::from_value(json!({
        "metadata": {"name": "freeze-bootstrap-tokens"},
        "spec": {
            "policyName": "freeze-bootstrap-tokens",
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": "kube-system"},
            }},
        },
    }))
    .unwrap();
    (policy, binding)
}

/// How many failed reconciles the operator logged with the policy's message
/// (the Machine's error policy logs each once, with its retry delay).
fn refused_reconciles(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("reconcile failed") && l.contains("retry_in") && l.contains(DENIAL))
        .count()
}

/// The type and message of the Machine's condition that says
/// `ObjectRejected`, whichever condition it is.
fn rejection(m: &Machine) -> Option<(String, String)> {
    m.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.reason == "ObjectRejected")
        .map(|c| (c.type_.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_bootstrap_token_reaches_the_machine() {
    let started = Instant::now();
    let h = Harness::start(HarnessOptions { hosts: 1 }).await;
    let client = h.client.clone();
    let host = &h.hosts.hosts()[0];
    let (policy, binding) = token_policy();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    // The policy takes effect once the API server has loaded it: a dry-run
    // create of a token Secret is then refused with its message.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let probe: Secret = serde_json::from_value(json!({
        "metadata": {"name": "bootstrap-token-probe0"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {"token-id": "probe0", "token-secret": "0123456789abcdef"},
    }))
    .unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for(
        "the policy in force",
        Duration::from_secs(30),
        async || match secrets.create(&dry_run, &probe).await {
            Err(e) if e.to_string().contains(DENIAL) => Some(()),
            _ => None,
        },
    )
    .await;
    eprintln!("set up in {:?}", started.elapsed());

    let mut operator = h.operator();
    let machines = h.machines();
    h.create_machines(&h.hosts.hosts()[..1]).await;
    let name = host.name();

    // The refusal reaches the Machine's status with the policy's message.
    let (failed, (type_, message)) = wait_for(
        "the Machine's ObjectRejected condition",
        Duration::from_secs(90),
        async || {
            let m = machine_status(&machines, name).await?;
            let r = rejection(&m)?;
            Some((m, r))
        },
    )
    .await;
    let first = Instant::now();
    eprintln!("refused at {:?}: {type_}: {message}", started.elapsed());
    assert!(message.contains(DENIAL), "{message}");
    assert_eq!(condition(&failed, &type_).map(|c| c.0), Some("False"));
    assert_eq!(phase(&failed), Some(MachinePhase::Failed));
    let event = wait_for(
        "a Warning Event with the policy's message",
        Duration::from_secs(30),
        async || {
            events_for(&client, name).await.into_iter().find(|e| {
                e.reason.as_deref() == Some("ObjectRejected")
                    && e.type_.as_deref() == Some("Warning")
                    && e.message.as_deref().is_some_and(|m| m.contains(DENIAL))
            })
        },
    )
    .await;
    eprintln!("Event: {:?}", event.message);
    let tokens = secrets
        .list(&ListParams::default().fields("type=bootstrap.kubernetes.io/token"))
        .await
        .unwrap();
    assert!(tokens.items.is_empty(), "no token got in");

    // Retried with backoff (RETRY_BACKOFF doubling: retries 1, 3 and 7 s
    // after the first refusal, up to three in the 8 s from here), not in a
    // loop, which would fail hundreds of times; the operator goes on.
    // The reconcile's error is logged after the status and the Event are
    // written: wait for that line, then count the retries from it.
    let at_first = wait_for(
        "the refusal logged as a failed reconcile",
        Duration::from_secs(10),
        async || Some(refused_reconciles(&h.operator_log())).filter(|n| *n >= 1),
    )
    .await;
    let window = RETRY_BACKOFF * 8;
    tokio::time::sleep(window).await;
    let retries = refused_reconciles(&h.operator_log()) - at_first;
    eprintln!(
        "{retries} refused retries in {:?} after the first ({at_first} logged by then)",
        first.elapsed()
    );
    assert!(
        (1..=5).contains(&retries),
        "{retries} refused reconciles in {window:?}: retried without backoff, or not at all"
    );
    assert!(operator.is_running(), "the operator goes on");
    let still = machines.get(name).await.unwrap();
    assert!(rejection(&still).is_some(), "still refused: {still:?}");

    // The policy goes: the next retry gets through and the Machine joins.
    bindings
        .delete("freeze-bootstrap-tokens", &DeleteParams::default())
        .await
        .unwrap();
    policies
        .delete("freeze-bootstrap-tokens", &DeleteParams::default())
        .await
        .unwrap();
    let ready = wait_ready(&machines, name, Duration::from_secs(150)).await;
    eprintln!("Ready at {:?}", started.elapsed());
    assert_eq!(rejection(&ready), None, "the condition was replaced");
    assert!(operator.is_running());
    eprintln!("whole test in {:?}", started.elapsed());
}
