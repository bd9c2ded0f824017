//! The Machine controller end to end: the node-operator binary (a child
//! process, so it can be killed and restarted) against a real API server and
//! controller-manager, provisioning real SSH test hosts with the examples'
//! PackageVersions. The kubelet package is `kok-test-kubelet`, which joins by
//! a real TLS bootstrap (its CSR approved and signed by the controller-manager),
//! registers its Node and renews its Lease.
//!
//! One operator works on the whole cluster, so the scenarios run in sequence
//! in one test: provision three Machines (the operator killed halfway and
//! restarted), a stopped kubelet repaired, a problem condition (as
//! node-problem-detector reports it) remediated within the cool-down and the
//! cluster-wide cap, a checksum mismatch refused, a host-key mismatch refused,
//! a host cut off mid-install converging, and a Machine deleted.

mod support;

use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use kok_testenv::wait::wait_for;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube_on_kube_api::machine::MachinePhase;
use kube_on_kube_api::{Machine, PackageVersion};
use serde_json::json;

use support::*;

/// The kernel-deadlock remedy of this test: records its start and end time on
/// the host, two seconds apart, so overlapping remediations would show (`;`
/// separates remediations in the flag, so the command chains with `&&`).
const REMEDY: &str =
    "date +%s.%N >> /root/remedy-runs && sleep 2 && date +%s.%N >> /root/remedy-runs";

/// Start and end times of every run of [`REMEDY`] on `host`.
fn remedy_runs(host: &kok_testenv::hosts::TestHost) -> Vec<f64> {
    on(host, "cat /root/remedy-runs 2>/dev/null")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Sets a Node condition as node-problem-detector does: a strategic merge of
/// the status conditions, which are keyed by type.
async fn set_node_condition(nodes: &Api<Node>, node: &str, type_: &str, status: &str) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let patch = json!({"status": {"conditions": [{
        "type": type_,
        "status": status,
        "reason": "NodeProblemDetectorTest",
        "message": format!("{type_} set by the test"),
        "lastHeartbeatTime": now.to_string(),
        "lastTransitionTime": now.to_string(),
    }]}});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap_or_else(|e| panic!("setting {type_}={status} on Node {node}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_join_are_repaired_and_leave() {
    let started = Instant::now();
    let h = Harness::start(HarnessOptions { hosts: 4 }).await;
    let (client, hosts) = (h.client.clone(), &h.hosts);
    // A kubelet whose artifact does not match its checksum.
    let bad = package_version_like(
        &h.package_versions,
        hosts,
        "kubelet",
        "kubelet-1.35.9",
        "1.35.9",
        "kubelet.tar.gz",
        &"0".repeat(64),
    );
    apply(&Api::<PackageVersion>::all(client.clone()), &bad).await;
    eprintln!("set up in {:?}", started.elapsed());

    // The operator killed below runs without leader election: the Lease a
    // killed leader leaves behind would hold its successor back for the
    // lease duration, and taking over a Lease is runtime.rs's subject, not
    // this test's.
    let mut operator = h.operator_with(&["--leader-elect=false"]);
    let machines: Api<Machine> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let three = &hosts.hosts()[..3];
    for (i, host) in three.iter().enumerate() {
        apply(&machines, &machine(host, host.host_public_key(), i)).await;
    }

    // Killed halfway through provisioning: once some package is installed on
    // some host, before every Machine is Ready.
    let t = Instant::now();
    wait_for("a package installed", Duration::from_secs(90), async || {
        let list = machines.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|m| m.status.as_ref().is_some_and(|s| !s.installed.is_empty()))
            .then_some(())
    })
    .await;
    operator.kill();
    eprintln!("operator killed after {:?}", t.elapsed());
    let operator = h.operator();
    for host in three {
        wait_ready(&machines, host.name(), Duration::from_secs(120)).await;
    }
    eprintln!("three Machines Ready {:?} after creation", t.elapsed());

    for (i, host) in three.iter().enumerate() {
        let m = machines.get(host.name()).await.unwrap();
        let st = m.status.clone().unwrap();
        assert_eq!(st.node_name.as_deref(), Some(host.name()));
        assert_eq!(st.host.as_ref().unwrap().arch, "amd64");
        assert_eq!(st.host.as_ref().unwrap().hostname, host.name());
        for (pkg, version) in [
            ("containerd", "2.1.4"),
            ("cni-plugins", "1.8.0"),
            ("kubelet", "1.35.4"),
        ] {
            let i = &st.installed[pkg];
            assert_eq!(i.version, version, "{pkg}");
            assert!(i.healthy, "{pkg}");
            assert_eq!(
                on(
                    host,
                    &format!("readlink /opt/kube-on-kube/packages/{pkg}/current")
                ),
                version
            );
        }
        for c in ["Reachable", "PackagesInstalled", "NodeReady", "Ready"] {
            assert_eq!(condition(&m, c).map(|c| c.0), Some("True"), "{c}: {st:?}");
        }
        assert_eq!(st.observed_generation, m.metadata.generation);
        let op = st.last_operation.as_ref().unwrap();
        assert_eq!(
            op.result,
            kube_on_kube_api::shared::OperationResult::Succeeded,
            "{op:?}"
        );
        assert!(op.finished_at.is_some(), "{op:?}");
        for reason in [
            "Installed",
            "BootstrapConfigured",
            "SysctlsApplied",
            "Ready",
        ] {
            assert!(
                has_event(&client, host.name(), reason).await,
                "{}: no {reason} Event",
                host.name()
            );
        }
        let node = nodes.get(host.name()).await.unwrap();
        let labels = node.labels();
        assert_eq!(
            labels["topology.kubernetes.io/zone"],
            format!("zone-{}", i % 2)
        );
        assert_eq!(labels["kubeonkube.io/idc"], "idc-1");
        assert_eq!(labels["pool"], "general");
        let taints = node
            .spec
            .as_ref()
            .unwrap()
            .taints
            .clone()
            .unwrap_or_default();
        assert!(
            taints.iter().any(|t| t.key == "dedicated"
                && t.value.as_deref() == Some("batch")
                && t.effect == "PreferNoSchedule"),
            "{taints:?}"
        );
        assert_eq!(
            on(
                host,
                "systemctl is-active kubelet.service containerd.service"
            ),
            "active\nactive"
        );
        assert_eq!(on(host, "sysctl -n net.ipv4.ip_forward"), "1");
        assert!(
            on(host, "cat /etc/sysctl.d/90-kube-on-kube.conf").contains("net.ipv4.ip_forward = 1")
        );
        // The kubelet authenticated with its own certificate, issued by the
        // controller-manager for a CSR the bootstrap token made.
        assert!(on(host, "cat /etc/kubernetes/kubelet.conf").contains("client-certificate-data"));
    }
    let csrs = Api::<CertificateSigningRequest>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    for host in three {
        let node_csrs: Vec<_> = csrs
            .items
            .iter()
            .filter(|c| {
                c.name_any()
                    .starts_with(&format!("node-csr-{}-", host.name()))
            })
            .collect();
        assert!(!node_csrs.is_empty(), "no CSR for {}", host.name());
        let csr = node_csrs[0];
        assert_eq!(
            csr.spec.signer_name,
            "kubernetes.io/kube-apiserver-client-kubelet"
        );
        assert!(
            csr.spec
                .username
                .as_deref()
                .unwrap_or_default()
                .starts_with("system:bootstrap:")
        );
        let status = csr.status.clone().unwrap();
        // Approved by the node-operator, for this Machine's token (the
        // controller-manager approves no bootstrap request here).
        assert!(
            status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Approved"
                    && c.reason.as_deref() == Some("MachineBootstrapToken")),
            "{status:?}"
        );
        assert!(status.certificate.is_some());
    }
    // The bootstrap token never shows in status or Events.
    for host in three {
        let path = host
            .path_on_host("/etc/kubernetes/bootstrap-kubelet.conf")
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let kubeconfig: serde_json::Value = serde_norway::from_str(&text).unwrap();
        let token = kubeconfig["users"][0]["user"]["token"]
            .as_str()
            .expect("a token in the bootstrap kubeconfig");
        let secret = token.split('.').nth(1).unwrap();
        let status =
            serde_json::to_string(&machines.get(host.name()).await.unwrap().status).unwrap();
        assert!(
            !status.contains(secret),
            "token secret in the status: {status}"
        );
        for e in events_for(&client, host.name()).await {
            let note = e.message.unwrap_or_default();
            assert!(!note.contains(secret), "token secret in an Event: {note}");
        }
    }
    // Leases are renewed.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renew = |l: Lease| l.spec.and_then(|s| s.renew_time);
    let first = renew(leases.get(three[0].name()).await.unwrap()).unwrap();
    wait_for("the Lease renewed", Duration::from_secs(30), async || {
        let now = renew(leases.get(three[0].name()).await.ok()?)?;
        (now != first).then_some(())
    })
    .await;
    // No bootstrap token is left once the kubelets have their own credentials.
    assert_eq!(machine_tokens(&client).await, Vec::<String>::new());

    // Converged means no more work: across re-checks and a restart nothing is
    // downloaded or bootstrapped again, and downloads were at most once per
    // host, plus once more for a download the kill interrupted.
    let requests = hosts.artifact_requests();
    for file in ["containerd.tar.gz", "cni-plugins.tar.gz", "kubelet.tar.gz"] {
        let n = count(&requests, file);
        eprintln!("{file}: downloaded {n} times");
        assert!(
            (3..=6).contains(&n),
            "{file} downloaded {n} times: {requests:?}"
        );
    }
    // No SSH session when nothing needs doing: restarted with a long re-check
    // interval, the operator still keeps the Nodes (a label taken off is put
    // back) but opens no session to any host. Counted once the previous
    // operator, which may have been in the middle of a periodic check, has
    // finished it and stopped (SIGTERM, so it also gives up the Lease).
    operator.stop().await;
    let sessions: Vec<usize> = three.iter().map(ssh_sessions).collect();
    eprintln!("SSH sessions per host until converged: {sessions:?}");
    // After a restart, a Machine's next check is one interval after the last
    // one its status records. Pick an interval at which a check placed by the
    // Machine's name alone (what a restart without that record does) would
    // fall within four seconds of the operator's first look at the Machines
    // for one of these hosts: a session opened there would show below.
    for host in three {
        let m = machines.get(host.name()).await.unwrap();
        let at = m.status.and_then(|s| s.last_checked_at);
        assert!(at.is_some(), "{}: no last check recorded", host.name());
    }
    let (quiet, due) = (1800..=14400)
        .map(Duration::from_secs)
        .find_map(|interval| {
            three
                .iter()
                .map(|host| interval - node_operator::machine::plan::spread(host.name(), interval))
                .find(|due| *due < Duration::from_secs(4))
                .map(|due| (interval, due))
        })
        .unwrap();
    let operator = h.operator_with(&[&format!("--recheck-interval={}s", quiet.as_secs())]);
    let unlabel = json!({"metadata": {"labels": {"pool": null}}});
    nodes
        .patch(
            three[1].name(),
            &PatchParams::default(),
            &Patch::Merge(&unlabel),
        )
        .await
        .unwrap();
    wait_for(
        "the Node's label put back",
        Duration::from_secs(60),
        async || {
            let node = nodes.get(three[1].name()).await.ok()?;
            (node.labels().get("pool").map(String::as_str) == Some("general")).then_some(())
        },
    )
    .await;
    // The operator runs (it put the label back), so it has looked at every
    // Machine, all queued at its start: wait past the check a placement by
    // name would have made since, with a margin for a slow first pass.
    tokio::time::sleep(due + Duration::from_secs(2)).await;
    for host in three {
        assert_eq!(
            phase(&machines.get(host.name()).await.unwrap()),
            Some(MachinePhase::Ready)
        );
    }
    let idle: Vec<usize> = three.iter().map(ssh_sessions).collect();
    assert_eq!(idle, sessions, "no SSH session while nothing needs doing");
    assert_eq!(
        hosts.artifact_requests(),
        requests,
        "nothing downloaded after converging"
    );
    // Still without periodic checks, a kubelet that stops is repaired once
    // its Node turns NotReady (the controller-manager notices the Lease is
    // no longer renewed, after NODE_GRACE) and the Node change reaches the
    // operator.
    let h1 = &three[1];
    on(h1, "systemctl stop kubelet.service");
    let t = Instant::now();
    wait_for(
        "the Node NotReady",
        NODE_GRACE + Duration::from_secs(60),
        async || {
            let node = nodes.get(h1.name()).await.ok()?;
            let ready = node
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.status != "True").then_some(())
        },
    )
    .await;
    eprintln!("Node NotReady {:?} after its kubelet stopped", t.elapsed());
    wait_for(
        "the kubelet restarted after its Node turned NotReady",
        Duration::from_secs(120),
        async || {
            (on(h1, "systemctl is-active kubelet.service") == "active"
                && has_event(&client, h1.name(), "Restarted").await)
                .then_some(())
        },
    )
    .await;
    wait_ready(&machines, h1.name(), Duration::from_secs(90)).await;
    eprintln!(
        "stopped kubelet repaired by the Node change in {:?} (Machine Ready again)",
        t.elapsed()
    );
    let sessions: Vec<usize> = three.iter().map(ssh_sessions).collect();

    // A Ready worker whose host says its kubelet has no credentials (an
    // emptied kubelet.conf: what a compromised worker would do to be handed
    // a token) is given none at the periodic check below: whether a Machine
    // joins is the API's word, not the host's.
    let h0 = &three[0];
    on(
        h0,
        "cp /etc/kubernetes/kubelet.conf /etc/kubernetes/kubelet.conf.kept && \
         : > /etc/kubernetes/kubelet.conf",
    );

    // With a short interval the periodic checks do open sessions (and
    // still download nothing). From here on the operator also remedies a
    // kernel deadlock (a condition node-problem-detector reports; the kubelet
    // owns and rewrites its own pressure conditions) with a command that
    // records when it ran, one Machine at a time, at most once an hour per
    // Machine.
    operator.stop().await;
    let mut operator = h.operator_with(&[
        &format!("--remediation=KernelDeadlock=command:{REMEDY}"),
        "--remediation-cooldown=1h",
        "--max-concurrent-remediations=1",
    ]);
    wait_for(
        "a periodic check of every host",
        Duration::from_secs(60),
        async || {
            three
                .iter()
                .zip(&sessions)
                .all(|(host, before)| ssh_sessions(host) > *before)
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        hosts.artifact_requests(),
        requests,
        "nothing downloaded by periodic checks"
    );
    wait_for(
        "the claim of missing credentials reported",
        Duration::from_secs(30),
        async || {
            has_event(&client, h0.name(), "CredentialsClaimedMissing")
                .await
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        machine_tokens(&client).await,
        Vec::<String>::new(),
        "a token was issued to a Ready worker"
    );
    on(
        h0,
        "mv /etc/kubernetes/kubelet.conf.kept /etc/kubernetes/kubelet.conf",
    );
    bootstrap_requests_get_only_their_machines_node(&h, three).await;
    for host in three {
        let m = machines.get(host.name()).await.unwrap();
        assert_eq!(phase(&m), Some(MachinePhase::Ready));
        let bootstraps = events_for(&client, host.name())
            .await
            .iter()
            .filter(|e| e.reason.as_deref() == Some("BootstrapConfigured"))
            .map(|e| e.count.unwrap_or(1))
            .sum::<i32>();
        assert_eq!(
            bootstraps,
            1,
            "{}: one bootstrap token per Machine",
            host.name()
        );
    }
    eprintln!("phase 1 done at {:?}", started.elapsed());

    // A kernel deadlock reported on two Nodes at once, as node-problem-detector
    // sets it: each Machine gets the configured remedy, one at a time across
    // the cluster, and only once within the cool-down although the condition
    // stays True.
    let t = Instant::now();
    for host in &three[..2] {
        set_node_condition(&nodes, host.name(), "KernelDeadlock", "True").await;
    }
    let runs = wait_for(
        "both Machines remedied",
        Duration::from_secs(90),
        async || {
            let runs: Vec<Vec<f64>> = three[..2].iter().map(remedy_runs).collect();
            (runs.iter().all(|r| r.len() == 2)
                && has_event(&client, three[0].name(), "Remediated").await
                && has_event(&client, three[1].name(), "Remediated").await)
                .then_some(runs)
        },
    )
    .await;
    eprintln!(
        "kernel deadlock remedied on two Machines in {:?}",
        t.elapsed()
    );
    let (a, b) = ((runs[0][0], runs[0][1]), (runs[1][0], runs[1][1]));
    assert!(
        a.1 <= b.0 || b.1 <= a.0,
        "two remediations ran at once: {a:?} and {b:?}"
    );
    // A periodic check of both later, the condition still True: no second run.
    let sessions: Vec<usize> = three[..2].iter().map(ssh_sessions).collect();
    wait_for(
        "a periodic check after the remediations",
        Duration::from_secs(60),
        async || {
            three[..2]
                .iter()
                .zip(&sessions)
                .all(|(host, before)| ssh_sessions(host) > *before)
                .then_some(())
        },
    )
    .await;
    for host in &three[..2] {
        assert_eq!(
            remedy_runs(host).len(),
            2,
            "{}: remedied again within the cool-down",
            host.name()
        );
        set_node_condition(&nodes, host.name(), "KernelDeadlock", "False").await;
        wait_ready(&machines, host.name(), Duration::from_secs(60)).await;
    }

    // A stopped kubelet is restarted by the periodic check.
    let h0 = &three[0];
    on(h0, "systemctl stop kubelet.service");
    assert_eq!(on(h0, "systemctl is-active kubelet.service"), "inactive");
    let t = Instant::now();
    wait_for(
        "the kubelet restarted",
        Duration::from_secs(60),
        async || {
            (on(h0, "systemctl is-active kubelet.service") == "active"
                && has_event(&client, h0.name(), "Restarted").await)
                .then_some(())
        },
    )
    .await;
    eprintln!("stopped kubelet repaired in {:?}", t.elapsed());
    wait_ready(&machines, h0.name(), Duration::from_secs(60)).await;

    // A kubelet whose artifact does not match its checksum is refused and
    // the running version stays current.
    let h2 = &three[2];
    let kubelet_downloads = count(&hosts.artifact_requests(), "kubelet.tar.gz");
    let patch = json!({"spec": {"packages": {"kubelet": "kubelet-1.35.9"}}});
    machines
        .patch(h2.name(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(
        "the checksum mismatch reported",
        Duration::from_secs(60),
        async || {
            let m = machine_status(&machines, h2.name()).await?;
            (condition(&m, "PackagesInstalled") == Some(("False", "ChecksumMismatch"))
                && phase(&m) == Some(MachinePhase::Failed))
            .then_some(())
        },
    )
    .await;
    // Not tried again while nothing changed, though Node and status updates
    // keep reaching the operator. A Machine retried like any failure would
    // be within its first three backoffs (1, 2 and 4 times --retry-backoff).
    tokio::time::sleep(RETRY_BACKOFF * 7).await;
    assert_eq!(
        count(&hosts.artifact_requests(), "kubelet.tar.gz"),
        kubelet_downloads + 1,
        "the mismatching artifact downloaded once"
    );
    let m = machines.get(h2.name()).await.unwrap();
    assert_eq!(phase(&m), Some(MachinePhase::Failed));
    let message = condition_message(&m, "PackagesInstalled").unwrap();
    assert!(
        message.contains(&"0".repeat(64)) && message.contains("nothing was switched"),
        "{message}"
    );
    assert!(has_event(&client, h2.name(), "ChecksumMismatch").await);
    assert_eq!(
        on(h2, "readlink /opt/kube-on-kube/packages/kubelet/current"),
        "1.35.4"
    );
    assert_eq!(on(h2, "systemctl is-active kubelet.service"), "active");
    assert_eq!(
        on(h2, "ls /opt/kube-on-kube/packages/kubelet"),
        "1.35.4\ncurrent"
    );
    let patch = json!({"spec": {"packages": {"kubelet": "kubelet-1.35.4"}}});
    machines
        .patch(h2.name(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_ready(&machines, h2.name(), Duration::from_secs(60)).await;
    let node = nodes.get(h2.name()).await.unwrap();
    assert_ne!(
        node.spec.unwrap().unschedulable,
        Some(true),
        "uncordoned after the refused upgrade"
    );

    // A Machine whose SSH key Secret does not exist yet: said so, retried
    // with backoff, and it goes on once the Secret appears, with no change
    // to the Machine. Its host then presents another key than the pinned
    // one: refused, nothing run.
    let h3 = &hosts.hosts()[3];
    let mut m3 = machine(h3, three[0].host_public_key(), 3);
    m3.spec.ssh.private_key_secret_ref.name = "node-ssh-key-late".into();
    apply(&machines, &m3).await;
    let m = wait_condition(
        &machines,
        h3.name(),
        "Reachable",
        "False",
        "SecretMissing",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(phase(&m), Some(MachinePhase::Failed));
    assert!(
        condition_message(&m, "Reachable")
            .unwrap()
            .contains("kube-system/node-ssh-key-late"),
        "{:?}",
        condition_message(&m, "Reachable")
    );
    assert!(has_event(&client, h3.name(), "SecretMissing").await);
    let late = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("node-ssh-key-late".into()),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/ssh-auth".into()),
        string_data: Some([("ssh-privatekey".to_string(), hosts.client_private_key_pem())].into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), "kube-system")
        .create(&Default::default(), &late)
        .await
        .unwrap();
    let m = wait_condition(
        &machines,
        h3.name(),
        "Reachable",
        "False",
        "HostKeyMismatch",
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(phase(&m), Some(MachinePhase::Failed));
    let message = condition_message(&m, "Reachable").unwrap();
    assert!(message.contains("host key"), "{message}");
    assert!(has_event(&client, h3.name(), "HostKeyMismatch").await);
    assert_eq!(ssh_sessions(h3), 0, "no session on a host with another key");
    assert_eq!(on(h3, "ls -A /opt"), "", "nothing was run on the host");

    // The right key, and the host cut off once installing has begun: it
    // converges after the host returns.
    let before = hosts.artifact_requests().len();
    let patch = json!({"spec": {"ssh": {"hostPublicKey": h3.host_public_key()}}});
    machines
        .patch(h3.name(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(
        "installing begun on the fourth host",
        Duration::from_secs(60),
        async || (hosts.artifact_requests().len() > before).then_some(()),
    )
    .await;
    h3.cut_off().unwrap();
    let m = wait_condition(
        &machines,
        h3.name(),
        "Reachable",
        "False",
        "Unreachable",
        Duration::from_secs(90),
    )
    .await;
    eprintln!(
        "cut-off host: {:?} {:?}",
        phase(&m),
        condition_message(&m, "Reachable")
    );
    let message = condition_message(&m, "Reachable").unwrap();
    assert!(message.contains("unreachable"), "{message}");
    assert!(has_event(&client, h3.name(), "Unreachable").await);
    h3.reconnect().unwrap();
    wait_ready(&machines, h3.name(), Duration::from_secs(150)).await;
    eprintln!("cut-off host converged at {:?}", started.elapsed());

    // Deleting a Machine drains and removes its Node and its packages.
    let t = Instant::now();
    offboard(
        &client,
        &machines,
        h3.name(),
        Duration::from_secs(90),
        &["Drained", "HostCleaned", "NodeDeleted"],
    )
    .await;
    eprintln!("Machine offboarded in {:?}", t.elapsed());
    assert!(
        nodes.get_opt(h3.name()).await.unwrap().is_none(),
        "Node deleted"
    );
    assert_eq!(
        on(h3, "ls -A /opt/kube-on-kube/packages"),
        "",
        "packages removed"
    );
    assert_eq!(
        on(h3, "ls -A /etc/systemd/system | grep -c service || true"),
        "0",
        "units removed"
    );
    assert_eq!(on(h3, "ls -A /usr/local/bin"), "", "links removed");
    assert_eq!(
        on(h3, "systemctl is-active kubelet.service || true"),
        "inactive"
    );
    // The others are untouched.
    for host in three {
        assert_eq!(
            phase(&machines.get(host.name()).await.unwrap()),
            Some(MachinePhase::Ready)
        );
    }
    operator.kill();
    eprintln!("whole test in {:?}", started.elapsed());
}

/// The session counter the test above relies on counts what sshd opens:
/// one per command, and nothing when nothing is run.
/// The bootstrap-token Secrets of any Machine.
async fn machine_tokens(client: &kube::Client) -> Vec<String> {
    Api::<Secret>::namespaced(client.clone(), "kube-system")
        .list(&ListParams::default().labels("kubeonkube.io/machine"))
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| s.name_any())
        .collect()
}

/// A client of the business API authenticating with a bootstrap token.
async fn token_client(h: &Harness, token: &node_operator::bootstrap::Token) -> kube::Client {
    let mut config = h.env.kubeconfig().clone();
    for named in &mut config.auth_infos {
        named.auth_info = Some(kube::config::AuthInfo {
            token: Some(format!("{}.{}", token.id, token.secret).into()),
            ..Default::default()
        });
    }
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// Creates a kubelet client certificate request for `node` as `client`.
async fn node_client_csr(client: &kube::Client, name: &str, node: &str) {
    let (request, _key) = kok_testenv::node_csr(node).unwrap();
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(request),
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "client auth"],
        },
    }))
    .unwrap();
    Api::<CertificateSigningRequest>::all(client.clone())
        .create(&Default::default(), &csr)
        .await
        .unwrap();
}

/// The decision on CSR `name`: its Approved or Denied condition's type and
/// reason.
async fn decision(client: &kube::Client, name: &str) -> Option<(String, String)> {
    let csr = Api::<CertificateSigningRequest>::all(client.clone())
        .get(name)
        .await
        .ok()?;
    csr.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "Approved" || c.type_ == "Denied")
        .map(|c| (c.type_, c.reason.unwrap_or_default()))
}

/// A bootstrap token gets a client certificate for its own Machine's Node
/// only: one of a Machine's tokens asking for another Node's name is
/// denied, and a token that is no Machine's (any other holder of a token in
/// `system:bootstrappers`) gets nothing approved for any name.
async fn bootstrap_requests_get_only_their_machines_node(
    h: &Harness,
    three: &[kok_testenv::hosts::TestHost],
) {
    let secrets = Api::<Secret>::namespaced(h.client.clone(), "kube-system");
    let expires = k8s_openapi::jiff::Timestamp::now() + node_operator::bootstrap::TOKEN_LIFETIME;
    let machines_token = node_operator::bootstrap::new_token(expires).unwrap();
    let secret = node_operator::bootstrap::token_secret(three[1].name(), &machines_token);
    secrets.create(&Default::default(), &secret).await.unwrap();
    let other_token = node_operator::bootstrap::new_token(expires).unwrap();
    let mut other = node_operator::bootstrap::token_secret("none", &other_token);
    other.metadata.labels = None;
    secrets.create(&Default::default(), &other).await.unwrap();
    let (victim, own) = (three[2].name(), three[1].name());
    node_client_csr(&token_client(h, &other_token).await, "attack-plain", victim).await;
    let with_machines = token_client(h, &machines_token).await;
    node_client_csr(&with_machines, "attack-machine", victim).await;
    node_client_csr(&with_machines, "own-machine", own).await;
    let decided = |name: &'static str| async move {
        wait_for(
            &format!("CSR {name} decided"),
            Duration::from_secs(30),
            async || decision(&h.client, name).await,
        )
        .await
    };
    assert_eq!(
        decided("attack-machine").await,
        ("Denied".into(), "NotTheMachine".into())
    );
    assert_eq!(
        decided("own-machine").await,
        ("Approved".into(), "MachineBootstrapToken".into())
    );
    // Judged in the same passes as the two above; the controller-manager
    // decides at once when it decides at all.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(decision(&h.client, "attack-plain").await, None);
    for s in [&secret, &other] {
        secrets
            .delete(&s.name_any(), &Default::default())
            .await
            .unwrap();
    }
}

#[test]
fn ssh_sessions_are_counted() {
    let hosts = kok_testenv::hosts::TestHosts::start_with(kok_testenv::hosts::HostsOptions {
        count: 1,
        extra_private_dirs: vec!["/root".into()],
    })
    .unwrap();
    let host = &hosts.hosts()[0];
    count_ssh_sessions(host);
    assert_eq!(ssh_sessions(host), 0);
    assert_eq!(on(host, "echo hello"), "hello", "rc prints nothing");
    assert_eq!(ssh_sessions(host), 1);
    on(host, "true");
    on(host, "true");
    assert_eq!(ssh_sessions(host), 3);
}
