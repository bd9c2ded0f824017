//! A fast subset of the upstream Kubernetes conformance suite against a
//! cluster the operators make, the way `scripts/conformance.sh` runs the
//! whole suite (docs/conformance.md): the dev environment's `default/ci`
//! Cluster with its example worker and the spare host joined as a second
//! one, the unmodified `e2e.test` of the pinned release, images from the
//! local registry under their upstream names. A few specs from each of
//! api-machinery (an admission webhook and an aggregated API server, both
//! reached through konnectivity), apps, network, node, storage and cli: a
//! regression in how the operators render the control plane, the add-ons
//! or the workers fails the build here.

use std::path::Path;
use std::process::Command;

/// The specs, by a part of their names that only they have.
const SUBSET: &[&str] = &[
    "[sig-api-machinery] AdmissionWebhook [Privileged:ClusterAdmin] should be able to deny pod and configmap creation",
    "[sig-api-machinery] Aggregator Should be able to support the 1.17 Sample API Server using the current Aggregator",
    "[sig-api-machinery] CustomResourceDefinition resources [Privileged:ClusterAdmin] Simple CustomResourceDefinition creating/deleting custom resource definition objects works",
    "[sig-apps] Deployment RollingUpdateDeployment should delete old pods and create new ones",
    "[sig-apps] ReplicaSet should serve a basic image on each replica with a public image",
    "[sig-cli] Kubectl client Kubectl version should check is all data is printed",
    "[sig-cli] Kubectl client Update Demo should create and stop a replication controller",
    "[sig-cli] Kubectl logs logs should be able to retrieve and filter logs",
    "[sig-network] DNS should provide DNS for services",
    "[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: http",
    "[sig-network] Services should serve a basic endpoint from pods",
    "[sig-node] Kubelet when scheduling a busybox command in a pod should print the output to logs",
    "[sig-node] Pods should be submitted and removed",
    "[sig-storage] ConfigMap should be consumable from pods in volume [NodeConformance]",
    "[sig-storage] EmptyDir volumes should support (root,0644,tmpfs)",
    "[sig-storage] Secrets should be consumable from pods in volume [NodeConformance]",
];

/// `text` as a regular expression matching itself.
fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The counts of summary.md's third line: "N passed, M failed, K skipped; …".
fn counts(summary: &str) -> Option<(usize, usize, usize)> {
    let line = summary.lines().find(|l| l.contains(" passed, "))?;
    let number = |word: &str| -> Option<usize> {
        let before = line.split(word).next()?;
        before
            .rsplit([' ', ','])
            .find(|s| !s.is_empty())?
            .parse()
            .ok()
    };
    Some((number(" passed")?, number(" failed")?, number(" skipped")?))
}

#[test]
fn counts_are_read_from_the_summary() {
    let summary =
        "# Conformance of `default/ci` at `abc`\n\n15 passed, 1 failed, 0 skipped; 4 min 2 s.\n";
    assert_eq!(counts(summary), Some((15, 1, 0)));
    assert_eq!(counts("nothing ran"), None);
    assert_eq!(literal("a (b) [c]"), r"a \(b\) \[c\]");
}

#[test]
fn a_subset_of_the_upstream_conformance_suite_passes() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = repo.join("target/conformance-ci");
    let focus = SUBSET
        .iter()
        .map(|s| literal(s))
        .collect::<Vec<_>>()
        .join("|");
    // The workspace's binaries beside this test's own (scripts/test.sh
    // builds the whole workspace), so that the script builds nothing.
    let program = Path::new(env!("CARGO_BIN_EXE_kok-dev-env"));
    let operators_dir = program.parent().expect("the binary is in a directory");
    let status = Command::new(repo.join("scripts/conformance.sh"))
        .current_dir(&repo)
        .env("KOK_DEV_OPERATORS_DIR", operators_dir)
        .args(["--focus", &focus, "--no-serial", "--procs", "4", "--out"])
        .arg(&out)
        .status()
        .expect("run scripts/conformance.sh");
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap_or_else(|e| {
        panic!(
            "scripts/conformance.sh (exit {status}) wrote no summary ({e}); see {}",
            out.display()
        )
    });
    println!("{summary}");
    assert!(status.success(), "scripts/conformance.sh: {status}");
    let (passed, failed, _) = counts(&summary).expect("counts in summary.md");
    assert_eq!(
        (passed, failed),
        (SUBSET.len(), 0),
        "every spec of the subset runs and passes; {}",
        out.join("summary.md").display()
    );
}
