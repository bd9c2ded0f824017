//! `kok-dev-env` as `scripts/dev-env.sh` runs it, checked the way a user
//! would: every example converges (both Clusters Ready, their
//! node-operators running, the example Machine a Ready worker of each with
//! real PackageVersions, the example CanaryRelease succeeded on it, every
//! add-on Pod running), the operators run from the Helm chart under its
//! ServiceAccounts, the commands the banner prints work as printed (a Pod
//! started with kubectl runs on a worker; `kubectl kok cluster kubeconfig`
//! gives a kubeconfig that reaches the cluster; a cluster made with
//! `kubectl kok cluster create demo --wait` gets the spare host as its
//! worker and runs a Pod), a subset of the upstream conformance suite
//! passes against the example Cluster `default/ci` (as
//! `scripts/conformance.sh` runs the whole suite), and Ctrl-C stops
//! everything and leaves no process, network interface, network namespace,
//! mount or cgroup behind.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use kube_on_kube_api::canary::CanaryPhase;
use kube_on_kube_api::cluster::ClusterPhase;
use kube_on_kube_api::machine::MachinePhase;
use kube_on_kube_api::{CanaryRelease, Cluster, Machine, PackageVersion};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::time::timeout;

/// Two control planes, a worker's software and a kubelet upgrade on a busy
/// 2-core machine.
const CONVERGED_WITHIN: Duration = Duration::from_secs(900);
/// From Ctrl-C to exited.
const STOPPED_WITHIN: Duration = Duration::from_secs(120);
const API_CALL: Duration = Duration::from_secs(30);
/// The conformance subset's specs run in four ginkgo processes.
const CONFORMANCE_WITHIN: Duration = Duration::from_secs(600);

/// A fast subset of the upstream Kubernetes conformance suite, by a part of
/// their names that only they have: a few specs from each of api-machinery
/// (an admission webhook and an aggregated API server, both reached through
/// konnectivity), apps, network, node, storage and cli. The unmodified
/// `e2e.test` of the pinned release runs them, with images from the local
/// registry under their upstream names: a regression in how the operators
/// render the control plane, the add-ons or the workers fails here.
/// (Pod to Pod across nodes is `real_workers`' own check.)
const CONFORMANCE_SUBSET: &[&str] = &[
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

const BANNER: &str = "kube-on-kube dev environment is up";
const CONVERGED: &str = "every example converged";
/// The banner's heading of the commands that make a cluster of one's own.
const SPARE_HEADING: &str = "A cluster of your own";
/// The version the example CanaryRelease upgrades the kubelet to.
const CANARY_KUBELET: &str = "v1.35.8";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_command_runs_every_example_on_real_workers_and_stops_clean() {
    let program = Path::new(env!("CARGO_BIN_EXE_kok-dev-env"));
    // Cargo builds this package's binaries for its tests, not other packages'.
    let operators_dir = program.parent().expect("the binary is in a directory");
    for operator in ["kube-on-kube-operator", "node-operator", "kubectl-kok"] {
        assert!(
            operators_dir.join(operator).is_file(),
            "{} is missing: build the operators first with `cargo build --workspace --bins` \
             (scripts/test.sh does)",
            operators_dir.join(operator).display()
        );
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().expect("temporary directory");
    let before = Leftovers::now();

    let started = Instant::now();
    let mut child = Command::new(program)
        .arg("--dir")
        .arg(dir.path())
        .arg("--examples")
        .arg(repo.join("examples"))
        .arg("--chart")
        .arg(repo.join("charts/kube-on-kube"))
        .arg("--operators-dir")
        .arg(operators_dir)
        .arg(format!("--timeout={}", CONVERGED_WITHIN.as_secs()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A failed assertion unwinds through here and takes the environment
        // down with it.
        .kill_on_drop(true)
        .spawn()
        .expect("start kok-dev-env");
    let pid = child.id().expect("a running child");
    let ours = Ours::default();
    let sampler = tokio::spawn(ours.clone().sample_every(Duration::from_millis(500)));
    let (tx, mut lines) = mpsc::unbounded_channel();
    tokio::spawn(collect(
        child.stdout.take().expect("stdout"),
        "",
        tx.clone(),
    ));
    tokio::spawn(collect(
        child.stderr.take().expect("stderr"),
        "stderr: ",
        tx,
    ));
    let mut output = Vec::new();

    let converged = timeout(CONVERGED_WITHIN + Duration::from_secs(60), async {
        while let Some(line) = lines.recv().await {
            println!("{line}");
            let found = line.contains(CONVERGED);
            output.push(line);
            if found {
                return true;
            }
        }
        false
    })
    .await;
    match converged {
        Ok(true) => {}
        Ok(false) => panic!(
            "kok-dev-env ended before the examples converged:\n{}",
            tail(&output)
        ),
        Err(_) => panic!("the examples did not converge in time:\n{}", tail(&output)),
    }
    println!(
        "every example converged {:.1}s after the command",
        started.elapsed().as_secs_f64()
    );
    let banner = output
        .iter()
        .find(|l| l.contains(BANNER))
        .expect("the banner comes before convergence");
    assert!(
        banner.contains("2 Ready workers in business clusters"),
        "the banner counts the workers: {banner}"
    );

    check_meta_cluster(&dir.path().join("meta.kubeconfig")).await;
    for cluster in ["ci", "prod-east"] {
        check_workers_cluster(&dir.path().join(format!("{cluster}.kubeconfig"))).await;
    }

    // What the banner tells the user to try, run as printed.
    let work = tempfile::tempdir().expect("temporary directory");
    let tried = banner_commands(&output, "Try:");
    assert!(
        tried.iter().any(|c| c.contains(" run hello "))
            && tried
                .iter()
                .any(|c| c.contains("cluster kubeconfig ci > ci.kubeconfig")),
        "{tried:#?}"
    );
    run_commands(&tried, work.path(), Duration::from_secs(120)).await;
    pod_runs(&dir.path().join("ci.kubeconfig"), "hello").await;

    // The conformance subset on default/ci and a cluster of the user's own
    // on the spare host, side by side: two users of one dev environment,
    // and neither waits for the other.
    let demo = banner_commands(&output, SPARE_HEADING);
    assert!(
        demo.iter()
            .any(|c| c.contains("kubectl kok") && c.contains("cluster create demo --wait")),
        "{demo:#?}"
    );
    let conformance = async {
        let started = Instant::now();
        conformance_subset(&repo, dir.path(), "default/ci").await;
        println!(
            "the conformance subset passed in {:.1}s",
            started.elapsed().as_secs_f64()
        );
    };
    let own_cluster = async {
        let started = Instant::now();
        run_commands(
            &[&tried[..1], &demo[..]].concat(),
            work.path(),
            Duration::from_secs(900),
        )
        .await;
        println!(
            "cluster demo made, its worker Ready and a Pod running on it {:.1}s after `cluster create`",
            started.elapsed().as_secs_f64()
        );
    };
    tokio::join!(conformance, own_cluster);
    let demo = work.path().join("demo.kubeconfig");
    pod_runs(&demo, "hello").await;
    let nodes = Api::<Node>::all(client(&demo).await)
        .list(&ListParams::default())
        .await
        .expect("the demo cluster's Nodes");
    assert_eq!(names(&nodes.items), ["spare-0"]);

    // Ctrl-C, as in the terminal.
    // SAFETY: plain system call on our own child, not reaped yet.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGINT);
    }
    let stopped = Instant::now();
    let rest = timeout(STOPPED_WITHIN, async {
        while let Some(line) = lines.recv().await {
            println!("{line}");
            output.push(line);
        }
    })
    .await;
    assert!(
        rest.is_ok(),
        "still running {STOPPED_WITHIN:?} after Ctrl-C:\n{}",
        tail(&output)
    );
    let status = timeout(API_CALL, child.wait())
        .await
        .expect("exits once its output is closed")
        .expect("wait for kok-dev-env");
    assert!(status.success(), "exited with {status}:\n{}", tail(&output));
    println!(
        "stopped {:.1}s after Ctrl-C",
        stopped.elapsed().as_secs_f64()
    );
    sampler.abort();
    ours.sample();
    // Tests beside this one make and remove their own hosts and Pods: only
    // what this test's processes made counts, and a teardown still under way
    // gets a few seconds.
    let mut left = Leftovers::default();
    for _ in 0..20 {
        left = Leftovers::now().since(&before).made_by(&ours);
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(left.is_empty(), "left behind after Ctrl-C:\n{left:#?}");
}

/// The operators run from the chart's Deployments under its own
/// ServiceAccounts; both Clusters are Ready and their node-operators run.
async fn check_meta_cluster(kubeconfig: &Path) {
    let meta = client(kubeconfig).await;
    let deployments = Api::<Deployment>::namespaced(meta.clone(), "kok-system")
        .list(&ListParams::default().labels("app.kubernetes.io/instance=kube-on-kube"))
        .await
        .expect("the chart's Deployments");
    let operator = deployments
        .items
        .iter()
        .find(|d| d.name_any().ends_with("kube-on-kube-operator"))
        .unwrap_or_else(|| {
            panic!(
                "no operator Deployment from the chart: {:?}",
                names(&deployments.items)
            )
        });
    assert_available(operator);
    let sa = operator
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_default();
    assert!(
        sa.contains("kube-on-kube"),
        "the chart's ServiceAccount, not {sa:?}"
    );

    let clusters = Api::<Cluster>::all(meta.clone())
        .list(&ListParams::default())
        .await
        .expect("Clusters");
    let mut keys: Vec<String> = clusters
        .iter()
        .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
        .collect();
    keys.sort();
    assert_eq!(keys, ["clusters/prod-east", "default/ci"]);
    for c in &clusters {
        let status = c.status.clone().unwrap_or_default();
        assert_eq!(
            status.phase,
            Some(ClusterPhase::Running),
            "{}",
            c.name_any()
        );
        assert!(
            kube_on_kube_api::cluster::settled(&status.conditions),
            "{}: {:?}",
            c.name_any(),
            status.conditions
        );
        let ns = c.namespace().unwrap_or_default();
        let node_operator = Api::<Deployment>::namespaced(meta.clone(), &ns)
            .get(&format!("{}-node-operator", c.name_any()))
            .await
            .expect("the Cluster's node-operator");
        assert_available(&node_operator);
    }
}

/// The example Machine is a Ready worker, upgraded by the example
/// CanaryRelease; the PackageVersions carry real checksums.
async fn check_workers_cluster(kubeconfig: &Path) {
    let ci = client(kubeconfig).await;
    let machines = Api::<Machine>::all(ci.clone())
        .list(&ListParams::default())
        .await
        .expect("Machines");
    assert_eq!(names(&machines.items), ["worker-a1"]);
    for m in &machines.items {
        let phase = m.status.as_ref().and_then(|s| s.phase);
        assert_eq!(phase, Some(MachinePhase::Ready), "{}", m.name_any());
    }
    let nodes = Api::<Node>::all(ci.clone())
        .list(&ListParams::default())
        .await
        .expect("Nodes");
    assert_eq!(names(&nodes.items), ["worker-a1"]);
    for n in &nodes.items {
        let status = n.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        assert!(ready, "Node {} Ready", n.name_any());
        let kubelet = status
            .node_info
            .map(|i| i.kubelet_version)
            .unwrap_or_default();
        assert_eq!(kubelet, CANARY_KUBELET, "the canary's kubelet runs");
    }
    let canaries = Api::<CanaryRelease>::all(ci.clone())
        .list(&ListParams::default())
        .await
        .expect("CanaryReleases");
    assert!(
        !canaries.items.is_empty(),
        "the example CanaryRelease is applied"
    );
    for c in &canaries.items {
        let phase = c.status.as_ref().and_then(|s| s.phase);
        assert!(
            matches!(phase, Some(CanaryPhase::Succeeded | CanaryPhase::Promoted)),
            "CanaryRelease {}: {phase:?}",
            c.name_any()
        );
    }
    let pods = Api::<Pod>::all(ci.clone())
        .list(&ListParams::default())
        .await
        .expect("Pods");
    assert!(!pods.items.is_empty(), "the add-ons run Pods");
    for pod in &pods.items {
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        assert!(
            matches!(phase.as_deref(), Some("Running" | "Succeeded")),
            "Pod {}/{} is {phase:?}",
            pod.namespace().unwrap_or_default(),
            pod.name_any()
        );
    }
    // The kubelet serves with a certificate of the cluster's CA, which the
    // node-operator approved (metrics-server, ready above, verifies it).
    let csrs = Api::<CertificateSigningRequest>::all(ci.clone())
        .list(&ListParams::default().fields("spec.signerName=kubernetes.io/kubelet-serving"))
        .await
        .expect("CertificateSigningRequests");
    assert!(
        !csrs.items.is_empty(),
        "the kubelet asks for its serving certificate"
    );
    for csr in &csrs.items {
        let status = csr.status.clone().unwrap_or_default();
        let approved = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Approved" && c.status == "True");
        assert!(
            approved && status.certificate.is_some(),
            "CSR {} approved and signed",
            csr.name_any()
        );
    }
    let pvs = Api::<PackageVersion>::all(ci)
        .list(&ListParams::default())
        .await
        .expect("PackageVersions");
    assert!(pvs.items.len() >= 5, "{:?}", names(&pvs.items));
    for pv in &pvs.items {
        for a in &pv.spec.artifacts {
            assert!(
                a.sha256.chars().any(|c| c != '0'),
                "{} carries a real checksum",
                pv.name_any()
            );
        }
    }
}

/// The commands the banner lists under the line `heading` (up to the
/// next blank line), without their indentation.
fn banner_commands(output: &[String], heading: &str) -> Vec<String> {
    let at = output
        .iter()
        .position(|l| l.starts_with(heading))
        .unwrap_or_else(|| panic!("the banner has no {heading:?} section:\n{}", tail(output)));
    output[at + 1..]
        .iter()
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_owned())
        .collect()
}

/// Runs `commands` in one shell in `dir`, stopping at the first that fails.
async fn run_commands(commands: &[String], dir: &Path, limit: Duration) {
    let script = format!("set -euo pipefail\nset -x\n{}\n", commands.join("\n"));
    let out = timeout(
        limit,
        Command::new("bash")
            .arg("-c")
            .arg(&script)
            .current_dir(dir)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("not done after {limit:?}:\n{script}"))
    .expect("bash");
    println!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{script}failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `scripts/conformance.sh --env` with the subset against `cluster` of the
/// running dev environment in `env_dir`: every spec runs and passes.
async fn conformance_subset(repo: &Path, env_dir: &Path, cluster: &str) {
    let out = repo.join("target/conformance-ci");
    let focus = CONFORMANCE_SUBSET
        .iter()
        .map(|s| literal(s))
        .collect::<Vec<_>>()
        .join("|");
    let run = Command::new(repo.join("scripts/conformance.sh"))
        .current_dir(repo)
        .arg("--env")
        .arg(env_dir)
        .args(["--cluster", cluster])
        // One attempt per spec, as a conformance result is: a spec that
        // fails fails the test, named in the summary's Failed table.
        .args(["--focus", &focus, "--no-serial", "--procs", "4", "--out"])
        .arg(&out)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = timeout(CONFORMANCE_WITHIN, run)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "scripts/conformance.sh not done after {CONFORMANCE_WITHIN:?}; see {}",
                out.display()
            )
        })
        .expect("run scripts/conformance.sh");
    println!("{}", String::from_utf8_lossy(&output.stderr));
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap_or_else(|e| {
        panic!(
            "scripts/conformance.sh (exit {}) wrote no summary ({e}); see {}",
            output.status,
            out.display()
        )
    });
    println!("{summary}");
    // It fails for a failed spec and for a suite that failed outside its
    // specs (no report counts that one).
    assert!(
        output.status.success(),
        "scripts/conformance.sh: {}; {}:\n{}",
        output.status,
        out.join("summary.md").display(),
        section(&summary, "Failed").unwrap_or_default()
    );
    let (passed, failed, _) = counts(&summary).expect("counts in summary.md");
    assert_eq!(
        (passed, failed),
        (CONFORMANCE_SUBSET.len(), 0),
        "every spec of the subset runs and passes; {}:\n{}",
        out.join("summary.md").display(),
        section(&summary, "Failed").unwrap_or_default()
    );
}

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

/// The lines of the summary's `## {heading}` section, if it has one.
fn section(summary: &str, heading: &str) -> Option<String> {
    let title = format!("## {heading}");
    let mut lines = summary.lines().skip_while(|l| l.trim() != title).skip(1);
    lines.next()?;
    Some(
        lines
            .take_while(|l| !l.starts_with("## "))
            .collect::<Vec<_>>()
            .join("\n")
            .trim()
            .to_string(),
    )
}

#[test]
fn conformance_counts_are_read_from_the_summary() {
    let summary =
        "# Conformance of `default/ci` at `abc`\n\n15 passed, 1 failed, 0 skipped; 4 min 2 s.\n";
    assert_eq!(counts(summary), Some((15, 1, 0)));
    assert_eq!(counts("nothing ran"), None);
    let summary =
        format!("{summary}\n## Failed\n\n| spec | first line |\n| a | b |\n\n## Passed\n\n- c\n");
    assert_eq!(
        section(&summary, "Failed").as_deref(),
        Some("| spec | first line |\n| a | b |")
    );
    assert_eq!(section(&summary, "Passed on a retry"), None);
    assert_eq!(literal("a (b) [c]"), r"a \(b\) \[c\]");
}

/// Waits until Pod `name` in the default namespace runs.
async fn pod_runs(kubeconfig: &Path, name: &str) {
    let pods = Api::<Pod>::namespaced(client(kubeconfig).await, "default");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let pod = pods.get(name).await.expect("the Pod");
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        if phase.as_deref() == Some("Running") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Pod {name} not Running: {:?}",
            pod.status
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn assert_available(d: &Deployment) {
    let available = d
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Available" && c.status == "True")
        });
    assert!(
        available,
        "Deployment {} available: {:?}",
        d.name_any(),
        d.status
    );
}

fn names<K: ResourceExt>(items: &[K]) -> Vec<String> {
    let mut names: Vec<String> = items.iter().map(ResourceExt::name_any).collect();
    names.sort();
    names
}

/// What a run could leave on the machine.
#[derive(Debug, Default)]
struct Leftovers {
    processes: BTreeSet<String>,
    links: BTreeSet<String>,
    netns: BTreeSet<String>,
    mounts: BTreeSet<String>,
    cgroups: BTreeSet<String>,
}

impl Leftovers {
    fn now() -> Leftovers {
        Leftovers {
            processes: processes(),
            links: lines("ip", &["-o", "link", "show"])
                .into_iter()
                // `name@peer` for one end of a veth pair.
                .filter_map(|l| Some(l.split(':').nth(1)?.split('@').next()?.trim().to_owned()))
                .collect(),
            netns: dir_entries(Path::new("/run/netns")),
            mounts: std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
                .collect(),
            cgroups: cgroups(),
        }
    }

    /// What is here now that was not in `before`.
    fn since(self, before: &Leftovers) -> Leftovers {
        let new = |now: BTreeSet<String>, then: &BTreeSet<String>| -> BTreeSet<String> {
            now.difference(then).cloned().collect()
        };
        Leftovers {
            processes: new(self.processes, &before.processes),
            links: new(self.links, &before.links),
            netns: new(self.netns, &before.netns),
            mounts: new(self.mounts, &before.mounts),
            cgroups: new(self.cgroups, &before.cgroups),
        }
    }

    /// Only what `ours` made: its processes still running, and what
    /// [`kok_testenv::owner_pid`] names one of them as the maker of (or
    /// names no maker of at all).
    fn made_by(self, ours: &Ours) -> Leftovers {
        let seen = ours.seen();
        let pids: BTreeSet<u32> = seen
            .iter()
            .filter_map(|identity| identity.split(' ').next()?.parse().ok())
            .collect();
        let made = |set: BTreeSet<String>| -> BTreeSet<String> {
            set.into_iter()
                .filter(|name| kok_testenv::owner_pid(name).is_none_or(|p| pids.contains(&p)))
                .collect()
        };
        // The parents of the hosts' and containers' cgroups stay while
        // anyone has a child in them.
        let parent_in_use = |dir: &String| {
            (dir.ends_with("/kok-hosts") || dir.ends_with("/kok-pods"))
                && dir_entries(Path::new(dir))
                    .iter()
                    .any(|e| Path::new(dir).join(e).is_dir())
        };
        Leftovers {
            processes: self
                .processes
                .into_iter()
                .filter(|p| {
                    let pid = p.split(' ').next().and_then(|n| n.parse().ok());
                    pid.and_then(kok_testenv::process_identity)
                        .is_some_and(|identity| seen.contains(&identity))
                })
                .collect(),
            links: made(self.links),
            netns: made(self.netns),
            mounts: made(self.mounts),
            cgroups: made(self.cgroups)
                .into_iter()
                .filter(|dir| !parent_in_use(dir))
                .collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.processes.is_empty()
            && self.links.is_empty()
            && self.netns.is_empty()
            && self.mounts.is_empty()
            && self.cgroups.is_empty()
    }
}

/// `pid command line` of every user-space process but this one.
fn processes() -> BTreeSet<String> {
    let me = std::process::id();
    dir_entries(Path::new("/proc"))
        .into_iter()
        .filter_map(|pid| pid.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            if cmdline.is_empty() {
                return None; // a kernel thread
            }
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            Some(format!("{pid} {}", text.trim()))
        })
        .collect()
}

/// Every process this test started, directly or not, as `pid start-time`
/// records ([`kok_testenv::process_identity`]), sampled while it runs: what
/// it may leave behind. A process that has been orphaned is no longer a
/// descendant, so the samples are taken all along.
#[derive(Clone, Default)]
struct Ours(std::sync::Arc<std::sync::Mutex<BTreeSet<String>>>);

impl Ours {
    fn seen(&self) -> BTreeSet<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn sample(&self) {
        let me = std::process::id();
        let descends = |pid: u32| {
            let mut at = pid;
            for _ in 0..64 {
                match kok_testenv::parent_of(at) {
                    Some(p) if p == me => return true,
                    Some(p) if p > 1 => at = p,
                    _ => return false,
                }
            }
            false
        };
        let found: Vec<String> = dir_entries(Path::new("/proc"))
            .into_iter()
            .filter_map(|pid| pid.parse::<u32>().ok())
            .filter(|&pid| pid != me && descends(pid))
            .filter_map(kok_testenv::process_identity)
            .collect();
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(found);
    }

    async fn sample_every(self, period: Duration) {
        loop {
            self.sample();
            tokio::time::sleep(period).await;
        }
    }
}

/// Every cgroup directory the test hosts and the Pods' containers use, in
/// every hierarchy.
fn cgroups() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for hierarchy in dir_entries(Path::new("/sys/fs/cgroup")) {
        for parent in ["kok-hosts", "kok-pods"] {
            let root = PathBuf::from("/sys/fs/cgroup")
                .join(&hierarchy)
                .join(parent);
            if root.is_dir() {
                found.insert(root.display().to_string());
            }
            for entry in dir_entries(&root) {
                let dir = root.join(entry);
                if dir.is_dir() {
                    found.insert(dir.display().to_string());
                }
            }
        }
    }
    found
}

fn dir_entries(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn lines(program: &str, args: &[&str]) -> Vec<String> {
    std::process::Command::new(program)
        .args(args)
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Sends each line of `stream` to `tx`, prefixed, until the stream closes.
async fn collect(
    stream: impl AsyncRead + Unpin,
    prefix: &'static str,
    tx: mpsc::UnboundedSender<String>,
) {
    let mut reader = BufReader::new(stream).lines();
    while let Ok(Some(line)) = reader.next_line().await {
        if tx.send(format!("{prefix}{line}")).is_err() {
            return;
        }
    }
}

async fn client(kubeconfig: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("kok-dev-env wrote the kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("a usable kubeconfig");
    Client::try_from(config).expect("client")
}

/// The last lines of the program's output, for failure messages.
fn tail(output: &[String]) -> String {
    let from = output.len().saturating_sub(80);
    output[from..].join("\n")
}
