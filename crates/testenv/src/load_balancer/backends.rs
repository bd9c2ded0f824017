//! Where a connection to a Service's load-balancer address goes, as
//! kube-proxy decides it: the ready endpoints of the Service's
//! EndpointSlices, on the slice port named like the Service port (the
//! EndpointSlice controller has already turned the `targetPort`, a number or
//! a container port's name, into each endpoint's number), taken in turn.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::net::TcpStream;

/// Label that ties an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// How long one endpoint may take to accept before the next one is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The ready TCP endpoints of `namespace/service`'s port `port_name` (empty
/// for an unnamed port), sorted and without repeats.
pub fn ready<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    namespace: &str,
    service: &str,
    port_name: &str,
) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = slices
        .into_iter()
        .filter(|s| {
            s.metadata.namespace.as_deref() == Some(namespace)
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .map(String::as_str)
                    == Some(service)
                && s.address_type == "IPv4"
        })
        .flat_map(|s| {
            let port = s
                .ports
                .iter()
                .flatten()
                .find(|p| {
                    p.name.as_deref().unwrap_or_default() == port_name
                        && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
                })
                .and_then(|p| p.port)
                .and_then(|p| u16::try_from(p).ok());
            s.endpoints
                .iter()
                // An endpoint whose readiness is unknown counts as ready.
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
                .filter_map(move |e| {
                    let ip = e.addresses.first()?.parse().ok()?;
                    Some(SocketAddr::new(ip, port?))
                })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Connects `inbound` to `backends[turn % len]`, or to the next one that
/// accepts, and copies bytes both ways until both sides close. With no
/// backend the connection is closed at once, as a Service without ready
/// endpoints rejects it.
pub async fn forward(mut inbound: TcpStream, backends: Vec<SocketAddr>, turn: usize) {
    let count = backends.len();
    for i in 0..count {
        let target = backends[(turn + i) % count];
        if let Ok(Ok(mut outbound)) =
            tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await
        {
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(
        service: &str,
        ports: serde_json::Value,
        endpoints: serde_json::Value,
    ) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{service}-x"), "namespace": "ns",
                         "labels": {SERVICE_NAME_LABEL: service}},
            "addressType": "IPv4",
            "ports": ports,
            "endpoints": endpoints,
        }))
        .expect("slice")
    }

    #[test]
    fn ready_endpoints_on_the_port_of_the_same_name() {
        let slices = [
            slice(
                "web",
                json!([{"name": "http", "port": 8080, "protocol": "TCP"},
                       {"name": "metrics", "port": 9090, "protocol": "TCP"}]),
                json!([
                    {"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
                    {"addresses": ["10.0.0.1"]},
                    {"addresses": ["10.0.0.3"], "conditions": {"ready": false}},
                ]),
            ),
            // A second slice of the same Service, repeating an endpoint.
            slice(
                "web",
                json!([{"name": "http", "port": 8080}]),
                json!([{"addresses": ["10.0.0.4"]}, {"addresses": ["10.0.0.2"]}]),
            ),
            slice(
                "other",
                json!([{"name": "http", "port": 1}]),
                json!([{"addresses": ["10.0.0.9"]}]),
            ),
        ];
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            ready(&slices, "ns", "web", "http"),
            vec![
                addr("10.0.0.1:8080"),
                addr("10.0.0.2:8080"),
                addr("10.0.0.4:8080")
            ]
        );
        assert_eq!(
            ready(&slices, "ns", "web", "metrics"),
            vec![addr("10.0.0.1:9090"), addr("10.0.0.2:9090")]
        );
        assert!(ready(&slices, "ns", "web", "").is_empty());
        assert!(ready(&slices, "elsewhere", "web", "http").is_empty());
    }

    #[test]
    fn an_unnamed_port_matches_the_unnamed_slice_port() {
        let slices = [slice(
            "one",
            json!([{"port": 6443, "protocol": "TCP"}]),
            json!([{"addresses": ["10.0.0.7"]}]),
        )];
        assert_eq!(
            ready(&slices, "ns", "one", ""),
            vec!["10.0.0.7:6443".parse().unwrap()]
        );
    }
}
