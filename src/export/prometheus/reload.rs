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
//! A reload never lowers what a client must show, by accident or on purpose: a file that
//! configures nothing (empty, comments only, `---`, `null`, `{}`, or cut right after a key) is
//! refused as at start, and so is a valid file that would let in a client that the
//! configuration in force keeps out: `basic_auth_users` removed, `client_auth_type` no longer
//! requiring or verifying certificates, a lower `min_version`, and TLS turned off (or on: the
//! listener's kind is fixed at start, as in the exporter-toolkit). Those take a restart, which
//! is a deliberate act; a file cut short while being written is not. Certificates, keys,
//! client CAs, passwords and users may all change, and requirements may rise. Connections
//! already open keep the certificate they were handshaken with; their next request is checked
//! against the current users.

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
        let cfg = web_config::read(path, &mut files)?;
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
        let read =
            web_config::read(&self.file, &mut files).and_then(|c| self.no_weaker(&st.current, c));
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

    /// `c`, unless it lowers what `now` asks of a client: a reload may rotate certificates,
    /// keys, client CAs and passwords, add and remove users, and ask more, but what would let
    /// a client in that `now` keeps out (basic auth removed, client certificates no longer
    /// required or verified, an older TLS version) takes a restart, as does turning TLS on or
    /// off (a listener's kind is fixed at start). A file cut short while being written can
    /// read as a weaker one; a restart is a deliberate act.
    fn no_weaker(&self, now: &WebConfig, c: WebConfig) -> Result<WebConfig, WebConfigError> {
        const RESTART: &str =
            "a reload never lowers what a client must show: restart the engine to apply it";
        let refused = |field: &str, detail: String| {
            Err(WebConfigError::Invalid {
                file: self.file.clone(),
                field: field.to_owned(),
                detail,
            })
        };
        match (self.tls, c.tls.is_some()) {
            (true, false) => {
                return refused(
                    "tls_server_config",
                    format!(
                        "removed, but the endpoint was started with TLS and a listener's kind is \
                         fixed at start: it keeps serving TLS; {RESTART} (plain HTTP)"
                    ),
                );
            }
            (false, true) => {
                return refused(
                    "tls_server_config",
                    "added, but the endpoint was started without TLS and a listener's kind is \
                     fixed at start: it keeps serving plain HTTP; restart the engine to serve TLS"
                        .to_owned(),
                );
            }
            _ => {}
        }
        if now.users.is_some() && c.users.is_none() {
            return refused(
                "basic_auth_users",
                format!("removed, but the endpoint asks for a password now; {RESTART}"),
            );
        }
        if let (Some(old), Some(new)) = (&now.tls, &c.tls) {
            let (a, b) = (old.client_auth, new.client_auth);
            if (a.required() && !b.required()) || (a.verifies() && !b.verifies()) {
                return refused(
                    "tls_server_config.client_auth_type",
                    format!(
                        "{}, weaker than {} in force: {RESTART}",
                        b.as_str(),
                        a.as_str()
                    ),
                );
            }
            if new.min_version < old.min_version {
                return refused(
                    "tls_server_config.min_version",
                    format!(
                        "{}, below {} in force: {RESTART}",
                        new.min_version, old.min_version
                    ),
                );
            }
        }
        Ok(c)
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
        let b = bcrypt::hash("b", 4).unwrap();
        std::fs::write(&f, users(&b)).unwrap();
        assert!(live.get().users.as_ref().unwrap().allows("alice", b"b"));
        assert_eq!(live.counts.get(Outcome::Ok), 1);
        assert!(live.counts.last_successful(), "fixed");
    }

    #[test]
    fn documents_that_configure_nothing_or_drop_basic_auth_are_refused_and_the_users_stay() {
        let d = tmp("nothing");
        let f = d.join("web.yml");
        let a = bcrypt::hash("a", 4).unwrap();
        std::fs::write(&f, users(&a)).unwrap();
        let live = LiveWebConfig::load(&f).unwrap();
        let good = live.get();
        let cut = users(&a);
        let cases = [
            "",
            "# managed by config management\n",
            "---\n",
            "--- # nothing yet\n...\n",
            "{}\n",
            "null\n",
            "~\n",
            "basic_auth_users:\n",
            "basic_auth_users: {}\n",
            &cut[..cut.len() - 20],
        ];
        for (i, text) in cases.iter().enumerate() {
            std::fs::write(&f, text).unwrap();
            assert!(Arc::ptr_eq(&good, &live.get()), "{text:?}: refused");
            assert_eq!(live.counts.get(Outcome::Failed), i as u64 + 1, "{text:?}");
            assert!(!live.counts.last_successful(), "{text:?}");
            assert!(!live.get().users.as_ref().unwrap().allows("alice", b"b"));
            assert!(live.get().users.as_ref().unwrap().allows("alice", b"a"));
            // The same text at start: an error naming the file and what is expected.
            let e = super::super::web_config::load(&f)
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(e.contains(&f.display().to_string()), "{text:?}: {e}");
            assert!(e.contains("expected"), "{text:?}: {e}");
            assert!(!e.contains(&a[7..]), "{text:?}: no hash in {e}");
        }
        assert_eq!(live.counts.get(Outcome::Ok), 0);
    }
}
