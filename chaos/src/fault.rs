//! The faults, and how each is made real on a [`Network`]: packet filters (iptables) in
//! the faulty host's namespace for the network ones, packets held in user space for delay
//! and reordering (this kernel has no `netem`; see `delay`), and signals to every process
//! of the host for a pause.

use std::fmt;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use crate::delay::Delayer;
use crate::net::{Host, Network, pids_in, run};

/// The name that stands for the harness (the callers outside the cluster) among a
/// fault's peers.
pub const HARNESS: &str = "harness";

/// What goes wrong on one host while a fault lasts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// No packet passes between `host` and `peers`, either way.
    Partition { host: String, peers: Vec<String> },
    /// `host`'s packets to `peers` are lost; theirs to it arrive.
    OneWay { host: String, peers: Vec<String> },
    /// `percent` of the packets between `host` and `peers` are lost, each way.
    Loss {
        host: String,
        peers: Vec<String>,
        percent: u8,
    },
    /// Every packet `host` sends `peers` arrives twice.
    Duplicate { host: String, peers: Vec<String> },
    /// Every packet `host` sends `peers` leaves `delay_ms` late, plus up to `jitter_ms`:
    /// with jitter, packets overtake each other.
    Delay {
        host: String,
        peers: Vec<String>,
        delay_ms: u64,
        jitter_ms: u64,
    },
    /// Every process of `host` is stopped (SIGSTOP) until the fault heals: a pause longer
    /// than a lease, as a long garbage collection or a frozen VM makes.
    Pause { host: String },
}

impl Fault {
    /// The host it happens on.
    pub fn host(&self) -> &str {
        match self {
            Fault::Partition { host, .. }
            | Fault::OneWay { host, .. }
            | Fault::Loss { host, .. }
            | Fault::Duplicate { host, .. }
            | Fault::Delay { host, .. }
            | Fault::Pause { host } => host,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Partition { host, peers } => {
                write!(f, "{host} cut off from {}", peers.join(", "))
            }
            Fault::OneWay { host, peers } => {
                write!(f, "{host}'s packets to {} lost", peers.join(", "))
            }
            Fault::Loss {
                host,
                peers,
                percent,
            } => write!(
                f,
                "{percent}% of packets between {host} and {} lost",
                peers.join(", ")
            ),
            Fault::Duplicate { host, peers } => {
                write!(f, "{host}'s packets to {} duplicated", peers.join(", "))
            }
            Fault::Delay {
                host,
                peers,
                delay_ms,
                jitter_ms,
            } => {
                write!(f, "{host}'s packets to {} {delay_ms}", peers.join(", "))?;
                match jitter_ms {
                    0 => f.write_str(" ms late"),
                    jitter => write!(f, " to {} ms late, reordered", delay_ms + jitter),
                }
            }
            Fault::Pause { host } => write!(f, "{host} paused"),
        }
    }
}

/// A fault in force; [`Active::heal`] ends it.
#[derive(Debug)]
pub struct Active {
    host: Host,
    /// The rules put in force, each as inserted: healing deletes exactly these, and the
    /// host's NetworkPolicy rules after them stay.
    rules: Vec<Vec<String>>,
    /// What else holds the host, undone after its rules are gone.
    holding: Holding,
}

#[derive(Debug)]
enum Holding {
    Nothing,
    /// The thread that holds the packets the rules queue.
    Packets(Delayer),
    /// The host's processes, stopped.
    Processes,
}

/// Puts `fault` in force on `network`.
///
/// # Errors
///
/// When a host is unknown, or `iptables` or `kill` fails; what was put in force by then
/// is healed.
pub fn apply(network: &Network, fault: &Fault) -> anyhow::Result<Active> {
    let host = network.host(fault.host())?.clone();
    let addresses = |peers: &[String]| -> anyhow::Result<Vec<String>> {
        peers
            .iter()
            .map(|peer| {
                if peer == HARNESS {
                    Ok(network.gateway().to_string())
                } else {
                    network.host(peer).map(|h| h.address.to_string())
                }
            })
            .collect()
    };
    let mut rules: Vec<Vec<String>> = Vec::new();
    let holding = match fault {
        Fault::Partition { peers, .. } => {
            for address in addresses(peers)? {
                rules.push(drop_rule("OUTPUT", "-d", &address, None));
                rules.push(drop_rule("INPUT", "-s", &address, None));
            }
            Holding::Nothing
        }
        Fault::OneWay { peers, .. } => {
            for address in addresses(peers)? {
                rules.push(drop_rule("OUTPUT", "-d", &address, None));
            }
            Holding::Nothing
        }
        Fault::Loss { peers, percent, .. } => {
            let share = f64::from(*percent) / 100.0;
            for address in addresses(peers)? {
                rules.push(drop_rule("OUTPUT", "-d", &address, Some(share)));
                rules.push(drop_rule("INPUT", "-s", &address, Some(share)));
            }
            Holding::Nothing
        }
        Fault::Duplicate { peers, .. } => {
            for address in addresses(peers)? {
                rules.push(
                    [
                        "-t",
                        "mangle",
                        "POSTROUTING",
                        "-d",
                        &address,
                        "-j",
                        "TEE",
                        "--gateway",
                        &address,
                    ]
                    .map(str::to_owned)
                    .to_vec(),
                );
            }
            Holding::Nothing
        }
        Fault::Pause { .. } => {
            signal(&host, "STOP")?;
            Holding::Processes
        }
        Fault::Delay {
            peers,
            delay_ms,
            jitter_ms,
            ..
        } => {
            let queue = DELAY_QUEUE.to_string();
            for address in addresses(peers)? {
                rules.push(
                    [
                        "OUTPUT",
                        "-d",
                        &address,
                        "-j",
                        "NFQUEUE",
                        "--queue-num",
                        &queue,
                    ]
                    .map(str::to_owned)
                    .to_vec(),
                );
            }
            // Bound before the rules feed it: a queue nobody reads drops what it gets.
            let delayer = Delayer::start(
                &host.namespace,
                DELAY_QUEUE,
                Duration::from_millis(*delay_ms),
                Duration::from_millis(*jitter_ms),
                *delay_ms ^ jitter_ms.rotate_left(32),
            )?;
            Holding::Packets(delayer)
        }
    };
    let mut applied: Vec<Vec<String>> = Vec::with_capacity(rules.len());
    for rule in rules {
        if let Err(error) = change(&host, "-I", &rule) {
            for rule in &applied {
                let _ = change(&host, "-D", rule);
            }
            return Err(error);
        }
        applied.push(rule);
    }
    Ok(Active {
        host,
        rules: applied,
        holding,
    })
}

/// The netfilter queue a delay uses (one fault is in force at a time).
const DELAY_QUEUE: u16 = 7;

impl Active {
    /// Ends the fault: its filters deleted, its held packets let go, the host's processes
    /// continued.
    ///
    /// # Errors
    ///
    /// When `iptables` or `kill` fails.
    pub async fn heal(self) -> anyhow::Result<()> {
        for rule in &self.rules {
            change(&self.host, "-D", rule)?;
        }
        match self.holding {
            Holding::Nothing => {}
            // Joins a thread that lets the held packets go: off the runtime's threads.
            Holding::Packets(delayer) => {
                tokio::task::spawn_blocking(move || delayer.stop()).await??;
            }
            Holding::Processes => signal(&self.host, "CONT")?,
        }
        Ok(())
    }
}

/// An `iptables` rule (without its command) dropping packets of `chain` to or from
/// `address`; a share of them when `share` is given.
fn drop_rule(chain: &str, direction: &str, address: &str, share: Option<f64>) -> Vec<String> {
    let mut rule = vec![chain, direction, address]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    if let Some(share) = share {
        rule.extend(
            [
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &format!("{share:.3}"),
            ]
            .map(str::to_owned),
        );
    }
    rule.extend(["-j", "DROP"].map(str::to_owned));
    rule
}

/// Inserts (`-I`: before the host's NetworkPolicy rules) or deletes (`-D`) `rule`, whose
/// table, if not the filter one, comes first (`-t mangle CHAIN ...`).
fn change(host: &Host, command: &str, rule: &[String]) -> anyhow::Result<()> {
    let mut args: Vec<&str> = Vec::with_capacity(rule.len() + 1);
    let rest = match rule {
        [flag, table, rest @ ..] if flag == "-t" => {
            args.extend([flag.as_str(), table.as_str()]);
            rest
        }
        rest => rest,
    };
    args.push(command);
    args.extend(rest.iter().map(String::as_str));
    iptables(host, &args)
}

/// Runs `iptables ARGS` on `host`.
pub(crate) fn iptables(host: &Host, args: &[&str]) -> anyhow::Result<()> {
    let mut command = vec!["netns", "exec", host.namespace.as_str(), "iptables", "-w"];
    command.extend_from_slice(args);
    run("ip", &command).map(drop)
}

/// Sends SIGSTOP or SIGCONT (`signal`) to every process of `host`.
fn signal(host: &Host, signal: &str) -> anyhow::Result<()> {
    send(&host.namespace, signal)
        .with_context(|| format!("cannot send SIG{signal} to {}", host.name))
}

fn send(namespace: &str, signal: &str) -> anyhow::Result<()> {
    let pids = pids_in(namespace)?;
    if pids.is_empty() {
        return Ok(());
    }
    let mut args = vec![format!("-{signal}")];
    args.extend(pids.iter().map(ToString::to_string));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run("kill", &args).map(drop)
}
