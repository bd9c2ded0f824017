//! The peer: `kubeadm init` on one SSH test host and `kubeadm join` on the
//! others, as its best users run it. The hosts are prepared first, by
//! default off the clock, as a golden image would have them (see
//! [`HostStart`] for the other starts): the same runc, containerd, CNI
//! plugins and crictl as node-operator's PackageVersions (installed by
//! node-operator's installer, so the files and units are the same), the same
//! kernel parameters, the kubelet and kubeadm binaries, the kubelet unit
//! with kubeadm's drop-in as its packages ship it, and (unless asked not to)
//! kubeadm's images pulled. On the clock: `kubeadm
//! init` with one config file, then at once the joins (file discovery: the
//! cluster's CA and address handed to them, with the token `init` printed), the pod
//! network (kube-router, the same manifest as kube-on-kube's add-on) and the
//! workload, until the workload's Pod on every worker is Ready.

use std::process::Output;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use kok_testenv::hosts::{HostsOptions, TestHost, TestHosts};
use kok_testenv::node_software;
use kube::Client;
use node_operator::install::Installer;
use node_operator::machine::plan;

use crate::measure::Meter;
use crate::provision::on_every_host;
use crate::workers::site::{Site, probe};
use crate::workers::timeline::Timeline;
use crate::workers::{wait_addons, wait_workloads};

/// The Kubernetes version both tools run.
const KUBERNETES_VERSION: &str = "v1.35.4";
/// The CoreDNS image tag of kube-on-kube's add-on (kubeadm's own default,
/// v1.13.1, is not built into the test registry).
const COREDNS_TAG: &str = "v1.12.1";
/// The Pod network, as kube-on-kube's example Clusters have it.
const POD_SUBNET: &str = "10.244.0.0/16";
/// kube-on-kube's kube-router add-on, as rendered for its golden test.
const KUBE_ROUTER: &str =
    include_str!("../../../crates/kube-on-kube-operator/src/render/addons/golden/kube-router.yaml");
/// The API address in that rendering.
const GOLDEN_SERVER: &str = "https://api.prod-east.example.com:6443";

/// One run, in seconds from `kubeadm init`.
#[derive(Clone, Debug)]
pub struct KubeadmRun {
    /// `kubeadm init` exited: the control plane answers, its add-ons applied.
    pub init_s: f64,
    /// Per worker: Node Ready, a Pod Running on it, the workload Pod Ready.
    pub workers: Vec<(f64, f64, f64)>,
    /// Until every worker's workload Pod was Ready.
    pub all_s: f64,
    /// Until kube-proxy and kube-router were Ready on every worker and
    /// CoreDNS available.
    pub addons_s: f64,
    /// CPU of everything on the hosts until then.
    pub hosts_cpu_s: f64,
    /// Preparing the hosts (on the clock for bare hosts).
    pub prepare_s: f64,
}

/// How kubeadm's hosts start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HostStart {
    /// As from a golden image: the node software installed and kubeadm's
    /// images pulled, off the clock.
    Golden,
    /// The node software installed off the clock; the images pulled on it,
    /// by `kubeadm init` and the kubelets.
    GoldenWithoutImages,
    /// Bare: the node software installed on the clock, by node-operator's
    /// installer run in-process on every host at once (the fastest
    /// installer there is here), then kubeadm as above.
    Bare,
}

impl HostStart {
    pub fn describe(self) -> &'static str {
        match self {
            HostStart::Golden => {
                "prepared off the clock, as from a golden image (node software installed, kubeadm's images pulled)"
            }
            HostStart::GoldenWithoutImages => {
                "prepared off the clock with the node software installed; kubeadm's images pulled on the clock"
            }
            HostStart::Bare => {
                "bare: the node software installed on the clock by node-operator's installer run in-process, images pulled on the clock"
            }
        }
    }
}

/// Prepares `1 + workers` fresh hosts and times kubeadm on them.
pub async fn one_run(
    site: &Site,
    workers: usize,
    start: HostStart,
    timeout: Duration,
) -> Result<KubeadmRun> {
    // etcd's data directory is the control-plane host's own, as on a real
    // host (the hosts share the machine's other directories).
    let options = HostsOptions {
        count: 1 + workers,
        extra_private_dirs: vec!["/var/lib/etcd".into()],
    };
    let hosts = tokio::task::block_in_place(|| TestHosts::start_with(options))
        .context("start the hosts")?;
    let control_plane = &hosts.hosts()[0];
    let config = init_config(control_plane);
    let mut cpu_before: f64 = hosts_cpu(&hosts);
    let mut meter = Meter::start();
    let mut started = Instant::now();
    prepare(site, &hosts, &config, start == HostStart::Golden)
        .await
        .context("prepare the hosts")?;
    let prepare_s = started.elapsed().as_secs_f64();
    if start != HostStart::Bare {
        // The clock starts now.
        cpu_before = hosts_cpu(&hosts);
        meter = Meter::start();
        started = Instant::now();
    }
    // Each line of its output stamped with the time it came, for the log.
    let init = stamped(
        control_plane,
        "init",
        "kubeadm init --config /etc/kubernetes/kubeadm.yaml --ignore-preflight-errors=all",
    )
    .await?;
    let init_s = started.elapsed().as_secs_f64();
    let token = join_token(&init)?;
    let admin = ssh(control_plane, "cat /etc/kubernetes/admin.conf").await?;
    let client = admin_client(&admin.stdout).await?;
    let timeline = Timeline::start(&client);
    let endpoint = format!("{}:6443", control_plane.ip());
    // File discovery: the workers get the cluster's CA and address with the
    // join command, and need not wait (5 s at a time) for the controller
    // manager to sign the cluster-info ConfigMap for the new token, as
    // token discovery does.
    let discovery = discovery_kubeconfig(&admin.stdout)?;
    let joins = hosts.hosts()[1..].iter().map(|host| {
        let command = format!(
            "cat >/etc/kubernetes/discovery.conf <<'EOF'\n{discovery}EOF\n\
             kubeadm join --discovery-file /etc/kubernetes/discovery.conf --tls-bootstrap-token {token} \
             --node-name {} --ignore-preflight-errors=all",
            host.name()
        );
        async move { stamped(host, "join", &command).await }
    });
    let network = async {
        kubectl_apply(&admin.stdout, &kube_router(&endpoint)).await?;
        probe(&client).await
    };
    let (joined, network) = tokio::join!(futures::future::join_all(joins), network);
    for j in joined {
        j.context("kubeadm join")?;
    }
    network.context("the pod network and the workload")?;
    let worker_names: Vec<&str> = hosts.hosts()[1..].iter().map(TestHost::name).collect();
    wait_workloads(&timeline, &worker_names, started, timeout).await?;
    let cost = meter.stop();
    let addons_s = wait_addons(&client, &worker_names, started, timeout).await?;
    let since = |t: Option<Instant>| t.map_or(f64::NAN, |t| (t - started).as_secs_f64());
    let workers = hosts.hosts()[1..]
        .iter()
        .map(|h| {
            let seen = timeline.get(h.name());
            (
                since(seen.ready),
                since(seen.first_running.map(|(t, _)| t)),
                since(seen.workload_ready),
            )
        })
        .collect();
    Ok(KubeadmRun {
        init_s,
        workers,
        all_s: cost.wall_s,
        addons_s,
        hosts_cpu_s: hosts_cpu(&hosts) - cpu_before,
        prepare_s,
    })
}

fn hosts_cpu(hosts: &TestHosts) -> f64 {
    hosts
        .hosts()
        .iter()
        .filter_map(|h| h.cpu_time())
        .map(|t| t.as_secs_f64())
        .sum()
}

/// The golden image: node-operator's PackageVersions but the kubelet's,
/// the Machine's kernel parameters, the kubelet and kubeadm binaries, the
/// kubelet unit with kubeadm's drop-in (enabled, not started: `kubeadm`
/// starts it), the host's own kubelet flags in a drop-in of their own
/// (`/etc/default/kubelet` is the machine's, shared by every host), and
/// kubeadm's config file. With `prepull`, every image kubeadm runs already
/// pulled (`kubeadm config images pull`), as golden images have them.
async fn prepare(site: &Site, hosts: &TestHosts, config: &str, prepull: bool) -> Result<()> {
    let kubeadm = kok_testenv::bins::bin("kubeadm")
        .context("no kubeadm: run scripts/testenv-bins.sh --kubeadm")?;
    std::fs::copy(&kubeadm, site.depot.artifacts_dir().join("kubeadm"))?;
    let kubeadm_url = site.depot.artifact_url("kubeadm");
    let kubelet_url = site
        .packages
        .iter()
        .find(|w| w.package == "kubelet")
        .and_then(|w| w.spec.artifacts.first())
        .map(|a| a.url.clone())
        .context("no kubelet package")?;
    let (kubeadm_url, kubelet_url) = (&kubeadm_url, &kubelet_url);
    on_every_host(hosts, hosts.hosts().len(), async |session, host| {
        let machine = node_software::example_machine(host, "zone-0")?;
        let values = plan::template_values(&machine, &site.cluster_values);
        let sysctls: String = machine
            .spec
            .sysctls
            .iter()
            .map(|(k, v)| format!("sysctl -q -w {k}={v} && "))
            .collect();
        // A real host resolves its own name (the installer or cloud-init
        // writes it into /etc/hosts); kubeadm's preflight looks it up. /etc
        // is the host's own overlay.
        let script = format!(
            "set -e; {sysctls} true
             echo '{ip} {name}' >>/etc/hosts
             curl -fsS -o /usr/local/bin/kubelet {kubelet_url}
             curl -fsS -o /usr/local/bin/kubeadm {kubeadm_url}
             chmod 0755 /usr/local/bin/kubelet /usr/local/bin/kubeadm
             mkdir -p /etc/systemd/system/kubelet.service.d /etc/kubernetes/manifests
             cat >/etc/systemd/system/kubelet.service <<'EOF'\n{KUBELET_UNIT}EOF
             cat >/etc/systemd/system/kubelet.service.d/10-kubeadm.conf <<'EOF'\n{KUBEADM_DROP_IN}EOF
             printf '[Service]\nEnvironment=\"KUBELET_EXTRA_ARGS=--cgroup-root={} --node-ip={}\"\n' \
               >/etc/systemd/system/kubelet.service.d/20-host.conf
             systemctl daemon-reload && systemctl enable kubelet.service
             cat >/etc/kubernetes/kubeadm.yaml <<'EOF'\n{config}EOF
             {pull}",
            host.cgroup_root(),
            host.ip(),
            ip = host.ip(),
            name = host.name(),
            pull = if prepull {
                "kubeadm config images pull --config /etc/kubernetes/kubeadm.yaml >/dev/null"
            } else {
                ""
            },
        );
        let installer = Installer::new(session);
        for w in site.packages.iter().filter(|w| w.package != "kubelet") {
            installer.install(&w.spec, &values).await?;
        }
        let out = session.run(&script).await?;
        if out.status != 0 {
            bail!("{}: {}", host.name(), out.stderr.trim());
        }
        Ok(())
    })
    .await?;
    Ok(())
}

/// The kubelet unit of upstream's packages (`kubelet.service` of
/// kubernetes/release), with the binary where these hosts have it.
const KUBELET_UNIT: &str = "[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/local/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
";

/// kubeadm's drop-in of the same packages (`10-kubeadm.conf`).
const KUBEADM_DROP_IN: &str = "[Service]
Environment=\"KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf\"
Environment=\"KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml\"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/local/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
";

/// `kubeadm init`'s configuration: the control plane's address, the Pod
/// network, the CoreDNS tag of the test registry,
/// and for the kubelet and kube-proxy what kube-on-kube's nodes get on these
/// hosts (cgroupfs, cgroup v1 allowed, disk eviction at 1%, the conntrack
/// table left to the machine).
fn init_config(host: &TestHost) -> String {
    let cgroup_v1 = node_software::machine_has_cgroup_v1_only();
    format!(
        "apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: {ip}
  bindPort: 6443
nodeRegistration:
  name: {name}
  criSocket: unix:///run/containerd/containerd.sock
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: {KUBERNETES_VERSION}
controlPlaneEndpoint: {ip}:6443
networking:
  podSubnet: {POD_SUBNET}
dns:
  imageTag: {COREDNS_TAG}
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: {fail_cgroup_v1}
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
conntrack:
  maxPerCore: 0
",
        ip = host.ip(),
        name = host.name(),
        fail_cgroup_v1 = !cgroup_v1,
    )
}

/// The bootstrap token of the join command `kubeadm init` prints.
fn join_token(init_output: &str) -> Result<String> {
    init_output
        .split_whitespace()
        .skip_while(|w| *w != "--token")
        .nth(1)
        .filter(|t| {
            t.split_once('.').is_some_and(|(id, secret)| {
                id.len() == 6
                    && secret.len() == 16
                    && t.bytes()
                        .all(|b| b == b'.' || b.is_ascii_lowercase() || b.is_ascii_digit())
            })
        })
        .map(str::to_string)
        .with_context(|| format!("no join command in kubeadm init's output:\n{init_output}"))
}

/// What `kubeadm join --discovery-file` reads: the admin kubeconfig's
/// cluster (its CA and API address), without its credentials.
fn discovery_kubeconfig(admin_conf: &[u8]) -> Result<String> {
    let admin: serde_json::Value = serde_norway::from_slice(admin_conf)?;
    let cluster = admin["clusters"][0]["cluster"].clone();
    if cluster["certificate-authority-data"].as_str().is_none()
        || cluster["server"].as_str().is_none()
    {
        bail!("the admin kubeconfig has no cluster CA or server");
    }
    let discovery = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kubernetes", "cluster": cluster}],
        "contexts": [{"name": "discovery", "context": {"cluster": "kubernetes", "user": "discovery"}}],
        "current-context": "discovery",
        "users": [{"name": "discovery", "user": {}}],
    });
    Ok(serde_norway::to_string(&discovery)?)
}

/// kube-on-kube's kube-router add-on for a cluster whose API is `endpoint`,
/// without kube-on-kube's labels.
fn kube_router(endpoint: &str) -> String {
    KUBE_ROUTER
        .replace(GOLDEN_SERVER, &format!("https://{endpoint}"))
        .lines()
        .filter(|l| {
            !l.contains("app.kubernetes.io/managed-by: kube-on-kube-operator")
                && !l.contains("kubeonkube.io/addon:")
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

async fn ssh(host: &TestHost, command: &str) -> Result<Output> {
    let ssh = host.ssh_command(command, Duration::from_secs(10));
    let out = tokio::process::Command::from(ssh).output().await?;
    if !out.status.success() {
        bail!(
            "{command} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(out)
}

/// Runs `command` on `host` with each line of its output stamped with the
/// time it came, keeps that under `target/testenv-logs/`, and returns it.
async fn stamped(host: &TestHost, what: &str, command: &str) -> Result<String> {
    let result = ssh(
        host,
        &format!(
            "set -o pipefail; {command} 2>&1 | while IFS= read -r l; do echo \"$(date +%T.%3N) $l\"; done"
        ),
    )
    .await;
    let output = match &result {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Err(e) => format!("{e:#}"),
    };
    keep_log(&format!("kubeadm-{what}-{}.log", host.name()), &output);
    result.map(|_| output)
}

/// Keeps `text` under `target/testenv-logs/`, where the environment's other
/// logs are.
fn keep_log(name: &str, text: &str) {
    let dir = std::path::Path::new("target/testenv-logs");
    if std::fs::create_dir_all(dir).is_ok() {
        let _ = std::fs::write(dir.join(name), text);
    }
}

async fn admin_client(admin_conf: &[u8]) -> Result<Client> {
    let kubeconfig: kube::config::Kubeconfig = serde_norway::from_slice(admin_conf)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(Client::try_from(config)?)
}

/// `kubectl apply -f -` with the admin kubeconfig, as a kubeadm user
/// applies a pod network.
async fn kubectl_apply(admin_conf: &[u8], manifest: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("admin.conf");
    std::fs::write(&kubeconfig, admin_conf)?;
    let kubectl = kok_testenv::bins::bin("kubectl")?;
    let mut child = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    {
        use tokio::io::AsyncWriteExt as _;
        let mut stdin = child.stdin.take().context("no stdin")?;
        stdin.write_all(manifest.as_bytes()).await?;
    }
    let out = child.wait_with_output().await?;
    if !out.status.success() {
        bail!("kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_read_from_the_join_command() {
        let out = "Then you can join any number of worker nodes by running:\n\nkubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef \\\n\t--discovery-token-ca-cert-hash sha256:00\n";
        assert_eq!(join_token(out).unwrap(), "abcdef.0123456789abcdef");
        assert!(join_token("kubeadm join --token ABC.def").is_err());
        assert!(join_token("no join command").is_err());
    }

    #[test]
    fn discovery_carries_the_cluster_and_no_credentials() {
        let admin = b"apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    certificate-authority-data: Q0E=\n    server: https://10.0.0.1:6443\nusers:\n- name: admin\n  user:\n    client-key-data: S0VZ\n";
        let d = discovery_kubeconfig(admin).unwrap();
        assert!(d.contains("certificate-authority-data: Q0E="), "{d}");
        assert!(d.contains("server: https://10.0.0.1:6443"), "{d}");
        assert!(!d.contains("S0VZ"), "{d}");
        assert!(discovery_kubeconfig(b"clusters: []").is_err());
    }

    #[test]
    fn the_pod_network_is_kube_on_kubes_without_its_labels() {
        let m = kube_router("10.1.2.3:6443");
        assert!(m.contains("server: \"https://10.1.2.3:6443\""), "{m}");
        assert!(!m.contains("kube-on-kube"));
        assert!(m.contains("kind: DaemonSet"));
    }
}
