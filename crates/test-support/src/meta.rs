//! A real meta-cluster for the tests that need one (`meta_cluster`,
//! `meta_worker_removal`): its control plane runs as processes (as
//! kubeadm's static Pods would), and its workers are Machines that a
//! node-operator in the meta-cluster itself turns into real nodes over SSH
//! (containerd, runc, CNI plugins, kubelet), with the add-ons a kubeadm
//! cluster gets (the bootstrap-token pieces, kube-proxy, CoreDNS) and
//! kube-router as its network, rendered by the operator's own add-on
//! templates; upstream's local-path-provisioner for claims and MetalLB for
//! LoadBalancers. On it, the operators installed by the chart from their
//! images, and business control planes from upstream's images.
//!
//! The test environment plays the site: the hosts reach the API server
//! through a forwarder on their bridge (the address its certificate names
//! and the `kubernetes` Service leads to), images come from the registry
//! mirroring their upstream names, node software from the artifact server.
use crate as common;
use crate::Kubectl;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kok_testenv::hosts::TestHosts;
use kok_testenv::kube_env::{KubeEnv, Options, RealNodes};
use kok_testenv::meta_network::{POD_CIDR, PodRoutes};
use kok_testenv::node_software::{self, PackageVersionsOptions};
use kok_testenv::proxy::TcpProxy;
use kok_testenv::registry::Registry;
use kok_testenv::wait::wait_for;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use kube_on_kube_api::Cluster;
use kube_on_kube_operator::names::Names;
use kube_on_kube_operator::render::addons;
use serde_json::{Value, json};

/// The test environment's Service network (`kube_env`'s) and its DNS
/// address, the tenth.
pub const META_SERVICE_CIDR: &str = "10.0.0.0/16";
pub const META_DNS: &str = "10.0.0.10";

/// The label and taint-free marking of the hosts business control planes
/// run on (the Production example's placement selects it).
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubeonkube.io/control-plane";

/// The chart's release and namespace; the bootstrap node-operator takes
/// part in the chart's leader election, so the chart's replicas take over
/// from it.
pub const RELEASE: &str = "kube-on-kube";
pub const RELEASE_NAMESPACE: &str = "kok-system";

/// The release a Cluster is made at and the one it is upgraded to.
pub const FROM_VERSION: &str = "1.35.3";
pub const TO_VERSION: &str = "1.35.4";

/// Field manager of what the test applies.
pub const MANAGER: &str = "meta-cluster-test";

/// The meta-cluster's add-ons, as a kubeadm cluster has them: what a
/// kubelet needs to join, kube-proxy, kube-router (Pod network) and CoreDNS.
pub const META_ADDONS: [&str; 4] = [
    addons::BOOTSTRAP,
    addons::KUBE_PROXY,
    addons::KUBE_ROUTER,
    addons::COREDNS,
];

/// A real meta-cluster: control plane as processes, workers that are
/// Machines. Fields drop in order: the node-operator first, the forwarder
/// before the hosts whose bridge it listens on.
pub struct Meta {
    node_operator: NodeOperator,
    _proxy: TcpProxy,
    pub env: KubeEnv,
    pub kubectl: Kubectl,
    _registry: Registry,
    routes: PodRoutes,
    pub hosts: TestHosts,
    /// How many of the hosts are meta workers; the others are left for
    /// business clusters' Machines.
    meta_hosts: usize,
    /// The node software's PackageVersions, as applied to the meta-cluster.
    pub packages: String,
}

impl Meta {
    /// A meta-cluster up and serving: `hosts` meta workers made Ready Nodes
    /// from their Machines, the add-ons running, claims and LoadBalancers
    /// served, and the chart's operators running from their images and
    /// leading. `business_hosts` more test hosts are left for business
    /// clusters' Machines.
    pub async fn up(hosts: usize, business_hosts: usize) -> Meta {
        let t0 = Instant::now();
        let mut meta = Meta::start(hosts, business_hosts).await;
        println!("meta control plane and add-ons up after {:?}", t0.elapsed());
        let applied = Instant::now();
        meta.apply_machines();
        // What needs no node goes first, while the hosts become nodes: the
        // operators' images pushed, the storage and load balancer applied
        // (their Pods wait for the nodes).
        let pushed = meta.push_operator_images();
        println!("pushed {pushed:?}");
        meta.apply_storage_and_load_balancer();
        let nodes = meta.wait_nodes_ready(Duration::from_secs(420)).await;
        println!(
            "Machines applied → {} meta workers Ready in {:?}",
            nodes.len(),
            applied.elapsed()
        );
        meta.wait_pods_ready("kube-proxy", "k8s-app=kube-proxy", nodes.len())
            .await;
        meta.wait_pods_ready("kube-router", "k8s-app=kube-router", nodes.len())
            .await;
        meta.wait_pods_ready("CoreDNS", "k8s-app=kube-dns", 1).await;
        println!("meta add-ons running after {:?}", applied.elapsed());
        meta.route_pods();
        // The chart installs while the storage and load balancer roll out.
        let installed = Instant::now();
        std::thread::scope(|s| {
            let chart = s.spawn(|| meta.helm_install());
            meta.wait_storage_and_load_balancer();
            println!(
                "local-path-provisioner and MetalLB running after {:?}",
                applied.elapsed()
            );
            chart.join().expect("the chart's install");
        });
        meta.hand_over_node_operator().await;
        println!(
            "the chart's operators run from their images after {:?}",
            installed.elapsed()
        );
        meta
    }

    /// The Production example at `version` in the restricted namespace
    /// `ns`, created: every component in a real container on the meta
    /// workers, its etcd members on claims of the meta-cluster's
    /// provisioner, its API exposed by the meta-cluster's load balancer at
    /// the first address of [`Meta::pool`]. Its Api and name.
    pub async fn create_production(&self, ns: &str, version: &str) -> (Api<Cluster>, String) {
        let client = self.env.client().await;
        self.kubectl.apply(&restricted_namespace(ns));
        // The example's metrics-server add-on, registered as a user does.
        let mut template: Value = serde_norway::from_str(include_str!(
            "../../../examples/addon-template-metrics-server.yaml"
        ))
        .expect("the add-on template example");
        template["metadata"]["namespace"] = ns.into();
        self.kubectl.apply(&template.to_string());
        let mut cluster: Cluster = common::production_example();
        cluster.metadata.namespace = Some(ns.into());
        cluster.spec.version = version.into();
        let (lb_address, _) = self.pool();
        cluster.spec.api_server.external.addresses = vec![lb_address.to_string()];
        // No DNS here serves the example's name: workers reach the API by
        // the load balancer's address.
        cluster.spec.api_server.external.dns_names.clear();
        // The hosts share this machine's two cores: what the example
        // requests for a dedicated machine would leave its Pods unscheduled.
        cluster.spec.etcd.component.resources = None;
        cluster.spec.api_server.component.resources = None;
        let name = cluster.name_any();
        let clusters: Api<Cluster> = Api::namespaced(client, ns);
        clusters
            .create(&Default::default(), &cluster)
            .await
            .expect("create the Cluster");
        (clusters, name)
    }

    /// A kubectl of the business cluster `name` in `ns` as its admin, its
    /// kubeconfig in `dir`; checked to answer at the load balancer's
    /// address.
    pub async fn business_kubectl(&self, ns: &str, name: &str, dir: &Path) -> Kubectl {
        let client = self.env.client().await;
        let clusters: Api<Cluster> = Api::namespaced(client.clone(), ns);
        let status = clusters
            .get(name)
            .await
            .expect("the Cluster")
            .status
            .expect("a status");
        let (lb_address, _) = self.pool();
        assert_eq!(
            status.endpoint.as_deref(),
            Some(format!("https://{lb_address}:6443").as_str())
        );
        let business = Kubectl {
            kubeconfig: common::kubeconfig_file(
                &client,
                ns,
                &status
                    .admin_kubeconfig_secret
                    .expect("the admin kubeconfig"),
                dir,
            )
            .await,
        };
        assert_eq!(business.ok(&["get", "--raw", "/readyz"]).trim(), "ok");
        business
    }
}

impl Meta {
    /// Starts the control plane, its add-ons, and the node-operator; no
    /// Machine yet. Of the `hosts + business_hosts` test hosts, the first
    /// `hosts` are for meta workers.
    pub async fn start(hosts: usize, business_hosts: usize) -> Meta {
        // One real meta-cluster at a time on this machine.
        let routes = PodRoutes::claim().expect("the meta-cluster's Pod network");
        // Its processes (control plane, sshd, containerd, kubelets) go first
        // on the cores: beside CPU-bound tests its timers and probes
        // stretched a test from 225 s alone to 340-410 s. Its Pods'
        // containers are weighed by their kubelets' cgroups instead.
        kok_testenv::renice_process(-5).expect("a higher priority (needs root)");
        let meta_hosts = hosts;
        let hosts = TestHosts::start(hosts + business_hosts).expect("the test hosts");
        let gateway = hosts.gateway_ip();
        let registry = Registry::start_with_node_images(gateway).expect("the registry");
        node_software::serve_artifacts(&hosts).expect("the node artifacts");
        let env = KubeEnv::start(Options {
            controller_manager: true,
            scheduler: true,
            kwok_nodes: 0,
            install_crds: true,
            controller_manager_qps: None,
            node_monitor_grace: None,
            real_nodes: Some(RealNodes { address: gateway }),
        })
        .expect("the meta-cluster's control plane");
        let port = env.api_port();
        let proxy = TcpProxy::start_at(
            SocketAddr::new(gateway, port),
            ([127, 0, 0, 1], port).into(),
        )
        .expect("the API server's forwarder on the hosts' bridge");
        env.publish_api_endpoint(proxy.addr())
            .await
            .expect("the kubernetes Service's endpoint");
        let server = format!("https://{}", proxy.addr());
        let client = env.client().await;
        apply_addons(&client, &env, &server).await;

        let kubectl = Kubectl {
            kubeconfig: env.kubeconfig_path().to_path_buf(),
        };
        let packages = node_software::package_versions(
            &node_software::artifacts_base_url(&hosts),
            &PackageVersionsOptions::for_test_hosts(&registry),
        )
        .expect("the PackageVersions");
        kubectl.apply(&packages);
        let key = node_software::example_ssh_key(&hosts).expect("the key Secret");
        kubectl.apply(&serde_json::to_string(&key).expect("json"));

        kubectl.apply(&restricted_namespace(RELEASE_NAMESPACE));
        let node_operator = NodeOperator::start(&env);
        Meta {
            node_operator,
            _proxy: proxy,
            env,
            kubectl,
            _registry: registry,
            routes,
            hosts,
            meta_hosts,
            packages,
        }
    }

    /// The hosts that are meta workers.
    pub fn meta_hosts(&self) -> &[kok_testenv::hosts::TestHost] {
        &self.hosts.hosts()[..self.meta_hosts]
    }

    /// The hosts left for business clusters.
    pub fn business_hosts(&self) -> &[kok_testenv::hosts::TestHost] {
        &self.hosts.hosts()[self.meta_hosts..]
    }

    /// Applies a Machine for every meta host: a meta worker labelled for
    /// control planes.
    pub fn apply_machines(&self) {
        for (i, host) in self.meta_hosts().iter().enumerate() {
            let machine =
                node_software::example_machine(host, &format!("zone-{}", i % 3)).expect("Machine");
            let mut v = serde_json::to_value(&machine).expect("json");
            v["spec"]["kubelet"]["nodeLabels"] = json!({ CONTROL_PLANE_LABEL: "" });
            v["spec"]["kubelet"]["taints"] = json!([]);
            // The hosts share this machine's cores: what the example keeps
            // for the system would leave control planes no room.
            v["spec"]["kubelet"]["kubeReserved"] = json!({"cpu": "50m", "memory": "128Mi"});
            v["spec"]["kubelet"]["systemReserved"] = json!({"cpu": "50m", "memory": "128Mi"});
            self.kubectl.apply(&v.to_string());
        }
    }

    /// Waits until every meta host is a Ready Node; their names.
    pub async fn wait_nodes_ready(&self, timeout: Duration) -> BTreeSet<String> {
        let wanted: BTreeSet<String> = self
            .meta_hosts()
            .iter()
            .map(|h| h.name().to_string())
            .collect();
        wait_for("every meta worker Ready", timeout, async || {
            let list = self.kubectl.json(&["get", "nodes"])?;
            let ready: BTreeSet<String> = list["items"]
                .as_array()?
                .iter()
                .filter(|n| common::is_ready(n))
                .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
                .collect();
            (ready == wanted).then_some(ready)
        })
        .await
    }

    /// Waits until the Pods matching `selector` in kube-system number at
    /// least `count` and all run ready.
    pub async fn wait_pods_ready(&self, what: &str, selector: &str, count: usize) {
        wait_for(
            &format!("{what} running"),
            Duration::from_secs(240),
            async || {
                let list =
                    self.kubectl
                        .json(&["-n", "kube-system", "get", "pods", "-l", selector])?;
                let pods = list["items"].as_array()?;
                let ready = pods.iter().filter(|p| common::is_ready(p)).count();
                (pods.len() >= count && ready == pods.len()).then_some(())
            },
        )
        .await;
    }
}

impl Meta {
    /// The operators' images from this build, pushed to the registry under
    /// the chart's default names.
    pub fn push_operator_images(&self) -> Vec<String> {
        let bin_dir = common::node_operator_binary()
            .parent()
            .expect("the binaries' directory")
            .to_path_buf();
        node_software::push_operator_images(&bin_dir, env!("CARGO_PKG_VERSION"))
            .expect("the operators' images")
    }

    /// The chart installed with the pushed images (`helm upgrade --install
    /// --wait`), the node-operator for the meta-cluster's own Machines
    /// enabled.
    pub fn helm_install(&self) {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/kube-on-kube");
        let home = tempfile::tempdir().expect("helm's home");
        let out = Command::new(kok_testenv::bins::bin("helm").expect("helm"))
            .args(["upgrade", "--install", RELEASE])
            .arg(&chart)
            .args(["--namespace", RELEASE_NAMESPACE, "--wait", "--timeout=5m"])
            .args(["--set", "nodeOperator.enabled=true"])
            .args(["--set", "nodeOperator.sshKeySecretNamespaces={kube-system}"])
            .args(["--set", &format!("nodeOperator.clusterDNS={META_DNS}")])
            .args(["--set", "nodeOperator.recheckInterval=20s"])
            .env("KUBECONFIG", self.env.kubeconfig_path())
            .env("HELM_CACHE_HOME", home.path().join("cache"))
            .env("HELM_CONFIG_HOME", home.path().join("config"))
            .env("HELM_DATA_HOME", home.path().join("data"))
            .stdin(Stdio::null())
            .output()
            .expect("run helm");
        assert!(
            out.status.success(),
            "helm install: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The bootstrap node-operator stopped: it hands its Lease over to the
    /// chart's.
    pub async fn hand_over_node_operator(&mut self) {
        self.node_operator.stop();
        let leases: Api<Lease> = Api::namespaced(self.env.client().await, RELEASE_NAMESPACE);
        let holder = wait_for(
            "a node-operator Pod of the chart to lead",
            Duration::from_secs(90),
            async || {
                let lease = leases.get_opt("node-operator").await.ok()??;
                let holder = lease.spec?.holder_identity?;
                holder.contains("node-operator-").then_some(holder)
            },
        )
        .await;
        println!("the chart's node-operator {holder} leads");
    }
}

impl Meta {
    /// SIGKILLs the leading kube-on-kube-operator's process on its meta
    /// worker; the Pod's name.
    pub async fn kill_operator_leader(&self) -> String {
        let client = self.env.client().await;
        let leases: Api<Lease> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
        let leader = wait_for(
            "a kube-on-kube-operator to lead",
            Duration::from_secs(60),
            async || {
                let lease = leases.get_opt("kube-on-kube-operator").await.ok()??;
                lease.spec?.holder_identity
            },
        )
        .await;
        let pods: Api<Pod> = Api::namespaced(client, RELEASE_NAMESPACE);
        let pod = pods.get(&leader).await.expect("the leader's Pod");
        let node = pod
            .spec
            .and_then(|s| s.node_name)
            .expect("the leader's node");
        let host = self
            .hosts
            .hosts()
            .iter()
            .find(|h| h.name() == node)
            .expect("the leader's meta worker");
        let out = host.ssh("pkill -KILL -f /usr/local/bin/kube-on-kube-operator");
        assert!(out.status.success(), "pkill on {node}: {out:?}");
        leader
    }

    /// Waits until `pod` of the release has restarted its container and
    /// is ready again.
    pub async fn wait_restarted(&self, pod: &str) {
        let pods: Api<Pod> = Api::namespaced(self.env.client().await, RELEASE_NAMESPACE);
        wait_for(
            &format!("{pod} to run again from its image"),
            Duration::from_secs(120),
            async || {
                let p = pods.get(pod).await.ok()?;
                let c = p.status?.container_statuses?.into_iter().next()?;
                (c.restart_count >= 1 && c.ready).then_some(())
            },
        )
        .await;
    }
}

impl Meta {
    /// An agnhost Pod `name` in `ns` that Pod Security's restricted
    /// standard admits, once it runs; `namespace/name`.
    pub fn restricted_pod(&self, ns: &str, name: &str) -> String {
        let pod = self.start_restricted_pod(ns, name);
        self.wait_pod_ready(&pod);
        pod
    }

    /// That Pod created, not waited for; `namespace/name`.
    pub fn start_restricted_pod(&self, ns: &str, name: &str) -> String {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "agnhost",
                    "image": "registry.k8s.io/e2e-test-images/agnhost:2.59",
                    "args": ["pause"],
                    "securityContext": {"allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"]}},
                }],
            },
        });
        self.kubectl.apply(&pod.to_string());
        format!("{ns}/{name}")
    }

    /// Waits until `pod` (`namespace/name`) is Ready.
    pub fn wait_pod_ready(&self, pod: &str) {
        let (ns, name) = pod.split_once('/').expect("namespace/name");
        self.kubectl
            .run(
                &[
                    "-n",
                    ns,
                    "wait",
                    "--for=condition=Ready",
                    &format!("pod/{name}"),
                    "--timeout=180s",
                ],
                None,
            )
            .unwrap_or_else(|e| panic!("{pod} runs: {e}"));
    }

    /// The IP of a Pod in `ns` matching `selector`.
    pub fn pod_ip(&self, ns: &str, selector: &str) -> String {
        let list = self
            .kubectl
            .json(&["-n", ns, "get", "pods", "-l", selector])
            .expect("list Pods");
        let ips: Vec<String> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|p| p["status"]["podIP"].as_str().map(str::to_string))
            .collect();
        ips.first()
            .unwrap_or_else(|| panic!("no Pod {selector} in {ns}"))
            .clone()
    }

    /// The Pods of `ns`, their containers, and the memory they use
    /// (working set), as each meta worker's kubelet reports them
    /// (`/stats/summary`).
    pub fn memory_of(&self, ns: &str) -> (usize, usize, u64) {
        let (mut pods, mut containers, mut bytes) = (0, 0, 0);
        for node in self.meta_hosts() {
            let path = format!("/api/v1/nodes/{}/proxy/stats/summary", node.name());
            let text = self.kubectl.ok(&["get", "--raw", &path]);
            let summary: Value = serde_json::from_str(&text).expect("a stats summary");
            for pod in summary["pods"].as_array().into_iter().flatten() {
                if pod["podRef"]["namespace"] != ns {
                    continue;
                }
                pods += 1;
                containers += pod["containers"].as_array().map_or(0, Vec::len);
                bytes += pod["memory"]["workingSetBytes"].as_u64().unwrap_or(0);
            }
        }
        (pods, containers, bytes)
    }

    /// Whether `pod` (`namespace/name`) opens a TCP connection to
    /// `ip:port` within 3 s.
    pub fn connects(&self, pod: &str, ip: &str, port: u16) -> bool {
        let (ns, name) = pod.split_once('/').expect("namespace/name");
        self.kubectl
            .run(
                &[
                    "-n",
                    ns,
                    "exec",
                    name,
                    "--",
                    "nc",
                    "-z",
                    "-w",
                    "3",
                    ip,
                    &port.to_string(),
                ],
                None,
            )
            .is_ok()
    }
}

/// Ready for the latest spec, every stateless component reported at
/// `version`, no upgrade under way.
pub fn settled_at(c: &Cluster, version: &str) -> bool {
    let Some(status) = c.status.as_ref() else {
        return false;
    };
    let components = status.components.as_ref();
    let versions = [
        components.and_then(|x| x.api_server.version.clone()),
        components.and_then(|x| x.controller_manager.version.clone()),
        components.and_then(|x| x.scheduler.version.clone()),
    ];
    status.observed_generation == c.metadata.generation
        && common::all_ready(c)
        && versions.iter().all(|v| v.as_deref() == Some(version))
        && status
            .condition("Progressing")
            .is_some_and(|p| p.status == "False" && p.reason == "UpToDate")
}

impl Meta {
    /// Routes every Node's Pod CIDR from this machine, where the API server
    /// runs, to the Node.
    pub fn route_pods(&self) {
        let nodes = self.kubectl.json(&["get", "nodes"]).expect("list Nodes");
        for node in nodes["items"].as_array().into_iter().flatten() {
            let cidr = node["spec"]["podCIDR"].as_str().expect("a Pod CIDR");
            let address = node["status"]["addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["type"] == "InternalIP")
                .and_then(|a| a["address"].as_str())
                .expect("an InternalIP");
            self.routes
                .route(cidr, address.parse().expect("an address"))
                .expect("a route to the Node's Pods");
        }
    }

    /// The meta-cluster's claims and LoadBalancers, from upstream's
    /// manifests as released: local-path-provisioner (the default class,
    /// volumes under each node's /opt, its helper Pods on busybox) and
    /// MetalLB in L2 mode answering for [`Meta::pool`] on the hosts'
    /// network.
    pub fn apply_storage_and_load_balancer(&self) {
        let manifests = node_software::images_dir()
            .expect("the images' directory")
            .join("manifests");
        let local_path = std::fs::read_to_string(manifests.join("local-path-storage.yaml"))
            .expect("local-path-provisioner's manifest")
            .replace(
                "image: busybox",
                "image: registry.k8s.io/e2e-test-images/busybox:1.37.0-1",
            );
        self.kubectl.apply(&local_path);
        self.kubectl
            .run(
                &[
                    "annotate",
                    "storageclass",
                    "local-path",
                    "storageclass.kubernetes.io/is-default-class=true",
                ],
                None,
            )
            .expect("local-path as the default class");
        let metallb = std::fs::read_to_string(manifests.join("metallb-native.yaml"))
            .expect("MetalLB's manifest");
        self.kubectl.apply(&metallb);
    }

    /// Waits until local-path-provisioner and MetalLB run, then gives
    /// MetalLB its pool and advertises it in L2 mode.
    pub fn wait_storage_and_load_balancer(&self) {
        for (ns, what) in [
            ("local-path-storage", "deployment/local-path-provisioner"),
            ("metallb-system", "deployment/controller"),
            ("metallb-system", "daemonset/speaker"),
        ] {
            self.kubectl
                .run(
                    &["-n", ns, "rollout", "status", what, "--timeout=180s"],
                    None,
                )
                .unwrap_or_else(|e| panic!("{ns} {what}: {e}"));
        }
        let (first, last) = self.pool();
        let pool = json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "hosts", "namespace": "metallb-system"},
            "spec": {"addresses": [format!("{first}-{last}")]},
        });
        let l2 = json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement",
            "metadata": {"name": "hosts", "namespace": "metallb-system"},
            "spec": {"ipAddressPools": ["hosts"]},
        });
        // The controller's webhook serves a moment after it turns ready.
        for object in [pool, l2] {
            let text = object.to_string();
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match self.kubectl.run(
                    &[
                        "apply",
                        "--server-side",
                        "--field-manager",
                        MANAGER,
                        "-f",
                        "-",
                    ],
                    Some(&text),
                ) {
                    Ok(_) => break,
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("MetalLB's webhook not yet: {e}");
                        std::thread::sleep(Duration::from_secs(2));
                    }
                    Err(e) => panic!("applying {text}: {e}"),
                }
            }
        }
    }

    /// The load balancer's addresses: the top of the hosts' /24, which no
    /// host takes.
    pub fn pool(&self) -> (std::net::Ipv4Addr, std::net::Ipv4Addr) {
        let IpAddr::V4(gateway) = self.hosts.gateway_ip() else {
            panic!("an IPv4 bridge");
        };
        let [a, b, c, _] = gateway.octets();
        ([a, b, c, 200].into(), [a, b, c, 220].into())
    }
}

/// A namespace whose Pods Pod Security Admission admits only under the
/// `restricted` standard (not root, no privilege escalation, every
/// capability dropped, the runtime's seccomp profile, no node directories).
pub fn restricted_namespace(name: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }},
    })
    .to_string()
}

/// The meta-cluster's node-operator, as a process beside its control plane
/// (as the control plane's own programs run); killed when dropped.
pub struct NodeOperator {
    child: Child,
    log: PathBuf,
}

impl NodeOperator {
    pub fn start(env: &KubeEnv) -> NodeOperator {
        let log = env.log_dir().join("meta-node-operator.log");
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(common::node_operator_binary())
            .arg(format!("--kubeconfig={}", env.kubeconfig_path().display()))
            .arg(format!("--cluster-dns={META_DNS}"))
            .arg("--http-address=127.0.0.1:0")
            .arg("--recheck-interval=20s")
            .arg(format!("--leader-election-namespace={RELEASE_NAMESPACE}"))
            .arg("--log-level=info,node_operator=debug")
            .env("POD_NAME", "meta-node-operator")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start the node-operator");
        NodeOperator { child, log }
    }
}

impl NodeOperator {
    /// SIGTERM, as a Pod is stopped: it releases the Lease on its way out.
    pub fn stop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Meta {
    /// On a failure, what the meta-cluster looked like: each node's
    /// conditions (disk or memory pressure evicts Pods), the Pods not
    /// running, and the last warnings.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let show = |what: &str, args: &[&str]| match self.kubectl.run(args, None) {
            Ok(out) => eprintln!("--- {what}\n{out}"),
            Err(e) => eprintln!("--- {what}: {e}"),
        };
        show(
            "meta nodes' conditions that hold",
            &[
                "get",
                "nodes",
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.name}:{range .status.conditions[?(@.status=="True")]} {.type}{end}{"\n"}{end}"#,
            ],
        );
        show(
            "meta Pods not running",
            &[
                "get",
                "pods",
                "-A",
                "-o",
                "wide",
                "--field-selector=status.phase!=Running",
            ],
        );
        if let Ok(events) = self.kubectl.run(
            &[
                "get",
                "events",
                "-A",
                "--field-selector=type=Warning",
                "--sort-by=.lastTimestamp",
            ],
            None,
        ) {
            let lines: Vec<&str> = events.lines().collect();
            let last = &lines[lines.len().saturating_sub(30)..];
            eprintln!("--- the last meta warnings\n{}", last.join("\n"));
        }
    }
}

impl Drop for NodeOperator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("meta node-operator log: {}", self.log.display());
        }
    }
}

/// The meta-cluster's add-ons, rendered by the operator's templates for a
/// cluster with the meta-cluster's networks, whose API hosts reach at
/// `server`, and applied.
pub async fn apply_addons(client: &kube::Client, env: &KubeEnv, server: &str) {
    let mut cluster: Cluster = common::minimal_example();
    cluster.spec.network.service_cidr = META_SERVICE_CIDR.into();
    cluster.spec.network.pod_cidr = POD_CIDR.into();
    // The meta-cluster's network enforces NetworkPolicies: tenants are
    // fenced from each other's control planes.
    cluster.spec.addons.push(
        serde_json::from_value(json!({
            "name": addons::KUBE_ROUTER,
            "version": addons::KUBE_ROUTER_VERSION,
            "values": {"extraArgs": ["--run-firewall=true"]},
        }))
        .expect("the kube-router entry"),
    );
    let settings = addons::Settings {
        registry: "registry.k8s.io",
        operator_version: env!("CARGO_PKG_VERSION"),
        node_operator_image: "node-operator",
    };
    let ca_pem = env_ca_pem(env);
    let names = Names::new(&cluster, "cluster.local");
    let facts = addons::Facts {
        names: &names,
        endpoint: server,
        ca_pem: &ca_pem,
    };
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    for plan in addons::plan(&cluster, &settings, &[], &[]) {
        let addons::Plan::Apply(planned) = plan else {
            continue;
        };
        if !META_ADDONS.contains(&planned.name.as_str()) {
            continue;
        }
        let rendered = addons::render(&planned, &cluster, &facts, &settings)
            .unwrap_or_else(|e| panic!("rendering {}: {e}", planned.name));
        for object in rendered.objects {
            apply_object(client, &discovery, object).await;
        }
    }
}

pub fn env_ca_pem(env: &KubeEnv) -> String {
    use base64::Engine as _;
    let data = env.kubeconfig().clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.certificate_authority_data.clone())
        .expect("the CA in the admin kubeconfig");
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("base64"),
    )
    .expect("PEM")
}

pub async fn apply_object(client: &kube::Client, discovery: &Discovery, object: DynamicObject) {
    let types = object.types.clone().expect("types");
    let gvk = kube::api::GroupVersionKind::try_from(&types).expect("gvk");
    let (resource, caps): (ApiResource, _) = discovery
        .resolve_gvk(&gvk)
        .unwrap_or_else(|| panic!("{gvk:?} is served"));
    let api: Api<DynamicObject> = match (caps.scope, object.namespace()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), &ns, &resource),
        _ => Api::all_with(client.clone(), &resource),
    };
    let mut value = serde_json::to_value(&object).expect("json");
    value["apiVersion"] = resource.api_version.clone().into();
    value["kind"] = resource.kind.clone().into();
    api.patch(
        &object.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await
    .unwrap_or_else(|e| panic!("applying {} {}: {e}", resource.kind, object.name_any()));
}

/// The business worker's Machine and key Secret: the example Machine for
/// `host`, reserving little (the hosts share this machine's cores).
pub fn business_machine(hosts: &TestHosts, host: &kok_testenv::hosts::TestHost) -> String {
    let key = node_software::example_ssh_key(hosts).expect("the key Secret");
    let machine = node_software::example_machine(host, "zone-0").expect("the Machine");
    let mut v = serde_json::to_value(&machine).expect("json");
    v["spec"]["kubelet"]["kubeReserved"] = json!({"cpu": "50m", "memory": "128Mi"});
    v["spec"]["kubelet"]["systemReserved"] = json!({"cpu": "50m", "memory": "128Mi"});
    format!("{}\n---\n{}", serde_json::to_string(&key).expect("json"), v)
}

/// One agnhost Pod serving HTTP, on the business worker.
pub const BUSINESS_WORKLOAD: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: agnhost
        image: registry.k8s.io/e2e-test-images/agnhost:2.59
        args: [netexec, --http-port=8080]
"#;

impl Meta {
    /// The meta worker MetalLB announces the tenant's load balancer address
    /// from, as its speaker reports it on the Service.
    pub async fn load_balancer_announcer(&self, ns: &str) -> String {
        wait_for(
            "MetalLB to say which node announces the API's address",
            Duration::from_secs(60),
            async || {
                let events = self.kubectl.json(&[
                    "-n",
                    ns,
                    "get",
                    "events",
                    "--field-selector",
                    "reason=nodeAssigned",
                ])?;
                let note = events["items"].as_array()?.last()?["message"]
                    .as_str()?
                    .to_string();
                // announcing from node "meta-x" with protocol "layer2"
                note.split('"').nth(1).map(str::to_string)
            },
        )
        .await
    }

    /// The tenant's etcd member Pods and their nodes.
    pub fn etcd_nodes(&self, ns: &str) -> Vec<(String, String)> {
        let pods = self
            .kubectl
            .json(&[
                "-n",
                ns,
                "get",
                "pods",
                "-l",
                "kubeonkube.io/component=etcd",
            ])
            .expect("the etcd Pods");
        pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                Some((
                    p["metadata"]["name"].as_str()?.to_string(),
                    p["spec"]["nodeName"].as_str()?.to_string(),
                ))
            })
            .collect()
    }
}

/// The images of every container of the Pods in `ns` that are not on
/// their way out, each checked to run ready in containerd.
pub async fn running_images(client: &kube::Client, ns: &str) -> BTreeSet<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&Default::default())
        .await
        .expect("the tenant's Pods");
    let mut seen = BTreeSet::new();
    for pod in list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let status = pod.status.clone().unwrap_or_default();
        for c in status.container_statuses.unwrap_or_default() {
            let id = c.container_id.unwrap_or_default();
            assert!(
                id.starts_with("containerd://") && c.ready,
                "{} {}: {id} ready={}",
                pod.name_any(),
                c.name,
                c.ready
            );
            seen.insert(c.image);
        }
    }
    seen
}
