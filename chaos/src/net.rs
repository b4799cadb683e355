//! Hosts on this machine: one network namespace per process, joined by veth links to a
//! bridge in this namespace, on a /24 of their own. The harness (this process) sits on the
//! bridge too, at `.1`, as the callers outside the cluster do. Everything is removed when
//! the [`Network`] is dropped, the processes still in its namespaces first.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use rand::Rng;

/// One host: a namespace, its address on `eth0`, and the link to the bridge.
#[derive(Debug, Clone)]
pub struct Host {
    /// The process it is for (`orchestrator-0`, `postgres`, ...).
    pub name: String,
    /// Its network namespace: `ip netns exec <namespace> ...` runs a program there.
    pub namespace: String,
    /// Its address.
    pub address: Ipv4Addr,
}

/// The hosts and the bridge between them; torn down when dropped.
#[derive(Debug)]
pub struct Network {
    prefix: String,
    bridge: String,
    /// The harness's own address on the bridge.
    gateway: Ipv4Addr,
    hosts: BTreeMap<String, Host>,
}

impl Network {
    /// Creates a host for each of `names`, all reachable from each other and from here.
    ///
    /// # Errors
    ///
    /// When `ip` fails (not root, no iproute2, no free /24 in 10.213.0.0/16); whatever was
    /// created by then is removed.
    pub fn create(names: &[&str]) -> anyhow::Result<Network> {
        let mut rng = rand::rng();
        let prefix = format!("al{:04x}", rng.random::<u16>());
        let taken = ip(&["-4", "-o", "addr", "show"])?;
        let third = (0..64)
            .map(|_| rng.random::<u8>())
            .find(|third| !taken.contains(&format!("10.213.{third}.")))
            .context("no free /24 in 10.213.0.0/16 for the hosts")?;
        let mut network = Network {
            bridge: format!("{prefix}br"),
            gateway: Ipv4Addr::new(10, 213, third, 1),
            prefix,
            hosts: BTreeMap::new(),
        };
        ip(&["link", "add", &network.bridge, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", network.gateway),
            "dev",
            &network.bridge,
        ])?;
        ip(&["link", "set", &network.bridge, "up"])?;
        for (index, name) in names.iter().enumerate() {
            let number = u8::try_from(index + 2)
                .ok()
                .filter(|n| *n < 255)
                .context("too many hosts for a /24")?;
            let host = Host {
                name: (*name).to_owned(),
                namespace: format!("{}-{name}", network.prefix),
                address: Ipv4Addr::new(10, 213, third, number),
            };
            network.add(&host, index)?;
            network.hosts.insert(host.name.clone(), host);
        }
        Ok(network)
    }

    fn add(&self, host: &Host, index: usize) -> anyhow::Result<()> {
        let link = format!("{}v{index}", self.prefix);
        ip(&["netns", "add", &host.namespace])?;
        ip(&[
            "link",
            "add",
            &link,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &host.namespace,
        ])?;
        ip(&["link", "set", &link, "master", &self.bridge, "up"])?;
        let ns = ["-n", host.namespace.as_str()];
        ip(&[
            &ns[..],
            &[
                "addr",
                "add",
                &format!("{}/24", host.address),
                "dev",
                "eth0",
            ],
        ]
        .concat())?;
        ip(&[&ns[..], &["link", "set", "eth0", "up"]].concat())?;
        ip(&[&ns[..], &["link", "set", "lo", "up"]].concat())?;
        Ok(())
    }

    /// The namespaces' common prefix: `deploy/local/cluster --netns` takes it.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// This process's address on the bridge: where the cluster sees its callers from.
    pub fn gateway(&self) -> Ipv4Addr {
        self.gateway
    }

    /// The host of process `name`.
    ///
    /// # Errors
    ///
    /// When the network has no such host.
    pub fn host(&self, name: &str) -> anyhow::Result<&Host> {
        self.hosts
            .get(name)
            .with_context(|| format!("the network has no host {name}"))
    }

    /// Every host.
    pub fn hosts(&self) -> impl Iterator<Item = &Host> {
        self.hosts.values()
    }

    /// The processes running on `host`.
    ///
    /// # Errors
    ///
    /// When `ip netns pids` fails.
    pub fn pids(&self, host: &Host) -> anyhow::Result<Vec<u32>> {
        pids_in(&host.namespace)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for host in self.hosts.values() {
            if let Ok(pids) = self.pids(host) {
                // Stopped ones too: a SIGKILL ends a stopped process.
                for pid in pids {
                    let _ = Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .stderr(Stdio::null())
                        .status();
                }
            }
            let _ = ip(&["netns", "del", &host.namespace]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// The processes running in network namespace `namespace`.
pub(crate) fn pids_in(namespace: &str) -> anyhow::Result<Vec<u32>> {
    Ok(ip(&["netns", "pids", namespace])?
        .split_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .collect())
}

/// Runs `ip ARGS`; its standard output, or an error with what it printed.
pub(crate) fn ip(args: &[&str]) -> anyhow::Result<String> {
    run("ip", args)
}

/// Runs `program ARGS` to the end; its standard output, or an error naming the command.
pub(crate) fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    if !output.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
