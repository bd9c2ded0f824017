//! Routes from this machine to the Pods of a real meta-cluster (SSH test
//! hosts made nodes, see [`crate::kube_env::RealNodes`]), as the CNI of a
//! control-plane node would give it: the meta-cluster's control plane runs
//! here as processes, and its API server reaches admission webhooks and
//! aggregated APIs at their Pods' addresses (`--enable-aggregator-routing`),
//! each Node's Pod CIDR routed to the Node's address on the hosts' bridge.
//!
//! Every real meta-cluster of this machine uses [`POD_CIDR`], so they run
//! one at a time: [`PodRoutes::claim`] waits for the one before to end, and
//! removes what a killed one left.

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use crate::sys::FileLock;

/// The meta-cluster's Pod network: apart from the test hosts' (10.213/16),
/// the load balancer's (10.212/16), the Pod runners' (10.214-10.237) and
/// the business clusters' defaults (10.244/16, 10.96/12).
pub const POD_CIDR: &str = "10.238.0.0/16";

const LOCK: &str = "/run/kok-testenv-meta-pod-network.lock";

/// This machine's routes to the Pod CIDRs of a meta-cluster's Nodes;
/// removed when dropped.
pub struct PodRoutes {
    routes: Mutex<BTreeMap<String, IpAddr>>,
    _lock: FileLock,
}

impl PodRoutes {
    /// Holds the Pod network (waiting while another meta-cluster of this
    /// machine has it) and clears routes into it a killed run left.
    pub fn claim() -> io::Result<PodRoutes> {
        let lock = FileLock::acquire(Path::new(LOCK))?;
        // Nothing else routes into this network: a route there is a
        // leftover.
        let _ = ip(&["route", "flush", "root", POD_CIDR]);
        Ok(PodRoutes {
            routes: Mutex::new(BTreeMap::new()),
            _lock: lock,
        })
    }

    /// Routes `pod_cidr` (a Node's `spec.podCIDR`, inside [`POD_CIDR`]) to
    /// `node` (its address on the hosts' bridge). Again for the same CIDR
    /// replaces the route.
    pub fn route(&self, pod_cidr: &str, node: IpAddr) -> io::Result<()> {
        ip(&["route", "replace", pod_cidr, "via", &node.to_string()])?;
        self.routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pod_cidr.to_string(), node);
        Ok(())
    }
}

impl Drop for PodRoutes {
    fn drop(&mut self) {
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        for (cidr, node) in routes.iter() {
            let _ = ip(&["route", "del", cidr, "via", &node.to_string()]);
        }
    }
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
