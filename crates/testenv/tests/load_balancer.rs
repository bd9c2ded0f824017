//! The test meta-cluster's load balancer: a Service of type LoadBalancer in
//! front of a Deployment the Pod runner runs gets an address of the
//! machine's, written in its status; connections to it from the machine and
//! from another network namespace (a Pod, routed via the machine) reach the
//! ready replicas in turn, on the container port its `targetPort` names; it
//! follows the replicas as they are scaled and replaced; the address goes
//! when the Service stops being a LoadBalancer or is deleted.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::load_balancer::{ingress_ips, wait_for_ingress};
use kok_testenv::pods::{Options, PodRunner, RUNNER_LABEL};
use kok_testenv::wait::wait_for;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn runner() -> &'static PodRunner {
    static RUNNER: OnceLock<PodRunner> = OnceLock::new();
    RUNNER.get_or_init(|| {
        PodRunner::start(
            KubeEnv::shared(),
            Options {
                nodes: vec!["lb-test-0".into()],
                load_balancer: true,
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("the Pod runner did not start: {e}"))
    })
}

/// Answers each connection with its Pod's name and the line it was sent.
const ECHO: &str = r#"
import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen(64)
while True:
    c, _ = s.accept()
    f = c.makefile("rwb")
    line = f.readline()
    f.write(os.environ["HOSTNAME"].encode() + b" " + line)
    f.flush()
    c.close()
"#;

/// Sends `ping` to `ip:80` and prints the answer.
const CLIENT: &str = r#"
import socket, sys
c = socket.create_connection((sys.argv[1], 80), 5)
c.sendall(b"ping\n")
print(c.makefile().readline().strip())
"#;

/// One request from the machine: the answering Pod's name.
async fn ask(ip: Ipv4Addr) -> Option<String> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect((ip, 80)).await.ok()?;
        s.write_all(b"ping\n").await.ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.ok()?;
        let (pod, rest) = answer.trim().split_once(' ')?;
        (rest == "ping").then(|| pod.to_string())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// The Pods that answer `rounds` requests in a row, all of them answered.
async fn answering(ip: Ipv4Addr, rounds: usize) -> Option<BTreeSet<String>> {
    let mut seen = BTreeSet::new();
    for _ in 0..rounds {
        seen.insert(ask(ip).await?);
    }
    Some(seen)
}

/// Names of the Deployment's ready Pods.
async fn ready_pods(pods: &Api<Pod>) -> BTreeSet<String> {
    let list = pods
        .list(&ListParams::default().labels("app=echo"))
        .await
        .expect("list pods");
    list.items
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .map(|p| p.name_any())
        .collect()
}

/// Waits until exactly `want` Pods are ready and every request is answered
/// by exactly them.
async fn follows(pods: &Api<Pod>, ip: Ipv4Addr, want: usize) -> BTreeSet<String> {
    wait_for(
        &format!("{ip}:80 to be answered by the {want} ready Pods"),
        Duration::from_secs(90),
        async || {
            let ready = ready_pods(pods).await;
            (ready.len() == want && answering(ip, 4 * want).await? == ready).then_some(ready)
        },
    )
    .await
}

fn addresses_on(interface: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show", "dev", interface])
        .output()
        .expect("ip addr");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn route_to(ip: Ipv4Addr) -> String {
    let out = std::process::Command::new("ip")
        .args(["route", "get", &ip.to_string()])
        .output()
        .expect("ip route get");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn scale(deployments: &Api<Deployment>, replicas: i32) {
    deployments
        .patch(
            "echo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .expect("scale");
}

/// Runs the client Pod (in its own network namespace, default route via
/// the machine) and returns what it printed.
async fn ask_from_a_pod(client: &Client, ns: &str, ip: Ipv4Addr) -> String {
    let runner = runner();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "client"},
        "spec": {
            "nodeName": runner.nodes()[0],
            "restartPolicy": "Never",
            "containers": [{"name": "client", "image": "python",
                            "command": ["/usr/bin/python3", "-c", CLIENT, ip.to_string()]}]
        }
    }))
    .expect("pod");
    let pod = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("client pod");
    let phase = wait_for(
        "the client Pod to finish",
        Duration::from_secs(60),
        async || {
            let phase = pods.get_opt("client").await.ok().flatten()?.status?.phase?;
            matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
        },
    )
    .await;
    let log = runner.container_log(ns, "client", &pod.uid().unwrap_or_default(), "client");
    let printed = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(phase, "Succeeded", "{printed}");
    printed.trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_service_gets_an_address_of_the_machine_that_follows_its_endpoints() {
    let runner = runner();
    let lb = runner.load_balancer().expect("load balancer");
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("lb").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "echo"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "echo"}},
            "template": {
                "metadata": {"labels": {"app": "echo"}},
                "spec": {
                    "nodeSelector": {RUNNER_LABEL: "true"},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "echo", "image": "python",
                        "command": ["/usr/bin/python3", "-c", ECHO],
                        "ports": [{"name": "echo", "containerPort": 8080}],
                        "readinessProbe": {"tcpSocket": {"port": "echo"}, "periodSeconds": 1}
                    }]
                }
            }
        }
    }))
    .expect("deployment");
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("deployment");
    // Port 80 to the container port named `echo`: the address serves the
    // Service's port, the Pods their own.
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "echo"},
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": "echo"},
            "ports": [{"name": "web", "port": 80, "targetPort": "echo"}]
        }
    }))
    .expect("service");
    services
        .create(&PostParams::default(), &service)
        .await
        .expect("service");

    let ip = wait_for_ingress(&services, "echo", Duration::from_secs(30)).await;
    println!("echo: load-balancer address {ip} of {}", lb.network());
    let network: Vec<&str> = lb.network().split('.').collect();
    assert_eq!(
        ip.octets()[..3]
            .iter()
            .map(u8::to_string)
            .collect::<Vec<_>>(),
        network[..3],
        "{ip} not in {}",
        lb.network()
    );
    assert!(
        addresses_on(lb.interface()).contains(&format!("inet {ip}/32")),
        "{ip} is not the machine's"
    );

    // From the machine: both replicas answer, in turn.
    let both = follows(&pods, ip, 2).await;
    println!("echo: answered by {both:?}");
    // From another network namespace, routed via the machine.
    let from_pod = ask_from_a_pod(&client, &ns, ip).await;
    let (pod, said) = from_pod.split_once(' ').unwrap_or_default();
    assert!(both.contains(pod) && said == "ping", "{from_pod}");

    // Scaled down: only the replica left answers.
    scale(&deployments, 1).await;
    let one = follows(&pods, ip, 1).await;
    assert!(one.is_subset(&both), "{one:?} {both:?}");
    // That replica replaced: its successor answers.
    let last = one.first().cloned().unwrap_or_default();
    pods.delete(&last, &DeleteParams::default())
        .await
        .expect("delete pod");
    let successor = follows(&pods, ip, 1).await;
    assert!(!successor.contains(&last), "{successor:?}");

    // No longer a LoadBalancer: status and address go.
    services
        .patch(
            "echo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
        )
        .await
        .expect("to ClusterIP");
    let released = |ip: Ipv4Addr| async move {
        // While the machine still holds the address, the kernel routes it
        // locally (`local … dev lo`): only a released address is checked.
        if addresses_on(lb.interface()).contains(&format!("inet {ip}/")) {
            return false;
        }
        // An address given to nobody stays routed to the load balancer's
        // interface, where nothing answers.
        let route = route_to(ip);
        assert!(
            route.contains(&format!("dev {} ", lb.interface())),
            "{ip} must stay routed to {}: {route}",
            lb.interface(),
        );
        let connect = tokio::net::TcpStream::connect(SocketAddr::from((ip, 80)));
        !matches!(
            tokio::time::timeout(Duration::from_secs(1), connect).await,
            Ok(Ok(_))
        )
    };
    wait_for(
        "the address to go with the type",
        Duration::from_secs(30),
        async || {
            let svc = services.get("echo").await.ok()?;
            (ingress_ips(&svc).is_empty() && released(ip).await).then_some(())
        },
    )
    .await;

    // A LoadBalancer again, then deleted: the address goes with it.
    services
        .patch(
            "echo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "LoadBalancer"}})),
        )
        .await
        .expect("to LoadBalancer");
    let again = wait_for_ingress(&services, "echo", Duration::from_secs(30)).await;
    follows(&pods, again, 1).await;

    // spec.loadBalancerIP: the Service moves to the address it asks for...
    let requested: Ipv4Addr = format!("{}200", lb.network().trim_end_matches("0/24"))
        .parse()
        .expect("an address of the pool");
    let ask = |ip: String| {
        let services = services.clone();
        async move {
            services
                .patch(
                    "echo",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"loadBalancerIP": ip}})),
                )
                .await
                .expect("ask for an address")
        }
    };
    ask(requested.to_string()).await;
    wait_for(
        "the Service to move to the address it asks for",
        Duration::from_secs(30),
        async || {
            let svc = services.get("echo").await.ok()?;
            (ingress_ips(&svc) == [requested.to_string()] && released(again).await).then_some(())
        },
    )
    .await;
    follows(&pods, requested, 1).await;
    // ...and gets none while it asks for one outside the pool.
    ask("192.0.2.10".into()).await;
    wait_for(
        "the Service to lose its address",
        Duration::from_secs(30),
        async || {
            let svc = services.get("echo").await.ok()?;
            (ingress_ips(&svc).is_empty() && released(requested).await).then_some(())
        },
    )
    .await;
    services
        .delete("echo", &DeleteParams::default())
        .await
        .expect("delete service");
    wait_for(
        "the address to go with the Service",
        Duration::from_secs(30),
        async || released(again).await.then_some(()),
    )
    .await;
    deployments
        .delete("echo", &DeleteParams::default())
        .await
        .expect("delete deployment");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_load_balancer_leaves_no_interface_behind() {
    let lb = kok_testenv::load_balancer::LoadBalancer::start(KubeEnv::shared()).expect("start");
    let interface = lb.interface().to_string();
    let anchor = format!("{}254", lb.network().trim_end_matches("0/24"));
    assert!(addresses_on(&interface).contains(&format!("inet {anchor}/24")));
    drop(lb);
    let links = std::process::Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .expect("ip link");
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(!links.contains(&format!(" {interface}:")), "{links}");
}
