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
