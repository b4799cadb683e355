//! The manifests' NetworkPolicies, enforced on the hosts as a CNI plugin would, and
//! probed against the call graph they are meant to allow.
//!
//! [`enforce`] reads the policies (`deploy/k8s`), and gives every agentloop host they
//! isolate packet filters that admit only what a policy lets in: from the hosts its
//! `podSelector`s match, to its ports, plus replies and the node (this process, standing
//! for the kubelet, whose probes NetworkPolicy does not filter). The whole run then goes
//! through those filters, so a policy that blocked a real call would fail the workload.
//!
//! [`probe`] tries every service from every host and from an outsider, and holds what
//! connects against [`INTENT`]: the call graph as the security documentation states it,
//! written here on its own so it is an oracle, not a copy of the policies.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

use crate::fault::iptables;
use crate::net::{Host, Network};

/// The host that runs nothing of agentloop: a pod of the namespace no policy lets in.
pub const OUTSIDER: &str = "outsider";

/// Who may call each service: (component, port, callers); `None` for anyone.
pub const INTENT: [(&str, u16, Option<&[&str]>); 6] = [
    ("orchestrator", 50051, None),
    ("decision", 50052, Some(&["orchestrator"])),
    ("policy", 50053, Some(&["orchestrator"])),
    ("tools", 50054, Some(&["orchestrator", "policy"])),
    ("ledger", 50055, Some(&["orchestrator"])),
    ("demo-executor", 50061, Some(&["tools"])),
];

/// How long a probe's connection may take before it counts as blocked.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Deserialize)]
struct Manifest {
    kind: String,
    #[serde(default)]
    spec: Option<Spec>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    pod_selector: Selector,
    #[serde(default)]
    policy_types: Vec<String>,
    #[serde(default)]
    ingress: Vec<IngressRule>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Selector {
    #[serde(default)]
    match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct IngressRule {
    from: Option<Vec<Peer>>,
    ports: Option<Vec<Port>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Peer {
    pod_selector: Option<Selector>,
    namespace_selector: Option<Selector>,
}

#[derive(Debug, Deserialize)]
struct Port {
    port: u16,
    #[serde(default)]
    protocol: Option<String>,
}

/// The NetworkPolicies of `files` (multi-document YAML; other kinds are skipped).
fn load(files: &[&Path]) -> anyhow::Result<Vec<Spec>> {
    let mut specs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        for document in serde_norway::Deserializer::from_str(&text) {
            let manifest = Manifest::deserialize(document).with_context(|| {
                format!("{} holds a manifest that does not read", file.display())
            })?;
            if manifest.kind == "NetworkPolicy"
                && let Some(spec) = manifest.spec
            {
                specs.push(spec);
            }
        }
    }
    Ok(specs)
}

/// The component a host runs (`orchestrator-1` runs `orchestrator`); `None` for the hosts
/// that are not agentloop's.
fn component(host: &str) -> Option<&str> {
    let component = host
        .strip_prefix("orchestrator-")
        .map_or(host, |_| "orchestrator");
    INTENT
        .iter()
        .any(|(name, ..)| *name == component)
        .then_some(component)
}

/// The labels of the pod a host stands for (`deploy/k8s/base`'s Deployments).
fn labels(host: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    match component(host) {
        Some(component) => {
            labels.insert("app.kubernetes.io/name".into(), "agentloop".into());
            labels.insert("app.kubernetes.io/component".into(), component.into());
        }
        None => {
            labels.insert("app.kubernetes.io/name".into(), host.into());
        }
    }
    labels
}

fn selects(selector: &Selector, labels: &BTreeMap<String, String>) -> bool {
    selector
        .match_labels
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
}

/// Gives each agentloop host the policies select the filters that admit only what they
/// allow. PostgreSQL and Redis, outside the namespace in production, get none.
///
/// # Errors
///
/// When a manifest cannot be read, or `iptables` fails.
pub fn enforce(network: &Network, files: &[&Path]) -> anyhow::Result<usize> {
    let specs = load(files)?;
    let mut isolated = 0;
    for host in network.hosts().filter(|h| component(&h.name).is_some()) {
        let own = labels(&host.name);
        let selecting: Vec<&Spec> = specs
            .iter()
            .filter(|spec| selects(&spec.pod_selector, &own))
            .filter(|spec| spec.policy_types.iter().any(|t| t == "Ingress"))
            .collect();
        if selecting.is_empty() {
            continue;
        }
        isolated += 1;
        let gateway = network.gateway().to_string();
        let mut rules: Vec<Vec<String>> = vec![
            words("INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"),
            words("INPUT -i lo -j ACCEPT"),
            words(&format!("INPUT -s {gateway} -j ACCEPT")),
        ];
        for rule in selecting.iter().flat_map(|spec| &spec.ingress) {
            let sources: Vec<Option<String>> = match &rule.from {
                None => vec![None],
                Some(peers) => network
                    .hosts()
                    .filter(|peer| {
                        peers.iter().any(|p| {
                            // A namespaceSelector names other namespaces: none of these
                            // hosts.
                            p.namespace_selector.is_none()
                                && p.pod_selector
                                    .as_ref()
                                    .is_some_and(|s| selects(s, &labels(&peer.name)))
                        })
                    })
                    .map(|peer| Some(peer.address.to_string()))
                    .collect(),
            };
            let ports: Vec<Option<u16>> = match &rule.ports {
                None => vec![None],
                Some(ports) => ports
                    .iter()
                    .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
                    .map(|p| Some(p.port))
                    .collect(),
            };
            for source in &sources {
                for port in &ports {
                    let mut rule = words("INPUT -p tcp");
                    if let Some(source) = source {
                        rule.extend(["-s".to_owned(), source.clone()]);
                    }
                    if let Some(port) = port {
                        rule.extend(["--dport".to_owned(), port.to_string()]);
                    }
                    rule.extend(words("-j ACCEPT"));
                    rules.push(rule);
                }
            }
        }
        rules.push(words("INPUT -j DROP"));
        for rule in rules {
            let mut args = vec!["-A"];
            args.extend(rule.iter().map(String::as_str));
            iptables(host, &args)?;
        }
    }
    Ok(isolated)
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_owned).collect()
}

/// What the probes found: how many, and each one that disagrees with [`INTENT`].
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Probed {
    /// Connections tried.
    pub probes: usize,
    /// Of them, the ones the filters stopped.
    pub blocked: usize,
    /// Each connection whose fate disagrees with the intent.
    pub disagreements: Vec<String>,
}

/// Tries every service from every agentloop host and from the outsider.
///
/// # Errors
///
/// When a host is missing or a probe cannot be run.
pub async fn probe(network: &Network) -> anyhow::Result<Probed> {
    let sources: Vec<&Host> = network
        .hosts()
        .filter(|h| component(&h.name).is_some() || h.name == OUTSIDER)
        .collect();
    let mut tries = Vec::new();
    for (target, port, callers) in INTENT {
        let target_host = network
            .hosts()
            .find(|h| component(&h.name) == Some(target))
            .with_context(|| format!("the network has no {target} host"))?;
        for source in &sources {
            if source.name == target_host.name {
                continue;
            }
            let allowed = callers.is_none_or(|callers| {
                component(&source.name).is_some_and(|c| callers.contains(&c))
            });
            let (from, to) = (source.name.clone(), target_host.name.clone());
            let connect = connects(source, target_host, port);
            tries.push(async move { (from, to, port, allowed, connect.await) });
        }
    }
    let results = futures::future::join_all(tries).await;
    let mut probed = Probed::default();
    for (from, to, port, allowed, connected) in results {
        let connected = connected?;
        probed.probes += 1;
        if !connected {
            probed.blocked += 1;
        }
        if connected != allowed {
            probed.disagreements.push(format!(
                "{from} -> {to}:{port} {} though the intent {}",
                if connected { "connects" } else { "is blocked" },
                if allowed { "allows it" } else { "does not" }
            ));
        }
    }
    probed.disagreements.sort();
    Ok(probed)
}

/// Whether a TCP connection from `source` to `target:port` is set up within
/// [`PROBE_TIMEOUT`].
async fn connects(source: &Host, target: &Host, port: u16) -> anyhow::Result<bool> {
    let address = format!("/dev/tcp/{}/{port}", target.address);
    let status = tokio::process::Command::new("ip")
        .args(["netns", "exec", &source.namespace, "timeout"])
        .arg(format!("{}", PROBE_TIMEOUT.as_secs_f64()))
        .args(["bash", "-c", "exec 3<>\"$1\"", "probe", &address])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .context("cannot run a probe")?;
    Ok(status.success())
}
