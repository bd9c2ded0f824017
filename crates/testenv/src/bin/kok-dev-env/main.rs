//! `kok-dev-env`: the product doing its job on this machine, in one command
//! (`scripts/dev-env.sh`). A meta-cluster whose Pods run as real processes,
//! the operators installed into it with the project's Helm chart, the example
//! Clusters turned into working business clusters, the example Machines
//! turned into real worker nodes on SSH test hosts, and the example
//! CanaryRelease rolled out on them.

mod examples;
mod kubeconfig;
mod progress;
mod site;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;

use progress::{Progress, Signals, Stop};
use site::Site;

/// Runs the whole product on this machine until Ctrl-C or SIGTERM:
///
/// 1. a meta-cluster (real etcd, kube-apiserver, kube-controller-manager and
///    kube-scheduler) whose Pods run as real processes on three nodes that
///    carry the control-plane label the Production example selects, with a
///    load balancer for its Services of type LoadBalancer (the part MetalLB
///    plays on bare metal);
/// 2. the operators installed into it with the project's Helm chart
///    (`helm upgrade --install`, its ServiceAccounts and RBAC; the chart's
///    images stand for the operator binaries built from this repository);
/// 3. the example Clusters applied and waited for until Ready;
/// 4. one SSH test host per example Machine and business cluster, an OCI
///    registry with the node images and an artifact server with the node
///    software, all built from upstream sources; the example Machines, their
///    key Secret and the example PackageVersions filled in for them (host
///    address and pinned key, artifact URLs on this machine with their real
///    checksums) and applied to every example Cluster (or those named by
///    --workers-cluster), whose workers then turn Ready and run every
///    add-on Pod;
/// 5. the example CanaryReleases applied once the workers are Ready and
///    followed until they succeed;
/// 6. --spare-hosts more test hosts, for a cluster of the user's own
///    (`kubectl kok cluster create demo --wait`): spare-workers.yaml in
///    --dir holds what to apply to it to get them as workers.
///
/// Kubeconfigs of the meta-cluster and of every business cluster go to
/// --dir; a business cluster exposed by a LoadBalancer is reachable from
/// this machine. Every upstream binary comes from the caches of
/// scripts/testenv-bins.sh and scripts/node-software.sh, which
/// scripts/dev-env.sh fills first. Stopping this program stops everything
/// and removes every process, network and mount it made.
#[derive(Parser, Debug)]
#[command(version, verbatim_doc_comment)]
struct Args {
    /// Directory for the kubeconfigs and helm's own files; created when
    /// missing, files from an earlier run are overwritten.
    #[arg(long, env = "KOK_DEV_DIR", default_value = ".kok-dev")]
    dir: PathBuf,
    /// Directory whose *.yaml and *.yml files are applied with server-side
    /// apply: Cluster objects and add-on templates to the meta-cluster,
    /// everything else to each business cluster that gets workers.
    #[arg(long, env = "KOK_DEV_EXAMPLES", default_value = "examples")]
    examples: PathBuf,
    /// The Helm chart the operators are installed with.
    #[arg(long, env = "KOK_DEV_CHART", default_value = "charts/kube-on-kube")]
    chart: PathBuf,
    /// Directory holding the kube-on-kube-operator and node-operator
    /// binaries the chart's images stand for (and kubectl-kok, for the
    /// commands the banner suggests).
    #[arg(long, env = "KOK_DEV_OPERATORS_DIR", default_value = "target/debug")]
    operators_dir: PathBuf,
    /// An example Cluster (NAMESPACE/NAME) that gets the example Machines,
    /// PackageVersions and CanaryReleases, on test hosts of its own;
    /// repeat it or separate with commas (default: every example Cluster).
    /// Each must be reachable from the hosts, so exposed by a LoadBalancer.
    #[arg(long, env = "KOK_DEV_WORKERS_CLUSTER", value_delimiter = ',')]
    workers_cluster: Vec<String>,
    /// Test hosts started for a cluster of your own; spare-workers.yaml in
    /// --dir turns them into its workers (Machines spare-0, spare-1, ...).
    #[arg(
        long,
        env = "KOK_DEV_SPARE_HOSTS",
        default_value_t = 1,
        value_name = "COUNT"
    )]
    spare_hosts: usize,
    /// Give up when the examples have not converged after this many seconds.
    #[arg(
        long,
        env = "KOK_DEV_TIMEOUT",
        default_value_t = 600,
        value_name = "SECONDS"
    )]
    timeout: u64,
    /// Stop by itself this many seconds after every example converged, as if
    /// interrupted (0: run until Ctrl-C or SIGTERM).
    #[arg(
        long,
        env = "KOK_DEV_EXIT_AFTER",
        default_value_t = 0,
        value_name = "SECONDS"
    )]
    exit_after: u64,
}

/// The line printed once every example has converged.
const CONVERGED: &str = "every example converged";

fn main() -> ExitCode {
    let args = Args::parse();
    // The current-thread runtime runs on the main thread, which lives as
    // long as the process: the test hosts' parent-death signal is tied to
    // the thread that forked them, so everything is started from here.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("kok-dev-env: building the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kok-dev-env: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let progress = Progress::new(Instant::now());
    // From here on a Ctrl-C is handled: what has been started is stopped.
    let mut signals = Signals::new()?;

    // Everything that can be wrong without a cluster is checked first.
    let operators = site::Operators::find(&args.operators_dir)?;
    let chart = std::fs::canonicalize(&args.chart)
        .with_context(|| format!("the Helm chart {}", args.chart.display()))?;
    let plan = examples::Plan::load(&args.examples, &args.workers_cluster)?;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let dir = std::fs::canonicalize(&args.dir)?;

    let hosts = plan.machines() * plan.workers_clusters.len() + args.spare_hosts;
    if hosts > 200 {
        bail!("{hosts} test hosts are more than this machine runs; lower --spare-hosts");
    }
    let site = match Site::start(&progress, &mut signals, &operators, hosts) {
        Ok(Some(site)) => site,
        Ok(None) => {
            progress.say("stopped before everything was up; nothing is left running");
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    let outcome = match serve(args, &dir, &chart, &plan, &site, &progress, &mut signals).await {
        Err(e) if e.is::<Stop>() => {
            progress.say(&format!("{e}: stopping"));
            Ok(ExitCode::SUCCESS)
        }
        other => other.map(|()| ExitCode::SUCCESS),
    };
    if outcome.is_err() {
        progress.say(&format!(
            "the logs stay in {} (the meta-cluster, and every Pod's under pods/)",
            site.env.log_dir().display()
        ));
    }
    progress.say("stopping the Pods, the test hosts, the registry and the meta-cluster");
    drop(site);
    progress.say("stopped");
    outcome
}

/// Installs, applies and waits; then runs until stopped. A signal ends it
/// with a [`Stop`] error.
async fn serve(
    args: &Args,
    dir: &Path,
    chart: &Path,
    plan: &examples::Plan,
    site: &Site,
    progress: &Progress,
    signals: &mut Signals,
) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(args.timeout);
    let meta_kubeconfig = dir.join("meta.kubeconfig");
    kubeconfig::write_private(
        &meta_kubeconfig,
        &std::fs::read(site.env.kubeconfig_path())?,
    )?;
    let meta = site.meta_client().await?;

    signals
        .until(site::helm_install(progress, dir, chart, &meta_kubeconfig))
        .await??;
    examples::apply(&meta, "meta-cluster", &plan.templates, progress).await?;
    let pool = site
        .runner
        .load_balancer()
        .context("the Pod runner has no load balancer")?
        .network();
    let clusters = plan.clusters_for(pool)?;
    examples::apply(&meta, "meta-cluster", &clusters, progress).await?;
    let clusters = signals
        .until(examples::wait_clusters(&meta, &clusters, progress, timeout))
        .await??;

    let mut reachable = Vec::new();
    for cluster in &clusters {
        reachable.push(kubeconfig::for_cluster(&meta, cluster, dir).await?);
    }
    let names: Vec<(String, String)> = reachable
        .iter()
        .filter_map(|c| c.dns_entry.clone())
        .collect();
    if !names.is_empty() {
        site::publish_dns(progress, &site.hosts, &names)?;
    }

    let hosts = site.hosts.hosts();
    let per_cluster = plan.machines();
    let private_key = site.hosts.client_private_key_pem();
    let mut workers = Vec::new();
    for (i, key) in plan.workers_clusters.iter().enumerate() {
        let cluster = reachable
            .iter()
            .find(|c| &c.key == key)
            .with_context(|| format!("Cluster {key} has no kubeconfig"))?;
        if cluster.through_load_balancer.is_none() {
            bail!(
                "Cluster {key} is not exposed by a LoadBalancer (spec.apiServer.external.type), \
                 so the worker hosts cannot reach its API; leave it out of --workers-cluster"
            );
        }
        let client = kubeconfig::client(&cluster.path).await?;
        let filled = plan.fill_in(
            &hosts[i * per_cluster..(i + 1) * per_cluster],
            &private_key,
            &site.package_versions,
        )?;
        let shown = format!("business cluster {key}");
        examples::apply(&client, &shown, &filled.business, progress).await?;
        workers.push(examples::Workers {
            key: key.clone(),
            client,
            filled,
        });
    }
    let spare_hosts = &hosts[plan.workers_clusters.len() * per_cluster..];
    let spare = if spare_hosts.is_empty() {
        None
    } else {
        let (yaml, machines) = plan.spare_kit(spare_hosts, &private_key, &site.package_versions)?;
        let path = dir.join("spare-workers.yaml");
        // It holds the hosts' private key.
        kubeconfig::write_private(&path, yaml.as_bytes())?;
        Some(progress::Spare { path, machines })
    };

    let ready = signals
        .until(examples::wait_workers(&workers, progress, timeout))
        .await??;
    let up_after = progress.elapsed();
    signals
        .until(examples::wait_pods(&workers, progress, timeout))
        .await??;
    progress.out(&progress::banner(&progress::Banner {
        up_after,
        dir,
        meta_url: site.env.api_url(),
        meta_kubeconfig: &meta_kubeconfig,
        clusters: &reachable,
        workers: &ready,
        spare: spare.as_ref(),
        hosts: &site.hosts,
        registry: site.registry.url(),
        operators: &operators_path(args),
        pod_logs: site.runner.log_dir(),
        meta_logs: site.env.log_dir(),
        exit_after: args.exit_after,
    }));

    let mut canaries = false;
    for w in &workers {
        if !w.filled.canaries.is_empty() {
            let shown = format!("business cluster {}", w.key);
            examples::apply(&w.client, &shown, &w.filled.canaries, progress).await?;
            canaries = true;
        }
    }
    if canaries {
        signals
            .until(examples::wait_canaries(&workers, progress, timeout))
            .await??;
        // The upgrade drained the workers: their Pods come back.
        signals
            .until(examples::wait_pods(&workers, progress, timeout))
            .await??;
    }
    progress.say(&format!(
        "{CONVERGED} ({:.1}s after the command started)",
        progress.elapsed().as_secs_f64()
    ));

    let deadline = async {
        match args.exit_after {
            0 => std::future::pending().await,
            secs => tokio::time::sleep(Duration::from_secs(secs)).await,
        }
    };
    signals.until(deadline).await?;
    progress.say(&format!("{}s are up (--exit-after)", args.exit_after));
    Ok(())
}

/// The operators' directory, absolute, for the PATH the banner suggests.
fn operators_path(args: &Args) -> PathBuf {
    std::fs::canonicalize(&args.operators_dir).unwrap_or_else(|_| args.operators_dir.clone())
}
