//! A load balancer for the test meta-cluster, doing what MetalLB and
//! kube-proxy do on a bare-metal one: every Service of type LoadBalancer
//! (without a `loadBalancerClass`) gets an IPv4 address from a /24 that
//! nothing else on the machine uses (the one its `spec.loadBalancerIP` asks
//! for, or none while that is outside the /24 or taken), the machine owns
//! that address (see
//! [`pool`]), `status.loadBalancer.ingress[0].ip` says it, and TCP
//! connections to `<address>:<port>` are forwarded to the Service's ready
//! endpoints (see [`backends`]), following them as they change. The address
//! is released when the Service is deleted or stops being a LoadBalancer,
//! and everything goes with the load balancer (or its process).

mod backends;
mod pool;

pub use pool::owner_of as owner_of_interface;

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};

use crate::background::Background;
use crate::kube_env::KubeEnv;
use crate::pods::net::NetError;
use pool::Pool;

/// How often a pass runs without a change, to retry what failed (a port
/// that could not be bound, a status that could not be written).
const RESYNC: Duration = Duration::from_secs(2);

/// Errors starting the load balancer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot set up the load balancer's addresses: {0}")]
    Network(#[from] NetError),
    #[error("no /24 of 10.212.0.0/16 is free on this machine")]
    NoPool,
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach the API server: {0}")]
    Kube(#[from] kube::Error),
}

/// A running load balancer for one test cluster. Dropping it closes its
/// ports and removes its addresses; the Services keep the status it wrote.
pub struct LoadBalancer {
    _background: Background,
    interface: String,
    network: String,
}

impl LoadBalancer {
    /// Start serving the LoadBalancer Services of `env`'s cluster, in every
    /// namespace. Returns once its addresses are set up and it has a client.
    pub fn start(env: &KubeEnv) -> Result<LoadBalancer, Error> {
        let pool = Pool::create()?;
        let interface = pool.interface().to_string();
        let network = pool.network();
        let kubeconfig = env.kubeconfig().clone();
        let background = Background::start(
            "kok-load-balancer",
            1,
            |what, source| Error::Io { what, source },
            move |ready, stop| async move {
                let client = match crate::pods::client_for(&kubeconfig).await {
                    Ok(c) => c,
                    Err(e) => return ready.send(Err(e.into())),
                };
                ready.send(Ok(()));
                // Ports close as the runtime goes; the pool's interface
                // goes with `run`.
                run(client, pool, stop).await;
            },
        )?;
        Ok(LoadBalancer {
            _background: background,
            interface,
            network,
        })
    }

    /// The /24 addresses are given from, as `10.212.X.0/24`.
    pub fn network(&self) -> &str {
        &self.network
    }

    /// The machine's interface the given-out addresses are on.
    pub fn interface(&self) -> &str {
        &self.interface
    }
}

/// The address `status.loadBalancer.ingress[0].ip` of Service `name` gives,
/// once it gives one.
///
/// # Panics
/// After `timeout`.
pub async fn wait_for_ingress(services: &Api<Service>, name: &str, timeout: Duration) -> Ipv4Addr {
    crate::wait::wait_for(
        &format!("Service {name} to get a load-balancer address"),
        timeout,
        async || {
            let svc = services.get_opt(name).await.ok().flatten()?;
            ingress_ips(&svc).first()?.parse().ok()
        },
    )
    .await
}

/// `status.loadBalancer.ingress[*].ip`.
pub fn ingress_ips(svc: &Service) -> Vec<String> {
    svc.status
        .iter()
        .flat_map(|s| s.load_balancer.iter())
        .flat_map(|lb| lb.ingress.iter().flatten())
        .filter_map(|i| i.ip.clone())
        .collect()
}

/// One Service port this load balancer listens on: number and name.
type Port = (u16, String);

/// The TCP ports of a Service this load balancer serves: one of type
/// LoadBalancer, of no other load balancer's class, not being deleted.
fn served_ports(svc: &Service) -> Option<Vec<Port>> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() != Some("LoadBalancer")
        || spec.load_balancer_class.is_some()
        || svc.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    Some(
        spec.ports
            .iter()
            .flatten()
            .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
            .filter_map(|p| {
                Some((
                    u16::try_from(p.port).ok()?,
                    p.name.clone().unwrap_or_default(),
                ))
            })
            .collect(),
    )
}

/// A Service that has an address: where it is, and a task per open port.
struct Assigned {
    namespace: String,
    name: String,
    ip: Ipv4Addr,
    listeners: BTreeMap<Port, tokio::task::JoinHandle<()>>,
}

impl Drop for Assigned {
    fn drop(&mut self) {
        for task in self.listeners.values() {
            task.abort();
        }
    }
}

struct Balancer {
    client: Client,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    pool: Pool,
    /// By Service UID, so a Service deleted and made again is a new one.
    assigned: HashMap<String, Assigned>,
}

async fn run(client: Client, pool: Pool, mut stop: watch::Receiver<bool>) {
    let (services, services_writer) = reflector::store();
    let (slices, slices_writer) = reflector::store();
    let changed = Arc::new(Notify::new());
    let watch_services = {
        let api: Api<Service> = Api::all(client.clone());
        let changed = changed.clone();
        tokio::spawn(async move {
            let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
            let mut stream = reflector::reflector(services_writer, stream).boxed();
            while stream.next().await.is_some() {
                changed.notify_one();
            }
        })
    };
    let watch_slices = {
        let api: Api<EndpointSlice> = Api::all(client.clone());
        tokio::spawn(async move {
            let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
            let mut stream = reflector::reflector(slices_writer, stream).boxed();
            while stream.next().await.is_some() {}
        })
    };
    let mut balancer = Balancer {
        client,
        services,
        slices,
        pool,
        assigned: HashMap::new(),
    };
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = tokio::time::timeout(RESYNC, changed.notified()) => {}
        }
        balancer.pass().await;
    }
    watch_services.abort();
    watch_slices.abort();
    // Ports close as `assigned` goes; the pool's interface goes after.
    balancer.assigned.clear();
}

impl Balancer {
    /// Bring addresses, ports and statuses in line with the Services.
    async fn pass(&mut self) {
        let services = self.services.state();
        let served: HashMap<String, (&Service, Vec<Port>)> = services
            .iter()
            .filter_map(|svc| Some((svc.uid()?, (svc.as_ref(), served_ports(svc)?))))
            .collect();
        let gone: Vec<String> = self
            .assigned
            .keys()
            .filter(|uid| !served.contains_key(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(assigned) = self.assigned.remove(&uid) {
                tracing::info!(service = %format!("{}/{}", assigned.namespace, assigned.name), ip = %assigned.ip, "load-balancer address released");
                self.pool.release(assigned.ip);
            }
        }
        // A Service that stopped being ours keeps no address of ours in its
        // status (no other load balancer gives addresses of this pool).
        for svc in services.iter().filter(|s| served_ports(s).is_none()) {
            if ingress_ips(svc)
                .iter()
                .any(|ip| ip.parse().is_ok_and(|ip| self.pool.contains(ip)))
            {
                self.write_status(svc, None).await;
            }
        }
        for (uid, (svc, ports)) in served {
            // `spec.loadBalancerIP`, as MetalLB honours it: that address or
            // none, and a changed request moves the Service.
            let requested: Option<Ipv4Addr> = svc
                .spec
                .as_ref()
                .and_then(|s| s.load_balancer_ip.as_deref())
                .filter(|ip| !ip.is_empty())
                .and_then(|ip| ip.parse().ok());
            if requested.is_some_and(|r| self.assigned.get(&uid).is_some_and(|a| a.ip != r))
                && let Some(moved) = self.assigned.remove(&uid)
            {
                self.pool.release(moved.ip);
            }
            if !self.assigned.contains_key(&uid) {
                let wanted = ingress_ips(svc).first().and_then(|ip| ip.parse().ok());
                let taken = match requested {
                    Some(r) => self.pool.take_exact(r),
                    None => self.pool.take(wanted),
                };
                match taken {
                    Ok(ip) => {
                        tracing::info!(service = %format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any()), %ip, "load-balancer address given");
                        self.assigned.insert(
                            uid.clone(),
                            Assigned {
                                namespace: svc.namespace().unwrap_or_default(),
                                name: svc.name_any(),
                                ip,
                                listeners: BTreeMap::new(),
                            },
                        );
                    }
                    Err(e) => {
                        tracing::warn!(service = %svc.name_any(), error = %e, "no load-balancer address");
                        if !ingress_ips(svc).is_empty() {
                            self.write_status(svc, None).await;
                        }
                        continue;
                    }
                }
            }
            let Some(assigned) = self.assigned.get_mut(&uid) else {
                continue;
            };
            sync_listeners(assigned, &ports, &self.slices).await;
            let ip = assigned.ip;
            if ingress_ips(svc) != [ip.to_string()] {
                self.write_status(svc, Some(ip)).await;
            }
        }
    }

    /// Sets (or with `None` clears) the Service's load-balancer ingress.
    async fn write_status(&self, svc: &Service, ip: Option<Ipv4Addr>) {
        let api: Api<Service> =
            Api::namespaced(self.client.clone(), &svc.namespace().unwrap_or_default());
        let ingress = ip.map(|ip| serde_json::json!([{"ip": ip.to_string(), "ipMode": "VIP"}]));
        let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": ingress}}});
        if let Err(e) = api
            .patch_status(
                &svc.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            tracing::debug!(service = %svc.name_any(), error = %e, "load-balancer status not written");
        }
    }
}

/// Opens the ports `ports` asks for and closes the others.
async fn sync_listeners(assigned: &mut Assigned, ports: &[Port], slices: &Store<EndpointSlice>) {
    assigned.listeners.retain(|port, task| {
        let keep = ports.contains(port) && !task.is_finished();
        if !keep {
            task.abort();
        }
        keep
    });
    for port in ports {
        if assigned.listeners.contains_key(port) {
            continue;
        }
        match TcpListener::bind((assigned.ip, port.0)).await {
            Ok(listener) => {
                let task = tokio::spawn(listen(
                    listener,
                    slices.clone(),
                    assigned.namespace.clone(),
                    assigned.name.clone(),
                    port.1.clone(),
                ));
                assigned.listeners.insert(port.clone(), task);
            }
            Err(e) => tracing::warn!(ip = %assigned.ip, port = port.0, error = %e, "cannot listen"),
        }
    }
}

/// Accepts connections and forwards each to the next ready endpoint.
async fn listen(
    listener: TcpListener,
    slices: Store<EndpointSlice>,
    namespace: String,
    service: String,
    port_name: String,
) {
    let mut turn = 0usize;
    loop {
        let inbound = match listener.accept().await {
            Ok((inbound, _)) => inbound,
            Err(_) => {
                // Out of descriptors, say: wait rather than spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let state = slices.state();
        let targets = backends::ready(
            state.iter().map(|s| s.as_ref()),
            &namespace,
            &service,
            &port_name,
        );
        tokio::spawn(backends::forward(inbound, targets, turn));
        turn = turn.wrapping_add(1);
    }
}
