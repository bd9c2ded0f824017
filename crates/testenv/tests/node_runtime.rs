//! The SSH test hosts run a worker node's real software side by side: each
//! host downloads containerd, runc, the CNI plugins, crictl and the kubelet
//! from the artifact server as a real machine would, runs containerd as a
//! unit configured as `scripts/node-packageversions.sh` configures it, pulls
//! images through the test registry as its mirror, runs Pods through the CRI
//! and then through a kubelet registered with a real API server, each
//! kubelet in its host's own cgroup root. No node-operator is involved: this
//! is what it will install on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use kok_testenv::hosts::{TestHost, TestHosts};
use kok_testenv::kube_env::{KubeEnv, Options};
use kok_testenv::node_software::{self, PackageVersionsOptions};
use kok_testenv::proxy::TcpProxy;
use kok_testenv::registry::Registry;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.59";
const PAUSE: &str = "registry.k8s.io/pause:3.10.1";

/// Runs `script` on `host` (with `set -eu`) and returns its stdout; fails
/// the test with everything it printed if it fails.
fn sh(host: &TestHost, script: &str) -> String {
    let out = host.ssh(&format!("set -eu\n{script}"));
    assert!(
        out.status.success(),
        "on {} ({}):\n{script}\n--- stdout\n{}\n--- stderr\n{}",
        host.name(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn eventually<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `printf <base64> | base64 -d > path`, so any content survives the shell.
fn write_file(path: &str, content: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(content);
    format!("mkdir -p \"$(dirname {path})\"\nprintf '%s' '{b64}' | base64 -d > {path}\n")
}

/// The PackageVersion of `package` in the YAML of `node-packageversions.sh`.
fn package<'a>(docs: &'a [Value], package: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == "PackageVersion" && d["spec"]["package"] == package)
        .unwrap_or_else(|| panic!("no PackageVersion of {package}"))
}

/// What a node-operator would do for `package`, by hand: download its
/// artifact, check its sha256, put its binaries in place and, with
/// `configure`, write its files (templates without template expressions)
/// and its unit.
fn install_script(docs: &[Value], name: &str, unpack: &str, configure: bool) -> String {
    let spec = &package(docs, name)["spec"];
    let artifact = &spec["artifacts"][0];
    let (url, sha) = (
        artifact["url"].as_str().unwrap(),
        artifact["sha256"].as_str().unwrap(),
    );
    let mut script = format!(
        "d=$(mktemp -d)\ncurl -fsS -o \"$d/a\" '{url}'\n\
         echo '{sha}  '\"$d/a\" | sha256sum -c --quiet\n{unpack}\nrm -rf \"$d\"\n"
    );
    if !configure {
        return script;
    }
    for file in spec["install"]["files"].as_array().into_iter().flatten() {
        let template = file["template"].as_str().unwrap();
        assert!(!template.contains("{{"), "{name}: {template}");
        script.push_str(&write_file(file["path"].as_str().unwrap(), template));
    }
    if let Some(unit) = spec["install"].get("systemdUnit") {
        let path = format!("/etc/systemd/system/{}", unit["name"].as_str().unwrap());
        script.push_str(&write_file(&path, unit["content"].as_str().unwrap()));
    }
    script
}

/// A bridge CNI network with the Pod subnet `10.244.<n>.0/24`.
fn cni_conflist(n: usize) -> String {
    json!({
        "cniVersion": "1.0.0",
        "name": "kok-test",
        "plugins": [{
            "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": format!("10.244.{n}.0/24")}]],
                     "routes": [{"dst": "0.0.0.0/0"}]}
        }]
    })
    .to_string()
}

/// The newest modification time and the number of files under `dir`.
fn tree_state(dir: &Path) -> (SystemTime, usize) {
    let mut newest = SystemTime::UNIX_EPOCH;
    let mut count = 0;
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let meta = entry.metadata().unwrap();
            newest = newest.max(meta.modified().unwrap());
            count += 1;
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    (newest, count)
}

fn cgroup_dirs(cgroup: &str) -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|h| h.path().join(cgroup.trim_start_matches('/')))
        .filter(|p| p.exists())
        .collect()
}

/// The machine's mounts that belong to `run_dir` or to a node's software.
fn leftover_mounts(run_dir: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            l.contains(run_dir)
                || l.contains("/var/lib/kubelet")
                || l.contains("/var/lib/containerd")
                || l.contains("/run/containerd")
                || l.contains("kok-hosts")
        })
        .map(str::to_owned)
        .collect()
}

/// Processes in the PID namespace `ns` that started before `started_before`
/// (clock ticks since boot). A namespace is named by an inode number, which
/// the kernel hands out again once the namespace is gone: a test running
/// beside this one may boot a host into a namespace with the same name.
fn processes_in_namespace(ns: &str, started_before: u64) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read_link(e.path().join("ns/pid")).is_ok_and(|l| l.display().to_string() == ns)
        })
        .filter(|e| start_ticks(&e.path()).is_some_and(|t| t < started_before))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// When the process at `/proc/<pid>` started, in clock ticks since boot.
fn start_ticks(proc_dir: &Path) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    // Field 22; the fields after the command's closing parenthesis start
    // at field 3.
    let after_command = &stat[stat.rfind(')')? + 1..];
    after_command.split_whitespace().nth(19)?.parse().ok()
}

/// Clock ticks since boot, as [`start_ticks`] counts them.
fn ticks_now() -> u64 {
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap();
    let seconds: f64 = uptime.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (seconds * per_second).ceil() as u64
}

#[test]
fn hosts_run_containerd_pods_and_kubelets_side_by_side() {
    let started = Instant::now();
    // The API server starts while the hosts install.
    let kube = std::thread::spawn(|| {
        KubeEnv::start(Options {
            controller_manager: false,
            scheduler: false,
            kwok_nodes: 0,
            install_crds: false,
            controller_manager_qps: None,
            node_monitor_grace: None,
            real_nodes: None,
        })
        .map_err(|e| e.report())
    });

    let hosts = TestHosts::start(2).unwrap();
    let registry = Registry::start_with_node_images(hosts.gateway_ip()).unwrap();
    let storage_before = tree_state(registry.storage());
    let served = node_software::serve_artifacts(&hosts).unwrap();
    assert!(served.iter().any(|f| f == "kubelet"), "{served:?}");
    let options = PackageVersionsOptions::for_test_hosts(&registry);
    // This machine kind: cgroup v1 only, root without CAP_SYS_RESOURCE. The
    // cgroup checks below read v1 hierarchies.
    assert!(
        options.cgroup_v1 && options.restrict_oom_score_adj,
        "{options:?}"
    );
    let yaml =
        node_software::package_versions(&node_software::artifacts_base_url(&hosts), &options)
            .unwrap();
    let docs: Vec<Value> = serde_norway::Deserializer::from_str(&yaml)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let kubelet_unit = package(&docs, "kubelet")["spec"]["install"]["systemdUnit"]["content"]
        .as_str()
        .unwrap();
    assert!(kubelet_unit.contains("kubeletExtraArgs"), "{kubelet_unit}");

    // Install and start containerd on both hosts at once.
    let install = [
        install_script(
            &docs,
            "runc",
            "install -m 0755 \"$d/a\" /usr/local/sbin/runc",
            true,
        ),
        install_script(&docs, "containerd", "tar -xzf \"$d/a\" -C /usr/local", true),
        install_script(
            &docs,
            "cni-plugins",
            "mkdir -p /opt/cni/bin && tar -xzf \"$d/a\" -C /opt/cni/bin",
            true,
        ),
        install_script(&docs, "crictl", "tar -xzf \"$d/a\" -C /usr/local/bin", true),
        // Its configuration and unit come below, written for this test.
        install_script(
            &docs,
            "kubelet",
            "install -m 0755 \"$d/a\" /usr/local/bin/kubelet",
            false,
        ),
    ]
    .concat();
    std::thread::scope(|s| {
        for (i, host) in hosts.hosts().iter().enumerate() {
            let script = format!(
                "{install}{cni}systemctl daemon-reload\nsystemctl enable --now containerd\n\
                 for i in $(seq 100); do crictl info >/dev/null 2>&1 && break; sleep 0.2; done\n\
                 crictl pull {PAUSE} >/dev/null\ncrictl pull {AGNHOST} >/dev/null\n",
                cni = write_file("/etc/cni/net.d/10-kok-test.conflist", &cni_conflist(i + 1)),
            );
            s.spawn(move || sh(host, &script));
        }
    });
    eprintln!("containerd up on both hosts after {:?}", started.elapsed());

    for host in hosts.hosts() {
        // The ignored ExecStartPre (no /sbin/modprobe here) did not stop it,
        // and it runs in its own cgroup under the host's root.
        assert_eq!(sh(host, "systemctl is-active containerd"), "active");
        let control_group = sh(host, "systemctl show -p ControlGroup --value containerd");
        assert_eq!(
            control_group,
            format!("{}/system.slice/containerd.service", host.cgroup_root())
        );
        assert_eq!(
            sh(host, "systemctl show -p KillMode --value containerd"),
            "process"
        );
        // LimitNOFILE=infinity: as high as the host may go.
        let (_, hard) = hard_nofile();
        let limits = sh(
            host,
            "cat /proc/$(systemctl show -p MainPID --value containerd)/limits",
        );
        let open_files = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap();
        let words: Vec<&str> = open_files.split_whitespace().collect();
        assert_eq!(
            words[3..5],
            [hard.to_string(), hard.to_string()],
            "{open_files}"
        );
        // Pulled through the mirror under the upstream names.
        let images = sh(host, "crictl images -o json");
        assert!(
            images.contains(PAUSE) && images.contains(AGNHOST),
            "{images}"
        );
        assert_eq!(sh(host, "nproc"), sh_machine("nproc"));
    }
    let pulls = std::fs::read_to_string(registry.log_path()).unwrap();
    assert!(
        pulls.contains("/v2/registry.k8s.io/e2e-test-images/agnhost/manifests/2.59"),
        "{pulls}"
    );

    // A Pod sandbox with agnhost through the CRI on each host.
    let mut pods = Vec::new();
    for (i, host) in hosts.hosts().iter().enumerate() {
        let sandbox = json!({
            "metadata": {"name": "netexec", "namespace": "default", "uid": format!("netexec-{i}"), "attempt": 0},
            "hostname": format!("netexec-{i}"),
            "log_directory": "/var/log/pods/netexec",
            "linux": {"cgroup_parent": format!("{}/crictl", host.cgroup_root())}
        });
        let container = json!({
            "metadata": {"name": "netexec"}, "image": {"image": AGNHOST},
            "args": ["netexec", "--http-port=8080"], "log_path": "netexec.log"
        });
        let ids = sh(
            host,
            &format!(
                "{}{}pod=$(crictl runp /tmp/pod.json)\nctr=$(crictl create $pod /tmp/ctr.json /tmp/pod.json)\n\
                 crictl start $ctr >/dev/null\necho $pod $ctr\n\
                 crictl inspectp -o go-template --template '{{{{.status.network.ip}}}}' $pod\n\
                 crictl inspect -o go-template --template '{{{{.info.pid}}}}' $ctr\n",
                write_file("/tmp/pod.json", &sandbox.to_string()),
                write_file("/tmp/ctr.json", &container.to_string()),
            ),
        );
        let words: Vec<String> = ids.split_whitespace().map(str::to_owned).collect();
        assert_eq!(words.len(), 4, "{ids}");
        let ip = words[2].clone();
        assert!(ip.starts_with(&format!("10.244.{}.", i + 1)), "{ip}");
        // Serves on its own host.
        let hostname = eventually(Duration::from_secs(20), "agnhost to serve", || {
            let out = host.ssh(&format!("curl -fsS --max-time 2 http://{ip}:8080/hostname"));
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        });
        assert_eq!(hostname, format!("netexec-{i}"));
        // Its processes are in the host's cgroups, memory and tasks counted.
        let cgroup = sh(host, &format!("cat /proc/{}/cgroup", words[3]));
        let memory_line = cgroup.lines().find(|l| l.contains(":memory:")).unwrap();
        assert!(
            memory_line.contains(&format!("{}/crictl/", host.cgroup_root())),
            "{cgroup}"
        );
        pods.push((words[0].clone(), words[1].clone(), ip, words[3].clone()));
    }
    for host in hosts.hosts() {
        let root = host.cgroup_root();
        let memory = read_number(&format!(
            "/sys/fs/cgroup/memory{root}/memory.usage_in_bytes"
        ));
        let tasks = read_number(&format!("/sys/fs/cgroup/pids{root}/pids.current"));
        assert!(memory > 10 << 20, "{root}: {memory} bytes");
        assert!(tasks >= 5, "{root}: {tasks} tasks");
    }

    // Host A reaches host B's Pods only once it has a route to them.
    let (a, b) = (&hosts.hosts()[0], &hosts.hosts()[1]);
    let b_pod = &pods[1].2;
    let curl_b = format!("curl -fsS --max-time 3 http://{b_pod}:8080/hostname");
    let refused = a.ssh(&curl_b);
    assert!(!refused.status.success());
    sh(a, &format!("ip route add 10.244.2.0/24 via {}", b.ip()));
    assert_eq!(sh(a, &curl_b), "netexec-1");

    // Restarting containerd (KillMode=process) keeps shims and containers.
    let before_main = sh(a, "systemctl show -p MainPID --value containerd");
    let shims_before = sh(a, "pgrep -x containerd-shim | sort");
    assert!(!shims_before.is_empty());
    sh(a, "systemctl restart containerd");
    assert_ne!(
        sh(a, "systemctl show -p MainPID --value containerd"),
        before_main
    );
    assert_eq!(sh(a, "pgrep -x containerd-shim | sort"), shims_before);
    let (_, a_ctr, a_ip, a_pid) = &pods[0];
    sh(a, &format!("kill -0 {a_pid}"));
    eventually(
        Duration::from_secs(20),
        "the container to be listed again",
        || {
            let out = a.ssh(&format!("crictl ps -q --state running --id {a_ctr}"));
            (out.status.success() && !out.stdout.is_empty()).then_some(())
        },
    );
    sh(
        a,
        &format!("curl -fsS --max-time 3 http://{a_ip}:8080/hostname"),
    );
    eprintln!("CRI Pods checked after {:?}", started.elapsed());

    // A kubelet on each host, registered with a real API server, each in its
    // host's cgroup root.
    let env = kube.join().unwrap().unwrap();
    let api: std::net::SocketAddr = env
        .api_url()
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    let proxy = TcpProxy::start(hosts.gateway_ip(), api).unwrap();
    let mut kubeconfig = env.kubeconfig().clone();
    let cluster = kubeconfig.clusters[0].cluster.as_mut().unwrap();
    cluster.server = Some(format!("https://{}", proxy.addr()));
    cluster.tls_server_name = Some("localhost".into());
    let ca = base64::engine::general_purpose::STANDARD
        .decode(cluster.certificate_authority_data.as_deref().unwrap())
        .unwrap();
    let kubeconfig = serde_norway::to_string(&kubeconfig).unwrap();
    let kubelet_config = "\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
  webhook:
    enabled: true
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
failCgroupV1: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
# The machine's disk is shared and often more than 85% full: the default
# thresholds (nodefs 10%, imagefs 15%) would evict every Pod. 0% is none.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 0%
  imagefs.available: 0%
";
    for host in hosts.hosts() {
        // As the PackageVersion's unit renders it, `kubeletExtraArgs`
        // holding `cgroup-root`.
        let unit = format!(
            "[Unit]\nDescription=kubelet\nAfter=containerd.service\nRequires=containerd.service\n\
             [Service]\nExecStart=/usr/local/bin/kubelet --config=/var/lib/kubelet/config.yaml \
             --kubeconfig=/etc/kubernetes/kubelet.conf --hostname-override={} --node-ip={} \
             --cgroup-root=\"{}\"\nRestart=always\n[Install]\nWantedBy=multi-user.target\n",
            host.name(),
            host.ip(),
            host.cgroup_root()
        );
        sh(
            host,
            &format!(
                "{}{}{}{}systemctl daemon-reload\nsystemctl enable --now kubelet\n",
                write_file("/etc/kubernetes/kubelet.conf", &kubeconfig),
                write_file(
                    "/etc/kubernetes/pki/ca.crt",
                    &String::from_utf8(ca.clone()).unwrap()
                ),
                write_file("/var/lib/kubelet/config.yaml", kubelet_config),
                write_file("/etc/systemd/system/kubelet.service", &unit),
            ),
        );
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let names: Vec<String> = hosts.hosts().iter().map(|h| h.name().to_owned()).collect();
    let pod_ips: Result<BTreeMap<String, String>, String> = runtime.block_on(async {
        let client = env.client().await;
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        let account = serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
        let _ = accounts.create(&PostParams::default(), &account).await;
        // What kube-controller-manager publishes in every namespace, for the
        // service account token's projected volume.
        let ca_map = serde_json::from_value(json!({
            "metadata": {"name": "kube-root-ca.crt"},
            "data": {"ca.crt": String::from_utf8(ca.clone()).unwrap()}
        }))
        .unwrap();
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let _ = maps.create(&PostParams::default(), &ca_map).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        for name in &names {
            let pod = serde_json::from_value(json!({
                "metadata": {"name": format!("web-{name}")},
                "spec": {
                    "nodeName": name,
                    "containers": [{"name": "netexec", "image": AGNHOST,
                                    "args": ["netexec", "--http-port=8080"],
                                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
                    "volumes": [{"name": "scratch", "emptyDir": {}}]
                }
            }))
            .unwrap();
            pods.create(&PostParams::default(), &pod).await.unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut ips = BTreeMap::new();
        while ips.len() < names.len() {
            for name in &names {
                let pod = pods.get(&format!("web-{name}")).await.unwrap();
                let status = pod.status.unwrap_or_default();
                if status.phase.as_deref() == Some("Running")
                    && let Some(ip) = status.pod_ip
                {
                    ips.insert(name.clone(), ip);
                }
            }
            if Instant::now() > deadline {
                let pods = pods.list(&Default::default()).await.unwrap();
                let statuses: Vec<String> = pods
                    .items
                    .iter()
                    .map(|p| serde_json::to_string(&p.status).unwrap())
                    .collect();
                return Err(format!("Running: {ips:?}; statuses: {statuses:#?}"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(ips)
    });
    let pod_ips = pod_ips.unwrap_or_else(|e| {
        for host in hosts.hosts() {
            let log = host.ssh("journalctl -u kubelet | tail -n 60");
            eprintln!(
                "--- kubelet on {}:\n{}",
                host.name(),
                String::from_utf8_lossy(&log.stdout)
            );
        }
        panic!("the kubelets' Pods are not Running: {e}")
    });
    for host in hosts.hosts() {
        let ip = &pod_ips[host.name()];
        assert_eq!(
            sh(
                host,
                &format!("curl -fsS --max-time 3 http://{ip}:8080/hostname")
            ),
            format!("web-{}", host.name())
        );
        // Its Pods' cgroups are under the host's root; the service account
        // token is a tmpfs the kubelet mounted.
        let kubepods = format!("{}/kubepods", host.cgroup_root());
        for hierarchy in ["memory", "cpu", "pids", "systemd"] {
            assert!(
                Path::new(&format!("/sys/fs/cgroup/{hierarchy}{kubepods}")).is_dir(),
                "{hierarchy}{kubepods}"
            );
        }
        let mounts = sh(host, "findmnt -rn -t tmpfs -o TARGET");
        assert!(mounts.contains("kube-api-access"), "{mounts}");
        assert_eq!(sh(host, "systemctl is-active kubelet"), "active");
    }
    eprintln!("kubelet Pods Running after {:?}", started.elapsed());

    // A reboot: the enabled units come back in order (containerd before the
    // kubelet that requires it), in a new cgroup tree, and the kubelet runs
    // its Pod again.
    let a = &hosts.hosts()[0];
    a.stop();
    assert_eq!(cgroup_dirs(&a.cgroup_root()), Vec::<PathBuf>::new());
    a.start().unwrap();
    let web_ip = eventually(Duration::from_secs(60), "the Pod after a reboot", || {
        let out = a.ssh(&format!(
            "set -e\npod=$(crictl pods -q --state ready --name web-{})\n\
             ip=$(crictl inspectp -o go-template --template '{{{{.status.network.ip}}}}' $pod)\n\
             curl -fsS --max-time 2 http://$ip:8080/hostname >/dev/null\necho $ip",
            a.name()
        ));
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    });
    assert!(web_ip.starts_with("10.244.1."), "{web_ip}");
    assert_eq!(
        sh(a, "systemctl is-active containerd kubelet"),
        "active\nactive"
    );
    assert!(
        Path::new(&format!(
            "/sys/fs/cgroup/memory{}/kubepods",
            a.cgroup_root()
        ))
        .is_dir()
    );
    eprintln!("rebooted host's Pod Running after {:?}", started.elapsed());

    // The registry served the cache without writing to it.
    assert_eq!(tree_state(registry.storage()), storage_before);

    // Powering the hosts off leaves no process, cgroup or mount behind.
    let run_dir = format!("/run/kok-testenv/{}", hosts.run_id());
    let roots: Vec<String> = hosts.hosts().iter().map(|h| h.cgroup_root()).collect();
    let namespaces: Vec<String> = hosts
        .hosts()
        .iter()
        .map(|h| {
            std::fs::read_link(format!("/proc/{}/ns/pid", h.init_pid().unwrap()))
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    assert!(!processes_in_namespace(&namespaces[0], u64::MAX).is_empty());
    let powered_off = ticks_now();
    drop(proxy);
    drop(hosts);
    for ns in &namespaces {
        assert_eq!(
            processes_in_namespace(ns, powered_off),
            Vec::<String>::new()
        );
    }
    for root in &roots {
        assert_eq!(cgroup_dirs(root), Vec::<PathBuf>::new());
    }
    assert_eq!(leftover_mounts(&run_dir), Vec::<String>::new());
    eprintln!("done after {:?}", started.elapsed());
}

fn hard_nofile() -> (u64, u64) {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let hard: u64 = words[4].parse().unwrap_or(u64::MAX);
    (words[3].parse().unwrap_or(u64::MAX), hard.min(nr_open))
}

fn sh_machine(command: &str) -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", command])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn read_number(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .parse()
        .unwrap()
}
