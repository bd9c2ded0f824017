//! The site both tools join workers to, set up once: a meta-cluster whose
//! Pods run as real processes (the Pod runner, with its load balancer), the
//! kube-on-kube-operator as one of them, a Minimal business Cluster exposed
//! by a LoadBalancer Service, its node-operator, the OCI registry with the
//! node images, the artifact server with the node artifacts, and the real
//! PackageVersions of both. Hosts come and go per run; the registry and the
//! artifacts stay on a bridge of their own that every run's hosts reach.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kok_testenv::hosts::TestHosts;
use kok_testenv::node_software::{self, PackageVersionsOptions};
use kok_testenv::pods::{Options, PodRunner, RUNNER_LABEL};
use kok_testenv::registry::Registry;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::cluster::{ExposureType, Placement};
use kube_on_kube_api::{Cluster, ClusterPackageVersion, PackageVersion};
use node_operator::machine::plan::{self, ClusterValues, Wanted};
use serde_json::json;

use crate::canary::apply;
use crate::controlplane::{meta_cluster, settled, start_operator};
use crate::fleet::sibling;

/// Namespace of the workload the benchmark runs on every node.
pub const PROBE_NAMESPACE: &str = "kok-bench";
/// Label of the workload's Pods.
pub const PROBE_LABEL: (&str, &str) = ("app", "kok-bench-probe");
/// The workload: upstream's e2e test image, on the Pod network.
const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.59";

/// The running site. Dropping it stops every Pod, the registry and the
/// artifact server.
pub struct Site {
    /// Serves the node artifacts; it has no hosts of its own.
    pub depot: TestHosts,
    pub registry: Registry,
    /// Admin client of the business cluster, through its external endpoint.
    pub business: Client,
    /// The ClusterPackageVersion's packages, in install order.
    pub packages: Vec<Wanted>,
    /// What node-operator renders into every kubelet configuration (its
    /// flags, as the kube-on-kube-operator set them).
    pub cluster_values: ClusterValues,
    /// Seconds from creating the Cluster to all its conditions True.
    pub cluster_ready_s: f64,
    meta: Client,
    namespace: String,
    cluster_name: String,
    packages_yaml: String,
    _runner: PodRunner,
}

impl Site {
    /// Sets everything up and waits until the Cluster is Ready.
    pub async fn start(operator_log_level: &str, timeout: Duration) -> Result<Site> {
        let env = meta_cluster()?;
        let mut programs = BTreeMap::new();
        for name in ["kube-on-kube-operator", "node-operator"] {
            programs.insert(name.to_string(), sibling(name)?);
        }
        let runner = PodRunner::start(
            env,
            Options {
                nodes: vec!["cp-0".into()],
                load_balancer: true,
                programs,
                ..Default::default()
            },
        )
        .context("start the Pod runner")?;
        let depot = TestHosts::start(0).context("start the artifact server")?;
        let registry =
            Registry::start_with_node_images(depot.gateway_ip()).context("start the registry")?;
        node_software::serve_artifacts(&depot).context("serve the node artifacts")?;
        let packages_yaml = node_software::package_versions(
            &node_software::artifacts_base_url(&depot),
            &PackageVersionsOptions::for_test_hosts(&registry),
        )
        .context("generate the PackageVersions")?;

        let meta = env.client().await;
        let ns = env.namespace("workers").await;
        start_operator(&meta, &ns, operator_log_level).await?;
        let name = "ci".to_string();
        let ready = create_cluster(&meta, &ns, &name, &packages_yaml, timeout).await?;
        Ok(Site {
            depot,
            registry,
            business: ready.business,
            packages: ready.packages,
            cluster_values: ready.cluster_values,
            cluster_ready_s: ready.ready_s,
            meta,
            namespace: ns,
            cluster_name: name,
            packages_yaml,
            _runner: runner,
        })
    }

    /// Deletes the site's Cluster and waits until it is gone.
    pub async fn delete_cluster(&mut self, timeout: Duration) -> Result<()> {
        let clusters: Api<Cluster> = Api::namespaced(self.meta.clone(), &self.namespace);
        clusters
            .delete(&self.cluster_name, &DeleteParams::default())
            .await
            .with_context(|| format!("delete Cluster {}", self.cluster_name))?;
        let started = Instant::now();
        while clusters.get_opt(&self.cluster_name).await?.is_some() {
            if started.elapsed() > timeout {
                bail!("Cluster {} not gone after {timeout:?}", self.cluster_name);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(())
    }

    /// Creates a new Cluster named `name` as the site's, as a user creating
    /// a cluster per CI job does, and waits until it is Ready.
    pub async fn create_cluster(&mut self, name: &str, timeout: Duration) -> Result<()> {
        let ready = create_cluster(
            &self.meta,
            &self.namespace,
            name,
            &self.packages_yaml,
            timeout,
        )
        .await?;
        self.business = ready.business;
        self.packages = ready.packages;
        self.cluster_values = ready.cluster_values;
        self.cluster_ready_s = ready.ready_s;
        self.cluster_name = name.to_string();
        Ok(())
    }

    /// Puts the SSH key `hosts` accept where the example Machines name it
    /// (each run of hosts has its own key).
    pub async fn ssh_key(&self, hosts: &TestHosts) -> Result<()> {
        let secret = node_software::example_ssh_key(hosts)?;
        let name = secret.name_any();
        let value = serde_json::to_value(&secret)?;
        apply(
            &Api::<Secret>::namespaced(self.business.clone(), "kube-system"),
            &name,
            &value,
        )
        .await
    }
}

/// A Ready Cluster, as the benchmark uses it.
struct Ready {
    business: Client,
    packages: Vec<Wanted>,
    cluster_values: ClusterValues,
    ready_s: f64,
}

/// Creates the Minimal example Cluster as `name` in `ns`, exposed by a
/// LoadBalancer Service, waits until it is Ready, and applies the
/// PackageVersions and the workload to it.
async fn create_cluster(
    meta: &Client,
    ns: &str,
    name: &str,
    packages_yaml: &str,
    timeout: Duration,
) -> Result<Ready> {
    let mut cluster: Cluster =
        serde_norway::from_str(include_str!("../../../examples/cluster-minimal.yaml"))?;
    cluster.metadata.name = Some(name.to_string());
    cluster.metadata.namespace = Some(ns.to_string());
    cluster.spec.placement = Some(Placement {
        node_selector: [(RUNNER_LABEL.to_string(), "true".to_string())].into(),
        tolerations: vec![],
    });
    cluster.spec.api_server.external.type_ = ExposureType::LoadBalancer;
    let clusters: Api<Cluster> = Api::namespaced(meta.clone(), ns);
    let created = Instant::now();
    clusters.create(&PostParams::default(), &cluster).await?;
    let ready = loop {
        let c = clusters.get(name).await?;
        if c.status.as_ref().is_some_and(|s| settled(&s.conditions)) {
            break c;
        }
        if created.elapsed() > timeout {
            bail!("Cluster {name} not Ready after {timeout:?}: {:?}", c.status);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let ready_s = created.elapsed().as_secs_f64();
    let status = ready.status.clone().context("no status")?;
    let secret = status
        .admin_kubeconfig_secret
        .context("no admin kubeconfig Secret")?;
    let business = business_client(meta, ns, &secret).await?;
    let cluster_values = node_operator_values(meta, ns, name).await?;
    let packages = apply_packages(&business, packages_yaml).await?;
    probe(&business).await?;
    eprintln!(
        "site: Cluster {name} Ready in {ready_s:.1}s at {}, packages {}",
        status.endpoint.unwrap_or_default(),
        packages
            .iter()
            .map(|w| w.package_version.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(Ready {
        business,
        packages,
        cluster_values,
        ready_s,
    })
}

/// A client of the business API with the admin kubeconfig the operator
/// wrote: it names the Cluster's external endpoint.
async fn business_client(meta: &Client, ns: &str, secret: &str) -> Result<Client> {
    let secret = Api::<Secret>::namespaced(meta.clone(), ns)
        .get(secret)
        .await?;
    let text = secret
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .map(|v| v.0.clone())
        .context("the admin kubeconfig Secret has no kubeconfig")?;
    let kubeconfig: kube::config::Kubeconfig = serde_norway::from_slice(&text)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(Client::try_from(config)?)
}

/// `--cluster-dns` and `--cluster-domain` of the Cluster's node-operator.
async fn node_operator_values(meta: &Client, ns: &str, cluster: &str) -> Result<ClusterValues> {
    let deployment = Api::<Deployment>::namespaced(meta.clone(), ns)
        .get(&format!("{cluster}-node-operator"))
        .await?;
    let args: Vec<String> = deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .unwrap_or_default();
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .map(str::to_string)
            .with_context(|| format!("the node-operator has no --{name}: {args:?}"))
    };
    Ok(ClusterValues {
        cluster_dns: flag("cluster-dns")?,
        cluster_domain: flag("cluster-domain")?,
        api_server: String::new(),
    })
}

/// Applies the PackageVersions and the ClusterPackageVersion of
/// `scripts/node-packageversions.sh`; returns the packages in the order
/// node-operator installs them.
async fn apply_packages(business: &Client, yaml: &str) -> Result<Vec<Wanted>> {
    use serde::Deserialize;
    let mut versions = BTreeMap::new();
    let mut default = None;
    for doc in serde_norway::Deserializer::from_str(yaml) {
        let value = serde_json::Value::deserialize(doc)?;
        let name = value["metadata"]["name"]
            .as_str()
            .context("a document without a name")?
            .to_string();
        match value["kind"].as_str() {
            Some("PackageVersion") => {
                apply(&Api::<PackageVersion>::all(business.clone()), &name, &value).await?;
                let pv: PackageVersion = serde_json::from_value(value)?;
                versions.insert(name, pv.spec);
            }
            Some("ClusterPackageVersion") => {
                apply(
                    &Api::<ClusterPackageVersion>::all(business.clone()),
                    &name,
                    &value,
                )
                .await?;
                default = Some(serde_json::from_value::<ClusterPackageVersion>(value)?);
            }
            other => bail!("unexpected {other:?} in the PackageVersions"),
        }
    }
    let default = default.context("no ClusterPackageVersion")?;
    let wanted = default
        .spec
        .packages
        .iter()
        .map(|(package, pv)| {
            Ok(Wanted {
                package: package.clone(),
                package_version: pv.clone(),
                spec: versions
                    .get(pv)
                    .with_context(|| format!("no PackageVersion {pv}"))?
                    .clone(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    plan::order(wanted).map_err(anyhow::Error::msg)
}

/// The workload: a DaemonSet of agnhost on the Pod network, Ready once it
/// answers its health check, so a Pod of it on a node is the first Pod a user
/// could reach there. It runs on every node that joins.
pub async fn probe(business: &Client) -> Result<()> {
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": PROBE_NAMESPACE}}))?;
    Api::<Namespace>::all(business.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    let labels = json!({PROBE_LABEL.0: PROBE_LABEL.1});
    let daemonset: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "probe", "namespace": PROBE_NAMESPACE},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "agnhost",
                        "image": AGNHOST,
                        "args": ["netexec", "--http-port=8080"],
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {
                            "httpGet": {"path": "/healthz", "port": 8080},
                            "periodSeconds": 1,
                        },
                    }],
                },
            },
        },
    }))?;
    Api::<DaemonSet>::namespaced(business.clone(), PROBE_NAMESPACE)
        .create(&PostParams::default(), &daemonset)
        .await?;
    Ok(())
}
