//! Re-reading the web configuration file when it changed, so that certificates and passwords
//! rotate without a restart (the exporter-toolkit re-reads its file per request).
//!
//! ```text
//! each new connection (before the TLS handshake) and each request (before basic auth)
//!   ─► stat the file and each file it named (cert_file, key_file, client_ca_file)
//!        unchanged ─► the current configuration (no parsing, bcrypt results stay cached)
//!        changed   ─► read and check everything again, as at start
//!                       ok     ─► new handshakes and requests use it; one line on stderr
//!                       failed ─► the last good configuration stays; one warning on stderr
//!   both counted in phasetrace.prometheus.web_config.reloads{result="ok"|"failed"};
//!   phasetrace.prometheus.web_config.last_reload_successful: 1 after ok (and at start), 0 after failed
//! ```
//!
//! Whether a file changed: [`super::watched`].
//!
//! The listener's kind is fixed at start, as in the exporter-toolkit: a file that gains
//! `tls_server_config` while the endpoint serves plain HTTP, or loses it while it serves TLS, is
//! a failed reload (the warning says to restart); certificates, client CA and client
//! certificate policy, TLS versions and users may all change. Connections already open keep
//! the certificate they were handshaken with; their next request is checked against the
//! current users.

use super::watched::Files;
use super::web_config::{self, WebConfig, WebConfigError};
use crate::names::{Outcome, env, metric};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Reloads counted by result, for `phasetrace.prometheus.web_config.reloads`, and how the last
/// one ended, for `phasetrace.prometheus.web_config.last_reload_successful`.
#[derive(Debug, Default)]
pub(crate) struct ReloadCounts {
    counts: [AtomicU64; Outcome::ALL.len()],
    /// The last reload failed: the configuration in force is not the one on disk. `false` at
    /// start (the file read at start is the one in force).
    last_failed: AtomicBool,
}

impl ReloadCounts {
    pub(crate) fn get(&self, r: Outcome) -> u64 {
        self.counts[r as usize].load(Ordering::Relaxed)
    }

    /// Whether the configuration in force is the file as last read: true at start and after a
    /// reload that worked, false after one that failed.
    pub(crate) fn last_successful(&self) -> bool {
        !self.last_failed.load(Ordering::Relaxed)
    }

    fn add(&self, r: Outcome) {
        self.counts[r as usize].fetch_add(1, Ordering::Relaxed);
        self.last_failed
            .store(r == Outcome::Failed, Ordering::Relaxed);
    }
}

/// The web configuration of a running endpoint: the last good one, re-read when its files
/// changed.
pub(crate) struct LiveWebConfig {
    file: PathBuf,
    /// Whether the endpoint serves TLS: fixed at start.
    tls: bool,
    state: Mutex<State>,
    counts: Arc<ReloadCounts>,
}

struct State {
    current: Arc<WebConfig>,
    files: Files,
}

impl LiveWebConfig {
    /// Reads and checks `path`: an error is an error at start.
    pub(crate) fn load(path: &Path) -> Result<LiveWebConfig, WebConfigError> {
        let mut files = Files::default();
        let cfg = web_config::read(path, &mut files, web_config::When::Start)?;
        Ok(LiveWebConfig {
            file: path.to_owned(),
            tls: cfg.tls.is_some(),
            state: Mutex::new(State {
                current: Arc::new(cfg),
                files,
            }),
            counts: Arc::default(),
        })
    }

    /// Whether the endpoint serves TLS (fixed at start).
    pub(crate) fn is_tls(&self) -> bool {
        self.tls
    }

    /// The reload counts, for the exported counter.
    pub(crate) fn counts(&self) -> Arc<ReloadCounts> {
        self.counts.clone()
    }

    /// The configuration to use now: first re-read when one of its files changed since the
    /// last read; the last good one when that fails (said on stderr, once per change).
    pub(crate) fn get(&self) -> Arc<WebConfig> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !st.files.changed() {
            return st.current.clone();
        }
        let mut files = Files::default();
        let read = web_config::read(&self.file, &mut files, web_config::When::Reload)
            .and_then(|c| self.same_listener(c));
        // What was read is what the next check compares with, even when it failed: a broken
        // file is reported once, and re-read when it changes again.
        st.files = files;
        match read {
            Ok(c) => {
                self.counts.add(Outcome::Ok);
                crate::diag::notice!(
                    "{}={}: re-read after a change and applied: {}",
                    env::PROMETHEUS_WEB_CONFIG,
                    self.file.display(),
                    c.describe()
                );
                st.current = Arc::new(c);
            }
            Err(e) => {
                self.counts.add(Outcome::Failed);
                crate::diag::warning!(
                    "the changed web configuration is not applied, the \
                     Prometheus endpoint keeps the one it read before ({}) until the file is \
                     fixed (counted in {}{{{}=\"{}\"}}): {e}",
                    st.current.describe(),
                    metric::PROMETHEUS_WEB_CONFIG_RELOADS,
                    crate::names::attr::RESULT,
                    Outcome::Failed.as_str(),
                );
            }
        }
        st.current.clone()
    }

    /// `c`, unless it turns TLS on or off: the listener's kind is fixed at start.
    fn same_listener(&self, c: WebConfig) -> Result<WebConfig, WebConfigError> {
        let detail = match (self.tls, c.tls.is_some()) {
            (true, false) => {
                "removed, but the endpoint was started with TLS and a listener's kind is fixed \
                 at start: it keeps serving TLS; restart the engine to serve plain HTTP"
            }
            (false, true) => {
                "added, but the endpoint was started without TLS and a listener's kind is fixed \
                 at start: it keeps serving plain HTTP; restart the engine to serve TLS"
            }
            _ => return Ok(c),
        };
        Err(WebConfigError::Invalid {
            file: self.file.clone(),
            field: "tls_server_config".to_owned(),
            detail: detail.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::watched::tests::tmp;
    use super::*;

    fn users(hash: &str) -> String {
        format!("basic_auth_users:\n  alice: '{hash}'\n")
    }

    #[test]
    fn an_unchanged_file_gives_the_same_config_and_a_rewrite_in_place_a_new_one() {
        let d = tmp("same-length");
        let f = d.join("web.yml");
        let (a, b) = (bcrypt::hash("a", 4).unwrap(), bcrypt::hash("b", 4).unwrap());
        assert_eq!(a.len(), b.len());
        std::fs::write(&f, users(&a)).unwrap();
        let live = LiveWebConfig::load(&f).unwrap();
        let first = live.get();
        assert!(
            Arc::ptr_eq(&first, &live.get()),
            "unchanged: the same config"
        );
        assert!(first.users.as_ref().unwrap().allows("alice", b"a"));
        // Rewritten in place (same inode, same length) right away.
        std::fs::write(&f, users(&b)).unwrap();
        let now = live.get();
        assert!(!Arc::ptr_eq(&first, &now));
        assert!(now.users.as_ref().unwrap().allows("alice", b"b"));
        assert!(!now.users.as_ref().unwrap().allows("alice", b"a"));
        assert_eq!(live.counts.get(Outcome::Ok), 1);
        assert!(live.counts.last_successful());
        assert!(Arc::ptr_eq(&now, &live.get()));
    }

    #[test]
    fn a_failed_reload_keeps_the_last_good_config_counts_once_and_recovers() {
        let d = tmp("failed");
        let f = d.join("web.yml");
        let a = bcrypt::hash("a", 4).unwrap();
        std::fs::write(&f, users(&a)).unwrap();
        let live = LiveWebConfig::load(&f).unwrap();
        let good = live.get();
        assert!(live.counts.last_successful(), "at start");
        for broken in [
            "basic_auth_users: [\n".to_owned(),
            "basic_auth_users:\n  alice: hunter2\n".to_owned(),
            String::new(),
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n".to_owned(),
        ] {
            std::fs::write(&f, &broken).unwrap();
            assert!(Arc::ptr_eq(&good, &live.get()), "{broken:?}");
            assert!(Arc::ptr_eq(&good, &live.get()), "{broken:?}: said once");
            assert!(!live.counts.last_successful(), "{broken:?}");
        }
        assert_eq!(live.counts.get(Outcome::Failed), 4);
        assert_eq!(live.counts.get(Outcome::Ok), 0);
        std::fs::write(&f, "{}\n").unwrap();
        assert!(live.get().users.is_none(), "`{{}}`: no basic auth");
        assert_eq!(live.counts.get(Outcome::Ok), 1);
        assert!(live.counts.last_successful(), "fixed");
    }
}
