//! Entry points of the fuzz targets (`fuzz/`, feature `fuzzing`): the parsers a target cannot
//! reach through the public API. Not part of the API: no stability, no docs.

/// The format an `Accept` header negotiates, as its content type's name.
pub fn accept(header: &str) -> &'static str {
    #[cfg(feature = "prometheus")]
    {
        use crate::export::prometheus::encode::Format;
        match crate::export::prometheus::negotiate::format(Some(header)) {
            Format::Classic => "classic",
            Format::OpenMetrics { .. } => "openmetrics",
            Format::Protobuf => "protobuf",
        }
    }
    #[cfg(not(feature = "prometheus"))]
    {
        let _ = header;
        "classic"
    }
}

/// Whether an `Accept-Encoding` header accepts gzip.
pub fn accept_gzip(header: &str) -> bool {
    #[cfg(feature = "prometheus")]
    {
        crate::export::prometheus::negotiate::gzip(Some(header))
    }
    #[cfg(not(feature = "prometheus"))]
    {
        let _ = header;
        false
    }
}

/// Reads the web configuration file at `path` as the endpoint does at start and on a reload
/// (both refuse the same documents): what `check` says of it, or the error's text.
#[cfg(feature = "prometheus")]
pub fn web_config(path: &std::path::Path) -> [Result<String, String>; 1] {
    use crate::export::prometheus::web_config::read;
    [()].map(|()| {
        read(path, &mut Default::default())
            .map(|c| c.describe())
            .map_err(|e| e.to_string())
    })
}

/// What the endpoint's basic auth made of one `Authorization` header value (see
/// [`basic_auth`]).
#[cfg(feature = "prometheus")]
#[derive(Debug)]
pub struct AuthStep {
    /// The user and password decoded, when the value is `Basic` and well formed.
    pub credentials: Option<(String, Vec<u8>)>,
    /// The credentials were in the cache of verified ones before this step.
    pub cached: bool,
    /// Let in (from the cache or by bcrypt).
    pub allowed: bool,
    /// Entries in the cache after this step.
    pub cache_len: usize,
}

/// The users [`basic_auth`] knows, with their passwords (bcrypt cost 4).
#[cfg(feature = "prometheus")]
pub const AUTH_USERS: [(&str, &str); 2] = [("alice", "pw"), ("bob", "s3cret")];

/// Runs each line of `data` (at most 8) as an `Authorization` header value through the
/// endpoint's basic auth, as a request would: decoding, the cache of verified credentials
/// (looked up, then filled by a bcrypt check that passed) against [`AUTH_USERS`].
#[cfg(feature = "prometheus")]
pub fn basic_auth(data: &[u8]) -> Vec<AuthStep> {
    use crate::export::prometheus::auth::{Verified, basic_credentials};
    use crate::export::prometheus::web_config::Users;
    static HASHES: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    let hashes = HASHES.get_or_init(|| {
        AUTH_USERS
            .iter()
            .map(|(u, p)| ((*u).to_owned(), bcrypt::hash(p, 4).unwrap_or_default()))
            .collect()
    });
    let pairs: Vec<(&str, &str)> = hashes
        .iter()
        .map(|(u, h)| (u.as_str(), h.as_str()))
        .collect();
    let users = Users::for_test(&pairs);
    let cache = Verified::with(4, std::time::Duration::from_secs(60));
    data.split(|b| *b == b'\n')
        .take(8)
        .map(|line| {
            let credentials = basic_credentials(line);
            let tag = credentials
                .as_ref()
                .and_then(|(u, p)| users.hash_of(u).and_then(|h| cache.tag(u, h, p)));
            let cached = tag.is_some_and(|t| cache.holds(&t));
            let allowed = cached
                || credentials.as_ref().is_some_and(|(u, p)| {
                    let ok = users.verify(u, p);
                    if let (true, Some(t)) = (ok, tag) {
                        cache.insert(t);
                    }
                    ok
                });
            AuthStep {
                credentials,
                cached,
                allowed,
                cache_len: cache.len(),
            }
        })
        .collect()
}
