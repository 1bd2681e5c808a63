//! The files one read of the web configuration depended on, each as it was when read, and
//! whether any changed since (see [`super::reload`]).
//!
//! A file is unchanged when its device, inode, length, mtime and ctime are those it had when
//! it was read (`stat` follows symbolic links, so a Kubernetes secret's link swap is a change).
//! File times are coarse (a few ms on most file systems), so a file rewritten in place, to the
//! same length, within the tick in which it was read would keep its stamp: while a file's
//! times are less than [`RACY`] old, each check also compares its content with a digest of
//! what was parsed (a few KB, only in the seconds after a change).

use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How recent a file's times must be for its content to be compared too.
const RACY: Duration = Duration::from_secs(2);

/// The `stat` of a file: what tells that it changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    #[cfg(unix)]
    id: (u64, u64),
    len: u64,
    modified: Option<SystemTime>,
    /// The inode change time: set on every write and rename, even one that restores the mtime.
    #[cfg(unix)]
    changed: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        let m = std::fs::metadata(path).ok()?;
        #[cfg(unix)]
        use std::os::unix::fs::MetadataExt as _;
        Some(Stamp {
            #[cfg(unix)]
            id: (m.dev(), m.ino()),
            len: m.len(),
            modified: m.modified().ok(),
            #[cfg(unix)]
            changed: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// Whether a write could still leave these times as they are.
    fn racy(&self, now: SystemTime) -> bool {
        let recent = |t: SystemTime| now.duration_since(t).map_or(true, |age| age < RACY);
        #[cfg(unix)]
        let changed = {
            let (s, ns) = self.changed;
            let t = u64::try_from(s)
                .ok()
                .map(|s| SystemTime::UNIX_EPOCH + Duration::new(s, u32::try_from(ns).unwrap_or(0)));
            t.is_none_or(recent)
        };
        #[cfg(not(unix))]
        let changed = false;
        self.modified.is_none_or(recent) || changed
    }
}

/// One file as it was read.
#[derive(Debug)]
struct Seen {
    path: PathBuf,
    /// `None`: it could not be `stat`ed (missing): its appearance is a change.
    stamp: Option<Stamp>,
    /// Of the bytes parsed; `None`: it could not be read.
    digest: Option<u64>,
    /// Its content is compared too (its times are recent).
    racy: bool,
}

/// The files one read of the configuration read, each as it was when read.
#[derive(Debug, Default)]
pub(crate) struct Files {
    seen: Vec<Seen>,
    hasher: RandomState,
}

impl Files {
    /// Reads `path` whole, noting its stamp (taken first) and a digest of what was read.
    pub(crate) fn read(&mut self, path: &Path) -> std::io::Result<Vec<u8>> {
        let now = SystemTime::now();
        let stamp = Stamp::of(path);
        let bytes = std::fs::read(path);
        self.seen.push(Seen {
            path: path.to_owned(),
            stamp,
            digest: bytes.as_ref().ok().map(|b| self.hasher.hash_one(b)),
            racy: stamp.is_some_and(|s| s.racy(now)),
        });
        bytes
    }

    /// [`Files::read`] for a PEM file, its error as the PEM parsers give it.
    pub(crate) fn read_pem(
        &mut self,
        path: &Path,
    ) -> Result<Vec<u8>, rustls::pki_types::pem::Error> {
        self.read(path).map_err(rustls::pki_types::pem::Error::Io)
    }

    /// Whether any file read is no longer as it was: one `stat` each, and for a file whose
    /// times are recent, a read and a digest.
    pub(crate) fn changed(&mut self) -> bool {
        let now = SystemTime::now();
        let Files { seen, hasher } = self;
        for s in seen.iter_mut() {
            let stamp = Stamp::of(&s.path);
            if stamp != s.stamp {
                return true;
            }
            if s.racy {
                let digest = std::fs::read(&s.path).ok().map(|b| hasher.hash_one(&b));
                if digest != s.digest {
                    return true;
                }
                s.racy = stamp.is_some_and(|st| st.racy(now));
            }
        }
        false
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A fresh temporary folder for one test (`tag` names it).
    pub(in crate::export::prometheus) fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("phasetrace-prom-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn while_times_are_recent_the_content_is_compared_too() {
        let d = tmp("racy");
        let f = d.join("web.yml");
        std::fs::write(&f, "{}\n").unwrap();
        let mut files = Files::default();
        files.read(&f).unwrap();
        assert!(files.seen[0].racy, "just written");
        assert!(!files.changed(), "same stamp, same content");
        // What a rewrite within one tick of a coarse clock leaves: the stamp as it was, other
        // bytes than those parsed.
        files.seen[0].digest = Some(files.seen[0].digest.unwrap() ^ 1);
        assert!(files.changed(), "same stamp, other content");
        files.seen[0].racy = false;
        assert!(!files.changed(), "an old stamp alone is trusted: no read");
    }

    #[test]
    fn a_missing_file_that_appears_is_a_change() {
        let d = tmp("appears");
        let f = d.join("web.yml");
        std::fs::write(&f, "{}\n").unwrap();
        let mut files = Files::default();
        let _ = files.read(&d.join("absent.pem"));
        let _ = files.read(&f);
        assert!(!files.changed());
        std::fs::write(d.join("absent.pem"), "x").unwrap();
        assert!(files.changed());
    }

    #[test]
    fn only_recent_times_are_racy() {
        let now = SystemTime::now();
        let stamp = |age: u64| Stamp {
            #[cfg(unix)]
            id: (1, 1),
            len: 1,
            modified: Some(now - Duration::from_secs(age)),
            #[cfg(unix)]
            changed: (
                (now - Duration::from_secs(age))
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap()
                    .as_secs() as i64,
                0,
            ),
        };
        assert!(stamp(0).racy(now));
        assert!(!stamp(10).racy(now));
        let future = Stamp {
            modified: Some(now + Duration::from_secs(60)),
            ..stamp(10)
        };
        assert!(future.racy(now), "a time ahead of the clock is not trusted");
    }
}
