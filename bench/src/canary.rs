//! Benchmark 4: upgrade throughput and how fast a bad version is stopped, on
//! the same number of SSH test hosts with node-operator and with an Ansible
//! rolling upgrade (`bench/ansible/upgrade.yml`, `serial` as kubespray rolls
//! nodes).
//!
//! node-operator runs as its own process against a business cluster (real
//! kube-apiserver and etcd; kwok keeps one Ready Node per host, as a kubelet
//! would). Its Machines are first provisioned through the Machine controller,
//! then:
//! - the ClusterPackageVersion's kubelet moves to a new version with
//!   `maxUnavailable`: Machines upgraded per minute, and the most Machines
//!   seen unavailable at once;
//! - a CanaryRelease (failure budget 0) rolls a kubelet whose health check
//!   fails: time from the first failed health check on any host to the
//!   release being Halted.
//!
//! Ansible does the same on fresh hosts: the first versions installed (by
//! node-operator's installer, which leaves the same files as provision.yml,
//! checked on every host; or by provision.yml itself with
//! `--ansible-provision`, which takes about 18 minutes on 200 hosts), then
//! upgrade.yml with `serial` equal to `maxUnavailable`, then the broken
//! version with `max_fail_percentage: 0` (time from the first failed health
//! check to the play ending). Both tools run the same health check, which
//! records on the host when it failed, so both clocks start alike.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kok_testenv::hosts::{HostsOptions, TestHosts};
use kok_testenv::kube_env::{KubeEnv, Options};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube_on_kube_api::canary::CanaryPhase;
use kube_on_kube_api::machine::MachinePhase;
use kube_on_kube_api::{CanaryRelease, ClusterPackageVersion, Machine, PackageVersion};
use serde_json::json;

use crate::measure::median;
use crate::packages::{self, HEALTH_FAILURES, Package};
use crate::peer::{Ansible, AnsibleArgs, Tool, playbook};
use crate::provision::install_all;

const MANAGER: &str = "kok-bench";
const SSH_KEY_SECRET: &str = "node-ssh-key";

/// Flags of `kok-bench canary`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of SSH test hosts (at most 253).
    #[arg(long, default_value_t = 200)]
    pub hosts: usize,
    /// Machines upgraded at once: the ClusterPackageVersion's
    /// `maxUnavailable`, the CanaryRelease's first batch and Ansible's
    /// `serial`.
    #[arg(long, default_value = "10%")]
    pub max_unavailable: String,
    /// Hosts worked on at once while provisioning: node-operator's SSH
    /// concurrency and Ansible's `--forks`.
    #[arg(long, default_value_t = 50)]
    pub parallel: usize,
    /// Size of each artifact's payload in MiB.
    #[arg(long, default_value_t = 1)]
    pub payload_mib: usize,
    /// Runs of each tool, taking turns going first; the table reports
    /// medians.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Give up on any one phase after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// The tools to compare (`node-operator`, `ansible`, `mitogen`), each
    /// as its best users run it (see `bench/src/peer.rs`).
    #[arg(long, value_delimiter = ',', default_values_t = ["node-operator".to_string(), "ansible".to_string(), "mitogen".to_string()])]
    pub tools: Vec<String>,
    /// Where Ansible is, and its strategy.
    #[command(flatten)]
    pub ansible: AnsibleArgs,
    /// Install the first versions on Ansible's hosts with provision.yml and
    /// report its time, rather than with node-operator's installer (the same
    /// files on the hosts, in a fraction of the time). Provisioning itself is
    /// compared by `kok-bench provision`.
    #[arg(long)]
    pub ansible_provision: bool,
    /// Append the results table to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// What one tool did in one run.
#[derive(Debug, Default, Clone)]
struct Sample {
    /// Not measured for Ansible without `--ansible-provision`.
    provision_s: Option<f64>,
    upgrade_s: f64,
    most_unavailable: usize,
    halt_s: f64,
    upgraded_before_halt: usize,
}

/// Runs the benchmark and prints (and optionally appends) the table.
pub async fn run(args: Args) -> Result<()> {
    let tools = Tool::parse_all(&args.tools)?;
    let ansible = Ansible::find(&args.ansible)?;
    let mut samples: Vec<(usize, Tool, Sample)> = Vec::new();
    for run in 0..args.runs {
        for tool in Tool::rotation(&tools, run) {
            let s = match tool {
                Tool::NodeOperator => node_operator(&args).await?,
                peer => playbooks(&args, peer, &ansible).await?,
            };
            eprintln!("run {}/{} {}: {s:?}", run + 1, args.runs, tool.label());
            samples.push((run, tool, s));
        }
    }
    let table = table(&args, &tools, &samples);
    println!("{table}");
    crate::append(args.out.as_deref(), &table)
}

fn hosts(count: usize) -> Result<TestHosts> {
    Ok(TestHosts::start_with(HostsOptions {
        count,
        extra_private_dirs: vec!["/root".into(), "/etc/sysctl.d".into()],
    })?)
}

/// Seconds since the epoch of the first failed health check on any host.
fn first_failure(hosts: &TestHosts) -> Option<f64> {
    hosts
        .hosts()
        .iter()
        .filter_map(|h| {
            let out = h.ssh(&format!("head -n 1 {HEALTH_FAILURES} 2>/dev/null"));
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .reduce(f64::min)
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// How many hosts `max_unavailable` (a count or a percentage) stands for:
/// node-operator's own rollout budget, so Ansible's `serial` is the same.
fn batch_size(max_unavailable: &str, hosts: usize) -> usize {
    let value = match max_unavailable.trim().parse::<i32>() {
        Ok(n) => IntOrString::Int(n),
        Err(_) => IntOrString::String(max_unavailable.trim().to_string()),
    };
    node_operator::rollout::max_unavailable(&value, hosts).min(hosts.max(1))
}

async fn node_operator(args: &Args) -> Result<Sample> {
    let binary = crate::fleet::sibling("node-operator")?;
    let env = KubeEnv::start(Options {
        controller_manager: false,
        scheduler: false,
        kwok_nodes: 1,
        install_crds: true,
        controller_manager_qps: None,
        node_monitor_grace: None,
        real_nodes: None,
    })
    .context("start the business cluster")?;
    let client = env.client().await;
    let hosts = hosts(args.hosts)?;
    let v1 = packages::build(&hosts, "1.0.0", args.payload_mib)?;
    let v2 = packages::build_kubelet(&hosts, "2.0.0", args.payload_mib, false)?;
    let broken = packages::build_kubelet(&hosts, "3.0.0", args.payload_mib, true)?;
    for p in v1.iter().chain([&v2, &broken]) {
        apply_package_version(&client, p).await?;
    }
    let defaults: BTreeMap<String, String> = v1
        .iter()
        .map(|p| (p.spec.package.clone(), p.name.clone()))
        .collect();
    apply_cluster_defaults(&client, &defaults, &args.max_unavailable).await?;
    cluster_info(&client, &env).await?;
    ssh_key(&client, &hosts).await?;
    let names: Vec<String> = hosts.hosts().iter().map(|h| h.name().to_string()).collect();
    crate::steady::create_nodes(&client, &names, false).await?;
    crate::steady::wait_nodes_ready(&client, names.len(), Duration::from_secs(args.timeout))
        .await?;

    let log = env.log_dir().join("node-operator.log");
    let mut child = Command::new(&binary)
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .arg(format!("--ssh-concurrency={}", args.parallel))
        .arg(format!("--concurrency={}", args.parallel.max(32)))
        .args([
            "--http-address=127.0.0.1:0",
            // Only the changes being measured open sessions.
            "--recheck-interval=1h",
            "--node-wait=60s",
            "--cluster-dns=10.0.0.10",
            // The level an operator runs at: debug logging would be measured too.
            "--log-level=info",
        ])
        .stdout(Stdio::from(std::fs::File::create(&log)?))
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("start {}", binary.display()))?;
    let result = drive(args, &client, &hosts, &defaults, &v2, &broken, &mut child).await;
    let _ = child.kill();
    let _ = child.wait();
    result.with_context(|| format!("node-operator log: {}", log.display()))
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    args: &Args,
    client: &Client,
    hosts: &TestHosts,
    defaults: &BTreeMap<String, String>,
    v2: &Package,
    broken: &Package,
    child: &mut Child,
) -> Result<Sample> {
    let machines: Api<Machine> = Api::all(client.clone());
    let timeout = Duration::from_secs(args.timeout);
    let mut sample = Sample::default();

    // Provisioning through the Machine controller.
    let t = Instant::now();
    for host in hosts.hosts() {
        let machine = json!({
            "apiVersion": "kubeonkube.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": host.name(), "labels": {"pool": "bench"}},
            "spec": {
                "ip": host.ip().to_string(),
                "ssh": {
                    "user": "root",
                    "port": host.port(),
                    "privateKeySecretRef": {"name": SSH_KEY_SECRET, "namespace": "kube-system"},
                    "hostPublicKey": host.host_public_key(),
                },
            },
        });
        apply(&machines, host.name(), &machine).await?;
    }
    let kubelet_v1 = defaults.get("kubelet").context("no default kubelet")?;
    wait_machines(&machines, child, kubelet_v1, timeout, None).await?;
    let provision_s = t.elapsed().as_secs_f64();
    sample.provision_s = Some(provision_s);
    eprintln!(
        "node-operator: {} Machines provisioned in {provision_s:.1}s",
        args.hosts
    );

    // The cluster default moves to the next kubelet.
    let t = Instant::now();
    let mut upgraded = defaults.clone();
    upgraded.insert("kubelet".into(), v2.name.clone());
    apply_cluster_defaults(client, &upgraded, &args.max_unavailable).await?;
    wait_machines(
        &machines,
        child,
        &v2.name,
        timeout,
        Some(&mut sample.most_unavailable),
    )
    .await?;
    sample.upgrade_s = t.elapsed().as_secs_f64();
    eprintln!(
        "node-operator: upgraded in {:.1}s, at most {} unavailable at once",
        sample.upgrade_s, sample.most_unavailable
    );

    // A canary of a kubelet whose health check fails.
    let release = json!({
        "apiVersion": "kubeonkube.io/v1alpha1",
        "kind": "CanaryRelease",
        "metadata": {"name": "broken-kubelet"},
        "spec": {
            "selector": {"matchLabels": {"pool": "bench"}},
            "packages": {"kubelet": broken.name},
            "batches": [int_or_percent(&args.max_unavailable), "100%"],
            "pauseBetweenBatches": "0s",
            "healthGates": {"nodeReady": true, "packageHealth": true, "timeout": "5m"},
            "failureBudget": 0,
            "autoRollback": false,
        },
    });
    let releases: Api<CanaryRelease> = Api::all(client.clone());
    apply(&releases, "broken-kubelet", &release).await?;
    let deadline = Instant::now() + timeout;
    let halted_at = loop {
        if let Some(status) = releases.get("broken-kubelet").await?.status
            && status.phase == Some(CanaryPhase::Halted)
        {
            break now_s();
        }
        if Instant::now() > deadline {
            bail!("the CanaryRelease did not halt within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let first = first_failure(hosts).context("no host recorded a failed health check")?;
    sample.halt_s = halted_at - first;
    sample.upgraded_before_halt = hosts_that_ran(hosts, &broken.spec.version);
    Ok(sample)
}

/// Waits until every Machine is Ready with `kubelet` installed and healthy;
/// counts the most Machines seen not Ready at once into `most_unavailable`
/// (and says which they were) when given. Follows a watch, as a controller
/// would, so every change is seen and the API server is not polled while the
/// operator under measurement works.
async fn wait_machines(
    machines: &Api<Machine>,
    child: &mut Child,
    kubelet: &str,
    timeout: Duration,
    mut most_unavailable: Option<&mut usize>,
) -> Result<()> {
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(machines.clone(), watcher::Config::default()),
    )
    .default_backoff();
    let mut stream = std::pin::pin!(stream);
    let deadline = Instant::now() + timeout;
    let mut last_report = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            bail!("node-operator exited ({status})");
        }
        match tokio::time::timeout(Duration::from_secs(1), stream.next()).await {
            Ok(Some(Err(e))) => eprintln!("  watching Machines: {e}"),
            Ok(None) => bail!("the watch of Machines ended"),
            Ok(Some(Ok(_))) | Err(_) => {}
        }
        let list = reader.state();
        let ready = |m: &Machine| {
            m.status
                .as_ref()
                .is_some_and(|s| s.phase == Some(MachinePhase::Ready))
        };
        let unavailable: Vec<String> = list
            .iter()
            .filter(|m| !ready(m))
            .map(|m| {
                let phase = m.status.as_ref().and_then(|s| s.phase);
                format!(
                    "{}={phase:?}",
                    m.metadata.name.as_deref().unwrap_or_default()
                )
            })
            .collect();
        if let Some(most) = most_unavailable.as_deref_mut()
            && unavailable.len() > *most
        {
            *most = unavailable.len();
            eprintln!(
                "  {} unavailable at once: {}",
                unavailable.len(),
                unavailable.join(" ")
            );
        }
        let done = list
            .iter()
            .filter(|m| {
                ready(m)
                    && m.status.as_ref().is_some_and(|s| {
                        s.installed
                            .get("kubelet")
                            .is_some_and(|i| i.package_version == kubelet && i.healthy)
                    })
            })
            .count();
        if done == list.len() && !list.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{done} of {} Machines at {kubelet} after {timeout:?}",
                list.len()
            );
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!("  {done}/{} Machines at {kubelet}", list.len());
            last_report = Instant::now();
        }
    }
}

/// Hosts whose kubelet `current` points at `version`.
fn hosts_that_ran(hosts: &TestHosts, version: &str) -> usize {
    hosts
        .hosts()
        .iter()
        .filter(|h| {
            let out = h.ssh("readlink /opt/kube-on-kube/packages/kubelet/current");
            String::from_utf8_lossy(&out.stdout).trim() == version
        })
        .count()
}

async fn apply_package_version(client: &Client, p: &Package) -> Result<()> {
    let pv = serde_json::to_value(PackageVersion::new(&p.name, p.spec.clone()))?;
    apply(&Api::<PackageVersion>::all(client.clone()), &p.name, &pv).await
}

/// Server-side apply of `object` (forced, as the benchmark's field manager).
pub(crate) async fn apply<K>(api: &Api<K>, name: &str, object: &serde_json::Value) -> Result<()>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .with_context(|| format!("apply {} {name}", K::kind(&())))?;
    Ok(())
}

/// A count as a number, a percentage as a string, as int-or-string fields
/// want them.
fn int_or_percent(text: &str) -> serde_json::Value {
    match text.trim().parse::<i64>() {
        Ok(n) => n.into(),
        Err(_) => text.trim().into(),
    }
}

async fn apply_cluster_defaults(
    client: &Client,
    packages: &BTreeMap<String, String>,
    max_unavailable: &str,
) -> Result<()> {
    let max = int_or_percent(max_unavailable);
    let cpv = json!({
        "apiVersion": "kubeonkube.io/v1alpha1",
        "kind": "ClusterPackageVersion",
        "metadata": {"name": "default"},
        "spec": {"packages": packages, "rollout": {"maxUnavailable": max}},
    });
    apply(
        &Api::<ClusterPackageVersion>::all(client.clone()),
        "default",
        &cpv,
    )
    .await
}

/// `kube-public/cluster-info`, as the bootstrap add-on publishes it: the
/// node-operator reads the API address and CA for the kubelet's bootstrap
/// kubeconfig from it.
async fn cluster_info(client: &Client, env: &KubeEnv) -> Result<()> {
    let cluster = env
        .kubeconfig()
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .context("the test kubeconfig names no cluster")?;
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "", "cluster": {
            "server": env.api_url(),
            "certificate-authority-data": cluster.certificate_authority_data,
        }}],
    });
    let cm = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cluster-info", "namespace": "kube-public"},
        "data": {"kubeconfig": serde_norway::to_string(&kubeconfig)?},
    });
    apply(
        &Api::<ConfigMap>::namespaced(client.clone(), "kube-public"),
        "cluster-info",
        &cm,
    )
    .await
}

async fn ssh_key(client: &Client, hosts: &TestHosts) -> Result<()> {
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SSH_KEY_SECRET, "namespace": "kube-system"},
        "type": "kubernetes.io/ssh-auth",
        "stringData": {"ssh-privatekey": hosts.client_private_key_pem()},
    });
    apply(
        &Api::<Secret>::namespaced(client.clone(), "kube-system"),
        SSH_KEY_SECRET,
        &secret,
    )
    .await
}

async fn playbooks(args: &Args, tool: Tool, ansible: &Ansible) -> Result<Sample> {
    let hosts = hosts(args.hosts)?;
    let v1 = packages::build(&hosts, "1.0.0", args.payload_mib)?;
    let v2 = packages::build_kubelet(&hosts, "2.0.0", args.payload_mib, false)?;
    let broken = packages::build_kubelet(&hosts, "3.0.0", args.payload_mib, true)?;
    let mut sample = Sample::default();

    if args.ansible_provision {
        let vars = json!({"packages": v1.iter().map(|p| p.ansible.clone()).collect::<Vec<_>>()});
        let run = playbook(&hosts, "provision.yml", &vars, args.parallel, tool, ansible)?;
        run.succeeded()?;
        sample.provision_s = Some(run.cost.wall_s);
        eprintln!(
            "{}: {} hosts provisioned in {:.1}s",
            tool.label(),
            args.hosts,
            run.cost.wall_s
        );
    } else {
        let cost = install_all(&hosts, &v1, args.parallel).await?;
        eprintln!(
            "{}: {} hosts prepared with node-operator's installer in {:.1}s",
            tool.label(),
            args.hosts,
            cost.wall_s
        );
    }
    // Either way, the upgrade starts from the same files on every host.
    for host in hosts.hosts() {
        packages::check_host(host, "1.0.0").context("the first versions")?;
    }

    let serial = batch_size(&args.max_unavailable, args.hosts);
    let upgrade = |pkg: &Package, max_fail_percentage: u32| {
        let vars = json!({
            "pkg": pkg.ansible,
            "serial": serial,
            "max_fail_percentage": max_fail_percentage,
        });
        playbook(
            &hosts,
            "upgrade.yml",
            &vars,
            args.parallel.max(serial),
            tool,
            ansible,
        )
    };
    let run = upgrade(&v2, 100)?;
    run.succeeded()?;
    sample.upgrade_s = run.cost.wall_s;
    sample.most_unavailable = serial;
    let on_v2 = hosts_that_ran(&hosts, &v2.spec.version);
    if on_v2 != args.hosts {
        bail!("{} upgraded {on_v2} of {} hosts", tool.label(), args.hosts);
    }
    eprintln!("{}: upgraded in {:.1}s", tool.label(), sample.upgrade_s);

    let run = upgrade(&broken, 0)?;
    let ended = now_s();
    if run.output.status.success() {
        bail!("the play of a kubelet whose health check fails succeeded");
    }
    let first = first_failure(&hosts).context("no host recorded a failed health check")?;
    sample.halt_s = ended - first;
    sample.upgraded_before_halt = hosts_that_ran(&hosts, &broken.spec.version);
    Ok(sample)
}

fn table(args: &Args, tools: &[Tool], samples: &[(usize, Tool, Sample)]) -> String {
    let per_min = |s: &Sample| args.hosts as f64 / (s.upgrade_s / 60.0);
    let of = |tool: Tool| -> Vec<Sample> {
        samples
            .iter()
            .filter(|(_, t, _)| *t == tool)
            .map(|(_, _, s)| s.clone())
            .collect()
    };
    let pick = |samples: &[Sample], f: &dyn Fn(&Sample) -> f64| {
        median(&samples.iter().map(f).collect::<Vec<_>>())
    };
    let provision = |samples: &[Sample]| {
        let measured: Vec<f64> = samples.iter().filter_map(|s| s.provision_s).collect();
        if measured.is_empty() {
            "–".to_string()
        } else {
            format!("{:.1}", median(&measured))
        }
    };
    let mut out = format!(
        "\n### Upgrade throughput and halting a bad version: {} hosts, maxUnavailable {} ({} hosts), Ansible strategy {}, median of {} runs\n\n\
         | tool | provision s | upgrade s | Machines/min | most unavailable (any run) | first failure → halt s | hosts switched to the bad version |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        args.hosts,
        args.max_unavailable,
        batch_size(&args.max_unavailable, args.hosts),
        args.ansible.ansible_strategy,
        args.runs
    );
    for tool in tools {
        let s = &of(*tool);
        out.push_str(&format!(
            "| {} | {} | {:.1} | {:.0} | {} | {:.1} | {:.0} |\n",
            tool.label(),
            provision(s),
            pick(s, &|s| s.upgrade_s),
            pick(s, &per_min),
            s.iter()
                .map(|s| s.most_unavailable)
                .max()
                .unwrap_or_default(),
            pick(s, &|s| s.halt_s),
            pick(s, &|s| s.upgraded_before_halt as f64),
        ));
    }
    if tools.contains(&Tool::NodeOperator) {
        let ours = &of(Tool::NodeOperator);
        for peer in tools.iter().filter(|t| **t != Tool::NodeOperator) {
            let theirs = &of(*peer);
            out.push_str(&format!(
                "| **ratio {} / node-operator** | | **{:.1}×** | | | **{:.1}×** | |\n",
                peer.label(),
                pick(theirs, &|s| s.upgrade_s) / pick(ours, &|s| s.upgrade_s),
                pick(theirs, &|s| s.halt_s) / pick(ours, &|s| s.halt_s)
            ));
        }
    }
    out.push_str(
        "\nnode-operator provisions through its Machine controller (bootstrap token, Node \
         registration); Ansible's provision, when measured (`--ansible-provision`), is the bare \
         install; otherwise its hosts start from the same files installed by node-operator's \
         installer. `most unavailable` for Ansible is its `serial`. Both sides' health checks \
         are the same deadline loop (node-operator's own script, one Ansible task).\n\nAll runs:\n\n\
         | run | tool | provision s | upgrade s | most unavailable | first failure → halt s | switched to the bad version |\n\
         |---:|---|---:|---:|---:|---:|---:|\n",
    );
    for (run, tool, s) in samples {
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} | {} | {:.1} | {} |\n",
            run + 1,
            tool.label(),
            provision(std::slice::from_ref(s)),
            s.upgrade_s,
            s.most_unavailable,
            s.halt_s,
            s.upgraded_before_halt
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::batch_size;

    #[test]
    fn batch_sizes_are_the_operators_budget() {
        assert_eq!(batch_size("10%", 200), 20);
        // Percentages round down, as node-operator's budget does.
        assert_eq!(batch_size("10%", 15), 1);
        assert_eq!(batch_size("30%", 10), 3);
        assert_eq!(batch_size("3", 200), 3);
        assert_eq!(batch_size("0", 200), 1);
        assert_eq!(batch_size("500", 20), 20);
    }
}
