//! Hosts for multi-host tests: network namespaces on a bridge, each with an address of its
//! own, made for one test and removed when it ends (needs root; CI runs as root).

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

/// One test's hosts at a time: two tests' namespaces, bridges and scrapes side by side on one
/// machine were seen to fail (a CI run whose multi-host straggler test, beside the candle
/// engine's multi-host test, found every target refusing connections), so they take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Network namespaces (and a bridge) made for one test, removed on drop.
pub(crate) struct Hosts {
    pub(crate) namespaces: Vec<String>,
    bridge: String,
    subnet: String,
    /// Held until the hosts are removed (dropped after them: fields drop in order).
    _turn: MutexGuard<'static, ()>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    /// `n` namespaces on a bridge in 198.18.S.0/24 (RFC 2544's benchmarking range): the bridge
    /// is .1, namespace r is .(10 + r).
    pub(crate) fn new(n: usize) -> Result<Hosts, String> {
        // Unique per test of this process too: tests run side by side.
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let id = (std::process::id() % 1_000) * 10 + NEXT.fetch_add(1, Ordering::Relaxed) % 10;
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let hosts = Hosts {
            namespaces: (0..n).map(|r| format!("pt{id}h{r}")).collect(),
            bridge: format!("ptbr{id}"),
            subnet: format!("198.18.{}", 1 + id % 250),
            _turn: turn,
        };
        hosts.remove();
        ip(&["link", "add", &hosts.bridge, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}.1/24", hosts.subnet),
            "dev",
            &hosts.bridge,
        ])?;
        ip(&["link", "set", &hosts.bridge, "up"])?;
        for (r, ns) in hosts.namespaces.iter().enumerate() {
            let (outer, inner) = (format!("ptv{id}o{r}"), format!("ptv{id}i{r}"));
            ip(&["netns", "add", ns])?;
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &inner, "netns", ns])?;
            ip(&["link", "set", &outer, "master", &hosts.bridge, "up"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", hosts.addr(r)),
                "dev",
                &inner,
            ])?;
            ip(&["-n", ns, "link", "set", &inner, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }

    pub(crate) fn addr(&self, r: usize) -> String {
        format!("{}.{}", self.subnet, 10 + r)
    }

    fn remove(&self) {
        // Deleting a namespace deletes its veth end, and so the pair.
        for ns in &self.namespaces {
            let _ = ip(&["netns", "del", ns]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.remove();
    }
}

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
