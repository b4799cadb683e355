//! Delay and reordering without `netem`: a packet filter rule hands the faulty host's
//! packets to a netfilter queue, and a thread of this process that entered the host's
//! network namespace holds each one for its delay before letting it go. With jitter,
//! packets overtake each other: reordering.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nfq::{Message, Queue, Verdict};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The most packets held at once; beyond it a packet goes at once (the fault fails open
/// rather than drop what it was asked to delay).
const MAX_HELD: usize = 65_536;
/// The kernel's bound on packets waiting for this process.
const KERNEL_QUEUE: u32 = 16_384;
/// How long the thread sleeps when no packet is waiting and none is due.
const IDLE: Duration = Duration::from_millis(1);

/// A queue's thread, holding packets until [`Delayer::stop`].
#[derive(Debug)]
pub(crate) struct Delayer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
}

/// A held packet, ordered by when it is due (then by arrival).
struct Held {
    due: Instant,
    arrival: u64,
    message: Message,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.arrival) == (other.due, other.arrival)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.arrival).cmp(&(other.due, other.arrival))
    }
}

impl Delayer {
    /// Binds netfilter queue `queue` in network namespace `namespace` and holds each packet
    /// for `delay` plus up to `jitter` (seeded by `seed`). Returns once the queue is bound,
    /// so the rule that feeds it can go in.
    pub(crate) fn start(
        namespace: &str,
        queue: u16,
        delay: Duration,
        jitter: Duration,
        seed: u64,
    ) -> anyhow::Result<Delayer> {
        let path = format!("/run/netns/{namespace}");
        let host = std::fs::File::open(&path).with_context(|| format!("cannot open {path}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, bound) = std::sync::mpsc::channel();
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("chaos-delay-{queue}"))
            .spawn(move || -> anyhow::Result<()> {
                // This thread alone enters the host: the queue is the host's.
                let opened = nix::sched::setns(&host, nix::sched::CloneFlags::CLONE_NEWNET)
                    .context("cannot enter the host's network namespace")
                    .and_then(|()| open(queue));
                let mut nf = match opened {
                    Ok(nf) => {
                        let _ = ready.send(Ok(()));
                        nf
                    }
                    Err(error) => {
                        let _ = ready.send(Err(format!("{error:#}")));
                        return Err(error);
                    }
                };
                hold(
                    &mut nf,
                    &stopping,
                    delay,
                    jitter,
                    StdRng::seed_from_u64(seed),
                )
            })
            .context("cannot start a delaying thread")?;
        match bound.recv() {
            Ok(Ok(())) => Ok(Delayer {
                stop,
                thread: Some(thread),
            }),
            Ok(Err(why)) => bail!("the netfilter queue could not be bound: {why}"),
            Err(_) => bail!("the delaying thread ended before binding its queue"),
        }
    }

    /// Lets every held packet go and ends the thread. Call it after the rule feeding the
    /// queue is gone.
    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Release);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => bail!("the delaying thread panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for Delayer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn open(queue: u16) -> anyhow::Result<Queue> {
    let mut nf = Queue::open().context("cannot open a netfilter queue socket")?;
    nf.bind(queue).context("cannot bind the netfilter queue")?;
    nf.set_queue_max_len(queue, KERNEL_QUEUE)?;
    // A queue that overflows lets packets through instead of dropping them.
    nf.set_fail_open(queue, true)?;
    nf.set_nonblocking(true);
    Ok(nf)
}

fn hold(
    nf: &mut Queue,
    stop: &AtomicBool,
    delay: Duration,
    jitter: Duration,
    mut rng: StdRng,
) -> anyhow::Result<()> {
    let mut held: BinaryHeap<Reverse<Held>> = BinaryHeap::new();
    let mut arrivals = 0u64;
    let jitter_us = u64::try_from(jitter.as_micros()).unwrap_or(u64::MAX);
    while !stop.load(Ordering::Acquire) {
        let mut idle = true;
        match nf.recv() {
            Ok(mut message) => {
                idle = false;
                if held.len() >= MAX_HELD {
                    message.set_verdict(Verdict::Accept);
                    nf.verdict(message)?;
                } else {
                    let extra = Duration::from_micros(rng.random_range(0..=jitter_us));
                    arrivals += 1;
                    held.push(Reverse(Held {
                        due: Instant::now() + delay + extra,
                        arrival: arrivals,
                        message,
                    }));
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error).context("the netfilter queue failed"),
        }
        let now = Instant::now();
        while held.peek().is_some_and(|Reverse(next)| next.due <= now) {
            if let Some(Reverse(due)) = held.pop() {
                idle = false;
                release(nf, due.message)?;
            }
        }
        if idle {
            std::thread::sleep(IDLE);
        }
    }
    // The rule feeding the queue is gone: what is still queued in the kernel goes too,
    // then what is held.
    loop {
        match nf.recv() {
            Ok(message) => release(nf, message)?,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(error) => return Err(error).context("the netfilter queue failed"),
        }
    }
    while let Some(Reverse(packet)) = held.pop() {
        release(nf, packet.message)?;
    }
    Ok(())
}

fn release(nf: &mut Queue, mut message: Message) -> anyhow::Result<()> {
    message.set_verdict(Verdict::Accept);
    nf.verdict(message).context("a verdict was refused")
}
