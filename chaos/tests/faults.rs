//! The faults, each made real on a host of its own and seen from outside it: a partition
//! stops a connection and healing lets it through again; a delay makes every answer at
//! least that late, and healing takes it away. Needs root, iproute2, iptables and
//! python3 (the echo server on the host); skips without them unless
//! `AGENTLOOP_REQUIRE_NETNS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agentloop_chaos::fault::{self, Fault, HARNESS};
use agentloop_chaos::net::Network;

const PORT: u16 = 7007;

/// A one-line echo server on `namespace`, port [`PORT`].
fn echo_server(namespace: &str) -> Child {
    let program = "import socket\n\
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
        s.bind(('0.0.0.0', 7007)); s.listen(16)\n\
        while True:\n    c, _ = s.accept(); c.sendall(c.recv(64)); c.close()\n";
    Command::new("ip")
        .args(["netns", "exec", namespace, "python3", "-c", program])
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

/// One exchange with the echo server: how long it took, or `None` when it did not
/// happen within `within`.
fn round_trip(address: SocketAddr, within: Duration) -> Option<Duration> {
    let began = Instant::now();
    let mut stream = TcpStream::connect_timeout(&address, within).ok()?;
    stream.set_read_timeout(Some(within)).ok()?;
    stream.write_all(b"ping").ok()?;
    let mut reply = [0u8; 4];
    stream.read_exact(&mut reply).ok()?;
    (&reply == b"ping").then(|| began.elapsed())
}

#[tokio::test]
async fn partitions_and_delays_take_effect_and_heal() {
    if !agentloop_chaos::runs_here("faults") {
        return;
    }
    let network = Network::create(&["echo"]).unwrap();
    let host = network.host("echo").unwrap().clone();
    let mut server = echo_server(&host.namespace);
    let address = SocketAddr::from((host.address, PORT));
    // The server's start, a bounded wait: it answers within 10 s or the test fails.
    let began = Instant::now();
    while round_trip(address, Duration::from_secs(1)).is_none() {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the echo server never answered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let cut = fault::apply(
        &network,
        &Fault::Partition {
            host: "echo".into(),
            peers: vec![HARNESS.into()],
        },
    )
    .unwrap();
    assert_eq!(
        round_trip(address, Duration::from_millis(500)),
        None,
        "cut off"
    );
    cut.heal().await.unwrap();
    assert!(
        round_trip(address, Duration::from_secs(5)).is_some(),
        "healed"
    );

    let late = fault::apply(
        &network,
        &Fault::Delay {
            host: "echo".into(),
            peers: vec![HARNESS.into()],
            delay_ms: 200,
            jitter_ms: 0,
        },
    )
    .unwrap();
    // Connecting waits for the host's SYN-ACK, the answer for its data: each is late.
    let slow = round_trip(address, Duration::from_secs(5)).expect("a late answer");
    assert!(slow >= Duration::from_millis(400), "{slow:?}");
    late.heal().await.unwrap();
    let healed = round_trip(address, Duration::from_secs(5)).expect("an answer");
    assert!(healed < Duration::from_millis(200), "{healed:?}");

    server.kill().unwrap();
    server.wait().unwrap();
}
