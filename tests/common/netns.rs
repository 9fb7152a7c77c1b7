//! A private network for etcd members, so that one can be cut off for real: a bridge on this
//! machine (the test process's side at `.1`) and a network namespace per member, joined to the
//! bridge by a veth pair. A partition drops every packet on the member's side of its link, in
//! both directions: its peers and clients see silence, as behind a failed switch port. Needs
//! root (`ip netns`, `iptables`).

use std::process::Command;

/// The bridge and the namespaces' prefix; one such network exists at a time (a new one removes
/// what a killed test left).
const NAME: &str = "plsafe";

/// The network's /24.
const SUBNET: &str = "10.79.0";

/// A bridge with a namespace per member; removed on drop.
pub struct MemberNet {
    members: usize,
}

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

fn must(args: &[&str]) {
    run(args).unwrap_or_else(|e| panic!("member network (needs root): {e}"));
}

impl MemberNet {
    /// Makes the bridge and `members` namespaces, each with its address.
    pub fn create(members: usize) -> Self {
        remove(8);
        let bridge_ip = format!("{SUBNET}.1/24");
        must(&["ip", "link", "add", NAME, "type", "bridge"]);
        must(&["ip", "addr", "add", &bridge_ip, "dev", NAME]);
        must(&["ip", "link", "set", NAME, "up"]);
        // With br_netfilter loaded (a kubelet loads it), bridged packets meet FORWARD's rules.
        must(&[
            "iptables", "-I", "FORWARD", "-i", NAME, "-o", NAME, "-j", "ACCEPT",
        ]);
        let net = MemberNet { members };
        for i in 0..members {
            let (ns, host, peer) = (net.namespace(i), format!("{NAME}h{i}"), format!("{NAME}p{i}"));
            let addr = format!("{}/24", net.ip(i));
            must(&["ip", "netns", "add", &ns]);
            must(&["ip", "link", "add", &host, "type", "veth", "peer", "name", &peer]);
            must(&["ip", "link", "set", &peer, "netns", &ns]);
            must(&["ip", "link", "set", &host, "master", NAME, "up"]);
            let inside = ["ip", "netns", "exec", &ns];
            must(&[&inside[..], &["ip", "link", "set", "lo", "up"]].concat());
            must(&[&inside[..], &["ip", "link", "set", &peer, "name", "eth0"]].concat());
            must(&[&inside[..], &["ip", "addr", "add", &addr, "dev", "eth0"]].concat());
            must(&[&inside[..], &["ip", "link", "set", "eth0", "up"]].concat());
        }
        net
    }

    /// Member `i`'s namespace.
    pub fn namespace(&self, i: usize) -> String {
        format!("{NAME}{i}")
    }

    /// Member `i`'s address.
    pub fn ip(&self, i: usize) -> String {
        format!("{SUBNET}.{}", 10 + i)
    }

    /// Cuts member `i` off: every packet in or out of its link is dropped.
    pub fn cut(&self, i: usize) {
        self.rules(i, "-I");
    }

    /// Joins member `i` again.
    pub fn heal(&self, i: usize) {
        self.rules(i, "-D");
    }

    fn rules(&self, i: usize, op: &str) {
        let ns = self.namespace(i);
        for (chain, dir) in [("INPUT", "-i"), ("OUTPUT", "-o")] {
            must(&[
                "ip", "netns", "exec", &ns, "iptables", op, chain, dir, "eth0", "-j", "DROP",
            ]);
        }
    }
}

/// Removes the bridge, the forward rule and up to `members` namespaces, if they exist.
fn remove(members: usize) {
    for i in 0..members {
        let _ = run(&["ip", "netns", "del", &format!("{NAME}{i}")]);
    }
    let _ = run(&["ip", "link", "del", NAME]);
    while run(&[
        "iptables", "-D", "FORWARD", "-i", NAME, "-o", NAME, "-j", "ACCEPT",
    ])
    .is_ok()
    {}
}

impl Drop for MemberNet {
    fn drop(&mut self) {
        remove(self.members);
    }
}
